"""Transactional test data: committed and aborted transactions, and one left open."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaException, Producer

from tests.support.clients import rdkafka_conf

__all__ = [
    "CLUSTER_TRANSACTION_SETTINGS",
    "TxnData",
    "consumed_all",
    "end_transaction",
    "try_kafka",
    "write_transactions",
]

CLUSTER_TRANSACTION_SETTINGS = {
    "min.insync.replicas": "2",
    "offsets.topic.num.partitions": "3",
    "transaction.state.log.num.partitions": "3",
}
"""Broker settings of the three-broker transaction tests: few internal partitions, acks=all on two replicas."""


def end_transaction(p: Any, *, commit: bool, timeout_s: float = 30, attempts: int = 20) -> None:
    """commit_transaction / abort_transaction of a confluent-kafka producer, again while the
    error is retriable."""
    for _ in range(attempts):
        try:
            (p.commit_transaction if commit else p.abort_transaction)(timeout_s)
            return
        except KafkaException as e:
            if not e.args[0].retriable():
                raise
            time.sleep(0.5)
    raise AssertionError("the transaction never ended")


def consumed_all(c: Any, parts: list[Any], total: int) -> bool:
    """Whether the consumer's group has committed offsets adding up to ``total``."""
    try:
        return sum(tp.offset for tp in c.committed(parts, timeout=10) if tp.offset > 0) >= total
    except KafkaException:
        return False


def try_kafka(fn: Any) -> Any:
    """``fn()``'s result (True for None), or None if it raised KafkaException."""
    try:
        r = fn()
        return True if r is None else r
    except KafkaException:
        return None


@dataclass
class TxnData:
    """What :func:`write_transactions` wrote (values), and the producer whose last transaction is open."""

    committed: list[bytes] = field(default_factory=list)
    aborted: list[bytes] = field(default_factory=list)
    open: list[bytes] = field(default_factory=list)
    producer: Producer | None = None

    def commit_open(self) -> None:
        assert self.producer is not None
        self.producer.commit_transaction(15)
        self.committed += self.open
        self.open = []


def write_transactions(bootstrap: str, topic: str, transactional_id: str, *, transactions: int = 6,
                       per_transaction: int = 10, partitions: int = 2, leave_open: int = 0) -> TxnData:
    """``transactions`` transactions of ``per_transaction`` records over ``partitions``
    partitions (value ``t<T>-<I>``); every third one, starting with the second, is aborted.
    Then, with ``leave_open``, one more transaction of that many records is left open.
    Between the data each partition holds a commit or abort marker per transaction."""
    p = Producer(rdkafka_conf(bootstrap, **{"transactional.id": transactional_id, "linger.ms": 5}))
    p.init_transactions(30)
    data = TxnData(producer=p)
    for t in range(transactions):
        p.begin_transaction()
        values = [b"t%d-%d" % (t, i) for i in range(per_transaction)]
        for i, v in enumerate(values):
            p.produce(topic, v, partition=i % partitions)
        p.flush(15)
        if t % 3 == 1:
            p.abort_transaction(15)
            data.aborted += values
        else:
            p.commit_transaction(15)
            data.committed += values
    if leave_open:
        p.begin_transaction()
        data.open = [b"open-%d" % i for i in range(leave_open)]
        for i, v in enumerate(data.open):
            p.produce(topic, v, partition=i % partitions)
        p.flush(15)
    return data
