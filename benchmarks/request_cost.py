"""Broker CPU per small request, and its latency, for one or more source trees of shoal.

Usage:
    python benchmarks/request_cost.py TREE [TREE ...] [--rate N] [--seconds S] [--rounds R]
        [--kinds produce1,produce_all,fetch,fetch1,heartbeat,share_fetch] [-o key=value ...]

Starts one broker per tree (``PYTHONPATH=TREE python -m shoal serve``, run from a
directory outside the trees; a TREE of ``kafka`` or ``kafka-flush`` is Apache Kafka from
the reference kit, reference/kafka/kit.sh, with its default flush policy or with an fsync
per append; ``-o`` applies to shoal's brokers only), then, per round and per kind, drives each broker in turn
(in alternating order, so that each pair sees about the same load on a shared machine)
with raw wire requests sent at a fixed rate (open loop: a request leaves when its time
comes, whether or not earlier ones were answered), round-robin over ``--connections``
connections:

- ``produce1``, ``produce_all``: Produce v9 of one 100-byte record to a one-partition
  topic, acks=1 and acks=all (the broker's flush policy applies: by default shoal fsyncs
  every append, and ``-o log.flush.interval.messages=...`` changes it);
- ``fetch``: Fetch v12 at the log end with max_wait 100 ms (an empty long poll that
  times out);
- ``fetch1``: Fetch v12 of the log's last batch, one 100-byte record (produced first
  when the topic is empty), answered at once;
- ``heartbeat``: ShareGroupHeartbeat v1 of members already in a share group;
- ``share_fetch``: ShareFetch v2 of one record, each acknowledging (ACCEPT) the record the
  member's previous ShareFetch acquired, by ``--connections`` members of a new share group
  on their own connections, over records produced beforehand (one record per batch). A
  member's next ShareFetch needs the previous answer (its session epoch and the offset to
  acknowledge), so this kind is closed loop: each member has one request in flight, and
  the rate printed is the rate achieved (``--rate`` is not used).

Printed per run: the rate achieved, the broker's CPU microseconds per request (user +
system time from /proc/<pid>/stat before and after, at the kernel's clock-tick
resolution), and the p50/p99 latency from a request's scheduled send time to its
response. At the end, per kind and tree, the medians over the rounds, and the ratio of
each tree's median CPU per request to the first tree's.
"""

from __future__ import annotations

import argparse
import datetime
import os
import selectors
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from kio.schema.create_topics.v7 import request as create7
from kio.schema.fetch.v12 import request as fetch12
from kio.schema.produce.v9 import request as produce9
from kio.schema.share_fetch.v2 import request as share_fetch2
from kio.schema.share_group_heartbeat.v1.request import ShareGroupHeartbeatRequest
from kio.static.primitive import i8, i32, i32Timedelta, i64
from produce_consume import cpu_seconds, free_port, wait_port

from shoal.protocol.batch import build_batch
from tests.support.wire import RawConnection, request_bytes

KAFKA_TREES = ("kafka", "kafka-flush")
KINDS = ("produce1", "produce_all", "fetch", "fetch1", "heartbeat", "share_fetch")
TOPIC = "cost"
GROUP = "cost-share"


class _Kafka:
    """Apache Kafka from the reference kit (tests/support/kafka_ref.py) in place of a tree:
    ``kafka`` with its default flush policy, ``kafka-flush`` with an fsync per append."""

    def __init__(self, data_dir: str, flush: bool) -> None:
        from tests.support.kafka_ref import KafkaBroker

        overrides = {"log.flush.interval.messages": "1"} if flush else {}
        self.broker = KafkaBroker(Path(data_dir), overrides=overrides).start()
        assert self.broker.proc is not None
        self.pid = self.broker.proc.pid

    def terminate(self) -> None:
        self.broker.stop()

    def wait(self, timeout: float | None = None) -> int:
        return 0

    def kill(self) -> None:
        self.broker.stop()


def start(tree: str, data_dir: str, cwd: str, overrides: list[str]) -> tuple[Any, str]:
    if tree in KAFKA_TREES:
        kafka = _Kafka(data_dir, tree == "kafka-flush")
        return kafka, kafka.broker.bootstrap
    port = free_port()
    args = [sys.executable, "-m", "shoal", "serve", "--port", str(port), "--data-dir", data_dir,
            "--log-level", "WARNING"]
    for o in overrides:
        args += ["-o", o]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=dict(os.environ, PYTHONPATH=tree), cwd=cwd)
    wait_port(port)
    return proc, f"127.0.0.1:{port}"


def create_topic(bootstrap: str) -> None:
    with RawConnection(bootstrap) as conn:
        r = conn.request(create7.CreateTopicsRequest(
            topics=(create7.CreatableTopic(name=TOPIC, num_partitions=i32(1), replication_factor=1,
                                           assignments=(), configs=()),),
            timeout=i32Timedelta.parse(datetime.timedelta(seconds=30)), validate_only=False))
        assert r.topics[0].error_code.value in (0, 36), r  # none, or topic_already_exists


def produce_template(acks: int) -> bytes:
    batch = build_batch([(None, b"x" * 100, [], int(time.time() * 1000))])
    return request_bytes(produce9.ProduceRequest(
        transactional_id=None, acks=acks, timeout=datetime.timedelta(seconds=30),
        topic_data=(produce9.TopicProduceData(name=TOPIC, partition_data=(
            produce9.PartitionProduceData(index=0, records=batch),)),)), 0)


def fetch_template(offset: int) -> bytes:
    return request_bytes(fetch12.FetchRequest(
        cluster_id=None, replica_id=-1, max_wait=datetime.timedelta(milliseconds=100), min_bytes=1,
        max_bytes=1 << 20, isolation_level=0, session_id=0, session_epoch=-1,
        topics=(fetch12.FetchTopic(topic=TOPIC, partitions=(fetch12.FetchPartition(
            partition=0, current_leader_epoch=-1, fetch_offset=offset, last_fetched_epoch=-1, log_start_offset=-1,
            partition_max_bytes=1 << 20),)),),
        forgotten_topics_data=(), rack_id=""), 0)


def log_end(bootstrap: str) -> int:
    with RawConnection(bootstrap) as conn:
        r = conn.request(fetch12.FetchRequest(
            cluster_id=None, replica_id=-1, max_wait=datetime.timedelta(0), min_bytes=0, max_bytes=1,
            isolation_level=0, session_id=0, session_epoch=-1,
            topics=(fetch12.FetchTopic(topic=TOPIC, partitions=(fetch12.FetchPartition(
                partition=0, current_leader_epoch=-1, fetch_offset=0, last_fetched_epoch=-1, log_start_offset=-1,
                partition_max_bytes=1),)),),
            forgotten_topics_data=(), rack_id=""))
        return int(r.responses[0].partitions[0].high_watermark)


def join_share_members(bootstrap: str, n: int) -> list[tuple[RawConnection, bytes]]:
    """``n`` members of a share group, each on its own connection, with their steady heartbeat.

    The members join one after another (each new member bumps the group's epoch); while
    they join, those that joined earlier heartbeat every 5 s, as clients do. Prints how
    long the joins took."""
    group = f"{GROUP}-{uuid.uuid4().hex[:8]}"
    members: list[list[Any]] = []
    t0 = time.perf_counter()

    def beat(m: list[Any]) -> None:
        r = m[0].request(ShareGroupHeartbeatRequest(group_id=group, member_id=m[1], member_epoch=i32(m[2])))
        assert r.error_code.value == 0, r
        m[2], m[3] = int(r.member_epoch), time.perf_counter()

    for _ in range(n):
        conn = RawConnection(bootstrap, timeout_s=60)
        member_id = str(uuid.uuid4())
        r = conn.request(ShareGroupHeartbeatRequest(group_id=group, member_id=member_id, member_epoch=i32(0),
                                                    subscribed_topic_names=(TOPIC,)))
        assert r.error_code.value == 0, r
        members.append([conn, member_id, int(r.member_epoch), time.perf_counter()])
        for m in members:
            if time.perf_counter() - m[3] > 5:
                beat(m)
    joined = time.perf_counter() - t0
    for _ in range(3):  # until every member has the group's last epoch
        for m in members:
            beat(m)
    if n > 20:
        print(f"  {n} members joined in {joined:.1f} s", flush=True)
    return [(m[0], request_bytes(ShareGroupHeartbeatRequest(group_id=group, member_id=m[1], member_epoch=i32(m[2])),
                                 0)) for m in members]


def share_fetch_loop(bootstrap: str, pid: int, seconds: float, connections: int) -> tuple[float, ...]:
    """The ``share_fetch`` kind: (rate, CPU us per request, p50 ms, p99 ms)."""
    group = f"{GROUP}-fetch-{uuid.uuid4().hex[:8]}"
    conns = [RawConnection(bootstrap, timeout_s=60) for _ in range(connections)]
    try:
        members = []
        topic_id = None
        for conn in conns:
            member_id = str(uuid.uuid4())
            r = conn.request(ShareGroupHeartbeatRequest(group_id=group, member_id=member_id, member_epoch=i32(0),
                                                        subscribed_topic_names=(TOPIC,)))
            assert r.error_code.value == 0, r
            tps = r.assignment.topic_partitions if r.assignment is not None else ()
            if tps:
                topic_id = tps[0].topic_id
            members.append([conn, member_id, int(r.member_epoch), bool(tps)])
        deadline = time.perf_counter() + 30
        pending = members
        while pending:  # until each member has the partition (an assignment is sent when it changes)
            if time.perf_counter() > deadline:
                raise RuntimeError(f"the share group did not assign the partition: {r}")
            for m in pending:
                r = m[0].request(ShareGroupHeartbeatRequest(group_id=group, member_id=m[1], member_epoch=i32(m[2])))
                assert r.error_code.value == 0, r
                m[2] = int(r.member_epoch)
                tps = r.assignment.topic_partitions if r.assignment is not None else ()
                if tps:
                    topic_id, m[3] = tps[0].topic_id, True
            pending = [m for m in members if not m[3]]
            if pending:
                time.sleep(0.2)
        # The share-partition starts at the log end (share.auto.offset.reset latest): the
        # records to fetch come after it; a few more than can be fetched in the time given.
        with RawConnection(bootstrap, timeout_s=60) as producer:
            template = produce_template(1)
            for start in range(0, int(6000 * (seconds + 1)), 500):
                for cid in range(start, start + 500):
                    req = bytearray(template)
                    struct.pack_into(">i", req, 8, cid)
                    producer.send(bytes(req))
                for _ in range(500):
                    producer.read_response(0, 9)

        state = [[m[0], m[1], 0, None] for m in members]  # conn, member id, session epoch, offset to acknowledge

        def one_pass(latencies: list[float]) -> int:
            t0 = time.perf_counter()
            for st in state:
                acks = () if st[3] is None else (share_fetch2.AcknowledgementBatch(
                    first_offset=i64(st[3]), last_offset=i64(st[3]), acknowledge_types=(i8(1),)),)
                st[0].send(request_bytes(share_fetch2.ShareFetchRequest(
                    group_id=group, member_id=st[1], share_session_epoch=i32(st[2]),
                    max_wait=datetime.timedelta(milliseconds=100), min_bytes=i32(1), max_bytes=i32(1 << 20),
                    max_records=i32(1), batch_size=i32(1), share_acquire_mode=i8(1), is_renew_ack=False,
                    topics=(share_fetch2.FetchTopic(topic_id=topic_id, partitions=(share_fetch2.FetchPartition(
                        partition_index=i32(0), acknowledgement_batches=acks),)),),
                    forgotten_topics_data=()), st[2]))
            got = 0
            for st in state:
                _cid, r = st[0].read_response(78, 2)
                latencies.append(time.perf_counter() - t0)
                assert r.error_code == 0, r
                st[2] += 1
                st[3] = None
                for t in r.responses:
                    for p in t.partitions:
                        assert p.error_code == 0 and p.acknowledge_error_code == 0, p
                        for a in p.acquired_records:
                            st[3] = int(a.first_offset)
                            got += 1
            return got

        warm: list[float] = []
        end = time.perf_counter() + 0.5
        while time.perf_counter() < end:
            one_pass(warm)
        lat: list[float] = []
        cpu0, t0 = cpu_seconds(pid), time.perf_counter()
        end = t0 + seconds
        while time.perf_counter() < end:
            if not one_pass(lat):
                raise RuntimeError("ran out of records to fetch")
        cpu1, t1 = cpu_seconds(pid), time.perf_counter()
    finally:
        for c in conns:
            c.close()
    lat.sort()
    return (len(lat) / (t1 - t0), (cpu1 - cpu0) / len(lat) * 1e6, lat[len(lat) // 2] * 1e3,
            lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1e3)


def drive(socks: list[socket.socket], templates: list[bytes], rate: float, seconds: float) -> tuple[int, list[float]]:
    """Send ``rate`` requests/s for ``seconds`` round-robin over ``socks`` (request ``i`` from
    ``templates[i % len]`` with correlation id ``i``), read every response; returns the
    number answered and their latencies (s) from their scheduled send times."""
    sel = selectors.DefaultSelector()
    pending: list[bytearray] = [bytearray() for _ in socks]
    bufs: list[bytearray] = [bytearray() for _ in socks]
    for i, s in enumerate(socks):
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ, i)
    total = int(rate * seconds)
    sched: list[float] = [0.0] * total
    latencies: list[float] = []
    answered = 0
    sent = 0
    t0 = time.perf_counter() + 0.05
    interval = 1.0 / rate
    deadline = t0 + seconds + 30.0
    n = len(socks)
    while answered < total:
        now = time.perf_counter()
        if now > deadline:
            raise RuntimeError(f"only {answered} of {total} answered")
        while sent < total and t0 + sent * interval <= now:
            i = sent % n
            req = bytearray(templates[i])
            struct.pack_into(">i", req, 8, sent)
            sched[sent] = t0 + sent * interval
            pending[i] += req
            sent += 1
        for i, s in enumerate(socks):
            if pending[i]:
                try:
                    k = s.send(pending[i])
                except BlockingIOError:
                    k = 0
                del pending[i][:k]
        wait = (t0 + sent * interval - time.perf_counter()) if sent < total else 0.05
        for key, _ in sel.select(max(wait, 0.0)):
            i = key.data
            chunk = socks[i].recv(1 << 20)
            if not chunk:
                raise RuntimeError("the broker closed a connection")
            buf = bufs[i]
            buf += chunk
            got = time.perf_counter()
            pos = 0
            while len(buf) - pos >= 8:
                (size,) = struct.unpack_from(">i", buf, pos)
                if len(buf) - pos < 4 + size:
                    break
                (cid,) = struct.unpack_from(">i", buf, pos + 4)
                latencies.append(got - sched[cid])
                answered += 1
                pos += 4 + size
            del buf[:pos]
    sel.close()
    for s in socks:
        s.setblocking(True)
    return answered, latencies


def run_kind(kind: str, bootstrap: str, pid: int, rate: float, seconds: float, connections: int) -> tuple[float, ...]:
    if kind == "share_fetch":
        return share_fetch_loop(bootstrap, pid, seconds, connections)
    conns: list[RawConnection] = []
    try:
        if kind == "heartbeat":
            members = join_share_members(bootstrap, connections)
            conns = [c for c, _ in members]
            templates = [t for _, t in members]
        else:
            conns = [RawConnection(bootstrap, timeout_s=60) for _ in range(connections)]
            if kind == "fetch":
                templates = [fetch_template(log_end(bootstrap))]
            elif kind == "fetch1":
                if log_end(bootstrap) == 0:
                    conns[0].send(produce_template(1))
                    conns[0].read_frame()
                templates = [fetch_template(log_end(bootstrap) - 1)]
            else:
                templates = [produce_template(1 if kind == "produce1" else -1)]
            templates = templates * connections
        drive([c.sock for c in conns], templates, rate, 0.5)  # warm up
        cpu0, t0 = cpu_seconds(pid), time.perf_counter()
        answered, lat = drive([c.sock for c in conns], templates, rate, seconds)
        cpu1, t1 = cpu_seconds(pid), time.perf_counter()
    finally:
        for c in conns:
            c.close()
    lat.sort()
    return (answered / (t1 - t0), (cpu1 - cpu0) / answered * 1e6, lat[len(lat) // 2] * 1e3,
            lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1e3)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trees", nargs="+")
    ap.add_argument("--rate", type=float, default=2000.0, help="requests per second (default 2000)")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--connections", type=int, default=4)
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("-o", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="a broker configuration for every broker")
    args = ap.parse_args()
    kinds = [k for k in args.kinds.split(",") if k]
    for k in kinds:
        if k not in KINDS:
            ap.error(f"unknown kind {k}")
    trees = [t if t in KAFKA_TREES else os.path.abspath(t) for t in args.trees]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # stop the brokers on the way out
    results: dict[tuple[str, int], list[tuple[float, ...]]] = {(k, i): [] for k in kinds for i in range(len(trees))}
    with tempfile.TemporaryDirectory(prefix="shoal-cost-") as tmp:
        brokers: list[tuple[Any, str]] = []
        try:
            for i, tree in enumerate(trees):
                brokers.append(start(tree, os.path.join(tmp, f"data-{i}"), tmp, args.overrides))
                create_topic(brokers[-1][1])
            for rnd in range(args.rounds):
                for kind in kinds:
                    order = list(range(len(trees)))
                    if rnd % 2:
                        order.reverse()
                    for i in order:
                        proc, bs = brokers[i]
                        r = run_kind(kind, bs, proc.pid, args.rate, args.seconds, args.connections)
                        results[(kind, i)].append(r)
                        print(f"round {rnd + 1} {kind:11s} tree {i}: {r[0]:7.0f} req/s  {r[1]:6.1f} us CPU/req  "
                              f"p50 {r[2]:6.2f} ms  p99 {r[3]:7.2f} ms", flush=True)
        finally:
            for proc, _ in brokers:
                proc.terminate()
            for proc, _ in brokers:
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
    print("\nmedians (CPU us per request, p50/p99 ms; ratio of CPU to tree 0):")
    for kind in kinds:
        base = statistics.median(r[1] for r in results[(kind, 0)])
        for i, tree in enumerate(trees):
            rs = results[(kind, i)]
            cpu = statistics.median(r[1] for r in rs)
            print(f"  {kind:11s} tree {i} ({tree}): {cpu:6.1f} us  p50 {statistics.median(r[2] for r in rs):6.2f}  "
                  f"p99 {statistics.median(r[3] for r in rs):7.2f}  x{cpu / base:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
