"""What survives a crash (SIGKILL) and a clean restart (SIGTERM) of the broker."""

from __future__ import annotations

import threading
import time

import pytest
from confluent_kafka import TopicCollection, TopicPartition
from confluent_kafka.admin import ConfigResource, ResourceType

from tests.support.clients import admin_client, consumer, create_topic, produce_all, producer, records_of, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

T = 15
# With tiny segments a batch must fit in one (Kafka answers RECORD_LIST_TOO_LARGE otherwise).
SMALL_BATCHES = {"batch.size": 1000}


def watermarks(bs: str, topic: str, partitions: int) -> list[tuple[int, int]]:
    c = consumer(bs)
    try:
        return [c.get_watermark_offsets(TopicPartition(topic, p), timeout=T) for p in range(partitions)]
    finally:
        c.close()


def read_all(bs: str, topic: str, partitions: int) -> dict[int, list]:
    """Every record of every partition, from the log start to the high watermark."""
    marks = watermarks(bs, topic, partitions)
    total = sum(high - low for low, high in marks)
    got = records_of(bs, topic, partitions, total, start=-2, timeout_s=30)  # -2: OFFSET_BEGINNING
    out: dict[int, list] = {p: [] for p in range(partitions)}
    for r in sorted(got, key=lambda r: (r.partition, r.offset)):
        out[r.partition].append(r)
    for p, (low, high) in enumerate(marks):
        assert [r.offset for r in out[p]] == list(range(low, high)), f"partition {p} has gaps or duplicates"
    return out


def test_acknowledged_records_survive_kill_9(start_broker, topic_name):
    b = start_broker({"log.segment.bytes": "4096"})
    bs = b.bootstrap
    create_topic(bs, topic_name, 3)
    items = [{"partition": i % 3, "key": b"k%d" % i, "value": b"value-%06d" % i + b"." * (i % 50)}
             for i in range(3000)]
    reports = produce_all(producer(bs, **{"enable.idempotence": True}, **SMALL_BATCHES), topic_name, items)
    acked = {(r.partition(), r.offset()): r.value() for r in reports}

    b.kill()
    b.start()
    assert b.bootstrap == bs  # same port: clients reconnect as to the same broker

    data = read_all(bs, topic_name, 3)
    assert {(r.partition, r.offset): r.value for p in data.values() for r in p} == acked
    # Segments rolled many times, so reads crossed segment boundaries.
    assert len(list((b.data_dir / f"{topic_name}-0").glob("*.log"))) > 3


def test_kill_9_while_producing_loses_no_acknowledged_record(start_broker, topic_name):
    """Crash in the middle of a produce stream; an idempotent producer then finishes the job."""
    b = start_broker({"log.segment.bytes": "8192"})
    bs = b.bootstrap
    create_topic(bs, topic_name, 2)
    p = producer(bs, **{"enable.idempotence": True, "linger.ms": 2, "message.timeout.ms": 60_000,
                        "retry.backoff.ms": 50, "reconnect.backoff.max.ms": 200}, **SMALL_BATCHES)
    acked: dict[tuple[int, int], bytes] = {}
    failures: list = []
    lock = threading.Lock()

    def on_delivery(err, msg):
        with lock:
            if err is not None:
                failures.append(err)
            else:
                acked[(msg.partition(), msg.offset())] = msg.value()

    n = 4000
    stop = threading.Event()

    def produce_stream():
        for i in range(n):
            while True:
                try:
                    p.produce(topic_name, value=b"m-%06d" % i, partition=i % 2, on_delivery=on_delivery)
                    break
                except BufferError:
                    p.poll(0.05)
            if i % 50 == 0:
                p.poll(0)
                time.sleep(0.002)
        stop.set()

    t = threading.Thread(target=produce_stream, daemon=True)
    t.start()
    wait_until("some records acknowledged", lambda: (p.poll(0.05), len(acked) > 500)[1], timeout_s=20)
    b.kill()
    acked_before_crash = dict(acked)
    b.start()
    assert b.bootstrap == bs
    assert stop.wait(30)
    t.join(30)
    assert p.flush(60) == 0
    assert not failures, failures[:3]

    data = read_all(bs, topic_name, 2)
    stored = {(r.partition, r.offset): r.value for recs in data.values() for r in recs}
    # Every record acknowledged before the crash is at its acknowledged offset.
    for key, value in acked_before_crash.items():
        assert stored.get(key) == value, key
    # With idempotence and retries every record ends up exactly once, in order per partition.
    assert stored == acked
    for part, recs in data.items():
        assert [r.value for r in recs] == [b"m-%06d" % i for i in range(part, n, 2)]


def test_clean_restart_keeps_offsets_topic_ids_and_configs(start_broker, topic_name):
    b = start_broker({"log.segment.bytes": "2048"})
    bs = b.bootstrap
    create_topic(bs, topic_name, 2, {"retention.ms": "86400000", "cleanup.policy": "delete"})
    create_topic(bs, topic_name + "-lat", 1, {"message.timestamp.type": "LogAppendTime"})
    items = [{"partition": i % 2, "key": b"%d" % i, "value": b"v%d" % i, "timestamp": 1_700_000_000_000 + i,
              "headers": [("h", b"%d" % i)]} for i in range(600)]
    produce_all(producer(bs, **SMALL_BATCHES), topic_name, items)
    produce_all(producer(bs), topic_name + "-lat", [{"value": b"x"}])
    admin = admin_client(bs)
    ids_before = {
        name: f.result(timeout=T).topic_id
        for name, f in admin.describe_topics(TopicCollection([topic_name, topic_name + "-lat"]),
                                             request_timeout=T).items()
    }
    before = read_all(bs, topic_name, 2)
    lat_before = read_all(bs, topic_name + "-lat", 1)
    cluster_before = admin.describe_cluster(request_timeout=T).result(timeout=T).cluster_id

    b.restart()
    assert b.bootstrap == bs
    admin = admin_client(bs)
    assert admin.describe_cluster(request_timeout=T).result(timeout=T).cluster_id == cluster_before
    ids_after = {
        name: f.result(timeout=T).topic_id
        for name, f in admin.describe_topics(TopicCollection([topic_name, topic_name + "-lat"]),
                                             request_timeout=T).items()
    }
    assert {k: str(v) for k, v in ids_after.items()} == {k: str(v) for k, v in ids_before.items()}
    res = ConfigResource(ResourceType.TOPIC, topic_name)
    cfg = admin.describe_configs([res], request_timeout=T)[res].result(timeout=T)
    assert cfg["retention.ms"].value == "86400000" and not cfg["retention.ms"].is_default
    res = ConfigResource(ResourceType.TOPIC, topic_name + "-lat")
    cfg = admin.describe_configs([res], request_timeout=T)[res].result(timeout=T)
    assert cfg["message.timestamp.type"].value == "LogAppendTime"

    after = read_all(bs, topic_name, 2)
    assert after == before
    assert read_all(bs, topic_name + "-lat", 1) == lat_before
    # New records continue the offsets where they stopped, with the same settings.
    produce_all(producer(bs), topic_name, [{"partition": 0, "value": b"after-restart"}])
    produce_all(producer(bs), topic_name + "-lat", [{"value": b"y", "timestamp": 5}])
    assert watermarks(bs, topic_name, 2) == [(0, 301), (0, 300)]
    (r,) = records_of(bs, topic_name + "-lat", [0], 1, start=1)
    assert r.value == b"y" and r.timestamp != 5


def test_restart_after_delete_records_and_topic_deletion(start_broker, topic_name):
    b = start_broker({"log.segment.bytes": "1024"})
    bs = b.bootstrap
    create_topic(bs, topic_name, 1)
    create_topic(bs, topic_name + "-gone", 1)
    p = producer(bs, **{"linger.ms": 0})
    for i in range(40):
        produce_all(p, topic_name, [{"value": b"r%03d" % i + b"-" * 100}])
    admin = admin_client(bs)
    (fut,) = admin.delete_records([TopicPartition(topic_name, 0, 25)], request_timeout=T).values()
    assert fut.result(timeout=T).low_watermark == 25
    admin.delete_topics([topic_name + "-gone"], request_timeout=T)[topic_name + "-gone"].result(timeout=T)

    b.kill()
    b.start()
    assert watermarks(bs, topic_name, 1) == [(25, 40)]
    data = read_all(bs, topic_name, 1)
    assert [r.value[:4] for r in data[0]] == [b"r%03d" % i for i in range(25, 40)]
    assert topic_name + "-gone" not in admin_client(bs).list_topics(timeout=T).topics


def test_old_timestamps_do_not_roll_a_segment_per_append(start_broker, topic_name):
    """segment.ms compares record timestamps with the segment's first one (Kafka), not the wall clock."""
    b = start_broker()
    bs = b.bootstrap
    create_topic(bs, topic_name, 1, {"segment.ms": "3600000"})
    p = producer(bs, **{"linger.ms": 0})
    year_2001 = 1_000_000_000_000
    for i in range(20):
        produce_all(p, topic_name, [{"value": b"%d" % i, "timestamp": year_2001 + i}])
    assert len(list((b.data_dir / f"{topic_name}-0").glob("*.log"))) == 1
    # A record two hours later than the segment's first one rolls it.
    produce_all(p, topic_name, [{"value": b"later", "timestamp": year_2001 + 2 * 3600_000}])
    assert len(list((b.data_dir / f"{topic_name}-0").glob("*.log"))) == 2
    assert [r.value for r in records_of(bs, topic_name, [0], 21)][-1] == b"later"
