"""Produce and transactions: a batch with the transactional bit needs a transactional id.

Kafka's broker refuses a Produce request without a transactional id that holds a
transactional batch, as a whole: every partition TRANSACTIONAL_ID_AUTHORIZATION_FAILED
(KafkaApis.handleProduceRequest), and nothing is written. Otherwise a read_committed
reader would see records no transaction ever committed.
"""

from __future__ import annotations

import datetime
import time

import pytest
from kio.schema.errors import ErrorCode
from kio.schema.produce.v9 import request as produce9

from shoal.protocol.batch import build_batch
from tests.support.broker import BrokerProcess
from tests.support.clients import create_topic
from tests.support.wire import RawConnection

pytestmark = pytest.mark.integration

TRANSACTIONAL = 0x10


def _batch(values: list[bytes], *, transactional: bool) -> bytes:
    now = int(time.time() * 1000)
    return build_batch([(None, v, (), now) for v in values], producer_id=7, producer_epoch=0, base_sequence=0,
                       transactional=transactional)


def _produce(conn: RawConnection, topic: str, parts: dict[int, bytes],
             correlation_id: int) -> dict[int, tuple[int, int]]:
    """Partition -> (error code, base offset)."""
    req = produce9.ProduceRequest(
        transactional_id=None, acks=-1, timeout=datetime.timedelta(seconds=5),
        topic_data=(produce9.TopicProduceData(name=topic, partition_data=tuple(
            produce9.PartitionProduceData(index=p, records=r) for p, r in parts.items())),))
    resp = conn.request(req, correlation_id)
    return {int(p.index): (int(p.error_code), int(p.base_offset)) for t in resp.responses
            for p in t.partition_responses}


def test_a_transactional_batch_without_a_transactional_id_is_refused_whole(broker: BrokerProcess,
                                                                           topic_name: str) -> None:
    create_topic(broker.bootstrap, topic_name, partitions=2)
    with RawConnection(broker.bootstrap) as conn:
        # Partition 1's batch is an ordinary one, but the request is refused as a whole.
        codes = _produce(conn, topic_name, {0: _batch([b"a"], transactional=True),
                                            1: _batch([b"b"], transactional=False)}, 1)
        assert codes == {0: (ErrorCode.transactional_id_authorization_failed, -1),
                         1: (ErrorCode.transactional_id_authorization_failed, -1)}
        # Nothing was written: ordinary batches land at offset 0 of both partitions.
        assert _produce(conn, topic_name, {0: _batch([b"c"], transactional=False),
                                           1: _batch([b"d"], transactional=False)}, 2) == {
            0: (ErrorCode.none, 0), 1: (ErrorCode.none, 0)}
