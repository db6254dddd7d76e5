"""Full Metadata at scale: requests per second, and what it costs a normal producer.

Usage:
    python benchmarks/metadata_scale.py [--topics 2000] [--partitions 1] [--clients 1000]
                                        [--refreshers 100] [--seconds 10] [--messages 1000]
                                        [--handler-only | --skip-handler] [--cached-runs 1000]

To measure an older shoal the same way, run this file with that tree first on
PYTHONPATH from a directory holding no other ``shoal`` (``--cached-runs 5`` when its
handler caches nothing).

Three figures:

1. In process, no sockets: the time the Metadata handler takes to answer a request for
   every topic of a store of ``--topics`` x 5 partitions (10,000 partitions by default),
   for the first request after a change (the snapshot is built and encoded) and for the
   following ones (cached).
2. A real ``shoal serve`` with ``--topics`` topics of ``--partitions`` partitions each
   (each partition holds open files, so the default of 1 stays below a 20,000 fd limit):
   ``--clients`` connections send full Metadata requests (v12, topics null) back to back
   for ``--seconds``; printed: responses per second and their size.
3. A confluent-kafka producer with the client's default settings (acks=all, linger.ms=5)
   sends ``--messages`` records and flushes, three times alone and three times while
   ``--refreshers`` connections refresh full metadata back to back; printed: the medians
   and the slowdown.

The load generators run in a separate process (asyncio, raw sockets), so the producer
and the broker do not share its interpreter.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import multiprocessing
import os
import resource
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from confluent_kafka import Producer  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402
from kio.schema.metadata.v12.request import MetadataRequest  # noqa: E402
from kio.serial import entity_writer  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from produce_consume import free_port, wait_port  # noqa: E402

try:
    from shoal.cluster.metadata import LocalMetadata  # noqa: E402
except ImportError:  # an older shoal (before cluster mode), to measure it the same way
    LocalMetadata = None  # type: ignore[assignment,misc]
from shoal.config import BrokerConfig  # noqa: E402
from shoal.protocol.codec import codec_for, encode_response  # noqa: E402
from shoal.protocol.header import RequestHeader  # noqa: E402
from shoal.server.context import RequestContext  # noqa: E402
from shoal.server.handlers.metadata import handle_metadata  # noqa: E402


def raise_fd_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def metadata_request(correlation_id: int) -> bytes:
    header = struct.pack(">hhih", 3, 12, correlation_id, 5) + b"bench" + b"\x00"
    buf = io.BytesIO()
    entity_writer(MetadataRequest)(buf, MetadataRequest(topics=None, allow_auto_topic_creation=False,
                                                        include_topic_authorized_operations=False))
    body = header + buf.getvalue()
    return struct.pack(">i", len(body)) + body


# -- 1. the handler alone --------------------------------------------------------------
class _Store:
    def __init__(self, topics: int, partitions: int) -> None:
        self._topics = {f"t{i:05d}": SimpleNamespace(name=f"t{i:05d}", topic_id=uuid.uuid4(),
                                                     num_partitions=partitions) for i in range(topics)}
        self.metadata_version = 0
        self._changed: dict[str, int] = {}

    def bump_metadata_version(self, topic: str) -> None:
        self.metadata_version += 1
        self._changed[topic] = self.metadata_version

    def topic_metadata_version(self, name: str) -> int:
        return self._changed.get(name, 0)

    def topics(self) -> list:
        return list(self._topics.values())

    def get_topic(self, name: str) -> object:
        return self._topics.get(name)


def handler_cost(topics: int, partitions: int, cached_runs: int) -> None:
    store = _Store(topics, partitions)
    broker = SimpleNamespace(store=store, extensions={}, node_id=0, advertised_host="127.0.0.1",
                             advertised_port=9092, cluster_id="bench", config=BrokerConfig())
    if LocalMetadata is not None:
        broker.cluster = LocalMetadata(broker)
    codec = codec_for(3, 12)
    header = RequestHeader(3, 12, 1, "bench")
    request = MetadataRequest(topics=None, allow_auto_topic_creation=False,
                              include_topic_authorized_operations=False)
    size = 0

    def once() -> float:
        """Wall time of one request, or of its longest step if it yields to the loop."""
        nonlocal size
        ctx = RequestContext(broker, None, header, codec)  # type: ignore[arg-type]
        t0 = time.perf_counter()
        result = handle_metadata(ctx, request)
        if asyncio.iscoroutine(result):
            longest = 0.0

            async def drive() -> object:
                nonlocal longest
                task = asyncio.ensure_future(result)
                t = time.perf_counter()
                while not task.done():
                    await asyncio.sleep(0)
                    now = time.perf_counter()
                    longest = max(longest, now - t)
                    t = now
                return task.result()

            result = asyncio.run(drive())
            once.longest = longest  # type: ignore[attr-defined]
        pieces = encode_response(codec, 3, 1, result)
        size = sum(len(p) for p in pieces)
        return time.perf_counter() - t0

    cold = once()
    longest = getattr(once, "longest", cold)
    changed = []
    for i in range(min(20, cached_runs)):
        store.bump_metadata_version(f"t{i:05d}")
        changed.append(once())
    cached = sorted(once() for _ in range(cached_runs))
    changed.sort()
    print(f"handler, {topics} topics x {partitions} partitions ({topics * partitions} partitions), "
          f"response {size / 1e6:.2f} MB:")
    print(f"  first request (encodes every topic): {cold * 1000:.0f} ms in all, "
          f"longest step without yielding {longest * 1000:.1f} ms")
    print(f"  after one topic changed: median {changed[len(changed) // 2] * 1000:.2f} ms")
    print(f"  cached ({cached_runs} requests): median {cached[len(cached) // 2] * 1e6:.1f} us, "
          f"p99 {cached[len(cached) * 99 // 100] * 1e6:.1f} us")


# -- load generator (child process) ----------------------------------------------------
async def _refresh_loop(port: int, stop_at: float, counts: list[int], sizes: list[int]) -> None:
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return
    cid = 0
    try:
        while time.monotonic() < stop_at:
            cid += 1
            writer.write(metadata_request(cid))
            size = struct.unpack(">i", await reader.readexactly(4))[0]
            await reader.readexactly(size)
            counts[0] += 1
            sizes[0] = size
    except (OSError, asyncio.IncompleteReadError):
        pass
    finally:
        writer.close()


def _load(port: int, clients: int, seconds: float, ready: multiprocessing.Event, result: multiprocessing.Queue,
          started: multiprocessing.Event | None) -> None:
    raise_fd_limit()

    async def main() -> None:
        counts, sizes = [0], [0]
        if started is not None:
            started.wait()
        t0 = time.monotonic()
        stop_at = t0 + seconds
        tasks = [asyncio.ensure_future(_refresh_loop(port, stop_at, counts, sizes)) for _ in range(clients)]
        ready.set()
        await asyncio.gather(*tasks)
        result.put((counts[0], time.monotonic() - t0, sizes[0]))

    asyncio.run(main())


def start_load(port: int, clients: int, seconds: float) -> tuple[multiprocessing.Process, multiprocessing.Queue,
                                                                  multiprocessing.Event]:
    ready = multiprocessing.Event()
    result: multiprocessing.Queue = multiprocessing.Queue()
    p = multiprocessing.Process(target=_load, args=(port, clients, seconds, ready, result, None), daemon=True)
    p.start()
    return p, result, ready


# -- 3. a producer --------------------------------------------------------------------
def produce(p: Producer, topic: str, count: int) -> float:
    """Seconds to send ``count`` records and have every one acknowledged."""
    start = time.perf_counter()
    for _ in range(count):
        p.produce(topic, b"x" * 100)
        p.poll(0)
    left = p.flush(120)
    elapsed = time.perf_counter() - start
    if left:
        raise RuntimeError(f"{left} messages not delivered")
    return elapsed


def median_of(n: int, fn: Callable[[], float]) -> float:
    return sorted(fn() for _ in range(n))[n // 2]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--topics", type=int, default=2000)
    ap.add_argument("--partitions", type=int, default=1)
    ap.add_argument("--clients", type=int, default=1000)
    ap.add_argument("--refreshers", type=int, default=100)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--messages", type=int, default=1000)
    ap.add_argument("--skip-handler", action="store_true", help="only the figures of a running broker")
    ap.add_argument("--handler-only", action="store_true", help="only the handler's figures")
    ap.add_argument("--cached-runs", type=int, default=1000, help="requests timed once the response is cached")
    args = ap.parse_args()
    raise_fd_limit()

    if not args.skip_handler:
        handler_cost(args.topics, 5, args.cached_runs)
    if args.handler_only:
        return

    tmp = tempfile.mkdtemp(prefix="shoal-metadata-bench-")
    port = free_port()
    broker = subprocess.Popen(
        [sys.executable, "-m", "shoal", "serve", "--port", str(port), "--data-dir", os.path.join(tmp, "data"),
         "--log-level", "WARNING", "-o", "log.flush.interval.messages=1"],
        stdout=subprocess.DEVNULL, stderr=open(os.path.join(tmp, "shoal.log"), "wb"),
    )
    bootstrap = f"127.0.0.1:{port}"
    try:
        wait_port(port)
        admin = AdminClient({"bootstrap.servers": bootstrap})
        t0 = time.perf_counter()
        names = [f"topic-{i:05d}" for i in range(args.topics)]
        for i in range(0, len(names), 200):
            futures = admin.create_topics([NewTopic(n, args.partitions, 1) for n in names[i:i + 200]],
                                          operation_timeout=60)
            for f in futures.values():
                f.result(120)
        print(f"created {args.topics} topics x {args.partitions} partitions in {time.perf_counter() - t0:.1f} s")

        p, result, _ = start_load(port, args.clients, args.seconds)
        count, elapsed, size = result.get(timeout=args.seconds + 300)
        p.join()
        print(f"full Metadata v12, {args.clients} clients for {elapsed:.1f} s: {count / elapsed:.0f} requests/s "
              f"(response {size / 1e3:.0f} kB)")

        # A normal producer: the client's defaults (acks=all, linger.ms=5).
        producer = Producer({"bootstrap.servers": bootstrap, "log_level": 0})
        producer.list_topics(names[0], timeout=10)  # connected, metadata known: time only the sends
        produce(producer, names[0], args.messages)  # warm up
        alone = median_of(3, lambda: produce(producer, names[0], args.messages))
        p, result, ready = start_load(port, args.refreshers, 3600)
        ready.wait(60)
        time.sleep(1.0)  # let every refresher connect and start
        loaded = median_of(3, lambda: produce(producer, names[0], args.messages))
        p.terminate()
        p.join()
        del producer
        print(f"producer, {args.messages} messages (default settings), median of 3: alone {alone:.3f} s, "
              f"while {args.refreshers} clients refresh full metadata {loaded:.3f} s; "
              f"slowdown {loaded / alone:.2f}x")
    finally:
        broker.terminate()
        try:
            broker.wait(60)
        except subprocess.TimeoutExpired:
            broker.kill()
            broker.wait()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
