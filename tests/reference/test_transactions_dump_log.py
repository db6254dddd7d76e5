"""kafka-dump-log on shoal's transaction state and transaction markers.

A transactional producer (confluent-kafka) commits one transaction and aborts another;
the broker stops, and Kafka's DumpLogSegments reads ``__transaction_state`` with
``--transaction-log-decoder`` (every record a TransactionLogKey / TransactionLogValue,
through Kafka's states) and the data partition (a COMMIT and an ABORT control record,
in place) and its ``.txnindex`` (the aborted transaction).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from confluent_kafka import Producer

from tests.reference.conftest import SHOAL_OVERRIDES
from tests.support.broker import BrokerProcess
from tests.support.clients import create_topic, rdkafka_conf
from tests.support.kafka_ref import run_tool

pytestmark = [pytest.mark.integration, pytest.mark.timeout(400)]


def test_transaction_state_and_markers_decode(tmp_path: Path, kafka_classpath: str) -> None:
    data = tmp_path / "data"
    b = BrokerProcess(data, SHOAL_OVERRIDES)
    b.start()
    try:
        create_topic(b.bootstrap, "dl-txn", partitions=1)
        p = Producer(rdkafka_conf(b.bootstrap, **{"transactional.id": "dl-tx"}))
        p.init_transactions(15)
        for commit in (True, False):
            p.begin_transaction()
            p.produce("dl-txn", b"x", partition=0)
            p.flush(15)
            if commit:
                p.commit_transaction(15)
            else:
                p.abort_transaction(15)
    finally:
        b.stop()
    files = sorted(str(f) for f in data.glob("__transaction_state-*/*.log") if f.stat().st_size > 0)
    out = run_tool("kafka-dump-log", "--files", ",".join(files), "--transaction-log-decoder", timeout=180).stdout
    states = []
    for line in out.splitlines():
        if line.startswith("| offset: "):
            _, _, rest = line.partition(" key: ")
            key_text, _, value_text = rest.partition(" payload: ")
            key, value = json.loads(key_text), json.loads(value_text)
            assert key["data"] == {"transactionalId": "dl-tx"}
            assert value["data"]["producerEpoch"] == 0 and value["data"]["transactionTimeoutMs"] == 60000
            states.append((value["data"]["transactionStatus"],
                           [(t["topic"], t["partitionIds"]) for t in value["data"]["transactionPartitions"]]))
    ongoing = ("Ongoing", [("dl-txn", [0])])
    assert states == [("Empty", []), ongoing, ("PrepareCommit", [("dl-txn", [0])]), ("CompleteCommit", []),
                      ongoing, ("PrepareAbort", [("dl-txn", [0])]), ("CompleteAbort", [])], out[-3000:]
    seg = sorted(data.glob("dl-txn-0/*.log"))[0]
    out = run_tool("kafka-dump-log", "--files", str(seg), "--print-data-log", timeout=180).stdout
    rows = [line.split(" headerKeys: [] ")[1] for line in out.splitlines() if line.startswith("| offset: ")]
    assert rows == ["payload: x", "endTxnMarker: COMMIT coordinatorEpoch: 0", "payload: x",
                    "endTxnMarker: ABORT coordinatorEpoch: 0"], out[-3000:]
    # the segment's aborted-transaction index, in Kafka's .txnindex layout
    out = run_tool("kafka-dump-log", "--files", str(seg.with_suffix(".txnindex")), timeout=180).stdout
    entries = [line for line in out.splitlines() if line.startswith("version: ")]
    assert entries == ["version: 0 producerId: 0 firstOffset: 2 lastOffset: 3 lastStableOffset: 4"], out
