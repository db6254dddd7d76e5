"""Produce v3-v12 response bodies without kio (pure).

Every Produce request is answered, and with ``acks=all`` under load the brokers answer
thousands a second: building kio entities for each partition and walking them with kio's
writer cost more than the rest of the answer's path. :func:`write_produce_response`
packs the same wire format directly. It writes no KIP-951 leader hints (the
``current_leader`` and ``node_endpoints`` tagged fields of v10+): a response that needs
them goes through kio. Tested against kio's writer for every version.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable

from .header import uvarint

__all__ = ["PartitionResult", "write_one_partition", "write_produce_response"]

PartitionResult = tuple[int, int, int, int, int, str | None, Iterable[tuple[int, str | None]]]
"""(partition index, error code, base offset, log append time in ms or -1, log start
offset, error message or None, record errors: (batch index, message or None) each)."""

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_PART_V3 = struct.Struct(">ihqq")  # index, error code, base offset, log append time
_PART_V5 = struct.Struct(">ihqqq")  # ..., log start offset
_THROTTLE_0 = _I32.pack(0)
_OFFSETS_V3 = struct.Struct(">qq")  # base offset, log append time
_OFFSETS_V5 = struct.Struct(">qqq")  # ..., log start offset
_TEMPLATES: dict[tuple[int, str, int], tuple[bytes, int]] = {}
_TEMPLATES_KEPT = 4096


def _string(out: bytearray, text: str, flexible: bool) -> None:
    raw = text.encode()
    if flexible:
        out += uvarint(len(raw) + 1)
    else:
        out += _I16.pack(len(raw))
    out += raw


def _nullable_string(out: bytearray, text: str | None, flexible: bool) -> None:
    if text is not None:
        _string(out, text, flexible)
    elif flexible:
        out.append(0)
    else:
        out += _I16.pack(-1)


def _array_length(out: bytearray, n: int, flexible: bool) -> None:
    if flexible:
        out += uvarint(n + 1)
    else:
        out += _I32.pack(n)


def write_produce_response(version: int, topics: list[tuple[str, list[PartitionResult]]]) -> bytes:
    """A Produce response body (v3-v12, throttle time 0, no tagged fields)."""
    if not 3 <= version <= 12:
        raise ValueError(f"Produce v{version} is not written here")
    flexible = version >= 9
    part = _PART_V5 if version >= 5 else _PART_V3
    out = bytearray()
    _array_length(out, len(topics), flexible)
    for name, parts in topics:
        _string(out, name, flexible)
        _array_length(out, len(parts), flexible)
        for index, code, base_offset, append_time, log_start, message, record_errors in parts:
            if version >= 5:
                out += part.pack(index, code, base_offset, append_time, log_start)
            else:
                out += part.pack(index, code, base_offset, append_time)
            if version >= 8:
                errors = list(record_errors)
                _array_length(out, len(errors), flexible)
                for batch_index, batch_message in errors:
                    out += _I32.pack(batch_index)
                    _nullable_string(out, batch_message, flexible)
                    if flexible:
                        out.append(0)  # the record error's tagged fields
                _nullable_string(out, message, flexible)
            if flexible:
                out.append(0)  # the partition's tagged fields
        if flexible:
            out.append(0)  # the topic's tagged fields
    out += _THROTTLE_0
    if flexible:
        out.append(0)  # the response's tagged fields
    return bytes(out)


def write_one_partition(version: int, name: str, index: int, base_offset: int, append_time: int,
                        log_start: int) -> bytes:
    """The answer to a Produce of one partition that succeeded: the same bytes as
    ``write_produce_response(version, [(name, [(index, 0, base_offset, append_time,
    log_start, None, ())])])``, from a template kept per version, topic and partition in
    which only the three offsets are written."""
    key = (version, name, index)
    template = _TEMPLATES.get(key)
    if template is None:
        flexible = version >= 9
        prefix = bytearray()
        _array_length(prefix, 1, flexible)
        _string(prefix, name, flexible)
        _array_length(prefix, 1, flexible)
        prefix += _I32.pack(index)
        prefix += _I16.pack(0)
        body = write_produce_response(version, [(name, [(index, 0, 0, 0, 0, None, ())])])
        assert body.startswith(prefix)
        if len(_TEMPLATES) >= _TEMPLATES_KEPT:
            _TEMPLATES.clear()
        template = _TEMPLATES[key] = (body, len(prefix))
    body, position = template
    out = bytearray(body)
    if version >= 5:
        _OFFSETS_V5.pack_into(out, position, base_offset, append_time, log_start)
    else:
        _OFFSETS_V3.pack_into(out, position, base_offset, append_time)
    return bytes(out)
