"""Kafka client helpers for integration tests: quiet librdkafka clients and bounded polling.

Every helper takes a bootstrap string ("127.0.0.1:PORT") and a deadline in seconds, so a
test never hangs: it fails with a message saying what it was waiting for.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

__all__ = [
    "rdkafka_conf", "admin_client", "producer", "consumer", "create_topic", "produce_all", "consume_exact",
    "wait_until", "Record", "records_of",
]

T = TypeVar("T")

# librdkafka logs go to Python logging (pytest shows them only for failing tests).
RDKAFKA_LOG = logging.getLogger("rdkafka")


def rdkafka_conf(bootstrap: str, **extra: Any) -> dict[str, Any]:
    conf: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "logger": RDKAFKA_LOG,
        "log_level": 4,
        "broker.address.family": "v4",
        "socket.timeout.ms": 10_000,
    }
    conf.update(extra)
    return conf


def admin_client(bootstrap: str, **extra: Any) -> AdminClient:
    return AdminClient(rdkafka_conf(bootstrap, **extra))


def producer(bootstrap: str, **extra: Any) -> Producer:
    conf = {"acks": "all", "linger.ms": 5, "message.timeout.ms": 15_000}
    conf.update(extra)
    return Producer(rdkafka_conf(bootstrap, **conf))


def consumer(bootstrap: str, **extra: Any) -> Consumer:
    """A consumer for assign(): no group coordination is needed (group.id is required by the client)."""
    conf = {"group.id": "shoal-tests-unused", "enable.auto.commit": False, "auto.offset.reset": "earliest",
            "fetch.wait.max.ms": 100, "enable.partition.eof": False}
    conf.update(extra)
    return Consumer(rdkafka_conf(bootstrap, **conf))


def create_topic(bootstrap: str, name: str, partitions: int = 1, config: Mapping[str, str] | None = None,
                 timeout_s: float = 15.0) -> None:
    """Create a topic through AdminClient; raises KafkaException on failure."""
    admin = admin_client(bootstrap)
    futures = admin.create_topics([NewTopic(name, partitions, 1, config=dict(config or {}))],
                                  operation_timeout=timeout_s, request_timeout=timeout_s)
    futures[name].result(timeout=timeout_s)


def wait_until(what: str, check: Callable[[], T], timeout_s: float = 10.0, interval_s: float = 0.05) -> T:
    """Call ``check`` until it returns something truthy; fail naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while True:
        last = check()
        if last:
            return last
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what} (last: {last!r})")
        time.sleep(interval_s)


class Record(tuple):
    """(partition, offset, key, value, headers, timestamp) of a consumed message, comparable."""

    __slots__ = ()

    def __new__(cls, msg: Message) -> "Record":
        ts_type, ts = msg.timestamp()
        return super().__new__(cls, (msg.partition(), msg.offset(), msg.key(), msg.value(), msg.headers(), ts_type,
                                     ts))

    partition = property(lambda s: s[0])
    offset = property(lambda s: s[1])
    key = property(lambda s: s[2])
    value = property(lambda s: s[3])
    headers = property(lambda s: s[4])
    timestamp_type = property(lambda s: s[5])
    timestamp = property(lambda s: s[6])


def produce_all(p: Producer, topic: str, items: Iterable[Mapping[str, Any]], timeout_s: float = 30.0) -> list[Message]:
    """Produce each item (kwargs of Producer.produce); return the delivery reports in send order.

    Fails if any delivery reports an error or the flush does not finish in time.
    """
    reports: dict[int, Message] = {}
    errors: list[Any] = []

    def on_delivery(i: int) -> Callable[[KafkaError | None, Message], None]:
        def cb(err: KafkaError | None, msg: Message) -> None:
            if err is not None:
                errors.append((i, err))
            reports[i] = msg
        return cb

    n = 0
    for i, item in enumerate(items):
        while True:
            try:
                p.produce(topic, on_delivery=on_delivery(i), **item)
                break
            except BufferError:
                p.poll(0.1)
        n += 1
    remaining = p.flush(timeout_s)
    assert remaining == 0, f"{remaining} messages not delivered within {timeout_s}s"
    assert not errors, f"delivery errors: {errors[:5]}"
    return [reports[i] for i in range(n)]


def consume_exact(c: Consumer, n: int, timeout_s: float = 20.0) -> list[Record]:
    """Poll until ``n`` messages arrived; fail on a consumer error or on timeout."""
    out: list[Record] = []
    deadline = time.monotonic() + timeout_s
    while len(out) < n:
        if time.monotonic() > deadline:
            raise AssertionError(f"consumed {len(out)} of {n} messages within {timeout_s}s")
        for msg in c.consume(min(1000, n - len(out)), timeout=0.5):
            if msg.error() is not None:
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    continue
                raise KafkaException(msg.error())
            out.append(Record(msg))
    return out


def records_of(bootstrap: str, topic: str, partitions: int | Iterable[int], n: int, *, start: int = 0,
               timeout_s: float = 20.0, **consumer_conf: Any) -> list[Record]:
    """Assign ``partitions`` of ``topic`` from offset ``start`` and read exactly ``n`` records."""
    parts = range(partitions) if isinstance(partitions, int) else partitions
    c = consumer(bootstrap, **consumer_conf)
    try:
        c.assign([TopicPartition(topic, p, start) for p in parts])
        return consume_exact(c, n, timeout_s)
    finally:
        c.close()
