"""Transactional test data: committed and aborted transactions, and one left open."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, KafkaException, Producer, TopicPartition

from tests.support.clients import rdkafka_conf, wait_until

__all__ = [
    "CLUSTER_TRANSACTION_SETTINGS",
    "CtpOutcome",
    "TxnData",
    "assert_exactly_once",
    "consume_transform_produce",
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


def assert_exactly_once(values: list[int], total: int) -> None:
    """``values`` hold each of 0..total-1 exactly once."""
    missing = sorted(set(range(total)) - set(values))
    dupes = len(values) - len(set(values))
    assert not missing and not dupes, f"{len(missing)} missing (first {missing[:10]}), {dupes} duplicated"


@dataclass
class CtpOutcome:
    """What :func:`consume_transform_produce` did: the value ``kill`` returned (None if it
    never ran), and the transactions committed, aborted and committed after the kill."""

    killed: Any = None
    commits: int = 0
    aborts: int = 0
    commits_after_kill: int = 0


def consume_transform_produce(c: Any, parts: list[Any], new_producer: Callable[[], Any], out_topic: str,
                              total: int, rng: random.Random, *, batch: int, kill_after: int,
                              kill: Callable[[], Any], deadline_s: float, timeout_s: float = 30,
                              attempts: int = 20) -> CtpOutcome:
    """confluent-kafka's exactly-once loop: each batch the read_committed consumer ``c`` gets
    from ``parts`` goes to ``out_topic`` (same partition) in a transaction that commits the
    consumer's positions, or (one in five, by ``rng``) is aborted and read again from the
    group's committed offsets. Once ``kill_after`` transactions committed, ``kill()`` runs in
    the middle of one (its records written, its commit not sent). A fatal error replaces
    the producer (``new_producer``), any other aborts the transaction. Ends once the group
    committed ``total`` records, or after ``deadline_s``."""

    def rewind() -> None:
        """Back to the group's committed offsets (what the last committed transaction consumed)."""
        committed = wait_until("committed offsets", lambda: try_kafka(lambda: c.committed(parts, timeout=10)),
                               timeout_s=90, interval_s=1)
        for tp in committed:
            c.seek(TopicPartition(tp.topic, tp.partition, tp.offset if tp.offset >= 0 else OFFSET_BEGINNING))

    out = CtpOutcome()
    p = new_producer()
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        msgs = [m for m in c.consume(batch, 1.0) if not m.error()]
        if not msgs:
            if consumed_all(c, parts, total):
                break
            continue
        try:
            p.begin_transaction()
            for m in msgs:
                p.produce(out_topic, m.value(), partition=m.partition())
            abort = rng.random() < 0.2
            if out.killed is None and out.commits >= kill_after and not abort:
                p.flush(30)  # this transaction's records are in the log, its commit is still to come
                out.killed = kill()
            if not abort:
                p.send_offsets_to_transaction(c.position(parts), c.consumer_group_metadata(), timeout_s)
            else:
                p.flush(30)  # the aborted records reach the log (abort would purge what is queued)
            end_transaction(p, commit=not abort, timeout_s=timeout_s, attempts=attempts)
            if abort:
                out.aborts += 1
                rewind()
            else:
                out.commits += 1
                out.commits_after_kill += out.killed is not None
        except KafkaException as e:
            if e.args[0].fatal():
                p = new_producer()
            else:
                try_kafka(lambda p=p: p.abort_transaction(timeout_s))
            out.aborts += 1
            rewind()
    return out


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
