"""One share group of many members on one broker: joins, heartbeat latency, fencing.

Usage:
    python benchmarks/share_members.py [TREE ...] [--members 1000] [--rounds 1] [--steady 30]
        [--ramp 0] [--real 0 --real-procs 4]

Per tree (default: this checkout) and round, in alternating tree order: one ``shoal
serve`` (``PYTHONPATH=TREE``) with broker defaults on a temp data dir, except
``group.share.max.size=1000`` (Kafka's default, 200, refuses the 201st member; 1000 is its
ceiling); a topic of 8 partitions with a producer writing 200 one-KiB records/s; then
``--members`` members of ONE share group, each on its own connection, all started at once
(``--ramp S`` spreads the starts over S seconds), driven by one asyncio loop of raw
ShareGroupHeartbeat v1 requests at the interval the broker answers (5 s by default; see
``tests/support/share_members.py``). Once every member holds a partition (or 180 s
passed) the members heartbeat ``--steady`` seconds more, then leave.

Printed per run: members joined / N and how long until all joined and all held a
partition; heartbeat latency p50/p99 over the whole run and over the steady part (client
side: request written -> answer read); members fenced (UNKNOWN_MEMBER_ID /
FENCED_MEMBER_EPOCH answers to members that had joined, and members the broker logged as
having left before the members were stopped, which only session expiry does here);
connection attempts that failed and connections lost; the broker's CPU (seconds, and
percent of one core) over the run.

``--real N`` adds, after the raw members, a run of N confluent-kafka ShareConsumers in
``--real-procs`` processes against a fresh broker (each a librdkafka instance with its
own threads), polling until ``--steady`` seconds after all joined; printed: members the
group reports then and at the end, records consumed, consumers' errors, members the broker
logged as removed before the consumers closed, and the consumer processes' threads and
resident memory.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from produce_consume import cpu_seconds, free_port, wait_port

from tests.support.share_members import run_members, summary

TOPIC = "members"
PARTITIONS = 8
RECORDS_PER_S = 200
LEFT = re.compile(r"group (\S+) \(share\): member (\S+) left")


def start(tree: str, data_dir: str, cwd: str, log_path: str) -> tuple[subprocess.Popen[bytes], str, Any]:
    port = free_port()
    log_file = open(log_path, "wb")  # noqa: SIM115 (closed by stop())
    args = [sys.executable, "-m", "shoal", "serve", "--port", str(port), "--data-dir", data_dir,
            "-o", "group.share.max.size=1000"]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=log_file,
                            env=dict(os.environ, PYTHONPATH=tree), cwd=cwd)
    wait_port(port)
    return proc, f"127.0.0.1:{port}", log_file


def stop(proc: subprocess.Popen[bytes], log_file: Any) -> None:
    proc.terminate()
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    log_file.close()


def create_topic(bootstrap: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap, "broker.address.family": "v4"})
    admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)])[TOPIC].result(30)


def produce_loop(bootstrap: str, halt: threading.Event) -> None:
    """RECORDS_PER_S one-KiB records a second over the topic's partitions, until ``halt``."""
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "broker.address.family": "v4", "linger.ms": 20})
    value = b"x" * 1024
    t0 = time.perf_counter()
    sent = 0
    while not halt.is_set():
        due = int((time.perf_counter() - t0) * RECORDS_PER_S)
        while sent < due:
            p.produce(TOPIC, value=value, partition=sent % PARTITIONS)
            sent += 1
        p.poll(0.05)
    p.flush(10)


def left_members(log_path: str, group: str) -> set[str]:
    out = set()
    for line in Path(log_path).read_text(errors="replace").splitlines():
        m = LEFT.search(line)
        if m and m.group(1) == group:
            out.add(m.group(2))
    return out


def raw_run(tree: str, tmp: str, tag: str, args: argparse.Namespace) -> dict[str, Any]:
    log_path = os.path.join(tmp, f"broker-{tag}.log")
    proc, bootstrap, log_file = start(tree, os.path.join(tmp, f"data-{tag}"), tmp, log_path)
    halt = threading.Event()
    producer = threading.Thread(target=produce_loop, args=(bootstrap, halt), daemon=True)
    try:
        create_topic(bootstrap)
        producer.start()
        group = f"members-{uuid.uuid4().hex[:8]}"
        cpu0, t0 = cpu_seconds(proc.pid), time.perf_counter()
        expired: set[str] = set()
        # Members leave once stopped: what the log says left before is session expiry.
        report = asyncio.run(run_members(bootstrap, group, TOPIC, args.members, steady_s=args.steady,
                                         join_timeout_s=180, ramp_s=args.ramp,
                                         before_leave=lambda: expired.update(left_members(log_path, group))))
        cpu1, t1 = cpu_seconds(proc.pid), time.perf_counter()
        s = summary(report)
        s["expired"] = len(expired)
        s["broker_cpu_s"] = cpu1 - cpu0
        s["broker_cpu_pct"] = 100 * (cpu1 - cpu0) / (t1 - t0)
        s["seconds"] = t1 - t0
        return s
    finally:
        halt.set()
        producer.join(15)
        stop(proc, log_file)


def _consumers_proc(bootstrap: str, group: str, count: int, stop: Any, ready: Any, out: Any) -> None:
    from confluent_kafka import ShareConsumer

    consumers = []
    errors = 0
    for _ in range(count):
        c = ShareConsumer({"bootstrap.servers": bootstrap, "broker.address.family": "v4", "group.id": group,
                           "log_level": 3})
        c.subscribe([TOPIC])
        consumers.append(c)
    ready.put(count)
    got = 0
    while not stop.is_set():
        for c in consumers:
            try:
                for m in c.poll(0.01):
                    if m.error() is None:
                        got += 1
                    else:
                        errors += 1
            except Exception:
                errors += 1
    for c in consumers:
        try:
            c.close()
        except Exception:
            errors += 1
    out.put((got, errors))


def describe_members(bootstrap: str, group: str) -> int:
    from kio.schema.share_group_describe.v1.request import ShareGroupDescribeRequest

    from tests.support.wire import RawConnection

    try:
        with RawConnection(bootstrap, timeout_s=30) as conn:
            r = conn.request(ShareGroupDescribeRequest(group_ids=(group,), include_authorized_operations=False))
            return len(r.groups[0].members)
    except OSError:  # a broker that does not answer within 30 s
        return -1


def real_run(tree: str, tmp: str, tag: str, args: argparse.Namespace) -> dict[str, Any]:
    log_path = os.path.join(tmp, f"broker-{tag}.log")
    proc, bootstrap, log_file = start(tree, os.path.join(tmp, f"data-{tag}"), tmp, log_path)
    halt = threading.Event()
    producer = threading.Thread(target=produce_loop, args=(bootstrap, halt), daemon=True)
    procs: list[multiprocessing.Process] = []
    try:
        create_topic(bootstrap)
        producer.start()
        group = f"real-{uuid.uuid4().hex[:8]}"
        ctx = multiprocessing.get_context("spawn")
        ready, out, halt_consumers = ctx.Queue(), ctx.Queue(), ctx.Event()
        per = [args.real // args.real_procs + (1 if i < args.real % args.real_procs else 0)
               for i in range(args.real_procs)]
        cpu0, t0 = cpu_seconds(proc.pid), time.perf_counter()
        for count in per:
            p = ctx.Process(target=_consumers_proc, args=(bootstrap, group, count, halt_consumers, ready, out))
            p.start()
            procs.append(p)
        for _ in per:
            ready.get(timeout=300)
        seen, all_in = 0, None
        deadline = time.perf_counter() + 60
        while time.perf_counter() < deadline:
            seen = describe_members(bootstrap, group)
            if seen >= args.real:
                all_in = time.perf_counter() - t0
                break
            time.sleep(1)
        time.sleep(args.steady)
        seen_at_end = describe_members(bootstrap, group)
        expired = left_members(log_path, group)  # before the consumers close (and leave)
        rss_mib, threads = 0.0, 0
        for p in procs:  # what the consumers cost the machine, once all of them are in
            status = dict(line.split(":", 1) for line in Path(f"/proc/{p.pid}/status").read_text().splitlines()
                          if ":" in line)
            rss_mib += int(status["VmRSS"].split()[0]) / 1024
            threads += int(status["Threads"])
        cpu1, t1 = cpu_seconds(proc.pid), time.perf_counter()
        halt_consumers.set()
        results = [out.get(timeout=300) for _ in per]
        for p in procs:
            p.join(30)
        return {"members_seen": seen, "members_at_end": seen_at_end, "all_in_s": all_in, "consumed": sum(g for g, _ in results),
                "rss_mib": rss_mib, "threads": threads,
                "consumer_errors": sum(e for _, e in results), "left_per_log": len(expired),
                "broker_cpu_pct": 100 * (cpu1 - cpu0) / (t1 - t0)}
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
                p.join(10)
        halt.set()
        producer.join(15)
        stop(proc, log_file)


def fmt(s: dict[str, Any], n: int) -> str:
    def sec(v: float | None) -> str:
        return "-" if v is None else f"{v:.1f} s"

    return (f"joined {s['joined']}/{n} (all joined {sec(s['all_joined_s'])}, all assigned "
            f"{sec(s['all_assigned_s'])}), assigned {s['assigned']}/{n}; heartbeats {s['heartbeats']}, "
            f"p50 {s['p50_ms']:.0f} ms p99 {s['p99_ms']:.0f} ms (steady p50 {s['steady_p50_ms']:.0f} ms "
            f"p99 {s['steady_p99_ms']:.0f} ms); fenced {s['fenced']} answers, {s['expired']} sessions expired; "
            f"connect failures {s['connect_failures']}, lost connections {s['lost_connections']}, "
            f"errors {s['errors'] or 0}; broker CPU {s['broker_cpu_s']:.1f} s ({s['broker_cpu_pct']:.0f}% "
            f"of a core over {s['seconds']:.0f} s)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trees", nargs="*", default=[str(ROOT)])
    ap.add_argument("--members", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--steady", type=float, default=30.0, help="seconds after every member holds a partition")
    ap.add_argument("--ramp", type=float, default=0.0, help="seconds over which the members start")
    ap.add_argument("--real", type=int, default=0, help="confluent-kafka ShareConsumers for the real-client run")
    ap.add_argument("--real-procs", type=int, default=4)
    args = ap.parse_args()
    trees = [os.path.abspath(t) for t in args.trees]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # stop the brokers on the way out
    print(f"load average at start: {os.getloadavg()[0]:.2f}", flush=True)
    with tempfile.TemporaryDirectory(prefix="shoal-members-") as tmp:
        for rnd in range(args.rounds):
            order = list(range(len(trees)))
            if rnd % 2:
                order.reverse()
            for i in order:
                if args.members:  # --members 0: only the real-client run
                    s = raw_run(trees[i], tmp, f"{rnd}-{i}", args)
                    print(f"round {rnd + 1} tree {i} ({trees[i]}): {args.members} raw members: {fmt(s, args.members)}; "
                          f"load average {os.getloadavg()[0]:.2f}", flush=True)
                if args.real:
                    r = real_run(trees[i], tmp, f"real-{rnd}-{i}", args)
                    after = "" if r["all_in_s"] is None else f" after {r['all_in_s']:.1f} s"
                    print(f"round {rnd + 1} tree {i}: {args.real} ShareConsumers in {args.real_procs} processes: "
                          f"{r['members_seen']} members in the group{after}, "
                          f"{r['consumed']} records consumed, {r['consumer_errors']} consumer errors, "
                          f"{r['members_at_end']} members {args.steady:.0f} s later, "
                          f"{r['left_per_log']} members removed per the broker log; broker CPU "
                          f"{r['broker_cpu_pct']:.0f}%; the consumer processes: {r['threads']} threads, "
                          f"{r['rss_mib']:.0f} MiB resident", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
