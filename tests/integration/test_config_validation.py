"""Config values outside Kafka's ranges are refused with a message naming the range; topic
``compression.type`` recompresses what producers send.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic, ResourceType

from shoal.protocol.batch import Compression, iter_batches
from tests.support.broker import BrokerProcess
from tests.support.clients import admin_client, create_topic, produce_all, producer, records_of

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

T = 15


def refusal(future) -> KafkaError:
    with pytest.raises(KafkaException) as info:
        future.result(timeout=T)
    return info.value.args[0]


@pytest.mark.parametrize("key,value,range_text", [
    ("retention.ms", "-5", "at least -1"),
    ("segment.ms", "0", "at least 1"),
    ("flush.messages", "0", "at least 1"),
    ("max.message.bytes", "-1", "at least 0"),
    ("cleanup.policy", "shred", "compact"),
    ("compression.type", "brotli", "zstd"),
])
def test_out_of_range_topic_configs_are_refused_everywhere(shared_broker, topic_name, key, value, range_text):
    bs = shared_broker.bootstrap
    admin = admin_client(bs)
    err = refusal(admin.create_topics([NewTopic(topic_name, 1, 1, config={key: value})], request_timeout=T)[topic_name])
    assert err.code() == KafkaError.INVALID_CONFIG
    assert range_text in err.str() and key in err.str()
    assert topic_name not in admin.list_topics(timeout=T).topics

    create_topic(bs, topic_name, 1)
    res = ConfigResource(ResourceType.TOPIC, topic_name, incremental_configs=[
        ConfigEntry(key, value, incremental_operation=AlterConfigOpType.SET)])
    err = refusal(admin.incremental_alter_configs([res], request_timeout=T)[res])
    assert err.code() == KafkaError.INVALID_CONFIG and range_text in err.str()

    res = ConfigResource(ResourceType.TOPIC, topic_name, set_config={key: value})
    err = refusal(admin.alter_configs([res], request_timeout=T)[res])
    assert err.code() == KafkaError.INVALID_CONFIG and range_text in err.str()


def test_retention_ms_minus_one_is_accepted(shared_broker, topic_name):
    create_topic(shared_broker.bootstrap, topic_name, 1, {"retention.ms": "-1"})


@pytest.mark.parametrize("key,value,range_text", [
    ("log.retention.ms", "-5", "at least -1"),
    ("group.share.delivery.count.limit", "11", "between 2 and 10"),
    ("group.share.record.lock.duration.ms", "999", "between 1000 and 3600000"),
])
def test_out_of_range_broker_configs_stop_the_start(tmp_path: Path, key, value, range_text):
    b = BrokerProcess(tmp_path / "data", {key: value})
    with pytest.raises(Exception, match="did not report readiness"):
        b.start()
    tail = b.stderr_tail()
    assert key in tail and range_text in tail
    assert not b.is_alive()


@pytest.mark.parametrize("compression_type,codec", [("zstd", Compression.ZSTD), ("gzip", Compression.GZIP),
                                                    ("uncompressed", Compression.NONE)])
def test_topic_compression_type_recompresses_stored_batches(broker, topic_name, compression_type, codec):
    bs = broker.bootstrap
    create_topic(bs, topic_name, 1, {"compression.type": compression_type})
    admin = admin_client(bs)
    res = ConfigResource(ResourceType.TOPIC, topic_name)
    described = admin.describe_configs([res], request_timeout=T)[res].result(timeout=T)
    assert described["compression.type"].value == compression_type and not described["compression.type"].is_default
    source = "none" if codec != Compression.NONE else "lz4"
    values = [b"value-%d" % i * 10 for i in range(50)]
    produce_all(producer(bs, **{"compression.codec": source}), topic_name, [{"value": v} for v in values])
    assert [r.value for r in records_of(bs, topic_name, [0], len(values))] == values
    segment = broker.data_dir / f"{topic_name}-0" / ("0" * 20 + ".log")
    data = segment.read_bytes()
    headers = list(iter_batches(data))
    assert headers and {h.compression for h in headers} == {codec}
