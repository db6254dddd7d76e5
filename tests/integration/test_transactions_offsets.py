"""Offsets committed inside a transaction (TxnOffsetCommit): visible at commit, dropped at
abort, UNSTABLE_OFFSET_COMMIT for require_stable readers while pending; and a
consume-transform-produce loop with random aborts that delivers every input exactly once.
"""

from __future__ import annotations

import datetime
import random
import time

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from kio.schema.add_offsets_to_txn.v3 import request as addoff3
from kio.schema.end_txn.v3 import request as end3
from kio.schema.errors import ErrorCode
from kio.schema.init_producer_id.v4 import request as init4
from kio.schema.offset_fetch.v8 import request as fetch8
from kio.schema.txn_offset_commit.v3 import request as tcommit3

from tests.support.broker import BrokerProcess
from tests.support.clients import create_topic, produce_all, producer, rdkafka_conf
from tests.support.wire import RawConnection

pytestmark = pytest.mark.integration


def _fetch(conn: RawConnection, group: str, topic: str, stable: bool, cid: int) -> tuple[int, int]:
    resp = conn.request(fetch8.OffsetFetchRequest(groups=(fetch8.OffsetFetchRequestGroup(
        group_id=group, topics=(fetch8.OffsetFetchRequestTopics(name=topic, partition_indexes=(0,)),)),),
        require_stable=stable), cid)
    part = resp.groups[0].topics[0].partitions[0]
    return int(part.error_code), int(part.committed_offset)


def test_transactional_offsets_appear_at_commit_and_vanish_at_abort(broker: BrokerProcess, topic_name: str) -> None:
    create_topic(broker.bootstrap, topic_name, partitions=1)
    group = topic_name + "-g"
    with RawConnection(broker.bootstrap) as conn:
        init = conn.request(init4.InitProducerIdRequest(
            transactional_id="tx-off", transaction_timeout=datetime.timedelta(seconds=30), producer_id=-1,
            producer_epoch=-1), 1)
        pid, epoch = int(init.producer_id), int(init.producer_epoch)
        cid = 10
        for offset, commit in ((7, False), (11, True)):
            cid += 10
            add = conn.request(addoff3.AddOffsetsToTxnRequest(transactional_id="tx-off", producer_id=pid,
                                                              producer_epoch=epoch, group_id=group), cid)
            assert add.error_code == ErrorCode.none
            resp = conn.request(tcommit3.TxnOffsetCommitRequest(
                transactional_id="tx-off", group_id=group, producer_id=pid, producer_epoch=epoch, topics=(
                    tcommit3.TxnOffsetCommitRequestTopic(name=topic_name, partitions=(
                        tcommit3.TxnOffsetCommitRequestPartition(partition_index=0, committed_offset=offset,
                                                                 committed_leader_epoch=-1,
                                                                 committed_metadata=""),)),)), cid + 1)
            assert resp.topics[0].partitions[0].error_code == ErrorCode.none
            # pending: require_stable readers are told so, others see the last committed offset (none)
            assert _fetch(conn, group, topic_name, True, cid + 2) == (ErrorCode.unstable_offset_commit, -1)
            assert _fetch(conn, group, topic_name, False, cid + 3) == (ErrorCode.none, -1)
            end = conn.request(end3.EndTxnRequest(transactional_id="tx-off", producer_id=pid, producer_epoch=epoch,
                                                  committed=commit), cid + 4)
            assert end.error_code == ErrorCode.none
            want = offset if commit else -1
            assert _fetch(conn, group, topic_name, True, cid + 5) == (ErrorCode.none, want)
    # the committed offset survives a restart (its marker is replayed with the records)
    broker.restart()
    with RawConnection(broker.bootstrap) as conn:
        assert _fetch(conn, group, topic_name, True, 1) == (ErrorCode.none, 11)


def test_consume_transform_produce_with_random_aborts_is_exactly_once(broker: BrokerProcess,
                                                                       topic_name: str) -> None:
    src, dst, group = topic_name + "-in", topic_name + "-out", topic_name + "-g"
    n = 1500
    create_topic(broker.bootstrap, src, partitions=2)
    create_topic(broker.bootstrap, dst, partitions=2)
    p = producer(broker.bootstrap)
    produce_all(p, src, [{"value": b"%d" % i, "partition": i % 2} for i in range(n)])
    rng = random.Random(29)
    c = Consumer(rdkafka_conf(broker.bootstrap, **{
        "group.id": group, "enable.auto.commit": False, "auto.offset.reset": "earliest",
        "isolation.level": "read_committed", "fetch.wait.max.ms": 100}))
    tp = Producer(rdkafka_conf(broker.bootstrap, **{"transactional.id": "tx-ctp", "linger.ms": 5}))
    tp.init_transactions(15)
    c.subscribe([src])
    done = 0
    aborts = 0
    deadline = time.monotonic() + 120
    try:
        while done < n:
            assert time.monotonic() < deadline, f"only {done} of {n} inputs committed"
            msgs = [m for m in c.consume(100, 1.0) if m.error() is None]
            if not msgs:
                continue
            tp.begin_transaction()
            for m in msgs:
                tp.produce(dst, b"out-" + m.value(), partition=m.partition())
            tp.send_offsets_to_transaction(c.position(c.assignment()), c.consumer_group_metadata(), 15)
            if rng.random() < 0.3:
                tp.abort_transaction(15)
                aborts += 1
                # start again from the committed offsets: the aborted transaction's offsets are gone
                committed = c.committed(c.assignment(), 15)
                for t in committed:
                    c.seek(TopicPartition(t.topic, t.partition, t.offset if t.offset >= 0 else 0))
            else:
                tp.commit_transaction(15)
                done += len(msgs)
    finally:
        c.close()
    assert aborts > 0
    out = Consumer(rdkafka_conf(broker.bootstrap, **{
        "group.id": group + "-check", "auto.offset.reset": "earliest", "isolation.level": "read_committed",
        "enable.auto.commit": False}))
    try:
        out.assign([TopicPartition(dst, 0, 0), TopicPartition(dst, 1, 0)])
        got: list[bytes] = []
        end = time.monotonic() + 60
        while len(got) < n and time.monotonic() < end:
            got += [m.value() for m in out.consume(500, 0.5) if m.error() is None]
        got += [m.value() for m in out.consume(500, 1.5) if m.error() is None]  # nothing more may come
    finally:
        out.close()
    assert sorted(got) == sorted(b"out-%d" % i for i in range(n))


def _ctp_round(bootstrap: str, src: str, dst: str, group: str, stop_after: int | None,
               leave_open: bool = False) -> tuple[int, Producer | None]:
    """One instance of the pipeline: consume from the committed offsets, transform, commit
    each poll's records in one transaction; stop after ``stop_after`` inputs (None: when
    the input is drained). ``leave_open``: end with a transaction left open (a crash of the
    application). Returns (inputs committed, the producer if its transaction is open)."""
    c = Consumer(rdkafka_conf(bootstrap, **{
        "group.id": group, "enable.auto.commit": False, "auto.offset.reset": "earliest",
        "isolation.level": "read_committed", "fetch.wait.max.ms": 100}))
    tp = Producer(rdkafka_conf(bootstrap, **{"transactional.id": "tx-crash", "linger.ms": 5}))
    tp.init_transactions(30)
    c.subscribe([src])
    done = 0
    idle_since = time.monotonic()
    try:
        while stop_after is None or done < stop_after:
            msgs = [m for m in c.consume(100, 1.0) if m.error() is None]
            if not msgs:
                if stop_after is None and time.monotonic() - idle_since > 5:
                    break
                continue
            idle_since = time.monotonic()
            tp.begin_transaction()
            for m in msgs:
                tp.produce(dst, b"out-" + m.value(), partition=m.partition())
            tp.send_offsets_to_transaction(c.position(c.assignment()), c.consumer_group_metadata(), 15)
            tp.commit_transaction(15)
            done += len(msgs)
        if leave_open:
            msgs = [m for m in c.consume(100, 5.0) if m.error() is None]
            tp.begin_transaction()
            for m in msgs:
                tp.produce(dst, b"out-" + m.value(), partition=m.partition())
            tp.send_offsets_to_transaction(c.position(c.assignment()), c.consumer_group_metadata(), 15)
            tp.flush(15)
            return done, tp
        return done, None
    finally:
        c.close()


def test_consume_transform_produce_survives_a_broker_kill(start_broker, topic_name: str) -> None:
    """A pipeline commits part of the input, then leaves a transaction open (records and
    offsets written) when the broker is killed (-9). After the restart a new instance of
    the pipeline fences the old one, whose open transaction is aborted, and goes on from
    the committed offsets: a read_committed reader of the output sees every input once."""
    b = start_broker()
    src, dst, group = topic_name + "-in", topic_name + "-out", topic_name + "-g"
    n = 1000
    create_topic(b.bootstrap, src, partitions=2)
    create_topic(b.bootstrap, dst, partitions=2)
    produce_all(producer(b.bootstrap), src, [{"value": b"%d" % i, "partition": i % 2} for i in range(n)])
    first, zombie = _ctp_round(b.bootstrap, src, dst, group, stop_after=300, leave_open=True)
    assert first >= 300 and zombie is not None
    b.restart(crash=True)
    rest, _ = _ctp_round(b.bootstrap, src, dst, group, stop_after=None)
    assert first + rest == n
    out = Consumer(rdkafka_conf(b.bootstrap, **{
        "group.id": group + "-check", "auto.offset.reset": "earliest", "isolation.level": "read_committed",
        "enable.auto.commit": False}))
    try:
        out.assign([TopicPartition(dst, 0, 0), TopicPartition(dst, 1, 0)])
        got: list[bytes] = []
        end = time.monotonic() + 60
        while len(got) < n and time.monotonic() < end:
            got += [m.value() for m in out.consume(500, 0.5) if m.error() is None]
        got += [m.value() for m in out.consume(500, 1.5) if m.error() is None]
    finally:
        out.close()
    assert sorted(got) == sorted(b"out-%d" % i for i in range(n))
    zombie.purge()
