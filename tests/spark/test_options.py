"""Option parsing of the ``shoal`` data source, as Spark's Kafka connector defines the options (no Spark session)."""

from __future__ import annotations

import pytest

from shoal.spark.options import check_batch_options, check_stream_options, parse_options

BS = {"kafka.bootstrap.servers": "127.0.0.1:9092", "subscribe": "t"}


@pytest.mark.parametrize("key", ["kafka.auto.offset.reset", "kafka.key.deserializer", "kafka.value.deserializer",
                                 "kafka.key.serializer", "kafka.value.serializer", "kafka.enable.auto.commit",
                                 "kafka.interceptor.classes"])
def test_kafka_options_spark_forbids_are_refused(key: str) -> None:
    with pytest.raises(ValueError, match=f"'{key}' is not supported"):
        parse_options({**BS, key: "x"})


def test_other_kafka_options_pass_to_the_client() -> None:
    opts = parse_options({**BS, "kafka.fetch.max.bytes": "1000", "kafka.group.id": "g"})
    assert dict(opts.kafka_conf) == {"fetch.max.bytes": "1000", "group.id": "g"}


def test_offsets_by_timestamp_and_strategy() -> None:
    opts = parse_options({**BS, "startingOffsetsByTimestamp": '{"t": {"0": 1000, "1": 2000}}',
                          "endingOffsetsByTimestamp": '{"t": {"0": 5000, "1": 6000}}',
                          "startingOffsetsByTimestampStrategy": "LATEST"})
    assert opts.starting_offsets_by_timestamp == {"t": {0: 1000, 1: 2000}}
    assert opts.ending_offsets_by_timestamp == {"t": {0: 5000, 1: 6000}}
    assert opts.starting_timestamp_strategy == "latest"
    assert parse_options(BS).starting_timestamp_strategy == "error"
    with pytest.raises(ValueError, match="startingOffsetsByTimestampStrategy"):
        parse_options({**BS, "startingOffsetsByTimestampStrategy": "earliest"})
    with pytest.raises(ValueError, match="startingOffsetsByTimestamp must be JSON"):
        parse_options({**BS, "startingOffsetsByTimestamp": "[1, 2]"})


def test_trigger_bounds() -> None:
    opts = parse_options({**BS, "minOffsetsPerTrigger": "100", "maxTriggerDelay": "30s"})
    assert (opts.min_offsets_per_trigger, opts.max_trigger_delay_ms) == (100, 30_000)
    assert parse_options(BS).max_trigger_delay_ms == 15 * 60_000
    assert parse_options({**BS, "maxTriggerDelay": "250ms"}).max_trigger_delay_ms == 250
    with pytest.raises(ValueError, match="not a duration"):
        parse_options({**BS, "maxTriggerDelay": "soon"})
    with pytest.raises(ValueError, match="minOffsetsPerTrigger cannot be larger"):
        parse_options({**BS, "minOffsetsPerTrigger": "100", "maxOffsetsPerTrigger": "10"})


def test_batch_and_stream_rules() -> None:
    with pytest.raises(ValueError, match="startingOffsets cannot be latest"):
        check_batch_options(parse_options({**BS, "startingOffsets": "latest"}))
    with pytest.raises(ValueError, match="cannot hold -1"):
        check_batch_options(parse_options({**BS, "startingOffsets": '{"t": {"0": -1}}'}))
    with pytest.raises(ValueError, match="cannot hold -2"):
        check_batch_options(parse_options({**BS, "endingOffsets": '{"t": {"0": -2}}'}))
    check_batch_options(parse_options({**BS, "startingOffsets": "earliest", "endingOffsets": "latest"}))
    for key, value in [("endingOffsets", "latest"), ("endingTimestamp", "1000"),
                       ("endingOffsetsByTimestamp", '{"t": {"0": 1}}')]:
        with pytest.raises(ValueError, match=f"{key} is not valid in a streaming query"):
            check_stream_options(parse_options({**BS, key: value}))
    check_stream_options(parse_options({**BS, "startingOffsets": "latest"}))


def test_isolation_level_is_spark_connectors() -> None:
    from shoal.spark.kafka import consumer_conf, producer_conf

    # read_uncommitted unless asked, as Spark's connector (librdkafka alone would read committed)
    assert consumer_conf(parse_options(BS))["isolation.level"] == "read_uncommitted"
    committed = parse_options({**BS, "kafka.isolation.level": "read_committed"})
    assert consumer_conf(committed)["isolation.level"] == "read_committed"
    assert "isolation.level" not in producer_conf(committed)  # a consumer setting only
    with pytest.raises(ValueError, match="must be read_uncommitted or read_committed"):
        parse_options({**BS, "kafka.isolation.level": "committed"})
    # a share group's isolation is its group config, as for Kafka's share consumer
    with pytest.raises(ValueError, match="share.isolation.level"):
        parse_options({**BS, "shareGroup": "g", "kafka.isolation.level": "read_committed"})


def test_sink_refuses_a_transactional_id() -> None:
    from pyspark.sql.types import StringType, StructField, StructType

    from shoal.spark.sink import ShoalStreamWriter, ShoalWriter

    schema = StructType([StructField("value", StringType())])
    opts = parse_options({**BS, "topic": "t", "kafka.transactional.id": "tx"})
    for make in (lambda: ShoalWriter(opts, schema), lambda: ShoalStreamWriter(opts, schema)):
        with pytest.raises(ValueError, match="transactional.id is not supported: the sink writes at-least-once"):
            make()
    ShoalWriter(parse_options({**BS, "topic": "t"}), schema)
