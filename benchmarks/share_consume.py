"""Share-group consume throughput against a fresh ``shoal serve``, with confluent-kafka.

(a) One ShareConsumer (implicit acknowledgement) on one partition, next to a plain
    consumer (assign, no group) reading the same records from the same broker.
(b) A simulated 5 ms of processing per record: throughput as the number of
    ShareConsumers (threads) on ONE partition grows; the ideal is N x 200 records/s.
(c) Queue work on ONE partition: ``--queue-consumers`` ShareConsumers (default 8, one
    process each) acknowledge every record explicitly (ACCEPT) as fast as they can;
    ``--records`` records of ``--queue-value-bytes`` (default 1 KiB) produced first.
    Printed: records/s from the first record received to the last, the broker's CPU,
    and the duplicates and missing offsets over all consumers (0 and 0 expected).

    python benchmarks/share_consume.py            # both
    python benchmarks/share_consume.py --only a --records 200000
    python benchmarks/share_consume.py --only b --consumers 1,2,4,8,16,32,64 --max-poll-records 20
    python benchmarks/share_consume.py --only c --records 200000 --queue-consumers 8

``--kafka`` runs the same cases against Apache Kafka afterwards (the jars of
reference/kafka/kit.sh, Java 17+; share groups enabled, Kafka's defaults otherwise) and
prints shoal's figures over Kafka's.

Each case also prints what the share coordinator wrote to ``__share_group_state`` meanwhile
(read from its segment files): records, bytes, and bytes per write and per acknowledged
record.
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
import multiprocessing
from typing import Any
import time
import uuid

from confluent_kafka import AcknowledgeType, Consumer, Producer, ShareConsumer, TopicPartition
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic, ResourceType

QUIET = {"log_level": 3}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_shoal(data_dir: str, overrides: list[str]) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    # One share group per measured row: more than group.share.max.groups' default of 10 (100 is its maximum).
    extra = [x for o in ["group.share.max.groups=100", *overrides] for x in ("-o", o)]
    proc = subprocess.Popen([sys.executable, "-m", "shoal", "serve", "--port", str(port), "--data-dir", data_dir,
                             "--log-level", "WARNING", *extra], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return proc, port
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("broker did not start")


def state_log_totals(data_dir: str) -> tuple[int, int]:
    """(records, bytes) in the record batches of every ``__share_group_state`` segment."""
    records = size = 0
    for name in os.listdir(data_dir):
        if not name.startswith("__share_group_state-"):
            continue
        part = os.path.join(data_dir, name)
        for seg in os.listdir(part):
            if not seg.endswith(".log"):
                continue
            with open(os.path.join(part, seg), "rb") as f:
                data = f.read()
            pos = 0
            while pos + 61 <= len(data):
                length = int.from_bytes(data[pos + 8:pos + 12], "big")
                if length <= 0 or pos + 12 + length > len(data):
                    break
                records += int.from_bytes(data[pos + 57:pos + 61], "big")
                size += 12 + length
                pos += 12 + length
    return records, size


def print_state_writes(label: str, before: tuple[int, int], after: tuple[int, int], acknowledged: int) -> None:
    writes, size = after[0] - before[0], after[1] - before[1]
    print(f"    {label}: __share_group_state grew by {writes} records, {size} bytes: "
          f"{size / max(writes, 1):.1f} B per write, {size / max(acknowledged, 1):.2f} B per acknowledged record")


def setup(bs: str, topic: str, group: str, count: int, value_size: int, batch_records: int) -> None:
    admin = AdminClient({"bootstrap.servers": bs, **QUIET})
    admin.create_topics([NewTopic(topic, 1)])[topic].result(15)
    res = ConfigResource(ResourceType.GROUP, group, incremental_configs=[
        ConfigEntry("share.auto.offset.reset", "earliest", incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([res])[res].result(15)
    p = Producer({"bootstrap.servers": bs, "acks": "all", "linger.ms": 5, "batch.num.messages": batch_records,
                  "batch.size": 1_000_000, **QUIET})
    value = b"x" * value_size
    for _ in range(count):
        while True:
            try:
                p.produce(topic, value)
                break
            except BufferError:
                p.poll(0.01)
    p.flush(60)


def plain_consume(bs: str, topic: str, count: int) -> float:
    c = Consumer({"bootstrap.servers": bs, "group.id": "unused", "enable.auto.commit": False,
                  "fetch.queue.backoff.ms": 1, **QUIET})
    c.assign([TopicPartition(topic, 0, 0)])
    n = 0
    t0 = time.perf_counter()
    while n < count:
        n += sum(1 for m in c.consume(1000, 1.0) if m.error() is None)
    dt = time.perf_counter() - t0
    c.close()
    return count / dt


def share_consume(bs: str, topic: str, group: str, count: int, max_poll_records: int = 2000
                  ) -> tuple[float, float, int]:
    """Records/s, the seconds spent inside poll() after the first records, and the polls that returned records."""
    c = ShareConsumer({"bootstrap.servers": bs, "group.id": group, "max.poll.records": max_poll_records, **QUIET})
    c.subscribe([topic])
    n = 0
    t0 = None
    in_poll = 0.0
    polls = 0
    while n < count:
        p0 = time.perf_counter()
        messages = c.poll(1.0)
        if t0 is not None:
            in_poll += time.perf_counter() - p0
        got = sum(1 for m in messages if m.error() is None)
        if got:
            polls += 1
            if t0 is None:
                t0 = time.perf_counter()
        n += got
    assert t0 is not None
    dt = time.perf_counter() - t0
    c.commit_sync()
    c.close()
    return count / dt, in_poll, polls


def case_a(bs: str, pid: int, data_dir: str, count: int, batch_records: int, max_poll_records: int) -> None:
    topic = f"a-{uuid.uuid4().hex[:8]}"
    setup(bs, topic, "bench-a", count, 100, batch_records)
    results = []
    split = (0.0, 0)
    state = ((0, 0), (0, 0))
    for name in ("plain consumer (assign)", "share consumer (implicit ack)"):
        cpu0 = cpu_seconds(pid)
        if name.startswith("plain"):
            rate = plain_consume(bs, topic, count)
        else:
            before = state_log_totals(data_dir)
            rate, in_poll, polls = share_consume(bs, topic, "bench-a", count, max_poll_records)
            split = (in_poll, polls)
            state = (before, state_log_totals(data_dir))
        cpu = cpu_seconds(pid) - cpu0
        results.append((name, rate, cpu))
    print(f"(a) one partition, {count} records of 100 B, {batch_records} records per batch, "
          f"share max.poll.records={max_poll_records}")
    for name, rate, cpu in results:
        print(f"    {name:32s} {rate:10.0f} records/s   broker CPU {cpu * 1e6 / count:6.1f} us/record")
    print(f"    share / plain = {results[1][1] / results[0][1]:.2f}")
    # The ShareConsumer fetches only inside poll(), when nothing is queued: time inside
    # poll() is the round trip (request, broker, response, parsing); the rest is the
    # application's own handling of the records.
    in_poll, polls = split
    outside = count / results[1][1] - in_poll
    print(f"    share client: {polls} polls with records; per poll {in_poll / polls * 1e3:.2f} ms inside poll() "
          f"(fetch round trip), {outside / polls * 1e3:.2f} ms outside; plain consumer "
          f"{count / results[0][1] / polls * 1e3:.2f} ms for as many records")
    print_state_writes("share state", state[0], state[1], count)


def _worker(bs: str, group: str, topic: str, slots: list[int], counts: Any, stop: Any, work_ms: float,
            max_poll_records: int) -> None:
    """One process running ShareConsumers (one thread each) that spend ``work_ms`` per record."""

    def run(i: int) -> None:
        # max.poll.records is sent as the ShareFetch's MaxRecords: it bounds what the
        # broker acquires for this consumer per fetch, so the partition's records are
        # spread over all consumers instead of a few holding hundreds each.
        c = ShareConsumer({"bootstrap.servers": bs, "group.id": group, "max.poll.records": max_poll_records,
                           **QUIET})
        c.subscribe([topic])
        try:
            while not stop.is_set():
                for m in c.poll(0.2):
                    if m.error() is None:
                        if work_ms:
                            time.sleep(work_ms / 1000)
                        counts[i] += 1
        finally:
            c.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in slots]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def case_b(bs: str, pid: int, data_dir: str, consumers: list[int], seconds: float, work_ms: float, max_poll_records: int) -> None:
    print(f"(b) one partition, {work_ms:g} ms of work per record, max.poll.records={max_poll_records}, "
          f"{seconds:g} s measured per row")
    print(f"    {'consumers':>9s} {'records/s':>10s} {'ideal':>8s} {'ratio':>6s} {'active':>6s} {'broker CPU':>10s}"
          f" {'client CPU':>10s}")
    for n in consumers:
        topic = f"b{n}-{uuid.uuid4().hex[:8]}"
        group = f"bench-b{n}"
        ideal = n * 1000 / work_ms
        count = int(ideal * (seconds + 6)) + 1000
        setup(bs, topic, group, count, 100, 5)
        procs = min(n, max(1, n // 4))
        counts = multiprocessing.Array("l", n, lock=False)
        stop = multiprocessing.Event()
        workers = [multiprocessing.Process(target=_worker, args=(bs, group, topic, list(range(i, n, procs)), counts,
                                                                 stop, work_ms, max_poll_records), daemon=True)
                   for i in range(procs)]
        for w in workers:
            w.start()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and sum(1 for c in counts if c) < n:
            time.sleep(0.1)
        time.sleep(1.0)
        start = sum(counts)
        before = list(counts)
        state0 = state_log_totals(data_dir)
        cpu0 = cpu_seconds(pid)
        ccpu0 = sum(cpu_seconds(w.pid) for w in workers if w.pid is not None)
        t0 = time.perf_counter()
        time.sleep(seconds)
        done = sum(counts) - start
        state1 = state_log_totals(data_dir)
        dt = time.perf_counter() - t0
        cpu = (cpu_seconds(pid) - cpu0) / dt
        ccpu = (sum(cpu_seconds(w.pid) for w in workers if w.pid is not None) - ccpu0) / dt
        active = sum(1 for a, b in zip(before, counts) if b > a)
        stop.set()
        for w in workers:
            w.join(30)
        rate = done / dt
        print(f"    {n:9d} {rate:10.0f} {ideal:8.0f} {rate / ideal:6.2f} {active:6d} {cpu:9.0%} {ccpu:10.0%}",
              flush=True)
        # Records consumed in the window stand for those acknowledged in it (implicit
        # acknowledgement sends them with the next poll).
        print_state_writes(f"{n} consumers", state0, state1, done)

def _queue_worker(bs: str, group: str, topic: str, count: int, done: Any, first: Any, out: Any) -> None:
    """One ShareConsumer acknowledging (ACCEPT) every record until ``count`` are taken in all."""
    c = ShareConsumer({"bootstrap.servers": bs, "group.id": group, "share.acknowledgement.mode": "explicit",
                       **QUIET})
    c.subscribe([topic])
    offsets: list[int] = []
    try:
        while done.value < count:
            messages = c.poll(0.2)
            for m in messages:
                if m.error() is None:
                    c.acknowledge(m, AcknowledgeType.ACCEPT)
                    offsets.append(m.offset())
            if offsets and not first.value:
                first.value = time.perf_counter()
            if messages:
                with done.get_lock():
                    done.value += sum(1 for m in messages if m.error() is None)
                    if done.value >= count:
                        out.put(("end", time.perf_counter()))
        c.commit_sync()
    finally:
        c.close()
        out.put(("offsets", offsets))


def case_c(bs: str, pid: int, data_dir: str, consumers: int, count: int, value_size: int) -> float:
    topic = f"c-{uuid.uuid4().hex[:8]}"
    group = "bench-c"
    setup(bs, topic, group, count, value_size, 500)
    done = multiprocessing.Value("q", 0)
    first = multiprocessing.Value("d", 0.0, lock=False)
    out: Any = multiprocessing.Queue()
    cpu0 = cpu_seconds(pid)
    state0 = state_log_totals(data_dir)
    procs = [multiprocessing.Process(target=_queue_worker, args=(bs, group, topic, count, done, first, out),
                                     daemon=True) for _ in range(consumers)]
    for w in procs:
        w.start()
    end = 0.0
    taken: list[int] = []
    reports = 0
    while reports < consumers:
        kind, value = out.get(timeout=600)
        if kind == "end":
            end = value
            cpu1 = cpu_seconds(pid)
        else:
            taken += value
            reports += 1
    for w in procs:
        w.join(30)
    state1 = state_log_totals(data_dir)
    distinct = set(taken)
    rate = count / (end - first.value)
    print(f"(c) one partition, {consumers} ShareConsumers acknowledging each record (explicit ACCEPT), "
          f"{count} records of {value_size} B")
    print(f"    {rate:10.0f} records/s   broker CPU {(cpu1 - cpu0) * 1e6 / count:6.1f} us/record   "
          f"duplicates {len(taken) - len(distinct)}   missing {len(set(range(count)) - distinct)}")
    print_state_writes("share state", state0, state1, count)
    return rate


def run_cases(args: argparse.Namespace, bs: str, pid: int, data_dir: str) -> float | None:
    """The cases ``--only`` selects; (c)'s records/s when it ran."""
    if args.only in (None, "a"):
        case_a(bs, pid, data_dir, args.records, args.batch_records, args.share_max_poll_records)
    if args.only in (None, "b"):
        case_b(bs, pid, data_dir, [int(x) for x in args.consumers.split(",")], args.seconds, args.work_ms,
               args.max_poll_records)
    if args.only in (None, "c"):
        return case_c(bs, pid, data_dir, args.queue_consumers, args.records, args.queue_value_bytes)
    return None


def run_on_kafka(args: argparse.Namespace) -> float | None:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from pathlib import Path

    from tests.support.kafka_ref import KafkaBroker

    work = Path(tempfile.mkdtemp(prefix="kafka-share-bench-"))
    # Kafka's own defaults, except what the test kit sets for a one-broker cluster (replication
    # factors of 1, share groups enabled) and the group limit shoal's run raises too.
    kafka = KafkaBroker(work, overrides={"group.share.max.groups": "100"}).start()
    try:
        assert kafka.proc is not None
        print(f"Apache Kafka at {kafka.bootstrap}")
        return run_cases(args, kafka.bootstrap, kafka.proc.pid, str(kafka.data_dir))
    finally:
        kafka.stop()
        shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", choices=("a", "b", "c"))
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--consumers", default="1,2,4,8,16,32,64")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--work-ms", type=float, default=5.0)
    ap.add_argument("--max-poll-records", type=int, default=20,
                    help="(b) each ShareConsumer's max.poll.records (20 x 5 ms = 100 ms of work per poll)")
    ap.add_argument("--batch-records", type=int, default=500, help="(a) records per produced batch")
    ap.add_argument("--share-max-poll-records", type=int, default=2000,
                    help="(a) the ShareConsumer's max.poll.records (records per ShareFetch round trip)")
    ap.add_argument("--queue-consumers", type=int, default=8, help="(c) ShareConsumers on the partition")
    ap.add_argument("--queue-value-bytes", type=int, default=1024, help="(c) record value size")
    ap.add_argument("-o", "--override", action="append", default=[], help="broker KEY=VALUE, repeatable")
    ap.add_argument("--kafka", action="store_true",
                    help="the same cases against Apache Kafka afterwards (reference/kafka/kit.sh's jars)")
    args = ap.parse_args()
    data_dir = tempfile.mkdtemp(prefix="shoal-share-bench-")
    proc, port = start_shoal(data_dir, args.override)
    bs = f"127.0.0.1:{port}"
    print(f"shoal at {bs}")
    try:
        shoal_c = run_cases(args, bs, proc.pid, data_dir)
    finally:
        proc.terminate()
        proc.wait(30)
        shutil.rmtree(data_dir, ignore_errors=True)
    if args.kafka:
        kafka_c = run_on_kafka(args)
        if shoal_c and kafka_c:
            print(f"(c) shoal / Apache Kafka = {shoal_c / kafka_c:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
