"""kafka-python 3's transactional KafkaProducer and its read_committed KafkaConsumer.

The transactional producer commits, aborts and sends a consumer group's offsets inside a
transaction; the read_committed consumer gets the committed records only, the
read_uncommitted one every record; the group's offsets appear at commit only.
"""

from __future__ import annotations

import time

import pytest
from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KpTopicPartition
from kafka.structs import OffsetAndMetadata

from tests.support.broker import BrokerProcess
from tests.support.clients import create_topic

pytestmark = pytest.mark.integration


def kp_values(bootstrap: str, topic: str, isolation: str, want: int, timeout_s: float = 20.0) -> list[bytes]:
    c = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest",
                      isolation_level=isolation, consumer_timeout_ms=1000)
    try:
        tps = [KpTopicPartition(topic, p) for p in (0, 1)]
        c.assign(tps)
        c.seek_to_beginning(*tps)
        got: list[bytes] = []
        deadline = time.monotonic() + timeout_s
        while len(got) < want and time.monotonic() < deadline:
            for recs in c.poll(timeout_ms=500).values():
                got += [r.value for r in recs]
        for recs in c.poll(timeout_ms=1500).values():  # nothing more may come
            got += [r.value for r in recs]
        return got
    finally:
        c.close()


def test_kafka_python_transactions(broker: BrokerProcess, topic_name: str) -> None:
    create_topic(broker.bootstrap, topic_name, partitions=2)
    p = KafkaProducer(bootstrap_servers=broker.bootstrap, transactional_id="kp-tx", request_timeout_ms=15_000)
    p.init_transactions()
    committed = [b"c%d" % i for i in range(10)]
    aborted = [b"a%d" % i for i in range(10)]
    group = topic_name + "-g"
    for values, commit in ((committed[:5], True), (aborted, False), (committed[5:], True)):
        p.begin_transaction()
        for i, v in enumerate(values):
            p.send(topic_name, v, partition=i % 2)
        p.flush()
        p.send_offsets_to_transaction({KpTopicPartition(topic_name, 0): OffsetAndMetadata(len(values), "", -1)},
                                      group)
        if commit:
            p.commit_transaction()
        else:
            p.abort_transaction()
    p.close()
    assert sorted(kp_values(broker.bootstrap, topic_name, "read_committed", 10)) == sorted(committed)
    assert sorted(kp_values(broker.bootstrap, topic_name, "read_uncommitted", 20)) == sorted(committed + aborted)
    c = KafkaConsumer(bootstrap_servers=broker.bootstrap, group_id=group, enable_auto_commit=False)
    try:
        # the last committed transaction's offset (5); the aborted one's (10) never appeared
        assert c.committed(KpTopicPartition(topic_name, 0)) == 5
    finally:
        c.close()
