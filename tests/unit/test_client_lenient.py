"""Lenient response types: DescribeTransactions' start time -1 (no transaction open), as
Kafka and shoal send it, which kio's own reader refuses."""

from __future__ import annotations

import datetime
import io

import pytest
from kio.schema.describe_transactions.v0 import response as r
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader, entity_writer

from shoal.client.lenient import lenient_response


def _state(txn_id: str, start_ms: int) -> r.TransactionState:
    return r.TransactionState(
        error_code=ErrorCode.none, transactional_id=txn_id, transaction_state="Empty" if start_ms < 0 else "Ongoing",
        transaction_timeout=datetime.timedelta(seconds=60),
        transaction_start_time=datetime.datetime.fromtimestamp(start_ms / 1000, datetime.UTC), producer_id=7,
        producer_epoch=2, topics=(r.TopicData(topic="t", partitions=(0, 3)),))


def _encoded(*states: r.TransactionState) -> bytes:
    buf = io.BytesIO()
    entity_writer(r.DescribeTransactionsResponse)(
        buf, r.DescribeTransactionsResponse(throttle_time=datetime.timedelta(0), transaction_states=states))
    return buf.getvalue()


def test_describe_transactions_start_time_minus_one_is_read_as_minus_one() -> None:
    data = _encoded(_state("idle", -1), _state("open", 1_700_000_000_123))
    with pytest.raises(Exception, match="negative"):
        entity_reader(r.DescribeTransactionsResponse)(data, 0)  # kio's own type refuses it
    value, used = entity_reader(lenient_response(65, 0))(data, 0)
    assert used == len(data)
    idle, open_ = value.transaction_states
    assert (idle.transactional_id, idle.transaction_state, idle.transaction_start_time) == ("idle", "Empty", -1)
    assert open_.transaction_start_time == 1_700_000_000_123
    assert (open_.producer_id, open_.producer_epoch, open_.transaction_timeout) == (
        7, 2, datetime.timedelta(seconds=60))
    assert [(t.topic, tuple(t.partitions)) for t in open_.topics] == [("t", (0, 3))]


def test_other_responses_are_kio_types() -> None:
    from shoal.protocol.codec import codec_for

    assert lenient_response(66, 1) is codec_for(66, 1).response_type  # nothing to relax in ListTransactions
