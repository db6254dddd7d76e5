"""What the metrics endpoint costs on produce: the same produce run with metrics.port off and on.

Usage:
    python benchmarks/metrics_overhead.py [--rounds N] [--records N] [--value-size B] [--linger-ms MS]

Each round starts a fresh broker twice, once with ``metrics.port=-1`` (off, the default)
and once with ``metrics.port=0`` (on, with ``/metrics`` scraped every second during the
run, as a Prometheus with a 1 s interval would), in alternating order, and produces the
same records through a confluent-kafka Producer (acks=all, 1 partition). The default
``linger.ms=0`` makes many small Produce requests, the case where per-request counting
weighs most; ``--batch-records 1`` (librdkafka's ``batch.num.messages``) makes every
record its own Produce request, the worst case. Printed per run: msgs/s and the broker's CPU seconds per million records
(from /proc/<pid>/stat); then the medians per mode and the overhead of "on" in both.
Broker CPU per record is the steadier figure on a machine whose cores the client shares.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from produce_consume import cpu_seconds, create_topic, free_port, wait_port  # noqa: E402
from confluent_kafka import Producer  # noqa: E402


def start(data_dir: str, metrics: bool) -> tuple[subprocess.Popen[bytes], int, str | None]:
    port = free_port()
    log_path = os.path.join(data_dir + ".log")
    proc = subprocess.Popen(
        [sys.executable, "-m", "shoal", "serve", "--port", str(port), "--data-dir", data_dir, "--log-level", "INFO",
         "-o", f"metrics.port={0 if metrics else -1}"],
        stdout=subprocess.DEVNULL, stderr=open(log_path, "wb"),
    )
    wait_port(port)
    url = None
    if metrics:
        deadline = time.time() + 10
        while url is None and time.time() < deadline:
            m = re.search(r"queue view on (http://\S+)/", Path(log_path).read_text())
            url = m.group(1) + "/metrics" if m else None
            time.sleep(0.05)
    return proc, port, url


def produce(bootstrap: str, topic: str, count: int, value_size: int, linger_ms: int, batch_records: int) -> float:
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": linger_ms,
                  "batch.num.messages": batch_records,
                  "enable.idempotence": False, "queue.buffering.max.messages": 1_000_000})
    value = b"x" * value_size
    start_t = time.perf_counter()
    for _ in range(count):
        while True:
            try:
                p.produce(topic, value, partition=0)
                break
            except BufferError:
                p.poll(0.001)
        p.poll(0)
    if p.flush(300):
        raise RuntimeError("records not delivered")
    return time.perf_counter() - start_t


def one_run(metrics: bool, args: argparse.Namespace, workdir: str, n: int) -> tuple[float, float, int]:
    data_dir = os.path.join(workdir, f"run{n}-{'on' if metrics else 'off'}")
    proc, port, url = start(data_dir, metrics)
    scrapes = 0
    stop = threading.Event()

    def scraper() -> None:
        nonlocal scrapes
        while not stop.wait(1.0):
            with urllib.request.urlopen(url, timeout=5) as r:  # type: ignore[arg-type]
                r.read()
            scrapes += 1

    try:
        bootstrap = f"127.0.0.1:{port}"
        create_topic(bootstrap, "bench", 1)
        produce(bootstrap, "bench", 2000, args.value_size, args.linger_ms, args.batch_records)  # warm-up
        t = threading.Thread(target=scraper, daemon=True) if url else None
        if t:
            t.start()
        c0 = cpu_seconds(proc.pid)
        elapsed = produce(bootstrap, "bench", args.records, args.value_size, args.linger_ms, args.batch_records)
        cpu = cpu_seconds(proc.pid) - c0
        stop.set()
        if t:
            t.join()
    finally:
        proc.terminate()
        proc.wait(30)
    rate = args.records / elapsed
    cpu_per_m = cpu / args.records * 1e6
    print(f"metrics {'on ' if metrics else 'off'}  {rate:9.0f} msg/s  broker {cpu_per_m:6.2f} cpu-s/M records"
          + (f"  ({scrapes} scrapes)" if metrics else ""), flush=True)
    return rate, cpu_per_m, scrapes


def micro(n: int = 1_000_000) -> float:
    """Seconds per Produce request that the metrics hooks add, timed in process.

    The exact calls a one-partition Produce makes with metrics on: the two clock reads
    of the connection, ``request_done`` and ``produced``.
    """
    from time import perf_counter

    from shoal.observe.metrics import Metrics

    m = Metrics()
    t0 = perf_counter()
    for _ in range(n):
        started = perf_counter()
        m.produced("bench", 10, 1200)
        m.request_done(0, perf_counter() - started)
    with_hooks = perf_counter() - t0
    t0 = perf_counter()
    for _ in range(n):
        pass
    empty = perf_counter() - t0
    return (with_hooks - empty) / n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--value-size", type=int, default=100)
    ap.add_argument("--linger-ms", type=int, default=0)
    ap.add_argument("--batch-records", type=int, default=10_000, help="librdkafka batch.num.messages")
    ap.add_argument("--micro", action="store_true", help="only time the hooks in process")
    args = ap.parse_args()
    per_request = micro()
    print(f"metrics hooks per Produce request, in process: {per_request * 1e6:.2f} us", flush=True)
    if args.micro:
        return 0
    results: dict[bool, list[tuple[float, float, int]]] = {False: [], True: []}
    with tempfile.TemporaryDirectory(prefix="shoal-metrics-bench-") as workdir:
        for i in range(args.rounds):
            for metrics in ((False, True) if i % 2 == 0 else (True, False)):
                results[metrics].append(one_run(metrics, args, workdir, i))
    off_rate = statistics.median(r for r, _c, _s in results[False])
    on_rate = statistics.median(r for r, _c, _s in results[True])
    off_cpu = statistics.median(c for _r, c, _s in results[False])
    on_cpu = statistics.median(c for _r, c, _s in results[True])
    print(f"median over {args.rounds} rounds, {args.records} records of {args.value_size} B, "
          f"linger.ms={args.linger_ms}, batch.num.messages={args.batch_records}:")
    print(f"  off: {off_rate:9.0f} msg/s  broker {off_cpu:6.2f} cpu-s/M")
    print(f"  on:  {on_rate:9.0f} msg/s  broker {on_cpu:6.2f} cpu-s/M")
    print(f"  overhead of metrics: throughput {100 * (off_rate - on_rate) / off_rate:+.1f}%, "
          f"broker CPU per record {100 * (on_cpu - off_cpu) / off_cpu:+.1f}%")
    if args.batch_records == 1:  # one request per record: the hooks' share of the broker's CPU per request
        print(f"  hooks' share of the broker CPU per request (off): {100 * per_request * 1e6 / off_cpu:.2f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
