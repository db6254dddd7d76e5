"""A streaming pipeline on Spark over shoal: events -> share group -> parse/enrich -> Parquet + topic.

    python examples/pipeline.py                       # local[*], starts its own broker
    python examples/pipeline.py --bootstrap HOST:PORT # use a running broker
    python examples/pipeline.py --master spark://HOST:7077
    python examples/pipeline.py --standalone          # starts a master and two workers here, then stops them

A generator thread produces ``--events`` JSON events to the topic ``events`` (one partition).
A streaming query reads them through the share group ``pipeline`` with ``--tasks`` tasks
(more tasks than partitions), parses the JSON, enriches each event (amount in cents, a size
class, the delivery count) and, per micro-batch, appends the result to a Parquet table and
writes it to the topic ``results``. Progress is printed every two seconds; the run ends
when every event id is in the table. Exit status 0 means every event arrived.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

EVENTS_TOPIC = "events"
RESULTS_TOPIC = "results"
GROUP = "pipeline"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_port(port: int, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise RuntimeError(f"nothing listens on port {port} after {timeout_s}s")


def start_broker(data_dir: str) -> tuple[subprocess.Popen[bytes], str]:
    proc = subprocess.Popen([sys.executable, "-m", "shoal", "serve", "--port", "0", "--data-dir", data_dir,
                             "--log-level", "WARNING"], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
    assert proc.stdout is not None
    line = proc.stdout.readline().decode()
    if not line.startswith("listening on "):
        proc.kill()
        raise RuntimeError(f"broker did not start: {line!r}")
    return proc, line.split()[-1]


class Standalone:
    """A Spark standalone cluster on this machine: one master, two workers (pyspark's spark-class)."""

    def __init__(self, workdir: str, workers: int = 2, cores: int = 1) -> None:
        import pyspark

        self.spark_class = str(Path(pyspark.__file__).parent / "bin" / "spark-class")
        self.workdir = workdir
        self.workers = workers
        self.cores = cores
        self.procs: list[subprocess.Popen[bytes]] = []
        self.port = _free_port()

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def _spawn(self, name: str, *args: str) -> None:
        log = open(os.path.join(self.workdir, f"{name}.log"), "wb")
        env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable,
                   SPARK_WORKER_DIR=os.path.join(self.workdir, "work"))
        self.procs.append(subprocess.Popen([self.spark_class, *args], stdout=log, stderr=subprocess.STDOUT,
                                           stdin=subprocess.DEVNULL, env=env))

    def start(self) -> Standalone:
        self._spawn("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                    "--port", str(self.port), "--webui-port", str(_free_port()))
        _wait_port(self.port)
        for i in range(self.workers):
            self._spawn(f"worker{i}", "org.apache.spark.deploy.worker.Worker", self.url, "--host", "127.0.0.1",
                        "--cores", str(self.cores), "--memory", "1g", "--webui-port", str(_free_port()))
        return self

    def stop(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs.clear()


def create_topics(bootstrap: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap, "broker.address.family": "v4"})
    futures = admin.create_topics([NewTopic(EVENTS_TOPIC, 1, 1), NewTopic(RESULTS_TOPIC, 1, 1)])
    for f in futures.values():
        try:
            f.result(15)
        except Exception as e:  # already there from an earlier run
            if "TOPIC_ALREADY_EXISTS" not in str(e):
                raise


def generate(bootstrap: str, n: int, rate: float) -> None:
    """Produce ``n`` JSON events at about ``rate`` events/s."""
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "broker.address.family": "v4", "linger.ms": 5,
                  "enable.idempotence": True})
    users = ["ada", "grace", "edsger", "barbara", "ken"]
    t0 = time.monotonic()
    for i in range(n):
        event = {"id": i, "user": users[i % len(users)], "amount": round((i * 37 % 1000) / 10, 2),
                 "ts": int(time.time() * 1000)}
        p.produce(EVENTS_TOPIC, key=str(i).encode(), value=json.dumps(event).encode())
        if rate > 0 and i % 100 == 99:
            p.poll(0)
            ahead = (i + 1) / rate - (time.monotonic() - t0)
            if ahead > 0:
                time.sleep(ahead)
    p.flush(60)


def build_query(spark, bootstrap: str, out: str, tasks: int, state_dir: str):  # type: ignore[no-untyped-def]
    from pyspark.sql import functions as F

    events = (spark.readStream.format("shoal")
              .option("kafka.bootstrap.servers", bootstrap)
              .option("subscribe", EVENTS_TOPIC)
              .option("shareGroup", GROUP)
              .option("numTasks", str(tasks))
              .option("startingOffsets", "earliest")
              .option("maxRecordsPerTask", "500")
              .option("stateDir", state_dir)
              .load())
    schema = "id long, user string, amount double, ts long"
    parsed = events.select(F.from_json(F.col("value").cast("string"), schema).alias("e"), "offset",
                           "deliveryCount")
    enriched = parsed.select(
        "e.id", "e.user", "e.amount",
        (F.col("e.amount") * 100).cast("long").alias("amount_cents"),
        F.when(F.col("e.amount") >= 50, "large").otherwise("small").alias("size"),
        (F.col("e.ts") / 1000).cast("timestamp").alias("event_time"),
        F.current_timestamp().alias("processed_at"),
        "offset", "deliveryCount",
    )

    def sink(batch, batch_id: int) -> None:  # type: ignore[no-untyped-def]
        batch.persist()
        batch.write.mode("append").parquet(os.path.join(out, "table"))
        (batch.select(F.col("id").cast("string").alias("key"), F.to_json(F.struct("*")).alias("value"))
         .write.mode("append").format("shoal").option("kafka.bootstrap.servers", bootstrap)
         .option("topic", RESULTS_TOPIC).save())
        batch.unpersist()

    return (enriched.writeStream.foreachBatch(sink).queryName("pipeline")
            .option("checkpointLocation", os.path.join(out, "checkpoint"))
            .trigger(processingTime="1 second").start())


def run(args: argparse.Namespace) -> int:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    workdir = tempfile.mkdtemp(prefix="shoal-pipeline-")
    out = args.out or os.path.join(workdir, "out")
    broker = cluster = None
    try:
        bootstrap = args.bootstrap
        if bootstrap is None:
            broker, bootstrap = start_broker(os.path.join(workdir, "broker"))
            print(f"broker: {bootstrap}", flush=True)
        create_topics(bootstrap)
        master = args.master
        if args.standalone:
            cluster = Standalone(workdir).start()
            master = cluster.url
            print(f"standalone cluster: {master} (2 workers)", flush=True)

        from pyspark.sql import SparkSession

        import shoal.spark

        builder = (SparkSession.builder.master(master).appName("shoal-pipeline")
                   .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "4")
                   .config("spark.executorEnv.PYSPARK_PYTHON", sys.executable))
        if master.startswith("spark://"):
            builder = builder.config("spark.executor.memory", "768m").config("spark.cores.max", "2")
        spark = builder.getOrCreate()
        spark.sparkContext.setLogLevel("ERROR")
        shoal.spark.register(spark)

        gen = threading.Thread(target=generate, args=(bootstrap, args.events, args.rate), daemon=True)
        gen.start()
        query = build_query(spark, bootstrap, out, args.tasks, os.path.join(workdir, "share-state"))
        deadline = time.monotonic() + args.timeout
        seen = 0
        try:
            while time.monotonic() < deadline:
                time.sleep(2)
                if query.exception() is not None:
                    raise RuntimeError(f"query failed: {query.exception()}")
                p = query.lastProgress
                try:
                    seen = spark.read.parquet(os.path.join(out, "table")).select("id").distinct().count()
                except Exception:  # no table yet
                    seen = 0
                if p:
                    print(f"batch {p['batchId']}: {p['numInputRows']} rows, "
                          f"{p.get('processedRowsPerSecond', 0):.0f} rows/s; table has {seen}/{args.events} events",
                          flush=True)
                if seen >= args.events and not gen.is_alive():
                    break
        finally:
            query.stop()
        table = spark.read.parquet(os.path.join(out, "table"))
        total, distinct = table.count(), table.select("id").distinct().count()
        print(f"done: {distinct} distinct events of {args.events} in {out}/table ({total} rows; "
              f"{total - distinct} redelivered); results topic '{RESULTS_TOPIC}' written", flush=True)
        spark.stop()
        return 0 if distinct == args.events else 1
    finally:
        if cluster is not None:
            cluster.stop()
        if broker is not None:
            broker.terminate()
            broker.wait(20)
        if not args.keep:  # the broker's and Spark's files; --out, when given, lies elsewhere
            shutil.rmtree(workdir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bootstrap", help="a running broker (default: start one)")
    ap.add_argument("--master", default="local[*]", help="Spark master (default local[*])")
    ap.add_argument("--standalone", action="store_true", help="start a master and two workers here, then stop them")
    ap.add_argument("--events", type=int, default=5000)
    ap.add_argument("--rate", type=float, default=2000.0, help="events per second (0: as fast as possible)")
    ap.add_argument("--tasks", type=int, default=4, help="share-group tasks (the topic has one partition)")
    ap.add_argument("--out", help="output directory (default: a temporary one, removed at the end)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    ap.add_argument("--timeout", type=float, default=240.0)
    return run(ap.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
