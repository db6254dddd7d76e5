"""Unit tests of the dead-letter hook of SharePartition and of shoal.share.dlq (KIP-1191)."""

from __future__ import annotations

from shoal.share.dlq import (
    ArchiveCause,
    DeadLetter,
    DeadLetterIndex,
    dead_letter_headers,
    dead_letter_partition,
    source_of,
    topic_name_problem,
)
from shoal.share.partition import SharePartition
from shoal.share.state import AcknowledgeType

ACCEPT, RELEASE, REJECT, GAP = (int(t) for t in (AcknowledgeType.ACCEPT, AcknowledgeType.RELEASE,
                                                 AcknowledgeType.REJECT, AcknowledgeType.GAP))
REJ, LIM = ArchiveCause.CLIENT_REJECT, ArchiveCause.DELIVERY_COUNT_EXCEEDED
LOCK = 1000


def make(limit: int = 2) -> SharePartition:
    return SharePartition("g", "topic", 0, 0, record_lock_duration_ms=LOCK, delivery_count_limit=limit)


def acked(sp: SharePartition, ranges: list[tuple[int, int, list[int]]], now: int = 0, commit: bool = True):
    sp.acknowledge("m", ranges, now)
    w = sp.take_write()
    assert w is not None
    (sp.commit(w) if commit else sp.rollback(w, now))
    return w


def test_reject_is_dead_lettered_with_its_delivery_count() -> None:
    sp = make()
    sp.acquire("m", [(0, 4)], 0, 100)
    w = acked(sp, [(0, 0, [REJECT]), (1, 1, [ACCEPT]), (2, 2, [RELEASE]), (3, 3, [GAP]), (4, 4, [REJECT])])
    assert w.dead_letters == (DeadLetter(0, 0, 1, REJ), DeadLetter(4, 4, 1, REJ))


def test_release_at_the_limit_is_dead_lettered_once() -> None:
    sp = make(limit=2)
    sp.acquire("m", [(0, 0)], 0, 100)
    assert acked(sp, [(0, 0, [RELEASE])]).dead_letters == ()
    sp.acquire("m", [(0, 0)], 0, 100)
    w = acked(sp, [(0, 0, [RELEASE])])
    assert w.dead_letters == (DeadLetter(0, 0, 2, LIM),)
    assert sp.start_offset == 1
    assert sp.take_write() is None


def test_lock_expiry_at_the_limit_is_dead_lettered() -> None:
    sp = make(limit=1)
    sp.acquire("m", [(0, 2)], 0, 100)
    assert sp.expire(LOCK) == [(0, 2)]
    w = sp.take_write()
    assert w is not None and w.dead_letters == (DeadLetter(0, 2, 1, LIM),)
    sp.commit(w)
    assert sp.start_offset == 3


def test_available_record_past_a_lowered_limit_is_dead_lettered_at_acquire_gaps_are_not() -> None:
    sp = make(limit=3)
    sp.acquire("m", [(0, 0), (2, 2)], 0, 100)  # offset 1 is a gap
    w = acked(sp, [(0, 0, [RELEASE]), (2, 2, [RELEASE])])
    assert w.dead_letters == ()
    sp.delivery_count_limit = 1
    assert sp.acquire("m", [(0, 0), (2, 2)], 0, 100) == []
    w = sp.take_write()
    assert w is not None and w.dead_letters == (DeadLetter(0, 0, 1, LIM), DeadLetter(2, 2, 1, LIM))


def test_a_rolled_back_write_offers_its_expiries_again_but_not_its_acknowledgements() -> None:
    sp = make(limit=1)
    sp.acquire("m", [(0, 1)], 0, 100)
    sp.acknowledge("m", [(0, 0, [REJECT])], 0)
    sp.expire(LOCK + 1)  # offset 1 (not pending) expires at the limit
    w = sp.take_write()
    assert w is not None and w.dead_letters == (DeadLetter(0, 0, 1, REJ), DeadLetter(1, 1, 1, LIM))
    sp.rollback(w, LOCK + 1)  # offset 0's lock expired meanwhile: released at the limit
    w2 = sp.take_write()
    assert w2 is not None
    assert sorted(w2.dead_letters) == [DeadLetter(0, 0, 1, LIM), DeadLetter(1, 1, 1, LIM)]


def test_headers_partition_and_names() -> None:
    h = dead_letter_headers("t", 3, 42, "g", 5, LIM)
    assert dict(h) == {"__dlq.errors.topic": b"t", "__dlq.errors.partition": b"3", "__dlq.errors.offset": b"42",
                       "__dlq.errors.group": b"g", "__dlq.errors.delivery.count": b"5",
                       "__dlq.errors.message": b"Offset delivery count exceeded the threshold."}
    assert source_of(h) == ("g", "t", 3, 42)
    assert source_of([("__dlq.errors.offset", b"x")]) is None
    assert dead_letter_partition(7, 3) == 1
    assert topic_name_problem("dlq.t", "dlq.") is None
    assert topic_name_problem("t", "dlq.") is not None
    assert topic_name_problem("__t", "") is not None
    assert topic_name_problem("t", "") is None


def test_index_adds_and_prunes() -> None:
    idx = DeadLetterIndex()
    idx.add("g", "t", 0, 5)
    idx.add("g", "t", 0, 9)
    assert idx.contains("g", "t", 0, 5) and not idx.contains("g", "t", 1, 5)
    idx.prune("g", "t", 0, 6)
    assert not idx.contains("g", "t", 0, 5) and idx.contains("g", "t", 0, 9)
