"""Share groups and transactions: ``share.isolation.level``.

With read_committed, share consumers get only records below the last stable offset and
never a record of an aborted transaction (its records are archived, and so are the
markers); with read_uncommitted (the default) they get every record.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from confluent_kafka import Producer

from tests.integration.test_share_consumer import consume_until, set_group_configs, share_consumer
from tests.support.broker import BrokerProcess
from tests.support.clients import create_topic, rdkafka_conf

pytestmark = pytest.mark.integration


def _collect(bootstrap: str, group: str, topic: str, consumers: int, until: Any, timeout_s: float) -> list[bytes]:
    got: list[bytes] = []
    lock = threading.Lock()
    stop = threading.Event()

    def handle(msgs: list[Any]) -> None:
        with lock:
            got.extend(m.value() for m in msgs)

    threads = [threading.Thread(target=consume_until, args=(share_consumer(bootstrap, group, topic), stop, handle))
               for _ in range(consumers)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            with lock:
                if until(list(got)):
                    break
            time.sleep(0.2)
        time.sleep(1.0)  # anything else that would come
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    return got


def test_read_committed_share_consumers_never_get_aborted_or_open_records(broker: BrokerProcess,
                                                                         topic_name: str) -> None:
    bs = broker.bootstrap
    create_topic(bs, topic_name, partitions=2)
    for g in ("rc", "ru"):
        set_group_configs(bs, g, share_auto_offset_reset="earliest")
    set_group_configs(bs, "rc", share_isolation_level="read_committed")
    p = Producer(rdkafka_conf(bs, **{"transactional.id": "tx-share", "linger.ms": 5}))
    p.init_transactions(15)
    committed: list[bytes] = []
    aborted: list[bytes] = []
    for t in range(10):
        p.begin_transaction()
        values = [b"t%d-%d" % (t, i) for i in range(20)]
        for i, v in enumerate(values):
            p.produce(topic_name, v, partition=i % 2)
        p.flush(15)
        if t % 3 == 1:
            p.abort_transaction(15)
            aborted += values
        else:
            p.commit_transaction(15)
            committed += values
    # one more transaction left open: above the last stable offset
    p.begin_transaction()
    p.produce(topic_name, b"open", partition=0)
    p.flush(15)

    got = _collect(bs, "rc", topic_name, 8, lambda g: len(g) >= len(committed), 60)
    assert sorted(got) == sorted(committed)
    everything = _collect(bs, "ru", topic_name, 8, lambda g: len(g) >= len(committed) + len(aborted) + 1, 60)
    assert sorted(everything) == sorted(committed + aborted + [b"open"])
    p.commit_transaction(15)
    got = _collect(bs, "rc", topic_name, 2, lambda g: b"open" in g, 30)
    assert got == [b"open"]


def test_read_committed_start_offset_moves_past_markers_and_aborted_records(broker: BrokerProcess,
                                                                           topic_name: str) -> None:
    """KIP-932: the records of aborted transactions and the markers are archived as gaps, so
    the share-partition start offset moves past them even when nothing follows them."""
    import subprocess
    import sys

    bs = broker.bootstrap
    create_topic(bs, topic_name, partitions=1)
    set_group_configs(bs, "rc-end", share_auto_offset_reset="earliest", share_isolation_level="read_committed")
    p = Producer(rdkafka_conf(bs, **{"transactional.id": "tx-share-end", "linger.ms": 5}))
    p.init_transactions(15)
    for values, commit in (([b"c0", b"c1", b"c2"], True), ([b"a0", b"a1"], False)):
        p.begin_transaction()
        for v in values:
            p.produce(topic_name, v, partition=0)
        p.flush(15)
        if commit:
            p.commit_transaction(15)
        else:
            p.abort_transaction(15)
    # offsets: c0-c2 0-2, commit marker 3, a0-a1 4-5, abort marker 6: the log ends at 7
    got = _collect(bs, "rc-end", topic_name, 1, lambda g: len(g) >= 3, 30)
    assert sorted(got) == [b"c0", b"c1", b"c2"]

    def start_offset() -> int:
        out = subprocess.run([sys.executable, "-m", "shoal", "share-groups", "--bootstrap-server", bs, "--describe",
                              "--group", "rc-end", "--offsets"], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        rows = [line.split() for line in out.stdout.splitlines() if line.startswith("rc-end ")]
        return int(rows[0][3])

    deadline = time.monotonic() + 20
    while start_offset() != 7:
        assert time.monotonic() < deadline, f"the start offset stayed at {start_offset()}"
        time.sleep(0.5)
