"""Consume throughput of a consumer group (subscribe) next to plain assign(), same topic and broker.

Usage:
    python benchmarks/consumer_group.py [--records N] [--value-bytes B] [--partitions P] [--rounds R]

One ``shoal serve`` on a temporary data directory; a topic of P partitions is filled
with N records of B-byte values (confluent-kafka Producer, acks=all, linger.ms=5). Then
each mode reads all N records back with one confluent-kafka Consumer
(fetch.queue.backoff.ms=1, so librdkafka does not pause between fetches; auto commit
on at its default interval):

* ``assign``: ``assign()`` of every partition from offset 0, no group coordination;
* ``classic``: ``subscribe()`` in a fresh classic group (JoinGroup/SyncGroup/Heartbeat);
* ``consumer``: ``subscribe()`` with ``group.protocol=consumer`` (KIP-848 heartbeats).

The clock starts at the first record delivered (joining a group is reported apart), so
the figures compare steady-state consumption. Each mode runs R rounds, the best is kept.
Printed: msgs/s, MB/s of values, the broker's CPU seconds per million records, and each
group mode's ratio to ``assign``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def start_shoal(data_dir: str) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen([sys.executable, "-m", "shoal", "serve", "--port", "0", "--data-dir", data_dir,
                             "--log-level", "WARNING", "-o", "group.initial.rebalance.delay.ms=0",
                             "-o", "group.consumer.heartbeat.interval.ms=1000"],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("listening on "):
            return proc, line.split()[-1]
    raise RuntimeError("shoal did not start")


def fill(bootstrap: str, topic: str, partitions: int, records: int, value_bytes: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, "enable.idempotence": False,
                  "batch.size": 1_000_000, "queue.buffering.max.messages": 1_000_000})
    value = os.urandom(value_bytes)
    for i in range(records):
        while True:
            try:
                p.produce(topic, value, partition=i % partitions)
                break
            except BufferError:
                p.poll(0.01)
    assert p.flush(120) == 0


def consume(bootstrap: str, topic: str, partitions: int, records: int, mode: str, run: int) -> tuple[float, float]:
    """(seconds from first record to last, seconds from start to first record)."""
    conf: dict[str, Any] = {"bootstrap.servers": bootstrap, "group.id": f"bench-{mode}-{run}",
                            "auto.offset.reset": "earliest", "fetch.queue.backoff.ms": 1,
                            "enable.partition.eof": False}
    if mode == "consumer":
        conf["group.protocol"] = "consumer"
    c = Consumer(conf)
    start = time.perf_counter()
    if mode == "assign":
        c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    else:
        c.subscribe([topic])
    n = 0
    first = None
    deadline = time.monotonic() + 300
    while n < records:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{mode}: consumed {n} of {records}")
        for m in c.consume(10_000, timeout=0.5):
            if m.error() is not None:
                continue
            if first is None:
                first = time.perf_counter()
            n += 1
    end = time.perf_counter()
    c.close()
    assert first is not None
    return end - first, first - start


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--records", type=int, default=300_000)
    ap.add_argument("--value-bytes", type=int, default=1024)
    ap.add_argument("--partitions", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="shoal-bench-") as tmp:
        proc, bootstrap = start_shoal(tmp)
        try:
            topic = "bench-groups"
            fill(bootstrap, topic, args.partitions, args.records, args.value_bytes)
            print(f"{args.records} records of {args.value_bytes} B over {args.partitions} partitions; "
                  f"best of {args.rounds} rounds")
            print(f"{'mode':10} {'msgs/s':>10} {'MB/s':>8} {'join s':>7} {'broker CPU s/M':>15} {'vs assign':>10}")
            best: dict[str, float] = {}
            modes = ["assign", "classic", "consumer"]
            results: dict[str, tuple[float, float, float]] = {}
            for r in range(args.rounds):
                for mode in modes:
                    cpu0 = cpu_seconds(proc.pid)
                    secs, join = consume(bootstrap, topic, args.partitions, args.records, mode, r)
                    cpu = cpu_seconds(proc.pid) - cpu0
                    if mode not in best or secs < best[mode]:
                        best[mode] = secs
                        results[mode] = (secs, join, cpu)
            for mode in modes:
                secs, join, cpu = results[mode]
                rate = args.records / secs
                mbs = rate * args.value_bytes / 1e6
                ratio = "" if mode == "assign" else f"{best['assign'] / secs:9.2f}x"
                print(f"{mode:10} {rate:10.0f} {mbs:8.1f} {join:7.2f} {cpu / args.records * 1e6:15.2f} {ratio:>10}")
        finally:
            proc.terminate()
            proc.wait(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
