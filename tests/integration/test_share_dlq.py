"""Dead-letter topics of share groups (KIP-1191), driven by confluent-kafka's ShareConsumer.

A share group with ``errors.deadletterqueue.topic.name`` writes every record it archives
because a consumer rejected it, or because its delivery count reached
``share.delivery.count.limit``, onto that topic with the ``__dlq.errors.*`` headers; a
plain consumer reads the dead-letter topic and checks headers and counts: each such
record exactly once, also across kill -9 of the broker.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from typing import Any

import pytest
from confluent_kafka import AcknowledgeType, TopicPartition
from confluent_kafka.admin import ConfigResource, ResourceType

from tests.integration.test_share_consumer import consume_until, poll_until, set_group_configs, share_consumer
from tests.support.broker import BrokerProcess
from tests.support.clients import admin_client, consumer, create_topic, producer

pytestmark = pytest.mark.integration

DLQ_ENABLED = {"errors.deadletterqueue.group.enable": "true"}


def produce_keyed(bootstrap: str, topic: str, n: int, **extra: Any) -> None:
    p = producer(bootstrap, **extra)
    for i in range(n):
        p.produce(topic, key=b"k%d" % i, value=b"v%d" % i, headers=[("origin", b"%d" % i)])
        p.poll(0)
    assert p.flush(15) == 0


def read_all(bootstrap: str, topic: str, partitions: int = 1) -> list[Any]:
    """Every record of ``topic`` up to its high watermarks, read by a plain consumer."""
    c = consumer(bootstrap)
    try:
        ends = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(partitions)}
        c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        got: list[Any] = []
        seen = Counter[int]()
        deadline = time.monotonic() + 20
        while any(seen[p] < ends[p] for p in ends):
            assert time.monotonic() < deadline, f"read {dict(seen)} of {ends}"
            for m in c.consume(100, timeout=0.5):
                if m.error() is None:
                    got.append(m)
                    seen[m.partition()] = m.offset() + 1
        return got
    finally:
        c.close()


def headers_of(m: Any) -> dict[str, str]:
    return {k: v.decode() for k, v in (m.headers() or [])}


def dlq_offsets(records: list[Any]) -> Counter[int]:
    return Counter(int(headers_of(m)["__dlq.errors.offset"]) for m in records)


def wait_for_dlq(bootstrap: str, topic: str, n: int, timeout_s: float = 15) -> list[Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        got = read_all(bootstrap, topic)
        if len(got) >= n or time.monotonic() > deadline:
            return got
        time.sleep(0.3)


def reject_records(bootstrap: str, topic: str, n: int) -> Any:
    """A ShareConsumer of group "g" rejects every record until it has seen ``n``; the commit's result."""
    c = share_consumer(bootstrap, "g", topic, **{"share.acknowledgement.mode": "explicit"})
    got: list[Any] = []

    def take(m: Any) -> None:
        got.append(m)
        c.acknowledge(m, AcknowledgeType.REJECT)

    try:
        poll_until(c, lambda: len(got) >= n, 15.0, take)
        return c.commit_sync(10)
    finally:
        c.close()


def test_rejected_and_over_delivered_records_reach_the_dlq_once_with_headers(
        start_broker: Any, topic_name: str) -> None:
    b: BrokerProcess = start_broker()
    bs = b.bootstrap
    dlq = f"dlq.{topic_name}"
    create_topic(bs, topic_name)
    create_topic(bs, dlq, config=DLQ_ENABLED)
    set_group_configs(bs, "g", share_auto_offset_reset="earliest", share_delivery_count_limit="2",
                      errors_deadletterqueue_topic_name=dlq, errors_deadletterqueue_copy_record_enable="true")
    produce_keyed(bs, topic_name, 10)
    c = share_consumer(bs, "g", topic_name, **{"share.acknowledgement.mode": "explicit"})
    deliveries: Counter[int] = Counter()

    def take(m: Any) -> None:
        deliveries[m.offset()] += 1
        if m.offset() < 3:
            c.acknowledge(m, AcknowledgeType.REJECT)
        elif m.offset() < 6:
            c.acknowledge(m, AcknowledgeType.RELEASE)
        else:
            c.acknowledge(m, AcknowledgeType.ACCEPT)

    poll_until(c, lambda: False, 5.0, take)
    c.commit_sync()
    c.close()
    assert deliveries == Counter({0: 1, 1: 1, 2: 1, 3: 2, 4: 2, 5: 2, 6: 1, 7: 1, 8: 1, 9: 1})

    got = wait_for_dlq(bs, dlq, 6)
    assert dlq_offsets(got) == Counter({o: 1 for o in range(6)})
    for m in got:
        h = headers_of(m)
        o = int(h["__dlq.errors.offset"])
        assert h["__dlq.errors.topic"] == topic_name
        assert h["__dlq.errors.partition"] == "0"
        assert h["__dlq.errors.group"] == "g"
        if o < 3:
            assert h["__dlq.errors.delivery.count"] == "1"
            assert h["__dlq.errors.message"] == "Offset rejected by client."
        else:
            assert h["__dlq.errors.delivery.count"] == "2"
            assert h["__dlq.errors.message"] == "Offset delivery count exceeded the threshold."
        assert m.key() == b"k%d" % o and m.value() == b"v%d" % o  # errors.deadletterqueue.copy.record.enable
        assert "origin" not in h
    # Nothing more arrives later (no second copy of any record).
    time.sleep(1.0)
    assert len(read_all(bs, dlq)) == 6


def test_headers_only_by_default_and_lock_expiry_at_the_limit(start_broker: Any, topic_name: str) -> None:
    b: BrokerProcess = start_broker({"group.share.min.record.lock.duration.ms": "1000"})
    bs = b.bootstrap
    dlq = f"dlq.{topic_name}"
    create_topic(bs, topic_name)
    create_topic(bs, dlq, partitions=3, config=DLQ_ENABLED)
    set_group_configs(bs, "g", share_auto_offset_reset="earliest", share_delivery_count_limit="2",
                      share_record_lock_duration_ms="1000", errors_deadletterqueue_topic_name=dlq)
    produce_keyed(bs, topic_name, 2)
    # c1 rejects offset 0 and holds offset 1 without acknowledging it; c2 gets offset 1
    # once its lock expired and holds it too: its second lock expiry archives it.
    c1 = share_consumer(bs, "g", topic_name, **{"share.acknowledgement.mode": "explicit"})
    c2 = share_consumer(bs, "g", topic_name, **{"share.acknowledgement.mode": "explicit"})
    try:
        first: list[Any] = []

        def take(m: Any) -> None:
            first.append(m)
            if m.offset() == 0:
                c1.acknowledge(m, AcknowledgeType.REJECT)

        poll_until(c1, lambda: len(first) >= 2, 15.0, take)
        c1.commit_sync()
        second: list[Any] = []
        poll_until(c2, lambda: len(second) >= 1, 15.0, second.append)
        assert [(m.offset(), m.delivery_count()) for m in second] == [(1, 2)]
        got = wait_for_dlq(bs, dlq, 2, timeout_s=10)
    finally:
        c1.close()
        c2.close()
    assert dlq_offsets(got) == Counter({0: 1, 1: 1})
    for m in got:
        assert m.partition() == 0  # source partition 0 % 3 partitions
        assert m.key() is None and m.value() is None
    by_offset = {int(headers_of(m)["__dlq.errors.offset"]): headers_of(m) for m in got}
    assert by_offset[0]["__dlq.errors.message"] == "Offset rejected by client."
    assert by_offset[1]["__dlq.errors.message"] == "Offset delivery count exceeded the threshold."
    assert by_offset[1]["__dlq.errors.delivery.count"] == "2"


def test_a_topic_not_enabled_for_dead_letters_gets_nothing(start_broker: Any, topic_name: str) -> None:
    b: BrokerProcess = start_broker()
    bs = b.bootstrap
    dlq = f"dlq.{topic_name}"
    create_topic(bs, topic_name)
    create_topic(bs, dlq)  # no errors.deadletterqueue.group.enable
    set_group_configs(bs, "g", share_auto_offset_reset="earliest", errors_deadletterqueue_topic_name=dlq)
    produce_keyed(bs, topic_name, 3)
    reject_records(bs, topic_name, 3)
    assert read_all(bs, dlq) == []
    assert "errors.deadletterqueue.group.enable" in b.stderr_tail(200)


def test_a_record_already_on_the_dlq_is_not_written_again(start_broker: Any, topic_name: str) -> None:
    """The state after a crash between the dead-letter write and the state write: the record
    is on the dead-letter topic but not archived; archiving it again writes nothing."""
    b: BrokerProcess = start_broker()
    bs = b.bootstrap
    dlq = f"dlq.{topic_name}"
    create_topic(bs, topic_name)
    create_topic(bs, dlq, config=DLQ_ENABLED)
    set_group_configs(bs, "g", share_auto_offset_reset="earliest", errors_deadletterqueue_topic_name=dlq)
    produce_keyed(bs, topic_name, 3)
    p = producer(bs)
    p.produce(dlq, value=None, headers=[("__dlq.errors.topic", topic_name.encode()), ("__dlq.errors.partition", b"0"),
                                        ("__dlq.errors.offset", b"1"), ("__dlq.errors.group", b"g"),
                                        ("__dlq.errors.delivery.count", b"1"),
                                        ("__dlq.errors.message", b"Offset rejected by client.")])
    assert p.flush(15) == 0
    b.kill()
    b.start()
    reject_records(bs, topic_name, 3)
    wait_for_dlq(bs, dlq, 3)
    time.sleep(0.5)
    assert dlq_offsets(read_all(bs, dlq)) == Counter({0: 1, 1: 1, 2: 1})


TOTAL = 300
CONSUMERS = 3
KILLS = 3


def test_kill_9_every_rejected_and_over_delivered_record_once(start_broker: Any, topic_name: str) -> None:
    """Consumers reject every offset % 5 == 0 and release every offset % 5 == 1 (limit 3),
    accept the rest, while the broker is killed with SIGKILL and restarted. Afterwards the
    dead-letter topic holds each offset % 5 in (0, 1) exactly once and nothing else."""
    b: BrokerProcess = start_broker()
    bs = b.bootstrap
    dlq = f"dlq.{topic_name}"
    create_topic(bs, topic_name, partitions=2)
    create_topic(bs, dlq, config=DLQ_ENABLED)
    set_group_configs(bs, "g", share_auto_offset_reset="earliest", share_delivery_count_limit="3",
                      errors_deadletterqueue_topic_name=dlq)
    p = producer(bs, **{"batch.num.messages": 10, "linger.ms": 0})
    for i in range(TOTAL):
        p.produce(topic_name, value=b"%d" % i, partition=i % 2)
        p.poll(0)
    assert p.flush(15) == 0
    stop = threading.Event()
    rng = random.Random(1191)

    def run() -> None:
        c = share_consumer(bs, "g", topic_name, **{"share.acknowledgement.mode": "explicit",
                                                     "max.poll.records": 20})

        def handle(msgs: list[Any]) -> None:
            for m in msgs:
                kind = m.offset() % 5
                c.acknowledge(m, AcknowledgeType.REJECT if kind == 0 else
                              AcknowledgeType.RELEASE if kind == 1 else AcknowledgeType.ACCEPT)
            try:
                c.commit_sync(10)
            except Exception:
                pass

        consume_until(c, stop, handle)

    threads = [threading.Thread(target=run, daemon=True) for _ in range(CONSUMERS)]
    for t in threads:
        t.start()
    try:
        for _ in range(KILLS):
            time.sleep(rng.uniform(0.5, 2.0))
            b.kill()
            time.sleep(rng.uniform(0.0, 0.3))
            b.start()
        expected = Counter({(part, o): 1 for part in range(2) for o in range(TOTAL // 2) if o % 5 in (0, 1)})
        deadline = time.monotonic() + 60
        got: list[Any] = []
        while time.monotonic() < deadline:
            got = read_all(bs, dlq)
            if len(got) >= len(expected):
                break
            time.sleep(0.5)
        time.sleep(2.0)  # anything written twice would show up now
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    got = read_all(bs, dlq)
    seen = Counter((int(headers_of(m)["__dlq.errors.partition"]), int(headers_of(m)["__dlq.errors.offset"]))
                   for m in got)
    assert seen == expected
    for m in got:
        h = headers_of(m)
        if int(h["__dlq.errors.offset"]) % 5 == 0:
            assert h["__dlq.errors.message"] == "Offset rejected by client."
        else:
            assert h["__dlq.errors.message"] == "Offset delivery count exceeded the threshold."
            assert int(h["__dlq.errors.delivery.count"]) >= 3


def test_auto_created_dead_letter_topic(start_broker: Any, topic_name: str) -> None:
    b: BrokerProcess = start_broker({"errors.deadletterqueue.auto.create.topics.enable": "true",
                                     "num.partitions": "2"})
    bs = b.bootstrap
    dlq = f"dlq.{topic_name}"
    create_topic(bs, topic_name)
    set_group_configs(bs, "g", share_auto_offset_reset="earliest", errors_deadletterqueue_topic_name=dlq)
    produce_keyed(bs, topic_name, 2)
    c = share_consumer(bs, "g", topic_name, **{"share.acknowledgement.mode": "explicit"})
    got: list[Any] = []

    def take(m: Any) -> None:
        got.append(m)
        c.acknowledge(m, AcknowledgeType.REJECT if m.offset() == 1 else AcknowledgeType.ACCEPT)

    poll_until(c, lambda: len(got) >= 2, 15.0, take)
    c.commit_sync()
    c.close()
    admin = admin_client(bs)
    res = ConfigResource(ResourceType.TOPIC, dlq)
    configs = admin.describe_configs([res])[res].result(timeout=10)
    assert configs["errors.deadletterqueue.group.enable"].value == "true"
    records = read_all(bs, dlq, partitions=2)
    assert [(m.partition(), headers_of(m)["__dlq.errors.offset"]) for m in records] == [(0, "1")]


def test_kill_9_between_the_dead_letter_write_and_the_state_write(start_broker: Any, topic_name: str) -> None:
    """Reproduce the crash window exactly: reject records (dead-letter records written, then
    the ARCHIVED state), kill -9 the broker, and cut ``__share_group_state`` back to before
    the state write, which is what the disk holds after a crash between the two fsyncs. The
    records come back and are rejected again; the dead-letter topic still has each once."""
    b: BrokerProcess = start_broker()
    bs = b.bootstrap
    dlq = f"dlq.{topic_name}"
    create_topic(bs, topic_name)
    create_topic(bs, dlq, config=DLQ_ENABLED)
    set_group_configs(bs, "g", share_auto_offset_reset="earliest", errors_deadletterqueue_topic_name=dlq)
    produce_keyed(bs, topic_name, 3)
    state_log = b.data_dir / "__share_group_state-0" / "00000000000000000000.log"

    def reject_all() -> tuple[list[Any], int]:
        """Receive the 3 records and reject them; the state log's size before the reject."""
        c = share_consumer(bs, "g", topic_name, **{"share.acknowledgement.mode": "explicit"})
        got: list[Any] = []
        try:
            poll_until(c, lambda: len(got) >= 3, 15.0, got.append)
            time.sleep(0.5)  # the acquisition's own state write, if any, is on disk
            before = state_log.stat().st_size
            for m in got:
                c.acknowledge(m, AcknowledgeType.REJECT)
            c.commit_sync()
            assert state_log.stat().st_size > before
        finally:
            c.close()
        return got, before

    first, before = reject_all()
    assert sorted(m.offset() for m in first) == [0, 1, 2]
    assert dlq_offsets(wait_for_dlq(bs, dlq, 3)) == Counter({0: 1, 1: 1, 2: 1})
    b.kill()
    with open(state_log, "r+b") as f:
        f.truncate(before)
    b.start()
    again, _ = reject_all()
    assert sorted(m.offset() for m in again) == [0, 1, 2]  # not archived: delivered again
    time.sleep(0.5)
    assert dlq_offsets(read_all(bs, dlq)) == Counter({0: 1, 1: 1, 2: 1})


def test_a_dead_letter_topic_that_refuses_the_records_does_not_block_the_group(
        start_broker: Any, topic_name: str) -> None:
    b: BrokerProcess = start_broker()
    bs = b.bootstrap
    dlq = f"dlq.{topic_name}"
    create_topic(bs, topic_name)
    create_topic(bs, dlq, config={**DLQ_ENABLED, "max.message.bytes": "100"})  # below the headers alone
    set_group_configs(bs, "g", share_auto_offset_reset="earliest", errors_deadletterqueue_topic_name=dlq)
    produce_keyed(bs, topic_name, 3)
    result = reject_records(bs, topic_name, 3)
    assert result and all(err is None and tp.error is None for tp, err in result.items())
    assert read_all(bs, dlq) == []
    assert "refused dead-letter records" in b.stderr_tail(200)
    # Archived all the same: a new consumer gets nothing.
    c2 = share_consumer(bs, "g", topic_name)
    try:
        later: list[Any] = []
        poll_until(c2, lambda: False, 3.0, later.append)
        assert later == []
    finally:
        c2.close()
