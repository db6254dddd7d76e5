"""Produce and consume with confluent-kafka (librdkafka) against a real broker."""

from __future__ import annotations

import os
import time

import pytest
from confluent_kafka import TIMESTAMP_CREATE_TIME, TIMESTAMP_LOG_APPEND_TIME, Consumer, TopicPartition

from tests.support.clients import (
    admin_client,
    consume_exact,
    consumer,
    create_topic,
    produce_all,
    producer,
    records_of,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


@pytest.mark.parametrize("idempotence", [True, False], ids=["idempotent", "plain"])
def test_exact_round_trip_of_keys_values_headers_timestamps(shared_broker, topic_name, idempotence):
    bs = shared_broker.bootstrap
    create_topic(bs, topic_name, 1)
    base_ts = 1_700_000_000_000
    items = [
        {"key": b"k1", "value": b"v1", "timestamp": base_ts},
        {"key": None, "value": b"no key", "timestamp": base_ts + 1},
        {"key": b"no value", "value": None, "timestamp": base_ts + 2},
        {"key": None, "value": None, "timestamp": base_ts + 3},
        {"key": b"", "value": b"", "timestamp": base_ts + 4},
        {"key": b"h", "value": b"headers", "timestamp": base_ts + 5,
         "headers": [("a", b"1"), ("b", b"2"), ("a", b"3"), ("null", None), ("empty", b"")]},
        {"key": bytes(range(256)), "value": bytes(range(256)) * 40, "timestamp": base_ts + 6},
        {"key": "ünïcode".encode(), "value": "✓".encode(), "timestamp": base_ts - 10_000,
         "headers": [("ключ", "значение".encode())]},
    ]
    p = producer(bs, **{"enable.idempotence": idempotence})
    reports = produce_all(p, topic_name, items)
    assert [r.offset() for r in reports] == list(range(len(items)))

    got = records_of(bs, topic_name, 1, len(items))
    assert [r.offset for r in got] == list(range(len(items)))
    for item, r in zip(items, got):
        assert r.key == item["key"]
        assert r.value == item["value"]
        assert r.timestamp_type == TIMESTAMP_CREATE_TIME
        assert r.timestamp == item["timestamp"]
        assert (r.headers or []) == item.get("headers", [])


def test_log_append_time_topic_stamps_broker_time(shared_broker, topic_name):
    bs = shared_broker.bootstrap
    create_topic(bs, topic_name, 1, {"message.timestamp.type": "LogAppendTime"})
    before = int(time.time() * 1000)
    reports = produce_all(producer(bs), topic_name, [{"value": b"x%d" % i, "timestamp": 1_000} for i in range(5)])
    after = int(time.time() * 1000)
    # The delivery report carries the broker's log_append_time.
    for r in reports:
        ts_type, ts = r.timestamp()
        assert ts_type == TIMESTAMP_LOG_APPEND_TIME
        assert before - 1000 <= ts <= after + 1000
    got = records_of(bs, topic_name, 1, 5)
    for r in got:
        assert r.timestamp_type == TIMESTAMP_LOG_APPEND_TIME
        assert before - 1000 <= r.timestamp <= after + 1000
        assert r.timestamp != 1_000


def test_per_partition_order_across_three_partitions(shared_broker, topic_name):
    bs = shared_broker.bootstrap
    create_topic(bs, topic_name, 3)
    n = 3000
    items = [{"partition": i % 3, "key": b"%d" % (i % 3), "value": b"%06d" % i} for i in range(n)]
    reports = produce_all(producer(bs, **{"enable.idempotence": True, "linger.ms": 20}), topic_name, items)
    for i, r in enumerate(reports):
        assert (r.partition(), r.offset()) == (i % 3, i // 3)
    got = records_of(bs, topic_name, 3, n, timeout_s=40)
    by_part: dict[int, list[bytes]] = {0: [], 1: [], 2: []}
    for r in got:
        assert r.offset == len(by_part[r.partition])
        by_part[r.partition].append(r.value)
    for part, values in by_part.items():
        assert values == [b"%06d" % i for i in range(part, n, 3)]


def test_consume_from_middle_offset(shared_broker, topic_name):
    bs = shared_broker.bootstrap
    create_topic(bs, topic_name, 1)
    # Several batches so the middle offset falls inside one.
    p = producer(bs)
    for chunk in range(5):
        produce_all(p, topic_name, [{"value": b"%d" % i} for i in range(chunk * 20, chunk * 20 + 20)])
    got = records_of(bs, topic_name, [0], 100 - 57, start=57)
    assert [r.offset for r in got] == list(range(57, 100))
    assert [r.value for r in got] == [b"%d" % i for i in range(57, 100)]


def test_watermarks_and_offsets_for_times(shared_broker, topic_name):
    bs = shared_broker.bootstrap
    create_topic(bs, topic_name, 2)
    base = 1_700_000_000_000
    produce_all(producer(bs), topic_name,
                [{"partition": 0, "value": b"%d" % i, "timestamp": base + i * 1000} for i in range(10)])
    c = consumer(bs)
    try:
        assert c.get_watermark_offsets(TopicPartition(topic_name, 0), timeout=10) == (0, 10)
        assert c.get_watermark_offsets(TopicPartition(topic_name, 1), timeout=10) == (0, 0)
        query = [
            TopicPartition(topic_name, 0, base - 5),          # before everything -> 0
            TopicPartition(topic_name, 1, base),              # empty partition -> end (-1)
        ]
        res = c.offsets_for_times(query, timeout=10)
        assert [(t.partition, t.offset) for t in res] == [(0, 0), (1, -1)]
        for ts, expected in [(base + 3000, 3), (base + 3500, 4), (base + 9000, 9), (base + 9001, -1)]:
            (t,) = c.offsets_for_times([TopicPartition(topic_name, 0, ts)], timeout=10)
            assert t.error is None
            assert t.offset == expected, ts
    finally:
        c.close()


def test_list_offsets_earliest_latest_max_timestamp(shared_broker, topic_name):
    from confluent_kafka.admin import OffsetSpec

    bs = shared_broker.bootstrap
    create_topic(bs, topic_name, 1)
    base = 1_700_000_000_000
    stamps = [base + 5, base + 50, base + 7, base + 20]  # max at offset 1
    produce_all(producer(bs), topic_name, [{"value": b"v", "timestamp": t} for t in stamps])
    admin = admin_client(bs)
    tp = TopicPartition(topic_name, 0)
    # A timestamp query answers the first offset whose timestamp is >= the target, in offset order.
    cases = [("earliest", OffsetSpec.earliest(), 0, None), ("latest", OffsetSpec.latest(), 4, None),
             ("max", OffsetSpec.max_timestamp(), 1, base + 50), ("ts+6", OffsetSpec.for_timestamp(base + 6), 1, None),
             ("ts+5", OffsetSpec.for_timestamp(base + 5), 0, base + 5),
             ("ts+51", OffsetSpec.for_timestamp(base + 51), -1, None)]
    for what, spec, offset, ts in cases:
        res = admin.list_offsets({tp: spec}, request_timeout=10)[tp].result(timeout=10)
        assert res.offset == offset, what
        if ts is not None:
            assert res.timestamp == ts, what


def test_fetch_long_poll_gets_records_produced_later(shared_broker, topic_name):
    bs = shared_broker.bootstrap
    create_topic(bs, topic_name, 1)
    # A long max wait: the consumer's fetch parks on the broker until data arrives.
    c = consumer(bs, **{"fetch.wait.max.ms": 5000, "fetch.min.bytes": 1})
    try:
        c.assign([TopicPartition(topic_name, 0, 0)])
        assert c.consume(10, timeout=1.0) == []
        t0 = time.monotonic()
        produce_all(producer(bs, **{"linger.ms": 0}), topic_name, [{"value": b"late"}])
        (r,) = consume_exact(c, 1, timeout_s=10)
        # Woken by the append, not by the 5 s max wait expiring.
        assert time.monotonic() - t0 < 4.0
        assert (r.offset, r.value) == (0, b"late")
    finally:
        c.close()


def test_consumer_on_unknown_partition_offsets(shared_broker, topic_name):
    bs = shared_broker.bootstrap
    create_topic(bs, topic_name, 1)
    produce_all(producer(bs), topic_name, [{"value": b"%d" % i} for i in range(3)])
    c: Consumer = consumer(bs, **{"auto.offset.reset": "latest"})
    try:
        # Offset past the end: reset to latest, then later records arrive.
        c.assign([TopicPartition(topic_name, 0, 100)])
        assert c.consume(10, timeout=1.0) == []
        produce_all(producer(bs), topic_name, [{"value": b"after"}])
        (r,) = consume_exact(c, 1)
        assert (r.offset, r.value) == (3, b"after")
    finally:
        c.close()


def test_small_fetch_limits_still_make_progress(shared_broker, topic_name):
    """A batch larger than the fetch limits is returned whole, so consumers never stall."""
    bs = shared_broker.bootstrap
    create_topic(bs, topic_name, 2)
    items = [{"partition": i % 2, "value": bytes([i]) * 10_000} for i in range(40)]
    produce_all(producer(bs, **{"linger.ms": 0}), topic_name, items)
    got = records_of(bs, topic_name, 2, 40, **{"max.partition.fetch.bytes": 100, "fetch.max.bytes": 1000,
                                                   "message.max.bytes": 1000})
    assert sorted((r.partition, r.offset, r.value) for r in got) == sorted(
        (i % 2, i // 2, bytes([i]) * 10_000) for i in range(40))


def test_large_values_near_the_size_limit(shared_broker, topic_name):
    bs = shared_broker.bootstrap
    create_topic(bs, topic_name, 1)
    values = [os.urandom(900_000), os.urandom(500_000), b"small"]
    produce_all(producer(bs, **{"linger.ms": 0}), topic_name, [{"value": v} for v in values])
    got = records_of(bs, topic_name, [0], 3)
    assert [r.value for r in got] == values


def minor_faults(pid: int) -> int:
    return int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[7])


def test_megabyte_produces_do_not_fault_their_buffers_in_again(shared_broker, topic_name):
    """Each 1 MB Produce passes through a few buffers of its size; with glibc's adaptive
    malloc thresholds a broker could map them afresh (or trim them away) on every request
    and fault 500-700 pages back in per request (twice the CPU per record). ``shoal
    serve`` fixes the thresholds: after a few requests, no request faults much."""
    import datetime

    from kio.schema.produce.v9 import request as produce9

    from shoal.protocol.batch import build_batch
    from tests.support.wire import RawConnection

    bs = shared_broker.bootstrap
    create_topic(bs, topic_name, 1)
    batch = build_batch([(None, b"x" * 1024, (), int(time.time() * 1000)) for _ in range(960)])

    def produce_once(conn, i):
        resp = conn.request(produce9.ProduceRequest(
            transactional_id=None, acks=-1, timeout=datetime.timedelta(seconds=10),
            topic_data=(produce9.TopicProduceData(name=topic_name, partition_data=(
                produce9.PartitionProduceData(index=0, records=batch),)),)), correlation_id=i)
        assert resp.responses[0].partition_responses[0].error_code == 0

    with RawConnection(bs) as conn:
        for i in range(10):
            produce_once(conn, i)
        before = minor_faults(shared_broker.pid)
        for i in range(30):
            produce_once(conn, 100 + i)
        faults = minor_faults(shared_broker.pid) - before
    assert faults < 30 * 64, f"{faults} page faults for 30 produces of {len(batch)} bytes"
