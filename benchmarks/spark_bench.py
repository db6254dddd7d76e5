"""Spark data source throughput against a shoal broker it starts: batch read and write with 1, 2
and 4 tasks on a one-partition topic, and the share-group streaming source.

    python benchmarks/spark_bench.py [--records 200000] [--value-bytes 1000] [--bootstrap HOST:PORT]

Prints MB/s and records/s per case. Times include Spark's job overhead (a few hundred ms per
job on local[4]), so small runs understate the steady state.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time


def _broker(data_dir: str) -> tuple[subprocess.Popen[bytes], str]:
    proc = subprocess.Popen([sys.executable, "-m", "shoal", "serve", "--port", "0", "--data-dir", data_dir,
                             "--log-level", "WARNING"], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
    assert proc.stdout is not None
    line = proc.stdout.readline().decode()
    if not line.startswith("listening on "):
        raise RuntimeError(f"broker did not start: {line!r}")
    return proc, line.split()[-1]


def _topic(bootstrap: str, name: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap, "broker.address.family": "v4"})
    admin.create_topics([NewTopic(name, 1, 1)])[name].result(15)


def _line(what: str, n: int, nbytes: int, seconds: float) -> None:
    print(f"{what:<38} {n:>9} records {seconds:7.2f} s {n / seconds:>10.0f} rec/s {nbytes / seconds / 1e6:8.1f} MB/s",
          flush=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--value-bytes", type=int, default=1000)
    ap.add_argument("--bootstrap")
    args = ap.parse_args()
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

        spark = (SparkSession.builder.master("local[4]").config("spark.ui.enabled", "false")
                 .config("spark.sql.shuffle.partitions", "4").getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        shoal.spark.register(spark)
        n, size = args.records, args.value_bytes
        stamp = int(time.time())
        src = spark.range(n).select(F.col("id").cast("string").alias("key"),
                                    F.expr(f"unbase64(repeat('QUJD', {size // 3}))").alias("value")).cache()
        src.count()
        nbytes = n * (size // 3 * 3)
        read_topic = None
        for tasks in (1, 2, 4):
            topic = f"bench-w{tasks}-{stamp}"
            _topic(bootstrap, topic)
            t = time.perf_counter()
            src.repartition(tasks).write.mode("append").format("shoal").option("kafka.bootstrap.servers", bootstrap) \
                .option("topic", topic).save()
            _line(f"batch write, {tasks} task(s)", n, nbytes, time.perf_counter() - t)
            read_topic = read_topic or topic
        for tasks in (1, 2, 4):
            df = spark.read.format("shoal").option("kafka.bootstrap.servers", bootstrap) \
                .option("subscribe", read_topic).option("minPartitions", str(tasks)).load()
            t = time.perf_counter()
            got = df.select(F.sum(F.length("value"))).collect()[0][0]
            _line(f"batch read, {tasks} task(s)", n, got, time.perf_counter() - t)

        # share-group streaming source: 4 tasks on the 1-partition topic
        rows = 0
        t = time.perf_counter()
        q = (spark.readStream.format("shoal").option("kafka.bootstrap.servers", bootstrap)
             .option("subscribe", read_topic).option("shareGroup", f"bench-{stamp}").option("numTasks", "4")
             .option("startingOffsets", "earliest").option("maxRecordsPerTask", "20000")
             .option("stateDir", os.path.join(work, "share-state")).load()
             .select(F.length("value").alias("n")).writeStream.format("noop").start())
        try:
            deadline = time.monotonic() + 600
            while rows < n and time.monotonic() < deadline:
                time.sleep(0.5)
                rows = sum(p["numInputRows"] for p in q.recentProgress)
        finally:
            q.stop()
        _line("share-group stream, 4 tasks", rows, rows * (size // 3 * 3), time.perf_counter() - t)
        spark.stop()
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(20)
    return 0


if __name__ == "__main__":
    sys.exit(main())
