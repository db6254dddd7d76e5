"""Batch and offset-based streaming reads, and the sink, against a real broker."""

from __future__ import annotations

import datetime
import json
import time
from pathlib import Path

import pytest

from tests.support.clients import create_topic, produce_all, producer, records_of
from tests.support.transactions import write_transactions

pytestmark = pytest.mark.spark

BASE_TS = 1_700_000_000_000


def _fill(bootstrap: str, topic: str, n: int, partitions: int = 1, start: int = 0) -> None:
    p = producer(bootstrap)
    produce_all(p, topic, ({"key": b"k%d" % i, "value": b"v%d" % i, "partition": i % partitions,
                            "headers": [("h", b"%d" % i), ("empty", None)], "timestamp": BASE_TS + i * 1000}
                           for i in range(start, start + n)))


def _reader(spark, bootstrap: str, topic: str, **opts):  # type: ignore[no-untyped-def]
    r = spark.read.format("shoal").option("kafka.bootstrap.servers", bootstrap).option("subscribe", topic)
    for k, v in opts.items():
        r = r.option(k, v)
    return r.load()


def test_batch_read_is_exact(spark, spark_broker, topic_name) -> None:  # type: ignore[no-untyped-def]
    bs = spark_broker.bootstrap
    create_topic(bs, topic_name, partitions=3)
    _fill(bs, topic_name, 3000, partitions=3)
    df = _reader(spark, bs, topic_name, includeHeaders="true")
    assert df.columns == ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType", "headers"]
    rows = df.collect()
    assert len(rows) == 3000
    got = {(r.partition, r.offset): r for r in rows}
    assert len(got) == 3000
    for r in rows:
        i = int(r.value[1:])
        assert r.key == b"k%d" % i and r.topic == topic_name and r.partition == i % 3
        assert r.offset == i // 3
        assert r.timestampType == 0
        assert r.timestamp == datetime.datetime.fromtimestamp((BASE_TS + i * 1000) / 1000, datetime.UTC) \
            .replace(tzinfo=None)
        assert [(h.key, h.value) for h in r.headers] == [("h", b"%d" % i), ("empty", None)]
    # without includeHeaders there is no headers column
    assert "headers" not in _reader(spark, bs, topic_name).columns


def test_offset_and_timestamp_ranges(spark, spark_broker, topic_name) -> None:  # type: ignore[no-untyped-def]
    bs = spark_broker.bootstrap
    create_topic(bs, topic_name, partitions=2)
    _fill(bs, topic_name, 200, partitions=2)  # partition p holds i = 2*offset + p
    df = _reader(spark, bs, topic_name, startingOffsets=json.dumps({topic_name: {"0": 10, "1": -2}}),
                 endingOffsets=json.dumps({topic_name: {"0": 20, "1": 5}}))
    got = sorted((r.partition, r.offset) for r in df.select("partition", "offset").collect())
    assert got == [(0, o) for o in range(10, 20)] + [(1, o) for o in range(0, 5)]

    # timestamps: record i has BASE_TS + i s; [i=40, i=60) -> offsets 20..29 of each partition
    df = _reader(spark, bs, topic_name, startingTimestamp=str(BASE_TS + 40_000), endingTimestamp=str(BASE_TS + 60_000))
    got = sorted((r.partition, r.offset) for r in df.select("partition", "offset").collect())
    assert got == [(p, o) for p in (0, 1) for o in range(20, 30)]

    # assign a subset of partitions
    df = spark.read.format("shoal").option("bootstrap.servers", bs) \
        .option("assign", json.dumps({topic_name: [1]})).load()
    assert {r.partition for r in df.select("partition").collect()} == {1}
    assert df.count() == 100


def test_filters_are_pushed_down(spark, spark_broker, topic_name) -> None:  # type: ignore[no-untyped-def]
    bs = spark_broker.bootstrap
    create_topic(bs, topic_name, partitions=2)
    _fill(bs, topic_name, 400, partitions=2)
    df = _reader(spark, bs, topic_name).where("partition = 1 and offset >= 50 and offset < 60")
    plan = df._jdf.queryExecution().executedPlan().toString()
    assert sorted(r.offset for r in df.collect()) == list(range(50, 60))
    # the pushed filters left no Filter node for partition/offset above the scan
    assert "partition" not in plan.split("BatchEvalPython")[0].split("Filter")[-1] or "Filter" not in plan
    lo = datetime.datetime.fromtimestamp((BASE_TS + 100_000) / 1000, datetime.UTC).replace(tzinfo=None)
    df = _reader(spark, bs, topic_name).where(f"timestamp >= timestamp'{lo.isoformat(sep=' ')}'")
    assert df.count() == 300


def test_min_partitions_splits_one_partition(spark, spark_broker, topic_name) -> None:  # type: ignore[no-untyped-def]
    bs = spark_broker.bootstrap
    create_topic(bs, topic_name, partitions=1)
    _fill(bs, topic_name, 1000)
    df = _reader(spark, bs, topic_name, minPartitions="4")
    assert df.rdd.getNumPartitions() == 4
    sizes = df.rdd.glom().map(len).collect()
    assert sorted(sizes) == [250, 250, 250, 250]
    assert sorted(r.offset for r in df.select("offset").collect()) == list(range(1000))


def test_streaming_restart_loses_and_repeats_nothing(spark, spark_broker, topic_name,  # type: ignore[no-untyped-def]
                                                      tmp_path: Path) -> None:
    bs = spark_broker.bootstrap
    create_topic(bs, topic_name, partitions=2)
    _fill(bs, topic_name, 500, partitions=2)
    out, cp = str(tmp_path / "out"), str(tmp_path / "cp")

    def run_until(n: int) -> None:
        df = spark.readStream.format("shoal").option("kafka.bootstrap.servers", bs).option("subscribe", topic_name) \
            .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "120").load()
        q = df.select("partition", "offset", "value").writeStream.format("parquet").option("path", out) \
            .option("checkpointLocation", cp).trigger(processingTime="200 milliseconds").start()
        try:
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline:
                q.processAllAvailable() if n < 0 else time.sleep(0.3)
                rows = [p for p in q.recentProgress if p["numInputRows"]]
                assert all(p["numInputRows"] <= 120 for p in rows)
                if n < 0 or sum(p["numInputRows"] for p in q.recentProgress) >= n:
                    break
        finally:
            q.stop()

    run_until(200)  # stopped part way through
    _fill(bs, topic_name, 300, partitions=2, start=500)
    run_until(-1)  # restarted from the checkpoint, to the end
    got = spark.read.parquet(out).collect()
    assert len(got) == 800
    assert sorted(int(r.value[1:]) for r in got) == list(range(800))


def test_available_now_and_new_partitions(spark, spark_broker, topic_name, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from confluent_kafka.admin import NewPartitions

    from tests.support.clients import admin_client

    bs = spark_broker.bootstrap
    create_topic(bs, topic_name, partitions=1)
    _fill(bs, topic_name, 100)
    out, cp = str(tmp_path / "out"), str(tmp_path / "cp")

    def once() -> None:
        df = spark.readStream.format("shoal").option("kafka.bootstrap.servers", bs).option("subscribe", topic_name) \
            .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "30").load()
        q = df.select("partition", "offset", "value").writeStream.format("parquet").option("path", out) \
            .option("checkpointLocation", cp).trigger(availableNow=True).start()
        assert q.awaitTermination(120)
        assert all(p["numInputRows"] <= 30 for p in q.recentProgress)

    once()
    assert spark.read.parquet(out).count() == 100
    admin = admin_client(bs)
    admin.create_partitions([NewPartitions(topic_name, 2)])[topic_name].result(15)
    _fill(bs, topic_name, 40, partitions=2, start=100)
    once()
    got = spark.read.parquet(out).collect()
    assert sorted(int(r.value[1:]) for r in got) == list(range(140))
    assert {r.partition for r in got} == {0, 1}


def test_sink_batch_and_streaming(spark, spark_broker, topic_name, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from pyspark.sql import Row

    bs = spark_broker.bootstrap
    create_topic(bs, topic_name, partitions=2)
    rows = [Row(key=f"k{i}", value=b"v%d" % i, partition=i % 2,
                headers=[Row(key="h", value=b"%d" % i)]) for i in range(500)]
    schema = "key string, value binary, partition int, headers array<struct<key:string,value:binary>>"
    spark.createDataFrame(rows, schema).repartition(3).write.mode("append").format("shoal") \
        .option("kafka.bootstrap.servers", bs).option("topic", topic_name).save()
    got = records_of(bs, topic_name, 2, 500)
    assert sorted((r.partition, r.key, r.value, tuple(r.headers)) for r in got) == \
        sorted((i % 2, b"k%d" % i, b"v%d" % i, (("h", b"%d" % i),)) for i in range(500))

    # streaming: copy the topic into another one, with a topic column
    dst = topic_name + "-copy"
    create_topic(bs, dst, partitions=1)
    src = spark.readStream.format("shoal").option("kafka.bootstrap.servers", bs).option("subscribe", topic_name) \
        .option("startingOffsets", "earliest").option("includeHeaders", "true").load()
    q = src.selectExpr("key", "value", "headers", f"'{dst}' as topic").writeStream.format("shoal") \
        .option("kafka.bootstrap.servers", bs).option("checkpointLocation", str(tmp_path / "cp")) \
        .trigger(availableNow=True).start()
    assert q.awaitTermination(120)
    copied = records_of(bs, dst, 1, 500)
    assert sorted((r.key, r.value, tuple(r.headers)) for r in copied) == \
        sorted((b"k%d" % i, b"v%d" % i, (("h", b"%d" % i),)) for i in range(500))


def test_empty_ranges_read_as_empty(spark, spark_broker, topic_name, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    bs = spark_broker.bootstrap
    create_topic(bs, topic_name, partitions=2)
    # an idle topic, and a topic with records read from its end: no partition has anything to read
    assert _reader(spark, bs, topic_name).count() == 0
    _fill(bs, topic_name, 10, partitions=2)
    at_the_end = json.dumps({topic_name: {"0": 5, "1": 5}})
    assert _reader(spark, bs, topic_name, startingOffsets=at_the_end, endingOffsets=at_the_end).count() == 0
    assert _reader(spark, bs, topic_name).count() == 10


def test_sink_refuses_what_spark_kafka_sink_refuses(spark, spark_broker, topic_name) -> None:  # type: ignore[no-untyped-def]
    bs = spark_broker.bootstrap
    create_topic(bs, topic_name, partitions=1)

    def write(df, mode: str = "append") -> None:  # type: ignore[no-untyped-def]
        df.write.mode(mode).format("shoal").option("kafka.bootstrap.servers", bs).option("topic", topic_name).save()

    for schema, rows, message in [
        ("value int", [(7,)], "value column type must be string or binary"),
        ("key long, value string", [(1, "a")], "key column type must be string or binary"),
        ("value string, partition string", [("a", "0")], "partition column type must be int"),
        ("key string", [("a",)], "needs a value column"),
    ]:
        with pytest.raises(Exception, match=message):
            write(spark.createDataFrame(rows, schema))
    with pytest.raises(Exception, match="overwrite is not allowed"):
        write(spark.createDataFrame([("a",)], "value string"), mode="overwrite")
    write(spark.createDataFrame([("ok",)], "value string"))
    # nothing refused reached the topic
    assert [r.value for r in records_of(bs, topic_name, 1, 1)] == [b"ok"]


def test_offsets_by_timestamp_and_spark_errors(spark, spark_broker, topic_name) -> None:  # type: ignore[no-untyped-def]
    bs = spark_broker.bootstrap
    create_topic(bs, topic_name, partitions=2)
    _fill(bs, topic_name, 200, partitions=2)  # record i: partition i % 2, offset i // 2, time BASE_TS + i s

    def offsets(**opts) -> list[tuple[int, int]]:  # type: ignore[no-untyped-def]
        return sorted((r.partition, r.offset) for r in _reader(spark, bs, topic_name, **opts)
                      .select("partition", "offset").collect())

    # per-partition timestamps: partition 0 from i=40 (offset 20), partition 1 from i=81 (offset 40);
    # partition 0 up to i=60 (offset 30), partition 1 to the end (no record after its timestamp)
    got = offsets(startingOffsetsByTimestamp=json.dumps({topic_name: {"0": BASE_TS + 40_000, "1": BASE_TS + 81_000}}),
                  endingOffsetsByTimestamp=json.dumps({topic_name: {"0": BASE_TS + 60_000, "1": BASE_TS + 10**9}}))
    assert got == [(0, o) for o in range(20, 30)] + [(1, o) for o in range(40, 100)]
    # no record at or after the starting timestamp: an error by default, the latest offset on request
    late = json.dumps({topic_name: {"0": BASE_TS + 10**9, "1": BASE_TS}})
    with pytest.raises(Exception, match="no record of .* at or after timestamp"):
        offsets(startingOffsetsByTimestamp=late)
    assert offsets(startingOffsetsByTimestamp=late, startingOffsetsByTimestampStrategy="latest") == \
        [(1, o) for o in range(100)]
    # specific offsets name every partition, and none past the end
    with pytest.raises(Exception, match="must give every partition"):
        offsets(startingOffsets=json.dumps({topic_name: {"0": 5}}))
    with pytest.raises(Exception, match="past its latest offset"):
        offsets(endingOffsets=json.dumps({topic_name: {"0": 500, "1": -1}}))
    with pytest.raises(Exception, match="startingOffsets cannot be latest"):
        offsets(startingOffsets="latest")
    with pytest.raises(Exception, match="endingOffsets is not valid in a streaming query"):
        spark.readStream.format("shoal").option("kafka.bootstrap.servers", bs).option("subscribe", topic_name) \
            .option("endingOffsets", "latest").load().writeStream.format("console").start().awaitTermination(30)


def test_min_offsets_per_trigger_and_a_recreated_topic(spark, spark_broker, topic_name,  # type: ignore[no-untyped-def]
                                                      tmp_path: Path) -> None:
    from confluent_kafka.admin import AdminClient

    bs = spark_broker.bootstrap
    create_topic(bs, topic_name, partitions=1)
    out, cp = str(tmp_path / "out"), str(tmp_path / "cp")

    def start(**opts):  # type: ignore[no-untyped-def]
        r = spark.readStream.format("shoal").option("kafka.bootstrap.servers", bs).option("subscribe", topic_name) \
            .option("startingOffsets", "earliest")
        for k, v in opts.items():
            r = r.option(k, v)
        return r.load().writeStream.format("parquet").option("path", out).option("checkpointLocation", cp) \
            .trigger(processingTime="500 milliseconds").start()

    def rows() -> int:
        try:
            return spark.read.parquet(out).count()
        except Exception:
            return 0

    q = start(minOffsetsPerTrigger="100", maxTriggerDelay="6s")
    try:
        _fill(bs, topic_name, 60)
        time.sleep(3)
        assert rows() == 0  # fewer than 100 new records, and the delay has not passed
        _fill(bs, topic_name, 60, start=60)
        deadline = time.monotonic() + 60
        while rows() < 120 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert rows() == 120
    finally:
        q.stop()
    # the topic is deleted and created again: its offsets start over, below the checkpoint's
    admin = AdminClient({"bootstrap.servers": bs})
    admin.delete_topics([topic_name])[topic_name].result(30)
    deadline = time.monotonic() + 30
    while True:
        try:
            create_topic(bs, topic_name, partitions=1)
            break
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    _fill(bs, topic_name, 10)
    q = start()
    try:
        with pytest.raises(Exception, match="failOnDataLoss=false"):
            q.awaitTermination(60)
    finally:
        q.stop()
    q = start(failOnDataLoss="false")
    try:
        deadline = time.monotonic() + 60
        while rows() < 130 and time.monotonic() < deadline:
            assert q.exception() is None, q.exception()
            time.sleep(0.5)
        assert rows() == 130
    finally:
        q.stop()


def test_read_committed_leaves_out_aborted_and_open_transactions(spark, spark_broker, topic_name,  # type: ignore[no-untyped-def]
                                                                 tmp_path: Path) -> None:
    bs = spark_broker.bootstrap
    create_topic(bs, topic_name, partitions=2)
    # committed and aborted transactions (markers between them), and one left open at the end
    data = write_transactions(bs, topic_name, "tx-" + topic_name, leave_open=4)
    committed = {"kafka.isolation.level": "read_committed"}

    # batch: by default (read_uncommitted, as Spark's connector) every data record, never a marker
    everything = _reader(spark, bs, topic_name).select("partition", "offset", "value").collect()
    assert sorted(r.value for r in everything) == sorted(data.committed + data.aborted + data.open)
    where = {r.value: (r.partition, r.offset) for r in everything}
    # read_committed: exactly the committed records, at their offsets, also in ranges split by minPartitions
    rows = _reader(spark, bs, topic_name, minPartitions="5", **committed) \
        .select("partition", "offset", "value").collect()
    assert sorted((r.value, (r.partition, r.offset)) for r in rows) == sorted((v, where[v]) for v in data.committed)

    def stream(name: str, **opts: str) -> list:  # type: ignore[type-arg]
        r = spark.readStream.format("shoal").option("kafka.bootstrap.servers", bs).option("subscribe", topic_name) \
            .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "15")
        for k, v in opts.items():
            r = r.option(k, v)
        q = r.load().select("partition", "offset", "value").writeStream.format("parquet") \
            .option("path", str(tmp_path / name)).option("checkpointLocation", str(tmp_path / (name + "-cp"))) \
            .trigger(availableNow=True).start()
        assert q.awaitTermination(120), "the availableNow run did not finish"
        assert q.exception() is None, q.exception()
        assert all(p["numInputRows"] <= 15 for p in q.recentProgress)
        return spark.read.parquet(str(tmp_path / name)).collect()

    # streams: micro-batch ranges of 15 offsets cut through markers and aborted records
    got = stream("committed", **committed)
    assert sorted((r.value, (r.partition, r.offset)) for r in got) == sorted((v, where[v]) for v in data.committed)
    got = stream("all")
    assert sorted(r.value for r in got) == sorted(data.committed + data.aborted + data.open)
    # the open transaction commits: the read_committed stream goes on past it from its checkpoint
    opened = data.open
    data.commit_open()
    got = stream("committed", **committed)
    assert sorted(r.value for r in got) == sorted(data.committed)
    assert set(opened) <= {r.value for r in got}
