"""Share groups to the letter of KIP-932, over the wire with real clients.

Each test states the rule it checks (the KIP section, or Kafka's behaviour where the
KIP is silent) and drives a real ``shoal serve`` with confluent-kafka's ShareConsumer,
or with raw requests where no client sends them.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from confluent_kafka import ShareConsumer
from confluent_kafka.admin import NewPartitions

from tests.support.broker import BrokerProcess
from tests.support.clients import admin_client, create_topic, producer, rdkafka_conf

pytestmark = pytest.mark.integration


def share_consumer(bootstrap: str, group: str, topic: str, **extra: Any) -> ShareConsumer:
    c = ShareConsumer(rdkafka_conf(bootstrap, **{"group.id": group, **extra}))
    c.subscribe([topic])
    return c


class Polling:
    """A ShareConsumer polled on a thread (implicit acknowledgement), collecting what it gets."""

    def __init__(self, c: ShareConsumer) -> None:
        self.c = c
        self.got: list[tuple[int, int]] = []
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            for m in self.c.poll(0.2):
                if m.error() is None:
                    with self.lock:
                        self.got.append((m.partition(), m.offset()))

    def seen(self) -> set[tuple[int, int]]:
        with self.lock:
            return set(self.got)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(10)
        self.c.close()


def wait_for(what: str, check: Any, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


# --- 1. new partitions start at the earliest offset ---------------------------------------


def test_partitions_added_while_producing_deliver_every_record(broker: BrokerProcess, topic_name: str) -> None:
    """KIP-932 "Managing the SPSO and SPEO": when partitions are added to a subscribed
    topic, the new share-partitions start at offset 0, whatever
    share.auto.offset.reset (latest here) says."""
    bs = broker.bootstrap
    create_topic(bs, topic_name, partitions=1)
    c = Polling(share_consumer(bs, "g", topic_name))
    p = producer(bs, **{"linger.ms": 0, "topic.metadata.refresh.interval.ms": 200})
    produced: set[tuple[int, int]] = set()

    def delivered(err: Any, msg: Any) -> None:
        if err is None:
            produced.add((msg.partition(), msg.offset()))

    try:
        # The group exists once a record produced now is delivered (latest: earlier ones are not).
        def probe() -> bool:
            p.produce(topic_name, value=b"probe", partition=0, on_delivery=delivered)
            p.flush(5)
            time.sleep(0.3)
            return bool(c.seen())

        wait_for("the share group to deliver", probe, 30)
        first = min(o for _p, o in c.seen())
        produced = {(pp, o) for pp, o in produced if o >= first}
        admin = admin_client(bs)
        admin.create_partitions([NewPartitions(topic_name, 4)])[topic_name].result(timeout=10)
        fresh = producer(bs, **{"linger.ms": 0})
        for i in range(200):
            fresh.produce(topic_name, value=b"%d" % i, partition=i % 4, on_delivery=delivered)
            fresh.poll(0)
            if i % 20 == 0:
                time.sleep(0.05)
        assert fresh.flush(15) == 0
        assert {pp for pp, _o in produced} == {0, 1, 2, 3}
        wait_for("every record produced after the group existed", lambda: produced <= c.seen(), 40)
    finally:
        c.close()
