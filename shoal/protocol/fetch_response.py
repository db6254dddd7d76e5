"""Fetch v12+ response bodies without kio, both ways (pure).

Reading: kio's reader copies every partition's records out of the frame into a new
``bytes``; a follower fetching a megabyte per partition would copy each replicated byte
once more only to write it to its log. :func:`read_fetch_response_v12` walks the same
wire format (FetchResponse v12, the version the fetcher sends) and hands out each
partition's records as a read-only ``memoryview`` of the frame, which the follower
validates and appends before the frame's buffer is used again. Only the fields a
follower uses are kept; the others (aborted transactions, preferred read replica, tagged
fields such as DivergingEpoch, which a follower that truncates with OffsetsForLeaderEpoch
does not ask for) are skipped.

Writing: every follower round and consumer fetch is answered with a Fetch response whose
shape is fixed when no partition needs a leader hint. :func:`write_fetch_response` packs
v12-v17 directly into pieces for the connection (the records, bytes or a log's
FileSlice, stay pieces of their own), instead of building kio entities and walking them
with kio's writer. Tested against kio's writer for every version.

Malformed input raises ProtocolViolation, like the frame decoder.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from ..errors import ProtocolViolation
from .header import read_uvarint, skip_tagged_fields, uvarint

__all__ = ["FetchedPartition", "PartitionAnswer", "read_fetch_response_v12", "write_fetch_response"]

_TOP = struct.Struct(">ihi")  # throttle time, error code, session id
_PART = struct.Struct(">ihqqq")  # index, error code, high watermark, last stable offset, log start offset
_ABORTED = 16  # producer id, first offset
_PART_OUT = struct.Struct(">ihqqqb")  # ..., then null aborted transactions (uvarint 0)
_I32 = struct.Struct(">i")
_NO_PREFERRED_REPLICA = _I32.pack(-1)

_ABORTED_OUT = struct.Struct(">qqb")  # producer id, first offset, tagged fields

PartitionAnswer = tuple
"""(partition index, error code, high watermark, last stable offset, log start offset,
records: bytes-like or a FileSlice, anything with a length), optionally followed by the
aborted transactions, (producer id, first offset) pairs (absent or None: null, as for
read_uncommitted)."""


@dataclass(slots=True)
class FetchedPartition:
    topic: str
    partition_index: int
    error_code: int
    high_watermark: int
    log_start_offset: int
    records: memoryview | None


def _take(buf: memoryview, pos: int, n: int) -> int:
    end = pos + n
    if n < 0 or end > len(buf):
        raise ProtocolViolation("Fetch response ends inside a field")
    return end


def read_fetch_response_v12(buf: memoryview, pos: int = 0) -> tuple[int, list[FetchedPartition]]:
    """(top-level error code, every partition) of the Fetch v12 response body at ``pos``."""
    _take(buf, pos, _TOP.size)
    _throttle, error_code, _session = _TOP.unpack_from(buf, pos)
    pos += _TOP.size
    topics, pos = read_uvarint(buf, pos)
    out: list[FetchedPartition] = []
    for _ in range(max(topics - 1, 0)):
        n, pos = read_uvarint(buf, pos)
        end = _take(buf, pos, n - 1)
        topic = bytes(buf[pos:end]).decode()
        pos = end
        parts, pos = read_uvarint(buf, pos)
        for _ in range(max(parts - 1, 0)):
            _take(buf, pos, _PART.size)
            index, code, hw, _lso, log_start = _PART.unpack_from(buf, pos)
            pos += _PART.size
            aborted, pos = read_uvarint(buf, pos)
            for _ in range(max(aborted - 1, 0)):
                pos = skip_tagged_fields(buf, _take(buf, pos, _ABORTED))
            pos = _take(buf, pos, 4)  # preferred read replica
            n, pos = read_uvarint(buf, pos)
            records = None
            if n > 0:
                end = _take(buf, pos, n - 1)
                records = buf[pos:end]
                pos = end
            pos = skip_tagged_fields(buf, pos)
            out.append(FetchedPartition(topic, index, code, hw, log_start, records))
        pos = skip_tagged_fields(buf, pos)
    skip_tagged_fields(buf, pos)
    return error_code, out


def write_fetch_response(version: int, error_code: int, session_id: int,
                         topics: list[tuple[str | bytes, list[PartitionAnswer]]]) -> list[object]:
    """A Fetch response body (v12-v17, throttle time 0, no tagged fields) as pieces.

    ``topics``: (name, for v12; the 16 bytes of the topic id, from v13) with its
    partitions. No partition has a preferred read replica; a partition's aborted
    transactions are null unless its answer carries them (read_committed).
    Small fields are joined into bytes pieces; each partition's records stay a piece.
    """
    if not 12 <= version <= 17:
        raise ValueError(f"Fetch v{version} is not written here")
    pieces: list[object] = []
    head = bytearray(_TOP.pack(0, error_code, session_id))
    head += uvarint(len(topics) + 1)
    for topic, parts in topics:
        if version >= 13:
            assert isinstance(topic, bytes) and len(topic) == 16
            head += topic
        else:
            raw = topic.encode() if isinstance(topic, str) else topic
            head += uvarint(len(raw) + 1)
            head += raw
        head += uvarint(len(parts) + 1)
        for index, code, hw, lso, log_start, records, *rest in parts:
            aborted = rest[0] if rest else None
            if aborted is None:
                head += _PART_OUT.pack(index, code, hw, lso, log_start, 0)
            else:
                head += _PART.pack(index, code, hw, lso, log_start)
                head += uvarint(len(aborted) + 1)
                for producer_id, first_offset in aborted:
                    head += _ABORTED_OUT.pack(producer_id, first_offset, 0)
            head += _NO_PREFERRED_REPLICA
            n = len(records)  # type: ignore[arg-type]
            head += uvarint(n + 1)
            if n:
                pieces.append(bytes(head))
                pieces.append(records)
                head = bytearray(b"\x00")  # the partition's tagged fields
            else:
                head.append(0)
        head.append(0)  # the topic's tagged fields
    head.append(0)  # the response's tagged fields
    pieces.append(bytes(head))
    return pieces
