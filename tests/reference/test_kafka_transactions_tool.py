"""Kafka's kafka-transactions tool against shoal: list, describe, describe-producers,
find-hanging and abort of a hanging transaction (one the coordinator never knew: a
transactional batch written into the log of the stopped broker)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from confluent_kafka import Producer

from shoal.log.partition_log import PartitionLog
from shoal.log.policy import LogConfig
from shoal.protocol.batch import build_batch
from tests.reference.conftest import SHOAL_OVERRIDES
from tests.support.broker import BrokerProcess
from tests.support.clients import create_topic, rdkafka_conf
from tests.support.kafka_ref import run_tool

pytestmark = [pytest.mark.integration, pytest.mark.timeout(400)]


def table(bootstrap: str, *args: str) -> list[list[str]]:
    out = run_tool("kafka-transactions", "--bootstrap-server", bootstrap, *args, timeout=120).stdout
    return [[c.strip() for c in line.split("\t") if c.strip()] for line in out.splitlines() if line.strip()]


def test_kafka_transactions_tool(tmp_path: Path, kafka_classpath: str) -> None:
    b = BrokerProcess(tmp_path / "data", SHOAL_OVERRIDES)
    b.start()
    try:
        create_topic(b.bootstrap, "kt", partitions=1)
        b.stop()
        plog = PartitionLog.open(b.data_dir / "kt-0", LogConfig())
        old = int(time.time() * 1000) - 3_600_000
        plog.append(build_batch([(None, b"hanging", (), old)], producer_id=4242, producer_epoch=3, base_sequence=0,
                                transactional=True), old)
        plog.close()
        b.start()
        p = Producer(rdkafka_conf(b.bootstrap, **{"transactional.id": "kt-open"}))
        p.init_transactions(15)
        p.begin_transaction()
        p.produce("kt", b"x", partition=0)
        p.flush(15)

        rows = table(b.bootstrap, "list")
        assert rows[0] == ["TransactionalId", "Coordinator", "ProducerId", "TransactionState"]
        assert [(r[0], r[3]) for r in rows[1:]] == [("kt-open", "Ongoing")]
        rows = table(b.bootstrap, "describe", "--transactional-id", "kt-open")
        assert rows[1][1] == "kt-open" and rows[1][4] == "Ongoing" and rows[1][5] == "60000" and rows[1][-1] == "kt-0"
        rows = table(b.bootstrap, "describe-producers", "--topic", "kt", "--partition", "0")
        starts = {r[0]: r[5] for r in rows[1:]}  # the hanging transaction at 0, kt-open's at 1
        assert starts["4242"] == "0" and sorted(starts.values()) == ["0", "1"]
        rows = table(b.bootstrap, "find-hanging", "--broker-id", "0")
        assert [(r[0], r[1], r[2], r[5]) for r in rows[1:]] == [("kt", "0", "4242", "0")]
        table(b.bootstrap, "abort", "--topic", "kt", "--partition", "0", "--start-offset", "0")
        assert table(b.bootstrap, "find-hanging", "--broker-id", "0")[1:] == []
        p.commit_transaction(15)
        assert [(r[0], r[3]) for r in table(b.bootstrap, "list")[1:]] == [("kt-open", "CompleteCommit")]
    finally:
        b.stop()
