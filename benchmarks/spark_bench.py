"""Spark data source throughput against a shoal broker it starts: batch read and write with 1, 2
and 4 tasks on a one-partition topic, the share-group streaming source on one and on eight
partitions with its default options, each beside a plain client on the same records (an
idempotent confluent-kafka Producer for the sink, a confluent-kafka ShareConsumer for the
share source), with the ratio.

    python benchmarks/spark_bench.py [--records 200000] [--value-bytes 1000] [--master local[2]]
                                     [--bootstrap HOST:PORT] [--only write,read,share]
                                     [--share-partitions 1,8] [--record-locks N]
                                     [--spark-conf KEY=VALUE ...]

Prints MB/s and records/s per case. Times include Spark's job overhead (a few hundred ms per
job), so small runs understate the steady state. The batch writes run on records already
cached in as many partitions as tasks, after an untimed write that starts Spark's Python
workers: the timed job is the sink's, as a plain producer's time is its own. The streaming queries keep their checkpoints
with Spark's FileSystem-based checkpoint manager (``--spark-conf
spark.sql.streaming.checkpointFileManagerClass=...`` to choose another): Spark's default one
spends about 80 ms more per micro-batch on a local directory, whatever the source. Before
the share-group cases an untimed one-partition share stream of ``--share-warm-up``
micro-batches (100 by default) runs, as the untimed write does for the sink: Spark's JVM
takes some tens of micro-batches to reach its steady speed (skipped when the first share
case is the one-partition stream, which does the same). Each share case prints its figure over the whole
run (the first micro-batch, the Python workers' start, included) and after the first
micro-batch.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

# Spark's default checkpoint manager for a local directory goes through Hadoop's FileContext,
# which costs about 40 ms per metadata file here (two per micro-batch: the offsets and the
# commit log); the FileSystem-based one, which Spark uses where FileContext is missing, renames
# a temporary file as well (atomic on a local file system) in a few ms.
FS_CHECKPOINTS = ("spark.sql.streaming.checkpointFileManagerClass="
                  "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager")


def _broker(data_dir: str) -> tuple[subprocess.Popen[bytes], str]:
    proc = subprocess.Popen([sys.executable, "-m", "shoal", "serve", "--port", "0", "--data-dir", data_dir,
                             "--log-level", "WARNING"], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
    assert proc.stdout is not None
    line = proc.stdout.readline().decode()
    if not line.startswith("listening on "):
        raise RuntimeError(f"broker did not start: {line!r}")
    return proc, line.split()[-1]


def _topic(bootstrap: str, name: str, partitions: int = 1) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap, "broker.address.family": "v4"})
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(15)


def _plain_produce(bootstrap: str, topic: str, n: int, size: int) -> None:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "broker.address.family": "v4", "enable.idempotence": True,
                  "linger.ms": 5})
    value = b"ABC" * (size // 3)
    for i in range(n):
        while True:
            try:
                p.produce(topic, value, str(i).encode())
                break
            except BufferError:
                p.poll(0.05)
    p.flush(120)


def _plain_share_consume(bootstrap: str, topic: str, group: str, n: int) -> int:
    """Records a confluent-kafka ShareConsumer (implicit acknowledgement) reads in ``group`` from the start."""
    from confluent_kafka import ShareConsumer
    from confluent_kafka.admin import (
        AdminClient,
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
        ResourceType,
    )

    admin = AdminClient({"bootstrap.servers": bootstrap, "broker.address.family": "v4"})
    res = ConfigResource(ResourceType.GROUP, group, incremental_configs=[
        ConfigEntry("share.auto.offset.reset", "earliest", incremental_operation=AlterConfigOpType.SET)])
    for fut in admin.incremental_alter_configs([res]).values():
        fut.result(15)
    c = ShareConsumer({"bootstrap.servers": bootstrap, "broker.address.family": "v4", "group.id": group})
    c.subscribe([topic])
    got = 0
    deadline = time.monotonic() + 600
    try:
        while got < n and time.monotonic() < deadline:
            got += sum(1 for m in c.poll(1.0) if not m.error())
    finally:
        c.close()
    return got


def _set_group_config(bootstrap: str, group: str, name: str, value: str) -> None:
    from confluent_kafka.admin import (
        AdminClient,
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
        ResourceType,
    )

    res = ConfigResource(ResourceType.GROUP, group, incremental_configs=[
        ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)])
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for fut in admin.incremental_alter_configs([res]).values():
        fut.result(timeout=15)


def _line(what: str, n: int, nbytes: int, seconds: float) -> None:
    print(f"{what:<38} {n:>9} records {seconds:7.2f} s {n / seconds:>10.0f} rec/s {nbytes / seconds / 1e6:8.1f} MB/s",
          flush=True)


def _steady(batches: list[dict]) -> tuple[int, float] | None:
    """Records of the micro-batches after the first, and the seconds from the first one's end to the last one's."""
    from datetime import datetime

    if len(batches) < 2:
        return None

    def end(p: dict) -> float:
        start = datetime.fromisoformat(p["timestamp"].replace("Z", "+00:00")).timestamp()
        return start + p["durationMs"].get("triggerExecution", 0) / 1000

    return sum(p["numInputRows"] for p in batches[1:]), end(batches[-1]) - end(batches[0])


def _share_stream(spark, bootstrap: str, topic: str, group: str, parts: int, n: int, work: str
                  ) -> tuple[int, float, list[dict]]:
    """The share source (default options, ``numTasks`` up to 2) into Spark's noop sink until
    ``n`` records went through: (records, seconds, progress of the micro-batches with records)."""
    from pyspark.sql import functions as F

    rows = 0
    t = time.perf_counter()
    q = (spark.readStream.format("shoal").option("kafka.bootstrap.servers", bootstrap)
         .option("subscribe", topic).option("shareGroup", group)
         .option("numTasks", str(min(parts, 2))).option("startingOffsets", "earliest")
         .option("stateDir", os.path.join(work, "share-state")).load()
         .select(F.length("value").alias("n")).writeStream.format("noop").start())
    try:
        deadline = time.monotonic() + 600
        while rows < n and time.monotonic() < deadline:
            time.sleep(0.2)
            rows = sum(p["numInputRows"] for p in q.recentProgress)
        elapsed = time.perf_counter() - t
        batches = [p for p in q.recentProgress if p["numInputRows"]]
    finally:
        q.stop()
    return rows, elapsed, batches


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--value-bytes", type=int, default=1000)
    ap.add_argument("--bootstrap")
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--only", default="write,read,share", help="the cases to run, comma-separated")
    ap.add_argument("--share-partitions", default="1,8", help="partition counts of the share-group cases")
    ap.add_argument("--record-locks", type=int,
                    help="the share groups' share.partition.max.record.locks (a group config, up to the brokers' "
                         "group.share.max.partition.max.record.locks, 4000 by default); default: the brokers' 2000")
    ap.add_argument("--share-warm-up", type=int, default=100, metavar="BATCHES",
                    help="micro-batches of an untimed one-partition share stream before the measured ones, unless "
                         "the first measured case is the one-partition stream (that run warms Spark up); 0: none")
    ap.add_argument("--spark-conf", action="append", default=[], metavar="KEY=VALUE",
                    help="a Spark session setting; repeatable. The streaming queries' checkpoints use "
                         f"{FS_CHECKPOINTS.split('=')[1].rsplit('.', 1)[1]} unless "
                         "spark.sql.streaming.checkpointFileManagerClass is given")
    args = ap.parse_args()
    cases = set(args.only.split(","))
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    work = tempfile.mkdtemp(prefix="shoal-spark-bench-")
    proc = None
    bootstrap = args.bootstrap
    if bootstrap is None:
        proc, bootstrap = _broker(os.path.join(work, "broker"))
    try:
        from pyspark.sql import SparkSession
        from pyspark.sql import functions as F

        import shoal.spark

        builder = (SparkSession.builder.master(args.master).config("spark.ui.enabled", "false")
                   .config("spark.sql.shuffle.partitions", "4")
                   .config("spark.sql.streaming.numRecentProgressUpdates", "100000"))
        confs = args.spark_conf
        if not any(kv.startswith("spark.sql.streaming.checkpointFileManagerClass=") for kv in confs):
            confs = [FS_CHECKPOINTS, *confs]
        for kv in confs:
            print(f"spark conf {kv}", flush=True)
            key, _, value = kv.partition("=")
            builder = builder.config(key, value)
        spark = builder.getOrCreate()
        spark.sparkContext.setLogLevel("ERROR")
        shoal.spark.register(spark)
        n, size = args.records, args.value_bytes
        stamp = int(time.time())
        src = spark.range(n).select(F.col("id").cast("string").alias("key"),
                                    F.expr(f"unbase64(repeat('QUJD', {size // 3}))").alias("value")).cache()
        src.count()
        nbytes = n * (size // 3 * 3)
        read_topic = None
        write_s = {}
        if cases & {"write", "read"}:
            # not timed: the session's first Python job starts Spark's Python workers (about
            # a second), which every later write reuses
            _topic(bootstrap, f"bench-warmup-{stamp}")
            src.limit(1000).repartition(4).write.mode("append").format("shoal") \
                .option("kafka.bootstrap.servers", bootstrap).option("topic", f"bench-warmup-{stamp}").save()
        for tasks in (1, 2, 4) if cases & {"write", "read"} else ():
            topic = f"bench-w{tasks}-{stamp}"
            _topic(bootstrap, topic)
            # the records already in ``tasks`` cached partitions: the timed job is the sink's
            # (reading the cache, the Arrow batches to Python, producing), not a shuffle
            parts = src.repartition(tasks).cache()
            parts.count()
            t = time.perf_counter()
            parts.write.mode("append").format("shoal").option("kafka.bootstrap.servers", bootstrap) \
                .option("topic", topic).save()
            write_s[tasks] = time.perf_counter() - t
            parts.unpersist()
            _line(f"batch write, {tasks} task(s)", n, nbytes, write_s[tasks])
            read_topic = read_topic or topic
        for tasks in (1, 2, 4) if "read" in cases else ():
            df = spark.read.format("shoal").option("kafka.bootstrap.servers", bootstrap) \
                .option("subscribe", read_topic).option("minPartitions", str(tasks)).load()
            t = time.perf_counter()
            got = df.select(F.sum(F.length("value"))).collect()[0][0]
            _line(f"batch read, {tasks} task(s)", n, got, time.perf_counter() - t)

        if "write" in cases:
            t = time.perf_counter()
            _plain_produce(bootstrap, f"bench-plain-{stamp}", n, size)
            plain_write = time.perf_counter() - t
            _line("plain idempotent Producer", n, nbytes, plain_write)
            print(f"    sink with 1 task / plain Producer = {plain_write / write_s[1]:.2f}", flush=True)
        if "share" not in cases:
            spark.stop()
            return 0
        share_parts = [int(x) for x in args.share_partitions.split(",")]
        if read_topic is None and 1 in share_parts:
            read_topic = f"bench-p1-{stamp}"
            _topic(bootstrap, read_topic)
            _plain_produce(bootstrap, read_topic, n, size)

        # Spark's JVM runs its per-micro-batch code faster after some tens of micro-batches (in
        # a new session, the 8-partition micro-batches after the first took 270-460 ms against
        # 220-260 ms once a hundred micro-batches had run): an untimed stream first, on one
        # partition (one cap of records per micro-batch), as the sink's warm-up write.
        if args.share_warm_up and not (1 in [int(x) for x in args.share_partitions.split(",")][:1]):
            warm = f"bench-warm-{stamp}"
            _topic(bootstrap, warm, 1)
            warm_n = args.share_warm_up * (args.record_locks or 2000)
            _plain_produce(bootstrap, warm, warm_n, size)
            t = time.perf_counter()
            got, _, _ = _share_stream(spark, bootstrap, warm, f"bench-warm-{stamp}", 1, warm_n, work)
            print(f"untimed warm-up: share-group stream, 1 partition, {got} records in "
                  f"{time.perf_counter() - t:.1f} s", flush=True)

        # the share-group source, default options, beside a plain ShareConsumer on the same topic
        eight = f"bench-p8-{stamp}"
        if 8 in share_parts:
            _topic(bootstrap, eight, 8)
            _plain_produce(bootstrap, eight, n, size)
        for topic, parts in [(t, p) for t, p in ((read_topic, 1), (eight, 8)) if p in share_parts]:
            t = time.perf_counter()
            got = _plain_share_consume(bootstrap, topic, f"bench-plain-{parts}-{stamp}", n)
            plain = got / (time.perf_counter() - t)
            _line(f"plain ShareConsumer, {parts} partition(s)", got, got * (size // 3 * 3), time.perf_counter() - t)
            group = f"bench-{parts}-{stamp}"
            if args.record_locks:
                _set_group_config(bootstrap, group, "share.partition.max.record.locks", str(args.record_locks))
            locks = args.record_locks or 2000
            rows, elapsed, batches = _share_stream(spark, bootstrap, topic, group, parts, n, work)
            _line(f"share-group stream, {parts} partition(s)", rows, rows * (size // 3 * 3), elapsed)
            steady = _steady(batches)
            if steady:
                print(f"    after the first micro-batch (Spark's and the Python workers' start-up): "
                      f"{steady[0]} records in {steady[1]:.2f} s = {steady[0] / steady[1]:.0f} rec/s", flush=True)
            per_batch = sum(p["numInputRows"] for p in batches) / max(1, len(batches))
            batch_s = sum(p["durationMs"].get("triggerExecution", 0) for p in batches) / max(1, len(batches)) / 1000
            print(f"    {len(batches)} micro-batches, {per_batch:.0f} records and {batch_s * 1000:.0f} ms each; "
                  f"stream / plain ShareConsumer = {rows / elapsed / plain:.2f}; "
                  f"records/s / (record locks ({locks}) x partitions / batch time) = "
                  f"{rows / elapsed / (locks * parts / batch_s) if batch_s else 0:.2f}", flush=True)
            print("    records per micro-batch: " + " ".join(str(p["numInputRows"]) for p in batches), flush=True)
            if batches:
                print("    ms of the first micro-batch: " + ", ".join(
                    f"{k} {v}" for k, v in sorted(batches[0]["durationMs"].items())), flush=True)
            later = batches[1:]
            if later:
                keys = sorted({k for p in later for k in p["durationMs"]})
                print("    mean ms per micro-batch after the first: " + ", ".join(
                    f"{k} {sum(p['durationMs'].get(k, 0) for p in later) / len(later):.0f}" for k in keys), flush=True)
        spark.stop()
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(20)
    return 0


if __name__ == "__main__":
    sys.exit(main())
