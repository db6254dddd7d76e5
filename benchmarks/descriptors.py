"""Descriptors a fresh ``shoal serve`` holds for many partitions (read from /proc/PID/fd).

Creates TOPICS x PARTITIONS partitions (10,000 by default) in a few CreateTopics requests,
writes one record to each, reads every one back, restarts the broker and reads them all
again, printing the broker's open descriptors after each step.  Segments keep at most one
descriptor each, and only the most recently used ones (half the soft RLIMIT_NOFILE), so
the count stays bounded by the limit rather than growing with the partitions.

    python benchmarks/descriptors.py                      # 10,000 partitions, the inherited limit
    python benchmarks/descriptors.py --nofile 1024        # as under `ulimit -n 1024`
    python benchmarks/descriptors.py --topics 2000 --partitions 1
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from produce_consume import free_port  # noqa: E402

QUIET = {"log_level": 2}


def start_shoal(data_dir: str, port: int, nofile: int | None) -> subprocess.Popen[bytes]:
    def limit() -> None:
        if nofile is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

    proc = subprocess.Popen([sys.executable, "-m", "shoal", "serve", "--port", str(port), "--data-dir", data_dir,
                             "--log-level", "WARNING"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            preexec_fn=limit)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"broker exited with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return proc
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("broker did not start")


def fds(proc: subprocess.Popen[bytes]) -> int:
    return len(os.listdir(f"/proc/{proc.pid}/fd"))


def nofile_of(proc: subprocess.Popen[bytes]) -> str:
    with open(f"/proc/{proc.pid}/limits") as f:
        for line in f:
            if line.startswith("Max open files"):
                return " / ".join(line.split()[3:5])
    return "?"


def read_all(bs: str, parts: list[TopicPartition]) -> int:
    c = Consumer({"bootstrap.servers": bs, "group.id": "unused", "enable.auto.commit": False,
                  "fetch.wait.max.ms": 10, **QUIET})
    c.assign([TopicPartition(tp.topic, tp.partition, 0) for tp in parts])
    n = 0
    deadline = time.monotonic() + 300
    while n < len(parts) and time.monotonic() < deadline:
        n += sum(1 for m in c.consume(1000, 1.0) if m.error() is None)
    c.close()
    return n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--topics", type=int, default=100)
    ap.add_argument("--partitions", type=int, default=100, help="partitions per topic")
    ap.add_argument("--nofile", type=int, default=None, help="RLIMIT_NOFILE of the broker (soft and hard)")
    args = ap.parse_args()
    total = args.topics * args.partitions
    data = tempfile.mkdtemp(prefix="shoal-fds-")
    port = free_port()
    bs = f"127.0.0.1:{port}"
    proc = start_shoal(data, port, args.nofile)
    try:
        print(f"{total} partitions ({args.topics} topics x {args.partitions}); broker open file limit "
              f"(soft / hard) {nofile_of(proc)}")
        print(f"  {'step':44s} {'descriptors':>11s} {'seconds':>8s}")

        def row(step: str, t0: float) -> None:
            print(f"  {step:44s} {fds(proc):11d} {time.perf_counter() - t0:8.1f}", flush=True)

        row("started (empty)", time.perf_counter())
        t0 = time.perf_counter()
        admin = AdminClient({"bootstrap.servers": bs, "socket.timeout.ms": 300_000, **QUIET})
        names = [f"fd-{i:05d}" for i in range(args.topics)]
        for start in range(0, len(names), 50):
            futures = admin.create_topics([NewTopic(n, args.partitions, 1) for n in names[start:start + 50]],
                                          operation_timeout=300, request_timeout=300)
            for f in futures.values():
                f.result(300)
        row(f"created {total} partitions", t0)
        t0 = time.perf_counter()
        parts = [TopicPartition(n, p) for n in names for p in range(args.partitions)]
        prod = Producer({"bootstrap.servers": bs, "acks": "all", "linger.ms": 20, **QUIET})
        for tp in parts:
            while True:
                try:
                    prod.produce(tp.topic, b"x" * 100, partition=tp.partition)
                    break
                except BufferError:
                    prod.poll(0.05)
        left = prod.flush(300)
        row(f"wrote a record to each ({left} undelivered)", t0)
        t0 = time.perf_counter()
        n = read_all(bs, parts)
        row(f"read them back ({n} of {total})", t0)
        del prod, admin  # no client left to reconnect while the broker restarts
        proc.terminate()
        proc.wait(120)
        t0 = time.perf_counter()
        proc = start_shoal(data, port, args.nofile)
        row("restarted", t0)
        t0 = time.perf_counter()
        n = read_all(bs, parts)
        row(f"read them back ({n} of {total})", t0)
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(120)
        shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    main()
