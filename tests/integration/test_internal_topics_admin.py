"""The internal topics' records are the coordinators' state: admin requests cannot delete them.

DeleteRecords on an internal topic is refused with INVALID_TOPIC_EXCEPTION (Kafka's
ReplicaManager.deleteRecords); a config change that would make the broker delete their
records (cleanup.policy, retention.ms, retention.bytes) is refused with POLICY_VIOLATION.
"""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType
from kafka.admin import ConfigResource as KPConfigResource
from kafka.admin import ConfigResourceType, KafkaAdminClient
from kafka import TopicPartition as KPTopicPartition
from kafka.errors import InvalidTopicError

from tests.support.clients import admin_client, consumer, create_topic, produce_all, producer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

T = 15
INTERNAL = ("__consumer_offsets", "__share_group_state")


def _error(future) -> KafkaError:
    with pytest.raises(KafkaException) as info:
        future.result(timeout=T)
    return info.value.args[0]


def _configs(admin, name: str) -> dict[str, str]:
    res = ConfigResource(ResourceType.TOPIC, name)
    return {k: e.value for k, e in admin.describe_configs([res], request_timeout=T)[res].result(timeout=T).items()}


def _committed(bootstrap: str, group: str, topic: str) -> int:
    c = consumer(bootstrap, **{"group.id": group})
    try:
        (tp,) = c.committed([TopicPartition(topic, 0)], timeout=T)
        return tp.offset
    finally:
        c.close()


def test_delete_records_on_internal_topics_is_refused_and_offsets_survive_a_restart(broker, topic_name):
    bs = broker.bootstrap
    create_topic(bs, topic_name, 1)
    produce_all(producer(bs), topic_name, [{"value": b"v%d" % i} for i in range(5)])
    c = consumer(bs, **{"group.id": "keeper"})
    try:
        c.commit(offsets=[TopicPartition(topic_name, 0, 4)], asynchronous=False)
    finally:
        c.close()
    assert _committed(bs, "keeper", topic_name) == 4

    admin = admin_client(bs)
    for name in INTERNAL:
        parts = sorted(admin.list_topics(name, timeout=T).topics[name].partitions)[:3]
        futures = admin.delete_records([TopicPartition(name, p, -1) for p in parts], request_timeout=T)
        for tp, fut in futures.items():
            assert _error(fut).code() == KafkaError.TOPIC_EXCEPTION, (name, tp.partition)
        low = consumer(bs).get_watermark_offsets(TopicPartition(name, 0), timeout=T)[0]
        assert low == 0
    kp = KafkaAdminClient(bootstrap_servers=bs, request_timeout_ms=T * 1000)
    try:
        with pytest.raises(InvalidTopicError):
            kp.delete_records({KPTopicPartition("__consumer_offsets", 0): -1})
    finally:
        kp.close()

    broker.restart()
    assert _committed(broker.bootstrap, "keeper", topic_name) == 4


def test_retention_and_cleanup_policy_of_internal_topics_cannot_be_changed(broker):
    bs = broker.bootstrap
    admin = admin_client(bs)
    before = {name: _configs(admin, name) for name in INTERNAL}
    for name in INTERNAL:
        other_policy = "compact" if before[name]["cleanup.policy"] == "delete" else "delete"
        for key, value in (("retention.ms", "1"), ("retention.bytes", "1"), ("cleanup.policy", other_policy),
                           ("cleanup.policy", "compact,delete")):
            res = ConfigResource(ResourceType.TOPIC, name, incremental_configs=[
                ConfigEntry(key, value, incremental_operation=AlterConfigOpType.SET)])
            err = _error(admin.incremental_alter_configs([res], request_timeout=T)[res])
            assert err.code() == KafkaError.POLICY_VIOLATION, (name, key, value, err)
    # deleting the share-state topic's retention.ms=-1 override would bring back the broker default
    res = ConfigResource(ResourceType.TOPIC, "__share_group_state", incremental_configs=[
        ConfigEntry("retention.ms", None, incremental_operation=AlterConfigOpType.DELETE)])
    assert _error(admin.incremental_alter_configs([res], request_timeout=T)[res]).code() == \
        KafkaError.POLICY_VIOLATION
    # other configs of an internal topic may change
    res = ConfigResource(ResourceType.TOPIC, "__consumer_offsets", incremental_configs=[
        ConfigEntry("segment.ms", "3600000", incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([res], request_timeout=T)[res].result(timeout=T)

    # AlterConfigs replaces the whole set: one without cleanup.policy/retention.ms changes them
    for name in INTERNAL:
        res = ConfigResource(ResourceType.TOPIC, name, set_config={"segment.ms": "3600000"})
        assert _error(admin.alter_configs([res], request_timeout=T)[res]).code() == KafkaError.POLICY_VIOLATION
    kp = KafkaAdminClient(bootstrap_servers=bs, request_timeout_ms=T * 1000)
    try:
        for name in INTERNAL:  # kafka-python's AlterConfigs keeps the other overrides, sets retention.ms
            result = kp.alter_configs([KPConfigResource(ConfigResourceType.TOPIC, name,
                                                        configs={"retention.ms": "1"})], incremental=False)
            assert "PolicyViolation" in repr(result), result
    finally:
        kp.close()
    after = {name: _configs(admin, name) for name in INTERNAL}
    for name in INTERNAL:
        for key in ("cleanup.policy", "retention.ms", "retention.bytes"):
            assert after[name][key] == before[name][key], (name, key)
    assert after["__consumer_offsets"]["cleanup.policy"] == "compact"
    assert after["__share_group_state"]["retention.ms"] == "-1"


def test_other_topics_keep_their_configs_and_records_adjustable(broker, topic_name):
    bs = broker.bootstrap
    admin = admin_client(bs)
    create_topic(bs, topic_name, 1)
    res = ConfigResource(ResourceType.TOPIC, topic_name, incremental_configs=[
        ConfigEntry("retention.ms", "1000", incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([res], request_timeout=T)[res].result(timeout=T)
    assert _configs(admin, topic_name)["retention.ms"] == "1000"
