"""shoal and Apache Kafka side by side: Kafka's own perf tools against each broker in turn.

Usage (from the repository root; Java 17+ and Maven, the jars are fetched once by
reference/kafka/kit.sh):

    python benchmarks/kafka_side_by_side.py                 # full run, a few minutes
    python benchmarks/kafka_side_by_side.py --quick         # short run, to check it works
    python benchmarks/kafka_side_by_side.py --workloads produce,latency --records 50000
    python benchmarks/kafka_side_by_side.py --kafka-flush   # Kafka fsyncs every append too

The script starts a shoal broker (``python -m shoal serve`` of this checkout, free port,
temporary data dir), runs every selected workload against it, stops it, then does the
same with an Apache Kafka broker (KRaft combined mode, through tests/support/kafka_ref.py).
Only one broker runs at a time; the clients are the same JVM tools with the same options
for both. Each broker first takes an unmeasured warm-up (``--warmup-records`` 1 KiB
records produced and consumed), so that neither broker's figures include its JIT or its
first files. Workloads:

* ``produce``: org.apache.kafka.tools.ProducerPerformance (kafka-producer-perf-test),
  1 KiB and 100 B records, 1 and 6 partitions, acks=all, unthrottled, the Java
  producer's other defaults (linger.ms=5, batch.size=16384, idempotence on).
* ``consume``: org.apache.kafka.tools.ConsumerPerformance (kafka-consumer-perf-test)
  reading back each produce topic (classic group, fetch size 1 MiB).
* ``share``: org.apache.kafka.tools.ShareConsumerPerformance
  (kafka-share-consumer-perf-test), 1, 4 and 8 share consumers (``--threads``) on a
  topic of 1 and of 8 partitions; each run is a new share group whose
  share.auto.offset.reset is set to earliest with kafka-configs (the tool does not set it).
* ``latency``: ProducerPerformance at a fixed rate (``--latency-rate``, 500 records/s by
  default) with 100 B records, acks=all, linger.ms=0, batch.size=0, so every request
  carries one record (the table shows records per request, from the producer's metrics);
  p50/p99/p99.9 of send-to-acknowledgement as the tool reports them, for the steady state
  after the first fifth of the records (``--warmup-records`` of the tool).

For every workload run, the broker's CPU time (utime+stime of /proc/PID/stat; for Kafka
the JVM's pid) is read before and after the tool runs, and divided by the gigabytes of
record values moved and by the requests the client sent (the ``request-total`` of the
client's own metrics, from ``--print-metrics``).

Durability differs by default: shoal fsyncs every append before it answers a produce
(log.flush.interval.messages=1); Kafka leaves flushing to the OS. ``--kafka-flush`` sets
Kafka's log.flush.interval.messages=1 as well. Kafka's JVM runs with a fixed 1 GiB heap
(-Xms1g -Xmx1g) and the serial collector; the tools' JVMs with -Xmx512m and full JIT.
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
# the shoal broker started below must run this checkout's code
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)

from tests.support import kafka_ref
from tests.support.broker import BrokerProcess

CLK_TCK = os.sysconf("SC_CLK_TCK")
KAFKA_HEAP = ["-Xms1g", "-Xmx1g"]
TOOL_JVM = ["-Xmx512m"]
PRODUCE = "org.apache.kafka.tools.ProducerPerformance"
CONSUME = "org.apache.kafka.tools.ConsumerPerformance"
SHARE = "org.apache.kafka.tools.ShareConsumerPerformance"
WORKLOADS = ("produce", "consume", "share", "latency")
TOOL_TIMEOUT_S = 900.0

# shoal gets the group timings that kafka_ref gives the Kafka broker, and Kafka's
# offsets/share-state partition counts there, so that groups form equally fast on both.
SHOAL_OVERRIDES = {
    "group.initial.rebalance.delay.ms": "0",
    "offsets.topic.num.partitions": "3",
    "share.coordinator.state.topic.num.partitions": "3",
    "group.consumer.heartbeat.interval.ms": "1000",
    "group.consumer.session.timeout.ms": "10000",
    "group.share.heartbeat.interval.ms": "1000",
    "group.share.min.heartbeat.interval.ms": "1000",
    "group.share.session.timeout.ms": "10000",
    "group.share.min.session.timeout.ms": "6000",
}


class BenchError(RuntimeError):
    pass


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def kafka_version() -> str:
    m = re.search(r"kafka-clients-([^/:]+)\.jar", kafka_ref.classpath())
    return m.group(1) if m else "?"


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


# -- brokers ------------------------------------------------------------------------------


class KafkaRef(kafka_ref.KafkaBroker):
    """kafka_ref's broker with a fixed heap: the flags go after kafka_ref's own, and the
    JVM takes the last -Xms/-Xmx it is given."""

    def start(self) -> KafkaRef:
        original = kafka_ref.java_command

        def with_heap(main_class: str, *args: str, jvm: Sequence[str] = (), **kw):  # type: ignore[no-untyped-def]
            if main_class == "kafka.Kafka":
                jvm = [*jvm, *KAFKA_HEAP]
            return original(main_class, *args, jvm=jvm, **kw)

        kafka_ref.java_command = with_heap
        try:
            super().start()
        finally:
            kafka_ref.java_command = original
        return self


class Broker:
    """One of the two brokers under test: name, bootstrap, pid, start and stop."""

    def __init__(self, name: str, work: Path, kafka_flush: bool) -> None:
        self.name = name
        self.work = work
        self.kafka_flush = kafka_flush
        self._shoal: BrokerProcess | None = None
        self._kafka: KafkaRef | None = None

    @property
    def durability(self) -> str:
        if self.name == "shoal":
            return "fsync of every append before the answer (shoal's default log.flush.interval.messages=1)"
        if self.kafka_flush:
            return "log.flush.interval.messages=1 (--kafka-flush): fsync of every append"
        return "Kafka's default: no fsync per write, flushing left to the OS"

    def start(self) -> None:
        if self.name == "shoal":
            self._shoal = BrokerProcess(self.work / "shoal-data", overrides=SHOAL_OVERRIDES)
            self._shoal.start()
        else:
            overrides = {"log.flush.interval.messages": "1"} if self.kafka_flush else {}
            self._kafka = KafkaRef(self.work / "kafka", overrides=overrides)
            self._kafka.start()

    @property
    def bootstrap(self) -> str:
        return self._shoal.bootstrap if self._shoal is not None else self._kafka.bootstrap  # type: ignore[union-attr]

    @property
    def pid(self) -> int:
        if self._shoal is not None:
            return self._shoal.pid
        assert self._kafka is not None and self._kafka.proc is not None
        return self._kafka.proc.pid

    def alive(self) -> bool:
        if self._shoal is not None:
            return self._shoal.is_alive()
        return self._kafka is not None and self._kafka.proc is not None and self._kafka.proc.poll() is None

    def log_tail(self) -> str:
        if self._shoal is not None:
            return self._shoal.stderr_tail()
        return self._kafka.log_tail() if self._kafka is not None else ""

    def stop(self) -> None:
        if self._shoal is not None:
            try:
                self._shoal.stop(check=False)
            finally:
                self._shoal = None
        if self._kafka is not None:
            try:
                self._kafka.stop()
            finally:
                self._kafka = None


# -- tools ----------------------------------------------------------------------------------

_METRIC = re.compile(r"^([\w.-]+):([\w.-]+):\{([^}]*)\}\s*:\s*(\S+)\s*$")


def parse_metrics(text: str) -> dict[tuple[str, str], float]:
    """``--print-metrics`` lines, summed over their tags: (group, name) -> value."""
    out: dict[tuple[str, str], float] = {}
    for line in text.splitlines():
        m = _METRIC.match(line.strip())
        if m is None:
            continue
        try:
            value = float(m.group(4))
        except ValueError:
            continue
        if math.isnan(value):
            continue
        key = (m.group(1), m.group(2))
        out[key] = out.get(key, 0.0) + value
    return out


def client_requests(metrics: dict[tuple[str, str], float]) -> float:
    """Requests the client sent to the broker (its ``*-metrics:request-total``)."""
    total = sum(v for (group, name), v in metrics.items()
                if name == "request-total" and group.endswith("-metrics") and "node" not in group)
    if total <= 0:
        raise BenchError("the tool's metrics have no request-total")
    return total


def run_java(broker: Broker, main_class: str, *args: str) -> str:
    """Run one of Kafka's tools with full JIT; fails at once when the broker exits meanwhile
    (a client would otherwise retry until its own timeouts)."""
    cmd = kafka_ref.java_command(main_class, *args, quick=False, jvm=TOOL_JVM)
    tool = main_class.rsplit(".", 1)[1]
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL, text=True)
        try:
            deadline = time.monotonic() + TOOL_TIMEOUT_S
            while proc.poll() is None:
                if not broker.alive():
                    raise BenchError(f"{broker.name} exited while {tool} ran\n{broker.log_tail()}")
                if time.monotonic() > deadline:
                    raise BenchError(f"{tool} did not finish within {TOOL_TIMEOUT_S:.0f}s")
                try:
                    proc.wait(0.5)
                except subprocess.TimeoutExpired:
                    pass
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if proc.returncode != 0:
        raise BenchError(f"{tool} {' '.join(args)} exited with {proc.returncode}\n"
                         f"--- stdout ---\n{stdout[-3000:]}\n--- stderr ---\n{stderr[-3000:]}")
    return stdout


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    kafka_ref.run_tool("kafka-topics", "--bootstrap-server", bootstrap, "--create", "--if-not-exists",
                       "--topic", topic, "--partitions", str(partitions), "--replication-factor", "1",
                       timeout=180)


_PRODUCE_SUMMARY = re.compile(
    r"(\d+) (steady state )?records sent, ([\d.]+) records/sec \(([\d.]+) MB/sec\), ([\d.]+) ms avg latency, "
    r"([\d.]+) ms max latency, ([\d.]+) ms 50th, ([\d.]+) ms 95th, ([\d.]+) ms 99th, ([\d.]+) ms 99.9th")


def produce_perf(broker: Broker, topic: str, records: int, size: int, rate: int,
                 props: Sequence[str], warmup: int = 0) -> tuple[dict[str, float], dict[tuple[str, str], float]]:
    """ProducerPerformance's summary; with ``warmup``, its steady-state one (the records after
    the first ``warmup``)."""
    out = run_java(broker, PRODUCE, "--bootstrap-server", broker.bootstrap, "--topic", topic, "--num-records", str(records),
                   "--record-size", str(size), "--throughput", str(rate), "--print-metrics",
                   "--warmup-records", str(warmup), "--command-property", *props)
    found = _PRODUCE_SUMMARY.findall(out)
    if not found:
        raise BenchError(f"no summary line in ProducerPerformance's output:\n{out[-3000:]}")
    total = found[0][0]
    sent, _, rps, mbps, avg, mx, p50, p95, p99, p999 = found[-1]
    if int(total) != records or (warmup and int(sent) != records - warmup):
        raise BenchError(f"ProducerPerformance sent {total} of {records} records:\n{out[-3000:]}")
    return ({"records": float(total), "records/s": float(rps), "MB/s": float(mbps), "avg ms": float(avg),
             "max ms": float(mx), "p50 ms": float(p50), "p95 ms": float(p95), "p99 ms": float(p99),
             "p99.9 ms": float(p999)}, parse_metrics(out))


def stats_table(out: str, first_field: str) -> dict[str, str]:
    """The header line starting with ``first_field`` and the data line after it, as a dict."""
    lines = [line.strip() for line in out.splitlines() if line.strip()]
    for i, line in enumerate(lines):
        if line.startswith(first_field) and i + 1 < len(lines):
            names = [n.strip() for n in line.split(",")]
            values = [v.strip() for v in lines[i + 1].split(",")]
            if len(values) >= len(names):
                return dict(zip(names, values))
    raise BenchError(f"no statistics in the tool's output:\n{out[-3000:]}")


def consume_perf(broker: Broker, topic: str, records: int, group: str
                 ) -> tuple[dict[str, float], dict[tuple[str, str], float]]:
    out = run_java(broker, CONSUME, "--bootstrap-server", broker.bootstrap, "--topic", topic, "--num-records", str(records),
                   "--group", group, "--timeout", "60000", "--print-metrics")
    row = stats_table(out, "start.time")
    got = int(row["data.consumed.in.nMsg"])
    if got < records:
        raise BenchError(f"ConsumerPerformance read {got} of {records} records\n{out[-3000:]}")
    # nMsg.sec counts from the start, the group join included; fetch.* from the join's end
    return ({"records": float(got), "records/s": float(row["nMsg.sec"]), "MB/s": float(row["MB.sec"]),
             "join ms": float(row["rebalance.time.ms"]), "fetch records/s": float(row["fetch.nMsg.sec"]),
             "fetch MB/s": float(row["fetch.MB.sec"])}, parse_metrics(out))


def share_perf(broker: Broker, topic: str, records: int, group: str, consumers: int
               ) -> tuple[dict[str, float], dict[tuple[str, str], float]]:
    kafka_ref.run_tool("kafka-configs", "--bootstrap-server", broker.bootstrap, "--entity-type", "groups",
                       "--entity-name", group, "--alter", "--add-config", "share.auto.offset.reset=earliest",
                       timeout=180)
    out = run_java(broker, SHARE, "--bootstrap-server", broker.bootstrap, "--topic", topic, "--num-records", str(records),
                   "--group", group, "--threads", str(consumers), "--timeout", "60000", "--print-metrics")
    row = stats_table(out, "start.time")
    got = int(row["data.consumed.in.nMsg"])
    if got < records:
        raise BenchError(f"ShareConsumerPerformance read {got} of {records} records\n{out[-3000:]}")
    return ({"records": float(got), "records/s": float(row["nMsg.sec"]), "MB/s": float(row["MB.sec"])},
            parse_metrics(out))


# -- workloads ------------------------------------------------------------------------------


@dataclass
class Case:
    workload: str
    name: str
    values: dict[str, dict[str, float]] = field(default_factory=dict)  # broker -> metric -> value


# metric name -> True when higher is better
DIRECTION = {
    "records/s": True, "MB/s": True, "fetch records/s": True, "fetch MB/s": True, "join ms": False,
    "records/request": False,
    "avg ms": False, "p50 ms": False, "p95 ms": False, "p99 ms": False, "p99.9 ms": False, "max ms": False,
    "CPU s/GB": False, "CPU ms/request": False, "CPU s": False,
}

SHOWN = {
    "produce": ["records/s", "MB/s", "p99 ms", "CPU s", "CPU s/GB", "CPU ms/request"],
    "consume": ["records/s", "join ms", "fetch records/s", "fetch MB/s", "CPU s", "CPU s/GB", "CPU ms/request"],
    "share": ["records/s", "MB/s", "CPU s", "CPU s/GB", "CPU ms/request"],
    "latency": ["records/s", "records/request", "p50 ms", "p99 ms", "p99.9 ms", "avg ms", "CPU ms/request"],
}


@dataclass
class Plan:
    records: int
    share_records: int
    share_size: int
    latency_records: int
    latency_rate: int
    workloads: list[str]
    warmup: int
    sizes: list[int] = field(default_factory=lambda: [1024, 100])
    partitions: list[int] = field(default_factory=lambda: [1, 6])
    share_partitions: list[int] = field(default_factory=lambda: [1, 8])
    share_consumers: list[int] = field(default_factory=lambda: [1, 4, 8])


def measured(broker: Broker, record_size: int,
             run: Callable[[], tuple[dict[str, float], dict[tuple[str, str], float]]]) -> dict[str, float]:
    """Run one tool, with the broker's CPU time read before and after."""
    before = cpu_seconds(broker.pid)
    result, metrics = run()
    cpu = cpu_seconds(broker.pid) - before
    if not broker.alive():
        raise BenchError(f"{broker.name} exited during the run\n{broker.log_tail()}")
    requests = client_requests(metrics)
    result["CPU s"] = cpu
    result["requests"] = requests
    result["CPU ms/request"] = cpu * 1000 / requests
    result["CPU s/GB"] = cpu / (result["records"] * record_size / 1e9)
    rpr = metrics.get(("producer-metrics", "records-per-request-avg"))
    if rpr is not None:
        result["records/request"] = rpr
    return result


def run_workloads(broker: Broker, plan: Plan, cases: dict[tuple[str, str], Case], log: Callable[[str], None]) -> None:
    b = broker.bootstrap
    stamp = int(time.time())
    want = set(plan.workloads)

    def case(workload: str, name: str) -> Case:
        return cases.setdefault((workload, name), Case(workload, name))

    if plan.warmup:
        # neither broker's figures should include its start: the JVM's JIT compiling the
        # produce and fetch paths, shoal's first segment files
        create_topic(b, "warmup", 1)
        log(f"{broker.name}: warm-up, {plan.warmup} x 1 KiB produced and consumed (not measured)")
        produce_perf(broker, "warmup", plan.warmup, 1024, -1, ["acks=all"])
        consume_perf(broker, "warmup", plan.warmup, f"warmup-{stamp}")

    if want & {"produce", "consume"}:
        for size in plan.sizes:
            for parts in plan.partitions:
                topic = f"perf-{size}b-{parts}p"
                name = f"{size} B, {parts} partition{'s' if parts > 1 else ''}"
                create_topic(b, topic, parts)
                log(f"{broker.name}: produce {plan.records} x {size} B to {parts} partition(s)")
                result = measured(broker, size,
                                  functools.partial(produce_perf, broker, topic, plan.records, size, -1, ["acks=all"]))
                if "produce" in want:
                    case("produce", name).values[broker.name] = result
                if "consume" in want:
                    log(f"{broker.name}: consume {plan.records} x {size} B from {parts} partition(s)")
                    result = measured(broker, size, functools.partial(consume_perf, broker, topic, plan.records,
                                                                      f"perf-{topic}-{stamp}"))
                    case("consume", name).values[broker.name] = result

    if "share" in want:
        for parts in plan.share_partitions:
            topic = f"share-{plan.share_size}b-{parts}p"
            create_topic(b, topic, parts)
            log(f"{broker.name}: fill {topic} with {plan.share_records} records (not measured)")
            produce_perf(broker, topic, plan.share_records, plan.share_size, -1, ["acks=all"])
            for consumers in plan.share_consumers:
                group = f"perf-share-{parts}p-{consumers}c-{stamp}"
                name = f"{parts} partition{'s' if parts > 1 else ''}, {consumers} consumer{'s' if consumers > 1 else ''}"
                log(f"{broker.name}: share-consume {plan.share_records} records, {name}")
                result = measured(broker, plan.share_size,
                                  functools.partial(share_perf, broker, topic, plan.share_records, group, consumers))
                case("share", name).values[broker.name] = result

    if "latency" in want:
        topic = "latency-100b-1p"
        create_topic(b, topic, 1)
        log(f"{broker.name}: {plan.latency_records} single-record produces at {plan.latency_rate}/s")
        props = ["acks=all", "linger.ms=0", "batch.size=0"]
        result = measured(broker, 100, functools.partial(produce_perf, broker, topic, plan.latency_records, 100,
                                                         plan.latency_rate, props, warmup=plan.latency_records // 5))
        case("latency", f"100 B at {plan.latency_rate} records/s").values[broker.name] = result


# -- output ---------------------------------------------------------------------------------


def fmt(v: float | None) -> str:
    if v is None:
        return "-"
    if v == 0:
        return "0"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    if abs(v) >= 10:
        return f"{v:.1f}"
    if abs(v) >= 0.1:
        return f"{v:.2f}"
    return f"{v:.4f}"


def print_tables(cases: dict[tuple[str, str], Case], plan: Plan, out: Callable[[str], None]) -> None:
    titles = {
        "produce": f"ProducerPerformance, {plan.records} records, acks=all, unthrottled",
        "consume": f"ConsumerPerformance, {plan.records} records (records/s from the start, group join "
                   "included; fetch records/s after the join)",
        "share": f"ShareConsumerPerformance, {plan.share_records} records of {plan.share_size} B, implicit acks",
        "latency": f"ProducerPerformance, {plan.latency_records} records at a fixed rate, acks=all, linger.ms=0",
    }
    for workload in WORKLOADS:
        rows = [c for c in cases.values() if c.workload == workload]
        if not rows:
            continue
        out("")
        out(f"== {workload}: {titles[workload]}")
        out(f"{'case':<28} {'metric':<16} {'shoal':>12} {'Kafka':>12} {'shoal/Kafka':>12}")
        for c in rows:
            for metric in SHOWN[workload]:
                s = c.values.get("shoal", {}).get(metric)
                k = c.values.get("kafka", {}).get(metric)
                ratio = f"{s / k:.2f}" if s is not None and k else "-"
                better = "higher is better" if DIRECTION.get(metric, True) else "lower is better"
                out(f"{c.name:<28} {metric:<16} {fmt(s):>12} {fmt(k):>12} {ratio:>12}   ({better})")
        if workload == "latency":
            for c in rows:
                for name, v in c.values.items():
                    if v["records/s"] < 0.9 * plan.latency_rate:
                        out(f"note: {name} held {v['records/s']:.0f} of {plan.latency_rate} records/s; its "
                            "latencies include waiting in the producer, not only the broker's answer")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="short run (small record counts) to check the setup")
    ap.add_argument("--records", type=int, help="records per produce/consume run (default 200000; quick 20000)")
    ap.add_argument("--share-records", type=int, help="records per share-consumer run (default 100000; quick 10000)")
    ap.add_argument("--share-record-size", type=int, default=100, help="bytes per record of the share runs (100)")
    ap.add_argument("--latency-records", type=int, help="records of the latency run (default 10000; quick 1000)")
    ap.add_argument("--latency-rate", type=int, default=500, help="records/s of the latency run (500)")
    ap.add_argument("--warmup-records", type=int,
                    help="1 KiB records produced and consumed on each broker before any measurement "
                         "(default 100000; quick 10000; 0: none)")
    ap.add_argument("--workloads", default=",".join(WORKLOADS),
                    help=f"comma-separated subset of {','.join(WORKLOADS)} (all by default)")
    ap.add_argument("--brokers", default="shoal,kafka", help="comma-separated subset of shoal,kafka (both)")
    ap.add_argument("--kafka-flush", action="store_true",
                    help="Kafka fsyncs every append too (log.flush.interval.messages=1), like shoal's default")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory (brokers' data and logs)")
    args = ap.parse_args(argv)

    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    brokers = [b.strip() for b in args.brokers.split(",") if b.strip()]
    if not workloads or any(w not in WORKLOADS for w in workloads):
        ap.error(f"--workloads takes a comma-separated subset of {','.join(WORKLOADS)}")
    if not brokers or any(b not in ("shoal", "kafka") for b in brokers):
        ap.error("--brokers takes shoal, kafka or shoal,kafka")
    plan = Plan(
        records=args.records or (20_000 if args.quick else 200_000),
        share_records=args.share_records or (10_000 if args.quick else 100_000),
        share_size=args.share_record_size,
        latency_records=args.latency_records or (1_000 if args.quick else 10_000),
        latency_rate=args.latency_rate,
        workloads=workloads,
        warmup=args.warmup_records if args.warmup_records is not None else (10_000 if args.quick else 100_000),
    )
    if plan.warmup < 0:
        ap.error("--warmup-records must be at least 0")
    if min(plan.records, plan.share_records, plan.latency_records, plan.latency_rate, plan.share_size) < 1:
        ap.error("record counts, sizes and the rate must be at least 1")

    def log(msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    def on_sigterm(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_sigterm)
    kafka_ref.classpath()  # fetch the jars (once) before any broker starts
    work = Path(tempfile.mkdtemp(prefix="shoal-vs-kafka-"))
    cases: dict[tuple[str, str], Case] = {}
    header = [
        (f"date (UTC): {time.strftime('%Y-%m-%d %H:%M', time.gmtime())}, "
         f"load average at start: {load_average()}, {os.cpu_count()} CPUs"),
        f"command: python benchmarks/kafka_side_by_side.py {' '.join(argv if argv is not None else sys.argv[1:])}",
    ]
    status = 0
    try:
        for name in brokers:
            broker = Broker(name, work, args.kafka_flush)
            header.append(f"{name}: {broker.durability}")
            try:
                log(f"starting {name}")
                broker.start()
                log(f"{name} on {broker.bootstrap}, pid {broker.pid}")
                run_workloads(broker, plan, cases, log)
            finally:
                log(f"stopping {name}")
                broker.stop()
        header.append(f"load average at end: {load_average()}")
    except KeyboardInterrupt:
        log("interrupted; brokers stopped")
        status = 130
    except (BenchError, kafka_ref.KitError, RuntimeError, subprocess.TimeoutExpired) as e:
        log(f"failed: {e}")
        status = 1
    finally:
        if args.keep or status == 1:
            log(f"brokers' data and logs kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    print("\n".join(header))
    print(f"Apache Kafka {kafka_version()}: broker JVM {' '.join(KAFKA_HEAP)}, serial GC; tools ProducerPerformance, "
          f"ConsumerPerformance, ShareConsumerPerformance ({' '.join(TOOL_JVM)})")
    print("CPU: broker utime+stime from /proc/PID/stat around each tool run; per GB of record values; "
          "per request the client sent (its request-total metric)")
    print_tables(cases, plan, print)
    return status


if __name__ == "__main__":
    sys.exit(main())
