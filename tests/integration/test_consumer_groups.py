"""Consumer groups end to end with real clients: librdkafka (classic and KIP-848 protocols),
kafka-python, confluent-kafka's AdminClient, restarts and the ``shoal consumer-groups`` tool."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import pytest
from confluent_kafka import Consumer, ConsumerGroupState, ConsumerGroupTopicPartitions, KafkaException, TopicPartition

from tests.support.broker import BrokerProcess
from tests.support.clients import admin_client, create_topic, produce_all, producer, rdkafka_conf, wait_until

pytestmark = pytest.mark.integration

PARTITIONS = 6
BROKER_SETTINGS = {
    "group.initial.rebalance.delay.ms": "0",
    "group.min.session.timeout.ms": "1000",
    "group.consumer.heartbeat.interval.ms": "300",
    "group.consumer.session.timeout.ms": "3000",
    "offsets.topic.num.partitions": "3",
}
CLASSIC = {"session.timeout.ms": 3000, "heartbeat.interval.ms": 200}
KIP848 = {"group.protocol": "consumer"}


def group_consumer(bootstrap: str, group: str, protocol: dict[str, Any], **extra: Any) -> Consumer:
    conf = {"group.id": group, "auto.offset.reset": "earliest", "enable.auto.commit": False,
            "fetch.wait.max.ms": 100, "topic.metadata.refresh.interval.ms": 1000, **protocol, **extra}
    return Consumer(rdkafka_conf(bootstrap, **conf))


def produce_batch(bootstrap: str, topic: str, start: int, n: int) -> set[bytes]:
    values = [b"v%06d" % i for i in range(start, start + n)]
    produce_all(producer(bootstrap), topic, [{"value": v, "partition": i % PARTITIONS} for i, v in
                                             enumerate(values, start)])
    return set(values)


def assigned(c: Consumer) -> set[int]:
    return {tp.partition for tp in c.assignment()}


def settled(consumers: Iterable[Consumer]) -> bool:
    """Every partition is owned by exactly one consumer and every consumer has some."""
    parts = [assigned(c) for c in consumers]
    return all(parts) and sum(len(p) for p in parts) == PARTITIONS and set().union(*parts) == set(range(PARTITIONS))


def pump(consumers: list[Consumer], seen: list[bytes], until: Callable[[], bool], what: str,
         timeout_s: float = 20.0) -> None:
    """Poll every consumer round-robin, committing synchronously after each batch, until ``until()``."""
    deadline = time.monotonic() + timeout_s
    while not until():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}; "
                                 f"assignments {[sorted(assigned(c)) for c in consumers]}, {len(seen)} consumed")
        for c in consumers:
            msgs = c.consume(500, timeout=0.05)
            batch = []
            for m in msgs:
                if m.error() is not None:
                    raise KafkaException(m.error())
                batch.append(m.value())
            if batch:
                c.commit(asynchronous=False)
                seen.extend(batch)


def consume_all(consumers: list[Consumer], expected: set[bytes], seen: list[bytes], what: str) -> None:
    before = len(seen)
    pump(consumers, seen, lambda: len(seen) - before >= len(expected), what)
    # A short extra round: nothing may arrive twice.
    end = time.monotonic() + 0.5
    pump(consumers, seen, lambda: time.monotonic() > end, "quiet period")
    got = seen[before:]
    assert len(got) == len(set(got)), "a record was delivered twice"
    assert set(got) == expected


class Killable:
    """A consumer in a child process (it can die for real: SIGKILL)."""

    SCRIPT = """
import sys, time
from confluent_kafka import Consumer
conf = eval(sys.argv[1])
c = Consumer(conf)
c.subscribe([sys.argv[2]])
told = False
while True:
    c.poll(0.05)
    if c.assignment() and not told:
        print("assigned", flush=True)
        told = True
"""

    def __init__(self, bootstrap: str, group: str, topic: str, protocol: dict[str, Any]) -> None:
        conf = {"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
                "broker.address.family": "v4", "log_level": 0, **protocol}
        self.proc = subprocess.Popen([sys.executable, "-c", self.SCRIPT, repr(conf), topic],
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self.assigned = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("assigned"):
                self.assigned.set()

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()


def group_lifecycle(broker: BrokerProcess, topic: str, group: str, protocol: dict[str, Any]) -> None:
    """Three members share a topic; one leaves, one dies; a newcomer resumes at the commits."""
    bs = broker.bootstrap
    create_topic(bs, topic, PARTITIONS)
    members = [group_consumer(bs, group, protocol) for _ in range(3)]
    for c in members:
        c.subscribe([topic])
    seen: list[bytes] = []
    pump(members, seen, lambda: settled(members), "three disjoint assignments covering the topic")
    consume_all(members, produce_batch(bs, topic, 0, 600), seen, "the first 600 records")
    assert settled(members)

    # One member leaves cleanly: the other two take its partitions, nothing is read twice.
    members.pop().close()
    pump(members, seen, lambda: settled(members), "a rebalance after a member left")
    consume_all(members, produce_batch(bs, topic, 600, 300), seen, "300 records after the leave")

    # A member joins from another process and dies without leaving: its session expires.
    doomed = Killable(bs, group, topic, protocol)
    pump(members, seen, lambda: doomed.assigned.is_set() and not settled(members), "the third member's join")
    doomed.kill()
    started = time.monotonic()
    pump(members, seen, lambda: settled(members), "the dead member's partitions to come back", timeout_s=20)
    assert time.monotonic() - started >= 1.0, "the dead member was removed before its session could expire"
    consume_all(members, produce_batch(bs, topic, 900, 300), seen, "300 records after the death")

    # Committed offsets are where the group stopped; a new member resumes exactly there.
    committed = {tp.partition: tp.offset for tp in
                 members[0].committed([TopicPartition(topic, p) for p in range(PARTITIONS)], timeout=10)}
    assert sum(committed.values()) == 1200
    for c in members:
        c.close()
    expected = produce_batch(bs, topic, 1200, 60)
    newcomer = group_consumer(bs, group, protocol)
    newcomer.subscribe([topic])
    firsts: dict[int, int] = {}
    got: list[bytes] = []
    deadline = time.monotonic() + 20
    while len(got) < 60 and time.monotonic() < deadline:
        for m in newcomer.consume(100, timeout=0.2):
            assert m.error() is None, m.error()
            firsts.setdefault(m.partition(), m.offset())
            got.append(m.value())
    newcomer.close()
    assert sorted(got) == sorted(expected)
    assert firsts == committed


def test_classic_group_librdkafka(start_broker: Callable[..., BrokerProcess], topic_name: str) -> None:
    group_lifecycle(start_broker(BROKER_SETTINGS), topic_name, "classic-g", CLASSIC)


def test_consumer_protocol_group_librdkafka(start_broker: Callable[..., BrokerProcess], topic_name: str) -> None:
    group_lifecycle(start_broker(BROKER_SETTINGS), topic_name, "kip848-g", KIP848)


class KafkaPythonMember:
    """One kafka-python KafkaConsumer polled by its own thread, as applications run it.

    kafka-python 3.0.12 starts a fresh JoinGroup when a join+sync it began finished
    while the application was outside ``poll()`` (``ensure_active_group`` discards a
    completed join task). Several consumers polled in turn from one thread therefore
    keep rebalancing; a thread per consumer keeps every consumer inside ``poll()``.

    The member knows the topic's partitions before its first JoinGroup. kafka-python
    3.0.12 joins as soon as ``poll()`` runs, before its first Metadata for a subscribed
    topic arrives; a leader in that state assigns nothing ("No partition metadata for
    topic") and rejoins when the metadata comes. That rejoin only flips the metadata
    snapshots (``rejoin_needed`` stays False, unlike the Java client, which requests a
    rejoin, KAFKA-9815, and also counts a pending join), and the leader's assignment
    makes the snapshots equal again. So when its SyncGroup answer comes after ``poll()``
    gave up waiting (a loaded machine), ``need_rejoin()`` is False, the finished join is
    never collected, heartbeats stay disabled, the session expires and the consumer sits
    outside the group for good. Any broker does the same with this client; asking for
    the topic's partitions first (``partitions_for_topic`` after ``subscribe``) keeps the
    leader from ever assigning without them.
    """

    def __init__(self, bootstrap: str, topic: str, seen: list[bytes], lock: threading.Lock,
                 poll_ms: int = 200) -> None:
        from kafka import KafkaConsumer

        self.consumer = KafkaConsumer(
            bootstrap_servers=bootstrap, group_id="kp-g", auto_offset_reset="earliest", enable_auto_commit=False,
            session_timeout_ms=3000, heartbeat_interval_ms=200, fetch_max_wait_ms=100, metadata_max_age_ms=1000)
        self.consumer.subscribe([topic])
        assert self.consumer.partitions_for_topic(topic) == set(range(PARTITIONS))
        self.assigned: frozenset[int] = frozenset()
        self._seen, self._lock, self._poll_ms = seen, lock, poll_ms
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        c = self.consumer
        while not self._stop.is_set():
            batch = [r.value for recs in c.poll(timeout_ms=self._poll_ms, max_records=500).values() for r in recs]
            if batch:
                c.commit()
                with self._lock:
                    self._seen.extend(batch)
            self.assigned = frozenset(tp.partition for tp in c.assignment())
        c.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(30)
        assert not self._thread.is_alive()


def test_kafka_python_group(start_broker: Callable[..., BrokerProcess], topic_name: str) -> None:
    b = start_broker(BROKER_SETTINGS)
    create_topic(b.bootstrap, topic_name, PARTITIONS)
    seen: list[bytes] = []
    lock = threading.Lock()
    members = [KafkaPythonMember(b.bootstrap, topic_name, seen, lock) for _ in range(3)]

    def settled() -> bool:
        parts = [m.assigned for m in members]
        return all(parts) and sum(map(len, parts)) == PARTITIONS and frozenset().union(*parts) == set(range(PARTITIONS))

    def count() -> int:
        with lock:
            return len(seen)

    try:
        wait_until("three disjoint assignments covering the topic", settled, 30)
        expected = produce_batch(b.bootstrap, topic_name, 0, 600)
        wait_until("600 records", lambda: count() >= 600, 30)
        with lock:
            assert len(seen) == 600 and set(seen) == expected
        members.pop().close()
        wait_until("a rebalance after a member left", lambda: len(members) == 2 and settled(), 30)
        expected = produce_batch(b.bootstrap, topic_name, 600, 300)
        wait_until("300 more records", lambda: count() >= 900, 30)
        with lock:
            assert len(seen) == len(set(seen)) == 900
    finally:
        while members:
            members.pop().close()
    # A new member resumes at the committed offsets: it sees only what came after.
    expected = produce_batch(b.bootstrap, topic_name, 900, 60)
    start = count()
    members = [KafkaPythonMember(b.bootstrap, topic_name, seen, lock)]
    try:
        wait_until("the 60 newest records", lambda: count() - start >= 60, 30)
    finally:
        members[0].close()
    with lock:
        assert set(seen[start:]) == expected and len(seen) - start == 60


def test_kafka_python_member_polled_briefly_gets_every_partition(start_broker: Callable[..., BrokerProcess],
                                                                 topic_name: str) -> None:
    """A lone member whose ``poll()`` returns after 5 ms, so that a join+sync outlasts it.

    It must not assign before it knows the topic's partitions (see KafkaPythonMember):
    a rejoin forced by the metadata arriving late would be lost and the member would sit
    outside the group with nothing (no heartbeats, session expired), on any broker.
    """
    b = start_broker(BROKER_SETTINGS)
    create_topic(b.bootstrap, topic_name, PARTITIONS)
    member = KafkaPythonMember(b.bootstrap, topic_name, [], threading.Lock(), poll_ms=5)
    try:
        wait_until("the lone member to own every partition", lambda: member.assigned == set(range(PARTITIONS)), 15)
    finally:
        member.close()


def commit_offsets(bootstrap: str, group: str, topic: str, offsets: dict[int, int]) -> None:
    admin = admin_client(bootstrap)
    request = ConsumerGroupTopicPartitions(group, [TopicPartition(topic, p, o) for p, o in offsets.items()])
    result = admin.alter_consumer_group_offsets([request])[group].result(10)
    assert all(tp.error is None for tp in result.topic_partitions)


def test_offset_fetch_many_groups_in_one_request(start_broker: Callable[..., BrokerProcess],
                                                 topic_name: str) -> None:
    from kafka import TopicPartition as KTP
    from kafka.admin import KafkaAdminClient

    from shoal.client.connection import Connection

    b = start_broker(BROKER_SETTINGS)
    create_topic(b.bootstrap, topic_name, 3)
    groups = {f"multi-{i}": {p: 10 * i + p for p in range(3)} for i in range(5)}
    for g, offsets in groups.items():
        commit_offsets(b.bootstrap, g, topic_name, offsets)

    # kafka-python asks for several groups in one request only when the broker serves v8+
    # (it raises UnsupportedVersionError otherwise).
    kadmin = KafkaAdminClient(bootstrap_servers=b.bootstrap)
    try:
        got = kadmin.list_group_offsets([*groups, "multi-missing"])
    finally:
        kadmin.close()
    for g, offsets in groups.items():
        assert {tp.partition: om.offset for tp, om in got[g].items()} == offsets
        assert all(tp.topic == topic_name for tp in got[g])
    assert not got["multi-missing"]

    # The same on the wire: one OffsetFetch v8 carrying every group (spread over 3 shards).
    with Connection.to(b.bootstrap) as conn:
        assert conn.version_for(9) >= 8
        req = conn.request_type(9, 8)
        from shoal.protocol.entities import make, sub

        gcls, tcls = sub(req, "OffsetFetchRequestGroup"), sub(req, "OffsetFetchRequestTopics")
        request = make(req, require_stable=False, groups=tuple(
            make(gcls, group_id=g, topics=(make(tcls, name=topic_name, partition_indexes=(0, 1, 2)),))
            for g in [*groups, "multi-missing"]))
        response = conn.send(request)
    assert [g.group_id for g in response.groups] == [*groups, "multi-missing"]
    for g in response.groups:
        assert g.error_code == 0
        offsets = {p.partition_index: p.committed_offset for t in g.topics for p in t.partitions}
        assert offsets == groups.get(g.group_id, {0: -1, 1: -1, 2: -1})
    _ = KTP


def test_admin_client_groups(start_broker: Callable[..., BrokerProcess], topic_name: str) -> None:
    b = start_broker(BROKER_SETTINGS)
    bs = b.bootstrap
    create_topic(bs, topic_name, PARTITIONS)
    produce_batch(bs, topic_name, 0, 60)
    admin = admin_client(bs)
    # Offsets committed by a tool make an empty classic group; a KIP-848 member converts it.
    commit_offsets(bs, "adm-848", topic_name, {0: 5})
    live_classic = group_consumer(bs, "adm-classic", CLASSIC)
    live_848 = group_consumer(bs, "adm-848", KIP848)
    for c in (live_classic, live_848):
        c.subscribe([topic_name])
    seen: list[bytes] = []
    pump([live_classic, live_848], seen,
         lambda: len(assigned(live_classic)) == PARTITIONS and len(assigned(live_848)) == PARTITIONS
         and len(seen) >= 60 + 55, "both groups to own every partition and read every record")
    commit_offsets(bs, "adm-simple", topic_name, {0: 3, 1: 4})

    listed = admin.list_consumer_groups().result(10)
    by_id = {g.group_id: g for g in listed.valid}
    assert {"adm-classic", "adm-848", "adm-simple"} <= set(by_id)
    assert by_id["adm-classic"].state == ConsumerGroupState.STABLE
    assert by_id["adm-simple"].state == ConsumerGroupState.EMPTY
    stable = admin.list_consumer_groups(states={ConsumerGroupState.STABLE}).result(10)
    assert {g.group_id for g in stable.valid} >= {"adm-classic"} and "adm-simple" not in {
        g.group_id for g in stable.valid}

    described = {g: f.result(10) for g, f in admin.describe_consumer_groups(["adm-classic", "adm-848"]).items()}
    for g, d in described.items():
        assert d.group_id == g and d.state == ConsumerGroupState.STABLE, (g, d.state)
        assert len(d.members) == 1
        assert {tp.partition for tp in d.members[0].assignment.topic_partitions} == set(range(PARTITIONS))
    assert described["adm-848"].type.name == "CONSUMER" and described["adm-classic"].type.name == "CLASSIC"
    got = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions("adm-848")])["adm-848"].result(10)
    assert {tp.partition: tp.offset for tp in got.topic_partitions}[0] == 10  # resumed at 5, read to the end
    assert len(seen) == 60 + 55

    offsets = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions("adm-simple")])["adm-simple"].result(10)
    assert {(tp.partition, tp.offset) for tp in offsets.topic_partitions} == {(0, 3), (1, 4)}

    # A group with members cannot be deleted; an empty one can, offsets and all.
    results = admin.delete_consumer_groups(["adm-classic", "adm-simple"])
    with pytest.raises(KafkaException) as e:
        results["adm-classic"].result(10)
    assert "NON_EMPTY_GROUP" in str(e.value)
    results["adm-simple"].result(10)
    assert "adm-simple" not in {g.group_id for g in admin.list_consumer_groups().result(10).valid}
    offsets = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions("adm-simple")])["adm-simple"].result(10)
    assert all(tp.offset < 0 for tp in offsets.topic_partitions)

    # Once its members have left, the consumer-protocol group can be deleted too.
    live_848.close()
    live_classic.close()
    wait_until("adm-848 to be empty", lambda: admin.describe_consumer_groups(["adm-848"])["adm-848"].result(10).state
               == ConsumerGroupState.EMPTY)
    admin.delete_consumer_groups(["adm-848", "adm-classic"])["adm-848"].result(10)
    assert not {"adm-848", "adm-classic"} & {g.group_id for g in admin.list_consumer_groups().result(10).valid}


@pytest.mark.parametrize("crash", [False, True], ids=["sigterm", "kill-9"])
def test_groups_and_offsets_survive_restart(start_broker: Callable[..., BrokerProcess], topic_name: str,
                                            crash: bool) -> None:
    b = start_broker(BROKER_SETTINGS)
    create_topic(b.bootstrap, topic_name, PARTITIONS)
    produce_batch(b.bootstrap, topic_name, 0, 120)
    seen: list[bytes] = []
    c = group_consumer(b.bootstrap, "durable-g", CLASSIC)
    c.subscribe([topic_name])
    pump([c], seen, lambda: len(seen) >= 120, "120 records")
    k = group_consumer(b.bootstrap, "durable-848", KIP848)
    k.subscribe([topic_name])
    pump([k], seen, lambda: len(seen) >= 240, "120 records with the consumer protocol")
    committed = {tp.partition: tp.offset for tp in
                 c.committed([TopicPartition(topic_name, p) for p in range(PARTITIONS)], timeout=10)}
    assert sum(committed.values()) == 120
    if crash:
        b.kill()  # right after the acknowledged commits
        c.close()
        k.close()
        b.start()
    else:
        c.close()
        k.close()
        b.restart()
    admin = admin_client(b.bootstrap)
    ids = {g.group_id for g in admin.list_consumer_groups().result(10).valid}
    assert {"durable-g", "durable-848"} <= ids
    for g in ("durable-g", "durable-848"):
        got = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(g)])[g].result(10)
        assert {tp.partition: tp.offset for tp in got.topic_partitions} == committed
    # A new member of the consumer-protocol group resumes at the commits.
    produce_batch(b.bootstrap, topic_name, 120, 12)
    n = group_consumer(b.bootstrap, "durable-848", KIP848)
    n.subscribe([topic_name])
    after: list[bytes] = []
    pump([n], after, lambda: len(after) >= 12, "the 12 new records")
    n.close()
    assert sorted(after) == [b"v%06d" % i for i in range(120, 132)]


def test_a_data_dir_with_one_offsets_partition_keeps_its_groups_under_the_default_of_50(
        start_broker: Callable[..., BrokerProcess], topic_name: str) -> None:
    """A data directory whose __consumer_offsets was created with one partition (shoal's old
    default) restarts under Kafka's default of 50: the existing topic's count decides where a
    group lives, so every group's offsets are still found, and new commits go on."""
    b = start_broker({**BROKER_SETTINGS, "offsets.topic.num.partitions": "1"})
    create_topic(b.bootstrap, topic_name, PARTITIONS)
    groups = [f"old-layout-{i}" for i in range(12)]
    admin = admin_client(b.bootstrap)
    committed = {}
    for n, g in enumerate(groups):
        offsets = [TopicPartition(topic_name, p, n * 10 + p) for p in range(PARTITIONS)]
        admin.alter_consumer_group_offsets([ConsumerGroupTopicPartitions(g, offsets)])[g].result(10)
        committed[g] = {p: n * 10 + p for p in range(PARTITIONS)}
    b.stop()
    b.overrides.pop("offsets.topic.num.partitions")  # the default, 50, from now on
    b.start()
    replays = [line for line in b.stderr_tail(400).splitlines() if "__consumer_offsets: replayed" in line]
    assert len(replays) == 2 and replays[-1].endswith("into 1 shard(s)"), replays
    admin = admin_client(b.bootstrap)
    assert set(groups) <= {g.group_id for g in admin.list_consumer_groups().result(10).valid}
    for g in groups:
        got = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(g)])[g].result(10)
        assert {tp.partition: tp.offset for tp in got.topic_partitions} == committed[g], g
    # a group that did not exist before lives in the same single partition, and commits as usual
    offsets = [TopicPartition(topic_name, 0, 7)]
    admin.alter_consumer_group_offsets([ConsumerGroupTopicPartitions("new-after-upgrade", offsets)])[
        "new-after-upgrade"].result(10)
    got = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions("new-after-upgrade")])[
        "new-after-upgrade"].result(10)
    assert [(tp.partition, tp.offset) for tp in got.topic_partitions] == [(0, 7)]
    meta = admin.list_topics("__consumer_offsets", timeout=10).topics.get("__consumer_offsets")
    assert meta is not None and len(meta.partitions) == 1


def run_cli(bootstrap: str, *args: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "shoal", "consumer-groups", "--bootstrap-server", bootstrap, *args],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def table(text: str) -> list[list[str]]:
    return [line.split() for line in text.strip().splitlines() if line.strip()]


def test_consumer_groups_cli(start_broker: Callable[..., BrokerProcess], topic_name: str) -> None:
    b = start_broker(BROKER_SETTINGS)
    bs = b.bootstrap
    create_topic(bs, topic_name, 2)
    produce_all(producer(bs), topic_name, [{"value": b"x", "partition": i % 2} for i in range(20)])
    commit_offsets(bs, "cli-g", topic_name, {0: 4, 1: 10})

    assert "cli-g" in run_cli(bs, "--list").split()

    rows = table(run_cli(bs, "--describe", "--group", "cli-g"))
    assert rows[0] == ["GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG", "CONSUMER-ID",
                       "HOST", "CLIENT-ID"]
    assert sorted(r[:6] for r in rows[1:]) == [["cli-g", topic_name, "0", "4", "10", "6"],
                                               ["cli-g", topic_name, "1", "10", "10", "0"]]
    assert all(r[6:] == ["-", "-", "-"] for r in rows[1:])
    state = table(run_cli(bs, "--describe", "--group", "cli-g", "--state"))
    assert state[0][:2] == ["GROUP", "COORDINATOR"] and state[1][0] == "cli-g" and "Empty" in state[1]

    # --reset-offsets: dry run by default, --execute applies.
    dry = table(run_cli(bs, "--reset-offsets", "--group", "cli-g", "--topic", topic_name, "--to-earliest"))
    assert dry[0] == ["GROUP", "TOPIC", "PARTITION", "NEW-OFFSET"]
    assert sorted(dry[1:]) == [["cli-g", topic_name, "0", "0"], ["cli-g", topic_name, "1", "0"]]
    assert sorted(r[3] for r in table(run_cli(bs, "--describe", "--group", "cli-g"))[1:]) == ["10", "4"]
    run_cli(bs, "--reset-offsets", "--group", "cli-g", "--topic", f"{topic_name}:1", "--shift-by", "-3", "--execute")
    run_cli(bs, "--reset-offsets", "--group", "cli-g", "--topic", f"{topic_name}:0", "--to-offset", "2", "--execute")
    rows = table(run_cli(bs, "--describe", "--group", "cli-g"))
    assert sorted((r[2], r[3]) for r in rows[1:]) == [("0", "2"), ("1", "7")]
    run_cli(bs, "--reset-offsets", "--group", "cli-g", "--all-topics", "--to-latest", "--execute")
    rows = table(run_cli(bs, "--describe", "--group", "cli-g"))
    assert sorted((r[2], r[3], r[5]) for r in rows[1:]) == [("0", "10", "0"), ("1", "10", "0")]

    # --delete-offsets, then --delete.
    run_cli(bs, "--delete-offsets", "--group", "cli-g", "--topic", topic_name)
    out = run_cli(bs, "--describe", "--group", "cli-g")
    assert topic_name not in out
    commit_offsets(bs, "cli-g", topic_name, {0: 1})
    assert "cli-g" in run_cli(bs, "--delete", "--group", "cli-g")
    assert "cli-g" not in run_cli(bs, "--list").split()


def test_offset_commit_to_unknown_topics_and_partitions(broker: BrokerProcess) -> None:
    """As Kafka: partitions of an OffsetCommit that no topic has are answered
    UNKNOWN_TOPIC_OR_PARTITION and not committed; the others are committed."""
    from shoal.client.connection import Connection
    from shoal.protocol.entities import make, sub

    create_topic(broker.bootstrap, "known", 2)

    def commit(conn: Connection, topics: dict[str, list[int]]) -> list[tuple[str, int, str]]:
        req = conn.request_type(8, 9)
        r = conn.send(make(req, group_id="unknown-commits", generation_id_or_member_epoch=-1, member_id="",
                           group_instance_id=None, topics=tuple(
                               make(sub(req, "OffsetCommitRequestTopic"), name=name, partitions=tuple(
                                   make(sub(req, "OffsetCommitRequestPartition"), partition_index=p,
                                        committed_offset=1, committed_leader_epoch=-1, committed_metadata="")
                                   for p in ps)) for name, ps in topics.items())))
        return [(t.name, p.partition_index, p.error_code.name) for t in r.topics for p in t.partitions]

    with Connection.to(broker.bootstrap) as conn:
        assert commit(conn, {"known": [0, 5, 1], "no-such-topic": [0]}) == [
            ("known", 0, "none"), ("known", 5, "unknown_topic_or_partition"), ("known", 1, "none"),
            ("no-such-topic", 0, "unknown_topic_or_partition")]
        assert commit(conn, {"no-such-topic": [0, 1]}) == [
            ("no-such-topic", 0, "unknown_topic_or_partition"), ("no-such-topic", 1, "unknown_topic_or_partition")]
        req = conn.request_type(9, 9)
        r = conn.send(make(req, require_stable=False, groups=(make(
            sub(req, "OffsetFetchRequestGroup"), group_id="unknown-commits", member_id=None, member_epoch=-1,
            topics=None),)))
        assert sorted((t.name, p.partition_index, p.committed_offset) for g in r.groups for t in g.topics
                      for p in t.partitions) == [("known", 0, 1), ("known", 1, 1)]


def test_offset_commit_with_an_older_member_epoch_for_partitions_owned_since_then(broker: BrokerProcess,
                                                                                topic_name: str) -> None:
    """KIP-1251 (Kafka 4.3): a KIP-848 member's OffsetCommit that crossed an epoch bump (its
    epoch is older than the member's) is accepted for partitions the member owns since an
    epoch no newer than the one sent, and refused (STALE_MEMBER_EPOCH) for others; also
    after a restart (the epochs are in the member records)."""
    import datetime
    import uuid

    from shoal.client.connection import Connection
    from shoal.protocol.entities import make, sub

    create_topic(broker.bootstrap, topic_name, 4)
    group = f"g-{topic_name}"

    def heartbeat(conn: Connection, member: str, epoch: int, owned: set[int] | None, tid: Any = None) -> Any:
        req = conn.request_type(68, 1)
        parts = None if owned is None else (make(sub(req, "TopicPartitions"), topic_id=tid,
                                                 partitions=tuple(sorted(owned))),)
        r = conn.send(make(req, group_id=group, member_id=member, member_epoch=epoch, instance_id=None, rack_id=None,
                           rebalance_timeout=datetime.timedelta(milliseconds=30_000 if epoch == 0 else -1),
                           subscribed_topic_names=(topic_name,) if epoch == 0 else None, subscribed_topic_regex=None,
                           server_assignor=None, topic_partitions=() if epoch == 0 else parts))
        assert r.error_code == 0, r
        return r

    def partitions(r: Any) -> set[int] | None:
        return None if r.assignment is None else {p for t in r.assignment.topic_partitions for p in t.partitions}

    def commit(conn: Connection, member: str, epoch: int, ps: list[int]) -> set[str]:
        req = conn.request_type(8, 9)
        r = conn.send(make(req, group_id=group, generation_id_or_member_epoch=epoch, member_id=member,
                           group_instance_id=None, topics=(make(sub(req, "OffsetCommitRequestTopic"), name=topic_name,
                           partitions=tuple(make(sub(req, "OffsetCommitRequestPartition"), partition_index=p,
                                                 committed_offset=7, committed_leader_epoch=-1, committed_metadata="")
                                            for p in ps)),)))
        return {p.error_code.name for t in r.topics for p in t.partitions}

    a, b = str(uuid.uuid4()), str(uuid.uuid4())
    with Connection.to(broker.bootstrap) as conn:
        ra = heartbeat(conn, a, 0, None)
        tid = ra.assignment.topic_partitions[0].topic_id
        assert (ra.member_epoch, partitions(ra)) == (1, {0, 1, 2, 3})
        assert heartbeat(conn, b, 0, None).member_epoch == 2
        ra = heartbeat(conn, a, 1, {0, 1, 2, 3}, tid)  # told to give some up
        kept = partitions(ra)
        assert ra.member_epoch == 1 and kept and kept < {0, 1, 2, 3}
        ra = heartbeat(conn, a, 1, kept, tid)
        assert ra.member_epoch == 2
        given_up = sorted({0, 1, 2, 3} - kept)
        assert commit(conn, a, 2, sorted(kept)) == {"none"}
        # Epoch 1 (before the bump): a owns these since epoch 1.
        assert commit(conn, a, 1, sorted(kept)) == {"none"}
        assert commit(conn, a, 1, [*sorted(kept), given_up[0]]) == {"stale_member_epoch"}
        assert commit(conn, a, 3, sorted(kept)) == {"stale_member_epoch"}
    broker.stop()
    broker.start()
    with Connection.to(broker.bootstrap) as conn:
        wait_until("the commit with epoch 1 after the restart",
                   lambda: commit(conn, a, 1, sorted(kept)) == {"none"}, 30)
        assert commit(conn, a, 1, given_up[:1]) == {"stale_member_epoch"}
