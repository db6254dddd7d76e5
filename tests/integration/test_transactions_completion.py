"""The end of a transaction on one broker: EndTxn is answered once PrepareCommit /
PrepareAbort is durable, the markers' fsync and the completion follow. A request of the
same transactional id that arrives meanwhile is parked until the completion is recorded
(not answered CONCURRENT_TRANSACTIONS, which clients retry only after a backoff), and a
crash right after EndTxn's answer still ends the transaction at restart.

Raw requests on one connection: a client pipelines them, and the broker serves the
frames it receives together, so the second request reaches the coordinator while the
first one's transaction is still completing.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable

import pytest
from kio.schema.add_partitions_to_txn.v3 import request as add3
from kio.schema.end_txn.v3 import request as end3
from kio.schema.errors import ErrorCode
from kio.schema.init_producer_id.v4 import request as init4
from kio.schema.produce.v9 import request as produce9

from shoal.coordinator.partitioning import coordinator_partition
from shoal.coordinator.records import TRANSACTION_STATE
from shoal.log.partition_log import PartitionLog
from shoal.log.policy import LogConfig
from shoal.protocol.batch import build_batch
from shoal.transactions.coordinator import TxnMetadata, TxnState, record_of
from tests.integration.test_transactions import read_all
from tests.support.broker import BrokerProcess
from tests.support.clients import create_topic, producer
from tests.support.wire import RawConnection, request_bytes

pytestmark = pytest.mark.integration


def _init(txn_id: str, pid: int = -1, epoch: int = -1) -> init4.InitProducerIdRequest:
    return init4.InitProducerIdRequest(transactional_id=txn_id, transaction_timeout=datetime.timedelta(seconds=30),
                                       producer_id=pid, producer_epoch=epoch)


def _add(txn_id: str, pid: int, epoch: int, topic: str, partitions: tuple[int, ...]) -> add3.AddPartitionsToTxnRequest:
    return add3.AddPartitionsToTxnRequest(
        v3_and_below_transactional_id=txn_id, v3_and_below_producer_id=pid, v3_and_below_producer_epoch=epoch,
        v3_and_below_topics=(add3.AddPartitionsToTxnTopic(name=topic, partitions=partitions),))


def _end(txn_id: str, pid: int, epoch: int, commit: bool) -> end3.EndTxnRequest:
    return end3.EndTxnRequest(transactional_id=txn_id, producer_id=pid, producer_epoch=epoch, committed=commit)


def _add_codes(response: object) -> set[int]:
    return {int(p.partition_error_code) for t in response.results_by_topic_v3_and_below  # type: ignore[attr-defined]
            for p in t.results_by_partition}


def _produce(conn: RawConnection, txn_id: str, topic: str, pid: int, epoch: int, partition: int, seq: int,
             value: bytes, cid: int) -> int:
    data = build_batch([(None, value, (), int(time.time() * 1000))], producer_id=pid, producer_epoch=epoch,
                       base_sequence=seq, transactional=True)
    resp = conn.request(produce9.ProduceRequest(
        transactional_id=txn_id, acks=-1, timeout=datetime.timedelta(seconds=10),
        topic_data=(produce9.TopicProduceData(name=topic, partition_data=(
            produce9.PartitionProduceData(index=partition, records=data),)),)), cid)
    return int(resp.responses[0].partition_responses[0].error_code)


def _pipelined(conn: RawConnection, *requests: tuple[object, int]) -> list[object]:
    """Send every request in one write, then read their responses (in request order)."""
    conn.send(b"".join(request_bytes(r, cid) for r, cid in requests))
    out = []
    for r, cid in requests:
        got_cid, response = conn.read_response(type(r).__api_key__, type(r).__version__)
        assert got_cid == cid
        out.append(response)
    return out


def _open_txn(conn: RawConnection, txn_id: str, topic: str, pid: int, epoch: int, partitions: int, seq: int,
              tag: bytes, cid: int) -> int:
    """AddPartitionsToTxn for every partition, then one record each; the next correlation id."""
    assert _add_codes(conn.request(_add(txn_id, pid, epoch, topic, tuple(range(partitions))), cid)) == {0}
    for p in range(partitions):
        assert _produce(conn, txn_id, topic, pid, epoch, p, seq, b"%s-%d" % (tag, p), cid + 1 + p) == ErrorCode.none
    return cid + 1 + partitions


def test_requests_behind_end_txn_wait_for_the_completion(broker: BrokerProcess, topic_name: str) -> None:
    create_topic(broker.bootstrap, topic_name, partitions=3)
    with RawConnection(broker.bootstrap) as conn:
        init = conn.request(_init("tx-park"), 1)
        assert init.error_code == ErrorCode.none
        pid, epoch = int(init.producer_id), int(init.producer_epoch)
        cid = _open_txn(conn, "tx-park", topic_name, pid, epoch, 3, 0, b"one", 2)
        # the next transaction's AddPartitionsToTxn right behind the commit: parked, then served
        end, add = _pipelined(conn, (_end("tx-park", pid, epoch, True), cid),
                              (_add("tx-park", pid, epoch, topic_name, (0, 1, 2)), cid + 1))
        assert end.error_code == ErrorCode.none  # type: ignore[attr-defined]
        assert _add_codes(add) == {0}
        for p in range(3):
            assert _produce(conn, "tx-park", topic_name, pid, epoch, p, 1, b"two-%d" % p, cid + 2 + p) == 0
        # an abort, with a retry of it and a new instance's InitProducerId right behind it
        end, again, init = _pipelined(conn, (_end("tx-park", pid, epoch, False), cid + 10),
                                      (_end("tx-park", pid, epoch, False), cid + 11),
                                      (_init("tx-park", pid, epoch), cid + 12))
        assert end.error_code == ErrorCode.none  # type: ignore[attr-defined]
        assert again.error_code == ErrorCode.none  # type: ignore[attr-defined]  # the abort is done: a retry
        assert (init.error_code, init.producer_id, init.producer_epoch) == (  # type: ignore[attr-defined]
            ErrorCode.none, pid, epoch + 1)
        # a commit behind an abort of the same transaction is refused once the abort completed
        epoch += 1
        cid = _open_txn(conn, "tx-park", topic_name, pid, epoch, 1, 0, b"three", cid + 20)
        end, wrong = _pipelined(conn, (_end("tx-park", pid, epoch, False), cid),
                                (_end("tx-park", pid, epoch, True), cid + 1))
        assert end.error_code == ErrorCode.none  # type: ignore[attr-defined]
        assert wrong.error_code == ErrorCode.invalid_txn_state  # type: ignore[attr-defined]
    p = producer(broker.bootstrap)
    p.produce(topic_name, b"plain", partition=0)
    assert p.flush(15) == 0
    # read_committed: the committed transaction and the plain record, nothing aborted, not stuck
    got = read_all(broker.bootstrap, topic_name, 3, "read_committed", 4)
    assert sorted(got) == [b"one-0", b"one-1", b"one-2", b"plain"]


@pytest.mark.parametrize("commit", [True, False])
def test_a_crash_right_after_end_txn_still_ends_the_transaction(
        start_broker: Callable[..., BrokerProcess], topic_name: str, commit: bool) -> None:
    b = start_broker()
    create_topic(b.bootstrap, topic_name, partitions=4)
    with RawConnection(b.bootstrap) as conn:
        init = conn.request(_init("tx-crash"), 1)
        pid, epoch = int(init.producer_id), int(init.producer_epoch)
        cid = _open_txn(conn, "tx-crash", topic_name, pid, epoch, 4, 0, b"v", 2)
        assert conn.request(_end("tx-crash", pid, epoch, commit), cid).error_code == ErrorCode.none
        b.kill()  # kill -9 as soon as EndTxn is answered: the markers may not be durable yet
    b.start()
    with RawConnection(b.bootstrap) as conn:
        # the restart ended the transaction: a new instance gets the next epoch at once
        init = conn.request(_init("tx-crash"), 1)
        assert (init.error_code, init.producer_id, init.producer_epoch) == (ErrorCode.none, pid, epoch + 1)
    p = producer(b.bootstrap)
    for i in range(4):
        p.produce(topic_name, b"plain-%d" % i, partition=i)
    assert p.flush(15) == 0
    got = read_all(b.bootstrap, topic_name, 4, "read_committed", 8 if commit else 4)
    expected = [b"plain-%d" % i for i in range(4)] + ([b"v-%d" % i for i in range(4)] if commit else [])
    assert sorted(got) == sorted(expected)


def test_a_prepare_record_without_its_completion_is_finished_at_start(
        start_broker: Callable[..., BrokerProcess], topic_name: str) -> None:
    """The state a crash leaves between EndTxn's answer and the completion: PrepareCommit
    durable, no CompleteCommit (and perhaps no markers). Made exactly so here, by appending
    the PrepareCommit record to ``__transaction_state`` of the stopped broker."""
    b = start_broker()
    create_topic(b.bootstrap, topic_name, partitions=2)
    with RawConnection(b.bootstrap) as conn:
        init = conn.request(_init("tx-prepared"), 1)
        pid, epoch = int(init.producer_id), int(init.producer_epoch)
        _open_txn(conn, "tx-prepared", topic_name, pid, epoch, 2, 0, b"p", 2)
    b.stop()
    now = int(time.time() * 1000)
    prepared = TxnMetadata("tx-prepared", pid, epoch, 30_000, TxnState.PREPARE_COMMIT,
                           {(topic_name, 0), (topic_name, 1)}, now - 1000, now)
    key, value = record_of(prepared).to_bytes()
    plog = PartitionLog.open(b.data_dir / f"{TRANSACTION_STATE}-{coordinator_partition('tx-prepared', 50)}",
                             LogConfig())
    plog.append(build_batch([(key, value, (), now)]), now)
    plog.close()
    b.start()
    assert "completed 1 interrupted transaction(s)" in b.stderr_tail(200)
    assert read_all(b.bootstrap, topic_name, 2, "read_committed", 2) in ([b"p-0", b"p-1"], [b"p-1", b"p-0"])
    with RawConnection(b.bootstrap) as conn:
        init = conn.request(_init("tx-prepared"), 1)
        assert (init.error_code, init.producer_id, init.producer_epoch) == (ErrorCode.none, pid, epoch + 1)
