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
