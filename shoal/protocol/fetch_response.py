"""A follower's reading of a Fetch v12 response body without copying its records (pure).

kio's reader copies every partition's records out of the frame into a new ``bytes``; a
follower fetching a megabyte per partition would copy each replicated byte once more only
to write it to its log. This reader walks the same wire format (FetchResponse v12, the
version the fetcher sends) and hands out each partition's records as a read-only
``memoryview`` of the frame, which the follower validates and appends before the frame's
buffer is used again. Only the fields a follower uses are kept; the others (aborted
transactions, preferred read replica, tagged fields such as DivergingEpoch, which a
follower that truncates with OffsetsForLeaderEpoch does not ask for) are skipped.

Malformed input raises ProtocolViolation, like the frame decoder.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from ..errors import ProtocolViolation
from .header import read_uvarint, skip_tagged_fields

__all__ = ["FetchedPartition", "read_fetch_response_v12"]

_TOP = struct.Struct(">ihi")  # throttle time, error code, session id
_PART = struct.Struct(">ihqqq")  # index, error code, high watermark, last stable offset, log start offset
_ABORTED = 16  # producer id, first offset


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
