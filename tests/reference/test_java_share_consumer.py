"""Apache Kafka's KafkaShareConsumer (the reference KIP-932 client) against shoal.

Each scenario runs in one JVM (tests/reference/java/ShareDriver.java) that prints every
delivery its consumers saw; the assertions here are about what the clients saw: which
records, how often, with which delivery count, and the share-group start offset that
Admin.listShareGroupOffsets reports afterwards.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections import Counter

import pytest

from tests.reference.driver import parse
from tests.support.kafka_ref import run_tool

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


def create_topic(bootstrap: str, topic: str, partitions: int = 1) -> None:
    run_tool("kafka-topics", "--bootstrap-server", bootstrap, "--create", "--topic", topic,
             "--partitions", str(partitions), "--replication-factor", "1")


def test_eight_explicit_consumers_on_one_partition(shoal, java) -> None:
    """8 consumers, explicit acknowledgement, one partition, 100k records: release 1 in 50
    (on its first delivery), reject 1 in 100, accept the rest."""
    n = 100_000
    create_topic(shoal.bootstrap, "share-eight")
    out = parse(java("ShareDriver").run("explicit", shoal.bootstrap, "share-eight", "eight", f"produce={n}",
                                        f"records={n}", "consumers=8", "release=50", "reject=100",
                                        "timeout.ms=400000", timeout=500))
    assert out.errors == [], out.errors[:10]
    seen = out.by_value()
    assert set(seen) == {str(i) for i in range(n)}, f"{n - len(seen)} records never delivered"
    wrong = []
    for i in range(n):
        got = [(d.offset, d.delivery_count, d.action) for d in seen[str(i)]]
        if i % 100 == 1:
            want = [(i, 1, "J")]  # rejected: delivered once, never again
        elif i % 50 == 0:
            want = [(i, 1, "R"), (i, 2, "A")]  # released once, then delivered again with count 2
        else:
            want = [(i, 1, "A")]
        if got != want:
            wrong.append((i, got, want))
    assert wrong == [], f"{len(wrong)} records delivered wrongly, e.g. {wrong[:5]}"
    accepted = Counter(d.value for d in out.deliveries if d.action == "A")
    assert len(accepted) == n - n // 100 and set(accepted.values()) == {1}
    # Every record is accepted or archived: the share-partition start offset is past all of them.
    assert out.start_offsets == {0: (n, 0)}
    # The records were shared: more than one consumer got work.
    per_consumer = Counter(d.consumer for d in out.deliveries)
    assert len(per_consumer) >= 2, per_consumer


def test_implicit_acknowledgement(shoal, java) -> None:
    """Implicit mode: records polled are accepted by the next poll or commit (sync and async)."""
    n = 3000
    create_topic(shoal.bootstrap, "share-implicit")
    out = parse(java("ShareDriver").run("implicit", shoal.bootstrap, "share-implicit", "implicit",
                                        f"produce={n}", f"records={n}", "consumers=2", "max.poll.records=200"))
    assert out.errors == []
    seen = out.by_value()
    assert sorted(seen, key=int) == [str(i) for i in range(n)]
    assert all(len(ds) == 1 and ds[0].delivery_count == 1 and ds[0].offset == int(v) for v, ds in seen.items())
    assert out.start_offsets == {0: (n, 0)}


def test_consumer_killed_mid_work(shoal, java) -> None:
    """A consumer holding acquired records is SIGKILLed: its records go to another consumer
    with delivery count 2; nothing is lost and nothing accepted twice."""
    n = 50
    create_topic(shoal.bootstrap, "share-killed")
    prog = java("ShareDriver")
    victim = subprocess.Popen(prog.command("hold", shoal.bootstrap, "share-killed", "killed", f"produce={n}",
                                           "max.poll.records=10", "share.record.lock.duration.ms=3000"),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        held_line = None
        deadline = time.monotonic() + 120
        assert victim.stdout is not None
        lines = []
        while time.monotonic() < deadline:
            line = victim.stdout.readline()
            if not line:
                break
            lines.append(line)
            if line.startswith("H "):
                held_line = line
                break
        assert held_line is not None, f"victim acquired nothing: {lines}"
        held = [int(x) for x in held_line.split()[2:]]
    finally:
        victim.send_signal(signal.SIGKILL)
        victim.wait()
    assert 1 <= len(held) <= n  # max.poll.records is a soft limit: whole log batches are acquired
    out = parse(prog.run("drain", shoal.bootstrap, "share-killed", "killed", f"records={n}"))
    assert out.errors == []
    seen = out.by_value()
    assert sorted(seen, key=int) == [str(i) for i in range(n)]
    for v, ds in seen.items():
        assert len(ds) == 1 and ds[0].action == "A", (v, ds)
        assert ds[0].delivery_count == (2 if int(v) in held else 1), (v, ds, held)
    assert out.start_offsets == {0: (n, 0)}


def test_delivery_count_limit(shoal, java) -> None:
    """A record released on every delivery is delivered share.delivery.count.limit times,
    then archived."""
    create_topic(shoal.bootstrap, "share-limit")
    out = parse(java("ShareDriver").run("limit", shoal.bootstrap, "share-limit", "limit", "produce=10",
                                        "records=10", "victim=3", "share.delivery.count.limit=3"))
    assert out.errors == []
    seen = out.by_value()
    assert [(d.delivery_count, d.action) for d in seen["3"]] == [(1, "R"), (2, "R"), (3, "R")]
    assert all([(d.delivery_count, d.action) for d in seen[str(i)]] == [(1, "A")] for i in range(10) if i != 3)
    assert out.start_offsets == {0: (10, 0)}


def test_renew_keeps_records_past_the_lock_duration(shoal, java) -> None:
    """RENEW (KIP-1222) extends the acquisition lock: a consumer holds its records for
    three lock durations while another consumer polls, and still accepts them."""
    n = 20
    create_topic(shoal.bootstrap, "share-renew")
    out = parse(java("ShareDriver").run("renew", shoal.bootstrap, "share-renew", "renew", f"produce={n}",
                                        f"records={n}", "max.poll.records=5", "share.record.lock.duration.ms=2000",
                                        "hold.ms=6000", "renew.every.ms=700"))
    assert out.errors == []
    mine = {d.value for d in out.deliveries if d.consumer == 0 and d.action == "N"}
    assert mine, "the renewing consumer got nothing"
    accepted = Counter(d.value for d in out.deliveries if d.action == "A")
    assert sorted(accepted, key=int) == [str(i) for i in range(n)] and set(accepted.values()) == {1}
    for d in out.deliveries:
        if d.value in mine:
            assert d.consumer == 0 and d.delivery_count == 1, d  # never timed out, never given to another
    assert out.start_offsets == {0: (n, 0)}
