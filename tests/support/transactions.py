"""Transactional test data: committed and aborted transactions, and one left open."""

from __future__ import annotations

from dataclasses import dataclass, field

from confluent_kafka import Producer

from tests.support.clients import rdkafka_conf

__all__ = ["TxnData", "write_transactions"]


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
