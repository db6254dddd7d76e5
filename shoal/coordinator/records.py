"""Records of the internal topics ``__consumer_offsets`` and ``__share_group_state``.

Theory of operation
-------------------
A coordinator's state is the replay of its records. Each record is a (key, value) pair
of bytes appended to an internal topic; on ``__consumer_offsets`` (compacted) the latest
value of a key wins, and a ``None`` value is a tombstone that deletes the key.

The bytes are Kafka's, so Kafka-aware tools decode these topics:

* key:   ``int16 record type`` + the key fields (never flexible);
* value: ``int16 value version`` + the value fields in that version, flexible versions
  ending with tagged fields.

The record types, field layouts and versions are in :mod:`shoal.coordinator.schemas`.
``__consumer_offsets`` uses 0-1 (offset commit), 2 (classic group metadata), 3-8
(consumer groups, KIP-848) and 9-15 (share groups, KIP-932); ``__share_group_state``
uses 0 (ShareSnapshot) and 1 (ShareUpdate). Domain modules (``shoal.groups``,
``shoal.share``) build and replay records as dicts keyed by the fields' snake_case
names; this module turns them into bytes and back. UUIDs are canonical strings in the
dicts and 16 bytes on disk.

Earlier versions of shoal wrote the same fields as compact JSON after the int16
prefixes. :func:`is_legacy_json` recognises such a record and :meth:`CoordinatorRecord.from_bytes`
still reads it; the coordinator runtime rewrites a partition holding any at start (see
``shoal.server.runtime``), so a data directory is upgraded once.

Pure: no I/O. Encoding is deterministic (equal dicts give equal bytes), which
compaction needs.
"""

from __future__ import annotations

import base64
import enum
import json
import struct
import uuid
from dataclasses import dataclass
from typing import Any

from shoal.coordinator.schemas import (
    CONSUMER_OFFSETS,
    RECORD_SCHEMAS,
    SHARE_GROUP_STATE,
    TRANSACTION_STATE,
    Field,
    Schema,
)

__all__ = [
    "CONSUMER_OFFSETS",
    "SHARE_GROUP_STATE",
    "TRANSACTION_STATE",
    "CoordinatorRecord",
    "RecordType",
    "ShareStateRecordType",
    "decode_key",
    "decode_value",
    "encode_key",
    "encode_value",
    "is_legacy_json",
    "record",
    "tombstone",
]

_I8 = struct.Struct(">b")
_I16 = struct.Struct(">h")
_U16 = struct.Struct(">H")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_FIXED = {"int8": _I8, "int16": _I16, "uint16": _U16, "int32": _I32, "int64": _I64}


class RecordType(enum.IntEnum):
    """Record types of ``__consumer_offsets`` (Kafka's numbering)."""

    OFFSET_COMMIT_LEGACY = 0
    OFFSET_COMMIT = 1
    GROUP_METADATA = 2
    CONSUMER_GROUP_METADATA = 3
    CONSUMER_GROUP_PARTITION_METADATA = 4
    CONSUMER_GROUP_MEMBER_METADATA = 5
    CONSUMER_GROUP_TARGET_ASSIGNMENT_METADATA = 6
    CONSUMER_GROUP_TARGET_ASSIGNMENT_MEMBER = 7
    CONSUMER_GROUP_CURRENT_MEMBER_ASSIGNMENT = 8
    SHARE_GROUP_PARTITION_METADATA = 9
    SHARE_GROUP_MEMBER_METADATA = 10
    SHARE_GROUP_METADATA = 11
    SHARE_GROUP_TARGET_ASSIGNMENT_METADATA = 12
    SHARE_GROUP_TARGET_ASSIGNMENT_MEMBER = 13
    SHARE_GROUP_CURRENT_MEMBER_ASSIGNMENT = 14
    SHARE_GROUP_STATE_PARTITION_METADATA = 15


class ShareStateRecordType(enum.IntEnum):
    """Record types of ``__share_group_state`` (Kafka's numbering)."""

    SHARE_SNAPSHOT = 0
    SHARE_UPDATE = 1


# --- the message encoding ----------------------------------------------------------------


def _uvarint(out: bytearray, n: int) -> None:
    if n < 0:
        raise ValueError("negative length")
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)


class _Reader:
    __slots__ = ("data", "pos")

    def __init__(self, data: bytes, pos: int = 0) -> None:
        self.data = data
        self.pos = pos

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise ValueError("record ends early")
        b = self.data[self.pos:self.pos + n]
        self.pos += n
        return b

    def fixed(self, s: struct.Struct) -> int:
        if self.pos + s.size > len(self.data):
            raise ValueError("record ends early")
        (v,) = s.unpack_from(self.data, self.pos)
        self.pos += s.size
        return int(v)

    def uvarint(self) -> int:
        n = shift = 0
        while True:
            if self.pos >= len(self.data):
                raise ValueError("record ends early")
            b = self.data[self.pos]
            self.pos += 1
            n |= (b & 0x7F) << shift
            if not b & 0x80:
                return n
            shift += 7
            if shift > 28:
                raise ValueError("varint too long")


def _length(r: _Reader, flexible: bool, wide: bool) -> int:
    """A length prefix; -1 means null. ``wide``: int32 (bytes, arrays) else int16 (strings)."""
    if flexible:
        return r.uvarint() - 1
    return r.fixed(_I32 if wide else _I16)


def _write_length(out: bytearray, n: int, flexible: bool, wide: bool) -> None:
    if flexible:
        _uvarint(out, n + 1)
    else:
        out += (_I32 if wide else _I16).pack(n)


def _write_primitive(out: bytearray, type_: str, value: Any, flexible: bool, nullable: bool) -> None:
    s = _FIXED.get(type_)
    if s is not None:
        out += s.pack(int(value))
    elif type_ == "bool":
        out.append(1 if value else 0)
    elif type_ == "uuid":
        out += (value if isinstance(value, uuid.UUID) else uuid.UUID(str(value))).bytes
    elif type_ in ("string", "bytes"):
        wide = type_ == "bytes"
        if value is None:
            if not nullable:
                raise ValueError(f"null {type_} in a non-nullable field")
            _write_length(out, -1, flexible, wide)
            return
        if type_ == "string":
            data = value.encode()
        elif isinstance(value, str):  # the legacy JSON form kept bytes as base64 text
            data = base64.b64decode(value.encode("ascii"), validate=True)
        else:
            data = bytes(value)
        if not wide and len(data) > 0x7FFF:
            raise ValueError("string longer than 32767 bytes")
        _write_length(out, len(data), flexible, wide)
        out += data
    else:  # pragma: no cover - schemas use only the types above
        raise ValueError(f"unknown type {type_}")


def _read_primitive(r: _Reader, type_: str, flexible: bool) -> Any:
    s = _FIXED.get(type_)
    if s is not None:
        return r.fixed(s)
    if type_ == "bool":
        return r.take(1) != b"\x00"
    if type_ == "uuid":
        return str(uuid.UUID(bytes=r.take(16)))
    n = _length(r, flexible, type_ == "bytes")
    if n < 0:
        return None
    data = r.take(n)
    return data.decode() if type_ == "string" else data


def _write_value(out: bytearray, fd: Field, value: Any, version: int, flexible: bool, tagged: bool = False) -> None:
    """One field's value (no tag header). Tagged arrays and structs are never null."""
    nullable = fd.is_nullable(version) and not tagged
    if fd.array:
        if value is None:
            if not nullable:
                raise ValueError(f"null array in non-nullable field {fd.name}")
            _write_length(out, -1, flexible, True)
            return
        _write_length(out, len(value), flexible, True)
        for item in value:
            if fd.type == "struct":
                _write_struct(out, fd.fields, item, version, flexible)
            else:
                _write_primitive(out, fd.type, item, flexible, False)
        return
    if fd.type == "struct":
        if fd.is_nullable(version):
            if value is None:
                if tagged or not nullable:
                    raise ValueError(f"null struct in field {fd.name}")
                out += _I8.pack(-1)
                return
            out += _I8.pack(1)
        _write_struct(out, fd.fields, value, version, flexible)
        return
    _write_primitive(out, fd.type, value, flexible, nullable)


def _read_value(r: _Reader, fd: Field, version: int, flexible: bool, tagged: bool = False) -> Any:
    if fd.array:
        n = _length(r, flexible, True)
        if n < 0:
            if not fd.is_nullable(version) or tagged:
                raise ValueError(f"null array in non-nullable field {fd.name}")
            return None
        if fd.type == "struct":
            return [_read_struct(r, fd.fields, version, flexible) for _ in range(n)]
        return [_read_primitive(r, fd.type, flexible) for _ in range(n)]
    if fd.type == "struct":
        if fd.is_nullable(version):
            marker = r.fixed(_I8)
            if marker < 0:
                return None
        return _read_struct(r, fd.fields, version, flexible)
    value = _read_primitive(r, fd.type, flexible)
    if value is None and not fd.is_nullable(version):
        raise ValueError(f"null in non-nullable field {fd.name}")
    return value


def _write_struct(out: bytearray, fields: tuple[Field, ...], data: dict[str, Any], version: int,
                  flexible: bool) -> None:
    tags: list[tuple[int, bytes]] = []
    for fd in fields:
        if not fd.present(version):
            continue
        value = data.get(fd.name, fd.default_value()) if isinstance(data, dict) else fd.default_value()
        if flexible and fd.is_tagged(version):
            if value == fd.default_value() or value is None:
                continue
            buf = bytearray()
            _write_value(buf, fd, value, version, True, tagged=True)
            assert fd.tag is not None
            tags.append((fd.tag, bytes(buf)))
            continue
        _write_value(out, fd, value, version, flexible)
    if flexible:
        tags.sort()
        _uvarint(out, len(tags))
        for tag, tagged in tags:
            _uvarint(out, tag)
            _uvarint(out, len(tagged))
            out += tagged


def _read_struct(r: _Reader, fields: tuple[Field, ...], version: int, flexible: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    by_tag: dict[int, Field] = {}
    for fd in fields:
        if not fd.present(version):
            out[fd.name] = fd.default_value()
        elif flexible and fd.is_tagged(version):
            out[fd.name] = fd.default_value()
            assert fd.tag is not None
            by_tag[fd.tag] = fd
        else:
            out[fd.name] = _read_value(r, fd, version, flexible)
    if flexible:
        for _ in range(r.uvarint()):
            tag = r.uvarint()
            size = r.uvarint()
            end = r.pos + size
            known = by_tag.get(tag)
            if known is None:
                r.take(size)  # unknown tagged field: skipped, as Kafka's readers do
                continue
            out[known.name] = _read_value(r, known, version, True, tagged=True)
            if r.pos != end:
                raise ValueError(f"tagged field {known.name} has the wrong size")
    return out


def _schemas(topic: str, record_type: int) -> tuple[Schema, Schema]:
    try:
        return RECORD_SCHEMAS[topic][record_type]
    except KeyError:
        raise ValueError(f"unknown {topic} record type {record_type}") from None


# --- keys and values ----------------------------------------------------------------------


def encode_key(record_type: int, fields: dict[str, Any], topic: str = CONSUMER_OFFSETS) -> bytes:
    """``int16 record type`` + the key fields. Raises ValueError for an unknown type or bad field."""
    key_schema, _ = _schemas(topic, record_type)
    out = bytearray(_I16.pack(record_type))
    _write_struct(out, key_schema.fields, fields, record_type, False)
    return bytes(out)


def decode_key(data: bytes, topic: str = CONSUMER_OFFSETS) -> tuple[int, dict[str, Any]]:
    """Returns (record type, key fields). Raises ValueError on malformed bytes or an unknown type."""
    if len(data) < 2:
        raise ValueError("record key shorter than its type")
    if is_legacy_json(data):
        return _I16.unpack_from(data, 0)[0], _json(data)
    r = _Reader(data)
    record_type = r.fixed(_I16)
    key_schema, _ = _schemas(topic, record_type)
    fields = _read_struct(r, key_schema.fields, record_type, False)
    if r.pos != len(data):
        raise ValueError("bytes left after the record key")
    return record_type, fields


def value_version(record_type: int, version: int | None, topic: str = CONSUMER_OFFSETS) -> int:
    """The version a value of ``record_type`` is written in: ``version`` if the schema has
    it, else the schema's usual one."""
    _, value_schema = _schemas(topic, record_type)
    if version is not None and value_schema.versions[0] <= version <= value_schema.versions[1]:
        return version
    return value_schema.write_version


def encode_value(record_type: int, version: int, fields: dict[str, Any], topic: str = CONSUMER_OFFSETS) -> bytes:
    """``int16 version`` + the value fields in that version."""
    _, value_schema = _schemas(topic, record_type)
    if not value_schema.versions[0] <= version <= value_schema.versions[1]:
        raise ValueError(f"{value_schema.name} has no version {version}")
    out = bytearray(_I16.pack(version))
    _write_struct(out, value_schema.fields, fields, version, value_schema.is_flexible(version))
    return bytes(out)


def decode_value(record_type: int, data: bytes | None,
                 topic: str = CONSUMER_OFFSETS) -> tuple[int, dict[str, Any]] | None:
    """Returns (version, value fields), or None for a tombstone. Raises ValueError on malformed bytes."""
    if data is None:
        return None
    if len(data) < 2:
        raise ValueError("record value shorter than its version")
    if is_legacy_json(data):
        return _I16.unpack_from(data, 0)[0], _json(data)
    _, value_schema = _schemas(topic, record_type)
    r = _Reader(data)
    version = r.fixed(_I16)
    if not value_schema.versions[0] <= version <= value_schema.versions[1]:
        raise ValueError(f"{value_schema.name} has no version {version}")
    fields = _read_struct(r, value_schema.fields, version, value_schema.is_flexible(version))
    if r.pos != len(data):
        raise ValueError("bytes left after the record value")
    return version, fields


def is_legacy_json(data: bytes | None) -> bool:
    """Whether a key or value is in the JSON form earlier shoal versions wrote.

    That form is an int16 followed by a JSON object. No binary record starts its fields
    with ``{"`` or ``{}`` and ends with ``}``: it would take a first string or array of at
    least 31,488 elements, an offset above 2^62, or (flexible values) a tagged-field count
    of 125 at the end.
    """
    return (data is not None and len(data) >= 4 and data[2:3] == b"{" and data[3:4] in (b'"', b"}")
            and data[-1:] == b"}")


def _json(data: bytes) -> dict[str, Any]:
    try:
        fields = json.loads(data[2:])
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"undecodable JSON record: {e}") from None
    if not isinstance(fields, dict):
        raise ValueError("JSON record is not an object")  # noqa: TRY004 (callers treat every bad record as ValueError)
    return fields


@dataclass(frozen=True, slots=True)
class CoordinatorRecord:
    """One record to append to (or replayed from) an internal topic partition.

    ``record_type``/``key`` and ``version``/``value`` are the decoded views; ``value``
    is None for a tombstone. ``topic`` says which internal topic's layouts apply.
    ``to_bytes`` gives the (key, value) pair the log stores.
    """

    record_type: int
    key: dict[str, Any]
    value: dict[str, Any] | None
    version: int = 0
    topic: str = CONSUMER_OFFSETS

    def to_bytes(self) -> tuple[bytes, bytes | None]:
        k = encode_key(self.record_type, self.key, self.topic)
        if self.value is None:
            return k, None
        version = value_version(self.record_type, self.version, self.topic)
        return k, encode_value(self.record_type, version, self.value, self.topic)

    @classmethod
    def from_bytes(cls, key: bytes, value: bytes | None, topic: str = CONSUMER_OFFSETS) -> CoordinatorRecord:
        """Decode a stored record (binary, or the legacy JSON form). Raises ValueError."""
        record_type, kf = decode_key(key, topic)
        dv = decode_value(record_type, value, topic)
        if dv is None:
            return cls(record_type, kf, None, 0, topic)
        return cls(record_type, kf, dv[1], dv[0], topic)


def record(record_type: int, key: dict[str, Any], value: dict[str, Any], version: int = 0,
           topic: str = CONSUMER_OFFSETS) -> CoordinatorRecord:
    return CoordinatorRecord(int(record_type), key, value, version, topic)


def tombstone(record_type: int, key: dict[str, Any], topic: str = CONSUMER_OFFSETS) -> CoordinatorRecord:
    return CoordinatorRecord(int(record_type), key, None, 0, topic)
