"""Transactions end to end: confluent-kafka's transactional producer against the broker's
transaction coordinator, read by read_committed and read_uncommitted consumers.

Each test would fail without the coordinator (init_transactions was refused), without
the markers (read_committed consumers would stall at the open transaction or see aborted
records), or without the last stable offset (they would see records of open transactions).
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable

import pytest
from confluent_kafka import KafkaException, Producer, TopicPartition
from kio.schema.add_partitions_to_txn.v3 import request as add3
from kio.schema.api_versions.v3 import request as versions3
from kio.schema.end_txn.v3 import request as end3
from kio.schema.end_txn.v5 import request as end5
from kio.schema.errors import ErrorCode
from kio.schema.init_producer_id.v4 import request as init4
from kio.schema.produce.v9 import request as produce9
from kio.schema.produce.v12 import request as produce12
from kio.schema.txn_offset_commit.v5 import request as tcommit5

from shoal.protocol.batch import build_batch
from tests.support.broker import BrokerProcess
from tests.support.clients import consumer, create_topic, rdkafka_conf
from tests.support.wire import RawConnection

pytestmark = pytest.mark.integration


def txn_producer(bootstrap: str, txn_id: str, **extra: object) -> Producer:
    conf: dict[str, object] = {"transactional.id": txn_id, "linger.ms": 5}
    if "transaction.timeout.ms" in extra:  # librdkafka wants socket.timeout.ms below it
        conf["socket.timeout.ms"] = min(10_000, int(extra["transaction.timeout.ms"]))  # type: ignore[call-overload]
    conf.update(extra)
    return Producer(rdkafka_conf(bootstrap, **conf))


def read_all(bootstrap: str, topic: str, partitions: int, isolation: str, expect: int,
             timeout_s: float = 30.0, settle_s: float = 1.0) -> list[bytes]:
    """Every value of ``topic`` a consumer with ``isolation`` gets: at least ``expect`` of them,
    then whatever else arrives within ``settle_s``."""
    c = consumer(bootstrap, **{"isolation.level": isolation})
    try:
        c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        got: list[bytes] = []
        deadline = time.monotonic() + timeout_s
        quiet_until = None
        while time.monotonic() < deadline:
            m = c.poll(0.2)
            if m is not None and m.error() is None:
                got.append(m.value())
                continue
            if len(got) >= expect:
                quiet_until = quiet_until or time.monotonic() + settle_s
                if time.monotonic() >= quiet_until:
                    break
        return got
    finally:
        c.close()


def produce_txn(p: Producer, topic: str, values: list[bytes], partitions: int, *, commit: bool) -> None:
    p.begin_transaction()
    for i, v in enumerate(values):
        p.produce(topic, v, partition=i % partitions)
    p.flush(15)
    if commit:
        p.commit_transaction(15)
    else:
        p.abort_transaction(15)


def test_read_committed_sees_committed_transactions_only(broker: BrokerProcess, topic_name: str) -> None:
    create_topic(broker.bootstrap, topic_name, partitions=2)
    p = txn_producer(broker.bootstrap, "tx-basic")
    p.init_transactions(15)
    a = [b"a%d" % i for i in range(10)]
    b = [b"b%d" % i for i in range(10)]
    c = [b"c%d" % i for i in range(5)]
    produce_txn(p, topic_name, a, 2, commit=True)
    produce_txn(p, topic_name, b, 2, commit=False)
    produce_txn(p, topic_name, c, 2, commit=True)
    committed = read_all(broker.bootstrap, topic_name, 2, "read_committed", 15)
    assert sorted(committed) == sorted(a + c)
    everything = read_all(broker.bootstrap, topic_name, 2, "read_uncommitted", 25)
    assert sorted(everything) == sorted(a + b + c)  # markers are never delivered as records

    # an open transaction: read_committed readers stop at it; the latest offset they see is the LSO
    p.begin_transaction()
    p.produce(topic_name, b"open", partition=0)
    p.flush(15)
    rc = consumer(broker.bootstrap, **{"isolation.level": "read_committed"})
    ru = consumer(broker.bootstrap, **{"isolation.level": "read_uncommitted"})
    try:
        lso = rc.get_watermark_offsets(TopicPartition(topic_name, 0), timeout=10)[1]
        hw = ru.get_watermark_offsets(TopicPartition(topic_name, 0), timeout=10)[1]
    finally:
        rc.close()
        ru.close()
    assert hw == lso + 1
    assert read_all(broker.bootstrap, topic_name, 2, "read_committed", 15, settle_s=1.5).count(b"open") == 0
    p.commit_transaction(15)
    assert b"open" in read_all(broker.bootstrap, topic_name, 2, "read_committed", 16)


def test_a_zombie_instance_is_fenced(broker: BrokerProcess, topic_name: str) -> None:
    create_topic(broker.bootstrap, topic_name, partitions=1)
    old = txn_producer(broker.bootstrap, "tx-zombie")
    old.init_transactions(15)
    old.begin_transaction()
    old.produce(topic_name, b"zombie-before", partition=0)
    old.flush(15)
    new = txn_producer(broker.bootstrap, "tx-zombie")
    new.init_transactions(30)  # aborts the old instance's open transaction
    produce_txn(new, topic_name, [b"new"], 1, commit=True)
    old.produce(topic_name, b"zombie-after", partition=0)
    with pytest.raises(KafkaException) as e:  # its send is refused (an old epoch), so is its commit
        old.flush(5)
        old.commit_transaction(15)
    assert e.value.args[0].fatal()
    assert read_all(broker.bootstrap, topic_name, 1, "read_committed", 1, settle_s=2.0) == [b"new"]


def test_an_expired_transaction_is_aborted_by_the_broker(broker: BrokerProcess, topic_name: str) -> None:
    create_topic(broker.bootstrap, topic_name, partitions=1)
    stuck = txn_producer(broker.bootstrap, "tx-stuck", **{"transaction.timeout.ms": 3000,
                                                          "message.timeout.ms": 2500})
    stuck.init_transactions(15)
    stuck.begin_transaction()
    stuck.produce(topic_name, b"never", partition=0)
    stuck.flush(15)
    later = txn_producer(broker.bootstrap, "tx-later")
    later.init_transactions(15)
    produce_txn(later, topic_name, [b"after"], 1, commit=True)
    # read_committed readers wait at the open transaction, then move past it once it is aborted
    assert read_all(broker.bootstrap, topic_name, 1, "read_committed", 1, timeout_s=30) == [b"after"]
    with pytest.raises(KafkaException):
        stuck.commit_transaction(10)


def test_an_open_transaction_survives_a_crash(start_broker: Callable[..., BrokerProcess], topic_name: str) -> None:
    b = start_broker()
    create_topic(b.bootstrap, topic_name, partitions=2)
    keep = txn_producer(b.bootstrap, "tx-keep", **{"transaction.timeout.ms": 60000})
    keep.init_transactions(15)
    keep.begin_transaction()
    for i in range(6):
        keep.produce(topic_name, b"keep%d" % i, partition=i % 2)
    keep.flush(15)
    lost = txn_producer(b.bootstrap, "tx-lost", **{"transaction.timeout.ms": 5000, "message.timeout.ms": 4000})
    lost.init_transactions(15)
    lost.begin_transaction()
    lost.produce(topic_name, b"lost", partition=0)
    lost.flush(15)
    b.restart(crash=True)  # kill -9
    keep.commit_transaction(60)  # the coordinator recovered the open transaction and its partitions
    got = read_all(b.bootstrap, topic_name, 2, "read_committed", 6, timeout_s=40, settle_s=1.0)
    assert sorted(got) == sorted(b"keep%d" % i for i in range(6))
    # the other one is aborted at its timeout after the restart: readers move past it
    after = txn_producer(b.bootstrap, "tx-after")
    after.init_transactions(15)
    produce_txn(after, topic_name, [b"after"], 1, commit=True)
    got = read_all(b.bootstrap, topic_name, 2, "read_committed", 7, timeout_s=40)
    assert sorted(got) == sorted([b"keep%d" % i for i in range(6)] + [b"after"])
    lost.purge()


def _init(conn: RawConnection, txn_id: str, timeout_ms: int, cid: int) -> tuple[int, int, int]:
    resp = conn.request(init4.InitProducerIdRequest(
        transactional_id=txn_id, transaction_timeout=datetime.timedelta(milliseconds=timeout_ms),
        producer_id=-1, producer_epoch=-1), cid)
    return int(resp.error_code), int(resp.producer_id), int(resp.producer_epoch)


def _produce_txn_batch(conn: RawConnection, txn_id: str, topic: str, pid: int, epoch: int, seq: int,
                       cid: int) -> int:
    data = build_batch([(None, b"v", (), int(time.time() * 1000))], producer_id=pid, producer_epoch=epoch,
                       base_sequence=seq, transactional=True)
    resp = conn.request(produce9.ProduceRequest(
        transactional_id=txn_id, acks=-1, timeout=datetime.timedelta(seconds=5),
        topic_data=(produce9.TopicProduceData(name=topic, partition_data=(
            produce9.PartitionProduceData(index=0, records=data),)),)), cid)
    return int(resp.responses[0].partition_responses[0].error_code)


def test_coordinator_checks_on_the_wire(start_broker: Callable[..., BrokerProcess], topic_name: str) -> None:
    b = start_broker(**{"transaction_max_timeout_ms": "10000"})
    create_topic(b.bootstrap, topic_name, partitions=1)
    # as in Kafka, __transaction_state is created when transactions are first used
    assert not (b.data_dir / "__transaction_state-0").exists()
    with RawConnection(b.bootstrap) as conn:
        assert _init(conn, "tx-wire", 20000, 1)[0] == ErrorCode.invalid_transaction_timeout
        assert (b.data_dir / "__transaction_state-49").exists()
        code, pid, epoch = _init(conn, "tx-wire", 5000, 2)
        assert code == ErrorCode.none and pid >= 0 and epoch == 0
        # a second init bumps the epoch of the same producer id
        assert _init(conn, "tx-wire", 5000, 3) == (ErrorCode.none, pid, 1)
        epoch = 1
        # a transactional batch for a partition not added to the transaction is refused
        assert _produce_txn_batch(conn, "tx-wire", topic_name, pid, epoch, 0, 4) == ErrorCode.invalid_txn_state
        add = conn.request(add3.AddPartitionsToTxnRequest(
            v3_and_below_transactional_id="tx-wire", v3_and_below_producer_id=pid, v3_and_below_producer_epoch=epoch,
            v3_and_below_topics=(add3.AddPartitionsToTxnTopic(name=topic_name, partitions=(0,)),)), 5)
        assert add.results_by_topic_v3_and_below[0].results_by_partition[0].partition_error_code == ErrorCode.none
        assert _produce_txn_batch(conn, "tx-wire", topic_name, pid, epoch, 0, 6) == ErrorCode.none
        # an older epoch is fenced; a commit of it is refused
        assert _produce_txn_batch(conn, "tx-wire", topic_name, pid, 0, 1, 7) == ErrorCode.invalid_producer_epoch
        end = conn.request(end3.EndTxnRequest(transactional_id="tx-wire", producer_id=pid, producer_epoch=0,
                                              committed=True), 8)
        assert end.error_code == ErrorCode.producer_fenced
        end = conn.request(end3.EndTxnRequest(transactional_id="tx-wire", producer_id=pid, producer_epoch=epoch,
                                              committed=True), 9)
        assert end.error_code == ErrorCode.none
        # once committed, it cannot be aborted; committing again is a retry and succeeds
        end = conn.request(end3.EndTxnRequest(transactional_id="tx-wire", producer_id=pid, producer_epoch=epoch,
                                              committed=False), 10)
        assert end.error_code == ErrorCode.invalid_txn_state
        end = conn.request(end3.EndTxnRequest(transactional_id="tx-wire", producer_id=pid, producer_epoch=epoch,
                                              committed=True), 11)
        assert end.error_code == ErrorCode.none


def test_idle_transactional_ids_expire(start_broker: Callable[..., BrokerProcess]) -> None:
    from kio.schema.list_transactions.v0 import request as list0

    b = start_broker(**{"transactional_id_expiration_ms": "1500",
                        "transaction_remove_expired_transaction_cleanup_interval_ms": "300"})
    with RawConnection(b.bootstrap) as conn:
        code, pid, _epoch = _init(conn, "tx-idle", 5000, 1)
        assert code == ErrorCode.none

        def known(cid: int) -> bool:
            resp = conn.request(list0.ListTransactionsRequest(state_filters=(), producer_id_filters=()), cid)
            return "tx-idle" in [t.transactional_id for t in resp.transaction_states]

        assert known(2)
        deadline = time.monotonic() + 20
        while known(3):
            assert time.monotonic() < deadline, "the idle transactional id was never forgotten"
            time.sleep(0.3)
        code, again, epoch = _init(conn, "tx-idle", 5000, 4)
        assert code == ErrorCode.none and again != pid and epoch == 0


def test_compressed_transactional_batches_keep_their_transaction(broker: BrokerProcess, topic_name: str) -> None:
    """lz4 batches into a zstd topic are recompressed in a worker thread: they stay
    transactional batches of their producer, so aborts still hide them."""
    create_topic(broker.bootstrap, topic_name, partitions=2, config={"compression.type": "zstd"})
    p = txn_producer(broker.bootstrap, "tx-lz4", **{"compression.type": "lz4", "linger.ms": 20})
    p.init_transactions(15)
    committed = [b"c%d" % i for i in range(200)]
    aborted = [b"a%d" % i for i in range(200)]
    produce_txn(p, topic_name, committed[:100], 2, commit=True)
    produce_txn(p, topic_name, aborted, 2, commit=False)
    produce_txn(p, topic_name, committed[100:], 2, commit=True)
    assert sorted(read_all(broker.bootstrap, topic_name, 2, "read_committed", 200)) == sorted(committed)
    assert sorted(read_all(broker.bootstrap, topic_name, 2, "read_uncommitted", 400)) == sorted(committed + aborted)


def test_transaction_version_2_on_the_wire(start_broker: Callable[..., BrokerProcess], topic_name: str) -> None:
    """KIP-890 part 2, as Apache Kafka's Java client uses it once ApiVersions finalizes
    ``transaction.version`` 2: no AddPartitionsToTxn / AddOffsetsToTxn (Produce v12 and
    TxnOffsetCommit v5 add the partitions), and EndTxn v5 bumps the epoch at every end."""
    b = start_broker()
    create_topic(b.bootstrap, topic_name, partitions=1)
    with RawConnection(b.bootstrap) as conn:
        v = conn.request(versions3.ApiVersionsRequest(client_software_name="t", client_software_version="1"), 1)
        assert [(f.name, f.min_version_level, f.max_version_level) for f in v.finalized_features] == [
            ("transaction.version", 2, 2)]
        assert [(f.name, f.max_version) for f in v.supported_features] == [("transaction.version", 2)]
        code, pid, epoch = _init(conn, "tx-v2", 10000, 2)
        assert code == ErrorCode.none and epoch == 0

        def produce(epoch: int, seq: int, cid: int) -> tuple[int, int]:
            data = build_batch([(None, b"v", (), int(time.time() * 1000))], producer_id=pid, producer_epoch=epoch,
                               base_sequence=seq, transactional=True)
            r = conn.request(produce12.ProduceRequest(
                transactional_id="tx-v2", acks=-1, timeout=datetime.timedelta(seconds=5),
                topic_data=(produce12.TopicProduceData(name=topic_name, partition_data=(
                    produce12.PartitionProduceData(index=0, records=data),)),)), cid).responses[0]
            return int(r.partition_responses[0].error_code), int(r.partition_responses[0].base_offset)

        def end(epoch: int, commit: bool, cid: int) -> tuple[int, int, int]:
            r = conn.request(end5.EndTxnRequest(transactional_id="tx-v2", producer_id=pid, producer_epoch=epoch,
                                                committed=commit), cid)
            return int(r.error_code), int(r.producer_id), int(r.producer_epoch)

        assert produce(0, 0, 3) == (ErrorCode.none, 0)  # the leader added the partition
        r = conn.request(tcommit5.TxnOffsetCommitRequest(
            transactional_id="tx-v2", group_id="g-v2", producer_id=pid, producer_epoch=0, generation_id=-1,
            member_id="", group_instance_id=None, topics=(tcommit5.TxnOffsetCommitRequestTopic(
                name=topic_name, partitions=(tcommit5.TxnOffsetCommitRequestPartition(
                    partition_index=0, committed_offset=1, committed_leader_epoch=-1, committed_metadata=""),)),)),
            4)
        assert r.topics[0].partitions[0].error_code == ErrorCode.none  # the offsets partition added here
        assert end(0, True, 5) == (ErrorCode.none, pid, 1)  # committed; go on with epoch 1
        assert end(0, True, 6) == (ErrorCode.none, pid, 1)  # a retry is told the same
        # a late batch of the committed transaction: the marker's epoch refuses it
        assert produce(0, 1, 7) == (ErrorCode.invalid_producer_epoch, -1)
        assert end(1, True, 8)[0] == ErrorCode.invalid_txn_state  # nothing open to commit
        assert produce(1, 0, 9) == (ErrorCode.none, 2)  # the next transaction (after the marker at 1)
        assert end(1, False, 10) == (ErrorCode.none, pid, 2)
        assert end(1, False, 11) == (ErrorCode.none, pid, 2)
        assert end(3, False, 12)[0] == ErrorCode.producer_fenced
    c = consumer(b.bootstrap, **{"isolation.level": "read_committed"})
    try:
        c.assign([TopicPartition(topic_name, 0, 0)])
        got: list[bytes] = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not got:
            m = c.poll(1)
            if m is not None and not m.error():
                got.append(m.value())
        got += [m.value() for m in iter(lambda: c.poll(2), None) if not m.error()]  # nothing more comes
    finally:
        c.close()
    assert got == [b"v"]  # the committed record only
