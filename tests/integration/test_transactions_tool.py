"""``shoal transactions``: list, describe, describe-producers, find-hanging and abort.

The hanging transaction is made the way one appears in practice, outside the coordinator:
a transactional batch in the log of a stopped broker whose producer id the transaction
coordinator never handed out (data from elsewhere, a lost coordinator state). It holds
the last stable offset, so read_committed readers stall, until ``abort`` writes a marker.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from confluent_kafka import Producer, TopicPartition

from shoal.log.partition_log import PartitionLog
from shoal.log.policy import LogConfig
from shoal.protocol.batch import build_batch
from tests.support.broker import BrokerProcess
from tests.support.clients import consumer, create_topic, produce_all, producer, rdkafka_conf

pytestmark = pytest.mark.integration


def shoal_tx(bootstrap: str, *args: str) -> list[list[str]]:
    proc = subprocess.run([sys.executable, "-m", "shoal", "transactions", "--bootstrap-server", bootstrap, *args],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return [line.split() for line in proc.stdout.splitlines()]


def committed_values(bootstrap: str, topic: str, want: int, timeout_s: float = 15) -> list[bytes]:
    c = consumer(bootstrap, **{"isolation.level": "read_committed"})
    try:
        c.assign([TopicPartition(topic, 0, 0)])
        got: list[bytes] = []
        deadline = time.monotonic() + timeout_s
        while len(got) < want and time.monotonic() < deadline:
            got += [m.value() for m in c.consume(100, 0.3) if m.error() is None]
        return got
    finally:
        c.close()


def test_list_describe_find_hanging_and_abort(start_broker, topic_name: str) -> None:
    b: BrokerProcess = start_broker()
    create_topic(b.bootstrap, topic_name, partitions=1)
    produce_all(producer(b.bootstrap), topic_name, [{"value": b"before", "partition": 0}])
    b.stop()
    # a transaction no coordinator knows of, at offset 1
    plog = PartitionLog.open(b.data_dir / f"{topic_name}-0", LogConfig())
    old = int(time.time() * 1000) - 3_600_000
    plog.append(build_batch([(None, b"hanging", (), old)], producer_id=4242, producer_epoch=3, base_sequence=0,
                            transactional=True), old)
    plog.close()
    b.start()

    done = Producer(rdkafka_conf(b.bootstrap, **{"transactional.id": "tool-done"}))
    done.init_transactions(15)
    done.begin_transaction()
    done.produce(topic_name, b"committed", partition=0)
    done.commit_transaction(15)
    open_ = Producer(rdkafka_conf(b.bootstrap, **{"transactional.id": "tool-open"}))
    open_.init_transactions(15)
    open_.begin_transaction()
    open_.produce(topic_name, b"open", partition=0)
    open_.flush(15)

    rows = shoal_tx(b.bootstrap, "list")
    assert rows[0] == ["TransactionalId", "ProducerId", "TransactionState"]
    assert {(r[0], r[2]) for r in rows[1:]} == {("tool-done", "CompleteCommit"), ("tool-open", "Ongoing")}
    rows = shoal_tx(b.bootstrap, "list", "--state", "Ongoing")
    assert [r[0] for r in rows[1:]] == ["tool-open"]
    rows = shoal_tx(b.bootstrap, "describe", "--transactional-id", "tool-open")
    assert rows[1][0] == "tool-open" and rows[1][3] == "Ongoing" and rows[1][-1] == f"{topic_name}-0"
    # no transaction open: Kafka's DescribeTransactions says start time -1, read as none
    idle = Producer(rdkafka_conf(b.bootstrap, **{"transactional.id": "tool-idle"}))
    idle.init_transactions(15)
    rows = shoal_tx(b.bootstrap, "describe", "--transactional-id", "tool-idle")
    assert rows[1][0] == "tool-idle" and rows[1][3] == "Empty" and rows[1][5:] == ["-", "-", "-"]
    rows = shoal_tx(b.bootstrap, "--output", "json", "describe", "--transactional-id", "tool-idle")
    described = json.loads(" ".join(rows[0]))[0]
    assert described["transactionstate"] == "Empty" and described["currenttransactionstarttimems"] is None
    rows = shoal_tx(b.bootstrap, "describe-producers", "--topic", topic_name, "--partition", "0")
    starts = {int(r[0]): r[5] for r in rows[1:]}
    assert starts[4242] == "1"  # the hanging one starts at offset 1; the open one after "committed"

    # read_committed readers stop at the hanging transaction
    assert committed_values(b.bootstrap, topic_name, 2, timeout_s=4) == [b"before"]
    rows = shoal_tx(b.bootstrap, "find-hanging", "--topic", topic_name, "--max-transaction-timeout", "1")
    assert [(r[0], r[1], r[2], r[5]) for r in rows[1:]] == [(topic_name, "0", "4242", "1")]
    shoal_tx(b.bootstrap, "abort", "--topic", topic_name, "--partition", "0", "--start-offset", "1")
    assert shoal_tx(b.bootstrap, "find-hanging", "--topic", topic_name, "--max-transaction-timeout", "1")[1:] == []
    assert committed_values(b.bootstrap, topic_name, 2) == [b"before", b"committed"]
    open_.commit_transaction(15)
    assert committed_values(b.bootstrap, topic_name, 3) == [b"before", b"committed", b"open"]
