"""Share-group throughput on one broker and on a three-broker cluster, and share failover.

Usage:
    python benchmarks/cluster_share_bench.py [--records N] [--consumers C] [--cases 1,3] [--no-failover]

Two clusters on this machine, each on its own etcd, with Kafka's default broker settings:

* ``RF=1, 1 broker``: one broker, a 6-partition topic with replication factor 1;
* ``RF=3, 3 brokers``: three brokers, 6 partitions, replication factor 3,
  min.insync.replicas=2; ``__consumer_offsets`` and ``__share_group_state`` are
  replicated too (their replication factors default to 3).

Per case a backlog of N 100-byte records (600,000 by default) is produced first; then C
ShareConsumers (8 by default, in two processes, implicit acknowledgement,
max.poll.records=500) in one share group consume all of it. Printed: records per second
from the first record received to the last, and the broker processes' CPU.

Failover (RF=3 cluster): eight ShareConsumers consume the backlog spending 1 ms per
record; the broker leading partition 0 is killed with SIGKILL. Printed: the time from the
kill to the end of the first poll that began after the kill and returned records of
partition 0 (the share-partition's new leader serving them), with the default
``broker.session.timeout.ms`` (9000).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cluster_bench import PARTITIONS, Cluster, create_topic  # noqa: E402
from share_consume import _worker as share_worker  # noqa: E402
from confluent_kafka import Producer, ShareConsumer  # noqa: E402
from confluent_kafka.admin import (AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource,  # noqa: E402
                                   ResourceType)

QUIET = {"log_level": 0}
GROUP = "bench-share"
TOPIC = "bench"


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def setup(bootstrap: str, rf: int, count: int) -> None:
    create_topic(bootstrap, TOPIC, rf, {"min.insync.replicas": "2"} if rf == 3 else {})
    admin = AdminClient({"bootstrap.servers": bootstrap, **QUIET})
    res = ConfigResource(ResourceType.GROUP, GROUP, incremental_configs=[
        ConfigEntry("share.auto.offset.reset", "earliest", incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([res])[res].result(15)
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, "batch.size": 1_000_000,
                  "enable.idempotence": True, **QUIET})
    value = b"x" * 100
    for i in range(count):
        while True:
            try:
                p.produce(TOPIC, value, partition=i % PARTITIONS)
                break
            except BufferError:
                p.poll(0.01)
    if p.flush(120) != 0:
        raise RuntimeError("backlog not acknowledged")


def throughput(cluster: Cluster, consumers: int, count: int) -> tuple[float, float]:
    """Records/s from the first record received until all ``count`` were, and the brokers' CPU (1.0 = one core)."""
    # Spawned, not forked: this process already runs librdkafka clients, whose threads a
    # forked child would not have.
    ctx = multiprocessing.get_context("spawn")
    counts = ctx.Array("l", consumers, lock=False)
    stop = ctx.Event()
    procs = 2
    pids = [proc.pid for proc, _ in cluster.brokers.values()]
    workers = [ctx.Process(target=share_worker, args=(cluster.bootstrap, GROUP, TOPIC, list(range(i, consumers, procs)),
                                                      counts, stop, 0, 500), daemon=True) for i in range(procs)]
    for w in workers:
        w.start()
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not sum(counts):
            time.sleep(0.001)
        t0 = time.perf_counter()
        cpu0 = sum(cpu_seconds(pid) for pid in pids)
        while time.monotonic() < deadline and sum(counts) < count:
            time.sleep(0.005)
        dt = time.perf_counter() - t0
        cpu = (sum(cpu_seconds(pid) for pid in pids) - cpu0) / dt
        got = sum(counts)
    finally:
        stop.set()
        for w in workers:
            w.join(30)
    if got < count:
        raise RuntimeError(f"consumed {got} of {count} records")
    return count / dt, cpu


def failover(cluster: Cluster, consumers: int) -> float:
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap, **QUIET})
    leader = admin.list_topics(TOPIC, timeout=5).topics[TOPIC].partitions[0].leader
    stop = threading.Event()
    killed_at = [0.0]
    served_after: list[float] = []
    lock = threading.Lock()

    def run() -> None:
        c = ShareConsumer({"bootstrap.servers": cluster.bootstrap, "group.id": GROUP + "-failover",
                           "max.poll.records": 50, **QUIET})
        c.subscribe([TOPIC])
        try:
            while not stop.is_set():
                began = time.monotonic()
                msgs = [m for m in c.poll(0.2) if m.error() is None]
                ended = time.monotonic()
                if any(m.partition() == 0 for m in msgs) and killed_at[0] and began > killed_at[0]:
                    with lock:
                        served_after.append(ended)
                time.sleep(0.001 * len(msgs))
        finally:
            c.close()

    res = ConfigResource(ResourceType.GROUP, GROUP + "-failover", incremental_configs=[
        ConfigEntry("share.auto.offset.reset", "earliest", incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([res])[res].result(15)
    threads = [threading.Thread(target=run) for _ in range(consumers)]
    for t in threads:
        t.start()
    try:
        time.sleep(5)
        proc = cluster.brokers[leader][0]
        proc.kill()
        proc.wait()
        killed_at[0] = time.monotonic()
        deadline = killed_at[0] + 90
        while not served_after and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    if not served_after:
        raise RuntimeError("partition 0 not served within 90 s of the kill")
    return min(served_after) - killed_at[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--consumers", type=int, default=8)
    ap.add_argument("--records", type=int, default=600_000, help="backlog produced before consuming")
    ap.add_argument("--no-failover", action="store_true")
    ap.add_argument("--cases", default="1,3", help="which cases, by broker count: 1 and/or 3 (default both)")
    args = ap.parse_args()
    rows = []
    fail_s = None
    wanted = {int(x) for x in args.cases.split(",")}
    for name, brokers, rf in (("RF=1, 1 broker", 1, 1), ("RF=3, 3 brokers", 3, 3)):
        if brokers not in wanted:
            continue
        root = Path(tempfile.mkdtemp(prefix="shoal-share-bench-"))
        cluster = Cluster(root, brokers).start()
        try:
            setup(cluster.bootstrap, rf, args.records)
            rate, cpu = throughput(cluster, args.consumers, args.records)
            rows.append((name, rate, cpu))
            if rf == 3 and not args.no_failover:
                fail_s = failover(cluster, args.consumers)
        finally:
            cluster.stop()
            shutil.rmtree(root, ignore_errors=True)
    print(f"{args.consumers} ShareConsumers, {PARTITIONS} partitions, {args.records} records of 100 B")
    print(f"{'case':<18} {'records/s':>10} {'broker CPU':>11}")
    for name, rate, cpu in rows:
        print(f"{name:<18} {rate:>10.0f} {cpu:>10.0%}")
    if len(rows) == 2:
        print(f"RF=3 / RF=1: {rows[1][1] / rows[0][1]:.2f}")
    if fail_s is not None:
        print(f"share-partition leader failover (kill -9 to records served again, "
              f"broker.session.timeout.ms=9000): {fail_s:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
