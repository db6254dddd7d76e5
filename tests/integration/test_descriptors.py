"""A broker under ``ulimit -n 1024``: 2,000 topics and a compacted topic with 100,000 updates.

Every segment used to hold three descriptors and compacted topics never merged segments,
so such a broker ran out of descriptors: restarted, it reset every connection, and a
segment roll wedged its partition.  Here the descriptors the broker holds (read from
/proc/PID/fd) stay below the limit, every write succeeds, compaction merges the compacted
topic's segments, and a restart under the same limit serves everything.
"""

from __future__ import annotations

import time

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import NewTopic

from tests.support.broker import BrokerProcess
from tests.support.clients import admin_client, consume_exact, consumer, produce_all, producer, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(480)]

LIMIT = 1024
TOPICS = 2000
UPDATES = 100_000
KEYS = 1000
COMPACTED = "compacted"
SEGMENT_BYTES = 16384


def create_topics(bs: str) -> None:
    admin = admin_client(bs, **{"socket.timeout.ms": 180_000})
    names = [f"t{i:04d}" for i in range(TOPICS)]
    for start in range(0, TOPICS, 500):  # a few CreateTopics requests
        futures = admin.create_topics([NewTopic(n, 1, 1) for n in names[start:start + 500]],
                                      operation_timeout=180, request_timeout=180)
        for f in futures.values():
            f.result(timeout=180)  # each topic's creation fsyncs; slow on a loaded machine
    admin.create_topics([NewTopic(COMPACTED, 1, 1, config={
        "cleanup.policy": "compact", "segment.bytes": str(SEGMENT_BYTES)})])[COMPACTED].result(timeout=30)


def read_topics(bs: str) -> dict[str, bytes]:
    c = consumer(bs, **{"fetch.wait.max.ms": 10})
    try:
        c.assign([TopicPartition(f"t{i:04d}", 0, 0) for i in range(TOPICS)])
        return {r[3].decode().split("=")[0]: r[3] for r in consume_exact(c, TOPICS, timeout_s=60)}
    finally:
        c.close()


def latest_values(bs: str) -> dict[bytes, bytes]:
    c = consumer(bs)
    try:
        low, high = c.get_watermark_offsets(TopicPartition(COMPACTED, 0), timeout=15)
        c.assign([TopicPartition(COMPACTED, 0, 0)])
        out: dict[bytes, bytes] = {}
        last = -1
        deadline = time.monotonic() + 60
        while last < high - 1:
            assert time.monotonic() < deadline, f"read up to offset {last} of {high}"
            for m in c.consume(1000, timeout=0.5):
                assert m.error() is None, m.error()
                out[m.key()] = m.value()
                last = m.offset()
        return out
    finally:
        c.close()


def segment_count(b: BrokerProcess) -> int:
    return len(list((b.data_dir / f"{COMPACTED}-0").glob("*.log")))


def test_2000_topics_and_a_compacted_topic_under_ulimit_1024(tmp_path):
    b = BrokerProcess(tmp_path / "data", {"log.retention.check.interval.ms": "1000"}, nofile_limit=LIMIT)
    try:
        b.start()
        bs = b.bootstrap
        create_topics(bs)
        assert b.open_descriptors() < LIMIT

        # every update is queued at once: give the last ones time on a loaded machine
        p = producer(bs, **{"enable.idempotence": True, "linger.ms": 20, "batch.size": SEGMENT_BYTES // 2,
                            "queue.buffering.max.messages": 200_000, "message.timeout.ms": 120_000})
        produce_all(p, "t0000", [])  # warm up
        for i in range(TOPICS):
            p.produce(f"t{i:04d}", value=b"t%04d=%d" % (i, i))
        expected = {}
        items = []
        for i in range(UPDATES):
            key = b"key-%04d" % (i % KEYS)
            expected[key] = b"%d" % i
            items.append({"key": key, "value": expected[key]})
        produce_all(p, COMPACTED, items, timeout_s=120)
        b.assert_alive()
        assert b.open_descriptors() < LIMIT
        # the updates (over 1 MB) rolled the 16 KiB segments many times, and compaction
        # (running meanwhile) cleans and merges them into few, at most segment.bytes each
        newest = max(int(p.stem) for p in (b.data_dir / f"{COMPACTED}-0").glob("*.log"))
        assert newest > UPDATES // 2
        wait_until("compaction to merge the segments", lambda: segment_count(b) < 10, timeout_s=120,
                   interval_s=0.5)
        assert all(p.stat().st_size <= SEGMENT_BYTES for p in (b.data_dir / f"{COMPACTED}-0").glob("*.log"))
        assert b.open_descriptors() < LIMIT

        topics = read_topics(bs)
        assert sorted(topics) == [f"t{i:04d}" for i in range(TOPICS)]
        assert latest_values(bs) == expected
        assert b.open_descriptors() < LIMIT

        b.restart()
        assert b.open_descriptors() < LIMIT
        assert read_topics(bs) == topics
        assert latest_values(bs) == expected
        # still writable after the restart, also the topics not used since
        produce_all(producer(bs), "t1999", [{"value": b"again"}])
        produce_all(producer(bs), COMPACTED, [{"key": b"key-0000", "value": b"new"}])
        assert latest_values(bs)[b"key-0000"] == b"new"
        assert b.open_descriptors() < LIMIT
        b.assert_alive()
        # the broker never ran out: no open, accept or flush failed with EMFILE
        assert "Too many open files" not in b.stderr_tail(1_000_000)
    finally:
        b.stop(check=False)
