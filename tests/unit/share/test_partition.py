"""Unit tests of SharePartition: one rule or error path each."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from kio.schema.errors import ErrorCode

from shoal.errors import ApiError
from shoal.share import partition as partition_module
from shoal.share.partition import AcquiredRecords, SharePartition, StateBatch, UpdateStatus
from shoal.share.state import TRANSITIONS, AcknowledgeType, AcquireMode, RecordState, can_transition

A, Q, K, X = RecordState.AVAILABLE, RecordState.ACQUIRED, RecordState.ACKNOWLEDGED, RecordState.ARCHIVED
ACCEPT, RELEASE, REJECT, GAP, RENEW = (int(t) for t in (AcknowledgeType.ACCEPT, AcknowledgeType.RELEASE,
                                                         AcknowledgeType.REJECT, AcknowledgeType.GAP,
                                                         AcknowledgeType.RENEW))
LOCK = 1000


def make(start: int = 0, **kw: int) -> SharePartition:
    kw.setdefault("record_lock_duration_ms", LOCK)
    return SharePartition("g", "topic", 0, start, **kw)


def ack(sp: SharePartition, member: str, first: int, last: int, *types: int, now: int = 0, ok: bool = True):
    update = sp.acknowledge(member, [(first, last, list(types))], now)
    write = sp.take_write()
    if write is not None:
        (sp.commit(write) if ok else sp.rollback(write, now))
    return update, write


# -- states -------------------------------------------------------------------------
def test_record_state_ids_and_table() -> None:
    assert [int(s) for s in (A, Q, K, X)] == [0, 1, 2, 4]
    assert can_transition(A, Q) and can_transition(Q, A) and can_transition(Q, K) and can_transition(Q, X)
    assert TRANSITIONS[K] == frozenset() and TRANSITIONS[X] == frozenset()
    assert not can_transition(A, K)


def test_module_is_pure() -> None:
    banned = {"asyncio", "socket", "threading", "time", "selectors"}
    for mod in ("state.py", "inflight.py", "partition.py"):
        tree = ast.parse((Path(partition_module.__file__).parent / mod).read_text())
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            assert not {n.split(".")[0] for n in names} & banned, (mod, names)


# -- acquire ------------------------------------------------------------------------
def test_acquire_whole_batches_and_lock() -> None:
    sp = make(100)
    got = sp.acquire("m", [(100, 104), (105, 109)], 0, 3)
    assert got == [AcquiredRecords(100, 104, 1)]  # soft limit: one whole batch
    assert sp.record(102) == (Q, 1, "m", LOCK)
    assert sp.end_offset == 105 and sp.next_fetch_offset() == 105
    assert sp.next_deadline_ms() == LOCK
    assert sp.acquire("m", [(100, 104), (105, 109)], 0, 10) == [AcquiredRecords(105, 109, 1)]


def test_acquire_record_limit_splits_batch() -> None:
    sp = make()
    got = sp.acquire("m", [(0, 9)], 0, 3, acquire_mode=AcquireMode.RECORD_LIMIT)
    assert got == [AcquiredRecords(0, 2, 1)]
    assert sp.acquire("n", [(0, 9)], 0, 100, acquire_mode=1) == [AcquiredRecords(3, 9, 1)]


def test_acquire_batch_size_combines_log_batches() -> None:
    sp = make()
    got = sp.acquire("m", [(0, 1), (2, 3), (4, 5)], 0, 100, batch_size=4)
    # BatchSize is the preferred size of acquired batches: one entry per in-flight batch.
    assert got == [AcquiredRecords(0, 3, 1), AcquiredRecords(4, 5, 1)]
    assert len(sp._batches) == 2


def test_acquire_clips_below_spso_and_archives_gaps() -> None:
    sp = make(5)
    got = sp.acquire("m", [(0, 6), (9, 10)], 0, 100)
    assert got == [AcquiredRecords(5, 6, 1), AcquiredRecords(9, 10, 1)]
    assert sp.record(7)[0] is X and sp.record(8)[0] is X
    assert sp.needs_write


def test_acquire_respects_in_flight_limit() -> None:
    sp = make(max_in_flight_records=4)
    assert sp.acquire("m", [(0, 9)], 0, 100) == [AcquiredRecords(0, 3, 1)]
    assert sp.next_fetch_offset() is None
    assert sp.acquire("m", [(0, 9)], 0, 100) == []
    ack(sp, "m", 0, 1, ACCEPT)
    assert sp.next_fetch_offset() == 4
    assert sp.acquire("m", [(0, 9)], 0, 100) == [AcquiredRecords(4, 5, 1)]


def test_acquire_nothing() -> None:
    sp = make()
    assert sp.acquire("m", [], 0, 10) == []
    assert sp.acquire("m", [(0, 3)], 0, 0) == []
    assert sp.next_fetch_offset() == 0 and not sp.has_available_in_flight()


def test_redelivery_increments_count_and_released_records_come_first() -> None:
    sp = make()
    sp.acquire("m", [(0, 4)], 0, 10)
    ack(sp, "m", 1, 2, RELEASE)
    assert sp.has_available_in_flight() and sp.next_fetch_offset() == 1
    got = sp.acquire("n", [(0, 4), (5, 6)], 0, 10)
    assert got == [AcquiredRecords(1, 2, 2), AcquiredRecords(5, 6, 1)]


def test_acquire_archives_record_at_delivery_limit() -> None:
    sp = SharePartition.from_persisted("g", "t", 0, start_offset=0, state_epoch=1,
                                       state_batches=[(0, 1, 0, 2), (2, 2, 0, 1)], delivery_count_limit=2)
    got = sp.acquire("m", [(0, 5)], 0, 10)
    assert got == [AcquiredRecords(2, 2, 2), AcquiredRecords(3, 5, 1)]
    assert sp.start_offset == 2 and sp.needs_write


# -- acknowledge --------------------------------------------------------------------
def test_accept_is_pending_until_commit() -> None:
    sp = make()
    sp.acquire("m", [(0, 4)], 0, 10)
    update = sp.acknowledge("m", [(0, 4, [ACCEPT])], 10)
    assert update.status is UpdateStatus.PENDING
    assert sp.record(0)[0] is Q and sp.is_pending(0) and sp.start_offset == 0
    assert sp.next_deadline_ms() is None  # pending records do not expire by themselves
    assert sp.expire(10 * LOCK) == []
    write = sp.take_write()
    assert write is not None and write.updates == (update,)
    assert write.start_offset == 5 and write.state_batches == ()
    assert sp.take_write() is None  # one write at a time
    assert sp.commit(write) == (update,) and update.status is UpdateStatus.COMMITTED
    assert sp.start_offset == 5 and sp.end_offset == 5


def test_rollback_restores_acquired_or_releases_expired() -> None:
    sp = make()
    sp.acquire("m", [(0, 4)], 0, 10)
    update, write = ack(sp, "m", 0, 1, ACCEPT, now=10, ok=False)
    assert update.status is UpdateStatus.ROLLED_BACK
    assert sp.record(0) == (Q, 1, "m", LOCK) and not sp.is_pending(0)
    assert sp.needs_write  # rolled back: the shell writes a fresh snapshot
    sp.commit(sp.take_write())
    sp.acknowledge("m", [(2, 3, [ACCEPT])], 10)
    w = sp.take_write()
    sp.rollback(w, LOCK)  # lock expired meanwhile
    assert sp.record(2) == (A, 1, None, None) and sp.record(0)[0] is Q


def test_per_offset_types_and_gap() -> None:
    sp = make()
    sp.acquire("m", [(0, 4)], 0, 10)
    ack(sp, "m", 0, 4, ACCEPT, GAP, RELEASE, REJECT, ACCEPT)
    assert [sp.record(o)[0] for o in range(2, 5)] == [A, X, K]
    assert sp.start_offset == 2
    w = sp.snapshot()
    assert w.state_batches == (StateBatch(2, 2, 0, 1), StateBatch(3, 3, 4, 1), StateBatch(4, 4, 2, 1))


def test_release_at_limit_archives() -> None:
    sp = make(delivery_count_limit=1)
    sp.acquire("m", [(0, 1)], 0, 10)
    ack(sp, "m", 0, 0, RELEASE)
    assert sp.start_offset == 1


def test_renew_extends_lock_without_write() -> None:
    sp = make()
    sp.acquire("m", [(0, 1)], 0, 10)
    update = sp.acknowledge("m", [(0, 1, [RENEW])], 500)
    assert update.done and not sp.needs_write
    assert sp.record(0) == (Q, 1, "m", 500 + LOCK)
    assert sp.expire(LOCK) == [] and sp.next_deadline_ms() == 500 + LOCK


@pytest.mark.parametrize(
    "member,batches,now,code",
    [
        ("other", [(0, 1, [ACCEPT])], 0, ErrorCode.invalid_record_state),
        ("m", [(0, 5, [ACCEPT])], 0, ErrorCode.invalid_request),  # 5 was never fetched
        ("m", [(5, 6, [ACCEPT])], 0, ErrorCode.invalid_request),
        ("m", [(3, 4, [ACCEPT]), (0, 1, [ACCEPT])], 0, ErrorCode.invalid_request),  # descending
        ("m", [(0, 3, [ACCEPT]), (2, 4, [ACCEPT])], 0, ErrorCode.invalid_request),  # overlapping
        ("m", [(0, 1, [ACCEPT])], LOCK, ErrorCode.invalid_record_state),  # lock lapsed
        ("m", [(1, 0, [ACCEPT])], 0, ErrorCode.invalid_request),
        ("m", [(0, 2, [ACCEPT, ACCEPT])], 0, ErrorCode.invalid_request),
        ("m", [(0, 1, [])], 0, ErrorCode.invalid_request),
        ("m", [(0, 1, [9])], 0, ErrorCode.invalid_request),
        # Kafka lets a batch start at the previous one's last offset through its request
        # checks; that offset is then acknowledged twice: INVALID_RECORD_STATE.
        ("m", [(0, 2, [ACCEPT]), (2, 3, [ACCEPT])], 0, ErrorCode.invalid_record_state),
    ],
)
def test_acknowledge_errors_change_nothing(member, batches, now, code) -> None:
    sp = make()
    sp.acquire("m", [(0, 4)], 0, 10)
    before = sp.describe()
    with pytest.raises(ApiError) as e:
        sp.acknowledge(member, batches, now)
    assert e.value.error_code is code
    assert sp.describe() == before and not sp.needs_write


def test_acknowledge_is_atomic_across_batches() -> None:
    sp = make()
    sp.acquire("m", [(0, 2)], 0, 10)
    sp.acquire("n", [(3, 4)], 0, 10)
    with pytest.raises(ApiError):
        sp.acknowledge("m", [(0, 2, [ACCEPT]), (3, 3, [ACCEPT])], 0)
    assert not sp.is_pending(0)


def test_pending_record_cannot_be_acknowledged_twice() -> None:
    sp = make()
    sp.acquire("m", [(0, 2)], 0, 10)
    sp.acknowledge("m", [(0, 0, [ACCEPT])], 0)
    with pytest.raises(ApiError):
        sp.acknowledge("m", [(0, 0, [REJECT])], 0)


# -- expiry and member release ------------------------------------------------------
def test_expire_releases_and_archives_at_limit() -> None:
    sp = make(delivery_count_limit=2)
    sp.acquire("m", [(0, 3)], 0, 10)
    assert sp.expire(LOCK - 1) == []
    assert sp.expire(LOCK) == [(0, 3)]
    assert sp.record(0) == (A, 1, None, None) and sp.needs_write
    sp.acquire("m", [(0, 3)], LOCK, 10)
    assert sp.expire(2 * LOCK) == [(0, 3)]
    assert sp.start_offset == 4  # archived at the limit, SPSO passes them


def test_release_member_only_touches_that_member() -> None:
    sp = make()
    sp.acquire("a", [(0, 1)], 0, 10)
    sp.acquire("b", [(2, 3)], 0, 10)
    assert sp.release_member("a", 5) == [(0, 1)]
    assert sp.record(0)[0] is A and sp.record(2)[0] is Q
    assert sp.release_member("nobody", 5) == []


# -- durability ---------------------------------------------------------------------
def test_snapshot_persists_acquired_as_available_with_count() -> None:
    sp = make(10)
    sp.acquire("m", [(10, 14)], 0, 10)
    ack(sp, "m", 12, 12, ACCEPT)
    w = sp.snapshot()
    assert w.start_offset == 10
    assert w.state_batches == (StateBatch(10, 11, 0, 1), StateBatch(12, 12, 2, 1), StateBatch(13, 14, 0, 1))


def test_commit_or_rollback_of_a_stale_write_is_refused() -> None:
    sp = make()
    sp.acquire("m", [(0, 1)], 0, 10)
    sp.acknowledge("m", [(0, 0, [ACCEPT])], 0)
    w = sp.take_write()
    sp.commit(w)
    with pytest.raises(ValueError):
        sp.commit(w)
    with pytest.raises(ValueError):
        sp.rollback(w, 0)


def test_acknowledgements_made_during_a_write_go_in_the_next_one() -> None:
    sp = make()
    sp.acquire("m", [(0, 3)], 0, 10)
    u1 = sp.acknowledge("m", [(0, 1, [ACCEPT])], 0)
    w1 = sp.take_write()
    u2 = sp.acknowledge("m", [(2, 3, [ACCEPT])], 0)
    assert w1.start_offset == 2 and sp.take_write() is None
    sp.commit(w1)
    w2 = sp.take_write()
    assert w2.updates == (u2,) and w2.start_offset == 4 and u1.done and not u2.done
    sp.commit(w2)
    assert sp.start_offset == 4


def test_restart_from_persisted_state() -> None:
    sp = make(100)
    sp.acquire("m", [(100, 109)], 0, 100)
    ack(sp, "m", 103, 103, ACCEPT)
    ack(sp, "m", 105, 105, RELEASE)
    w = sp.snapshot()
    again = SharePartition.from_persisted("g", "topic", 0, start_offset=w.start_offset, state_epoch=3,
                                          state_batches=w.state_batches, record_lock_duration_ms=LOCK)
    assert again.start_offset == 100 and again.end_offset == 110 and again.state_epoch == 3
    got = again.acquire("n", [(100, 109), (110, 111)], 0, 100)
    assert got == [AcquiredRecords(100, 102, 2), AcquiredRecords(104, 109, 2), AcquiredRecords(110, 111, 1)]


def test_restart_fills_unmentioned_offsets_and_reads_acquired_as_available() -> None:
    sp = SharePartition.from_persisted("g", "t", 0, start_offset=5, state_epoch=0,
                                       state_batches=[(0, 6, 2, 1), (9, 9, 1, 2)])
    assert sp.start_offset == 7 and sp.end_offset == 10
    assert sp.record(8) == (A, 0, None, None) and sp.record(9) == (A, 2, None, None)


def test_constructor_rejects_bad_config() -> None:
    with pytest.raises(ValueError):
        make(-1)
    with pytest.raises(ValueError):
        make(delivery_count_limit=0)


# -- log start moves (retention, DeleteRecords) --------------------------------------
def test_log_start_below_or_at_spso_changes_nothing() -> None:
    sp = make(10)
    sp.acquire("m", [(10, 14)], 0, 10)
    assert not sp.advance_start_to(10) and not sp.advance_start_to(3)
    assert (sp.start_offset, sp.end_offset) == (10, 15) and not sp.needs_write


def test_log_start_inside_in_flight_drops_state_below_and_persists_new_spso() -> None:
    sp = make(0)
    sp.acquire("m", [(0, 4), (5, 9)], 0, 10)
    ack(sp, "m", 7, 7, RELEASE)
    assert sp.advance_start_to(6)
    assert (sp.start_offset, sp.end_offset) == (6, 10)
    assert sp.describe() == [(6, 6, Q, 1), (7, 7, A, 1), (8, 9, Q, 1)]
    assert sp.record(3) == (K, 0, None, None)  # below SPSO: done
    # What is gone is already archived: the holder's acknowledgement of it succeeds, changing nothing.
    assert sp.acknowledge("m", [(4, 5, [ACCEPT])], 0).status is UpdateStatus.COMMITTED
    assert sp.describe() == [(6, 6, Q, 1), (7, 7, A, 1), (8, 9, Q, 1)]
    write = sp.take_write()
    assert write is not None and write.start_offset == 6
    assert write.state_batches == ()  # the release of 7 was written before: only the SPSO moved
    sp.commit(write)
    assert sp.next_fetch_offset() == 7


def test_log_start_past_speo_empties_the_partition() -> None:
    sp = make(0)
    sp.acquire("m", [(0, 4)], 0, 10)
    assert sp.advance_start_to(20)
    assert (sp.start_offset, sp.end_offset) == (20, 20) and sp.describe() == []
    assert sp.next_fetch_offset() == 20 and sp.next_deadline_ms() is None
    assert sp.release_member("m", 0) == []
    write = sp.take_write()
    assert write is not None and (write.start_offset, write.state_batches) == (20, ())


def test_log_start_then_spso_moves_on_over_terminal_records() -> None:
    sp = make(0)
    sp.acquire("m", [(0, 9)], 0, 10)
    ack(sp, "m", 5, 7, ACCEPT)
    assert sp.advance_start_to(4)
    assert (sp.start_offset, sp.end_offset) == (4, 10)
    ack(sp, "m", 4, 4, REJECT)
    assert sp.start_offset == 8


def test_acknowledgements_below_the_start_offset_are_skipped_as_a_success() -> None:
    # Kafka: offsets below SPSO are already archived; a batch wholly below it succeeds and
    # changes nothing, one straddling it acknowledges from SPSO on.
    sp = make(0)
    sp.acquire("m", [(0, 9)], 0, 10)
    assert sp.advance_start_to(4)
    update = sp.acknowledge("m", [(0, 3, [ACCEPT])], 0)
    assert update.status is UpdateStatus.COMMITTED
    write = sp.take_write()
    assert write is not None and (write.start_offset, write.state_batches) == (4, ())  # the SPSO move only
    sp.commit(write)
    ack(sp, "m", 2, 5, ACCEPT)
    assert sp.start_offset == 6 and sp.record(6)[:3] == (RecordState.ACQUIRED, 1, "m")


def test_log_start_over_a_pending_acknowledgement() -> None:
    sp = make(0)
    sp.acquire("m", [(0, 9)], 0, 10)
    update = sp.acknowledge("m", [(0, 5, [ACCEPT])], 0)
    write = sp.take_write()
    assert write is not None
    assert sp.advance_start_to(3)
    assert sp.is_pending(3) and sp.start_offset == 3
    assert sp.commit(write) == (update,) and update.status is UpdateStatus.COMMITTED
    assert sp.start_offset == 6
    nxt = sp.take_write()  # the SPSO the acknowledgement's write carried stands: -1, unchanged
    assert nxt is not None and (nxt.start_offset, nxt.spso, nxt.state_batches) == (-1, 6, ())
    assert sp.acquire("n", [(0, 9)], 0, 10) == []  # 6-9 are still m's
