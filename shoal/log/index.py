"""Sparse offset and time indexes: in-memory search and on-disk encoding (pure).

Theory of operation
-------------------
Each segment has two sparse indexes, kept as two parallel, sorted Python lists in memory
and mirrored to files of fixed-size entries (Kafka's layout):

* offset index (``.index``): ``(relative_offset int32, position int32)``: the batch whose
  base offset is ``segment_base + relative_offset`` starts at byte ``position``;
* time index (``.timeindex``): ``(timestamp int64, relative_offset int32)``: no record
  at an offset below ``relative_offset`` (plus the segment base) has a timestamp above
  ``timestamp``, and the batch at ``relative_offset`` reached it.

An entry is added every ``index.interval.bytes`` of log (and for the time index only when
the maximum timestamp grows), so a look-up lands at most that many bytes before the batch
sought; the caller then scans batch headers forward.  Keys are strictly increasing, values
non-decreasing.  Decoding a file checks these invariants and returns ``None`` for a torn
or inconsistent file, which the caller rebuilds from the log.  This module does no I/O.
"""

from __future__ import annotations

import struct
from bisect import bisect_right

__all__ = ["OFFSET_ENTRY", "TIME_ENTRY", "SparseIndex", "decode_offset_index", "decode_time_index"]

OFFSET_ENTRY = struct.Struct(">ii")
TIME_ENTRY = struct.Struct(">qi")


class SparseIndex:
    """Sorted (key, value) pairs with floor look-up.

    ``keys`` strictly increase; ``values`` never decrease.  Event loop only, never awaits.
    """

    __slots__ = ("keys", "values")

    def __init__(self, keys: list[int] | None = None, values: list[int] | None = None) -> None:
        self.keys: list[int] = keys if keys is not None else []
        self.values: list[int] = values if values is not None else []

    def __len__(self) -> int:
        return len(self.keys)

    def last(self) -> tuple[int, int] | None:
        return (self.keys[-1], self.values[-1]) if self.keys else None

    def can_append(self, key: int, value: int) -> bool:
        return not self.keys or (key > self.keys[-1] and value >= self.values[-1])

    def append(self, key: int, value: int) -> bool:
        """Add an entry if it keeps the index sorted; returns whether it was added."""
        if not self.can_append(key, value):
            return False
        self.keys.append(key)
        self.values.append(value)
        return True

    def floor(self, key: int) -> tuple[int, int] | None:
        """The entry with the largest key <= ``key``, or None if every key is larger."""
        i = bisect_right(self.keys, key) - 1
        if i < 0:
            return None
        return self.keys[i], self.values[i]

    def floor_value(self, value: int) -> tuple[int, int] | None:
        """The entry with the largest value <= ``value``, or None if every value is larger
        (for an offset index: the last indexed batch starting at or before a position)."""
        i = bisect_right(self.values, value) - 1
        if i < 0:
            return None
        return self.keys[i], self.values[i]

    def truncate_values_from(self, value: int) -> None:
        """Drop every entry whose value is >= ``value`` (after the log is cut at that point)."""
        i = len(self.values)
        while i > 0 and self.values[i - 1] >= value:
            i -= 1
        del self.keys[i:]
        del self.values[i:]


def _decode(data: bytes, entry: struct.Struct, value_limit: int | None) -> SparseIndex | None:
    if len(data) % entry.size:
        return None
    idx = SparseIndex()
    for key, value in entry.iter_unpack(data):
        if value_limit is not None and value >= value_limit:
            return None
        if not idx.append(key, value):
            return None
    return idx


def decode_offset_index(data: bytes, log_size: int) -> SparseIndex | None:
    """Parse an offset index file; None if torn, unsorted, or pointing past ``log_size``."""
    idx = _decode(data, OFFSET_ENTRY, log_size)
    if idx is not None and idx.values and idx.values[0] < 0:
        return None
    return idx


def decode_time_index(data: bytes) -> SparseIndex | None:
    """Parse a time index file (key timestamp, value relative offset); None if inconsistent."""
    return _decode(data, TIME_ENTRY, None)
