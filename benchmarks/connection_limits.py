"""Idle connections and slow-loris peers beside a normal producer: the broker's memory.

Usage:
    python benchmarks/connection_limits.py [--idle 1000] [--loris 500] [--frame-mib 100]
                                           [--fraction 0.95] [--idle-ms 30000] [--messages 1000]
                                           [--pool BYTES]

Starts ``shoal serve`` (``socket.request.max.bytes`` = the frame size,
``connections.max.idle.ms`` = ``--idle-ms``, ``queued.max.request.bytes`` = ``--pool`` if
given, else the default), then:

1. opens ``--idle`` connections that send nothing;
2. opens ``--loris`` connections that each announce a frame of ``--frame-mib`` MiB and send
   ``--fraction`` of it as fast as the broker takes it, then stop (until no connection has
   made progress for 3 s);
3. runs a confluent-kafka producer (acks=all) sending ``--messages`` records and reports
   whether all were delivered and how long it took;
4. waits until ``--idle-ms`` has passed since the last byte and counts the connections the
   broker closed.

Printed: the broker's resident set size (VmRSS) after each step and its peak (VmHWM), the
producer's time, and the closed connections. The file descriptor limit is raised to the
hard limit in this process (the broker inherits it).
"""

from __future__ import annotations

import argparse
import os
import resource
import selectors
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

sys.path.insert(0, str(Path(__file__).resolve().parent))
from produce_consume import free_port, wait_port  # noqa: E402

MIB = 1 << 20


def raise_fd_limit() -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


def memory(pid: int) -> str:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        k, _, v = line.partition(":")
        fields[k] = v.strip()
    return f"RSS {fields['VmRSS']}, peak {fields['VmHWM']}"


def connect(port: int) -> socket.socket:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)
    s.connect(("127.0.0.1", port))
    s.setblocking(False)
    return s


def slow_loris(socks: list[socket.socket], frame: int, fraction: float) -> tuple[int, int]:
    """Send each socket a size prefix and ``fraction`` of the body; returns (finished, bytes sent)."""
    target = int(frame * fraction)
    chunk = memoryview(bytes(MIB))
    sent = {s: 0 for s in socks}
    for s in socks:
        s.send(struct.pack(">i", frame))
    sel = selectors.DefaultSelector()
    for s in socks:
        sel.register(s, selectors.EVENT_WRITE)
    finished = 0
    last_progress = time.monotonic()
    while sel.get_map() and time.monotonic() - last_progress < 3.0:
        for key, _ in sel.select(timeout=0.5):
            s = key.fileobj
            want = min(MIB, target - sent[s])
            try:
                n = s.send(chunk[:want])
            except BlockingIOError:
                continue
            except OSError:
                sel.unregister(s)
                continue
            if n:
                sent[s] += n
                last_progress = time.monotonic()
            if sent[s] >= target:
                finished += 1
                sel.unregister(s)
    sel.close()
    return finished, sum(sent.values())


def closed_by_peer(s: socket.socket) -> bool:
    try:
        return s.recv(1 << 16) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def produce(bootstrap: str, topic: str, count: int) -> tuple[float, int]:
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, "log_level": 3,
                  "message.timeout.ms": 60000})
    delivered = [0]

    def done(err: object, _msg: object) -> None:
        if err is None:
            delivered[0] += 1

    start = time.perf_counter()
    for _ in range(count):
        p.produce(topic, b"x" * 100, on_delivery=done)
        p.poll(0)
    p.flush(90)
    return time.perf_counter() - start, delivered[0]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--idle", type=int, default=1000)
    ap.add_argument("--loris", type=int, default=500)
    ap.add_argument("--frame-mib", type=int, default=100)
    ap.add_argument("--fraction", type=float, default=0.95)
    ap.add_argument("--idle-ms", type=int, default=30_000)
    ap.add_argument("--messages", type=int, default=1000)
    ap.add_argument("--pool", type=int, default=None, help="queued.max.request.bytes (default: the broker's)")
    args = ap.parse_args()
    hard = raise_fd_limit()
    print(f"fd limit {hard}")
    frame = args.frame_mib * MIB

    tmp = tempfile.mkdtemp(prefix="shoal-conn-bench-")
    port = free_port()
    cmd = [sys.executable, "-m", "shoal", "serve", "--port", str(port), "--data-dir", os.path.join(tmp, "data"),
           "--log-level", "WARNING", "-o", f"socket.request.max.bytes={frame}",
           "-o", f"connections.max.idle.ms={args.idle_ms}"]
    if args.pool is not None:
        cmd += ["-o", f"queued.max.request.bytes={args.pool}"]
    broker = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(os.path.join(tmp, "shoal.log"), "wb"))
    bootstrap = f"127.0.0.1:{port}"
    socks: list[socket.socket] = []
    try:
        wait_port(port)
        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.create_topics([NewTopic("bench", 1, 1)])["bench"].result(30)
        alone, ok = produce(bootstrap, "bench", args.messages)
        print(f"started: {memory(broker.pid)}; producer alone: {ok}/{args.messages} in {alone:.3f} s")

        idle = [connect(port) for _ in range(args.idle)]
        socks += idle
        print(f"{args.idle} idle connections open: {memory(broker.pid)}")

        loris = [connect(port) for _ in range(args.loris)]
        socks += loris
        t0 = time.monotonic()
        finished, sent = slow_loris(loris, frame, args.fraction)
        last_byte = time.monotonic()
        print(f"{args.loris} connections announced {args.frame_mib} MiB frames; {finished} sent "
              f"{args.fraction:.0%} of theirs, {sent / MIB:.0f} MiB in all, in {last_byte - t0:.1f} s: "
              f"{memory(broker.pid)}")

        took, ok = produce(bootstrap, "bench", args.messages)
        print(f"producer beside them: {ok}/{args.messages} delivered in {took:.3f} s: {memory(broker.pid)}")

        wait = args.idle_ms / 1000 + 3.0 - (time.monotonic() - last_byte)
        if wait > 0:
            time.sleep(wait)
        idle_closed = sum(closed_by_peer(s) for s in idle)
        loris_closed = sum(closed_by_peer(s) for s in loris)
        print(f"after connections.max.idle.ms ({args.idle_ms} ms) + 3 s: broker closed {idle_closed}/{args.idle} "
              f"idle and {loris_closed}/{args.loris} slow-loris connections; {memory(broker.pid)}")
        if broker.poll() is not None:
            print(f"broker exited with {broker.returncode}")
    finally:
        for s in socks:
            s.close()
        broker.terminate()
        try:
            broker.wait(60)
        except subprocess.TimeoutExpired:
            broker.kill()
            broker.wait()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
