"""One log segment: ``<base>.log`` with its ``.index`` and ``.timeindex`` (file I/O).

Theory of operation
-------------------
A segment holds whole record batches with offsets from ``base_offset`` up to (not
including) the next segment's base.  Appends go to the end of ``.log`` with one
``os.write`` per append (the file is opened ``O_APPEND``); reads are ``os.pread`` of a
byte range, so readers never move a file position.

The indexes live in memory (:class:`~shoal.log.index.SparseIndex`).  Their files are
written whole, when the segment is validated (:meth:`Segment.recover`) and when it is
sealed (:meth:`Segment.seal`, with an fsync); the active segment's index files may lag,
which is harmless because the active segment is always validated and re-indexed on
open.  On open, a segment either trusts its index files (closed segments below the
recovery point, if the files decode consistently) or rebuilds them while validating
its batches, cutting the file at the first torn or corrupt batch.  ``next_offset`` (one past the last offset of the last batch),
``max_timestamp`` and its offset are tracked for roll, retention and ListOffsets.

A small map from "offset one past a read" to its byte position makes a sequential
consumer's next look-up O(1).

Descriptors
-----------
A segment holds at most one descriptor, on its ``.log`` (index files are opened only to
be rewritten), and only while it is among the most recently used segments of its
:class:`OpenSegments`, an LRU shared by every partition of a store.  Every use of
:attr:`Segment.fd` reopens the file if it was closed and marks the segment used; the
least recently used segment beyond the LRU's capacity has its descriptor closed.  So a
broker with 10,000 partitions holds at most ``capacity`` segment descriptors, however
many segments exist; busy partitions keep theirs open.  Closing a descriptor loses
nothing: written bytes are in the page cache, and a later ``fdatasync`` on a new
descriptor of the same file makes them durable (Linux syncs the file, not the
descriptor).  When ``open`` fails with EMFILE or ENFILE, the LRU closes half of its
descriptors, lowers its capacity (which then grows back by one every 16 opens), logs it
and tries once more; a second failure raises OSError to the caller (a Produce then fails with KAFKA_STORAGE_ERROR and the next one
tries again).

Concurrency: event loop only; a segment is owned by one PartitionLog.
"""

from __future__ import annotations

import errno
import logging
import os
import resource
import struct
from collections import OrderedDict
from dataclasses import replace
from pathlib import Path

from shoal.errors import FsyncError
from shoal.log.index import OFFSET_ENTRY, TIME_ENTRY, SparseIndex, decode_offset_index, decode_time_index
from shoal.protocol.batch import HEADER_SIZE, LOG_OVERHEAD, BatchHeader, scan_valid_prefix, read_header

__all__ = ["Segment", "OpenSegments", "FileSlice", "segment_name", "RECOVERY_CHUNK", "open_files_limit"]

log = logging.getLogger("shoal.log")

RECOVERY_CHUNK = 8 * 1024 * 1024
_BASE_LEN = struct.Struct(">qi")
_DELTA = struct.Struct(">i")
_MAXTS = struct.Struct(">q")
_POS_CACHE_MAX = 64
_LOG_FLAGS = os.O_RDWR | os.O_APPEND
MIN_OPEN_SEGMENTS = 16
_REGROW_EVERY = 16


def open_files_limit() -> int:
    """The process's soft RLIMIT_NOFILE (a large number when unlimited)."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


class OpenSegments:
    """The segments whose ``.log`` descriptor is open, least recently used first.

    ``capacity`` defaults to half the soft RLIMIT_NOFILE, leaving the other half for
    sockets and short-lived descriptors.  Event loop only, never awaits.
    """

    __slots__ = ("capacity", "max_capacity", "_lru", "opens", "evictions")

    def __init__(self, capacity: int | None = None) -> None:
        self.capacity = max(MIN_OPEN_SEGMENTS, capacity if capacity is not None else open_files_limit() // 2)
        """How many descriptors may be open now (lowered after EMFILE, then regrown slowly)."""
        self.max_capacity = self.capacity
        self._lru: OrderedDict[Segment, None] = OrderedDict()
        self.opens = 0
        """Descriptors opened so far (statistics)."""
        self.evictions = 0
        """Descriptors closed because the LRU was full (statistics)."""

    def __len__(self) -> int:
        return len(self._lru)

    def __contains__(self, seg: object) -> bool:
        return seg in self._lru

    def open(self, seg: "Segment", flags: int = _LOG_FLAGS) -> int:
        """Open ``seg``'s log file, make it the most recently used, evict beyond capacity.

        Raises OSError if the file cannot be opened, even after closing descriptors on
        EMFILE/ENFILE.
        """
        fd = self.os_open(seg.log_path, flags)
        self.opens += 1
        if self.capacity < self.max_capacity and self.opens % _REGROW_EVERY == 0:
            self.capacity += 1
        seg._fd = fd
        self._lru[seg] = None
        if len(self._lru) > self.capacity:
            self._close_oldest(len(self._lru) - self.capacity)
        return fd

    def fsync_dir(self, path: Path) -> None:
        """fsync a directory, opened with :meth:`os_open` (so a descriptor shortage closes
        segment descriptors instead of failing).  Raises OSError."""
        fd = self.os_open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def os_open(self, path: Path, flags: int) -> int:
        """``os.open`` that, on EMFILE/ENFILE, closes half of the segment descriptors, lowers
        the capacity, logs it and tries once more.  Raises OSError."""
        try:
            return os.open(path, flags, 0o644)
        except OSError as exc:
            if exc.errno not in (errno.EMFILE, errno.ENFILE) or len(self._lru) < 2:
                raise
            before = len(self._lru)
            self._close_oldest(max(1, before // 2))
            self.capacity = max(MIN_OPEN_SEGMENTS, len(self._lru))
            log.warning("opening %s failed (%s): closed %d segment descriptors, keeping at most %d open",
                        path, exc.strerror, before - len(self._lru), self.capacity)
            return os.open(path, flags, 0o644)

    def read_file(self, path: Path) -> bytes:
        """The whole content of a small file (an index), opened through :meth:`os_open`."""
        fd = self.os_open(path, os.O_RDONLY)
        try:
            chunks = []
            while chunk := os.read(fd, 1 << 20):
                chunks.append(chunk)
            return b"".join(chunks)
        finally:
            os.close(fd)

    def touch(self, seg: "Segment") -> None:
        self._lru.move_to_end(seg)

    def forget(self, seg: "Segment") -> None:
        self._lru.pop(seg, None)

    def _close_oldest(self, n: int) -> None:
        for _ in range(min(n, len(self._lru) - 1)):
            seg, _ = self._lru.popitem(last=False)
            seg._close_fd()
            self.evictions += 1


_DEFAULT: OpenSegments | None = None


def default_open_segments() -> OpenSegments:
    """The LRU used by segments opened without one (sized on first use)."""
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = OpenSegments()
    return _DEFAULT


def segment_name(base_offset: int) -> str:
    return f"{base_offset:020d}"


class FileSlice:
    """Whole batches of a segment's log file, read only when they are sent (a Fetch answer's
    records, as Kafka's FileRecords): the connection reads them into its reused scratch
    buffer and writes them to the socket at once, instead of each read allocating memory.

    A slice stays usable while its segment is neither closed nor truncated (compaction
    swaps, retention, a follower's truncation, deletion all do one or the other) and still
    holds its bytes; :meth:`usable` says so at the moment of sending, on the event loop.
    """

    __slots__ = ("segment", "position", "length", "_changes")

    def __init__(self, segment: "Segment", position: int, length: int) -> None:
        self.segment = segment
        self.position = position
        self.length = length
        self._changes = segment._changes

    def __len__(self) -> int:
        return self.length

    def __repr__(self) -> str:
        return f"FileSlice({self.segment.log_path.name}, {self.position}, {self.length})"

    def part(self, skip: int, length: int) -> "FileSlice":
        """``length`` bytes of this slice from ``skip`` on, usable while this slice is."""
        sub = FileSlice(self.segment, self.position + skip, length)
        sub._changes = self._changes
        return sub

    def usable(self) -> bool:
        seg = self.segment
        return seg._changes == self._changes and seg.size >= self.position + self.length

    def read(self, skip: int = 0) -> bytes:
        """The slice's bytes from ``skip`` on, read into memory.  Raises OSError, also when
        the slice is no longer usable."""
        fd = self._usable_fd()
        data = os.pread(fd, self.length - skip, self.position + skip)
        if len(data) != self.length - skip:
            raise OSError(errno.EIO, f"{self!r}: short read")
        return data

    def read_into(self, buffer: memoryview) -> None:
        """Read the whole slice into ``buffer`` (exactly its length).  Raises OSError, also
        when the slice is no longer usable."""
        if os.preadv(self._usable_fd(), [buffer], self.position) != self.length:
            raise OSError(errno.EIO, f"{self!r}: short read")

    def _usable_fd(self) -> int:
        """The segment file's descriptor (reopened if the LRU closed it).  Raises OSError
        (ESTALE when the slice is no longer usable)."""
        if not self.usable():
            raise OSError(errno.ESTALE, f"{self!r}: the segment was truncated or closed")
        return self.segment.fd


class Segment:
    __slots__ = ("dir", "base_offset", "_fd", "_files", "size", "next_offset", "max_timestamp",
                 "offset_of_max_timestamp", "first_timestamp", "_oidx", "_tidx", "_index_on_disk",
                 "index_interval", "_bytes_since_index", "_pos_cache", "_dirty", "_changes")

    def __init__(self, directory: Path, base_offset: int, index_interval: int,
                 files: OpenSegments | None = None, *, create: bool = False) -> None:
        """A segment of ``directory``; nothing is opened unless ``create`` (a new, empty file).

        Raises OSError if ``create`` fails; a missing file is size 0 otherwise.
        """
        self.dir = directory
        self.base_offset = base_offset
        self.index_interval = index_interval
        self._files = files if files is not None else default_open_segments()
        self._fd = -1
        self.next_offset = base_offset
        self.max_timestamp = -1
        self.offset_of_max_timestamp = -1
        self.first_timestamp = -1
        self._oidx: SparseIndex | None = SparseIndex()
        self._tidx: SparseIndex | None = SparseIndex()
        self._index_on_disk = False
        """Whether the index files hold the in-memory indexes (then memory may drop them)."""
        self._bytes_since_index = 0
        self._pos_cache: dict[int, int] = {}
        self._dirty = False
        self._changes = 0
        """Counts truncations and closes: a :class:`FileSlice` taken before either is stale."""
        if create:
            self._files.open(self, _LOG_FLAGS | os.O_CREAT)
            self.size = os.fstat(self._fd).st_size
        else:
            try:
                self.size = os.stat(self.log_path).st_size
            except FileNotFoundError:
                self.size = 0

    @property
    def fd(self) -> int:
        """The log file's descriptor, reopened if the LRU closed it.  Raises OSError."""
        fd = self._fd
        if fd < 0:
            return self._files.open(self)
        self._files.touch(self)
        return fd

    @property
    def is_open(self) -> bool:
        """Whether the log file's descriptor is open now."""
        return self._fd >= 0

    @property
    def offset_index(self) -> SparseIndex:
        """The sparse offset index, read from its file if it is not in memory.  Raises OSError."""
        if self._oidx is None:
            self._read_index_files()
        return self._oidx  # type: ignore[return-value]

    @property
    def time_index(self) -> SparseIndex:
        """The sparse time index, read from its file if it is not in memory.  Raises OSError."""
        if self._tidx is None:
            self._read_index_files()
        return self._tidx  # type: ignore[return-value]

    @property
    def indexes_in_memory(self) -> bool:
        return self._oidx is not None

    def _read_index_files(self) -> None:
        """Load both indexes from their files; rebuild them from the log if the files do
        not decode consistently (a crash tore them)."""
        try:
            oidx = decode_offset_index(self._files.read_file(self.index_path), self.size)
            tidx = decode_time_index(self._files.read_file(self.time_index_path))
        except FileNotFoundError:
            oidx = tidx = None
        if oidx is None or tidx is None or (self.size and (not oidx.keys or oidx.values[0] != 0)):
            log.warning("rebuilding the indexes of %s", self.log_path)
            self.recover(check_crc=False)
            return
        self._oidx, self._tidx = oidx, tidx

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
    def open(cls, directory: Path, base_offset: int, index_interval: int, *, recover: bool,
             files: OpenSegments | None = None) -> tuple["Segment", bool]:
        """Open a segment; returns (segment, truncated).

        With ``recover`` (or if the index files are unusable) the whole file is validated
        batch by batch (length, magic, CRC) and cut after the last good batch; the indexes
        are rebuilt.  ``truncated`` tells whether bytes were cut.  Raises OSError.
        """
        seg = cls(directory, base_offset, index_interval, files)
        if not seg.log_path.exists():
            raise FileNotFoundError(errno.ENOENT, "segment file missing", str(seg.log_path))
        if not recover and seg._load_indexes():
            return seg, False
        return seg, seg.recover(check_crc=True)

    def _load_indexes(self) -> bool:
        """Check the index files against the log cheaply and take the segment's offsets and
        timestamps from them; the entries themselves are read on first use.

        Reads the first and last entries only (the full files are decoded, and rebuilt if
        inconsistent, when first needed).  Returns False if the files are missing or do
        not match the log.
        """
        try:
            fd = self._files.os_open(self.index_path, os.O_RDONLY)
            try:
                osize = os.fstat(fd).st_size
                if osize % OFFSET_ENTRY.size:
                    return False
                first_entry = os.pread(fd, OFFSET_ENTRY.size, 0)
                last_entry = os.pread(fd, OFFSET_ENTRY.size, osize - OFFSET_ENTRY.size) if osize else b""
            finally:
                os.close(fd)
            fd = self._files.os_open(self.time_index_path, os.O_RDONLY)
            try:
                tsize = os.fstat(fd).st_size
                if tsize % TIME_ENTRY.size:
                    return False
                last_time = os.pread(fd, TIME_ENTRY.size, tsize - TIME_ENTRY.size) if tsize else b""
            finally:
                os.close(fd)
        except FileNotFoundError:
            return False
        if osize % OFFSET_ENTRY.size or tsize % TIME_ENTRY.size or (self.size and not osize):
            return False
        pos = 0
        if osize:
            if OFFSET_ENTRY.unpack(first_entry) != (0, 0):
                return False
            _rel, pos = OFFSET_ENTRY.unpack(last_entry)
            if not 0 <= pos < max(self.size, 1):
                return False
        # the last batch: from the last index entry, walk headers to the end (short)
        last: BatchHeader | None = None
        while pos < self.size:
            h = self._header_at(pos)
            if h is None:
                return False
            last, pos = h, h.end
        if pos != self.size or (last is not None and last.base_offset < self.base_offset):
            return False
        self.next_offset = last.next_offset if last is not None else self.base_offset
        if last_time:
            ts, rel = TIME_ENTRY.unpack(last_time)
            self.max_timestamp = ts
            self.offset_of_max_timestamp = self.base_offset + rel
        if self.size:
            first = self._header_at(0)
            if first is None:
                return False
            self.first_timestamp = first.max_timestamp if first.max_timestamp >= 0 else first.base_timestamp
        self._bytes_since_index = self.size - (OFFSET_ENTRY.unpack(last_entry)[1] if osize else 0)
        self._oidx = self._tidx = None
        self._index_on_disk = True
        return True

    def recover(self, *, check_crc: bool = True, producer_cb=None) -> bool:
        """Validate every batch, cut a torn/corrupt tail, rebuild indexes. Returns whether it cut."""
        self._oidx = SparseIndex()
        self._tidx = SparseIndex()
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
            fd = self.fd
            os.ftruncate(fd, good_end)
            self.size = good_end
            os.fsync(fd)
        self._pos_cache.clear()
        if self.size:
            self.write_indexes(fsync=False)
        # An empty segment (a new one, or one cut to nothing) keeps its empty indexes in
        # memory only: it can only be the active segment, which every open validates and
        # re-indexes, and a roll writes the files. A new partition then creates one file.
        return truncated

    def _note_batch(self, position: int, h: BatchHeader) -> None:
        """Account for one batch at ``position`` (indexes, offsets, timestamps)."""
        rel = h.base_offset - self.base_offset
        if self.size == 0 or position == 0 or self._bytes_since_index >= self.index_interval:
            if self.offset_index.append(rel, position):
                self._bytes_since_index = 0
                if h.max_timestamp > self.max_timestamp:
                    self.time_index.append(h.max_timestamp, rel)
        self._bytes_since_index += h.size
        if h.max_timestamp > self.max_timestamp:
            self.max_timestamp = h.max_timestamp
            self.offset_of_max_timestamp = h.base_offset
        if self.first_timestamp < 0:
            self.first_timestamp = h.max_timestamp if h.max_timestamp >= 0 else h.base_timestamp
        self.next_offset = h.next_offset

    def write_indexes(self, *, fsync: bool) -> None:
        """Replace both index files with the in-memory indexes (fsynced if asked).  Raises OSError."""
        odata = b"".join(OFFSET_ENTRY.pack(k, v) for k, v in zip(self.offset_index.keys, self.offset_index.values))
        tdata = b"".join(TIME_ENTRY.pack(k, v) for k, v in zip(self.time_index.keys, self.time_index.values))
        for path, data in ((self.index_path, odata), (self.time_index_path, tdata)):
            fd = self._files.os_open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            try:
                if data:
                    os.write(fd, data)
                if fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)
        self._index_on_disk = True

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
        written.  Raises OSError on a failed write (or open), after cutting back any
        partial bytes.
        """
        oidx, tidx = self.offset_index, self.time_index  # read before writing: may raise OSError
        start = self.size
        mv = memoryview(data)
        written = 0
        fd = self.fd
        try:
            while written < len(mv):
                written += os.write(fd, mv[written:])
        except OSError:
            os.ftruncate(fd, start)
            raise
        self.size = start + len(mv)
        self._dirty = True
        self._index_on_disk = False
        for h, (base, nxt), ts in zip(headers, offsets, max_ts):
            pos = start + h.position
            rel = base - self.base_offset
            if pos == 0 or self._bytes_since_index >= self.index_interval:
                if oidx.append(rel, pos):
                    self._bytes_since_index = 0
                    if ts > self.max_timestamp:
                        tidx.append(ts, rel)
            self._bytes_since_index += h.size
            if ts > self.max_timestamp:
                self.max_timestamp = ts
                self.offset_of_max_timestamp = base
            if self.first_timestamp < 0:
                self.first_timestamp = ts
            self.next_offset = nxt
        self._remember(self.next_offset, self.size)

    def seal(self) -> None:
        """Before the segment stops being active: index its max timestamp, fsync the log,
        write and fsync the index files.  Raises OSError."""
        self.index_max_timestamp()
        self.sync()

    def index_max_timestamp(self) -> None:
        """Add the time-index entry of the segment's max timestamp if it is missing (in memory)."""
        last = self.time_index.last()
        if self.max_timestamp >= 0 and (last is None or last[0] < self.max_timestamp):
            rel = self.offset_of_max_timestamp - self.base_offset
            if self.time_index.append(self.max_timestamp, max(rel, last[1] if last else 0)):
                self._index_on_disk = False

    def sync(self) -> None:
        """fdatasync the log, then write and fsync both index files.  Raises OSError."""
        self.flush()
        self.write_indexes(fsync=True)

    def flush(self) -> None:
        """fdatasync the log file if it was written since the last flush.  Raises OSError."""
        if self._dirty:
            fd = self.fd
            try:
                os.fdatasync(fd)
            except OSError as exc:
                raise FsyncError(exc.errno, f"fdatasync of {self.log_path.name} failed: {exc.strerror}") from exc
            self._dirty = False

    def mark_flushed(self) -> None:
        """Everything written so far was fdatasynced elsewhere (a flush ticket)."""
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

    def read_batches(self, position: int, max_bytes: int, min_slice: int | None = None) -> "bytes | FileSlice":
        """Whole batches from ``position``: as many as fit in ``max_bytes``, at least one.

        With ``min_slice``, batches that come to at least ``min_slice`` bytes are returned
        as a :class:`FileSlice`, without reading them: up to the end of the segment (which
        holds only whole batches) when that fits in ``max_bytes``, else up to the last batch
        the offset index knows to start within ``max_bytes`` (within
        ``log.index.interval.bytes`` of it). Otherwise they are read as bytes.
        """
        avail = self.size - position
        if avail <= 0:
            return b""
        if min_slice is not None and avail >= min_slice:
            if avail <= max_bytes:
                end, nxt = self.size, self.next_offset
            else:
                entry = self.offset_index.floor_value(position + max_bytes)
                end, nxt = (entry[1], self.base_offset + entry[0]) if entry is not None else (0, 0)
            if end - position >= min_slice:
                self._remember(nxt, end)
                return FileSlice(self, position, end - position)
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
        self._changes += 1
        fd = self.fd
        os.ftruncate(fd, position)
        self.size = position
        os.fsync(fd)
        self.recover(check_crc=False)

    def _close_fd(self) -> None:
        """Close the descriptor (the LRU already dropped this segment), and let the indexes
        go from memory if their files hold them: an unused segment costs neither."""
        if self._index_on_disk:
            self._oidx = self._tidx = None
        fd, self._fd = self._fd, -1
        if fd >= 0:
            try:
                os.close(fd)
            except OSError:
                pass

    def close(self) -> None:
        self._changes += 1
        self._files.forget(self)
        self._close_fd()

    def delete(self) -> None:
        """Close and remove the files (index files first, so no stray log is left without them)."""
        self.close()
        for p in (self.index_path, self.time_index_path, self.log_path):
            try:
                p.unlink()
            except FileNotFoundError:
                pass
