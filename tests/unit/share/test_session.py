"""ShareSessionCache: epochs, partitions, slot limit, connections, rotation."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from kio.schema.errors import ErrorCode
from kio.schema.share_acknowledge.v2.request import ShareAcknowledgeRequest
from kio.schema.share_fetch.v2.request import FetchPartition, FetchTopic, ForgottenTopic, ShareFetchRequest
from kio.static.primitive import i32

from shoal.config import BrokerConfig
from shoal.share.session import (
    FINAL_EPOCH,
    ShareSessionCache,
    next_epoch,
    rotate,
)

T1 = str(uuid.UUID(int=1))
T2 = str(uuid.UUID(int=2))
A, B, C = (T1, 0), (T1, 1), (T2, 0)


def test_next_epoch_and_rotate_helpers():
    assert next_epoch(0) == 1 and next_epoch(41) == 42
    assert next_epoch(2**31 - 1) == 1
    assert next_epoch(-1) == FINAL_EPOCH
    assert rotate([1, 2, 3], 1) == [2, 3, 1]
    assert rotate([1, 2, 3], 4) == [2, 3, 1]
    assert rotate([], 3) == []


def test_open_then_incremental_add_and_forget():
    c = ShareSessionCache()
    o = c.share_fetch("g", "m", 0, add=[A, B], connection_id="c1")
    assert o.ok and o.next_epoch == 1 and set(o.partitions) == {A, B} and o.added == (A, B)
    o = c.share_fetch("g", "m", 1, add=[C, A], forget=[B], connection_id="c1")
    assert o.ok and o.next_epoch == 2 and o.added == (C,) and o.forgotten == (B,)
    assert set(o.partitions) == {A, C}
    o = c.share_fetch("g", "m", 2)  # no changes: fetch all session partitions
    assert o.ok and set(o.partitions) == {A, C} and o.added == () and o.forgotten == ()
    assert c.get("g", "m").epoch == 3


def test_forgetting_unknown_partition_is_ignored():
    c = ShareSessionCache()
    c.share_fetch("g", "m", 0, add=[A])
    o = c.share_fetch("g", "m", 1, forget=[C])
    assert o.ok and o.forgotten == () and o.partitions == (A,)


def test_wrong_epoch_and_unknown_session():
    c = ShareSessionCache()
    assert c.share_fetch("g", "m", 1).error_code == ErrorCode.share_session_not_found
    assert c.share_fetch("g", "m", -1).error_code == ErrorCode.share_session_not_found
    c.share_fetch("g", "m", 0, add=[A])
    o = c.share_fetch("g", "m", 2, add=[B])
    assert o.error_code == ErrorCode.invalid_share_session_epoch and not o.ok
    assert c.get("g", "m").epoch == 1 and list(c.get("g", "m").partitions) == [A]  # unchanged
    assert c.share_fetch("g", "m", 1).ok


def test_close_with_final_epoch():
    c = ShareSessionCache()
    c.share_fetch("g", "m", 0, add=[A], connection_id="c1")
    o = c.share_fetch("g", "m", -1, add=[B])
    assert o.ok and o.closed and o.partitions == () and o.next_epoch == FINAL_EPOCH
    assert c.get("g", "m") is None and len(c) == 0
    assert c.sessions_of("c1") == []


def test_epoch_zero_replaces_existing_session():
    c = ShareSessionCache(max_slots=1)
    c.share_fetch("g", "m", 0, add=[A, B], connection_id="c1")
    c.share_fetch("g", "m", 1)
    o = c.share_fetch("g", "m", 0, add=[C], forget=[A], connection_id="c2")
    assert o.ok and o.replaced == (A, B) and o.partitions == (C,) and o.next_epoch == 1
    assert len(c) == 1  # replacing never hits the limit
    assert c.sessions_of("c1") == [] and c.sessions_of("c2") == [("g", "m")]


def test_slot_limit():
    c = ShareSessionCache(max_slots=2)
    assert c.share_fetch("g", "m1", 0).ok
    assert c.share_fetch("g", "m2", 0).ok
    o = c.share_fetch("g", "m3", 0, add=[A])
    assert o.error_code == ErrorCode.share_session_limit_reached
    assert c.get("g", "m3") is None and len(c) == 2
    c.share_fetch("g", "m1", -1)
    assert c.share_fetch("g", "m3", 0).ok


def test_zero_slots_refuses_everything():
    c = ShareSessionCache(max_slots=0)
    assert c.share_fetch("g", "m", 0).error_code == ErrorCode.share_session_limit_reached


def test_from_config():
    # Kafka's key, and the name earlier shoal versions used for it.
    assert ShareSessionCache.from_config(BrokerConfig({"group.share.max.share.sessions": "4"})).max_slots == 4
    assert ShareSessionCache.from_config(BrokerConfig({"max.share.session.cache.slots": "3"})).max_slots == 3
    assert ShareSessionCache.from_config(BrokerConfig()).max_slots == 2000  # Kafka's default
    with pytest.raises(ValueError):
        ShareSessionCache(-1)


def test_share_acknowledge_epochs():
    c = ShareSessionCache()
    assert c.share_acknowledge("g", "m", 1).error_code == ErrorCode.share_session_not_found
    c.share_fetch("g", "m", 0, add=[A])
    assert c.share_acknowledge("g", "m", 0).error_code == ErrorCode.invalid_share_session_epoch
    assert c.share_acknowledge("g", "m", 5).error_code == ErrorCode.invalid_share_session_epoch
    o = c.share_acknowledge("g", "m", 1)
    assert o.ok and o.next_epoch == 2 and o.partitions == (A,)
    assert c.share_fetch("g", "m", 2).ok
    o = c.share_acknowledge("g", "m", -1)
    assert o.ok and o.closed and c.get("g", "m") is None


def test_disconnect_closes_sessions_of_that_connection_only():
    c = ShareSessionCache()
    c.share_fetch("g", "m1", 0, add=[A], connection_id="c1")
    c.share_fetch("g", "m2", 0, add=[A], connection_id="c1")
    c.share_fetch("h", "m3", 0, add=[A], connection_id="c2")
    assert c.sessions_of("c1") == [("g", "m1"), ("g", "m2")]
    assert c.disconnect("c1") == [("g", "m1"), ("g", "m2")]
    assert c.get("g", "m1") is None and c.get("g", "m2") is None and c.get("h", "m3") is not None
    assert c.disconnect("c1") == []
    assert c.disconnect("unknown") == []


def test_session_follows_the_connection_it_was_last_used_on():
    c = ShareSessionCache()
    c.share_fetch("g", "m", 0, add=[A], connection_id="c1")
    c.share_fetch("g", "m", 1, connection_id="c2")
    assert c.disconnect("c1") == []
    assert c.get("g", "m") is not None
    assert c.disconnect("c2") == [("g", "m")]


def test_remove_member():
    c = ShareSessionCache()
    c.share_fetch("g", "m", 0, add=[A, B], connection_id="c1")
    s = c.remove_member("g", "m")
    assert s is not None and list(s.partitions) == [A, B]
    assert c.get("g", "m") is None and c.sessions_of("c1") == []
    assert c.remove_member("g", "m") is None
    assert c.disconnect("c1") == []


def test_rotation_starts_each_fetch_one_further():
    c = ShareSessionCache()
    first = c.share_fetch("g", "m", 0, add=[A, B, C]).partitions
    second = c.share_fetch("g", "m", 1).partitions
    third = c.share_fetch("g", "m", 2).partitions
    assert first == (A, B, C) and second == (B, C, A) and third == (C, A, B)
    assert c.rotate("g", "m") == [A, B, C]
    assert c.rotate("g", "nobody") == []
    # every partition comes first equally often
    heads = [c.rotate("g", "m")[0] for _ in range(30)]
    assert heads.count(A) == heads.count(B) == heads.count(C) == 10


def _fetch(epoch, topics=(), forgotten=(), member="m"):
    return ShareFetchRequest(
        group_id="g", member_id=member, share_session_epoch=i32(epoch), max_wait=timedelta(milliseconds=500),
        min_bytes=i32(1), max_records=i32(500), batch_size=i32(500),
        topics=tuple(FetchTopic(topic_id=uuid.UUID(t), partitions=tuple(
            FetchPartition(partition_index=i32(p), acknowledgement_batches=()) for p in ps)) for t, ps in topics),
        forgotten_topics_data=tuple(ForgottenTopic(topic_id=uuid.UUID(t), partitions=tuple(i32(p) for p in ps))
                                    for t, ps in forgotten),
    )


def test_handle_share_fetch_and_acknowledge_from_kio_entities():
    c = ShareSessionCache()
    o = c.handle_share_fetch(_fetch(0, topics=[(T1, [0, 1]), (T2, [0])]), connection_id=7)
    assert o.ok and set(o.partitions) == {A, B, C}
    o = c.handle_share_fetch(_fetch(1, forgotten=[(T1, [1])]), connection_id=7)
    assert o.ok and o.forgotten == (B,)
    ack = ShareAcknowledgeRequest(group_id="g", member_id="m", share_session_epoch=i32(2), topics=())
    assert c.handle_share_acknowledge(ack, connection_id=7).ok
    assert c.handle_share_fetch(_fetch(2)).error_code == ErrorCode.invalid_share_session_epoch
    assert c.disconnect(7) == [("g", "m")]
