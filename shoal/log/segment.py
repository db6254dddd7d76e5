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
recovery point, if the files decode consistently and match the end of the log file) or
rebuilds them while validating its batches (:meth:`Segment.recover`): a torn write at
the end is cut; damage in bytes known to have been fsynced costs only those bytes (the
batches after them move to a segment of their own, :class:`Damage`).  ``next_offset``
(one past the last offset of the last batch), ``max_timestamp`` and its offset are
tracked for roll, retention and ListOffsets.

Bytes not validated at open are CRC-checked by the first :meth:`Segment.read` that
serves them (the checked ranges are remembered); corrupt bytes found then become holes
that reads step over and answer with CORRUPT_MESSAGE, logged once each.

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
from bisect import bisect_right
from collections import OrderedDict
from dataclasses import dataclass, replace
from pathlib import Path

from shoal.errors import FsyncError
from shoal.log.index import OFFSET_ENTRY, TIME_ENTRY, SparseIndex, decode_offset_index, decode_time_index
from shoal.protocol.batch import (
    HEADER_SIZE,
    LOG_OVERHEAD,
    BatchHeader,
    CorruptBatchError,
    compute_crc,
    read_header,
    scan_valid_prefix,
)

__all__ = [
    "RECOVERY_CHUNK",
    "Damage",
    "FileSlice",
    "OpenSegments",
    "Segment",
    "open_files_limit",
    "segment_name",
]

log = logging.getLogger("shoal.log")

RECOVERY_CHUNK = 8 * 1024 * 1024
_BASE_LEN = struct.Struct(">qi")
_DELTA = struct.Struct(">i")
_MAXTS = struct.Struct(">q")
_POS_CACHE_MAX = 64
_LOG_FLAGS = os.O_RDWR | os.O_APPEND
MIN_OPEN_SEGMENTS = 16
_REGROW_EVERY = 16
_MIN_LENGTH = HEADER_SIZE - LOG_OVERHEAD


def _fault(chunk: bytes, check_crc: bool) -> str:
    """Why the batch at the start of ``chunk`` is not valid (for the log)."""
    try:
        h = read_header(chunk, 0)
    except CorruptBatchError as exc:
        return str(exc)
    if check_crc and compute_crc(chunk, h) != h.crc:
        return "CRC-32C mismatch"
    return "invalid batch"


def open_files_limit() -> int:
    """The process's soft RLIMIT_NOFILE (a large number when unlimited)."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


class OpenSegments:
    """The segments whose ``.log`` descriptor is open, least recently used first.

    ``capacity`` defaults to half the soft RLIMIT_NOFILE, leaving the other half for
    sockets and short-lived descriptors.  Event loop only, never awaits.
    """

    __slots__ = ("_lru", "capacity", "evictions", "max_capacity", "opens")

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

    def open(self, seg: Segment, flags: int = _LOG_FLAGS) -> int:
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

    def touch(self, seg: Segment) -> None:
        self._lru.move_to_end(seg)

    def forget(self, seg: Segment) -> None:
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


@dataclass(frozen=True, slots=True)
class Damage:
    """Bytes of a segment that are not whole, valid batches, as :meth:`Segment.recover` found
    and handled them."""

    position: int
    """The first damaged byte: the segment's valid batches end here, and the file was cut here."""
    size: int
    """The file's size before recovery."""
    next_offset: int
    """The offset after the last valid batch before the damage (the first offset lost)."""
    reason: str
    """What was wrong at ``position`` (a torn batch, a CRC mismatch, offsets going back)."""
    resume_position: int = -1
    """Where the next valid batch after the damage starts (-1: there is none)."""
    resume_offset: int = -1
    """That batch's base offset (-1: none)."""
    moved: bool = False
    """The bytes from ``resume_position`` on were moved to a new segment named by
    ``resume_offset``: only the damaged bytes were lost."""

    @property
    def lost_bytes(self) -> int:
        return (self.resume_position if self.moved else self.size) - self.position


class _Ranges:
    """Sorted, disjoint byte ranges [start, end) of a segment (the ones whose batches were
    CRC-checked since it was opened).  Event loop only."""

    __slots__ = ("ends", "starts")

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.ends: list[int] = []

    def covers(self, start: int, end: int) -> bool:
        i = bisect_right(self.starts, start) - 1
        return i >= 0 and self.ends[i] >= end

    def add(self, start: int, end: int) -> None:
        if end <= start:
            return
        i = bisect_right(self.starts, start) - 1
        if i >= 0 and self.ends[i] >= start:  # touches the range before: merge into it
            start = self.starts[i]
            end = max(end, self.ends[i])
        else:
            i += 1
        j = i
        while j < len(self.starts) and self.starts[j] <= end:  # swallow the ranges it reaches
            end = max(end, self.ends[j])
            j += 1
        self.starts[i:j] = [start]
        self.ends[i:j] = [end]

    def clip(self, size: int) -> None:
        """Forget everything at or beyond ``size`` (the file was cut there)."""
        while self.starts and self.starts[-1] >= size:
            self.starts.pop()
            self.ends.pop()
        if self.ends and self.ends[-1] > size:
            self.ends[-1] = size

    def clear(self) -> None:
        self.starts.clear()
        self.ends.clear()


class FileSlice:
    """Whole batches of a segment's log file, read only when they are sent (a Fetch answer's
    records, as Kafka's FileRecords): the connection reads them into its reused scratch
    buffer and writes them to the socket at once, instead of each read allocating memory.

    A slice stays usable while its segment is neither closed nor truncated (compaction
    swaps, retention, a follower's truncation, deletion all do one or the other) and still
    holds its bytes; :meth:`usable` says so at the moment of sending, on the event loop.
    """

    __slots__ = ("_changes", "length", "position", "segment")

    def __init__(self, segment: Segment, position: int, length: int) -> None:
        self.segment = segment
        self.position = position
        self.length = length
        self._changes = segment._changes

    def __len__(self) -> int:
        return self.length

    def __repr__(self) -> str:
        return f"FileSlice({self.segment.log_path.name}, {self.position}, {self.length})"

    def part(self, skip: int, length: int) -> FileSlice:
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
    __slots__ = (
        "_bytes_since_index",
        "_changes",
        "_dirty",
        "_fd",
        "_files",
        "_holes",
        "_index_on_disk",
        "_log_path",
        "_oidx",
        "_pos_cache",
        "_tidx",
        "_verified",
        "base_offset",
        "dir",
        "first_timestamp",
        "index_interval",
        "max_timestamp",
        "next_offset",
        "offset_of_max_timestamp",
        "size",
    )

    def __init__(self, directory: Path, base_offset: int, index_interval: int,
                 files: OpenSegments | None = None, *, create: bool = False) -> None:
        """A segment of ``directory``; nothing is opened unless ``create`` (a new, empty file).

        Raises OSError if ``create`` fails; a missing file is size 0 otherwise.
        """
        self.dir = directory
        self.base_offset = base_offset
        self._log_path: Path | None = None
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
        self._verified = _Ranges()
        """Byte ranges whose batches are known to be whole and CRC-valid (checked when
        recovered, appended or first read): reads check the rest (:meth:`read_batches`)."""
        self._holes: dict[int, tuple[int, int]] = {}
        """Corrupt bytes reads found (logged once each): their position -> (position, base
        offset) of the next valid batch after them (the segment's end and next offset if
        none).  Reads of offsets below that batch answer CORRUPT_MESSAGE; later ones skip
        the hole."""
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
            damage = self.recover(check_crc=False)
            if damage is not None:
                log.error("%s: cut %d bytes at byte %d (%s) while rebuilding its indexes; offsets from %d "
                          "on in this segment are lost", self.log_path, damage.lost_bytes, damage.position,
                          damage.reason, damage.next_offset)
            return
        self._oidx, self._tidx = oidx, tidx

    # --- paths ------------------------------------------------------------------------
    @property
    def log_path(self) -> Path:
        path = self._log_path
        if path is None:  # built once: every flush of the active segment names it
            path = self._log_path = self.dir / (segment_name(self.base_offset) + ".log")
        return path

    @property
    def index_path(self) -> Path:
        return self.dir / (segment_name(self.base_offset) + ".index")

    @property
    def time_index_path(self) -> Path:
        return self.dir / (segment_name(self.base_offset) + ".timeindex")

    @property
    def txn_index_path(self) -> Path:
        """Kafka's aborted-transaction index of the segment (written by the partition log)."""
        return self.dir / (segment_name(self.base_offset) + ".txnindex")

    # --- open / recover -------------------------------------------------------------
    @classmethod
    def open(cls, directory: Path, base_offset: int, index_interval: int, *, recover: bool,
             files: OpenSegments | None = None, salvage_below: int | None = None,
             next_segment: Segment | None = None) -> tuple[Segment, Damage | None]:
        """Open a segment; returns (segment, damage found and handled, or None).

        With ``recover`` (or if the index files are unusable) the whole file is validated
        batch by batch (length, magic, CRC, growing offsets) and its indexes rebuilt; what
        is not whole, valid batches is handled as :meth:`recover` says (``salvage_below``;
        the offsets it may hold end at ``next_segment``'s base).  Without, only the index
        files and the batches after the last index entry are checked (Kafka's sanity
        check); reads then CRC-check each batch the first time they serve it.

        A segment whose offsets, by its unchecked last header, reach into ``next_segment``
        without holding a copy of its first batch (what an interrupted compaction merge
        leaves) is validated too: a damaged header must not make it look longer than it is.
        Raises OSError.
        """
        seg = cls(directory, base_offset, index_interval, files)
        if not seg.log_path.exists():
            raise FileNotFoundError(errno.ENOENT, "segment file missing", str(seg.log_path))
        limit = next_segment.base_offset if next_segment is not None else None
        if (not recover and seg._load_indexes()
                and (limit is None or seg.next_offset <= limit or seg.holds_copy_of(next_segment))):
            return seg, None
        return seg, seg.recover(check_crc=True, salvage_below=salvage_below, limit_offset=limit)

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

    def recover(self, *, check_crc: bool = True, salvage_below: int | None = None,
                limit_offset: int | None = None) -> Damage | None:
        """Validate every batch, rebuild the indexes, and cut what is not whole, valid batches.

        Returns None if the whole file is valid, else the :class:`Damage` (truthy).  By
        default the file is cut at the first damaged batch, as Kafka cuts a torn write.
        With ``salvage_below`` and damage that starts below that offset (bytes that were
        fsynced: a closed segment, or the active one below the recovery point), only the
        damaged bytes are lost: the next valid batch after them (found by a byte scan, CRC
        checked, its base offset at least the expected next offset and its last offset
        below ``limit_offset``) and everything after it are moved to a new segment file
        named by that batch's base offset (``Damage.resume_offset``, which the caller opens
        next), then this file is cut at the damage.  ``check_crc=False`` only rebuilds the
        indexes (of bytes validated before).  Raises OSError.
        """
        self._oidx = SparseIndex()
        self._tidx = SparseIndex()
        self.next_offset = self.base_offset
        self.max_timestamp = self.offset_of_max_timestamp = self.first_timestamp = -1
        self._bytes_since_index = 0
        pos = 0
        good_end = 0
        reason = ""
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
                reason = _fault(chunk, check_crc)
                break
            bad = False
            for h in headers:
                if h.base_offset < self.next_offset:  # offsets must grow
                    reason = f"batch base offset {h.base_offset} below the offset {self.next_offset} expected"
                    bad = True
                    break
                self._note_batch(pos + h.position, h)
                good_end = pos + h.end
            if bad:
                break
            pos = good_end
        damage = None
        if good_end < self.size:
            found = self._find_batch(good_end + 1, self.next_offset, limit_offset) if check_crc else None
            damage = Damage(good_end, self.size, self.next_offset, reason or "a torn batch",
                            *(found if found is not None else (-1, -1)))
            if found is not None and salvage_below is not None and self.next_offset < salvage_below:
                self._move_tail(found[0], found[1])
                damage = replace(damage, moved=True)
            fd = self.fd
            self._changes += 1
            os.ftruncate(fd, good_end)
            self.size = good_end
            os.fsync(fd)
        self._pos_cache.clear()
        self._verified.clip(self.size)
        if check_crc:
            self._verified.add(0, self.size)
            self._holes.clear()
        else:
            self._holes = {p: h for p, h in self._holes.items() if h[0] <= self.size}
        if self.size:
            self.write_indexes(fsync=False)
        # An empty segment (a new one, or one cut to nothing) keeps its empty indexes in
        # memory only: it can only be the active segment, which every open validates and
        # re-indexes, and a roll writes the files. A new partition then creates one file.
        return damage

    def holds_copy_of(self, other: Segment) -> bool:
        """Whether ``other``'s first batch is, byte for byte, one of this segment's (what a
        compaction merge copied before it was interrupted).  Raises OSError."""
        if other.size == 0:
            return True  # nothing in it to disagree with
        h = other._header_at(0)
        if h is None:
            return False
        pos = self.find_position(h.base_offset)
        return pos is not None and self.read_at(pos, h.size) == other.read_at(0, h.size)

    def _find_batch(self, start: int, min_offset: int, limit_offset: int | None) -> tuple[int, int] | None:
        """(position, base offset) of the first valid batch at or after byte ``start`` whose
        offsets lie in [``min_offset``, ``limit_offset``), or None: a byte-by-byte scan for
        a header that parses, fits in the file and whose CRC-32C matches.  Raises OSError."""
        pos = start
        while pos + HEADER_SIZE <= self.size:
            chunk = os.pread(self.fd, min(RECOVERY_CHUNK, self.size - pos), pos)
            n = len(chunk)
            i = chunk.find(b"\x02", 16)  # the magic byte, 16 bytes into a batch
            while i != -1 and i - 16 + HEADER_SIZE <= n:
                c = i - 16
                try:
                    h = read_header(chunk, c, whole=False)
                except CorruptBatchError:
                    h = None
                if (h is not None and h.base_offset >= min_offset and pos + c + h.size <= self.size
                        and (limit_offset is None or h.last_offset < limit_offset)):
                    data = chunk[c:c + h.size] if c + h.size <= n else os.pread(self.fd, h.size, pos + c)
                    if len(data) == h.size and compute_crc(data, replace(h, position=0)) == h.crc:
                        return pos + c, h.base_offset
                i = chunk.find(b"\x02", i + 1)
            if pos + n >= self.size:
                return None
            pos += n - HEADER_SIZE + 1  # candidates that did not fit are looked at again
        return None

    def _move_tail(self, position: int, base_offset: int) -> None:
        """Copy bytes [``position``, size) to a new segment file named by ``base_offset``:
        written under a temporary name, fsynced, renamed, the directory fsynced (a crash
        leaves the whole new file or none, and this file still whole).  Raises OSError."""
        path = self.dir / (segment_name(base_offset) + ".log")
        tmp = path.with_name(path.name + ".tmp")
        out = self._files.os_open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        try:
            pos = position
            while pos < self.size:
                chunk = os.pread(self.fd, min(RECOVERY_CHUNK, self.size - pos), pos)
                if not chunk:
                    raise OSError(errno.EIO, f"{self.log_path}: short read at {pos}")
                view = memoryview(chunk)
                while view:
                    view = view[os.write(out, view):]
                pos += len(chunk)
            os.fsync(out)
        finally:
            os.close(out)
        for stale in (".index", ".timeindex"):  # of an earlier attempt: the new file is indexed when opened
            (self.dir / (segment_name(base_offset) + stale)).unlink(missing_ok=True)
        os.replace(tmp, path)
        self._files.fsync_dir(self.dir)

    def _note_batch(self, position: int, h: BatchHeader) -> None:
        """Account for one batch at ``position`` (indexes, offsets, timestamps)."""
        rel = h.base_offset - self.base_offset
        if (self.size == 0 or position == 0 or self._bytes_since_index >= self.index_interval) \
                and self.offset_index.append(rel, position):
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
        self._verified.add(start, self.size)  # appends are validated (CRC included) before
        self._dirty = True
        self._index_on_disk = False
        for h, (base, nxt), ts in zip(headers, offsets, max_ts):
            pos = start + h.position
            rel = base - self.base_offset
            if (pos == 0 or self._bytes_since_index >= self.index_interval) and oidx.append(rel, pos):
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
        for start, (end, _) in self._holes.items():
            if start < pos < end:  # the index entry points into damaged bytes: walk from their start
                pos = start
        while pos < self.size:
            hole = self._holes.get(pos)
            if hole is not None:  # corrupt bytes a read found: answered as such, or skipped
                if offset < hole[1]:
                    return pos
                pos = hole[0]
                continue
            data = os.pread(self.fd, 27, pos)
            if len(data) < 27:
                return None
            base, length = _BASE_LEN.unpack_from(data, 0)
            (delta,) = _DELTA.unpack_from(data, 23)
            if base + delta >= offset or length < _MIN_LENGTH or pos + LOG_OVERHEAD + length > self.size:
                return pos  # (a damaged header: the read from here reports it)
            pos += LOG_OVERHEAD + length
        return None

    def read(self, offset: int, max_bytes: int, min_slice: int | None = None) -> bytes | FileSlice | None:
        """Whole batches from the one holding ``offset`` (or the first after it), as
        :meth:`read_batches` returns them; None if no batch of this segment ends at or after
        ``offset``.

        Bytes no read, recovery or append has CRC-checked yet (a segment below the recovery
        point is not validated at start, as in Kafka) are checked first, once.  At the first
        corrupt batch the whole segment is scanned once: each run of damaged bytes becomes a
        hole, logged once at ERROR, that later reads skip.  The answer stops before a hole,
        and a read of an offset inside one raises CorruptBatchError (CORRUPT_MESSAGE): the
        consumer is never served damaged bytes.  Raises OSError.
        """
        for attempt in (0, 1):
            pos = self.find_position(offset)
            if pos is None:
                return None
            out = self.read_batches(pos, max_bytes, min_slice)
            end = pos + len(out)
            if end == pos or self._verified.covers(pos, end):
                return out
            bad = self._verify(pos, end, out if type(out) is not FileSlice else None)
            if bad is None:
                return out
            bad_pos, reason = bad
            if bad_pos in self._holes or attempt:
                break
            # a look-up may have walked through a damaged length field: map every hole, then look again
            self._map_holes()
        if bad_pos == pos:
            raise CorruptBatchError(f"corrupt record batch in segment {self.base_offset} of {self.dir.name} at "
                                    f"byte {pos}: {reason}", pos)
        keep = bad_pos - pos
        if type(out) is FileSlice:
            if min_slice is not None and keep >= min_slice:
                return FileSlice(self, pos, keep)
            return os.pread(self.fd, keep, pos)
        return out[:keep]

    def check_all(self) -> bool:
        """Whether every byte is whole, CRC-valid batches (checked once).  Damage found is
        mapped and logged as :meth:`read` maps it.  Raises OSError."""
        if self._verified.covers(0, self.size):
            return True
        if self._holes:
            return False
        if self._verify(0, self.size, None) is None:
            return True
        self._map_holes()
        return False

    def _map_holes(self) -> None:
        """Scan the whole segment (CRC included) and note every run of damaged bytes in
        :attr:`_holes`, logging each new one at ERROR.  The file is not changed.  Raises OSError."""
        pos = 0
        expected = self.base_offset
        self._pos_cache.clear()
        while pos < self.size:
            hole = self._holes.get(pos)
            if hole is not None:
                pos, expected = hole
                continue
            chunk = os.pread(self.fd, min(RECOVERY_CHUNK, self.size - pos), pos)
            headers, _ = scan_valid_prefix(chunk, 0, check_crc=True)
            good = 0
            for h in headers:
                if h.base_offset < expected:
                    break
                expected = h.next_offset
                good = h.end
            if good:
                self._verified.add(pos, pos + good)
                pos += good
                continue
            h, reason = self._valid_batch_at(pos)  # one larger than the chunk, or damage
            if h is not None and h.base_offset >= expected:
                self._verified.add(pos, h.end)
                expected, pos = h.next_offset, h.end
                continue
            if h is not None:
                reason = f"batch base offset {h.base_offset} below the offset {expected} expected"
            found = self._find_batch(pos + 1, expected, self.next_offset)
            hole = found if found is not None else (self.size, self.next_offset)
            self._holes[pos] = hole
            log.error("partition %s: corrupt bytes in segment %d at bytes %d-%d (%s): offsets %d-%d (%d) are "
                      "answered CORRUPT_MESSAGE, never served; %s. Restarting the broker without the partition's "
                      "recovery-point file validates every segment and cuts only the damaged bytes",
                      self.dir.name, self.base_offset, pos, hole[0] - 1, reason, expected, hole[1] - 1,
                      hole[1] - expected, "the batches after them are served" if found is not None
                      else "nothing valid follows in this segment")
            pos, expected = hole

    def _valid_batch_at(self, pos: int) -> tuple[BatchHeader | None, str]:
        """The batch at byte ``pos`` if it is whole, within the file and CRC-valid (with its
        absolute position), else (None, why).  Raises OSError."""
        try:
            h = read_header(os.pread(self.fd, HEADER_SIZE, pos), 0, whole=False)
        except CorruptBatchError as exc:
            return None, str(exc)
        if pos + h.size > self.size:
            return None, "batch extends past the end of the segment"
        whole = os.pread(self.fd, h.size, pos)
        if len(whole) != h.size or compute_crc(whole, h) != h.crc:
            return None, "CRC-32C mismatch"
        return replace(h, position=pos), ""

    def _verify(self, start: int, end: int, data: bytes | None) -> tuple[int, str] | None:
        """CRC-check the batches of bytes [``start``, ``end``) (``data``: those bytes, else read
        from the file); returns (position, why) of the first batch that is not whole and valid,
        or None.  Marks what passed as verified.  Raises OSError."""
        pos = start
        try:
            while pos < end:
                if data is not None:
                    chunk = memoryview(data)[pos - start:]
                else:
                    chunk = os.pread(self.fd, min(RECOVERY_CHUNK, end - pos), pos)
                headers, valid = scan_valid_prefix(chunk, 0, check_crc=True)
                if headers:
                    pos += valid
                    continue
                h, reason = self._valid_batch_at(pos)  # larger than the chunk, or damaged
                if h is None:
                    return pos, reason
                if h.end > end:
                    return pos, "batch extends past the data read"
                pos = h.end
            return None
        finally:
            self._verified.add(start, pos)

    def read_batches(self, position: int, max_bytes: int, min_slice: int | None = None) -> bytes | FileSlice:
        """Whole batches from ``position``: as many as fit in ``max_bytes``, at least one.

        With ``min_slice``, batches that come to at least ``min_slice`` bytes are returned
        as a :class:`FileSlice`, without reading them: up to the end of the segment (which
        holds only whole batches) when that fits in ``max_bytes``, else up to the last batch
        the offset index knows to start within ``max_bytes`` (within
        ``log.index.interval.bytes`` of it). Otherwise they are read as bytes.  Nothing is
        CRC-checked here (:meth:`read` does).
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
            if length < _MIN_LENGTH or position + end + total > self.size:  # damaged: the check reports it
                return data[:end] if end else data
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
        for p in (self.index_path, self.time_index_path, self.txn_index_path, self.log_path):
            try:
                p.unlink()
            except FileNotFoundError:
                pass
