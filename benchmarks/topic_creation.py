"""Creating a topic of many partitions: how long it takes, and how long other clients wait.

Usage:
    python benchmarks/topic_creation.py [--partitions 50,500] [--rounds 3]

Per round and partition count, a fresh ``shoal serve`` (single broker, default settings)
in a temporary data directory. While confluent-kafka's AdminClient creates a topic of N
partitions, another connection sends ApiVersions requests one after another (2 ms apart)
and times each answer: the slowest of them shows how long the broker's event loop was
busy with the creation and served no one else. Printed per round: the time CreateTopics
took and the slowest and the median ApiVersions answer while it ran.

To measure an older shoal the same way, run this file with that tree first on
PYTHONPATH from a directory holding no other ``shoal``.
"""

from __future__ import annotations

import argparse
import shutil
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from confluent_kafka.admin import AdminClient, NewTopic

sys.path.insert(0, str(Path(__file__).resolve().parent))
from produce_consume import free_port, wait_port  # noqa: E402


def ping(port: int, answers: list[tuple[float, float]], stop: threading.Event) -> None:
    """ApiVersions v0 requests, one at a time: (sent at, seconds to the answer)."""
    header = struct.pack(">hhih", 18, 0, 1, 4) + b"ping"
    frame = struct.pack(">i", len(header)) + header
    with socket.create_connection(("127.0.0.1", port)) as sock:
        while not stop.is_set():
            sent = time.perf_counter()
            sock.sendall(frame)
            (size,) = struct.unpack(">i", sock.recv(4, socket.MSG_WAITALL))
            sock.recv(size, socket.MSG_WAITALL)
            answers.append((sent, time.perf_counter() - sent))
            time.sleep(0.002)


def one(partitions: int) -> tuple[float, float, float]:
    """(CreateTopics seconds, slowest and median ApiVersions answer in seconds) on a fresh broker."""
    root = Path(tempfile.mkdtemp(prefix="shoal-topic-creation-"))
    port = free_port()
    broker = subprocess.Popen([sys.executable, "-m", "shoal", "serve", "--port", str(port), "--data-dir",
                               str(root / "data"), "--log-level", "WARNING"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    stop = threading.Event()
    pinger: threading.Thread | None = None
    try:
        wait_port(port)
        admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{port}", "log_level": 2})  # not the shutdown's disconnects
        admin.list_topics(timeout=10)  # connected before the clock starts
        answers: list[tuple[float, float]] = []
        pinger = threading.Thread(target=ping, args=(port, answers, stop))
        pinger.start()
        time.sleep(0.3)
        start = time.perf_counter()
        admin.create_topics([NewTopic("created", partitions, 1)])["created"].result(60)
        took = time.perf_counter() - start
        stop.set()
        pinger.join()
        during = [s for sent, s in answers if sent >= start - 0.01] or [0.0]
        return took, max(during), statistics.median(during)
    finally:
        stop.set()  # also when creation failed: the pinger stops before its broker does
        if pinger is not None:
            pinger.join(10)
        broker.terminate()
        broker.wait(30)
        shutil.rmtree(root, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--partitions", default="50,500", help="partition counts, comma-separated (default 50,500)")
    ap.add_argument("--rounds", type=int, default=3, help="fresh brokers per partition count (default 3)")
    args = ap.parse_args()
    print(f"{'partitions':>10} {'round':>5} {'CreateTopics ms':>16} {'slowest answer ms':>18} {'median answer ms':>17}")
    for n in (int(x) for x in args.partitions.split(",")):
        for r in range(args.rounds):
            took, slowest, med = one(n)
            print(f"{n:>10} {r + 1:>5} {took * 1000:>16.1f} {slowest * 1000:>18.1f} {med * 1000:>17.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
