"""The share-partition leader's state machine (KIP-932), with no I/O.

Theory of operation
-------------------
A :class:`SharePartition` tracks one (group_id, topic_id, partition).  Offsets below
the share-partition start offset (``start_offset``, SPSO) are done; offsets from
``end_offset`` (SPEO, exclusive) upwards have never been in flight and are AVAILABLE with
delivery count 0.  Every offset of ``[start_offset, end_offset)`` is covered by exactly
one :class:`~shoal.share.inflight.InFlightBatch`, kept in offset order.

Rules:

* **Acquire.**  The shell reads the log from :meth:`SharePartition.next_fetch_offset`
  and passes the batch headers it found.  Available in-flight records covered by them
  are acquired lowest offset first, then new records from SPEO on, whole batches at a
  time unless the record-limit acquire mode (or the in-flight limit
  ``group.share.partition.max.record.locks``) forces a split.  Acquiring adds one to
  the delivery count and sets the lock deadline to ``now_ms + record_lock_duration_ms``.
  An available record that already reached the delivery count limit is archived
  instead of acquired.  Offsets inside the fetched span that hold no batch are gaps:
  archived, never delivered.
* **Acknowledge.**  Only the member holding a record's lock may acknowledge it, and
  only before the deadline.  Accept -> ACKNOWLEDGED, reject and gap -> ARCHIVED,
  release -> AVAILABLE (ARCHIVED once the delivery count reached the limit), renew ->
  the lock deadline moves to ``now_ms + record_lock_duration_ms`` and the record stays
  ACQUIRED.  A request is checked whole before anything changes: all or nothing.
* **Lock expiry and member release.**  An ACQUIRED record whose deadline passed, or
  whose member left, is released as above (archived at the limit).
* **SPSO** moves up over ACKNOWLEDGED and ARCHIVED records; their state is dropped.
  It never moves down.  SPEO never moves below SPSO.
* **Log start.**  When retention or DeleteRecords moves the log start offset above
  SPSO, the shell calls :meth:`SharePartition.advance_start_to`: SPSO jumps to it and
  the in-flight state below is dropped (those records no longer exist).

Durability is two-phase.  Acknowledgements (except renew) do not change a record's
state at once: they mark it pending with a target state and return a
:class:`PendingUpdate`.  Lock expiry, member release and archiving during acquire do
change memory at once (there is nobody to answer) but still need persisting.  Either
way the partition becomes *dirty*; the shell then calls :meth:`SharePartition.take_write`,
which returns one :class:`StateWrite` covering all pending updates so far.  A write
carries what changed, as KIP-932's WriteShareGroupState examples show: the new SPSO, or
-1 when it did not move since the last write, and the state batches of the offsets whose
durable state changed (ACQUIRED written as AVAILABLE with its count); the share
coordinator merges them into the state it holds.  At most one write is outstanding per
partition, so writes reach the persister in order and a later one never undoes an
earlier one.  After the
persister answers, the shell calls :meth:`SharePartition.commit` (pending targets take
effect, SPSO advances) or :meth:`SharePartition.rollback` (targets are dropped; a
record whose lock expired meanwhile is released as by a lock timeout).

What it does not know: the log's contents (only the batch headers it is given), the
clock (time is ``now_ms``; deadlines are returned, never scheduled), sessions, group
membership, the persister, and ``share.auto.offset.reset`` (the initial SPSO is given).

Concurrency: event loop only, never awaits; callers must not interleave calls on one
partition from several threads.
"""

from __future__ import annotations

import bisect
import dataclasses
import enum
import heapq
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from kio.schema.errors import ErrorCode

from shoal.errors import ApiError
from shoal.share.dlq import ArchiveCause, DeadLetter
from shoal.share.inflight import InFlightBatch, InFlightState
from shoal.share.state import TERMINAL_STATES, AcknowledgeType, AcquireMode, RecordState

__all__ = [
    "DEFAULT_DELIVERY_COUNT_LIMIT",
    "DEFAULT_MAX_IN_FLIGHT_RECORDS",
    "DEFAULT_RECORD_LOCK_DURATION_MS",
    "AcquiredRecords",
    "PendingUpdate",
    "SharePartition",
    "StateBatch",
    "StateWrite",
    "UpdateStatus",
]

DEFAULT_RECORD_LOCK_DURATION_MS = 30_000  # group.share.record.lock.duration.ms
DEFAULT_DELIVERY_COUNT_LIMIT = 5  # group.share.delivery.count.limit
DEFAULT_MAX_IN_FLIGHT_RECORDS = 2000  # group.share.partition.max.record.locks

_ACK_TARGETS = {
    AcknowledgeType.ACCEPT: RecordState.ACKNOWLEDGED,
    AcknowledgeType.REJECT: RecordState.ARCHIVED,
    AcknowledgeType.GAP: RecordState.ARCHIVED,
    AcknowledgeType.RELEASE: RecordState.AVAILABLE,  # ARCHIVED at the delivery count limit
}


class StateBatch(NamedTuple):
    """One persisted range: WriteShareGroupState ``StateBatches`` entry."""

    first_offset: int
    last_offset: int
    delivery_state: int
    """A :class:`RecordState` id; never ACQUIRED (1) in what this module writes."""
    delivery_count: int


class AcquiredRecords(NamedTuple):
    """One ShareFetch ``AcquiredRecords`` entry."""

    first_offset: int
    last_offset: int
    delivery_count: int


class UpdateStatus(enum.Enum):
    PENDING = "pending"
    COMMITTED = "committed"
    ROLLED_BACK = "rolled_back"


@dataclass(eq=False)
class PendingUpdate:
    """One acknowledgement awaiting its durable write.

    ``status`` is PENDING until the write carrying it is committed or rolled back.  An
    acknowledgement with nothing durable in it (only renew) is COMMITTED at once.
    """

    member_id: str
    status: UpdateStatus = UpdateStatus.PENDING
    _states: list[InFlightState] = field(default_factory=list, repr=False)
    _first_offset: int = field(default=0, repr=False)
    """Lowest offset the acknowledgement names."""
    _last_offset: int = field(default=-1, repr=False)
    """Highest offset the acknowledgement names."""
    _dead_letters: list[DeadLetter] = field(default_factory=list, repr=False)
    """The records this acknowledgement archives (reject, release at the limit)."""

    @property
    def done(self) -> bool:
        return self.status is not UpdateStatus.PENDING


@dataclass(frozen=True, eq=False)
class StateWrite:
    """What the shell hands to the persister (WriteShareGroupState), then commits or rolls back.

    A change, merged by the share coordinator into the state it holds: ``start_offset``
    is the SPSO this write makes durable, or -1 when the SPSO is the one the previous
    write carried (KIP-932: "StartOffset": -1); ``state_batches`` are the durable states
    (ACQUIRED written as AVAILABLE) of the offsets from the SPSO on that changed since the
    previous write, in offset order, without AVAILABLE ranges of delivery count 0 (a
    count never goes back to 0, so the persisted state of such offsets is already that).
    :meth:`SharePartition.snapshot` returns the whole state instead.
    """

    group_id: str
    topic_id: uuid.UUID | str
    partition: int
    start_offset: int
    state_epoch: int
    leader_epoch: int
    state_batches: tuple[StateBatch, ...]
    updates: tuple[PendingUpdate, ...] = ()
    """The acknowledgements this write resolves."""
    delivery_complete_count: int = -1
    """Offsets from the SPSO on that are ACKNOWLEDGED or ARCHIVED once this write applies."""
    spso: int = -1
    """The SPSO once this write applies, whether or not it moved."""
    changed: tuple[tuple[int, int], ...] = field(default=(), repr=False)
    """Offset ranges this write carries the state of (sent again if it fails)."""
    previous_spso: int = field(default=-1, repr=False)
    """The SPSO the persister held before this write."""
    dead_letters: tuple[DeadLetter, ...] = ()
    """Records this write archives because a consumer rejected them or their delivery
    count reached the limit (KIP-1191): the shell writes them to the group's dead-letter
    topic before it persists the write. Gaps are not among them."""
    _released_dead: tuple[DeadLetter, ...] = field(default=(), repr=False)
    """The part of ``dead_letters`` not owed to ``updates`` (offered again on rollback)."""


class _Fetched:
    """The union of fetched batch ranges, for coverage queries."""

    __slots__ = ("batches", "ends", "starts")

    def __init__(self, batches: Iterable[tuple[int, int]]) -> None:
        merged: list[list[int]] = []
        self.batches: list[tuple[int, int]] = []
        """The batches in offset order, without empty or repeated ones."""
        for base, last in sorted((int(b[0]), int(b[1])) for b in batches):
            if last < base or (self.batches and last <= self.batches[-1][1]):
                continue
            self.batches.append((base, last))
            if merged and base <= merged[-1][1] + 1:
                merged[-1][1] = max(merged[-1][1], last)
            else:
                merged.append([base, last])
        self.starts = [m[0] for m in merged]
        self.ends = [m[1] for m in merged]

    def covers(self, lo: int, hi: int) -> bool:
        i = bisect.bisect_right(self.starts, lo) - 1
        return i >= 0 and self.ends[i] >= hi


class SharePartition:
    """State of one share-partition.  See the module docstring for the rules."""

    def __init__(
        self,
        group_id: str,
        topic_id: uuid.UUID | str,
        partition: int,
        start_offset: int,
        *,
        state_epoch: int = 0,
        leader_epoch: int = 0,
        record_lock_duration_ms: int = DEFAULT_RECORD_LOCK_DURATION_MS,
        delivery_count_limit: int = DEFAULT_DELIVERY_COUNT_LIMIT,
        max_in_flight_records: int = DEFAULT_MAX_IN_FLIGHT_RECORDS,
    ) -> None:
        """A share-partition with nothing in flight, starting at ``start_offset``.

        ``start_offset`` is the initial SPSO the shell computed from
        ``share.auto.offset.reset`` (or read from the persister).
        """
        if start_offset < 0:
            raise ValueError("start_offset must be >= 0")
        if record_lock_duration_ms <= 0 or delivery_count_limit < 1 or max_in_flight_records < 1:
            raise ValueError("invalid share-partition configuration")
        self.group_id = group_id
        self.topic_id = topic_id
        self.partition = partition
        self.state_epoch = state_epoch
        self.leader_epoch = leader_epoch
        self.record_lock_duration_ms = record_lock_duration_ms
        self.delivery_count_limit = delivery_count_limit
        self.max_in_flight_records = max_in_flight_records
        self.start_offset = start_offset
        """SPSO: every offset below it is acknowledged or archived."""
        self.end_offset = start_offset
        """SPEO (exclusive): offsets from here on were never in flight. Always >= start_offset."""
        self._batches: list[InFlightBatch] = []
        """Cover [start_offset, end_offset) exactly, in offset order."""
        self._untaken: list[PendingUpdate] = []
        """Pending updates not yet carried by a write."""
        self._dirty = False
        """Memory changed in a way no taken write carries yet."""
        self._write: StateWrite | None = None
        """The outstanding write, if any."""
        self._changed: list[tuple[int, int]] = []
        """Offset ranges whose durable state changed outside acknowledgements (lock expiry,
        release, archiving) that no taken write carries yet."""
        self._dead: list[DeadLetter] = []
        """Records archived outside acknowledgements at the delivery count limit (acquire,
        lock expiry, release) that no taken write carries yet."""
        self._written_start = start_offset
        """The SPSO the persister holds once every taken write succeeded."""
        self._available_from = start_offset
        """No in-flight offset in ``[start_offset, _available_from)`` is AVAILABLE: where the
        search of :meth:`next_fetch_offset` starts. Lowered whenever a record becomes
        AVAILABLE, raised by that search."""
        self._locks: list[tuple[int, int, int]] = []
        """Min-heap of (deadline_ms, first_offset, last_offset) lock entries. Every ACQUIRED,
        non-pending record lies in an entry with its deadline; entries whose records no
        longer hold that lock are stale and dropped when they reach the top."""

    # ------------------------------------------------------------------ restart
    @classmethod
    def from_persisted(
        cls,
        group_id: str,
        topic_id: uuid.UUID | str,
        partition: int,
        *,
        start_offset: int,
        state_epoch: int,
        state_batches: Iterable[tuple[int, int, int, int]],
        leader_epoch: int = 0,
        **config: int,
    ) -> SharePartition:
        """Rebuild from persisted share-partition state (ReadShareGroupState).

        ``state_batches`` are (first_offset, last_offset, delivery_state, delivery_count).
        Persisted ACQUIRED is read as AVAILABLE (nobody holds a lock after a restart);
        offsets between SPSO and the last batch that no batch mentions are AVAILABLE with
        count 0.  SPEO becomes one past the last persisted batch (or the SPSO).
        """
        sp = cls(group_id, topic_id, partition, start_offset, state_epoch=state_epoch,
                 leader_epoch=leader_epoch, **config)
        pos = start_offset
        for first, last, delivery_state, count in sorted(tuple(b) for b in state_batches):
            first = max(first, pos)
            if last < first:
                continue
            state = RecordState(delivery_state)
            if state is RecordState.ACQUIRED:
                state = RecordState.AVAILABLE
            if first > pos:
                sp._batches.append(InFlightBatch(pos, first - 1, InFlightState(RecordState.AVAILABLE)))
            sp._batches.append(InFlightBatch(first, last, InFlightState(state, count)))
            pos = last + 1
        sp.end_offset = pos
        sp._advance_start()
        sp._dirty = False
        return sp

    # ------------------------------------------------------------------ queries
    def next_fetch_offset(self) -> int | None:
        """Where the shell should start reading the log for the next acquire.

        The lowest AVAILABLE in-flight offset (released or timed-out records below SPEO)
        if there is one; else ``end_offset`` if the in-flight limit leaves room for new
        records; else None (nothing can be acquired until records are acknowledged).
        Amortized constant time: the search resumes where the last one stopped.
        """
        offset = self._first_available()
        if offset is not None:
            return offset
        if self.end_offset - self.start_offset < self.max_in_flight_records:
            return self.end_offset
        return None

    def has_available_in_flight(self) -> bool:
        """True if some offset below SPEO can be acquired again."""
        return self._first_available() is not None

    def next_deadline_ms(self) -> int | None:
        """The earliest lock deadline of an ACQUIRED, non-pending record; None if there is none.

        The shell schedules :meth:`expire` for then. Amortized constant time (a heap of
        lock entries, stale ones dropped lazily).
        """
        locks = self._locks
        while locks:
            deadline, lo, hi = locks[0]
            if self._holds_lock(deadline, lo, hi):
                return deadline
            heapq.heappop(locks)
        return None

    def record(self, offset: int) -> tuple[RecordState, int, str | None, int | None]:
        """(state, delivery_count, member_id, deadline_ms) of one offset, as in memory.

        Below SPSO: (ACKNOWLEDGED, 0, None, None) stands for "done"; from SPEO on:
        (AVAILABLE, 0, None, None).
        """
        if offset < self.start_offset:
            return RecordState.ACKNOWLEDGED, 0, None, None
        st = self._state_at(offset)
        if st is None:
            return RecordState.AVAILABLE, 0, None, None
        return st.state, st.delivery_count, st.member_id, st.deadline_ms

    def is_pending(self, offset: int) -> bool:
        st = self._state_at(offset) if offset >= self.start_offset else None
        return st is not None and st.is_pending

    def describe(self) -> list[tuple[int, int, RecordState, int]]:
        """In-flight ranges (first, last, state, delivery_count) in memory, merged where equal."""
        out: list[tuple[int, int, RecordState, int]] = []
        for batch in self._batches:
            for first, last, st in batch.states(batch.first_offset, batch.last_offset):
                if out and out[-1][1] + 1 == first and out[-1][2] is st.state and out[-1][3] == st.delivery_count:
                    out[-1] = (out[-1][0], last, st.state, st.delivery_count)
                else:
                    out.append((first, last, st.state, st.delivery_count))
        return out

    @property
    def needs_write(self) -> bool:
        """True if :meth:`take_write` would return a write now."""
        return self._write is None and (self._dirty or bool(self._untaken))

    @property
    def write_in_flight(self) -> StateWrite | None:
        return self._write

    # ------------------------------------------------------------------ acquire
    def acquire(
        self,
        member_id: str,
        batches: Iterable[tuple[int, int]],
        now_ms: int,
        max_records: int,
        *,
        acquire_mode: AcquireMode | int = AcquireMode.BATCH_OPTIMIZED,
        batch_size: int | None = None,
    ) -> list[AcquiredRecords]:
        """Acquire records for ``member_id`` out of the fetched log batches.

        ``batches`` are (base_offset, last_offset) of the batches the shell read from the
        log, starting at or below :meth:`next_fetch_offset`.  Returns the acquired ranges
        with their delivery counts, in offset order (adjacent ranges with equal counts
        merged); empty if nothing could be acquired.  In BATCH_OPTIMIZED mode
        ``max_records`` is a soft limit (whole batches are taken); in RECORD_LIMIT mode it
        is never exceeded.  ``batch_size``, if given, is the preferred size of acquired
        batches: consecutive new log batches are tracked as one in-flight batch of up to
        that many records (a log batch is never split for it), and each such batch is one
        entry of the result.  May archive records
        (gaps, delivery limit), which makes the partition dirty.
        """
        mode = AcquireMode(acquire_mode)
        fetched = _Fetched(batches)
        out: list[AcquiredRecords] = []
        if not fetched.starts or max_records <= 0:
            return out
        remaining = max_records
        deadline = now_ms + self.record_lock_duration_ms
        limit = self.delivery_count_limit
        archived = False

        # 1. Available records already in flight, inside the fetched span.
        span_lo = max(fetched.starts[0], self.start_offset)
        span_hi = min(fetched.ends[-1], self.end_offset - 1)
        if span_lo <= span_hi:
            i = self._index_of(span_lo)
            while i < len(self._batches) and remaining > 0:
                batch = self._batches[i]
                i += 1
                if batch.first_offset > span_hi:
                    break
                bs = batch.batch_state
                if bs is not None:
                    if bs.state is not RecordState.AVAILABLE or bs.is_pending:
                        continue
                    size = batch.last_offset - batch.first_offset + 1
                    if (batch.first_offset >= span_lo and batch.last_offset <= span_hi
                            and fetched.covers(batch.first_offset, batch.last_offset)
                            and (mode is AcquireMode.BATCH_OPTIMIZED or size <= remaining)):
                        if bs.delivery_count >= limit:
                            bs.state = RecordState.ARCHIVED
                            self._changed.append((batch.first_offset, batch.last_offset))
                            self._dead_letter(batch.first_offset, batch.last_offset, bs.delivery_count)
                            archived = True
                            continue
                        self._take(bs, member_id, deadline)
                        _append(out, batch.first_offset, batch.last_offset, bs.delivery_count)
                        remaining -= size
                        continue
                offsets = batch.split()
                for offset in range(max(batch.first_offset, span_lo), min(batch.last_offset, span_hi) + 1):
                    if remaining <= 0:
                        break
                    st = offsets[offset]
                    if st.state is not RecordState.AVAILABLE or st.is_pending:
                        continue
                    if not fetched.covers(offset, offset) or st.delivery_count >= limit:
                        st.state = RecordState.ARCHIVED  # no record here, or delivered enough
                        self._changed.append((offset, offset))
                        if fetched.covers(offset, offset):
                            self._dead_letter(offset, offset, st.delivery_count)
                        archived = True
                        continue
                    self._take(st, member_id, deadline)
                    _append(out, offset, offset, st.delivery_count)
                    remaining -= 1

        # 2. New records from SPEO on, within the in-flight limit.
        last_allowed = self.start_offset + self.max_in_flight_records - 1
        pos = self.end_offset
        grown: InFlightBatch | None = None
        for base, last in fetched.batches:
            if last < pos:
                continue
            if remaining <= 0 or pos > last_allowed:
                break
            if base > pos:
                self._batches.append(InFlightBatch(pos, base - 1, InFlightState(RecordState.ARCHIVED)))
                self._changed.append((pos, base - 1))
                archived = True
                grown = None
                pos = base
            hi = min(last, last_allowed)
            if mode is AcquireMode.RECORD_LIMIT:
                hi = min(hi, pos + remaining - 1)
            if hi < pos:
                break
            if (grown is not None and batch_size is not None and grown.last_offset + 1 == pos
                    and hi - grown.first_offset + 1 <= batch_size):
                grown.last_offset = hi
                _append(out, pos, hi, 1)
            else:
                grown = InFlightBatch(pos, hi, InFlightState(RecordState.ACQUIRED, 1, member_id, deadline))
                self._batches.append(grown)
                if batch_size is None:
                    _append(out, pos, hi, 1)
                else:
                    # BatchSize (ShareFetch v2) is the preferred size of acquired batches:
                    # each in-flight batch of new records is its own AcquiredRecords entry.
                    out.append(AcquiredRecords(pos, hi, 1))
            remaining -= hi - pos + 1
            pos = hi + 1
        self.end_offset = max(self.end_offset, pos)
        for a in out:
            self._push_lock(deadline, a.first_offset, a.last_offset)

        if archived:
            self._dirty = True
            self._advance_start()
        return out

    def archive_gap(self, first_offset: int, last_offset: int) -> bool:
        """Offsets ``[first_offset, last_offset]`` right at SPEO hold nothing to deliver
        (a read_committed share group: markers, aborted transactions' records): archive
        them, as :meth:`acquire` archives a gap before a fetched batch, so that SPSO can
        move past them. Returns whether anything changed (nothing unless ``first_offset``
        is SPEO)."""
        if first_offset != self.end_offset or last_offset < first_offset:
            return False
        self._batches.append(InFlightBatch(first_offset, last_offset, InFlightState(RecordState.ARCHIVED)))
        self._changed.append((first_offset, last_offset))
        self.end_offset = last_offset + 1
        self._dirty = True
        self._advance_start()
        return True

    # ------------------------------------------------------------------ acknowledge
    def acknowledge(
        self,
        member_id: str,
        batches: Iterable[tuple[int, int, Sequence[int]]],
        now_ms: int,
    ) -> PendingUpdate:
        """Acknowledge ranges for ``member_id``: (first_offset, last_offset, acknowledge_types).

        ``acknowledge_types`` has one element for the whole range or one per offset.
        Either every acknowledgement applies or none does.  Returns a
        :class:`PendingUpdate`: PENDING until the write that carries it (see
        :meth:`take_write`) is committed or rolled back, or already COMMITTED if it held
        only renewals (which take effect at once).

        Validation is Kafka's (the share-fetch request checks, then the share-partition
        leader's), and raises :class:`~shoal.errors.ApiError`:

        * ``INVALID_REQUEST`` for a malformed request: a bad range, the wrong number of
          types, an unknown type, batches out of ascending order or overlapping (a batch
          starting below the previous batch's last offset), or a range reaching past the
          records fetched so far (at or beyond SPEO);
        * ``INVALID_RECORD_STATE`` when an offset is not ACQUIRED by ``member_id`` with a
          live lock (or already has an acknowledgement pending), and for a batch starting
          at the previous batch's last offset (that offset is acknowledged twice).

        Offsets below SPSO are already archived (or acknowledged): a batch wholly below it
        is skipped as a success, one straddling it acknowledges from SPSO on.
        """
        runs: list[tuple[int, int, AcknowledgeType]] = []
        previous_last = -1
        twice = False
        for first, last, types in batches:
            first, last, types = int(first), int(last), list(types)
            if first < 0 or last < first or not types:
                raise ApiError(ErrorCode.invalid_request, f"bad acknowledgement range {first}-{last}")
            if first < previous_last:
                raise ApiError(ErrorCode.invalid_request,
                               "acknowledgement batches out of order or overlapping")
            twice |= first == previous_last
            if len(types) != 1 and len(types) != last - first + 1:
                raise ApiError(ErrorCode.invalid_request, f"{len(types)} acknowledge types for {first}-{last}")
            try:
                kinds = [AcknowledgeType(t) for t in types]
            except ValueError:
                raise ApiError(ErrorCode.invalid_request, f"unknown acknowledge type in {types}") from None
            previous_last = last
            if len(kinds) == 1:
                runs.append((first, last, kinds[0]))
            else:
                for offset, kind in enumerate(kinds, start=first):
                    if runs and runs[-1][2] is kind and runs[-1][1] + 1 == offset:
                        runs[-1] = (runs[-1][0], offset, kind)
                    else:
                        runs.append((offset, offset, kind))
        for lo, hi, _kind in runs:
            if hi >= self.end_offset and hi >= self.start_offset:
                raise ApiError(ErrorCode.invalid_request,
                               f"offsets {lo}-{hi} reach past the last fetched offset {self.end_offset - 1}")
        if twice:
            raise ApiError(ErrorCode.invalid_record_state, "an offset is acknowledged twice")
        # Below SPSO: already archived, nothing to do.
        runs = [(max(lo, self.start_offset), hi, kind) for lo, hi, kind in runs if hi >= self.start_offset]
        if not runs:
            return PendingUpdate(member_id, status=UpdateStatus.COMMITTED)

        # Check everything before changing anything.
        for lo, hi, _kind in runs:
            for first, last, st in self._states(lo, hi):
                if (st.state is not RecordState.ACQUIRED or st.member_id != member_id or st.is_pending
                        or st.deadline_ms is None or st.deadline_ms <= now_ms):
                    raise ApiError(ErrorCode.invalid_record_state,
                                   f"offsets {first}-{last} are not acquired by this member")

        update = PendingUpdate(member_id, _first_offset=runs[0][0], _last_offset=runs[-1][1])
        for lo, hi, kind in runs:
            if kind is AcknowledgeType.REJECT or kind is AcknowledgeType.RELEASE:
                for first, last, st in self._states(lo, hi):
                    if kind is AcknowledgeType.REJECT:
                        update._dead_letters.append(
                            DeadLetter(first, last, st.delivery_count, ArchiveCause.CLIENT_REJECT))
                    elif st.delivery_count >= self.delivery_count_limit:
                        update._dead_letters.append(
                            DeadLetter(first, last, st.delivery_count, ArchiveCause.DELIVERY_COUNT_EXCEEDED))
            for st in self._isolate(lo, hi):
                if kind is AcknowledgeType.RENEW:
                    st.deadline_ms = now_ms + self.record_lock_duration_ms
                    continue
                target = _ACK_TARGETS[kind]
                if target is RecordState.AVAILABLE and st.delivery_count >= self.delivery_count_limit:
                    target = RecordState.ARCHIVED
                st.pending_state = target
                update._states.append(st)
            if kind is AcknowledgeType.RENEW:
                self._push_lock(now_ms + self.record_lock_duration_ms, lo, hi)
        if update._states:
            self._untaken.append(update)
        else:
            update.status = UpdateStatus.COMMITTED
        return update

    # ------------------------------------------------------------------ release
    def expire(self, now_ms: int) -> list[tuple[int, int]]:
        """Release every ACQUIRED, non-pending record whose lock deadline is <= ``now_ms``.

        Released records become AVAILABLE, or ARCHIVED at the delivery count limit.
        Returns the released ranges (empty if none; the partition is dirty otherwise).
        Records with a pending acknowledgement are left to :meth:`rollback`.
        """
        return self._release_where(lambda st: st.deadline_ms is not None and st.deadline_ms <= now_ms)

    def release_member(self, member_id: str, now_ms: int) -> list[tuple[int, int]]:
        """Release every ACQUIRED, non-pending record held by ``member_id`` (session closed,
        member left or fenced).  Returns the released ranges, as :meth:`expire` does.
        """
        del now_ms  # part of the contract; release does not depend on time
        return self._release_where(lambda st: st.member_id == member_id)

    # ------------------------------------------------------------------ log start
    def advance_start_to(self, log_start_offset: int) -> bool:
        """The log's start offset moved to ``log_start_offset`` (retention, DeleteRecords).

        Records below it are gone from the log and can never be delivered, so SPSO moves
        up to it (SPEO too, if it was below) and the in-flight state below it is dropped,
        whatever it was: available, acquired (the holder's acknowledgement of those
        offsets is skipped as a success, as Kafka does below SPSO) or pending (the write carrying it
        still commits or rolls back, but no longer affects this partition).  Then SPSO
        moves on over terminal records as usual.  Returns True if SPSO moved (the
        partition is then dirty: the new SPSO must be persisted); False, changing
        nothing, if ``log_start_offset`` <= SPSO.
        """
        if log_start_offset <= self.start_offset:
            return False
        batches = self._batches
        drop = 0
        while drop < len(batches) and batches[drop].last_offset < log_start_offset:
            drop += 1
        del batches[:drop]
        if batches and batches[0].first_offset < log_start_offset:
            batches[0].trim_below(log_start_offset)
        self.start_offset = log_start_offset
        self.end_offset = max(self.end_offset, log_start_offset)
        self._dirty = True
        self._advance_start()
        return True

    # ------------------------------------------------------------------ durability
    def snapshot(self) -> StateWrite:
        """The whole durable state now (pending acknowledgements not applied): the SPSO and
        every in-flight range in a non-default state.  No side effects."""
        return self._build_snapshot()

    def take_write(self) -> StateWrite | None:
        """The next write for the persister, or None.

        None if a write is outstanding (wait for :meth:`commit`/:meth:`rollback`) or
        nothing changed since the last one.  Otherwise the change since the previous
        write (see :class:`StateWrite`), with every pending acknowledgement made so far
        applied; those are listed in ``updates``.
        """
        if not self.needs_write:
            return None
        updates = tuple(self._untaken)
        changed = self._changed
        changed.extend((u._first_offset, u._last_offset) for u in updates)
        released_dead = tuple(self._dead)
        self._untaken = []
        self._changed = []
        self._dead = []
        self._dirty = False
        write = self._build_change(updates, changed)
        dead = sorted(released_dead + tuple(d for u in updates for d in u._dead_letters))
        write = dataclasses.replace(write, dead_letters=tuple(dead), _released_dead=released_dead)
        self._written_start = write.spso
        for u in updates:
            for st in u._states:
                st.pending_write = write
        self._write = write
        return write

    def commit(self, write: StateWrite) -> tuple[PendingUpdate, ...]:
        """The persister stored ``write``: its acknowledgements take effect and SPSO advances.

        Returns the updates now COMMITTED, for the shell to answer.  Raises ValueError if
        ``write`` is not the outstanding write.
        """
        self._check_outstanding(write)
        self._write = None
        for update in write.updates:
            for st in update._states:
                new = st.pending_state
                assert new is not None
                if new is RecordState.AVAILABLE:
                    self._available_from = min(self._available_from, update._first_offset)
                st.state = new
                st.member_id = None
                st.deadline_ms = None
                st.pending_state = None
                st.pending_write = None
            update.status = UpdateStatus.COMMITTED
        self._advance_start()
        return write.updates

    def rollback(self, write: StateWrite, now_ms: int) -> tuple[PendingUpdate, ...]:
        """The persister failed ``write``: its acknowledgements are dropped.

        Their records stay ACQUIRED by their member, except those whose lock deadline is
        <= ``now_ms``, which are released as by a lock timeout.  The partition stays dirty
        (memory may hold changes the failed write carried), so :meth:`take_write` will
        offer a new snapshot.  Returns the updates now ROLLED_BACK.
        """
        self._check_outstanding(write)
        self._write = None
        self._changed.extend(write.changed)  # the persister did not take them: send them again
        self._dead[:0] = write._released_dead
        self._written_start = write.previous_spso
        for update in write.updates:
            held: set[int] = set()
            archived: set[int] = set()
            for st in update._states:
                st.pending_state = None
                st.pending_write = None
                if st.deadline_ms is not None and st.deadline_ms <= now_ms:
                    self._release(st)
                    self._available_from = min(self._available_from, update._first_offset)
                    if st.state is RecordState.ARCHIVED:
                        archived.add(id(st))
                elif st.deadline_ms is not None:
                    held.add(st.deadline_ms)
            if archived:
                for first, last, st in self._states(update._first_offset, update._last_offset):
                    if id(st) in archived:
                        self._dead_letter(first, last, st.delivery_count)
            for deadline in held:  # locked again: their entries may have been dropped while pending
                self._push_lock(deadline, update._first_offset, update._last_offset)
            update.status = UpdateStatus.ROLLED_BACK
        self._dirty = True
        self._advance_start()
        return write.updates

    # ------------------------------------------------------------------ internals
    def _check_outstanding(self, write: StateWrite) -> None:
        if write is not self._write:
            raise ValueError("not the outstanding write of this share-partition")

    def _take(self, st: InFlightState, member_id: str, deadline_ms: int) -> None:
        st.state = RecordState.ACQUIRED
        st.delivery_count += 1
        st.member_id = member_id
        st.deadline_ms = deadline_ms

    def _dead_letter(self, first: int, last: int, delivery_count: int) -> None:
        """Note records archived at the delivery count limit for the next write."""
        self._dead.append(DeadLetter(first, last, delivery_count, ArchiveCause.DELIVERY_COUNT_EXCEEDED))

    def _release(self, st: InFlightState) -> None:
        st.state = (RecordState.ARCHIVED if st.delivery_count >= self.delivery_count_limit
                    else RecordState.AVAILABLE)
        st.member_id = None
        st.deadline_ms = None

    def _release_where(self, predicate) -> list[tuple[int, int]]:  # type: ignore[no-untyped-def]
        released: list[tuple[int, int]] = []
        for batch in self._batches:
            for first, last, st in batch.states(batch.first_offset, batch.last_offset):
                if st.state is RecordState.ACQUIRED and not st.is_pending and predicate(st):
                    self._release(st)
                    if st.state is RecordState.ARCHIVED:
                        self._dead_letter(first, last, st.delivery_count)
                    self._available_from = min(self._available_from, first)
                    if released and released[-1][1] + 1 == first:
                        released[-1] = (released[-1][0], last)
                    else:
                        released.append((first, last))
        if released:
            self._changed.extend(released)
            self._dirty = True
            self._advance_start()
        return released

    def _first_available(self) -> int | None:
        """The lowest AVAILABLE in-flight offset, searching from ``_available_from``."""
        lo = max(self._available_from, self.start_offset)
        batches = self._batches
        i = self._index_of(lo) if lo < self.end_offset else len(batches)
        while i < len(batches):
            batch = batches[i]
            i += 1
            for first, _last, st in batch.states(lo, batch.last_offset):
                if st.state is RecordState.AVAILABLE and not st.is_pending:
                    self._available_from = first
                    return first
        # Records beyond SPEO enter as ACQUIRED or ARCHIVED, never AVAILABLE.
        self._available_from = self.end_offset
        return None

    def _push_lock(self, deadline_ms: int, first_offset: int, last_offset: int) -> None:
        locks = self._locks
        heapq.heappush(locks, (deadline_ms, first_offset, last_offset))
        if len(locks) > 64 + 2 * (self.end_offset - self.start_offset):
            # Mostly stale entries under one long-held lock: keep the live ones.
            self._locks = [e for e in locks if self._holds_lock(*e)]
            heapq.heapify(self._locks)

    def _holds_lock(self, deadline_ms: int, first_offset: int, last_offset: int) -> bool:
        """Whether some ACQUIRED, non-pending record of the range has this lock deadline."""
        lo = max(first_offset, self.start_offset)
        hi = min(last_offset, self.end_offset - 1)
        if lo > hi:
            return False
        for _f, _l, st in self._states(lo, hi):
            if st.state is RecordState.ACQUIRED and st.deadline_ms == deadline_ms and not st.is_pending:
                return True
        return False

    def _index_of(self, offset: int) -> int:
        """Index of the batch holding ``offset`` (or the first one after it)."""
        i = bisect.bisect_right(self._batches, offset, key=_first_offset) - 1
        if i < 0 or self._batches[i].last_offset < offset:
            i += 1
        return i

    def _state_at(self, offset: int) -> InFlightState | None:
        if offset >= self.end_offset:
            return None
        for _f, _l, st in self._states(offset, offset):
            return st
        return None

    def _states(self, lo: int, hi: int) -> Iterator[tuple[int, int, InFlightState]]:
        i = self._index_of(lo)
        while i < len(self._batches) and self._batches[i].first_offset <= hi:
            yield from self._batches[i].states(lo, hi)
            i += 1

    def _isolate(self, lo: int, hi: int) -> list[InFlightState]:
        """State objects standing for exactly ``[lo, hi]`` (splitting batches it cuts)."""
        out: list[InFlightState] = []
        i = self._index_of(lo)
        while i < len(self._batches) and self._batches[i].first_offset <= hi:
            batch = self._batches[i]
            i += 1
            if batch.batch_state is not None and lo <= batch.first_offset and batch.last_offset <= hi:
                out.append(batch.batch_state)
            else:
                offsets = batch.split()
                out.extend(offsets[o] for o in range(max(lo, batch.first_offset), min(hi, batch.last_offset) + 1))
        return out

    def _advance_start(self) -> None:
        """Move SPSO over terminal records and drop their state."""
        batches = self._batches
        drop = 0
        start = self.start_offset
        while drop < len(batches):
            batch = batches[drop]
            bs = batch.batch_state
            if bs is not None:
                if bs.state in TERMINAL_STATES and not bs.is_pending:
                    start = batch.last_offset + 1
                    drop += 1
                    continue
                break
            offsets = batch.offset_state
            assert offsets is not None
            offset = max(batch.first_offset, start)
            while offset <= batch.last_offset:
                st = offsets[offset]
                if st.state not in TERMINAL_STATES or st.is_pending:
                    break
                offset += 1
            start = offset
            if offset > batch.last_offset:
                drop += 1
                continue
            batch.trim_below(offset)
            break
        if drop:
            del batches[:drop]
        if not batches:
            start = max(start, self.end_offset)
        assert start >= self.start_offset
        self.start_offset = start
        self.end_offset = max(self.end_offset, start)

    def _build_snapshot(self) -> StateWrite:
        views: list[tuple[int, int, RecordState, int]] = []
        for batch in self._batches:
            for first, last, st in batch.states(batch.first_offset, batch.last_offset):
                view = st.durable_view()
                if views and views[-1][1] + 1 == first and views[-1][2] is view[0] and views[-1][3] == view[1]:
                    views[-1] = (views[-1][0], last, view[0], view[1])
                else:
                    views.append((first, last, view[0], view[1]))
        start = self.start_offset
        k = 0
        while k < len(views) and views[k][2] in TERMINAL_STATES:
            start = views[k][1] + 1
            k += 1
        if k == len(views):
            start = max(start, self.end_offset)
        state_batches = tuple(
            StateBatch(first, last, int(state), count)
            for first, last, state, count in views[k:]
            if not (state is RecordState.AVAILABLE and count == 0)
        )
        return StateWrite(
            group_id=self.group_id,
            topic_id=self.topic_id,
            partition=self.partition,
            start_offset=start,
            state_epoch=self.state_epoch,
            leader_epoch=self.leader_epoch,
            state_batches=state_batches,
            delivery_complete_count=sum(b.last_offset - b.first_offset + 1 for b in state_batches
                                        if b.delivery_state in (RecordState.ACKNOWLEDGED, RecordState.ARCHIVED)),
            spso=start,
        )

    def _build_change(self, updates: tuple[PendingUpdate, ...], changed: list[tuple[int, int]]) -> StateWrite:
        """The write carrying ``changed`` (offset ranges) with pending targets applied."""
        start = self.start_offset
        complete = 0
        leading = True
        for batch in self._batches:
            for first, last, st in batch.states(batch.first_offset, batch.last_offset):
                state = st.pending_state if st.pending_state is not None else st.state
                if state in TERMINAL_STATES:
                    if leading:
                        start = last + 1
                    else:
                        complete += last - first + 1
                else:
                    leading = False
        if leading:
            start = max(start, self.end_offset)
        views: list[tuple[int, int, RecordState, int]] = []
        hi_limit = self.end_offset - 1
        for lo, hi in _merge_ranges(changed):
            lo = max(lo, start)
            hi = min(hi, hi_limit)
            if lo > hi:
                continue
            for first, last, st in self._states(lo, hi):
                view = (st.pending_state, st.delivery_count) if st.pending_state is not None else st.durable_view()
                if view[0] is RecordState.AVAILABLE and view[1] == 0:
                    continue
                if views and views[-1][1] + 1 == first and views[-1][2] is view[0] and views[-1][3] == view[1]:
                    views[-1] = (views[-1][0], last, view[0], view[1])
                else:
                    views.append((first, last, view[0], view[1]))
        return StateWrite(
            group_id=self.group_id,
            topic_id=self.topic_id,
            partition=self.partition,
            start_offset=start if start != self._written_start else -1,
            state_epoch=self.state_epoch,
            leader_epoch=self.leader_epoch,
            state_batches=tuple(StateBatch(first, last, int(state), count) for first, last, state, count in views),
            updates=updates,
            delivery_complete_count=complete,
            spso=start,
            changed=tuple(changed),
            previous_spso=self._written_start,
        )


def _merge_ranges(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted ``ranges`` with overlapping and adjacent ones joined."""
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1] + 1:
            if hi > out[-1][1]:
                out[-1] = (out[-1][0], hi)
        else:
            out.append((lo, hi))
    return out


def _first_offset(batch: InFlightBatch) -> int:
    return batch.first_offset


def _append(out: list[AcquiredRecords], first: int, last: int, count: int) -> None:
    if out and out[-1].last_offset + 1 == first and out[-1].delivery_count == count:
        out[-1] = AcquiredRecords(out[-1].first_offset, last, count)
    else:
        out.append(AcquiredRecords(first, last, count))
