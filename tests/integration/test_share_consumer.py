"""Share groups end to end: confluent-kafka's ShareConsumer against a real ``shoal serve``."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

import pytest
from confluent_kafka import AcknowledgeType, ShareConsumer
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

from tests.support.broker import BrokerProcess
from tests.support.clients import admin_client, create_topic, producer, rdkafka_conf

pytestmark = pytest.mark.integration

SHORT_LOCKS = {"group.share.min.record.lock.duration.ms": "1000"}


def set_group_configs(bootstrap: str, group: str, **configs: str) -> None:
    entries = [ConfigEntry(k.replace("_", "."), v, incremental_operation=AlterConfigOpType.SET)
               for k, v in configs.items()]
    res = ConfigResource(ResourceType.GROUP, group, incremental_configs=entries)
    admin = admin_client(bootstrap)
    admin.incremental_alter_configs([res])[res].result(timeout=10)


def share_consumer(bootstrap: str, group: str, topic: str, **extra: Any) -> ShareConsumer:
    c = ShareConsumer(rdkafka_conf(bootstrap, **{"group.id": group, **extra}))
    c.subscribe([topic])
    return c


def consume_until(c: ShareConsumer, stop: threading.Event, handle: Callable[[list[Any]], None]) -> None:
    """Poll ``c`` until ``stop`` is set, handing each non-empty list of records to ``handle``,
    then close it. A poll that raises (a broker being killed) is tried again."""
    try:
        while not stop.is_set():
            try:
                msgs = [m for m in c.poll(0.3) if m.error() is None]
            except Exception:
                time.sleep(0.1)
                continue
            if msgs:
                handle(msgs)
    finally:
        try:
            c.close()
        except Exception:
            pass


def produce(bootstrap: str, topic: str, n: int, start: int = 0, **extra: Any) -> None:
    p = producer(bootstrap, **extra)
    for i in range(start, start + n):
        p.produce(topic, value=b"%d" % i)
        p.poll(0)
    assert p.flush(15) == 0


def poll_until(c: ShareConsumer, done: Callable[[], bool], timeout_s: float,
               on_message: Callable[[Any], None]) -> None:
    deadline = time.monotonic() + timeout_s
    while not done() and time.monotonic() < deadline:
        for m in c.poll(0.5):
            if m.error() is None:
                on_message(m)


def poll_for(c: ShareConsumer, seconds: float) -> list[Any]:
    out: list[Any] = []
    poll_until(c, lambda: False, seconds, out.append)
    return out


def offsets(msgs: Iterable[Any]) -> list[int]:
    return [m.offset() for m in msgs]


@pytest.fixture
def earliest(broker: BrokerProcess, topic_name: str) -> tuple[str, str]:
    create_topic(broker.bootstrap, topic_name)
    set_group_configs(broker.bootstrap, "g", share_auto_offset_reset="earliest")
    return broker.bootstrap, topic_name


def test_implicit_acknowledgement_delivers_each_record_once(earliest: tuple[str, str]) -> None:
    bs, topic = earliest
    produce(bs, topic, 300)
    c = share_consumer(bs, "g", topic)
    seen: list[Any] = []
    poll_until(c, lambda: len(seen) >= 300, 30, seen.append)
    c.commit_sync()
    assert sorted(offsets(seen)) == list(range(300))
    assert {m.delivery_count() for m in seen} == {1}
    c.close()
    again = share_consumer(bs, "g", topic)
    assert poll_for(again, 2.0) == []
    again.close()


def test_release_brings_a_record_back_with_delivery_count_2(earliest: tuple[str, str]) -> None:
    bs, topic = earliest
    produce(bs, topic, 10)
    c = share_consumer(bs, "g", topic, **{"share.acknowledgement.mode": "explicit"})
    got: list[Any] = []
    poll_until(c, lambda: len(got) >= 10, 20, got.append)
    released = got[3].offset()
    for m in got:
        c.acknowledge(m, AcknowledgeType.RELEASE if m.offset() == released else AcknowledgeType.ACCEPT)
    c.commit_sync()
    back: list[Any] = []
    poll_until(c, lambda: bool(back), 10, back.append)
    assert [(m.offset(), m.delivery_count()) for m in back] == [(released, 2)]
    c.acknowledge(back[0], AcknowledgeType.ACCEPT)
    c.commit_sync()
    c.close()


def test_reject_never_brings_a_record_back(earliest: tuple[str, str]) -> None:
    bs, topic = earliest
    produce(bs, topic, 5)
    c = share_consumer(bs, "g", topic, **{"share.acknowledgement.mode": "explicit"})
    got: list[Any] = []
    poll_until(c, lambda: len(got) >= 5, 20, got.append)
    for m in got:
        c.acknowledge(m, AcknowledgeType.REJECT if m.offset() == 2 else AcknowledgeType.RELEASE)
    c.commit_sync()
    later: list[Any] = []

    def take(m: Any) -> None:
        later.append(m)
        c.acknowledge(m, AcknowledgeType.ACCEPT)

    poll_until(c, lambda: False, 3.0, take)
    c.commit_sync()
    assert sorted(offsets(later)) == [0, 1, 3, 4]
    c.close()


def test_locks_expire_when_a_consumer_stops_polling(start_broker: Callable[..., BrokerProcess],
                                                    topic_name: str) -> None:
    b = start_broker(SHORT_LOCKS)
    create_topic(b.bootstrap, topic_name)
    set_group_configs(b.bootstrap, "g", share_auto_offset_reset="earliest", share_record_lock_duration_ms="2000")
    produce(b.bootstrap, topic_name, 20)
    stuck = share_consumer(b.bootstrap, "g", topic_name, **{"share.acknowledgement.mode": "explicit"})
    held: list[Any] = []
    poll_until(stuck, lambda: len(held) >= 20, 20, held.append)
    assert sorted(offsets(held)) == list(range(20))
    other = share_consumer(b.bootstrap, "g", topic_name)
    started = time.monotonic()
    got: list[Any] = []
    poll_until(other, lambda: len(got) >= 20, 20, got.append)
    other.commit_sync()
    assert sorted(offsets(got)) == list(range(20))
    assert {m.delivery_count() for m in got} == {2}
    assert time.monotonic() - started >= 1.0
    other.close()
    stuck.close()


def test_record_released_up_to_the_delivery_limit_is_archived(earliest: tuple[str, str]) -> None:
    bs, topic = earliest
    set_group_configs(bs, "g", share_auto_offset_reset="earliest", share_delivery_count_limit="2")
    produce(bs, topic, 3)
    c = share_consumer(bs, "g", topic, **{"share.acknowledgement.mode": "explicit"})
    counts: Counter[int] = Counter()

    def release_zero(m: Any) -> None:
        counts[m.offset()] += 1
        c.acknowledge(m, AcknowledgeType.RELEASE if m.offset() == 0 else AcknowledgeType.ACCEPT)

    poll_until(c, lambda: False, 4.0, release_zero)
    c.commit_sync()
    assert counts == Counter({0: 2, 1: 1, 2: 1})
    c.close()


def test_eight_consumers_share_one_partition(earliest: tuple[str, str]) -> None:
    bs, topic = earliest
    total = 400
    produce(bs, topic, total, **{"batch.num.messages": 5, "linger.ms": 0})
    seen: list[list[int]] = [[] for _ in range(8)]
    lock = threading.Lock()
    stop = threading.Event()

    def run(i: int) -> None:
        c = share_consumer(bs, "g", topic, **{"share.acknowledgement.mode": "explicit", "max.poll.records": 10})
        try:
            while not stop.is_set():
                for m in c.poll(0.2):
                    if m.error() is None:
                        time.sleep(0.005)
                        c.acknowledge(m, AcknowledgeType.ACCEPT)
                        with lock:
                            seen[i].append(m.offset())
                c.commit_sync()
        finally:
            c.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 40
    while time.monotonic() < deadline and sum(map(len, seen)) < total:
        time.sleep(0.1)
    time.sleep(0.5)
    stop.set()
    for t in threads:
        t.join(30)
    everything = [o for s in seen for o in s]
    assert sorted(everything) == list(range(total))
    assert all(seen), [len(s) for s in seen]


def test_two_share_groups_each_see_every_record(earliest: tuple[str, str]) -> None:
    bs, topic = earliest
    set_group_configs(bs, "h", share_auto_offset_reset="earliest")
    produce(bs, topic, 50)
    for group in ("g", "h"):
        c = share_consumer(bs, group, topic)
        got: list[Any] = []
        poll_until(c, lambda: len(got) >= 50, 20, got.append)
        c.commit_sync()
        c.close()
        assert sorted(offsets(got)) == list(range(50))


def test_commit_sync_reports_per_partition_results(broker: BrokerProcess, topic_name: str) -> None:
    bs = broker.bootstrap
    create_topic(bs, topic_name, partitions=3)
    set_group_configs(bs, "g", share_auto_offset_reset="earliest")
    p = producer(bs)
    for part in range(3):
        for i in range(4):
            p.produce(topic_name, value=b"x", partition=part)
    p.flush(10)
    c = share_consumer(bs, "g", topic_name, **{"share.acknowledgement.mode": "explicit"})
    got: list[Any] = []
    poll_until(c, lambda: len(got) >= 12, 20, got.append)
    for m in got:
        c.acknowledge(m, AcknowledgeType.ACCEPT)
    result = c.commit_sync()
    assert {(tp.topic, tp.partition) for tp in result} == {(topic_name, i) for i in range(3)}
    assert all(err is None and tp.error is None for tp, err in result.items())
    c.close()


def test_close_releases_what_was_not_acknowledged(earliest: tuple[str, str]) -> None:
    bs, topic = earliest
    produce(bs, topic, 10)
    a = share_consumer(bs, "g", topic, **{"share.acknowledgement.mode": "explicit"})
    got: list[Any] = []
    poll_until(a, lambda: len(got) >= 10, 20, got.append)
    for m in got[:4]:
        a.acknowledge(m, AcknowledgeType.ACCEPT)
    a.close()
    b = share_consumer(bs, "g", topic)
    rest: list[Any] = []
    started = time.monotonic()
    poll_until(b, lambda: len(rest) >= 6, 15, rest.append)
    b.commit_sync()
    assert sorted(offsets(rest)) == sorted(offsets(got[4:]))
    assert {m.delivery_count() for m in rest} == {2}
    assert time.monotonic() - started < 10  # long before the 30 s lock would expire
    b.close()
