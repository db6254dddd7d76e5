"""The authorizer and transactions: what a transactional producer and the transaction
admin APIs need, on a SASL listener with several users (one broker for the module).

alice may WRITE on her transactional id ``tx-alice`` (given with ``shoal acls
--transactional-id``) and on the topic, and READ the topic and the group ``g-ok``; bob may
only WRITE on the topic; carol may only DESCRIBE ``tx-alice``; admin is a super user.
confluent-kafka's transactional producer shows the refusals a client sees; the other
checks are raw requests of authenticated connections (tests/support/wire.py).
"""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AclOperation, NewTopic, ResourceType
from kio.schema.add_offsets_to_txn.v3 import request as addoff3
from kio.schema.add_partitions_to_txn.v3 import request as add3
from kio.schema.add_partitions_to_txn.v4 import request as add4
from kio.schema.add_partitions_to_txn.v5 import request as add5
from kio.schema.describe_producers.v0 import request as dprod0
from kio.schema.describe_transactions.v0 import request as dtxn0
from kio.schema.end_txn.v3 import request as end3
from kio.schema.errors import ErrorCode
from kio.schema.init_producer_id.v4 import request as init4
from kio.schema.list_transactions.v0 import request as list0
from kio.schema.produce.v9 import request as produce9
from kio.schema.txn_offset_commit.v3 import request as tcommit3
from kio.schema.write_txn_markers.v1 import request as markers1

from shoal.protocol.batch import build_batch
from tests.integration.test_acls import SETTINGS, _acl, _as, _create, _raw
from tests.support.broker import BrokerProcess
from tests.support.clients import admin_client, consume_exact, rdkafka_conf
from tests.support.wire import RawConnection

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

TOPIC, SECRET = "txn-orders", "txn-secret"


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    tmp = tmp_path_factory.mktemp("txnacl")
    b = BrokerProcess(tmp / "data", dict(SETTINGS))
    b.start()
    try:
        admin = admin_client(b.bootstrap, **_as("admin"))
        for t in (TOPIC, SECRET):
            admin.create_topics([NewTopic(t, 1, 1)], operation_timeout=15)[t].result(timeout=20)
        _create(admin, [_acl(ResourceType.TOPIC, TOPIC, "User:alice", AclOperation.WRITE),
                        _acl(ResourceType.TOPIC, TOPIC, "User:alice", AclOperation.READ),
                        _acl(ResourceType.GROUP, "g-ok", "User:alice", AclOperation.READ),
                        _acl(ResourceType.TOPIC, TOPIC, "User:bob", AclOperation.WRITE),
                        _acl(ResourceType.TRANSACTIONAL_ID, "tx-alice", "User:carol", AclOperation.DESCRIBE)])
        yield b
    finally:
        b.stop()


def _txn_producer(b: BrokerProcess, user: str, txn_id: str) -> Producer:
    return Producer(rdkafka_conf(b.bootstrap, **_as(user), **{"transactional.id": txn_id, "linger.ms": 5}))


def _grant_with_the_tool(b: BrokerProcess, tmp_path: Path) -> None:
    cfg = tmp_path / "admin.properties"
    cfg.write_text("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\nsasl.username=admin\n"
                   "sasl.password=admin-secret\n")
    r = subprocess.run([sys.executable, "-m", "shoal", "acls", "--bootstrap-server", b.bootstrap, "--command-config",
                        str(cfg), "--add", "--allow-principal", "User:alice", "--operation", "Write",
                        "--transactional-id", "tx-alice"], check=False, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "resourceType=TRANSACTIONAL_ID, name=tx-alice" in r.stdout, r.stdout


def test_a_transactional_producer_needs_write_on_its_transactional_id(secured: BrokerProcess,
                                                                      tmp_path: Path) -> None:
    b = secured
    # without WRITE on the transactional id: init_transactions is refused
    p = _txn_producer(b, "alice", "tx-alice")
    with pytest.raises(KafkaException) as e:
        p.init_transactions(20)
    assert e.value.args[0].code() == ErrorCode.transactional_id_authorization_failed
    del p

    _grant_with_the_tool(b, tmp_path)
    p = _txn_producer(b, "alice", "tx-alice")
    p.init_transactions(30)
    p.begin_transaction()
    for i in range(3):
        p.produce(TOPIC, b"t%d" % i, partition=0)
    p.commit_transaction(30)

    # offsets sent to a group alice may not READ: the transaction cannot take them
    c = Consumer(rdkafka_conf(b.bootstrap, **_as("alice"), **{"group.id": "g-denied"}))
    try:
        p.begin_transaction()
        p.produce(TOPIC, b"aborted", partition=0)
        with pytest.raises(KafkaException) as e:
            p.send_offsets_to_transaction([TopicPartition(TOPIC, 0, 3)], c.consumer_group_metadata(), 20)
        assert e.value.args[0].code() == ErrorCode.group_authorization_failed
        p.abort_transaction(30)
    finally:
        c.close()

    reader = Consumer(rdkafka_conf(b.bootstrap, **_as("admin"), **{
        "group.id": "reader", "isolation.level": "read_committed", "auto.offset.reset": "earliest",
        "enable.auto.commit": False}))
    try:
        reader.assign([TopicPartition(TOPIC, 0, 0)])
        assert [m.value for m in consume_exact(reader, 3, timeout_s=60)] == [b"t0", b"t1", b"t2"]
    finally:
        reader.close()
    b.assert_alive()


def _init(conn: RawConnection, txn_id: str) -> tuple[int, int, int]:
    r = conn.request(init4.InitProducerIdRequest(transactional_id=txn_id, transaction_timeout=datetime.timedelta(
        seconds=60), producer_id=-1, producer_epoch=-1))
    return int(r.error_code), int(r.producer_id), int(r.producer_epoch)


def _add_partitions(conn: RawConnection, pid: int, epoch: int, topics: tuple[str, ...]) -> dict[str, int]:
    r = conn.request(add3.AddPartitionsToTxnRequest(
        v3_and_below_transactional_id="tx-wire", v3_and_below_producer_id=pid, v3_and_below_producer_epoch=epoch,
        v3_and_below_topics=tuple(add3.AddPartitionsToTxnTopic(name=t, partitions=(0,)) for t in topics)))
    return {t.name: int(t.results_by_partition[0].partition_error_code) for t in r.results_by_topic_v3_and_below}


def _add_offsets(conn: RawConnection, pid: int, epoch: int, group: str) -> int:
    return int(conn.request(addoff3.AddOffsetsToTxnRequest(transactional_id="tx-wire", producer_id=pid,
                                                           producer_epoch=epoch, group_id=group)).error_code)


def _txn_offset_commit(conn: RawConnection, pid: int, epoch: int, group: str) -> dict[str, int]:
    r = conn.request(tcommit3.TxnOffsetCommitRequest(
        transactional_id="tx-wire", group_id=group, producer_id=pid, producer_epoch=epoch, topics=tuple(
            tcommit3.TxnOffsetCommitRequestTopic(name=t, partitions=(tcommit3.TxnOffsetCommitRequestPartition(
                partition_index=0, committed_offset=1, committed_leader_epoch=-1, committed_metadata=""),))
            for t in (TOPIC, SECRET))))
    return {t.name: int(t.partitions[0].error_code) for t in r.topics}


def _end(conn: RawConnection, pid: int, epoch: int, commit: bool) -> int:
    return int(conn.request(end3.EndTxnRequest(transactional_id="tx-wire", producer_id=pid, producer_epoch=epoch,
                                               committed=commit)).error_code)


def _produce(conn: RawConnection, pid: int, epoch: int) -> int:
    data = build_batch([(None, b"v", (), int(time.time() * 1000))], producer_id=pid, producer_epoch=epoch,
                       base_sequence=0, transactional=True)
    r = conn.request(produce9.ProduceRequest(
        transactional_id="tx-wire", acks=-1, timeout=datetime.timedelta(seconds=5),
        topic_data=(produce9.TopicProduceData(name=TOPIC, partition_data=(
            produce9.PartitionProduceData(index=0, records=data),)),)))
    return int(r.responses[0].partition_responses[0].error_code)


def _describe(conn: RawConnection) -> Any:
    return conn.request(dtxn0.DescribeTransactionsRequest(transactional_ids=("tx-wire",))).transaction_states[0]


def _listed(conn: RawConnection) -> set[str]:
    r = conn.request(list0.ListTransactionsRequest(state_filters=(), producer_id_filters=()))
    return {t.transactional_id for t in r.transaction_states}


def test_the_transaction_apis_check_kafkas_acls(secured: BrokerProcess) -> None:
    b = secured
    admin = admin_client(b.bootstrap, **_as("admin"))
    _create(admin, [_acl(ResourceType.TRANSACTIONAL_ID, "tx-wire", "User:alice", AclOperation.WRITE),
                    _acl(ResourceType.TRANSACTIONAL_ID, "tx-wire", "User:carol", AclOperation.DESCRIBE)])
    denied = ErrorCode.transactional_id_authorization_failed
    with _raw(b.bootstrap, "alice") as alice, _raw(b.bootstrap, "bob") as bob, \
            _raw(b.bootstrap, "carol") as carol, _raw(b.bootstrap, "admin") as root:
        assert _init(bob, "tx-wire")[0] == denied
        code, pid, epoch = _init(alice, "tx-wire")
        assert code == ErrorCode.none

        # AddPartitionsToTxn: WRITE on the transactional id, then on each topic (none is added
        # while one is refused); an internal topic is refused too
        assert _add_partitions(bob, pid, epoch, (TOPIC,)) == {TOPIC: denied}
        assert _add_partitions(alice, pid, epoch, (TOPIC, SECRET)) == {
            TOPIC: ErrorCode.operation_not_attempted, SECRET: ErrorCode.topic_authorization_failed}
        assert _add_partitions(alice, pid, epoch, (TOPIC, "__consumer_offsets")) == {
            TOPIC: ErrorCode.operation_not_attempted, "__consumer_offsets": ErrorCode.topic_authorization_failed}
        assert _add_partitions(alice, pid, epoch, (TOPIC,)) == {TOPIC: ErrorCode.none}
        assert [t.topic for t in _describe(root).topics] == [TOPIC]

        # Produce of a transactional batch: WRITE on the transactional id (bob may write the topic)
        assert _produce(bob, pid, epoch) == denied
        assert _produce(alice, pid, epoch) == ErrorCode.none

        # AddOffsetsToTxn: WRITE on the transactional id, READ on the group
        assert _add_offsets(bob, pid, epoch, "g-ok") == denied
        assert _add_offsets(alice, pid, epoch, "g-denied") == ErrorCode.group_authorization_failed
        assert _add_offsets(alice, pid, epoch, "g-ok") == ErrorCode.none

        # TxnOffsetCommit: WRITE on the transactional id, READ on the group, READ on each topic
        assert _txn_offset_commit(bob, pid, epoch, "g-ok") == {TOPIC: denied, SECRET: denied}
        assert _txn_offset_commit(alice, pid, epoch, "g-denied") == {
            TOPIC: ErrorCode.group_authorization_failed, SECRET: ErrorCode.group_authorization_failed}
        assert _txn_offset_commit(alice, pid, epoch, "g-ok") == {
            TOPIC: ErrorCode.none, SECRET: ErrorCode.topic_authorization_failed}

        # DescribeTransactions: DESCRIBE on the transactional id; topics the principal may not
        # DESCRIBE are left out. ListTransactions: only the ids the principal may DESCRIBE
        assert _describe(bob).error_code == denied
        st = _describe(carol)
        assert st.error_code == ErrorCode.none and st.transaction_state == "Ongoing" and st.topics == ()
        st = _describe(alice)
        assert st.error_code == ErrorCode.none and {t.topic for t in st.topics} == {TOPIC}
        assert {t.topic for t in _describe(root).topics} == {TOPIC, "__consumer_offsets"}
        assert _listed(bob) == set()
        assert "tx-wire" in _listed(carol)
        assert "tx-wire" in _listed(alice)  # WRITE implies DESCRIBE
        assert "tx-wire" in _listed(root)

        # DescribeProducers: READ on the topic
        r = bob.request(dprod0.DescribeProducersRequest(topics=(dprod0.TopicRequest(name=TOPIC,
                                                                                    partition_indexes=(0,)),)))
        assert r.topics[0].partitions[0].error_code == ErrorCode.topic_authorization_failed
        r = alice.request(dprod0.DescribeProducersRequest(topics=(dprod0.TopicRequest(name=TOPIC,
                                                                                      partition_indexes=(0,)),)))
        assert r.topics[0].partitions[0].error_code == ErrorCode.none
        assert pid in [int(s.producer_id) for s in r.topics[0].partitions[0].active_producers]

        # WriteTxnMarkers: CLUSTER_ACTION on the cluster (the brokers' own request)
        markers = markers1.WriteTxnMarkersRequest(markers=(markers1.WritableTxnMarker(
            producer_id=pid, producer_epoch=epoch, transaction_result=False, coordinator_epoch=0,
            topics=(markers1.WritableTxnMarkerTopic(name=TOPIC, partition_indexes=(0,)),)),))
        r = alice.request(markers)
        assert r.markers[0].topics[0].partitions[0].error_code == ErrorCode.cluster_authorization_failed
        assert _describe(root).transaction_state == "Ongoing"

        # AddPartitionsToTxn v4+, a partition leader's question to the coordinator (KIP-890):
        # CLUSTER_ACTION on the cluster, a top-level CLUSTER_AUTHORIZATION_FAILED otherwise
        def verify(conn: RawConnection, module: Any, topic: str) -> tuple[int, dict[tuple[str, int], int]]:
            r = conn.request(module.AddPartitionsToTxnRequest(transactions=(module.AddPartitionsToTxnTransaction(
                transactional_id="tx-wire", producer_id=pid, producer_epoch=epoch, verify_only=True,
                topics=(module.AddPartitionsToTxnTopic(name=topic, partitions=(0,)),)),)))
            return int(r.error_code), {(t.name, int(x.partition_index)): int(x.partition_error_code)
                                       for res in r.results_by_transaction for t in res.topic_results
                                       for x in t.results_by_partition}

        assert verify(alice, add5, TOPIC) == (ErrorCode.cluster_authorization_failed, {})
        assert verify(root, add5, TOPIC) == (ErrorCode.none, {(TOPIC, 0): ErrorCode.none})
        # a partition the transaction does not hold: TRANSACTION_ABORTABLE from v5
        assert verify(root, add5, SECRET) == (ErrorCode.none, {(SECRET, 0): ErrorCode.transaction_abortable})
        assert verify(root, add4, SECRET) == (ErrorCode.none, {(SECRET, 0): ErrorCode.invalid_txn_state})
        assert [t.topic for t in _describe(root).topics if t.topic == SECRET] == []  # only asked, not added

        # EndTxn: WRITE on the transactional id
        assert _end(bob, pid, epoch, False) == denied
        assert _describe(root).transaction_state == "Ongoing"
        assert _end(alice, pid, epoch, True) == ErrorCode.none
    b.assert_alive()


def test_shoal_acls_refuses_an_operation_a_transactional_id_does_not_take(secured: BrokerProcess,
                                                                         tmp_path: Path) -> None:
    b = secured
    cfg = tmp_path / "admin.properties"
    cfg.write_text("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\nsasl.username=admin\n"
                   "sasl.password=admin-secret\n")
    common = [sys.executable, "-m", "shoal", "acls", "--bootstrap-server", b.bootstrap, "--command-config", str(cfg)]

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*common, *args], check=False, capture_output=True, text=True, timeout=120)

    # as kafka-acls.sh: a transactional id takes Write, Describe and All only
    r = run("--add", "--allow-principal", "User:bob", "--operation", "Read", "--operation", "Write",
            "--transactional-id", "tx-tool")
    assert r.returncode != 0
    assert "ResourceType TRANSACTIONAL_ID only supports operations DESCRIBE, WRITE, ALL" in r.stderr, r.stderr
    r = run("--remove", "--force", "--allow-principal", "User:bob", "--operation", "Read", "--transactional-id",
            "tx-tool")
    assert r.returncode != 0 and "only supports operations" in r.stderr, r.stderr
    r = run("--list", "--transactional-id", "tx-tool", "--output", "json")
    assert r.returncode == 0 and json.loads(r.stdout)["acls"] == [], r.stdout + r.stderr
    r = run("--add", "--allow-principal", "User:bob", "--operation", "Describe", "--operation", "All",
            "--transactional-id", "tx-tool")
    assert r.returncode == 0, r.stderr
    r = run("--list", "--transactional-id", "tx-tool", "--output", "json")
    assert sorted(a["operation"] for a in json.loads(r.stdout)["acls"]) == ["ALL", "DESCRIBE"]
    # a topic still takes Read
    r = run("--add", "--allow-principal", "User:bob", "--operation", "Read", "--topic", "tx-tool-topic")
    assert r.returncode == 0, r.stderr


def test_shoal_acls_producer_and_consumer_shortcuts(secured: BrokerProcess, tmp_path: Path) -> None:
    b = secured
    cfg = tmp_path / "admin.properties"
    cfg.write_text("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\nsasl.username=admin\n"
                   "sasl.password=admin-secret\n")
    common = [sys.executable, "-m", "shoal", "acls", "--bootstrap-server", b.bootstrap, "--command-config", str(cfg)]

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*common, *args], check=False, capture_output=True, text=True, timeout=120)

    def acls_of(principal: str) -> set[tuple[str, str, str, str]]:
        r = run("--list", "--principal", principal, "--output", "json")
        assert r.returncode == 0, r.stderr
        return {(a["resource_type"], a["name"], a["pattern_type"], a["operation"]) for a in json.loads(r.stdout)["acls"]}

    # kafka-acls.sh's shortcuts, and its refusals
    for bad in (("--producer", "--transactional-id", "tx-dave"),  # no topic
                ("--consumer", "--topic", "dave-in"),  # no group
                ("--consumer", "--topic", "dave-in", "--group", "g", "--transactional-id", "tx-dave"),
                ("--idempotent", "--topic", "dave-in"),
                ("--producer", "--topic", "dave-out", "--operation", "Read")):
        r = run("--add", "--allow-principal", "User:dave", *bad)
        assert r.returncode != 0 and r.stderr.strip(), bad
    assert acls_of("User:dave") == set()
    r = run("--add", "--allow-principal", "User:dave", "--producer", "--idempotent", "--topic", "dave-",
            "--transactional-id", "tx-dave-", "--resource-pattern-type", "prefixed")
    assert r.returncode == 0, r.stderr
    r = run("--add", "--allow-principal", "User:dave", "--consumer", "--topic", "dave-in", "--group", "dave-g")
    assert r.returncode == 0, r.stderr
    assert acls_of("User:dave") == {
        ("TOPIC", "dave-", "PREFIXED", "WRITE"), ("TOPIC", "dave-", "PREFIXED", "DESCRIBE"),
        ("TOPIC", "dave-", "PREFIXED", "CREATE"), ("TRANSACTIONAL_ID", "tx-dave-", "PREFIXED", "WRITE"),
        ("TRANSACTIONAL_ID", "tx-dave-", "PREFIXED", "DESCRIBE"), ("CLUSTER", "kafka-cluster", "LITERAL",
                                                                  "IDEMPOTENT_WRITE"),
        ("TOPIC", "dave-in", "LITERAL", "READ"), ("TOPIC", "dave-in", "LITERAL", "DESCRIBE"),
        ("GROUP", "dave-g", "LITERAL", "READ")}
    r = run("--remove", "--force", "--allow-principal", "User:dave", "--consumer", "--topic", "dave-in", "--group",
            "dave-g")
    assert r.returncode == 0 and "Removed 3 ACL(s)." in r.stdout, r.stdout + r.stderr
    assert len(acls_of("User:dave")) == 6
