"""SharePartition against a reference model of the KIP-932 rules (offset -> record).

The model keeps one entry per in-flight offset and applies the rules offset by offset;
the machine keeps batches.  Acquisition uses the record-limit mode, so the two must
agree exactly.  Across restarts (rebuild from the last committed write) the test also
checks: an accepted record is never delivered again, persisted delivery counts never
decrease, and the SPSO never moves backwards.  The log start may move up (retention,
DeleteRecords); SPSO then follows it.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from shoal.errors import ApiError
from shoal.share.partition import SharePartition, StateWrite
from shoal.share.state import TERMINAL_STATES, AcknowledgeType, AcquireMode, RecordState

A, Q, K, X = RecordState.AVAILABLE, RecordState.ACQUIRED, RecordState.ACKNOWLEDGED, RecordState.ARCHIVED
LOCK_MS = 1_000
LIMIT = 3
MAX_IN_FLIGHT = 25
MEMBERS = ("m1", "m2", "m3")


@dataclass
class Rec:
    state: RecordState = A
    count: int = 0
    member: str | None = None
    deadline: int | None = None
    pending: RecordState | None = None
    in_write: bool = False


def _release(r: Rec) -> None:
    r.state = X if r.count >= LIMIT else A
    r.member = None
    r.deadline = None


@dataclass
class Store:
    """The persisted state as the share coordinator holds it: each write is a change
    (a new start offset or -1, and the states of the offsets it names) merged into it."""

    start_offset: int
    state_epoch: int
    offsets: dict[int, tuple[int, int]]

    def apply(self, write: StateWrite) -> None:
        if write.start_offset != -1:
            self.start_offset = write.start_offset
        for b in write.state_batches:
            for o in range(b.first_offset, b.last_offset + 1):
                self.offsets[o] = (b.delivery_state, b.delivery_count)
        self.offsets = {o: v for o, v in self.offsets.items() if o >= self.start_offset}

    def copy(self) -> Store:
        return Store(self.start_offset, self.state_epoch, dict(self.offsets))


class SharePartitionModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.sp = SharePartition("g", "t", 0, 0, record_lock_duration_ms=LOCK_MS,
                                 delivery_count_limit=LIMIT, max_in_flight_records=MAX_IN_FLIGHT)
        self.now = 0
        self.log: list[tuple[int, int]] = []
        self.log_end = 0
        self.log_start = 0
        self.start = 0
        self.end = 0
        self.recs: dict[int, Rec] = {}
        self.dirty = False
        self.untaken = False
        self.outstanding: StateWrite | None = None
        first = self.sp.snapshot()
        self.store = Store(first.start_offset, first.state_epoch, {})
        self.accepted: set[int] = set()

    # -- model helpers -------------------------------------------------------------
    def _advance(self) -> None:
        while self.start < self.end and self.recs[self.start].state in TERMINAL_STATES \
                and self.recs[self.start].pending is None:
            del self.recs[self.start]
            self.start += 1

    def _next_fetch(self) -> int | None:
        for o in range(self.start, self.end):
            r = self.recs[o]
            if r.state is A and r.pending is None:
                return o
        return self.end if self.end - self.start < MAX_IN_FLIGHT else None

    # -- rules ---------------------------------------------------------------------
    @rule(n=st.integers(1, 8))
    def produce(self, n: int) -> None:
        self.log.append((self.log_end, self.log_end + n - 1))
        self.log_end += n

    def _apply_log_start(self) -> None:
        """What the shell does before reading: SPSO moves up to the log start offset."""
        moved = self.sp.advance_start_to(self.log_start)
        assert moved == (self.log_start > self.start)
        if not moved:
            return
        for o in range(self.start, min(self.log_start, self.end)):
            del self.recs[o]
        self.start = self.log_start
        self.end = max(self.end, self.log_start)
        self.dirty = True
        self._advance()

    @rule(k=st.integers(1, 12))
    def delete_records(self, k: int) -> None:
        """Retention or DeleteRecords: the log start moves up (possibly inside a batch)."""
        self.log_start = min(self.log_end, self.log_start + k)
        self.log = [b for b in self.log if b[1] >= self.log_start]
        self._apply_log_start()

    @rule(member=st.sampled_from(MEMBERS), max_records=st.integers(1, 12))
    def acquire(self, member: str, max_records: int) -> None:
        fetch = self.sp.next_fetch_offset()
        assert fetch == self._next_fetch()
        if fetch is None:
            return
        fetched = [b for b in self.log if b[1] >= fetch]
        got = self.sp.acquire(member, fetched, self.now, max_records, acquire_mode=AcquireMode.RECORD_LIMIT)
        # model
        expected: list[tuple[int, int]] = []
        remaining = max_records
        last_allowed = self.start + MAX_IN_FLIGHT - 1
        for o in range(self.start, self.end):
            if remaining <= 0:
                break
            r = self.recs[o]
            if r.state is not A or r.pending is not None:
                continue
            if r.count >= LIMIT:
                r.state = X
                self.dirty = True
                continue
            r.state, r.count, r.member, r.deadline = Q, r.count + 1, member, self.now + LOCK_MS
            expected.append((o, r.count))
            remaining -= 1
        o = self.end
        while remaining > 0 and o < self.log_end and o <= last_allowed:
            self.recs[o] = Rec(Q, 1, member, self.now + LOCK_MS)
            expected.append((o, 1))
            remaining -= 1
            o += 1
        self.end = max(self.end, o)
        self._advance()
        flat = [(off, r.delivery_count) for r in got for off in range(r.first_offset, r.last_offset + 1)]
        assert flat == expected
        persisted = self.store.offsets
        for off, count in flat:
            assert off not in self.accepted, f"accepted offset {off} delivered again"
            assert off >= self.store.start_offset
            assert count > persisted.get(off, (0, 0))[1], "delivery count went backwards"

    @rule(member=st.sampled_from(MEMBERS), lo=st.integers(-2, 40), length=st.integers(1, 6),
          kinds=st.lists(st.sampled_from(list(AcknowledgeType)), min_size=1, max_size=6), per_offset=st.booleans())
    def acknowledge(self, member: str, lo: int, length: int, kinds: list[AcknowledgeType], per_offset: bool) -> None:
        lo = self.start + lo
        hi = lo + length - 1
        types = [kinds[i % len(kinds)] for i in range(length)] if per_offset else [kinds[0]]
        ok = lo >= 0 and lo >= self.start and hi < self.end and all(
            self.recs[o].state is Q and self.recs[o].member == member and self.recs[o].pending is None
            and self.recs[o].deadline is not None and self.recs[o].deadline > self.now
            for o in range(lo, hi + 1))
        try:
            update = self.sp.acknowledge(member, [(lo, hi, [int(t) for t in types])], self.now)
        except ApiError:
            assert not ok
            return
        assert ok
        durable = False
        for i, o in enumerate(range(lo, hi + 1)):
            kind = types[i] if per_offset else types[0]
            r = self.recs[o]
            if kind is AcknowledgeType.RENEW:
                r.deadline = self.now + LOCK_MS
            elif kind is AcknowledgeType.ACCEPT:
                r.pending = K
            elif kind is AcknowledgeType.RELEASE:
                r.pending = X if r.count >= LIMIT else A
            else:
                r.pending = X
            durable = durable or kind is not AcknowledgeType.RENEW
        assert update.done == (not durable)
        self.untaken = self.untaken or durable

    @rule(ms=st.integers(0, 1500))
    def expire(self, ms: int) -> None:
        self.now += ms
        released = self.sp.expire(self.now)
        n = 0
        for r in self.recs.values():
            if r.state is Q and r.pending is None and r.deadline <= self.now:
                _release(r)
                n += 1
        assert sum(b - a + 1 for a, b in released) == n
        self.dirty = self.dirty or n > 0
        self._advance()

    @rule(member=st.sampled_from(MEMBERS))
    def release_member(self, member: str) -> None:
        released = self.sp.release_member(member, self.now)
        n = 0
        for r in self.recs.values():
            if r.state is Q and r.pending is None and r.member == member:
                _release(r)
                n += 1
        assert sum(b - a + 1 for a, b in released) == n
        self.dirty = self.dirty or n > 0
        self._advance()

    @rule()
    def take_write(self) -> None:
        write = self.sp.take_write()
        expect = self.outstanding is None and (self.dirty or self.untaken)
        assert (write is not None) == expect
        if write is None:
            return
        self.outstanding = write
        self.dirty = self.untaken = False
        for r in self.recs.values():
            if r.pending is not None:
                r.in_write = True

    @precondition(lambda self: self.outstanding is not None)
    @rule(ok=st.booleans())
    def finish_write(self, ok: bool) -> None:
        write = self.outstanding
        assert write is not None
        self.outstanding = None
        if ok:
            old = self.store
            updates = self.sp.commit(write)
            assert write.start_offset == -1 or write.start_offset > old.start_offset, "SPSO moved backwards"
            new = old.copy()
            new.apply(write)
            old_p, new_p = old.offsets, new.offsets
            for off in range(new.start_offset, max([new.start_offset] + list(new_p)) + 1):
                assert new_p.get(off, (0, 0))[1] >= old_p.get(off, (0, 0))[1], "persisted count decreased"
            self.store = new
            for o, r in self.recs.items():
                if r.in_write:
                    if r.pending is K:
                        self.accepted.add(o)
                    r.state, r.member, r.deadline = r.pending, None, None
                    r.pending, r.in_write = None, False
        else:
            updates = self.sp.rollback(write, self.now)
            for r in self.recs.values():
                if r.in_write:
                    r.pending, r.in_write = None, False
                    if r.deadline <= self.now:
                        _release(r)
            self.dirty = True
        assert all(u.done for u in updates)
        self._advance()

    @rule()
    def restart(self) -> None:
        store = self.store
        before = self.start
        self.sp = SharePartition.from_persisted(
            "g", "t", 0, start_offset=store.start_offset, state_epoch=store.state_epoch,
            state_batches=[(o, o, s, c) for o, (s, c) in store.offsets.items()], record_lock_duration_ms=LOCK_MS,
            delivery_count_limit=LIMIT, max_in_flight_records=MAX_IN_FLIGHT)
        assert self.sp.start_offset == store.start_offset
        del before  # in-memory SPSO may be ahead of the store; the store's never goes back
        self.start = store.start_offset
        persisted = store.offsets
        self.end = max([store.start_offset] + [o + 1 for o in persisted])
        self.recs = {}
        for o in range(self.start, self.end):
            state, count = persisted.get(o, (0, 0))
            self.recs[o] = Rec(A if state == 1 else RecordState(state), count)
        self.dirty = self.untaken = False
        self.outstanding = None
        self._advance()
        self._apply_log_start()

    # -- invariants ----------------------------------------------------------------
    @invariant()
    def same_state(self) -> None:
        sp = self.sp
        assert (sp.start_offset, sp.end_offset) == (self.start, self.end)
        assert sp.start_offset <= sp.end_offset
        for o in range(self.start, self.end):
            r = self.recs[o]
            assert sp.record(o) == (r.state, r.count, r.member, r.deadline), o
            assert sp.is_pending(o) == (r.pending is not None), o
        deadlines = [r.deadline for r in self.recs.values() if r.state is Q and r.pending is None]
        assert sp.next_deadline_ms() == (min(deadlines) if deadlines else None)
        nxt = self._next_fetch()
        assert sp.next_fetch_offset() == nxt
        assert sp.has_available_in_flight() == (nxt is not None and nxt < self.end)


SharePartitionModel.TestCase.settings = settings(
    max_examples=300, stateful_step_count=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
TestSharePartitionModel = SharePartitionModel.TestCase
