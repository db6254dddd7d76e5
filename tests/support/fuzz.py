"""Request bodies for fuzzing: random valid ones from kio's schemas, and mutations of them.

``random_entity(cls, rng)`` builds a random instance of a kio request class (arrays of a
few elements, strings that are sometimes names the broker knows, small timeouts so that
no long poll holds a case up). ``length_fields(cls, body)`` walks an encoded body as kio's
reader does and lists where its length fields, uuids and strings are;
``mutations(cls, body, rng)`` sets those to extreme values (2^31-1, 2^32-2, -2, null,
overlong varints), garbles uuids and strings and truncates the body.
"""

from __future__ import annotations

import dataclasses
import datetime
import io
import random
import struct
import uuid
from collections.abc import Iterator
from typing import Any, NamedTuple

from kio.schema.errors import ErrorCode
from kio.serial import entity_writer
from kio.serial._introspect import classify_field, get_field_tag, is_optional

from shoal.protocol.header import read_uvarint
from shoal.protocol.header import uvarint as uv

__all__ = ["random_entity", "encode", "length_fields", "mutations", "uv", "Spot"]

_FIXED = {"bool": 1, "int8": 1, "int16": 2, "int32": 4, "int64": 8, "timedelta_i32": 4, "timedelta_i64": 8,
          "uuid": 16, "uint16": 2, "uint32": 4, "uint64": 8, "float64": 8, "error_code": 2}


def encode(entity: Any) -> bytes:
    buf = io.BytesIO()
    entity_writer(type(entity))(buf, entity)
    return buf.getvalue()


# -- random valid entities --------------------------------------------------------------
def random_entity(cls: type, rng: random.Random, depth: int = 0, *, names: tuple[str, ...] = (),
                  long_strings: bool = False) -> Any:
    """A random ``cls``; strings are sometimes one of ``names``, and with ``long_strings``
    sometimes 32,767 characters (the most a non-flexible string holds)."""
    kw = {}
    for f in dataclasses.fields(cls):
        if get_field_tag(f) is not None and rng.random() < 0.5:
            continue
        kw[f.name] = _value(f, rng, depth, names, long_strings)
    return cls(**kw)


def _value(f: dataclasses.Field[Any], rng: random.Random, depth: int, names: tuple[str, ...],
           long_strings: bool) -> Any:
    kind = classify_field(f)
    nullable = is_optional(f)
    t = f.metadata.get("kafka_type")
    if kind.is_array:
        if nullable and rng.random() < 0.2:
            return None
        n = rng.randint(0, 3 if depth < 3 else 0)
        if type(kind).__name__ == "EntityTupleField":
            return tuple(random_entity(kind.type_, rng, depth + 1, names=names, long_strings=long_strings)
                         for _ in range(n))
        return tuple(_primitive(t, False, rng, names, long_strings) for _ in range(n))
    if type(kind).__name__ == "EntityField":
        return random_entity(kind.type_, rng, depth + 1, names=names, long_strings=long_strings)
    return _primitive(t, nullable, rng, names, long_strings)


def _primitive(t: str | None, nullable: bool, rng: random.Random, names: tuple[str, ...],
               long_strings: bool) -> Any:
    if nullable and rng.random() < 0.15:
        return None
    if t == "bool":
        return rng.random() < 0.5
    if t in ("int8", "int16", "int32", "int64"):
        bits = {"int8": 8, "int16": 16, "int32": 32, "int64": 64}[t]
        r = rng.random()
        if r < 0.5:
            return rng.choice((0, 1, -1, 2))
        if r < 0.6:
            return (1 << (bits - 1)) - 1
        if r < 0.7:
            return -(1 << (bits - 1))
        return rng.randint(-(1 << (bits - 1)), (1 << (bits - 1)) - 1)
    if t in ("timedelta_i32", "timedelta_i64"):
        return datetime.timedelta(milliseconds=rng.choice((0, 1, 50, 100)))
    if t == "uuid":
        return rng.choice((uuid.UUID(int=0), uuid.UUID(int=rng.getrandbits(128))))
    if t == "string":
        r = rng.random()
        if names and r < 0.4:
            return rng.choice(names)
        if long_strings and r < 0.5:
            return "i" * 32767
        return "".join(rng.choice("abcé-_.") for _ in range(rng.randint(0, 12)))
    if t in ("bytes", "records"):
        return rng.randbytes(rng.randint(0, 40))
    if t == "error_code":
        return rng.choice(list(ErrorCode))
    if t == "uint16":
        return rng.randint(0, 65535)
    if t == "float64":
        return rng.random()
    if t == "datetime_i64":
        return datetime.datetime.fromtimestamp(rng.randint(0, 2_000_000_000), datetime.timezone.utc)
    raise AssertionError(f"no random value for kafka type {t}")


# -- where the lengths are ----------------------------------------------------------------
class Spot(NamedTuple):
    offset: int
    width: int
    kind: str
    """"i16", "i32", "uv" (a length, count or size), "uuid" or "text" (a string's bytes)."""
    where: str


def length_fields(cls: type, body: bytes) -> list[Spot]:
    """The spots of ``body`` (a valid encoding of a ``cls``) worth mutating, in order."""
    out: list[Spot] = []
    _walk(cls, body, 0, out)
    return out


def _length(buf: bytes, pos: int, flexible: bool, wide: bool, where: str, out: list[Spot]) -> tuple[int, int]:
    """A length at ``pos``: (elements or bytes, -1 for null; position after it)."""
    if flexible:
        n, end = read_uvarint(buf, pos)
        out.append(Spot(pos, end - pos, "uv", where))
        return n - 1, end
    if wide:
        out.append(Spot(pos, 4, "i32", where))
        return struct.unpack_from(">i", buf, pos)[0], pos + 4
    out.append(Spot(pos, 2, "i16", where))
    return struct.unpack_from(">h", buf, pos)[0], pos + 2


def _walk(cls: type, buf: bytes, pos: int, out: list[Spot]) -> int:
    flexible = bool(cls.__flexible__)
    known = {}
    for f in dataclasses.fields(cls):
        tag = get_field_tag(f)
        if tag is not None:
            known[int(tag)] = f
            continue
        pos = _walk_field(f, flexible, buf, pos, out, f"{cls.__name__}.{f.name}")
    if flexible:
        count, end = read_uvarint(buf, pos)
        out.append(Spot(pos, end - pos, "uv", f"{cls.__name__} tagged fields"))
        pos = end
        for _ in range(count):
            tag, pos = read_uvarint(buf, pos)
            size, end = read_uvarint(buf, pos)
            out.append(Spot(pos, end - pos, "uv", f"{cls.__name__} tagged field {tag}"))
            pos = end
            if tag in known:
                _walk_field(known[tag], True, buf, pos, out, f"{cls.__name__}.{known[tag].name}")
            pos += size
    return pos


def _walk_field(f: dataclasses.Field[Any], flexible: bool, buf: bytes, pos: int, out: list[Spot], where: str) -> int:
    kind = classify_field(f)
    t = f.metadata.get("kafka_type")
    if kind.is_array:
        n, pos = _length(buf, pos, flexible, True, where, out)
        for _ in range(max(n, 0)):
            if type(kind).__name__ == "EntityTupleField":
                pos = _walk(kind.type_, buf, pos, out)
            else:
                pos = _walk_primitive(t, flexible, buf, pos, out, where)
        return pos
    if type(kind).__name__ == "EntityField":
        return _walk(kind.type_, buf, pos, out)
    return _walk_primitive(t, flexible, buf, pos, out, where)


def _walk_primitive(t: str | None, flexible: bool, buf: bytes, pos: int, out: list[Spot], where: str) -> int:
    if t in _FIXED:
        if t == "uuid":
            out.append(Spot(pos, 16, "uuid", where))
        return pos + _FIXED[t]
    n, pos = _length(buf, pos, flexible, t != "string", where, out)
    if n > 0:
        if t == "string":
            out.append(Spot(pos, n, "text", where))
        pos += n
    return pos


# -- mutations ------------------------------------------------------------------------------
_EXTREME = {
    "uv": (uv(2**32 - 1), uv(2**31), uv(2**28), b"\xff\xff\xff\xff\xff\x01", b"\x00"),
    "i32": (struct.pack(">i", 2**31 - 1), struct.pack(">i", -2), struct.pack(">i", -1), struct.pack(">i", 2**30)),
    "i16": (struct.pack(">h", 32767), struct.pack(">h", -2), struct.pack(">h", -1)),
    "uuid": (b"\xff" * 16, b"\x00" * 16, b"\x00" * 8),
    "text": (b"\xff", b"\xc3"),
}


def mutations(cls: type, body: bytes, rng: random.Random, per_spot: int = 2) -> Iterator[tuple[str, bytes]]:
    """(description, mutated body): each spot of ``body`` set to ``per_spot`` of its extreme
    values (cycling through them, so that all are used across spots), and truncations."""
    spots = length_fields(cls, body)
    turn = rng.randrange(5)
    for spot in spots:
        values = _EXTREME[spot.kind]
        for _ in range(min(per_spot, len(values))):
            value = values[turn % len(values)]
            turn += 1
            if spot.kind == "text":
                yield f"{spot.where}: invalid UTF-8", body[:spot.offset] + value + body[spot.offset + 1:]
            else:
                yield (f"{spot.where} ({spot.kind} at {spot.offset}) = {value.hex()}",
                       body[:spot.offset] + value + body[spot.offset + spot.width:])
    for cut in sorted({rng.randrange(len(body)) for _ in range(2)} if body else ()):
        yield f"truncated to {cut} of {len(body)} bytes", body[:cut]
