"""One partition's log: segments, append, read, recovery, retention (file I/O).

Theory of operation
-------------------
A partition directory ``<topic>-<partition>`` holds segments ``<20-digit base>.log``
(+ ``.index``, ``.timeindex``, written when a segment is sealed or recovered with records:
the active segment's indexes live in memory, rebuilt at every open) and two small
checkpoint files, each replaced atomically (write temp, fsync, rename, fsync directory):

* ``log-start-offset``: raised by DeleteRecords and retention; records below it are gone;
* ``recovery-point``: every byte of the log below this offset was fsynced (written when a
  segment is rolled, after fsyncing it, and at close).

Invariants: segments are contiguous and ordered; only the last (active) one is written;
every byte of every segment is a whole, CRC-valid batch with growing offsets; the log end
offset (LEO) is the active segment's ``next_offset``; the high watermark equals the LEO
(one broker, no replicas) unless a replica manager sets it (cluster mode: the offset every
in-sync replica has, see shoal/cluster).

Append (:meth:`PartitionLog.append`) validates the whole request first (framing, magic,
CRC, sizes, idempotent-producer sequence): any fault raises and writes nothing.  Then it
assigns offsets by rewriting base offsets in one copy of the request, rolls if needed, and
writes everything with one ``os.write``.  It fsyncs when ``flush.messages`` records are
unflushed (shoal's default 1: every append) and reports ``durable`` in its result; a
caller that answers acks only once durable must call :meth:`flush` when it is False.

Read (:meth:`PartitionLog.read`) finds the segment by bisection, the batch by the sparse
index plus a short scan of headers (or by the cache of the previous read's end), and
returns whole batches from one ``pread``; records are never parsed.

Recovery on open (Kafka's LogLoader, but damage costs only the damaged bytes): segments
from the one holding the recovery point (all of them if the checkpoint is missing or does
not hold an offset, which is logged) are validated batch by batch (length, magic, CRC,
growing offsets) and re-indexed; older segments only have their index files checked
against the end of the log file (Kafka's sanity check; a missing or inconsistent index,
or a log file cut short, makes that segment validated too), and reads CRC-check their
batches the first time they serve them.  What is not whole, valid batches is handled by
where it is:

* at the end of the active segment, at or beyond the recovery point: a write a crash
  tore; the file is cut there (logged at WARN), as Kafka does;
* in a closed segment (fsynced whole when it was rolled), or in the active one below the
  recovery point: damage; only the damaged bytes are lost.  The next valid batch after
  them is found by a byte scan (CRC-checked, offsets in the range the segment may hold),
  the bytes from there are moved to a new segment named by its base offset, and the
  damaged segment is cut (logged at ERROR with the segment, the bytes and the offsets
  lost).  A later segment is never deleted.

Segments are then chained: a segment that starts after the previous one ends leaves a gap
of offsets (a missing or cut segment file; logged at ERROR, reads skip it as they skip the
offsets compaction removed); one wholly inside the previous one whose first batch the
previous one holds byte for byte is a leftover of an interrupted compaction merge and is
deleted; any other overlap is renamed ``*.overlapping`` and not served (never deleted).  A
segment below the recovery point whose last header says it reaches into the next file is
validated first (a damaged header must not make it look like it holds the next segment).  The log end offset is the last segment's, so
the next append gets an offset past every surviving record.  A log start offset
checkpoint beyond the log end is ignored (logged), never a reason to delete.  Producer
state and transactions (open ones, the aborted-transaction list) are rebuilt from the
batch headers (and the markers' records).

Transactions: a transactional batch opens its producer's transaction in the partition;
:meth:`PartitionLog.append_marker` (the transaction coordinator, or WriteTxnMarkers)
appends a commit or abort marker that closes it. :attr:`PartitionLog.last_stable_offset`
is the first offset of the oldest open transaction, or the high watermark; a
read_committed reader gets batches below it and :meth:`PartitionLog.aborted_transactions`
of the range. The aborted-transaction list is kept in memory and rebuilt at every open,
as the producer state is (the log's headers are walked at open anyway). Each segment's
part of it is also written, in Kafka's ``.txnindex`` layout (34-byte entries: version 0,
producer id, first offset, marker offset, last stable offset), for Kafka's tools: when
the segment is sealed, at close, and after opening, a truncation or compaction when it
differs from what the file holds. The files are never read back: the log is the truth.

Concurrency: event loop only; never awaits.  ``append`` and ``flush`` block on the disk.
"""

from __future__ import annotations

import logging
import os
import re
import struct
from bisect import bisect_right
from dataclasses import dataclass
from pathlib import Path

from shoal.errors import ApiError, ErrorCode, FsyncError
from shoal.log.policy import LogConfig, SegmentSummary, plan_retention, should_roll
from shoal.log.producer_state import AbortedTxn, ProducerStateTable, TxnState
from shoal.log.segment import FileSlice, OpenSegments, Segment, default_open_segments
from shoal.protocol.batch import (
    BatchHeader,
    TimestampType,
    decode_records,
    read_header,
    set_base_offset,
    set_log_append_time,
    set_partition_leader_epoch,
    validate_batches,
)
from shoal.protocol.markers import COMMIT, build_marker, marker_of

__all__ = ["AppendResult", "PartitionLog", "atomic_write"]

_log = logging.getLogger("shoal.log")

_SEGMENT_RE = re.compile(r"^(\d{20})\.log$")
_CHECKPOINT_RE = re.compile(r"^\d{1,19}$")
_NO_LIMIT = 1 << 63
_TXN_ENTRY = struct.Struct(">hqqqq")
LOG_START_FILE = "log-start-offset"
RECOVERY_POINT_FILE = "recovery-point"


def atomic_write(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` so that a crash leaves the old or the new content.

    Raises OSError naming ``path``; then ``path`` is as it was and the temporary file is
    gone (a full disk gets its space back). A short write (a nearly full disk) is
    continued until it fails, never renamed into place.
    """
    tmp = path.with_name(path.name + ".tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            view = memoryview(data)
            written = 0
            while written < len(view):
                written += os.write(fd, view[written:])
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise OSError(exc.errno, f"cannot write {path}: {exc.strerror}") from exc
    fsync_dir(path.parent)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _read_checkpoint(path: Path, instead: str) -> int | None:
    """The offset a checkpoint file holds; None if it is missing, or (logged at WARN, with
    what is done ``instead``) if it does not hold an offset.  Raises OSError."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    text = raw.decode("ascii", "replace").strip()
    if _CHECKPOINT_RE.match(text):
        return int(text)
    _log.warning("partition %s: the %s file holds %r, not an offset: %s", path.parent.name, path.name,
                 raw[:32], instead)
    return None


@dataclass(frozen=True, slots=True)
class AppendResult:
    base_offset: int
    """Offset of the first record appended (or of the original batch, for a duplicate)."""
    last_offset: int
    log_append_time_ms: int
    """The time stamped on the batches for LogAppendTime topics, else -1."""
    record_count: int
    log_start_offset: int
    durable: bool
    """Whether the appended bytes are fsynced (always True for a duplicate)."""
    duplicate: bool = False
    """The request repeated an already appended idempotent batch; nothing was written."""


@dataclass(slots=True)
class FlushTicket:
    """An fsync of a partition's active segment that covers offsets below ``end_offset``."""

    path: Path
    """The segment's log file: opened by :meth:`sync` itself, so a ticket holds no descriptor
    while it waits, and at most one per fsync thread is open at a time."""
    end_offset: int
    messages: int
    truncations: int = 0
    """The log's truncation count when the ticket was taken: a ticket from before a
    truncation covers offsets that no longer hold the same records."""
    drop_cache_below: int = 0
    """After the fsync, drop the file's pages below this byte position from the page
    cache (0: keep them). For a follower's log, which nobody reads while it follows."""
    bytes: int = 0
    """Bytes appended and not yet fsynced when the ticket was taken (what the sync writes)."""

    def sync(self) -> None:
        """Open the file, fdatasync it and close it (safe in a worker thread).  Raises OSError.

        Linux syncs the file, not the descriptor: every byte written through any
        descriptor of the file before the call is made durable. The pages the ticket
        drops are clean by then, so the kernel frees them at once.
        """
        fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.fdatasync(fd)
            if self.drop_cache_below > 0:
                try:
                    os.posix_fadvise(fd, 0, self.drop_cache_below, os.POSIX_FADV_DONTNEED)
                except OSError:
                    pass  # advice only
        except OSError as exc:
            raise FsyncError(exc.errno, f"fdatasync of {self.path.name} failed: {exc.strerror}") from exc
        finally:
            os.close(fd)


class PartitionLog:
    """The log of one partition.  Create with :meth:`open`."""

    def __init__(self, directory: Path, config: LogConfig, files: OpenSegments | None = None) -> None:
        self.dir = directory
        self.config = config
        self.files = files if files is not None else default_open_segments()
        """The LRU of open segment descriptors this log's segments share."""
        self.segments: list[Segment] = []
        self._bases: list[int] = []
        self.log_start_offset = 0
        self.producers = ProducerStateTable()
        self.txns = TxnState()
        self._unflushed_messages = 0
        self._unflushed_bytes = 0
        self._last_flush_ms = -1
        self.recovered_truncation = False
        """Whether opening cut damaged bytes (a torn write or corruption)."""
        self.epochs_in_log: list[tuple[int, int]] = []
        """(partition leader epoch, first offset) where each newer epoch starts in the batches
        found at open (to rebuild a damaged leader-epoch checkpoint)."""
        self.missing_offsets: list[tuple[int, int]] = []
        """Offset ranges [start, end) opening found lost (damaged bytes, a missing or cut
        segment); end -1: to the log end (a torn write)."""
        self.replicated_high_watermark: int | None = None
        """Set in cluster mode by the replica manager; None: the high watermark is the LEO."""
        self._recovery_point: int | None = None
        """The recovery point last read or written (None: no checkpoint file)."""
        self.compaction_state: tuple | None = None
        """What the last compaction pass saw and when a kept tombstone expires (compaction.py)."""
        self.durable_offset = 0
        """Every offset below this one is fsynced (within this process's life); lowered
        when the log is truncated below it."""
        self._truncations = 0
        self.offline: str | None = None
        """Why appends are refused until a restart (:meth:`fsync_failed`), or None."""

    # --- opening -----------------------------------------------------------------------
    @classmethod
    def open(cls, directory: Path, config: LogConfig, *, now_ms: int = 0,
             files: OpenSegments | None = None, sync_parent: bool = True) -> PartitionLog:
        """Open (or create) the log in ``directory``, recovering its tail.

        ``files`` is the LRU of open segment descriptors to share (one per store).  A new
        directory's entry is fsynced in its parent unless ``sync_parent`` is False: then the
        caller fsyncs the parent before anything is acknowledged in the log (one fsync for
        the many partitions of a new topic).  Raises OSError if the files cannot be read.
        """
        created = not directory.exists()
        directory.mkdir(parents=True, exist_ok=True)
        log = cls(directory, config, files)
        if created and sync_parent:  # make the new directory entry durable before anything is acknowledged in it
            log.files.fsync_dir(directory.parent)
        log._last_flush_ms = now_ms
        try:
            log._load(empty=created)
        except BaseException:  # out of descriptors or space: close what was opened
            for seg in log.segments:
                seg.close()
            raise
        return log

    def _load(self, *, empty: bool = False) -> None:
        """Read the segments and checkpoints of the directory; ``empty``: it was just created
        (nothing to list, which also spares a descriptor when none may be free).

        Kafka's LogLoader, except that damage never costs more than the damaged bytes: see
        the module docstring.
        """
        log, directory, config = self, self.dir, self.config
        names = [] if empty else [p.name for p in directory.iterdir()]
        for name in names:
            if name.endswith((".cleaned", ".tmp")):
                (directory / name).unlink()
        pending = sorted(int(m.group(1)) for name in names if (m := _SEGMENT_RE.match(name)))
        recovery_point = log._recovery_point = None if empty else _read_checkpoint(
            directory / RECOVERY_POINT_FILE, "validating every segment, as after a crash")
        start = None if empty else _read_checkpoint(
            directory / LOG_START_FILE, "the log starts at its first segment's base offset")
        # Kafka's unflushed segments: the one holding the recovery point and every later one
        if recovery_point is None or not pending:
            check_from = -1
        else:
            check_from = pending[max(0, bisect_right(pending, recovery_point) - 1)]
        interval = config.index_interval_bytes
        moved: set[int] = set()
        reported = -1  # offsets below this one that were lost are logged already
        i = 0
        while i < len(pending):
            base = pending[i]
            i += 1
            active = i == len(pending)
            limit = None if active else pending[i]
            # A closed segment was fsynced whole when it was rolled, and the active one up to the
            # recovery point: damage there is not a torn write, so only the damaged bytes go.
            seg, damage = Segment.open(directory, base, interval, recover=base >= check_from or base in moved,
                                       files=log.files, salvage_below=recovery_point if active else _NO_LIMIT,
                                       next_segment=None if active else Segment(directory, limit, interval, log.files))
            if damage is not None:
                log.recovered_truncation = True
                torn = active and (recovery_point is None or damage.next_offset >= recovery_point)
                reported = log._report_damage(seg, damage, torn, limit)
                if damage.moved:
                    pending.insert(i, damage.resume_offset)
                    moved.add(damage.resume_offset)
                if seg.size == 0 and not (active and not damage.moved):
                    seg.delete()  # nothing valid was left in it; the active segment stays even empty
                    continue
            prev = log.segments[-1] if log.segments else None
            if prev is not None and seg.base_offset != prev.next_offset:
                if seg.base_offset > prev.next_offset:
                    if seg.base_offset > reported:
                        _log.error("partition %s: offsets %d-%d (%d) are missing: segment %d ends at %d and the "
                                   "next segment starts at %d (a segment file is missing, or was cut); every "
                                   "later segment is kept", directory.name, max(prev.next_offset, reported),
                                   seg.base_offset - 1, seg.base_offset - max(prev.next_offset, reported),
                                   prev.base_offset, prev.next_offset, seg.base_offset)
                        log.missing_offsets.append((max(prev.next_offset, reported), seg.base_offset))
                elif seg.next_offset <= prev.next_offset and prev.holds_copy_of(seg):
                    # wholly inside the previous segment, which holds its batches: left over from a
                    # compaction that merged it into the previous one and stopped before deleting it
                    seg.delete()
                    continue
                else:
                    # offsets the previous segment holds too (other batches): neither can be trusted
                    # over the other, so this one is set aside (renamed, not deleted) and not served
                    seg.close()
                    aside = seg.log_path.with_name(seg.log_path.name + ".overlapping")
                    os.replace(seg.log_path, aside)
                    for p in (seg.index_path, seg.time_index_path):
                        p.unlink(missing_ok=True)
                    _log.error("partition %s: segment %d (offsets %d-%d) overlaps segment %d (ending at %d); it "
                               "is set aside as %s and not served", directory.name, seg.base_offset,
                               seg.base_offset, seg.next_offset - 1, prev.base_offset, prev.next_offset, aside.name)
                    if active:  # the log goes on after the last offset handed out
                        log.segments.append(Segment(directory, max(seg.next_offset, prev.next_offset), interval,
                                                    log.files, create=True))
                        log.segments[-1].recover()
                        log.files.fsync_dir(directory)
                    continue
            log.segments.append(seg)
        if not log.segments:
            log.segments.append(Segment(directory, start or 0, interval, log.files, create=True))
            log.segments[0].recover()
            log.files.fsync_dir(directory)
        log._bases = [s.base_offset for s in log.segments]
        leo = log.log_end_offset
        first = log.segments[0].base_offset
        if start is not None and start < first and pending:
            _log.warning("partition %s: the log start offset checkpoint is %d but the first segment starts at %d: "
                         "offsets %d-%d are gone (retention deleted them, or the first segment file is missing)",
                         directory.name, start, first, start, first - 1)
        if start is not None and start > leo:
            _log.error("partition %s: the log start offset checkpoint (%d) is beyond the log end offset (%d): the "
                       "log lost its end, or the checkpoint is damaged; it is ignored (nothing is deleted)",
                       directory.name, start, leo)
            start = None
        if recovery_point is not None and recovery_point > leo:
            _log.error("partition %s: the log ends at offset %d, below its recovery point %d: offsets %d-%d, "
                       "fsynced before, are lost (the last segment file is missing or was cut)", directory.name,
                       leo, recovery_point, leo, recovery_point - 1)
        log.log_start_offset = min(max(start or 0, log.segments[0].base_offset), leo)
        epochs = log.epochs_in_log
        for seg in log.segments:
            for h in seg.walk_headers():
                if h.producer_id >= 0:
                    log._replay_producer(h, seg)
                if h.partition_leader_epoch >= 0 and (not epochs or h.partition_leader_epoch > epochs[-1][0]):
                    epochs.append((h.partition_leader_epoch, h.base_offset))
        if log.txns.aborted or any(p.endswith(".txnindex") for p in names):
            log.write_txn_indexes()

    def _replay_producer(self, h, seg=None, data=None) -> None:
        """Rebuild producer and transaction state from one batch (at open, after a truncation,
        or as a follower): ``data`` holds the batch, else it is read from ``seg``."""
        if h.is_control:
            if data is None:
                data = seg.read_at(h.position, h.size)
            try:
                found = marker_of(data)
            except ApiError:
                found = None
            if found is None:
                return
            kind, coordinator_epoch = found
            self.producers.mark(h.producer_id, h.producer_epoch, h.max_timestamp, coordinator_epoch)
            entry = self.txns.on_marker(h.producer_id, kind == COMMIT, h.base_offset)
            if entry is not None and entry.last_offset < self.log_start_offset:
                self.txns.aborted.pop()
            return
        self.producers.replay(h.producer_id, h.producer_epoch, h.base_sequence, h.last_sequence,
                              h.base_offset, h.last_offset, h.max_timestamp)
        if h.is_transactional:
            self.txns.on_batch(h.producer_id, h.base_offset)

    def txn_index_bytes(self, seg: Segment) -> bytes:
        """The ``.txnindex`` content of ``seg``: the aborted transactions whose marker it holds."""
        return b"".join(_TXN_ENTRY.pack(0, a.producer_id, a.first_offset, a.last_offset, a.last_stable_offset)
                        for a in self.txns.aborted if seg.base_offset <= a.last_offset < seg.next_offset)

    def write_txn_indexes(self, segments: list | None = None) -> None:
        """Write the ``.txnindex`` file of each of ``segments`` (default: all) whose content
        differs from what it should be (none when it has no aborted transaction). A file
        that cannot be written is skipped (logged): nothing reads it back."""
        for seg in self.segments if segments is None else segments:
            want = self.txn_index_bytes(seg)
            path = seg.txn_index_path
            try:
                have = path.read_bytes()
            except FileNotFoundError:
                have = None
            except OSError:
                have = b"?"
            if (have or b"") == want and (have is not None or not want):
                continue
            try:
                if want:
                    atomic_write(path, want)
                else:
                    path.unlink(missing_ok=True)
            except OSError as exc:
                _log.warning("partition %s: cannot write %s: %s", self.dir.name, path.name, exc)

    def _report_damage(self, seg: Segment, damage, torn: bool, limit: int | None) -> int:
        """Log what recovery cut from ``seg`` (at WARN for a write torn at the end of the
        active segment, else at ERROR); returns the offset below which the loss is logged."""
        name, base = self.dir.name, seg.base_offset
        first = damage.next_offset
        if damage.moved:
            end = damage.resume_offset
            _log.error("partition %s: segment %d is damaged at byte %d (%s): %d bytes holding offsets %d-%d (%d) "
                       "are cut; the valid batches after them, from offset %d on, are kept as segment %d",
                       name, base, damage.position, damage.reason, damage.lost_bytes, first, end - 1, end - first,
                       end, end)
        elif limit is not None:
            end = limit
            _log.error("partition %s: segment %d is damaged at byte %d (%s): its last %d bytes, holding offsets "
                       "%d-%d (%d), are cut; the next segment is kept", name, base, damage.position, damage.reason,
                       damage.lost_bytes, first, end - 1, end - first)
        elif not torn:
            _log.error("partition %s: the active segment %d is damaged at byte %d (%s), below its recovery point: "
                       "its last %d bytes are cut, and with them offsets from %d on", name, base, damage.position,
                       damage.reason, damage.lost_bytes, first)
            self.missing_offsets.append((first, -1))
            return first
        else:
            end = first
            after = (f"; valid batches followed from offset {damage.resume_offset}, written after the recovery "
                     f"point, so possibly after the torn write: cut too") if damage.resume_offset >= 0 else ""
            _log.warning("partition %s: %d bytes cut at byte %d of the active segment %d (%s): a write the crash "
                         "tore; offsets from %d on were not on disk%s", name, damage.lost_bytes, damage.position,
                         base, damage.reason, first, after)
            self.missing_offsets.append((first, -1))
            return first
        self.missing_offsets.append((first, end))
        return end

    # --- offsets -------------------------------------------------------------------------
    @property
    def log_end_offset(self) -> int:
        return self.segments[-1].next_offset

    @property
    def high_watermark(self) -> int:
        hw = self.replicated_high_watermark
        leo = self.segments[-1].next_offset
        return leo if hw is None or hw > leo else hw

    @property
    def last_stable_offset(self) -> int:
        """The first offset of the oldest open transaction, or the high watermark if lower
        (or if no transaction is open): read_committed readers read below it."""
        hw = self.high_watermark
        first = self.txns.first_unstable_offset()
        return hw if first is None or first > hw else first

    def aborted_transactions(self, start: int, end: int) -> list[AbortedTxn]:
        """The aborted transactions with records in offsets [start, end)."""
        return self.txns.aborted_between(start, end)

    def without_aborted(self, headers: list) -> list:
        """``headers`` (consecutive batches below the last stable offset) without the batches
        of aborted transactions: what a read_committed reader may be given."""
        if not any(h.is_transactional and not h.is_control for h in headers):
            return headers
        by_pid: dict[int, list[AbortedTxn]] = {}
        for a in self.txns.aborted_between(headers[0].base_offset, headers[-1].next_offset):
            by_pid.setdefault(a.producer_id, []).append(a)
        if not by_pid:
            return headers
        return [h for h in headers if not (h.is_transactional and not h.is_control and any(
            a.first_offset <= h.base_offset <= a.last_offset for a in by_pid.get(h.producer_id, ())))]

    def append_marker(self, producer_id: int, producer_epoch: int, commit: bool, coordinator_epoch: int,
                      now_ms: int, *, leader_epoch: int | None = None, defer_flush: bool = False) -> AppendResult:
        """Append a commit or abort marker for ``producer_id``'s transaction.

        Raises ApiError(INVALID_PRODUCER_EPOCH) if the producer's epoch here is newer, and
        what :meth:`append` raises; nothing is appended then.
        """
        self.producers.check_marker(producer_id, producer_epoch, coordinator_epoch)
        batch = bytearray(build_marker(commit, producer_id, producer_epoch, coordinator_epoch, now_ms))
        result = self.append(batch, now_ms, check_producer=False, timestamp_type=TimestampType.CREATE_TIME,
                             leader_epoch=leader_epoch, crc_checked=True, defer_flush=defer_flush)
        self.producers.mark(producer_id, producer_epoch, now_ms, coordinator_epoch)
        self.txns.on_marker(producer_id, commit, result.base_offset)
        return result

    @property
    def size_bytes(self) -> int:
        return sum(s.size for s in self.segments)

    def replace_segments(self, n: int, segments: list[Segment]) -> None:
        """Put ``segments`` in place of the first ``n`` (compaction rewrote or merged them)."""
        self.segments[:n] = segments
        self._bases = [s.base_offset for s in self.segments]

    def summaries(self) -> list[SegmentSummary]:
        return [SegmentSummary(s.base_offset, s.next_offset, s.size, s.max_timestamp) for s in self.segments]

    # --- append --------------------------------------------------------------------------
    def append(self, batches, now_ms: int, *, timestamp_type: int | None = None,
               check_producer: bool = True, defer_flush: bool = False,
               leader_epoch: int | None = None, crc_checked: bool = False,
               header: BatchHeader | None = None) -> AppendResult:
        """Validate, assign offsets to, and write a run of v2 batches; all or nothing.

        A ``bytearray`` argument is rewritten in place (offsets, LogAppendTime); other
        buffers are copied once.

        ``timestamp_type`` defaults to the topic's ``message.timestamp.type``. ``leader_epoch``
        (cluster mode) is written into each batch's partition leader epoch field.
        ``crc_checked`` says the caller has already checked (or itself computed) every
        batch's CRC-32C over these very bytes (Produce: ``protocol/records.py``), so it
        is not computed a second time; the framing is read again unless ``header`` is
        given: the header of ``batches``, one whole batch, as the validation read it.
        Raises ApiError with: corrupt_message (framing, magic, CRC, empty), invalid_record
        (offset delta inconsistent with the record count), message_too_large (a batch above
        max.message.bytes), record_list_too_large (the request above segment.bytes),
        invalid_producer_epoch / out_of_order_sequence_number (idempotence),
        kafka_storage_error (the write failed; nothing is left in the log; or the log is
        offline after a failed fsync).
        """
        if self.offline is not None:
            raise ApiError(ErrorCode.kafka_storage_error, self.offline)
        headers = [header] if header is not None else validate_batches(batches, check_crc=not crc_checked)
        cfg = self.config
        total = len(batches)
        for h in headers:
            if h.records_count == 0 or h.last_offset_delta != h.records_count - 1:
                raise ApiError(ErrorCode.invalid_record, "offset delta does not match the record count")
            if h.size > cfg.max_message_bytes:
                raise ApiError(ErrorCode.message_too_large,
                               f"batch of {h.size} bytes exceeds max.message.bytes {cfg.max_message_bytes}")
        if total > cfg.segment_bytes:
            raise ApiError(ErrorCode.record_list_too_large,
                           f"{total} bytes exceed segment.bytes {cfg.segment_bytes}")
        if check_producer:
            pending: dict[int, tuple[int, int]] = {}
            for h in headers:
                if h.producer_id >= 0 and h.base_sequence >= 0:
                    dup = self.producers.check(h.producer_id, h.producer_epoch, h.base_sequence, h.last_sequence,
                                               pending)
                    if dup is not None:
                        return AppendResult(dup.first_offset, dup.last_offset, -1,
                                            dup.last_offset - dup.first_offset + 1, self.log_start_offset,
                                            True, True)
        if timestamp_type is None:
            timestamp_type = TimestampType.LOG_APPEND_TIME if cfg.log_append_time else TimestampType.CREATE_TIME
        log_append = timestamp_type == TimestampType.LOG_APPEND_TIME
        out = batches if isinstance(batches, bytearray) else bytearray(batches)
        offset = first = self.log_end_offset
        offsets = []
        max_ts = []
        records = 0
        for h in headers:
            set_base_offset(out, h.position, offset)
            if leader_epoch is not None:
                set_partition_leader_epoch(out, h.position, leader_epoch)
            if log_append:
                set_log_append_time(out, h, now_ms)
                max_ts.append(now_ms)
            else:
                max_ts.append(h.max_timestamp)
            nxt = offset + h.last_offset_delta + 1
            offsets.append((offset, nxt))
            offset = nxt
            records += h.records_count
        active = self.segments[-1]
        # Kafka's time-based roll compares the incoming records' largest timestamp with the
        # segment's first one, not the wall clock: records with old timestamps (a replay, a
        # migration) must not roll a segment per append.
        incoming_ts = max(max_ts) if max_ts else now_ms
        if should_roll(segment_size=active.size, incoming_bytes=total, segment_bytes=cfg.segment_bytes,
                       first_timestamp=active.first_timestamp, now_ms=incoming_ts, segment_ms=cfg.segment_ms):
            active = self.roll()  # raises OSError if the old segment's fsync fails
        try:
            active.append(out, headers, offsets, max_ts)
        except OSError as exc:
            raise ApiError(ErrorCode.kafka_storage_error, f"append failed: {exc}") from exc
        for h, (base, nxt) in zip(headers, offsets):
            if h.producer_id >= 0 and h.base_sequence >= 0:
                self.producers.update(h.producer_id, h.producer_epoch, h.base_sequence, h.last_sequence,
                                      base, nxt - 1, h.max_timestamp)
            if h.producer_id >= 0 and h.is_transactional and not h.is_control:
                # (a coordinator's transactional batch, TxnOffsetCommit, has no sequence)
                self.txns.on_batch(h.producer_id, base)
        self._unflushed_messages += records
        self._unflushed_bytes += total
        durable = False
        if not defer_flush and self.flush_due(now_ms):
            self.flush(now_ms)
            durable = True
        return AppendResult(first, offset - 1, now_ms if log_append else -1, records, self.log_start_offset,
                            durable)

    def append_as_follower(self, batches, now_ms: int) -> list[tuple[int, int]]:
        """Append batches fetched from the leader, keeping their offsets; all or nothing.

        Offsets must grow from the log end offset (a batch after a gap in the leader's log,
        left by damage its recovery cut, starts later). Returns (partition leader epoch,
        base offset) of each batch, for the leader-epoch cache. Raises ApiError:
        corrupt_message (framing, CRC), offset_out_of_range (an offset below the log end),
        kafka_storage_error (the write failed).
        """
        headers = validate_batches(batches)
        if not headers:
            return []
        offsets = []
        nxt = self.log_end_offset
        for h in headers:
            if h.base_offset < nxt:  # (a batch after a gap in the leader's log is taken, as Kafka takes it)
                raise ApiError(ErrorCode.offset_out_of_range,
                               f"fetched batch at {h.base_offset}, log end offset {nxt}")
            nxt = h.next_offset
            offsets.append((h.base_offset, nxt))
        max_ts = [h.max_timestamp for h in headers]
        active = self.segments[-1]
        if should_roll(segment_size=active.size, incoming_bytes=len(batches), segment_bytes=self.config.segment_bytes,
                       first_timestamp=active.first_timestamp, now_ms=max(max_ts), segment_ms=self.config.segment_ms):
            active = self.roll()
        try:
            active.append(batches, headers, offsets, max_ts)
        except OSError as exc:
            raise ApiError(ErrorCode.kafka_storage_error, f"append failed: {exc}") from exc
        for h in headers:
            if h.producer_id >= 0 and (h.base_sequence >= 0 or h.is_transactional):
                self._replay_producer(h, data=memoryview(batches)[h.position:h.end])
            self._unflushed_messages += h.records_count
        self._unflushed_bytes += len(batches)
        return [(h.partition_leader_epoch, h.base_offset) for h in headers]

    def truncate_to(self, offset: int) -> int:
        """Cut the log so that it ends at or before ``offset`` (a follower's divergent tail).

        A batch that straddles ``offset`` goes whole. Returns the new log end offset.
        Producer state is rebuilt from what is left.
        """
        if offset >= self.log_end_offset:
            return self.log_end_offset
        offset = max(offset, self.log_start_offset)
        while len(self.segments) > 1 and self.segments[-1].base_offset >= offset:
            self.segments.pop().delete()
            self._bases.pop()
        seg = self.segments[-1]
        pos = seg.find_position(offset)
        if pos is not None:
            seg.truncate_to_position(pos)
        atomic_write(self.dir / RECOVERY_POINT_FILE, str(seg.base_offset).encode())
        self._recovery_point = seg.base_offset
        had_aborted = bool(self.txns.aborted)
        self.producers = ProducerStateTable()
        self.txns = TxnState()
        for s in self.segments:
            for h in s.walk_headers():
                if h.producer_id >= 0:
                    self._replay_producer(h, s)
        if had_aborted:
            self.write_txn_indexes([self.segments[-1]])
        if self.replicated_high_watermark is not None:
            self.replicated_high_watermark = min(self.replicated_high_watermark, self.log_end_offset)
        self._truncations += 1
        self.durable_offset = min(self.durable_offset, self.log_end_offset)
        return self.log_end_offset

    def roll(self) -> Segment:
        """Seal the active segment (fsync) and start a new one at the LEO.

        Raises OSError if the fsync of the old segment fails (its appends may not be on
        disk), and ApiError(kafka_storage_error) if its index files cannot be written or the
        new segment cannot be created (no space, no descriptors): then the old segment stays
        active and nothing changed, so the next append tries again.  A recovery point that
        cannot be written is skipped: the older one on disk only makes the next start
        validate more.
        """
        old = self.segments[-1]
        old.index_max_timestamp()
        try:
            old.flush()
        except FsyncError as exc:
            self.fsync_failed(exc)
            raise
        if self.txns.aborted:
            self.write_txn_indexes([old])
        seg = None
        try:
            old.write_indexes(fsync=True)
            seg = Segment(self.dir, self.log_end_offset, self.config.index_interval_bytes, self.files, create=True)
            seg.recover()
            self.files.fsync_dir(self.dir)
        except OSError as exc:
            if seg is not None:
                seg.delete()
            raise ApiError(ErrorCode.kafka_storage_error, f"cannot start a new segment: {exc}") from exc
        self.segments.append(seg)
        self._bases.append(seg.base_offset)
        try:
            atomic_write(self.dir / RECOVERY_POINT_FILE, str(seg.base_offset).encode())
            self._recovery_point = seg.base_offset
        except OSError:
            pass  # a stale recovery point only makes the next start validate more
        return seg

    # --- flush ---------------------------------------------------------------------------
    @property
    def unflushed_messages(self) -> int:
        return self._unflushed_messages

    @property
    def unflushed_bytes(self) -> int:
        """Bytes appended since the last fsync (about: a truncation does not take its bytes
        off); what the next fsync writes out."""
        return self._unflushed_bytes

    def flush_due(self, now_ms: int) -> bool:
        """Whether the flush policy (flush.messages, flush.ms) asks for an fsync now."""
        return self._unflushed_messages >= self.config.flush_messages or self.needs_flush(now_ms)

    def begin_flush(self, drop_cache: bool = False) -> FlushTicket:
        """Start an fsync that may run in another thread (group commit).

        Returns a ticket naming the active segment's file (rolling or closing the segment
        meanwhile does not affect it: the file stays where it is). Run ``ticket.sync()``
        anywhere, then call :meth:`end_flush` on the event loop. ``drop_cache``: the
        ticket also drops the pages it makes durable from the page cache.
        """
        active = self.segments[-1]
        return FlushTicket(active.log_path, self.log_end_offset, self._unflushed_messages, self._truncations,
                           active.size if drop_cache else 0, self._unflushed_bytes)

    def end_flush(self, ticket: FlushTicket, now_ms: int) -> None:
        """Account for a completed ticket: everything before ``ticket.end_offset`` is durable
        (unless the log was truncated since the ticket was taken: what then stands at those
        offsets was written after it)."""
        if ticket.truncations == self._truncations:
            self.durable_offset = max(self.durable_offset, ticket.end_offset)
        self._unflushed_messages = max(0, self._unflushed_messages - ticket.messages)
        self._unflushed_bytes = max(0, self._unflushed_bytes - ticket.bytes)
        self._last_flush_ms = now_ms
        active = self.segments[-1] if self.segments else None
        if active is not None and ticket.end_offset == active.next_offset and ticket.path == active.log_path:
            active.mark_flushed()  # nothing was appended since: the next flush or close need not sync

    def fsync_failed(self, error: OSError) -> None:
        """An fsync of this log failed: refuse every later append until a restart.

        Bytes appended before the failure may be missing from the disk while reads still
        show them, and a later fsync may report success regardless; acknowledging appends
        after them could lose those too when the next start cuts the log at the hole. So,
        as Kafka takes a failed log directory offline, the log takes no more appends; a
        restart recovers what the disk holds.
        """
        if self.offline is None:
            self.offline = f"{self.dir.name} is offline until a restart: {error}"

    def needs_flush(self, now_ms: int) -> bool:
        """Whether flush.ms has passed with unflushed records."""
        return (self._unflushed_messages > 0 and self.config.flush_ms >= 0
                and now_ms - self._last_flush_ms >= self.config.flush_ms)

    def flush(self, now_ms: int | None = None) -> None:
        """fsync the active segment (older ones were fsynced when rolled).

        Raises OSError; FsyncError also takes the log offline (:meth:`fsync_failed`).
        """
        try:
            self.segments[-1].flush()
        except FsyncError as exc:
            self.fsync_failed(exc)
            raise
        self._unflushed_messages = 0
        self._unflushed_bytes = 0
        self.durable_offset = self.log_end_offset
        if now_ms is not None:
            self._last_flush_ms = now_ms

    # --- read ----------------------------------------------------------------------------
    def read(self, offset: int, max_bytes: int, min_slice: int | None = None) -> bytes | FileSlice:
        """Whole batches from the one containing ``offset``: at least one, else up to max_bytes.

        Returns b"" at the log end.  With ``min_slice``, the batches may come as a
        :class:`~shoal.log.segment.FileSlice` (see :meth:`Segment.read_batches`).  Raises
        ApiError(offset_out_of_range) outside [log_start_offset, log_end_offset],
        ApiError(kafka_storage_error) if the file cannot be opened or read,
        CorruptBatchError (corrupt_message) if ``offset`` lies in bytes found damaged (logged
        once; see :meth:`Segment.read`).
        """
        leo = self.segments[-1].next_offset
        if offset == leo and offset >= self.log_start_offset:
            return b""
        if offset < self.log_start_offset or offset > leo:
            raise ApiError(ErrorCode.offset_out_of_range,
                           f"offset {offset} outside [{self.log_start_offset}, {leo}]")
        i = bisect_right(self._bases, offset) - 1
        segs = self.segments
        try:
            while i < len(segs):
                data = segs[i].read(offset, max_bytes, min_slice)
                if data is not None:
                    return data
                i += 1
        except OSError as exc:  # e.g. EMFILE reopening the segment: this read fails, the next may not
            raise ApiError(ErrorCode.kafka_storage_error, f"reading {self.dir.name} failed: {exc}") from exc
        return b""

    def read_batches(self, offset: int):
        """Yield (header, batch bytes) of every batch ending at or after ``offset`` (slow path)."""
        while True:
            try:
                data = self.read(offset, 1)
            except ApiError:
                return
            if not data:
                return
            h = read_header(data, 0)
            yield h, data
            offset = h.next_offset

    # --- timestamps -------------------------------------------------------------------------
    def offset_for_timestamp(self, timestamp: int) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record with timestamp >= ``timestamp``, or None."""
        for seg in self.segments:
            if seg.max_timestamp < timestamp or seg.next_offset <= self.log_start_offset:
                continue
            entry = seg.time_index.floor(timestamp)
            start_offset = seg.base_offset + entry[1] if entry is not None else seg.base_offset
            pos = seg.find_position(max(start_offset, self.log_start_offset))
            if pos is None:
                continue
            for h in seg.batch_headers(pos):
                if h.max_timestamp < timestamp or h.last_offset < self.log_start_offset:
                    continue
                data = seg.read_at(h.position, h.size)
                for r in decode_records(data):
                    if r.timestamp >= timestamp and r.offset >= self.log_start_offset:
                        return r.offset, r.timestamp
        return None

    def max_timestamp(self) -> tuple[int, int] | None:
        """(offset, timestamp) of the record with the largest timestamp (ListOffsets -3), or None."""
        best = None
        for seg in self.segments:
            if seg.max_timestamp >= 0 and (best is None or seg.max_timestamp > best.max_timestamp):
                best = seg
        if best is None:
            return None
        pos = best.find_position(best.offset_of_max_timestamp)
        if pos is None:
            return None
        for h in best.batch_headers(pos):
            if h.max_timestamp == best.max_timestamp:
                for r in decode_records(best.read_at(h.position, h.size)):
                    if r.timestamp == best.max_timestamp:
                        return r.offset, r.timestamp
                return h.last_offset, h.max_timestamp
        return None

    # --- deletion ---------------------------------------------------------------------------
    def delete_records(self, before_offset: int) -> int:
        """Raise the log start offset to ``before_offset`` (-1: the high watermark).

        Returns the new log start offset (never lowered).  Raises ApiError(offset_out_of_range)
        above the high watermark.  Whole segments below it are deleted.
        """
        hw = self.high_watermark
        if before_offset == -1:
            before_offset = hw
        if before_offset < 0 or before_offset > hw:
            raise ApiError(ErrorCode.offset_out_of_range, f"offset {before_offset} above high watermark {hw}")
        if before_offset > self.log_start_offset:
            try:
                atomic_write(self.dir / LOG_START_FILE, str(before_offset).encode())
            except OSError as exc:
                raise ApiError(ErrorCode.kafka_storage_error, f"cannot write {LOG_START_FILE}: {exc}") from exc
            self.log_start_offset = before_offset
            self._delete_oldest(self._count_below_start())
            self.txns.forget_below(before_offset)
        return self.log_start_offset

    def _count_below_start(self) -> int:
        n = 0
        while n < len(self.segments) - 1 and self.segments[n + 1].base_offset <= self.log_start_offset:
            n += 1
        return n

    def _delete_oldest(self, n: int) -> None:
        if n <= 0:
            return
        n = min(n, len(self.segments) - 1)
        gone, self.segments = self.segments[:n], self.segments[n:]
        self._bases = self._bases[n:]
        for seg in gone:  # oldest first: what is left stays contiguous
            seg.delete()
        new_start = self.segments[0].base_offset
        if new_start > self.log_start_offset:
            self.log_start_offset = new_start
            self.txns.forget_below(new_start)
            try:
                atomic_write(self.dir / LOG_START_FILE, str(new_start).encode())
            except OSError:
                pass  # opening takes the first segment's base offset anyway; a full disk still frees space

    def apply_retention(self, now_ms: int) -> int:
        """Delete old segments per retention.ms / retention.bytes (cleanup.policy delete).

        Returns the number of segments deleted.  The active segment is never deleted.
        """
        if not self.config.delete:
            n = self._count_below_start()
        else:
            n = plan_retention(self.summaries(), now_ms=now_ms, retention_ms=self.config.retention_ms,
                               retention_bytes=self.config.retention_bytes, log_start_offset=self.log_start_offset)
        self._delete_oldest(n)
        return n

    def run_maintenance(self, now_ms: int) -> None:
        """Called periodically by the shell: retention, compaction, time-based flush."""
        self.apply_retention(now_ms)
        if self.config.compact:
            from shoal.log.compaction import compact
            compact(self, now_ms)
        if self.needs_flush(now_ms):
            self.flush(now_ms)

    def update_config(self, config: LogConfig) -> None:
        self.config = config

    # --- closing ----------------------------------------------------------------------------
    def close(self) -> None:
        """Flush, checkpoint the recovery point if needed, close files.

        The files are closed whatever fails. Raises OSError if the fsync fails (appends
        may not be on disk). The active segment is validated and re-indexed at every open
        (it holds the recovery point), so its index files are not written here, and the
        checkpoint is written only if it would make the next open validate less: when it
        is below the active segment, or missing while there are several segments.  Closing
        thousands of idle partitions then costs no fsync.  A checkpoint that cannot be
        written (a full disk) is skipped: the next open validates from the older one.
        """
        if not self.segments:
            return
        try:
            active = self.segments[-1]
            active.flush()
            if self.txns.aborted:
                self.write_txn_indexes([active])
            rp = self._recovery_point
            if (rp is None and len(self.segments) > 1) or (rp is not None and rp < active.base_offset):
                try:
                    atomic_write(self.dir / RECOVERY_POINT_FILE, str(self.log_end_offset).encode())
                    self._recovery_point = self.log_end_offset
                except OSError:
                    pass
        finally:
            for seg in self.segments:
                seg.close()
            self.segments = []

    def delete(self) -> None:
        """Close and remove every file of this partition (the directory stays)."""
        for seg in self.segments:
            seg.delete()
        self.segments = []
        for name in (LOG_START_FILE, RECOVERY_POINT_FILE):
            try:
                (self.dir / name).unlink()
            except FileNotFoundError:
                pass


