"""Soak: the size of the internal topics, RSS and descriptors under a steady load, over time.

A fresh ``shoal serve``; a producer writes 300 records/s (100 B) to one topic; a consumer
group reads them and commits after every poll (``__consumer_offsets``); a share group
reads them with a ShareConsumer that acknowledges every record (``__share_group_state``).
Every ``--interval`` seconds it prints the broker's RSS, its open descriptors, and the
bytes and segments of both internal topics.  ``__share_group_state`` gives space back a
whole segment at a time (below every share-partition's last snapshot), and
``__consumer_offsets`` by compaction of closed segments, so both stay bounded; with the
default 100 MiB segments that takes longer than a short run, which ``--segment-bytes``
shortens.

    python benchmarks/internal_topics_soak.py                      # 10 minutes
    python benchmarks/internal_topics_soak.py --minutes 3 --segment-bytes 1048576
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from confluent_kafka import Consumer, Producer, ShareConsumer
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic, ResourceType

sys.path.insert(0, str(Path(__file__).resolve().parent))
from produce_consume import free_port  # noqa: E402

QUIET = {"log_level": 2}
TOPIC = "soak"
INTERNAL = ("__consumer_offsets", "__share_group_state")


def start_shoal(data_dir: str, port: int, overrides: list[str]) -> subprocess.Popen[bytes]:
    extra = [x for o in overrides for x in ("-o", o)]
    proc = subprocess.Popen([sys.executable, "-m", "shoal", "serve", "--port", str(port), "--data-dir", data_dir,
                             "--log-level", "WARNING", *extra], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
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


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return -1.0


def topic_size(data: Path, topic: str) -> tuple[int, int]:
    """(bytes of segment files, number of segments) over every partition of ``topic``."""
    size = segments = 0
    for d in data.glob(f"{topic}-*"):
        for p in d.glob("*.log"):
            size += p.stat().st_size
            segments += 1
    return size, segments


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--rate", type=int, default=300, help="records per second")
    ap.add_argument("--interval", type=float, default=30.0, help="seconds between two rows")
    ap.add_argument("--segment-bytes", type=int, default=None,
                    help="offsets.topic.segment.bytes and share.coordinator.state.topic.segment.bytes "
                         "(default: the broker's, 100 MiB)")
    ap.add_argument("-o", dest="overrides", action="append", default=[], help="more broker key=value")
    args = ap.parse_args()
    overrides = list(args.overrides)
    if args.segment_bytes is not None:
        overrides += [f"offsets.topic.segment.bytes={args.segment_bytes}",
                      f"share.coordinator.state.topic.segment.bytes={args.segment_bytes}"]
    data = tempfile.mkdtemp(prefix="shoal-soak-")
    port = free_port()
    bs = f"127.0.0.1:{port}"
    proc = start_shoal(data, port, overrides)
    stop = threading.Event()
    counts = {"produced": 0, "group": 0, "share": 0, "commits": 0}
    errors: list[str] = []

    def produce() -> None:
        p = Producer({"bootstrap.servers": bs, "acks": "all", "linger.ms": 5, **QUIET})
        tick = 0.1
        per_tick = max(1, round(args.rate * tick))
        nxt = time.monotonic()
        while not stop.is_set():
            for _ in range(per_tick):
                p.produce(TOPIC, b"x" * 100)
            counts["produced"] += per_tick
            p.poll(0)
            nxt += tick
            time.sleep(max(0.0, nxt - time.monotonic()))
        p.flush(10)

    def group_consume() -> None:
        c = Consumer({"bootstrap.servers": bs, "group.id": "soak-group", "enable.auto.commit": False,
                      "auto.offset.reset": "earliest", **QUIET})
        c.subscribe([TOPIC])
        while not stop.is_set():
            msgs = [m for m in c.consume(500, 0.2) if m.error() is None]
            if msgs:
                counts["group"] += len(msgs)
                c.commit(asynchronous=True)
                counts["commits"] += 1
        c.close()

    def share_consume() -> None:
        c = ShareConsumer({"bootstrap.servers": bs, "group.id": "soak-share", **QUIET})
        c.subscribe([TOPIC])
        while not stop.is_set():
            counts["share"] += sum(1 for m in c.poll(0.2) if m.error() is None)
        c.close()

    def run(fn) -> threading.Thread:  # type: ignore[no-untyped-def]
        def guarded() -> None:
            try:
                fn()
            except Exception as exc:  # reported in the summary
                errors.append(f"{fn.__name__}: {exc!r}")

        t = threading.Thread(target=guarded, daemon=True)
        t.start()
        return t

    try:
        admin = AdminClient({"bootstrap.servers": bs, **QUIET})
        admin.create_topics([NewTopic(TOPIC, 1)])[TOPIC].result(15)
        res = ConfigResource(ResourceType.GROUP, "soak-share", incremental_configs=[
            ConfigEntry("share.auto.offset.reset", "earliest", incremental_operation=AlterConfigOpType.SET)])
        admin.incremental_alter_configs([res])[res].result(15)
        seg = args.segment_bytes if args.segment_bytes is not None else "broker default"
        print(f"{args.rate} records/s for {args.minutes:g} min; a consumer group committing after every poll and "
              f"a share group; internal segment.bytes {seg}")
        print(f"{'min':>5s} {'produced':>9s} {'group':>9s} {'share':>9s} {'RSS MiB':>8s} {'fds':>5s} "
              f"{'offsets KiB':>12s} {'segs':>4s} {'share-state KiB':>16s} {'segs':>4s}", flush=True)
        threads = [run(produce), run(group_consume), run(share_consume)]
        t0 = time.monotonic()
        end = t0 + args.minutes * 60
        next_row = t0
        path = Path(data)
        while True:
            now = time.monotonic()
            if now >= next_row or now >= end:
                off = topic_size(path, INTERNAL[0])
                state = topic_size(path, INTERNAL[1])
                print(f"{(now - t0) / 60:5.1f} {counts['produced']:9d} {counts['group']:9d} {counts['share']:9d} "
                      f"{rss_mib(proc.pid):8.1f} {len(os.listdir(f'/proc/{proc.pid}/fd')):5d} "
                      f"{off[0] / 1024:12.0f} {off[1]:4d} {state[0] / 1024:16.0f} {state[1]:4d}", flush=True)
                next_row += args.interval
                if proc.poll() is not None:
                    errors.append(f"broker exited with {proc.returncode}")
                    break
            if now >= end:
                break
            time.sleep(min(1.0, max(0.0, min(next_row, end) - time.monotonic())))
        stop.set()
        for t in threads:
            t.join(30)
        print("errors: " + ("; ".join(errors) if errors else "none"))
    finally:
        stop.set()
        if proc.poll() is None:
            proc.terminate()
            proc.wait(60)
        shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    main()
