"""Consume-transform-produce over 100,000 records with random aborts and a kill -9 of the
broker in the middle of a transaction (its records written, its commit not sent yet), with
confluent-kafka's and kafka-python's transactional producers.

The checker uses only what the clients saw: the input values produced, and the output read
back with read_committed, which must hold every input exactly once (the aborted
transactions' records and those of the transaction cut by the kill never show).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, TopicPartition

from tests.support.broker import BrokerProcess
from tests.support.clients import consumer, create_topic, producer, wait_until
from tests.support.transactions import assert_exactly_once, consume_transform_produce, try_kafka

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

TOTAL = 100_000
PARTITIONS = 3


def _produce_inputs(bootstrap: str, topic: str) -> None:
    p = producer(bootstrap, **{"enable.idempotence": True, "linger.ms": 5})
    for i in range(TOTAL):
        while True:
            try:
                p.produce(topic, str(i).encode(), partition=i % PARTITIONS)
                break
            except BufferError:
                p.poll(0.05)
    assert p.flush(60) == 0


def _read_committed(bootstrap: str, topic: str, timeout_s: float = 120.0) -> list[int]:
    """Every record of ``topic`` a read_committed consumer gets, once TOTAL arrived and nothing
    more came for two seconds."""
    c = consumer(bootstrap, **{"isolation.level": "read_committed"})
    c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
    out: list[int] = []
    deadline = time.monotonic() + timeout_s
    quiet_until = None
    try:
        while time.monotonic() < deadline:
            msgs = [m for m in c.consume(5000, 0.5) if not m.error()]
            out += [int(m.value()) for m in msgs]
            if msgs:
                quiet_until = None
            elif len(out) >= TOTAL:
                quiet_until = quiet_until or time.monotonic() + 2.0
                if time.monotonic() >= quiet_until:
                    break
    finally:
        c.close()
    return out


def test_confluent_kafka_exactly_once_through_a_broker_kill(start_broker: Callable[..., BrokerProcess]) -> None:
    b = start_broker()
    create_topic(b.bootstrap, "ck-in", partitions=PARTITIONS)
    create_topic(b.bootstrap, "ck-out", partitions=PARTITIONS)
    _produce_inputs(b.bootstrap, "ck-in")
    rng = random.Random(29)
    txn_id, group = "ck-ctp", "ck-ctp-group"

    # librdkafka starts its bootstrap again once every broker it knows is down (KIP-1102),
    # which a kill of the only broker always does; a transactional producer's
    # send_offsets_to_transaction issued meanwhile then waits for a decommissioned group
    # coordinator beyond its timeout. Without re-bootstrap it reconnects to the restarted broker.
    no_rebootstrap = {"metadata.recovery.strategy": "none"}

    def new_producer() -> Any:
        p = producer(b.bootstrap, **{"transactional.id": txn_id, "transaction.timeout.ms": 30000,
                                     "linger.ms": 5, **no_rebootstrap})
        wait_until("init_transactions", lambda: try_kafka(lambda: p.init_transactions(20)), timeout_s=90, interval_s=1)
        return p

    c = consumer(b.bootstrap, **{"group.id": group, "isolation.level": "read_committed", **no_rebootstrap})
    parts = [TopicPartition("ck-in", p) for p in range(PARTITIONS)]
    c.assign(parts)

    def kill() -> bool:
        b.restart(crash=True)  # kill -9, and the broker starts again on the same data
        return True

    out = consume_transform_produce(c, parts, new_producer, "ck-out", TOTAL, rng, batch=1000, kill_after=20,
                                    kill=kill, deadline_s=400, timeout_s=60, attempts=30)
    c.close()
    assert out.killed and out.aborts > 0 and out.commits_after_kill > 0, out
    assert_exactly_once(_read_committed(b.bootstrap, "ck-out"), TOTAL)


def test_kafka_python_exactly_once_through_a_broker_kill(start_broker: Callable[..., BrokerProcess]) -> None:
    from kafka import KafkaConsumer, KafkaProducer
    from kafka import TopicPartition as KpTopicPartition
    from kafka.errors import KafkaError
    from kafka.structs import OffsetAndMetadata

    b = start_broker()
    create_topic(b.bootstrap, "kp-in", partitions=PARTITIONS)
    create_topic(b.bootstrap, "kp-out", partitions=PARTITIONS)
    _produce_inputs(b.bootstrap, "kp-in")
    rng = random.Random(31)
    group = "kp-ctp-group"
    parts = [KpTopicPartition("kp-in", p) for p in range(PARTITIONS)]

    def new_producer() -> Any:
        def attempt() -> Any:
            p = KafkaProducer(bootstrap_servers=b.bootstrap, transactional_id="kp-ctp", linger_ms=5,
                              request_timeout_ms=15_000, max_block_ms=30_000)
            try:
                p.init_transactions()
            except KafkaError:
                p.close(timeout=5)
                return None
            return p
        return wait_until("init_transactions", attempt, timeout_s=90, interval_s=1)

    c = KafkaConsumer(bootstrap_servers=b.bootstrap, group_id=group, enable_auto_commit=False,
                      isolation_level="read_committed", auto_offset_reset="earliest", max_poll_records=1000,
                      request_timeout_ms=30_000)
    c.assign(parts)

    def rewind() -> None:
        for tp in parts:
            offset = wait_until("committed offset", lambda tp=tp: _kp_committed(c, tp), timeout_s=90, interval_s=1)
            if offset[0] is None:
                c.seek_to_beginning(tp)
            else:
                c.seek(tp, offset[0])

    p = new_producer()
    killed = False
    commits = aborts = commits_after_kill = 0
    deadline = time.monotonic() + 400
    while time.monotonic() < deadline:
        try:
            batch = c.poll(timeout_ms=1000, max_records=1000)
        except KafkaError:
            time.sleep(0.5)
            continue
        records = [r for recs in batch.values() for r in recs]
        if not records:
            if _kp_consumed_all(c, parts):
                break
            continue
        try:
            p.begin_transaction()
            for r in records:
                p.send("kp-out", r.value, partition=r.partition)
            abort = rng.random() < 0.2
            if not killed and commits >= 20 and not abort:
                p.flush()  # this transaction's records are in the log, its commit is still to come
                b.restart(crash=True)  # kill -9, and the broker starts again on the same data
                killed = True
            if not abort:
                offsets = {tp: OffsetAndMetadata(c.position(tp), "", -1) for tp in parts}
                p.send_offsets_to_transaction(offsets, group)
                p.commit_transaction()
                commits += 1
                commits_after_kill += killed
            else:
                p.flush()
                p.abort_transaction()
                aborts += 1
                rewind()
        except KafkaError:
            try:
                p.abort_transaction()
            except KafkaError:
                p.close(timeout=5)
                p = new_producer()
            aborts += 1
            rewind()
    p.close(timeout=10)
    c.close()
    assert killed and aborts > 0 and commits_after_kill > 0, (killed, aborts, commits_after_kill)
    assert_exactly_once(_read_committed(b.bootstrap, "kp-out"), TOTAL)


def _kp_consumed_all(c: Any, parts: list[Any]) -> bool:
    total = 0
    for tp in parts:
        offset = _kp_committed(c, tp)
        if offset is None:
            return False
        total += offset[0] or 0
    return total >= TOTAL


def _kp_committed(c: Any, tp: Any) -> tuple[int | None] | None:
    """The group's committed offset of ``tp`` as a 1-tuple (None inside: nothing committed);
    None while the broker cannot answer."""
    from kafka.errors import KafkaError

    try:
        return (c.committed(tp),)
    except KafkaError:
        return None
