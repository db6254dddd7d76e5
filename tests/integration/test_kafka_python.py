"""kafka-python 3 against a real broker: every compression codec, and cross-client reads."""

from __future__ import annotations

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition as KpTopicPartition

from tests.support.clients import create_topic, produce_all, producer, records_of

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

CODECS = [None, "gzip", "snappy", "lz4", "zstd"]


def kp_producer(bootstrap: str, **extra) -> KafkaProducer:
    conf = {"bootstrap_servers": bootstrap, "acks": "all", "linger_ms": 5, "request_timeout_ms": 15_000}
    conf.update(extra)
    return KafkaProducer(**conf)


def kp_read(bootstrap: str, topic: str, partitions: list[int], n: int, timeout_s: float = 20.0) -> list:
    """Assign partitions from the beginning and read exactly ``n`` records with KafkaConsumer."""
    import time

    c = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest",
                      group_id=None, fetch_max_wait_ms=100, request_timeout_ms=15_000)
    try:
        tps = [KpTopicPartition(topic, p) for p in partitions]
        c.assign(tps)
        c.seek_to_beginning(*tps)
        out = []
        deadline = time.monotonic() + timeout_s
        while len(out) < n:
            assert time.monotonic() < deadline, f"kafka-python read {len(out)} of {n} records in {timeout_s}s"
            for recs in c.poll(timeout_ms=500).values():
                out.extend(recs)
        return sorted(out, key=lambda r: (r.partition, r.offset))
    finally:
        c.close()


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c or "none")
def test_compressed_batches_round_trip(shared_broker, topic_name, codec):
    bs = shared_broker.bootstrap
    create_topic(bs, topic_name, 2)
    p = kp_producer(bs, compression_type=codec, batch_size=64 * 1024)
    sent = []
    futures = []
    for i in range(400):
        key = None if i % 7 == 0 else b"key-%d" % i
        value = None if i % 11 == 0 and key is not None else (b"value-%d-" % i) * (1 + i % 5)
        headers = [("n", b"%d" % i), ("dup", b"a"), ("dup", b"b")] if i % 3 == 0 else []
        ts = 1_700_000_000_000 + i
        futures.append(p.send(topic_name, key=key, value=value, headers=headers, partition=i % 2, timestamp_ms=ts))
        sent.append((i % 2, key, value, headers, ts))
    p.flush(timeout=20)
    metas = [f.get(timeout=20) for f in futures]
    p.close(timeout=10)
    for i, m in enumerate(metas):
        assert (m.partition, m.offset) == (i % 2, i // 2)

    got = kp_read(bs, topic_name, [0, 1], len(sent))
    expected = sorted(((part, i // 2, key, value, headers, ts) for i, (part, key, value, headers, ts) in enumerate(sent)),
                      key=lambda e: (e[0], e[1]))
    assert [(r.partition, r.offset, r.key, r.value, list(r.headers), r.timestamp) for r in got] == expected

    # librdkafka decodes the same (compressed) batches.
    rd = records_of(bs, topic_name, 2, len(sent))
    rd_sorted = sorted(rd, key=lambda r: (r.partition, r.offset))
    assert [(r.partition, r.offset, r.key, r.value, r.headers or [], r.timestamp) for r in rd_sorted] == expected


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_kafka_python_reads_librdkafka_compressed_records(shared_broker, topic_name, codec):
    bs = shared_broker.bootstrap
    create_topic(bs, topic_name, 1)
    items = [{"key": b"k%d" % i, "value": b"librdkafka-%d" % i, "headers": [("i", b"%d" % i)]} for i in range(300)]
    produce_all(producer(bs, **{"compression.type": codec, "linger.ms": 20}), topic_name, items)
    got = kp_read(bs, topic_name, [0], len(items))
    assert [(r.offset, r.key, r.value, list(r.headers)) for r in got] == [
        (i, it["key"], it["value"], it["headers"]) for i, it in enumerate(items)
    ]
