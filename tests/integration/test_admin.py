"""Topic and config administration through confluent-kafka's AdminClient."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition, TopicCollection
from confluent_kafka.admin import (
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewPartitions,
    NewTopic,
    ResourceType,
)

from tests.support.clients import (
    admin_client,
    consume_exact,
    consumer,
    create_topic,
    produce_all,
    producer,
    records_of,
    wait_until,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

T = 15  # seconds for every admin call


def error_of(future) -> KafkaError:
    with pytest.raises(KafkaException) as info:
        future.result(timeout=T)
    return info.value.args[0]


def topic_names(admin) -> set[str]:
    return set(admin.list_topics(timeout=T).topics)


def topic_configs(admin, name: str) -> dict[str, ConfigEntry]:
    res = ConfigResource(ResourceType.TOPIC, name)
    return admin.describe_configs([res], request_timeout=T)[res].result(timeout=T)


def test_create_list_describe_delete_topic(shared_broker, topic_name):
    admin = admin_client(shared_broker.bootstrap)
    fs = admin.create_topics([NewTopic(topic_name, 4, 1, config={"retention.ms": "3600000"})], request_timeout=T)
    assert fs[topic_name].result(timeout=T) is None
    md = admin.list_topics(timeout=T)
    assert topic_name in md.topics
    t = md.topics[topic_name]
    assert t.error is None
    assert sorted(t.partitions) == [0, 1, 2, 3]
    for p in t.partitions.values():
        assert (p.leader, p.replicas, p.isrs) == (0, [0], [0])

    (desc,) = admin.describe_topics(TopicCollection([topic_name]), request_timeout=T).values()
    d = desc.result(timeout=T)
    assert d.name == topic_name and len(d.partitions) == 4 and d.topic_id is not None

    assert admin.delete_topics([topic_name], request_timeout=T)[topic_name].result(timeout=T) is None
    assert topic_name not in topic_names(admin)
    # The name is free again, and the new topic starts empty.
    create_topic(shared_broker.bootstrap, topic_name, 1)
    c = consumer(shared_broker.bootstrap)
    try:
        assert c.get_watermark_offsets(TopicPartition(topic_name, 0), timeout=T) == (0, 0)
    finally:
        c.close()


def test_create_topic_errors(shared_broker, topic_name):
    admin = admin_client(shared_broker.bootstrap)
    create_topic(shared_broker.bootstrap, topic_name, 1)
    again = admin.create_topics([NewTopic(topic_name, 1, 1)], request_timeout=T)[topic_name]
    assert error_of(again).code() == KafkaError.TOPIC_ALREADY_EXISTS

    bad = "bad/name"
    assert error_of(admin.create_topics([NewTopic(bad, 1, 1)], request_timeout=T)[bad]).code() == \
        KafkaError.TOPIC_EXCEPTION
    long_name = "x" * 250
    assert error_of(admin.create_topics([NewTopic(long_name, 1, 1)], request_timeout=T)[long_name]).code() == \
        KafkaError.TOPIC_EXCEPTION

    rf3 = topic_name + "-rf3"
    assert error_of(admin.create_topics([NewTopic(rf3, 1, 3)], request_timeout=T)[rf3]).code() == \
        KafkaError.INVALID_REPLICATION_FACTOR

    zero = topic_name + "-zero"
    assert error_of(admin.create_topics([NewTopic(zero, 0, 1)], request_timeout=T)[zero]).code() == \
        KafkaError.INVALID_PARTITIONS

    badcfg = topic_name + "-badcfg"
    assert error_of(admin.create_topics([NewTopic(badcfg, 1, 1, config={"retention.ms": "soon"})],
                                        request_timeout=T)[badcfg]).code() == KafkaError.INVALID_CONFIG
    unknown_cfg = topic_name + "-unknown-cfg"
    assert error_of(admin.create_topics([NewTopic(unknown_cfg, 1, 1, config={"no.such.config": "1"})],
                                        request_timeout=T)[unknown_cfg]).code() == KafkaError.INVALID_CONFIG

    names = topic_names(admin)
    assert not {bad, long_name, rf3, zero, badcfg, unknown_cfg} & names

    # validate_only creates nothing.
    vo = topic_name + "-validate"
    assert admin.create_topics([NewTopic(vo, 2, 1)], validate_only=True, request_timeout=T)[vo].result(timeout=T) \
        is None
    assert vo not in topic_names(admin)


def test_delete_unknown_topic(shared_broker, topic_name):
    admin = admin_client(shared_broker.bootstrap)
    fut = admin.delete_topics([topic_name + "-never-created"], request_timeout=T)[topic_name + "-never-created"]
    assert error_of(fut).code() == KafkaError.UNKNOWN_TOPIC_OR_PART


def test_create_partitions(shared_broker, topic_name):
    bs = shared_broker.bootstrap
    admin = admin_client(bs)
    create_topic(bs, topic_name, 2)
    produce_all(producer(bs), topic_name, [{"partition": p, "value": b"before-%d" % p} for p in (0, 1)])
    assert admin.create_partitions([NewPartitions(topic_name, 5)], request_timeout=T)[topic_name].result(timeout=T) \
        is None
    assert sorted(admin.list_topics(topic_name, timeout=T).topics[topic_name].partitions) == [0, 1, 2, 3, 4]
    # Not growing is an error.
    fut = admin.create_partitions([NewPartitions(topic_name, 3)], request_timeout=T)[topic_name]
    assert error_of(fut).code() == KafkaError.INVALID_PARTITIONS
    fut = admin.create_partitions([NewPartitions(topic_name + "-none", 3)], request_timeout=T)[topic_name + "-none"]
    assert error_of(fut).code() == KafkaError.UNKNOWN_TOPIC_OR_PART
    # Explicit assignments: only this broker.
    node = admin.describe_cluster(request_timeout=T).result(timeout=T).nodes[0].id
    fut = admin.create_partitions([NewPartitions(topic_name, 6, replica_assignment=[[node + 1]])],
                                  request_timeout=T)[topic_name]
    assert error_of(fut).code() == KafkaError.INVALID_REPLICA_ASSIGNMENT
    admin.create_partitions([NewPartitions(topic_name, 6, replica_assignment=[[node]])],
                            request_timeout=T)[topic_name].result(timeout=T)
    assert len(admin.list_topics(topic_name, timeout=T).topics[topic_name].partitions) == 6
    # Old and new partitions all work.
    produce_all(producer(bs), topic_name, [{"partition": p, "value": b"after-%d" % p} for p in range(5)])
    got = records_of(bs, topic_name, 6, 7)
    assert sorted((r.partition, r.offset, r.value) for r in got) == [
        (0, 0, b"before-0"), (0, 1, b"after-0"), (1, 0, b"before-1"), (1, 1, b"after-1"),
        (2, 0, b"after-2"), (3, 0, b"after-3"), (4, 0, b"after-4"),
    ]


def test_topic_configs_describe_incremental_alter_and_alter(shared_broker, topic_name):
    bs = shared_broker.bootstrap
    admin = admin_client(bs)
    create_topic(bs, topic_name, 1, {"retention.ms": "3600000"})
    cfg = topic_configs(admin, topic_name)
    assert cfg["retention.ms"].value == "3600000"
    assert cfg["retention.ms"].source == 1  # DYNAMIC_TOPIC_CONFIG
    assert not cfg["retention.ms"].is_default
    assert cfg["cleanup.policy"].value == "delete"
    assert cfg["cleanup.policy"].is_default
    assert cfg["message.timestamp.type"].value == "CreateTime"

    res = ConfigResource(ResourceType.TOPIC, topic_name, incremental_configs=[
        ConfigEntry("segment.bytes", "1048576", incremental_operation=AlterConfigOpType.SET),
        ConfigEntry("retention.ms", None, incremental_operation=AlterConfigOpType.DELETE),
        ConfigEntry("cleanup.policy", "compact", incremental_operation=AlterConfigOpType.APPEND),
    ])
    assert admin.incremental_alter_configs([res], request_timeout=T)[res].result(timeout=T) is None
    cfg = topic_configs(admin, topic_name)
    assert cfg["segment.bytes"].value == "1048576"
    assert cfg["retention.ms"].value == str(7 * 24 * 3600 * 1000) and cfg["retention.ms"].is_default
    assert cfg["cleanup.policy"].value == "compact"

    # A bad value changes nothing (all or none per resource).
    res = ConfigResource(ResourceType.TOPIC, topic_name, incremental_configs=[
        ConfigEntry("segment.bytes", "2097152", incremental_operation=AlterConfigOpType.SET),
        ConfigEntry("retention.ms", "not-a-number", incremental_operation=AlterConfigOpType.SET),
    ])
    assert error_of(admin.incremental_alter_configs([res], request_timeout=T)[res]).code() == \
        KafkaError.INVALID_CONFIG
    assert topic_configs(admin, topic_name)["segment.bytes"].value == "1048576"

    # Legacy AlterConfigs replaces the whole set of overrides.
    res = ConfigResource(ResourceType.TOPIC, topic_name, set_config={"max.message.bytes": "200000"})
    assert admin.alter_configs([res], request_timeout=T)[res].result(timeout=T) is None
    cfg = topic_configs(admin, topic_name)
    assert cfg["max.message.bytes"].value == "200000" and not cfg["max.message.bytes"].is_default
    assert cfg["segment.bytes"].is_default
    assert cfg["cleanup.policy"].value == "delete"

    missing = ConfigResource(ResourceType.TOPIC, topic_name + "-missing")
    assert error_of(admin.describe_configs([missing], request_timeout=T)[missing]).code() == \
        KafkaError.UNKNOWN_TOPIC_OR_PART


def test_altered_max_message_bytes_is_enforced(shared_broker, topic_name):
    bs = shared_broker.bootstrap
    admin = admin_client(bs)
    create_topic(bs, topic_name, 1)
    res = ConfigResource(ResourceType.TOPIC, topic_name, incremental_configs=[
        ConfigEntry("max.message.bytes", "2000", incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([res], request_timeout=T)[res].result(timeout=T)
    p = producer(bs, **{"linger.ms": 0, "message.timeout.ms": 5000})
    errors = []
    p.produce(topic_name, value=b"x" * 5000, on_delivery=lambda err, msg: errors.append(err))
    p.flush(10)
    assert len(errors) == 1 and errors[0] is not None
    assert errors[0].code() == KafkaError.MSG_SIZE_TOO_LARGE
    produce_all(p, topic_name, [{"value": b"small"}])
    assert [r.value for r in records_of(bs, topic_name, 1, 1)] == [b"small"]


def test_broker_configs_describe_and_alter(broker):
    admin = admin_client(broker.bootstrap)
    res = ConfigResource(ResourceType.BROKER, "0")
    cfg = admin.describe_configs([res], request_timeout=T)[res].result(timeout=T)
    assert cfg["auto.create.topics.enable"].value == "true"
    assert cfg["log.retention.ms"].value == str(7 * 24 * 3600 * 1000)
    assert cfg["node.id"].is_read_only

    alter = ConfigResource(ResourceType.BROKER, "0", incremental_configs=[
        ConfigEntry("log.retention.ms", "86400000", incremental_operation=AlterConfigOpType.SET)])
    assert admin.incremental_alter_configs([alter], request_timeout=T)[alter].result(timeout=T) is None
    cfg = admin.describe_configs([res], request_timeout=T)[res].result(timeout=T)
    assert cfg["log.retention.ms"].value == "86400000"
    assert cfg["log.retention.ms"].source == 2  # DYNAMIC_BROKER_CONFIG: set on broker 0, not a cluster default

    # A topic without its own override now inherits the new default.
    create_topic(broker.bootstrap, "inherits", 1)
    assert topic_configs(admin, "inherits")["retention.ms"].value == "86400000"

    readonly = ConfigResource(ResourceType.BROKER, "0", incremental_configs=[
        ConfigEntry("node.id", "7", incremental_operation=AlterConfigOpType.SET)])
    assert error_of(admin.incremental_alter_configs([readonly], request_timeout=T)[readonly]).code() in (
        KafkaError.INVALID_REQUEST, KafkaError.INVALID_CONFIG, KafkaError.POLICY_VIOLATION)

    # Dynamic broker configs survive a restart.
    broker.restart()
    admin = admin_client(broker.bootstrap)
    cfg = admin.describe_configs([res], request_timeout=T)[res].result(timeout=T)
    assert cfg["log.retention.ms"].value == "86400000"
    assert cfg["node.id"].value == "0"


def test_describe_cluster(shared_broker):
    admin = admin_client(shared_broker.bootstrap)
    c = admin.describe_cluster(request_timeout=T).result(timeout=T)
    assert c.cluster_id
    assert [(n.id, n.host, n.port) for n in c.nodes] == [(0, "127.0.0.1", shared_broker.port)]
    assert c.controller.id == 0
    md = admin.list_topics(timeout=T)
    assert md.cluster_id == c.cluster_id
    assert list(md.brokers) == [0]


def test_delete_records_moves_low_watermark(shared_broker, topic_name):
    bs = shared_broker.bootstrap
    admin = admin_client(bs)
    create_topic(bs, topic_name, 2)
    produce_all(producer(bs), topic_name, [{"partition": 0, "value": b"%d" % i} for i in range(10)])
    tp = TopicPartition(topic_name, 0, 6)
    (fut,) = admin.delete_records([tp], request_timeout=T).values()
    assert fut.result(timeout=T).low_watermark == 6

    c = consumer(bs)
    try:
        assert c.get_watermark_offsets(TopicPartition(topic_name, 0), timeout=T) == (6, 10)
        # Reading from before the low watermark: offset out of range, reset to earliest (6).
        c.assign([TopicPartition(topic_name, 0, 2)])
        got = consume_exact(c, 4)
        assert [(r.offset, r.value) for r in got] == [(i, b"%d" % i) for i in range(6, 10)]
    finally:
        c.close()

    # Past the high watermark: OFFSET_OUT_OF_RANGE, nothing changes.
    (fut,) = admin.delete_records([TopicPartition(topic_name, 0, 11)], request_timeout=T).values()
    assert error_of(fut).code() == KafkaError.OFFSET_OUT_OF_RANGE
    # Offset -1 (OFFSET_END) deletes everything up to the high watermark.
    (fut,) = admin.delete_records([TopicPartition(topic_name, 0, -1)], request_timeout=T).values()
    assert fut.result(timeout=T).low_watermark == 10
    c = consumer(bs, **{"auto.offset.reset": "error"})
    try:
        assert c.get_watermark_offsets(TopicPartition(topic_name, 0), timeout=T) == (10, 10)
    finally:
        c.close()


def test_metadata_auto_creates_topics_by_default(broker):
    """Kafka's default: a producer to a new topic creates it with num.partitions (1) partitions."""
    p = producer(broker.bootstrap)
    reports = produce_all(p, "auto-created", [{"value": b"hello"}])
    assert reports[0].error() is None
    md = admin_client(broker.bootstrap).list_topics(timeout=T)
    assert sorted(md.topics["auto-created"].partitions) == [0]
    assert records_of(broker.bootstrap, "auto-created", 1, 1)[0].value == b"hello"


def test_metadata_auto_creates_topics_with_num_partitions(start_broker):
    b = start_broker({"num.partitions": "3"})
    p = producer(b.bootstrap)
    reports = produce_all(p, "auto-created", [{"value": b"hello"}])
    assert reports[0].error() is None
    md = admin_client(b.bootstrap).list_topics(timeout=T)
    assert sorted(md.topics["auto-created"].partitions) == [0, 1, 2]
    r = records_of(b.bootstrap, "auto-created", 3, 1)
    assert r[0].value == b"hello"
    # A consumer's metadata request (allow_auto_topic_creation=false) creates nothing.
    c = consumer(b.bootstrap)
    try:
        md = c.list_topics("consumer-only", timeout=T)
        assert md.topics["consumer-only"].error is not None
    finally:
        c.close()
    assert "consumer-only" not in topic_names(admin_client(b.bootstrap))


def test_no_auto_create_when_disabled_and_logged_once_per_client(start_broker):
    b = start_broker({"auto.create.topics.enable": "false"})
    for client in ("client-a", "client-b"):
        p = producer(b.bootstrap, **{"client.id": client})
        for _ in range(3):
            md = p.list_topics("auto-created-not", timeout=T)
            assert md.topics["auto-created-not"].error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART
    assert "auto-created-not" not in topic_names(admin_client(b.bootstrap))
    lines = [ln for ln in b.stderr_tail(400).splitlines() if "'auto-created-not'" in ln]
    assert len(lines) == 2, lines
    assert all(" INFO " in ln and "auto.create.topics.enable=false" in ln for ln in lines)
    assert {"'client-a'", "'client-b'"} == {w for ln in lines for w in ln.split() if w.startswith("'client-")}


def test_dynamic_broker_default_applies_to_existing_topics(start_broker, topic_name):
    """A dynamic log.retention.bytes reaches partitions of topics created before it was set."""
    b = start_broker({"log.retention.check.interval.ms": "100"})
    bs = b.bootstrap
    admin = admin_client(bs)
    create_topic(bs, topic_name, 1, {"segment.bytes": "1024"})
    p = producer(bs, **{"linger.ms": 0})
    for i in range(20):  # one batch per produce call: many small segments
        produce_all(p, topic_name, [{"value": b"%04d" % i + b"." * 200}])
    c = consumer(bs)
    try:
        tp = TopicPartition(topic_name, 0)
        assert c.get_watermark_offsets(tp, timeout=T) == (0, 20)
        res = ConfigResource(ResourceType.BROKER, "0", incremental_configs=[
            ConfigEntry("log.retention.bytes", "2048", incremental_operation=AlterConfigOpType.SET)])
        admin.incremental_alter_configs([res], request_timeout=T)[res].result(timeout=T)
        low, high = wait_until("retention to delete old segments",
                               lambda: (w := c.get_watermark_offsets(tp, timeout=T))[0] > 0 and w, timeout_s=10)
        assert high == 20 and 10 <= low < 20
    finally:
        c.close()


def test_one_broker_describes_its_log_dir_and_refuses_reassignments_elsewhere(shared_broker, topic_name):
    from kafka import KafkaAdminClient
    from kafka import TopicPartition as KTopicPartition
    from kafka.errors import InvalidReplicationAssignmentError, NoReassignmentInProgressError

    create_topic(shared_broker.bootstrap, topic_name, partitions=2)
    p = producer(shared_broker.bootstrap)
    produce_all(p, topic_name, [{"value": b"v" * 100, "partition": 1}] * 10)
    admin = KafkaAdminClient(bootstrap_servers=shared_broker.bootstrap, request_timeout_ms=T * 1000)
    try:
        (described,) = admin.describe_log_dirs()
        (log_dir,) = described["log_dirs"]
        assert log_dir["error_code"] == 0 and log_dir["log_dir"] == str(shared_broker.data_dir.resolve())
        parts = {p["partition_index"]: p for t in log_dir["topics"] if t["name"] == topic_name
                 for p in t["partitions"]}
        assert sorted(parts) == [0, 1]
        assert parts[0]["partition_size"] == 0 and parts[1]["partition_size"] > 1000
        assert parts[1]["offset_lag"] == 0
        node = described["broker"]
        tp, other = KTopicPartition(topic_name, 0), KTopicPartition(topic_name, 1)
        assert admin.alter_partition_reassignments({tp: [node], other: [node + 1]}) == {
            tp: None, other: InvalidReplicationAssignmentError}
        assert admin.alter_partition_reassignments({tp: None}) == {tp: NoReassignmentInProgressError}
        assert admin.list_partition_reassignments() == {}
    finally:
        admin.close()


def test_group_config_sources_follow_the_broker_value(start_broker):
    """A group config without a group override reports where the broker's value comes from,
    as Kafka does: STATIC_BROKER_CONFIG when set in the broker's configuration, DEFAULT_CONFIG
    when not set, DYNAMIC_BROKER_CONFIG when set dynamically on the broker, GROUP_CONFIG when the
    group overrides it."""
    b = start_broker({"group.share.session.timeout.ms": "50000", "group.share.min.session.timeout.ms": "45000"})
    admin = admin_client(b.bootstrap)
    res = ConfigResource(ResourceType.GROUP, "sources")
    alter = ConfigResource(ResourceType.GROUP, "sources", incremental_configs=[
        ConfigEntry("share.delivery.count.limit", "4", incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([alter], request_timeout=T)[alter].result(timeout=T)
    cfg = admin.describe_configs([res], request_timeout=T)[res].result(timeout=T)
    assert (cfg["share.session.timeout.ms"].value, int(cfg["share.session.timeout.ms"].source)) == ("50000", 4)
    assert (cfg["share.record.lock.duration.ms"].value, int(cfg["share.record.lock.duration.ms"].source)) == ("30000", 5)
    assert (cfg["share.delivery.count.limit"].value, int(cfg["share.delivery.count.limit"].source)) == ("4", 8)
