"""SharePartition judged by KIP-932's rules, stated here independently of the code.

The model below knows nothing of shoal's share package except its public calls: it has
its own record states (KIP-932's names, mapped to the persisted ids 0/1/2/4 only where
it compares), its own in-flight limit and lock rule, the persisted state it expects the
share coordinator to hold (computed from its own records, not from the writes), and
restarts by replaying that persisted state itself.

The rules (KIP-932 "In-flight records", "Managing the SPSO and SPEO", "Record
delivery count", "Acquisition lock", and the share-state writes of its later revision):

* A record is Available, Acquired, Acknowledged or Archived; the last two are final.
  Offsets below the SPSO are done; offsets from the SPEO on were never in flight.
* Acquiring takes Available records, lowest offset first, for one member: the delivery
  count goes up by one and the lock ends LOCK_MS later. A record whose count already
  reached the delivery limit is Archived instead. An offset that holds no record (a
  gap in the log) is never delivered: it is Archived once fetching passes it. A record
  is in flight for the first time only below SPSO + MAX_IN_FLIGHT.
* In the record-limit mode at most max_records are acquired. In the batch-optimized
  mode (what clients use) max_records is soft: whole log batches are taken (a batch is
  cut only by the in-flight limit), so the overshoot is under one batch (for records
  delivered again, under one in-flight batch). With BatchSize,
  the acquired ranges of new records are each at most BatchSize records unless a single
  log batch is larger, and they start and end on log-batch boundaries.
* Only the member holding a record's lock may acknowledge it, before the lock ends.
  Accept -> Acknowledged, Reject and Gap -> Archived, Release -> Available (Archived at
  the delivery limit), Renew -> the lock ends LOCK_MS from now. A request (several
  acknowledgement batches) applies all or nothing; until its write is durable the
  records stay Acquired (pending), and a failed write leaves them Acquired, or released
  if their lock ended meanwhile.
* A lock that ends, or a member that goes, releases its records as Release does.
* The SPSO moves up over final records and never moves down; it follows the log start.
* What is persisted: the SPSO (once a write carries it) and, per offset, the state and
  delivery count of its last persisted change. Acquiring alone persists nothing; every
  other change of a record is carried by the next write, Acquired written as Available.
  After a restart a record is what was persisted (so an acquired one is Available with
  its persisted count), and an accepted record is never delivered again.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from shoal.errors import ApiError
from shoal.share.partition import SharePartition, StateWrite
from shoal.share.state import AcquireMode

AVAILABLE, ACQUIRED, ACKNOWLEDGED, ARCHIVED = "Available", "Acquired", "Acknowledged", "Archived"
FINAL = frozenset({ACKNOWLEDGED, ARCHIVED})
PERSISTED_ID = {AVAILABLE: 0, ACQUIRED: 1, ACKNOWLEDGED: 2, ARCHIVED: 4}
"""KIP-932's persisted record state ids (WriteShareGroupState DeliveryState)."""
NAME_OF_ID = {v: k for k, v in PERSISTED_ID.items()}
GAP, ACCEPT, RELEASE, REJECT, RENEW = 0, 1, 2, 3, 4
"""Acknowledgement types on the wire (ShareAcknowledge AcknowledgeTypes)."""

LOCK_MS = 1_000
LIMIT = 3
MAX_IN_FLIGHT = 25
MEMBERS = ("m1", "m2", "m3")


@dataclass
class Rec:
    state: str = AVAILABLE
    count: int = 0
    member: str | None = None
    lock_ends: int | None = None
    pending: str | None = None
    """The state an acknowledgement moves it to once durable."""
    in_write: bool = False


@dataclass
class Persisted:
    """The share coordinator's view of one share-partition: SPSO, and offset -> (state, count)."""

    start: int
    offsets: dict[int, tuple[str, int]] = field(default_factory=dict)

    def get(self, offset: int) -> tuple[str, int]:
        return self.offsets.get(offset, (AVAILABLE, 0))

    def drop_below_start(self) -> None:
        self.offsets = {o: v for o, v in self.offsets.items() if o >= self.start}


def merged(held: Persisted, write: StateWrite) -> Persisted:
    """What the share coordinator holds after merging ``write`` (KIP-932: StartOffset -1
    keeps the SPSO; state batches replace the states of their offsets)."""
    out = Persisted(held.start if write.start_offset == -1 else write.start_offset, dict(held.offsets))
    for b in write.state_batches:
        for o in range(b.first_offset, b.last_offset + 1):
            out.offsets[o] = (NAME_OF_ID[b.delivery_state], b.delivery_count)
    out.drop_below_start()
    return out


class SharePartitionModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.sp = SharePartition("g", "t", 0, 0, record_lock_duration_ms=LOCK_MS,
                                 delivery_count_limit=LIMIT, max_in_flight_records=MAX_IN_FLIGHT)
        self.now = 0
        self.log: list[tuple[int, int]] = []
        """The log's record batches (first, last); offsets between them are gaps."""
        self.log_end = 0
        self.log_start = 0
        self.start = 0
        self.end = 0
        self.recs: dict[int, Rec] = {}
        self.changed: set[int] = set()
        """Offsets whose state changed since the last write took them (not acquisitions)."""
        self.start_moved = False
        self.untaken = False
        self.outstanding: tuple[StateWrite, dict[int, tuple[str, int]], dict[int, tuple[str, int]], int] | None \
            = None
        """The write in flight, the states it must carry, those it may carry, and the SPSO it makes durable."""
        self.expected = Persisted(0)
        """What the model says the share coordinator holds."""
        self.held = Persisted(0)
        """What the share coordinator holds, from the partition's own writes."""
        self.accepted: set[int] = set()

    # -- the rules as the model states them ---------------------------------------
    def _is_record(self, offset: int) -> bool:
        return any(a <= offset <= b for a, b in self.log)

    def _advance(self) -> None:
        while self.start < self.end and self.recs[self.start].state in FINAL and self.recs[self.start].pending is None:
            del self.recs[self.start]
            self.start += 1

    def _next_fetch(self) -> int | None:
        for o in range(self.start, self.end):
            r = self.recs[o]
            if r.state == AVAILABLE and r.pending is None:
                return o
        return self.end if self.end - self.start < MAX_IN_FLIGHT else None

    def _release(self, o: int) -> None:
        r = self.recs[o]
        r.state = ARCHIVED if r.count >= LIMIT else AVAILABLE
        r.member = r.lock_ends = None
        self.changed.add(o)

    def _acquirable(self, o: int, fetch: int) -> bool:
        if o < fetch or not self._is_record(o):
            return False
        if o >= self.end:
            return o < self.start + MAX_IN_FLIGHT
        r = self.recs[o]
        return r.state == AVAILABLE and r.pending is None and r.count < LIMIT

    # -- rules -----------------------------------------------------------------------
    @rule(n=st.integers(1, 8), gap=st.sampled_from([0, 0, 0, 1, 3]))
    def produce(self, n: int, gap: int) -> None:
        """A record batch of ``n`` records, after ``gap`` offsets holding none (compaction, markers)."""
        first = self.log_end + gap
        self.log.append((first, first + n - 1))
        self.log_end = first + n

    def _follow_log_start(self) -> None:
        moved = self.sp.advance_start_to(self.log_start)
        assert moved == (self.log_start > self.start)
        if not moved:
            return
        for o in range(self.start, min(self.log_start, self.end)):
            del self.recs[o]
        self.start = self.log_start
        self.end = max(self.end, self.log_start)
        self.start_moved = True
        self._advance()

    @rule(k=st.integers(1, 12))
    def delete_records(self, k: int) -> None:
        """Retention or DeleteRecords: the log start moves up (possibly inside a batch)."""
        self.log_start = min(self.log_end, self.log_start + k)
        self.log = [(max(a, self.log_start), b) for a, b in self.log if b >= self.log_start]
        self._follow_log_start()

    @rule(member=st.sampled_from(MEMBERS), max_records=st.integers(1, 12), optimized=st.booleans(),
          batch_size=st.sampled_from([None, None, 1, 4, 10]))
    def acquire(self, member: str, max_records: int, optimized: bool, batch_size: int | None) -> None:
        fetch = self.sp.next_fetch_offset()
        assert fetch == self._next_fetch()
        if fetch is None:
            return
        fetched = [b for b in self.log if b[1] >= fetch]
        mode = AcquireMode.BATCH_OPTIMIZED if optimized else AcquireMode.RECORD_LIMIT
        old_end = self.end
        got = self.sp.acquire(member, fetched, self.now, max_records, acquire_mode=mode, batch_size=batch_size)
        flat = [(o, a.delivery_count) for a in got for o in range(a.first_offset, a.last_offset + 1)]
        offsets = [o for o, _ in flat]
        assert offsets == sorted(set(offsets)), "acquired ranges overlap or are out of order"
        for o, count in flat:
            assert self._acquirable(o, fetch), f"offset {o} acquired but not acquirable"
            assert count == (self.recs[o].count if o < old_end else 0) + 1, f"delivery count of {o}"
            assert o not in self.accepted, f"accepted offset {o} delivered again"
        # Lowest offset first: nothing acquirable below the first acquired offset is skipped.
        limit_end = self.start + MAX_IN_FLIGHT
        candidates = [o for o in range(fetch, max(old_end, min(self.log_end, limit_end))) if self._acquirable(o, fetch)]
        if candidates:
            assert offsets and offsets[0] == candidates[0], (offsets[:1], candidates[:1])
            # Nothing acquirable is skipped between acquired offsets.
            skipped = [o for o in candidates if offsets[0] < o < offsets[-1] and o not in set(offsets)]
            assert not skipped, f"skipped {skipped}"
        else:
            assert not offsets
        if mode is AcquireMode.RECORD_LIMIT:
            assert len(offsets) <= max_records
        else:
            # The unit taken whole is a log batch, a BatchSize group, or an in-flight batch
            # of records being delivered again (after a restart, a persisted state batch).
            again = sum(1 for o in candidates if o < old_end)
            biggest = max([b - a + 1 for a, b in fetched] + [batch_size or 0, again])
            assert len(offsets) < max_records + biggest, "batch-optimized overshoot is over one batch"
        new = [o for o in offsets if o >= old_end]
        if new:
            cut_by_limit = new[-1] == limit_end - 1
            for a, b in fetched:
                part = [o for o in new if a <= o <= b]
                if part and mode is AcquireMode.BATCH_OPTIMIZED:
                    whole = list(range(max(a, old_end), b + 1))
                    assert part == whole or (cut_by_limit and part == whole[:len(part)]), \
                        f"log batch {a}-{b} split: {part[0]}-{part[-1]}"
        if batch_size is not None:
            for a in got:
                if a.first_offset < old_end:
                    continue
                size = a.last_offset - a.first_offset + 1
                starts = any(x == a.first_offset or (x < a.first_offset <= y and a.first_offset == old_end)
                             for x, y in fetched)
                assert starts, f"acquired range {a} does not start on a log batch"
                inside_one = any(x <= a.first_offset and a.last_offset <= y for x, y in fetched)
                assert size <= batch_size or inside_one, f"acquired range {a} larger than BatchSize {batch_size}"
        # The model applies the acquisition, and what fetching passed over.
        new_end = self.sp.end_offset
        assert new_end >= old_end
        for o in range(old_end, new_end):
            assert o in set(new) or not self._is_record(o), f"record {o} passed over without being acquired"
            self.recs[o] = Rec()
            if o not in set(new):
                self.recs[o].state = ARCHIVED
                self.changed.add(o)
        self.end = new_end
        for o in offsets:
            r = self.recs[o]
            r.state, r.count, r.member, r.lock_ends = ACQUIRED, r.count + 1, member, self.now + LOCK_MS
        # In-flight offsets fetching passed over: archived only if they hold no record, or
        # a record at the delivery limit.
        for o in range(self.start, old_end):
            r = self.recs[o]
            if r.state != AVAILABLE or r.pending is not None:
                continue
            # Below the partition's new SPSO it is final; above, the partition says.
            if o < self.sp.start_offset or int(self.sp.record(o)[0]) == PERSISTED_ID[ARCHIVED]:
                assert not self._is_record(o) or r.count >= LIMIT, f"record {o} archived without reason"
                r.state = ARCHIVED
                self.changed.add(o)
        self._advance()

    @rule(data=st.data())
    def acknowledge(self, data: st.DataObject) -> None:
        """One request of one to three acknowledgement batches: mostly by a member over
        records it holds (so that most requests are valid), sometimes anywhere."""
        holders = sorted({r.member for r in self.recs.values() if r.state == ACQUIRED and r.pending is None
                          and r.member is not None and r.lock_ends > self.now})
        member = data.draw(st.sampled_from(holders if holders and data.draw(st.integers(0, 5)) else list(MEMBERS)))
        held = sorted(o for o, r in self.recs.items() if r.state == ACQUIRED and r.member == member
                      and r.pending is None and r.lock_ends > self.now)
        kinds_st = st.lists(st.sampled_from([GAP, ACCEPT, RELEASE, REJECT, RENEW]), min_size=1, max_size=6)
        request = []
        if held and data.draw(st.integers(0, 5)) > 0:
            # Disjoint batches, each inside a run of records the member holds.
            starts = sorted(data.draw(st.lists(st.sampled_from(held), min_size=1, max_size=3, unique=True)))
            for i, lo in enumerate(starts):
                stop = starts[i + 1] if i + 1 < len(starts) else lo + 7
                hi = lo
                while hi + 1 < stop and hi + 1 in held and data.draw(st.integers(0, 3)) > 0:
                    hi += 1
                request.append((lo, hi))
        else:
            for _ in range(data.draw(st.sampled_from([1, 1, 1, 2, 3]))):
                lo = self.start + data.draw(st.integers(-2, 30))
                request.append((lo, lo + data.draw(st.integers(0, 5))))
        typed = []
        for lo, hi in request:
            length = hi - lo + 1
            kinds = data.draw(kinds_st)
            types = [kinds[i % len(kinds)] for i in range(length)] if data.draw(st.booleans()) else [kinds[0]]
            typed.append((lo, hi, types))
        request = typed
        # Kafka's rules: batches in ascending order without overlap, none reaching past the
        # last fetched offset; offsets below SPSO are already archived and skipped.
        ordered = all(b[0] > a[1] for a, b in itertools.pairwise(request)) and all(lo >= 0 for lo, _h, _t in request)
        covered = [o for lo, hi, _ in request for o in range(lo, hi + 1) if o >= self.start]
        ok = ordered and all(hi < self.end or hi < self.start for _lo, hi, _t in request) and all(
            o < self.end and self.recs[o].state == ACQUIRED and self.recs[o].member == member
            and self.recs[o].pending is None and self.recs[o].lock_ends is not None
            and self.recs[o].lock_ends > self.now for o in covered)
        try:
            update = self.sp.acknowledge(member, [(lo, hi, types) for lo, hi, types in request], self.now)
        except ApiError:
            assert not ok, "a valid acknowledgement was refused"
            return
        assert ok, "an invalid acknowledgement was applied"
        durable = False
        for lo, hi, types in request:
            for i, o in enumerate(range(lo, hi + 1)):
                if o < self.start:
                    continue
                kind = types[i] if len(types) > 1 else types[0]
                r = self.recs[o]
                if kind == RENEW:
                    r.lock_ends = self.now + LOCK_MS
                    continue
                durable = True
                if kind == ACCEPT:
                    r.pending = ACKNOWLEDGED
                elif kind == RELEASE:
                    r.pending = ARCHIVED if r.count >= LIMIT else AVAILABLE
                else:
                    r.pending = ARCHIVED
        assert update.done == (not durable)
        self.untaken = self.untaken or durable

    @rule(ms=st.sampled_from([0, 50, 300, 700, 1100, 1500]))
    def expire(self, ms: int) -> None:
        self.now += ms
        released = self.sp.expire(self.now)
        due = [o for o, r in self.recs.items() if r.state == ACQUIRED and r.pending is None and r.lock_ends <= self.now]
        for o in due:
            self._release(o)
        assert sum(b - a + 1 for a, b in released) == len(due)
        self._advance()

    @rule(member=st.sampled_from(MEMBERS))
    def member_leaves(self, member: str) -> None:
        released = self.sp.release_member(member, self.now)
        held = [o for o, r in self.recs.items() if r.state == ACQUIRED and r.pending is None and r.member == member]
        for o in held:
            self._release(o)
        assert sum(b - a + 1 for a, b in released) == len(held)
        self._advance()

    def _persisted_form(self, o: int, r: Rec) -> tuple[str, int]:
        if r.in_write and r.pending is not None:
            return r.pending, r.count
        return (AVAILABLE if r.state == ACQUIRED else r.state), r.count

    @rule()
    def take_write(self) -> None:
        write = self.sp.take_write()
        must = self.outstanding is None and (bool(self.changed) or self.untaken or self.start_moved)
        if self.outstanding is not None:
            assert write is None, "a second write while one is outstanding"
        elif must:
            assert write is not None, "changes left unwritten"
        if write is None:
            return
        for r in self.recs.values():
            if r.pending is not None:
                r.in_write = True
        carried = {o: self._persisted_form(o, self.recs[o]) for o in self.changed if o in self.recs}
        carried.update({o: self._persisted_form(o, r) for o, r in self.recs.items() if r.in_write})
        start = self.start
        while start < self.end and (self.recs[start].state in FINAL and self.recs[start].pending is None
                                    or self.recs[start].in_write and self.recs[start].pending in FINAL):
            start += 1
        # A write may also restate acquired records it has no need to carry (as Available
        # with their current count): persisting a delivery count early is harmless.
        optional = {o: self._persisted_form(o, r) for o, r in self.recs.items()
                    if r.state == ACQUIRED and o not in carried}
        self.outstanding = (write, carried, optional, start)
        self.changed = set()
        self.untaken = self.start_moved = False

    @precondition(lambda self: self.outstanding is not None)
    @rule(ok=st.booleans())
    def finish_write(self, ok: bool) -> None:
        assert self.outstanding is not None
        write, carried, optional, start = self.outstanding
        self.outstanding = None
        if ok:
            updates = self.sp.commit(write)
            assert start >= self.expected.start, "SPSO moved backwards"
            before = self.expected
            self.held = merged(self.held, write)
            self.expected = Persisted(start, dict(before.offsets))
            self.expected.offsets.update(carried)
            for o, form in optional.items():
                assert self.held.get(o) in (before.get(o), form), (o, self.held.get(o), before.get(o), form)
                if self.held.get(o) == (AVAILABLE, 0):
                    self.expected.offsets.pop(o, None)  # never delivered, as far as the coordinator knows
                else:
                    self.expected.offsets[o] = self.held.get(o)
            self.expected.drop_below_start()
            for o in range(self.expected.start, self.end):
                assert self.expected.get(o)[1] >= before.get(o)[1], "persisted delivery count decreased"
            assert self.held.start == self.expected.start, (self.held.start, self.expected.start)
            for o in sorted(set(self.held.offsets) | set(self.expected.offsets)):
                assert self.held.get(o) == self.expected.get(o), (o, self.held.get(o), self.expected.get(o))
            for o, r in self.recs.items():
                if r.in_write:
                    if r.pending == ACKNOWLEDGED:
                        self.accepted.add(o)
                    r.state, r.member, r.lock_ends = r.pending, None, None
                    r.pending, r.in_write = None, False
        else:
            updates = self.sp.rollback(write, self.now)
            for o, r in self.recs.items():
                if r.in_write:
                    r.pending, r.in_write = None, False
                    if r.lock_ends <= self.now:
                        self._release(o)
            self.changed |= {o for o in carried if o in self.recs}
            self.start_moved = True
        assert all(u.done for u in updates)
        self._advance()

    @rule(ok=st.sampled_from([True, True, True, False]))
    def write_round(self, ok: bool) -> None:
        """The shell's commit round: take a write and settle it at once."""
        if self.outstanding is None:
            self.take_write()
        if self.outstanding is not None:
            self.finish_write(ok)

    @rule()
    def restart(self) -> None:
        """The broker restarts: the partition loads what the share coordinator holds, and
        the model replays what it says is persisted."""
        held = self.held
        self.sp = SharePartition.from_persisted(
            "g", "t", 0, start_offset=held.start, state_epoch=0,
            state_batches=[(o, o, PERSISTED_ID[s], c) for o, (s, c) in sorted(held.offsets.items())],
            record_lock_duration_ms=LOCK_MS, delivery_count_limit=LIMIT, max_in_flight_records=MAX_IN_FLIGHT)
        mine = self.expected
        self.start = mine.start
        self.end = max([mine.start] + [o + 1 for o in mine.offsets])
        self.recs = {}
        for o in range(self.start, self.end):
            state, count = mine.get(o)
            self.recs[o] = Rec(state, count)
        self.changed = set()
        self.untaken = self.start_moved = False
        self.outstanding = None
        self._advance()
        self._follow_log_start()

    # -- invariants ----------------------------------------------------------------
    @invariant()
    def same_state(self) -> None:
        sp = self.sp
        assert (sp.start_offset, sp.end_offset) == (self.start, self.end)
        for o in range(self.start, self.end):
            r = self.recs[o]
            state, count, member, lock_ends = sp.record(o)
            assert (int(state), count, member, lock_ends) == (PERSISTED_ID[r.state], r.count, r.member,
                                                             r.lock_ends), o
            assert sp.is_pending(o) == (r.pending is not None), o
        locks = [r.lock_ends for r in self.recs.values() if r.state == ACQUIRED and r.pending is None]
        assert sp.next_deadline_ms() == (min(locks) if locks else None)
        nxt = self._next_fetch()
        assert sp.next_fetch_offset() == nxt
        assert sp.has_available_in_flight() == (nxt is not None and nxt < self.end)
        in_flight = sum(1 for r in self.recs.values() if r.state == ACQUIRED)
        assert in_flight <= MAX_IN_FLIGHT


SharePartitionModel.TestCase.settings = settings(
    max_examples=300, stateful_step_count=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
TestSharePartitionModel = SharePartitionModel.TestCase
