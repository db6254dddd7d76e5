"""The share-group source: more tasks than partitions, exactly once without failures, retries."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tests.support.clients import create_topic, produce_all, producer

pytestmark = pytest.mark.spark


def _fill(bootstrap: str, topic: str, n: int, start: int = 0) -> None:
    produce_all(producer(bootstrap), topic, ({"key": b"k%d" % i, "value": b"%d" % i} for i in range(start, start + n)))


def _share_stream(spark, bs: str, topic: str, group: str, state_dir: str, tasks: int = 4):  # type: ignore[no-untyped-def]
    return (spark.readStream.format("shoal").option("kafka.bootstrap.servers", bs).option("subscribe", topic)
            .option("shareGroup", group).option("numTasks", str(tasks)).option("startingOffsets", "earliest")
            .option("maxRecordsPerTask", "100").option("maxWaitMs", "200").option("stateDir", state_dir).load())


def _run_until(spark, q, path: str, n: int, timeout_s: float = 90.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if q.exception() is not None:
            raise AssertionError(f"query failed: {q.exception()}")
        try:
            if spark.read.parquet(path).count() >= n:
                return
        except Exception:  # no file yet
            pass
        time.sleep(1.0)
    raise AssertionError(f"fewer than {n} rows in {path} after {timeout_s}s")


def test_four_tasks_on_one_partition_exactly_once(spark, spark_broker, topic_name, state_dir,  # type: ignore[no-untyped-def]
                                                  tmp_path: Path) -> None:
    bs = spark_broker.bootstrap
    create_topic(bs, topic_name, partitions=1)
    _fill(bs, topic_name, 1500)
    out = str(tmp_path / "out")
    df = _share_stream(spark, bs, topic_name, "g-" + topic_name, state_dir)
    q = df.writeStream.format("parquet").option("path", out).option("checkpointLocation", str(tmp_path / "cp")) \
        .start()
    try:
        _run_until(spark, q, out, 1500)
        tasks_with_rows = max(p["numInputRows"] for p in q.recentProgress)
        _fill(bs, topic_name, 500, start=1500)  # arriving while the query runs
        _run_until(spark, q, out, 2000)
        time.sleep(3)  # a few more (empty) batches: nothing comes back
    finally:
        q.stop()
    rows = spark.read.parquet(out).collect()
    assert sorted(int(r.value) for r in rows) == list(range(2000))  # each exactly once
    assert {r.deliveryCount for r in rows} == {1}
    assert {(r.topic, r.partition) for r in rows} == {(topic_name, 0)}
    assert tasks_with_rows > 100  # a micro-batch drew on more than one task's quota
    assert all(int(r.offset) == int(r.value) for r in rows)

    # a new query on the same group after a clean stop: the group has nothing left to give
    out2 = str(tmp_path / "out2")
    q = _share_stream(spark, bs, topic_name, "g-" + topic_name, state_dir).writeStream.format("parquet") \
        .option("path", out2).option("checkpointLocation", str(tmp_path / "cp2")).start()
    try:
        _fill(bs, topic_name, 100, start=2000)
        _run_until(spark, q, out2, 100)
        time.sleep(3)
    finally:
        q.stop()
    again = spark.read.parquet(out2).collect()
    assert sorted(int(r.value) for r in again) == list(range(2000, 2100))


def test_killed_task_records_are_redelivered(spark, spark_broker, topic_name, state_dir,  # type: ignore[no-untyped-def]
                                             tmp_path: Path) -> None:
    from pyspark.sql.functions import col, udf

    bs = spark_broker.bootstrap
    create_topic(bs, topic_name, partitions=1)
    _fill(bs, topic_name, 400)
    marker = str(tmp_path / "killed-once")

    @udf("long")
    def parse(v: bytes) -> int:
        n = int(v)
        if n == 7 and not os.path.exists(marker):
            open(marker, "w").close()
            os._exit(1)  # the Python worker dies in the middle of the task
        return n

    out = str(tmp_path / "out")
    df = _share_stream(spark, bs, topic_name, "g-" + topic_name, state_dir).withColumn("n", parse(col("value")))
    q = df.writeStream.format("parquet").option("path", out).option("checkpointLocation", str(tmp_path / "cp")) \
        .start()
    try:
        _run_until(spark, q, out, 400, timeout_s=120)
        time.sleep(2)
    finally:
        q.stop()
    assert os.path.exists(marker)
    rows = spark.read.parquet(out).collect()
    assert sorted(set(r.n for r in rows)) == list(range(400))  # at least once
    assert len(rows) == 400  # the failed attempt's output was never committed
    seven = [r for r in rows if r.n == 7]
    assert seven[0].deliveryCount >= 2  # it came back after the task died


def test_release_on_request(spark, spark_broker, topic_name, state_dir, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import shoal.spark

    bs = spark_broker.bootstrap
    group = "g-" + topic_name
    create_topic(bs, topic_name, partitions=1)
    _fill(bs, topic_name, 50)
    seen: list[tuple[int, int]] = []

    def handle(batch, batch_id: int) -> None:  # type: ignore[no-untyped-def]
        rows = batch.select("value", "deliveryCount", "topic", "partition", "offset").collect()
        seen.extend((int(r.value), r.deliveryCount) for r in rows)
        first_time = [r for r in rows if int(r.value) % 10 == 0 and r.deliveryCount == 1]
        shoal.spark.release(first_time, state_dir=state_dir, share_group=group)

    q = _share_stream(spark, bs, topic_name, group, state_dir, tasks=2).writeStream.foreachBatch(handle) \
        .option("checkpointLocation", str(tmp_path / "cp")).start()
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and len(seen) < 55:
            assert q.exception() is None, q.exception()
            time.sleep(0.5)
    finally:
        q.stop()
    values = sorted(v for v, _ in seen)
    assert values == sorted(list(range(50)) + list(range(0, 50, 10)))
    assert sorted(v for v, dc in seen if dc == 2) == list(range(0, 50, 10))
