"""Slow readers: connections that send large Fetch requests and never read their socket.

Usage:
    python benchmarks/slow_readers.py [--readers 20] [--requests 20] [--mib 50] [--seconds 15]

Starts ``shoal serve``, writes ``--mib`` MiB of records (900 kB values) to a one-partition
topic, then opens ``--readers`` connections that each send up to ``--requests`` Fetch v12
requests for the whole partition (max_bytes and partition_max_bytes ``--mib`` MiB, from
offset 0) back to back and never read a byte of the answers. Sending goes on for
``--seconds`` (a connection the broker no longer reads from blocks: its requests wait in
the socket buffers). Meanwhile the broker's resident set size (VmRSS) is sampled every
50 ms, and a normal client produces and consumes one record while the readers hang on.

Printed: the broker's VmRSS before, its peak during the run (and VmHWM), the requests
each reader got into the socket, and how long the normal client's round trip took. A
broker that buffered every answer would need about readers x requests x MiB of memory.
"""

from __future__ import annotations

import argparse
import os
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from produce_consume import free_port, wait_port  # noqa: E402

from shoal.protocol.fetch_request import write_fetch_request_v12  # noqa: E402

MIB = 1 << 20
TOPIC = "slow-readers"


def rss_kib(pid: int, key: str = "VmRSS") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def fetch_frame(topic: str, max_bytes: int, correlation_id: int) -> bytes:
    """A framed Fetch v12 request (header v2) for partition 0 of ``topic`` from offset 0."""
    client = b"slow-reader"
    header = struct.pack(">hhih", 1, 12, correlation_id, len(client)) + client + b"\x00"
    body = write_fetch_request_v12(-1, 0, 1, max_bytes, [(topic, [(0, -1, 0, max_bytes)])])
    return struct.pack(">i", len(header) + len(body)) + header + body


def fill(bootstrap: str, mib: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(TOPIC, 1, 1)])[TOPIC].result(30)
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    value = b"v" * 900_000
    for _ in range(mib * MIB // len(value) + 1):
        while True:
            try:
                p.produce(TOPIC, value, partition=0)
                break
            except BufferError:
                p.poll(0.01)
    if p.flush(120):
        raise RuntimeError("records not delivered")


def slow_readers(port: int, readers: int, requests: int, mib: int, seconds: float) -> list[int]:
    """Open the readers and send their requests for ``seconds``; the sockets stay open (returned counts)."""
    socks = []
    for _ in range(readers):
        s = socket.create_connection(("127.0.0.1", port))
        s.setblocking(False)
        socks.append(s)
    frames = [fetch_frame(TOPIC, mib * MIB, i) for i in range(requests)]
    sent = [0] * readers
    pending = [b"".join(frames) for _ in range(readers)]
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(pending):
        progress = False
        for i, s in enumerate(socks):
            if not pending[i]:
                continue
            try:
                n = s.send(pending[i])
            except BlockingIOError:
                continue
            progress = progress or n > 0
            total = len(frames[0]) * requests
            pending[i] = pending[i][n:]
            sent[i] = (total - len(pending[i])) // len(frames[0])
        if not progress:
            time.sleep(0.05)
    slow_readers.sockets = socks  # type: ignore[attr-defined]
    return sent


def round_trip(bootstrap: str) -> float:
    start = time.perf_counter()
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    p.produce("normal-client", b"hello", partition=0)
    if p.flush(30):
        raise RuntimeError("the normal client's record was not delivered")
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "normal", "auto.offset.reset": "earliest"})
    c.assign([TopicPartition("normal-client", 0, 0)])
    try:
        while time.perf_counter() - start < 30:
            m = c.poll(0.5)
            if m is not None and m.error() is None:
                return time.perf_counter() - start
    finally:
        c.close()
    raise RuntimeError("the normal client's record was not consumed")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--readers", type=int, default=20)
    ap.add_argument("--requests", type=int, default=20, help="Fetch requests per reader")
    ap.add_argument("--mib", type=int, default=50, help="MiB of records, and each Fetch's max_bytes")
    ap.add_argument("--seconds", type=float, default=15.0, help="how long the readers send")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="shoal-slow-readers-") as tmp:
        port = free_port()
        proc = subprocess.Popen(
            [sys.executable, "-m", "shoal", "serve", "--port", str(port), "--data-dir", os.path.join(tmp, "data"),
             "--log-level", "WARNING", "-o", f"fetch.max.bytes={max(args.mib * MIB, 57671680)}",
             "-o", "num.partitions=1"],
            stdout=subprocess.DEVNULL, stderr=open(os.path.join(tmp, "shoal.log"), "wb"))
        peak = [0]
        stop = threading.Event()

        def sample() -> None:
            while not stop.is_set():
                try:
                    peak[0] = max(peak[0], rss_kib(proc.pid))
                except OSError:
                    return
                time.sleep(0.05)

        try:
            wait_port(port)
            bootstrap = f"127.0.0.1:{port}"
            fill(bootstrap, args.mib)
            before = rss_kib(proc.pid)
            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            sent = slow_readers(port, args.readers, args.requests, args.mib, args.seconds)
            rt = round_trip(bootstrap)
            time.sleep(1.0)
            stop.set()
            sampler.join()
            alive = proc.poll() is None
            print(f"readers={args.readers} requests/reader={args.requests} fetch max_bytes={args.mib} MiB")
            print(f"requests in the sockets per reader: min {min(sent)} max {max(sent)}")
            print(f"broker VmRSS before {before / 1024:.0f} MiB, peak {peak[0] / 1024:.0f} MiB "
                  f"(VmHWM {rss_kib(proc.pid, 'VmHWM') / 1024:.0f} MiB)" if alive else "broker died")
            print(f"normal client produce+consume round trip meanwhile: {rt:.2f} s")
            for s in getattr(slow_readers, "sockets", []):
                s.close()
        finally:
            stop.set()
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
