"""One log segment: ``<base>.log`` with its ``.index`` and ``.timeindex`` (file I/O).

Theory of operation
-------------------
A segment holds whole record batches with offsets from ``base_offset`` up to (not
including) the next segment's base.  Appends go to the end of ``.log`` with one
``os.write`` per append (the file is opened ``O_APPEND``); reads are ``os.pread`` of a
byte range, so readers never move a file position.

The indexes live in memory (:class:`~shoal.log.index.SparseIndex`) and are mirrored to
their files by appending entries; they are not fsynced with the log: they can always be
rebuilt from it.  On open, a segment either trusts its index files (closed segments
below the recovery point, if the files decode consistently) or rebuilds them while
validating its batches (:meth:`Segment.recover`), cutting the file at the first torn or
corrupt batch.  ``next_offset`` (one past the last offset of the last batch),
``max_timestamp`` and its offset are tracked for roll, retention and ListOffsets.

A small map from "offset one past a read" to its byte position makes a sequential
consumer's next look-up O(1).

Concurrency: event loop only; a segment is owned by one PartitionLog.
"""

from __future__ import annotations

import os
import struct
from dataclasses import replace
from pathlib import Path

from shoal.log.index import OFFSET_ENTRY, TIME_ENTRY, SparseIndex, decode_offset_index, decode_time_index
from shoal.protocol.batch import HEADER_SIZE, LOG_OVERHEAD, BatchHeader, scan_valid_prefix, read_header

__all__ = ["Segment", "segment_name", "RECOVERY_CHUNK"]

RECOVERY_CHUNK = 8 * 1024 * 1024
_BASE_LEN = struct.Struct(">qi")
_DELTA = struct.Struct(">i")
_MAXTS = struct.Struct(">q")
_POS_CACHE_MAX = 64


def segment_name(base_offset: int) -> str:
    return f"{base_offset:020d}"


class Segment:
    __slots__ = ("dir", "base_offset", "fd", "size", "next_offset", "max_timestamp", "offset_of_max_timestamp",
                 "first_timestamp", "offset_index", "time_index", "index_interval", "_bytes_since_index",
                 "_index_fd", "_time_fd", "_pos_cache", "_dirty")

    def __init__(self, directory: Path, base_offset: int, index_interval: int) -> None:
        self.dir = directory
        self.base_offset = base_offset
        self.index_interval = index_interval
        self.fd = os.open(self.log_path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        self.size = os.fstat(self.fd).st_size
        self.next_offset = base_offset
        self.max_timestamp = -1
        self.offset_of_max_timestamp = -1
        self.first_timestamp = -1
        self.offset_index = SparseIndex()
        self.time_index = SparseIndex()
        self._bytes_since_index = 0
        self._index_fd = -1
        self._time_fd = -1
        self._pos_cache: dict[int, int] = {}
        self._dirty = False

    # --- paths ------------------------------------------------------------------------
    @property
    def log_path(self) -> Path:
        return self.dir / (segment_name(self.base_offset) + ".log")

    @property
    def index_path(self) -> Path:
        return self.dir / (segment_name(self.base_offset) + ".index")

    @property
    def time_index_path(self) -> Path:
        return self.dir / (segment_name(self.base_offset) + ".timeindex")

    # --- open / recover -------------------------------------------------------------
    @classmethod
    def open(cls, directory: Path, base_offset: int, index_interval: int, *, recover: bool) -> tuple["Segment", bool]:
        """Open a segment; returns (segment, truncated).

        With ``recover`` (or if the index files are unusable) the whole file is validated
        batch by batch (length, magic, CRC) and cut after the last good batch; the indexes
        are rebuilt.  ``truncated`` tells whether bytes were cut.
        """
        seg = cls(directory, base_offset, index_interval)
        if not recover and seg._load_indexes():
            return seg, False
        return seg, seg.recover(check_crc=True)

    def _load_indexes(self) -> bool:
        try:
            odata = self.index_path.read_bytes()
            tdata = self.time_index_path.read_bytes()
        except FileNotFoundError:
            return False
        oidx = decode_offset_index(odata, self.size)
        tidx = decode_time_index(tdata)
        if oidx is None or tidx is None:
            return False
        if self.size and (not oidx.keys or oidx.values[0] != 0):
            return False
        # the last batch: from the last index entry, walk headers to the end (short)
        pos = oidx.values[-1] if oidx.keys else 0
        last: BatchHeader | None = None
        while pos < self.size:
            h = self._header_at(pos)
            if h is None:
                return False
            last, pos = h, h.end
        if pos != self.size:
            return False
        self.offset_index, self.time_index = oidx, tidx
        self.next_offset = last.next_offset if last is not None else self.base_offset
        if last is not None and last.base_offset < self.base_offset:
            return False
        if tidx.keys:
            self.max_timestamp = tidx.keys[-1]
            self.offset_of_max_timestamp = self.base_offset + tidx.values[-1]
        if self.size:
            first = self._header_at(0)
            if first is None:
                return False
            self.first_timestamp = first.max_timestamp if first.max_timestamp >= 0 else first.base_timestamp
        self._bytes_since_index = self.size - (oidx.values[-1] if oidx.values else 0)
        self._open_index_files(truncate=False)
        return True

    def recover(self, *, check_crc: bool = True, producer_cb=None) -> bool:
        """Validate every batch, cut a torn/corrupt tail, rebuild indexes. Returns whether it cut."""
        self.offset_index = SparseIndex()
        self.time_index = SparseIndex()
        self.next_offset = self.base_offset
        self.max_timestamp = self.offset_of_max_timestamp = self.first_timestamp = -1
        self._bytes_since_index = 0
        pos = 0
        good_end = 0
        while pos < self.size:
            chunk = os.pread(self.fd, min(RECOVERY_CHUNK, self.size - pos), pos)
            headers, _ = scan_valid_prefix(chunk, 0, check_crc=check_crc)
            if not headers and len(chunk) >= LOG_OVERHEAD:
                # a batch larger than the chunk: read it whole
                (_, length) = _BASE_LEN.unpack_from(chunk, 0)
                if LOG_OVERHEAD + length > len(chunk) and pos + LOG_OVERHEAD + length <= self.size:
                    chunk = os.pread(self.fd, LOG_OVERHEAD + length, pos)
                    headers, _ = scan_valid_prefix(chunk, 0, check_crc=check_crc)
            if not headers:
                break
            bad = False
            for h in headers:
                if h.base_offset < self.next_offset:  # offsets must grow
                    bad = True
                    break
                self._note_batch(pos + h.position, h)
                good_end = pos + h.end
            if bad:
                break
            pos = good_end
        truncated = good_end < self.size
        if truncated:
            os.ftruncate(self.fd, good_end)
            self.size = good_end
            os.fsync(self.fd)
        self._pos_cache.clear()
        self._open_index_files(truncate=True)
        self._write_all_indexes()
        return truncated

    def _note_batch(self, position: int, h: BatchHeader) -> tuple[bytes, bytes]:
        """Account for one batch at ``position`` (indexes, offsets, timestamps); returns new index bytes."""
        oentry = tentry = b""
        rel = h.base_offset - self.base_offset
        if self.size == 0 or position == 0 or self._bytes_since_index >= self.index_interval:
            if self.offset_index.append(rel, position):
                oentry = OFFSET_ENTRY.pack(rel, position)
                self._bytes_since_index = 0
                if h.max_timestamp > self.max_timestamp and self.time_index.append(h.max_timestamp, rel):
                    tentry = TIME_ENTRY.pack(h.max_timestamp, rel)
        self._bytes_since_index += h.size
        if h.max_timestamp > self.max_timestamp:
            self.max_timestamp = h.max_timestamp
            self.offset_of_max_timestamp = h.base_offset
        if self.first_timestamp < 0:
            self.first_timestamp = h.max_timestamp if h.max_timestamp >= 0 else h.base_timestamp
        self.next_offset = h.next_offset
        return oentry, tentry

    def _open_index_files(self, *, truncate: bool) -> None:
        flags = os.O_RDWR | os.O_CREAT | os.O_APPEND | (os.O_TRUNC if truncate else 0)
        if self._index_fd < 0:
            self._index_fd = os.open(self.index_path, flags, 0o644)
            self._time_fd = os.open(self.time_index_path, flags, 0o644)
        elif truncate:
            os.ftruncate(self._index_fd, 0)
            os.ftruncate(self._time_fd, 0)

    def _write_all_indexes(self) -> None:
        os.write(self._index_fd, b"".join(OFFSET_ENTRY.pack(k, v)
                                          for k, v in zip(self.offset_index.keys, self.offset_index.values)))
        os.write(self._time_fd, b"".join(TIME_ENTRY.pack(k, v)
                                         for k, v in zip(self.time_index.keys, self.time_index.values)))

    def _header_at(self, pos: int) -> BatchHeader | None:
        data = os.pread(self.fd, HEADER_SIZE, pos)
        try:
            h = read_header(data, 0, whole=False) if len(data) == HEADER_SIZE else None
        except Exception:
            return None
        if h is None or pos + h.size > self.size:
            return None
        return replace(h, position=pos)

    # --- append ---------------------------------------------------------------------
    def append(self, data, headers: list[BatchHeader], offsets: list[tuple[int, int]], max_ts: list[int]) -> None:
        """Write ``data`` (whole batches, offsets assigned) at the end with one write.

        ``headers`` are the batch headers with positions relative to ``data``; ``offsets``
        gives each batch's (base_offset, next_offset) and ``max_ts`` its max timestamp as
        written.  Raises OSError on a failed write, after cutting back any partial bytes.
        """
        start = self.size
        mv = memoryview(data)
        written = 0
        try:
            while written < len(mv):
                written += os.write(self.fd, mv[written:])
        except OSError:
            os.ftruncate(self.fd, start)
            raise
        saved = (self.next_offset, self.max_timestamp, self.offset_of_max_timestamp, self.first_timestamp,
                 self._bytes_since_index, len(self.offset_index), len(self.time_index))
        try:
            self._account(start, len(mv), headers, offsets, max_ts)
        except OSError:  # an index file could not grow: take the whole append back
            self._undo_append(start, saved)
            raise

    def _undo_append(self, start: int, saved: tuple[int, ...]) -> None:
        (self.next_offset, self.max_timestamp, self.offset_of_max_timestamp, self.first_timestamp,
         self._bytes_since_index, n_offsets, n_times) = saved
        del self.offset_index.keys[n_offsets:], self.offset_index.values[n_offsets:]
        del self.time_index.keys[n_times:], self.time_index.values[n_times:]
        self._pos_cache.clear()
        os.ftruncate(self.fd, start)
        self.size = start
        try:  # entries the files kept beyond the memory's are harmless: the active segment's
            # indexes are rebuilt at the next open
            os.ftruncate(self._index_fd, n_offsets * OFFSET_ENTRY.size)
            os.ftruncate(self._time_fd, n_times * TIME_ENTRY.size)
        except OSError:
            pass

    def _account(self, start: int, length: int, headers: list[BatchHeader], offsets: list[tuple[int, int]],
                 max_ts: list[int]) -> None:
        self.size = start + length
        self._dirty = True
        oentries = []
        tentries = []
        for h, (base, nxt), ts in zip(headers, offsets, max_ts):
            pos = start + h.position
            rel = base - self.base_offset
            if pos == 0 or self._bytes_since_index >= self.index_interval:
                if self.offset_index.append(rel, pos):
                    oentries.append(OFFSET_ENTRY.pack(rel, pos))
                    self._bytes_since_index = 0
                    if ts > self.max_timestamp and self.time_index.append(ts, rel):
                        tentries.append(TIME_ENTRY.pack(ts, rel))
            self._bytes_since_index += h.size
            if ts > self.max_timestamp:
                self.max_timestamp = ts
                self.offset_of_max_timestamp = base
            if self.first_timestamp < 0:
                self.first_timestamp = ts
            self.next_offset = nxt
        if oentries:
            os.write(self._index_fd, b"".join(oentries))
        if tentries:
            os.write(self._time_fd, b"".join(tentries))
        self._remember(self.next_offset, self.size)

    def seal(self) -> None:
        """Before the segment stops being active: index its max timestamp, fsync all files."""
        self.index_max_timestamp()
        self.sync()

    def index_max_timestamp(self) -> None:
        """Add the time-index entry of the segment's max timestamp if it is missing.

        Raises OSError if the entry cannot be written; then the index is as before.
        """
        last = self.time_index.last()
        if self.max_timestamp >= 0 and (last is None or last[0] < self.max_timestamp):
            rel = self.offset_of_max_timestamp - self.base_offset
            n = len(self.time_index)
            if self.time_index.append(self.max_timestamp, max(rel, last[1] if last else 0)):
                try:
                    os.write(self._time_fd, TIME_ENTRY.pack(*self.time_index.last()))  # type: ignore[misc]
                except OSError:
                    del self.time_index.keys[n:], self.time_index.values[n:]
                    os.ftruncate(self._time_fd, n * TIME_ENTRY.size)
                    raise

    def sync(self) -> None:
        """fsync the log and both index files."""
        self.flush()
        os.fsync(self._index_fd)
        os.fsync(self._time_fd)

    def flush(self) -> None:
        if self._dirty:
            os.fdatasync(self.fd)
            self._dirty = False

    # --- read -----------------------------------------------------------------------
    def _remember(self, offset: int, position: int) -> None:
        if len(self._pos_cache) >= _POS_CACHE_MAX:
            self._pos_cache.clear()
        self._pos_cache[offset] = position

    def find_position(self, offset: int) -> int | None:
        """Byte position of the batch containing ``offset`` (or the first batch after it).

        None when no batch of this segment ends at or after ``offset``.
        """
        pos = self._pos_cache.get(offset)
        if pos is not None:
            return pos if pos < self.size else None
        entry = self.offset_index.floor(offset - self.base_offset)
        pos = entry[1] if entry is not None else 0
        while pos < self.size:
            data = os.pread(self.fd, 27, pos)
            if len(data) < 27:
                return None
            base, length = _BASE_LEN.unpack_from(data, 0)
            (delta,) = _DELTA.unpack_from(data, 23)
            if base + delta >= offset:
                return pos
            pos += LOG_OVERHEAD + length
        return None

    def read_batches(self, position: int, max_bytes: int) -> bytes:
        """Whole batches from ``position``: as many as fit in ``max_bytes``, at least one."""
        avail = self.size - position
        if avail <= 0:
            return b""
        n = min(max(max_bytes, HEADER_SIZE), avail)
        data = os.pread(self.fd, n, position)
        end = 0
        last_next = -1
        ln = len(data)
        while end + 27 <= ln:
            base, length = _BASE_LEN.unpack_from(data, end)
            total = LOG_OVERHEAD + length
            if end + total > ln:
                if end == 0:  # first batch larger than max_bytes: return it whole
                    data = os.pread(self.fd, total, position)
                    (delta,) = _DELTA.unpack_from(data, 23)
                    self._remember(base + delta + 1, position + total)
                    return data
                break
            (delta,) = _DELTA.unpack_from(data, end + 23)
            last_next = base + delta + 1
            end += total
        if end == 0:
            return b""
        if last_next >= 0:
            self._remember(last_next, position + end)
        return data if end == ln else data[:end]

    def batch_headers(self, start: int = 0):
        """Yield every batch header from byte ``start`` (positions absolute), reading in chunks."""
        pos = start
        while pos < self.size:
            chunk = os.pread(self.fd, min(RECOVERY_CHUNK, self.size - pos), pos)
            headers, end = scan_valid_prefix(chunk, 0, check_crc=False)
            if not headers:
                h = self._header_at(pos)
                if h is None:
                    return
                yield h
                pos = h.end
                continue
            for h in headers:
                yield replace(h, position=pos + h.position)
            pos += end

    def walk_headers(self, start: int = 0):
        """Yield every batch header from byte ``start`` with one small pread per batch.

        Cheaper than :meth:`batch_headers` when batches are large (reads 61 bytes per batch).
        """
        pos = start
        while pos < self.size:
            h = self._header_at(pos)
            if h is None:
                return
            yield h
            pos = h.end

    def read_at(self, position: int, size: int) -> bytes:
        return os.pread(self.fd, size, position)

    # --- truncate / close / delete --------------------------------------------------------
    def truncate_to_position(self, position: int) -> None:
        os.ftruncate(self.fd, position)
        self.size = position
        os.fsync(self.fd)
        self.recover(check_crc=False)

    def close(self) -> None:
        for fd in (self.fd, self._index_fd, self._time_fd):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self.fd = self._index_fd = self._time_fd = -1

    def delete(self) -> None:
        self.close()
        for p in (self.log_path, self.index_path, self.time_index_path):
            try:
                p.unlink()
            except FileNotFoundError:
                pass
