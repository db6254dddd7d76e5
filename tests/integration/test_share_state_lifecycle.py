"""Share-partition state exists only where the group coordinator initialized it.

KIP-932 (the share coordinator): "If the share coordinator has no share-partition state
to return, it returns UNKNOWN_TOPIC_OR_PARTITION ... this share-partition is not
actually part of the share group". So a share-partition leader never creates state of
its own: a ShareFetch or ShareAcknowledge for a partition the group has not initialized
acquires nothing and creates nothing, and a group deleted and created again starts
where its config says, inheriting nothing. Driven with raw requests (shoal's client)
against a real broker.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from shoal.client.connection import Connection, KafkaProtocolError
from shoal.client.share import ShareMembership, ShareSession, topic_metadata
from tests.integration.test_share_consumer import produce, set_group_configs
from tests.support.broker import BrokerProcess
from tests.support.clients import create_topic

pytestmark = pytest.mark.integration

ACCEPT, RELEASE = 1, 2


def _topic_id(conn: Connection, topic: str) -> uuid.UUID:
    return topic_metadata(conn, [topic])[topic].topic_id


def _delete_group(conn: Connection, group: str) -> None:
    r = conn.call(42, 2, groups_names=(group,))
    assert [x.error_code for x in r.results] == [ErrorCode.none], r


def _delete_offsets(conn: Connection, group: str, topic: str) -> Any:
    from shoal.protocol.entities import make, sub

    req_type = conn.request_type(92, 0)
    return conn.send(make(req_type, group_id=group, topics=(
        make(sub(req_type, "DeleteShareGroupOffsetsRequestTopic"), topic_name=topic),)))


def _start_offsets(conn: Connection, group: str) -> list[int]:
    from shoal.protocol.entities import make, sub

    req_type = conn.request_type(90, 1)
    g = conn.send(make(req_type, groups=(make(sub(req_type, "DescribeShareGroupOffsetsRequestGroup"),
                                              group_id=group, topics=None),))).groups[0]
    return [int(p.start_offset) for t in g.topics for p in t.partitions]


def _fetch_all(session: ShareSession, key: tuple[uuid.UUID, int], n: int) -> list[tuple[int, int]]:
    """(offset, delivery count) of what ``session`` acquires of ``key``, until ``n`` or a dry fetch."""
    got: list[tuple[int, int]] = []
    for _ in range(10):
        r = session.fetch([key], max_wait_ms=300)
        assert r.errors == {}, r.errors
        got += [(rec.record.offset, rec.delivery_count) for rec in r.records]
        if len(got) >= n or not r.records:
            break
    return sorted(got)


def test_fetching_an_unassigned_partition_creates_no_state_for_a_group_created_again(
        broker: BrokerProcess, topic_name: str) -> None:
    """A member fetches a partition of a topic its group does not subscribe to, accepts part
    of it and releases the rest; the group is deleted and created again with
    share.auto.offset.reset=earliest. The new group starts at offset 0, every record
    delivered once."""
    bs = broker.bootstrap
    subscribed, other = f"{topic_name}-a", f"{topic_name}-b"
    create_topic(bs, subscribed)
    create_topic(bs, other)
    produce(bs, other, 10)
    group = "g-stray"
    set_group_configs(bs, group, share_auto_offset_reset="earliest")
    with Connection.to(bs) as conn:
        other_key = (_topic_id(conn, other), 0)
        m = ShareMembership(group, topics=(subscribed,))
        m.heartbeat(conn)
        s = ShareSession(conn, group, m.member_id)
        r = s.fetch([other_key], max_wait_ms=300)
        # Not part of the group: nothing acquired, and the partition says why.
        assert r.records == [] and r.errors == {other_key: ErrorCode.unknown_topic_or_partition}
        # Acknowledging there creates nothing either.
        assert s.acknowledge({other_key: [(0, 4, ACCEPT), (5, 9, RELEASE)]}) == {
            other_key: ErrorCode.unknown_topic_or_partition}
        s.close()
        m.leave(conn)
        _delete_group(conn, group)

        set_group_configs(bs, group, share_auto_offset_reset="earliest")
        m2 = ShareMembership(group, topics=(other,))
        m2.heartbeat(conn)
        assert m2.assignment == {other_key[0]: (0,)}
        s2 = ShareSession(conn, group, m2.member_id)
        assert _fetch_all(s2, other_key, 10) == [(o, 1) for o in range(10)]
        s2.close()
        m2.leave(conn)


def test_a_late_acknowledgement_after_the_offsets_were_deleted_creates_no_state(
        broker: BrokerProcess, topic_name: str) -> None:
    """A member leaves while holding records; DeleteShareGroupOffsets deletes the state; the
    member's final acknowledgement (accepting 0-4) arrives after it. The group is deleted and
    created again with share.auto.offset.reset=latest: nothing produced before is
    delivered, and the next record is."""
    bs = broker.bootstrap
    create_topic(bs, topic_name)
    produce(bs, topic_name, 10)
    group = "g-late"
    set_group_configs(bs, group, share_auto_offset_reset="earliest")
    with Connection.to(bs) as conn, Connection.to(bs) as admin:
        key = (_topic_id(conn, topic_name), 0)
        m = ShareMembership(group, topics=(topic_name,))
        m.heartbeat(conn)
        s = ShareSession(conn, group, m.member_id)
        assert _fetch_all(s, key, 10) == [(o, 1) for o in range(10)]
        m.leave(admin)  # the heartbeat goes one way, the session stays open on its connection
        r = _delete_offsets(admin, group, topic_name)
        assert r.error_code == ErrorCode.none and [t.error_code for t in r.responses] == [ErrorCode.none], r
        assert _start_offsets(admin, group) == []
        # The late acknowledgement finds no state and creates none.
        try:
            failed = s.acknowledge({key: [(0, 4, ACCEPT)]})
        except KafkaProtocolError as e:
            failed = {key: e.code}
        assert failed and failed != {key: ErrorCode.none}
        assert _start_offsets(admin, group) == []
        s.close()
        _delete_group(admin, group)

        set_group_configs(bs, group, share_auto_offset_reset="latest")
        m2 = ShareMembership(group, topics=(topic_name,))
        m2.heartbeat(admin)
        assert _start_offsets(admin, group) == [10]
        s2 = ShareSession(admin, group, m2.member_id)
        assert s2.fetch([key], max_wait_ms=300).records == []
        produce(bs, topic_name, 1)
        assert _fetch_all(s2, key, 1) == [(10, 1)]
        s2.close()
        m2.leave(admin)


# --- the share coordinator as Kafka's ShareCoordinatorShard --------------------------------


def _state_rpc(conn: Connection, api_key: int, version: int, group: str, topic_id: uuid.UUID, partition: int,
               **fields: Any) -> Any:
    """One share-state RPC for one key; returns its partition result."""
    from shoal.protocol.entities import make, sub

    req_type = conn.request_type(api_key, version)
    data_name = {83: "InitializeStateData", 85: "WriteStateData", 87: "ReadStateSummaryData"}[api_key]
    part = make(sub(req_type, "PartitionData"), partition=partition, **fields)
    resp = conn.send(make(req_type, group_id=group, topics=(make(sub(req_type, data_name), topic_id=topic_id,
                                                                 partitions=(part,)),)))
    return resp.results[0].partitions[0]


def _write(conn: Connection, group: str, topic_id: uuid.UUID, partition: int, state_epoch: int) -> Any:
    return _state_rpc(conn, 85, 1, group, topic_id, partition, state_epoch=state_epoch, leader_epoch=-1,
                      start_offset=-1, delivery_complete_count=-1, state_batches=())


def test_share_coordinator_refuses_uninitialized_and_unknown_keys_and_fences_stale_state_epochs(
        broker: BrokerProcess, topic_name: str) -> None:
    bs = broker.bootstrap
    create_topic(bs, topic_name)
    group = "g-coordinator"
    with Connection.to(bs) as conn:
        tid = _topic_id(conn, topic_name)
        # WriteShareGroupState of a key without state: INVALID_REQUEST, and nothing created.
        assert _write(conn, group, tid, 0, 0).error_code == ErrorCode.invalid_request
        summary = _state_rpc(conn, 87, 1, group, tid, 0, leader_epoch=-1)
        assert summary.error_code == ErrorCode.unknown_topic_or_partition
        # A topic or partition that does not exist: UNKNOWN_TOPIC_OR_PARTITION.
        for t, p in ((uuid.uuid4(), 0), (tid, 5)):
            r = _state_rpc(conn, 83, 0, group, t, p, state_epoch=0, start_offset=0)
            assert r.error_code == ErrorCode.unknown_topic_or_partition, (t, p)

        # The group coordinator initializes with the group epoch as state epoch.
        m = ShareMembership(group, topics=(topic_name,))
        m.heartbeat(conn)
        assert m.assignment == {tid: (0,)}
        first = _state_rpc(conn, 87, 1, group, tid, 0, leader_epoch=-1)
        assert (first.error_code, first.state_epoch) == (ErrorCode.none, m.member_epoch)
        m.leave(conn)
        r = _delete_offsets(conn, group, topic_name)
        assert [t.error_code for t in r.responses] == [ErrorCode.none]
        # Initialized again by a later member, at the later group epoch: a leader that still
        # holds the earlier state epoch is fenced.
        m2 = ShareMembership(group, topics=(topic_name,))
        m2.heartbeat(conn)
        again = _state_rpc(conn, 87, 1, group, tid, 0, leader_epoch=-1)
        assert again.error_code == ErrorCode.none and again.state_epoch > first.state_epoch
        assert _write(conn, group, tid, 0, first.state_epoch).error_code == ErrorCode.fenced_state_epoch
        assert _write(conn, group, tid, 0, again.state_epoch).error_code == ErrorCode.none
        m2.leave(conn)
