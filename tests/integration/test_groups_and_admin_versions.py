"""Group, share-group, security and transaction-admin APIs at every version they are served in.

Each request is sent raw at each version the broker advertises; the answer must decode
exactly with kio's reader for that version (``RawConnection``) and say the same thing at
every version, fields a version lacks aside.
"""

from __future__ import annotations

import datetime
import time

import pytest
from kio.index import load_request_schema
from kio.schema.errors import ErrorCode

from shoal.protocol.batch import build_batch
from shoal.protocol.entities import make, sub
from tests.support.wire import RawConnection

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

MS = datetime.timedelta(milliseconds=1)


def req(api_key: int, version: int, /, **fields: object) -> object:
    return make(load_request_schema(api_key, version), **fields)


def nested(api_key: int, version: int, entity: str, /, **fields: object) -> object:
    return make(sub(load_request_schema(api_key, version), entity), **fields)


def create_topic(conn: RawConnection, name: str, partitions: int) -> None:
    resp = conn.request(req(19, 4, topics=(nested(19, 4, "CreatableTopic", name=name, num_partitions=partitions,
                                                  replication_factor=1),),
                            timeout=datetime.timedelta(seconds=10)))
    assert resp.topics[0].error_code == ErrorCode.none


def topic_id(conn: RawConnection, name: str) -> object:
    resp = conn.request(req(3, 12, topics=(nested(3, 12, "MetadataRequestTopic", name=name),)))
    return resp.topics[0].topic_id


def produce(conn: RawConnection, topic: str, partition: int, values: list[bytes]) -> int:
    batch = build_batch([(b"k", v, [], 1_700_000_000_000 + i) for i, v in enumerate(values)])
    resp = conn.request(req(0, 9, acks=-1, timeout=datetime.timedelta(seconds=5), topic_data=(
        nested(0, 9, "TopicProduceData", name=topic, partition_data=(
            nested(0, 9, "PartitionProduceData", index=partition, records=batch),)),)))
    p = resp.responses[0].partition_responses[0]
    assert p.error_code == ErrorCode.none
    return int(p.base_offset)


def test_describe_transactions_before_any_transaction_answers_not_coordinator(start_broker):
    """Before ``__transaction_state`` exists this broker coordinates no transactional id:
    NOT_COORDINATOR for each, as Kafka's broker answers for a partition it does not own, and
    the connection serves on."""
    b = start_broker()
    with RawConnection(b.bootstrap) as conn:
        resp = conn.request(req(65, 0, transactional_ids=("a", "b")))
        assert [(s.transactional_id, s.error_code) for s in resp.transaction_states] == [
            ("a", ErrorCode.not_coordinator), ("b", ErrorCode.not_coordinator)]
        assert all((s.producer_id, s.producer_epoch, s.topics) == (-1, -1, ()) for s in resp.transaction_states)
        listed = conn.request(req(66, 0, state_filters=(), producer_id_filters=()))
        assert (listed.error_code, listed.transaction_states) == (ErrorCode.none, ())
    b.assert_alive()


def test_acls_without_an_authorizer_every_version(shared_broker):
    disabled = (ErrorCode.security_disabled, "No Authorizer is configured.")
    with RawConnection(shared_broker.bootstrap) as conn:
        for v in (1, 2, 3):
            d = conn.request(req(29, v, resource_type_filter=1, pattern_type_filter=1, operation=1,
                                 permission_type=1))
            assert ((d.error_code, d.error_message), d.resources) == (disabled, ())
            c = conn.request(req(30, v, creations=(nested(
                30, v, "AclCreation", resource_type=2, resource_name="x", resource_pattern_type=3,
                principal="User:a", host="*", operation=3, permission_type=3),)))
            assert [(r.error_code, r.error_message) for r in c.results] == [disabled]
            r = conn.request(req(31, v, filters=(nested(
                31, v, "DeleteAclsFilter", resource_type_filter=1, pattern_type_filter=1, operation=1,
                permission_type=1),) * 2))
            assert [(f.error_code, f.error_message, f.matching_acls) for f in r.filter_results] == [
                (*disabled, ())] * 2


def test_client_quotas_every_version(shared_broker):
    with RawConnection(shared_broker.bootstrap) as conn:
        for v in (0, 1):
            user = f"versions-user-{v}"
            alter = conn.request(req(49, v, entries=(
                nested(49, v, "EntryData", entity=(nested(49, v, "EntityData", entity_type="user", entity_name=user),),
                       ops=(nested(49, v, "OpData", key="producer_byte_rate", value=1024.0),)),
                nested(49, v, "EntryData", entity=(nested(49, v, "EntityData", entity_type="bogus", entity_name="u"),),
                       ops=(nested(49, v, "OpData", key="producer_byte_rate", value=1024.0),)),
            )))
            assert [(e.error_code, [(x.entity_type, x.entity_name) for x in e.entity]) for e in alter.entries] == [
                (ErrorCode.none, [("user", user)]), (ErrorCode.invalid_request, [("bogus", "u")])]
            assert alter.entries[0].error_message is None
            found = conn.request(req(48, v, components=(
                nested(48, v, "ComponentData", entity_type="user", match_type=0, match=user),), strict=True))
            assert (found.error_code, found.error_message) == (ErrorCode.none, None)
            assert [([(x.entity_type, x.entity_name) for x in e.entity], [(q.key, q.value) for q in e.values])
                    for e in found.entries] == [([("user", user)], [("producer_byte_rate", 1024.0)])]
            refused = conn.request(req(48, v, components=(
                nested(48, v, "ComponentData", entity_type="nope", match_type=2),)))
            assert (refused.error_code, refused.error_message, refused.entries) == (
                ErrorCode.unsupported_version, "Unsupported entity type nope", None)


def test_scram_credentials_answers(shared_broker):
    with RawConnection(shared_broker.bootstrap) as conn:
        altered = conn.request(req(51, 0, deletions=(
            nested(51, 0, "ScramCredentialDeletion", name="versions-nobody", mechanism=1),), upsertions=(
            nested(51, 0, "ScramCredentialUpsertion", name="versions-alice", mechanism=1, iterations=4096,
                   salt=b"salt", salted_password=b"x" * 32),
            nested(51, 0, "ScramCredentialUpsertion", name="versions-bob", mechanism=1, iterations=10,
                   salt=b"salt", salted_password=b"x" * 32))))
        assert [(r.user, r.error_code) for r in altered.results] == [
            ("versions-nobody", ErrorCode.resource_not_found), ("versions-alice", ErrorCode.none),
            ("versions-bob", ErrorCode.unacceptable_credential)]
        described = conn.request(req(50, 0, users=tuple(
            nested(50, 0, "UserName", name=n) for n in ("versions-alice", "versions-zed", "versions-zed"))))
        assert (described.error_code, described.error_message) == (ErrorCode.none, None)
        assert [(r.user, r.error_code, [(c.mechanism, c.iterations) for c in r.credential_infos])
                for r in described.results] == [
            ("versions-alice", ErrorCode.none, [(1, 4096)]),
            ("versions-zed", ErrorCode.duplicate_resource, [])]


def test_transaction_admin_every_version(shared_broker, topic_name):
    with RawConnection(shared_broker.bootstrap) as conn:
        create_topic(conn, topic_name, 1)
        produce(conn, topic_name, 0, [b"a"])
        producers = conn.request(req(61, 0, topics=(
            nested(61, 0, "TopicRequest", name=topic_name, partition_indexes=(0, 5)),
            nested(61, 0, "TopicRequest", name="versions-missing", partition_indexes=(0,)))))
        assert [(t.name, [(p.partition_index, p.error_code, p.active_producers) for p in t.partitions])
                for t in producers.topics] == [
            (topic_name, [(0, ErrorCode.none, ()), (5, ErrorCode.unknown_topic_or_partition, ())]),
            ("versions-missing", [(0, ErrorCode.unknown_topic_or_partition, ())])]
        for v in (0, 1, 2):
            listed = conn.request(req(66, v, state_filters=("Ongoing", "Weird")))
            assert (listed.error_code, listed.unknown_state_filters, listed.transaction_states) == (
                ErrorCode.none, ("Weird",), ())
        for v in (1, 2):
            markers = conn.request(req(27, v, markers=(nested(
                27, v, "WritableTxnMarker", producer_id=77, producer_epoch=0, transaction_result=False,
                coordinator_epoch=0, topics=(nested(27, v, "WritableTxnMarkerTopic", name="versions-missing",
                                                    partition_indexes=(0, 1)),)),)))
            assert [(m.producer_id, [(t.name, [(p.partition_index, p.error_code) for p in t.partitions])
                                     for t in m.topics]) for m in markers.markers] == [
                (77, [("versions-missing", [(0, ErrorCode.unknown_topic_or_partition),
                                            (1, ErrorCode.unknown_topic_or_partition)])])]


def test_sasl_on_a_plain_listener_every_version(shared_broker):
    for v in (0, 1):
        with RawConnection(shared_broker.bootstrap) as conn:
            h = conn.request(req(17, v, mechanism="PLAIN"))
            assert (h.error_code, h.mechanisms) == (ErrorCode.illegal_sasl_state, ())
    for v in (0, 1, 2):
        with RawConnection(shared_broker.bootstrap) as conn:
            a = conn.request(req(36, v, auth_bytes=b"\x00a\x00b"))
            assert (a.error_code, a.error_message, a.auth_bytes) == (
                ErrorCode.illegal_sasl_state, "SaslAuthenticate is not expected now", b"")
            if v >= 1:
                assert a.session_lifetime == datetime.timedelta(0)


def test_group_admin_every_version(shared_broker, topic_name):
    group = f"{topic_name}-g"
    with RawConnection(shared_broker.bootstrap) as conn:
        create_topic(conn, topic_name, 2)
        commit = conn.request(req(8, 8, group_id=group, generation_id_or_member_epoch=-1, topics=(
            nested(8, 8, "OffsetCommitRequestTopic", name=topic_name, partitions=(
                nested(8, 8, "OffsetCommitRequestPartition", partition_index=0, committed_offset=1,
                       committed_leader_epoch=-1),)),)))
        assert commit.topics[0].partitions[0].error_code == ErrorCode.none
        for v in range(6):
            d = conn.request(req(15, v, groups=(group, f"{group}-none")))
            assert [(g.group_id, g.error_code, g.group_state, g.protocol_type, g.members) for g in d.groups] == [
                (group, ErrorCode.none, "Empty", "", ()), (f"{group}-none", ErrorCode.none, "Dead", "", ())]
        for v in range(6):
            listed = {g.group_id: g for g in conn.request(req(16, v)).groups}
            assert listed[group].protocol_type == ""
            if v >= 4:
                assert listed[group].group_state == "Empty"
            if v >= 5:
                assert listed[group].group_type == "classic"
        for v in range(3):
            gone = conn.request(req(42, v, groups_names=(f"{group}-none{v}",)))
            assert [(r.group_id, r.error_code) for r in gone.results] == [
                (f"{group}-none{v}", ErrorCode.group_id_not_found)]
        emptied = conn.request(req(42, 2, groups_names=(group,)))  # a group of offsets only
        assert [(r.group_id, r.error_code) for r in emptied.results] == [(group, ErrorCode.none)]
        assert conn.request(req(15, 5, groups=(group,))).groups[0].group_state == "Dead"
        for v in (0, 1):
            member = f"versions-member-{v}-0123456789"
            hb = conn.request(req(68, v, group_id=f"{group}-c{v}", member_id=member, member_epoch=5,
                                  rebalance_timeout=30_000 * MS, subscribed_topic_names=(topic_name,)))
            assert (hb.error_code, hb.member_id, hb.member_epoch, hb.assignment) == (
                ErrorCode.unknown_member_id, None, 0, None)
            joined = conn.request(req(68, v, group_id=f"{group}-c{v}", member_id=member, member_epoch=0,
                                      rebalance_timeout=30_000 * MS, subscribed_topic_names=(topic_name,),
                                      topic_partitions=()))
            assert (joined.error_code, joined.member_id, joined.member_epoch) == (ErrorCode.none, member, 1)
            assert joined.heartbeat_interval == datetime.timedelta(seconds=5)
            assert [sorted(t.partitions) for t in joined.assignment.topic_partitions] == [[0, 1]]
            described = conn.request(req(69, v, group_ids=(f"{group}-c{v}",)))
            (g,) = described.groups
            assert (g.error_code, g.group_state, [m.member_id for m in g.members]) == (
                ErrorCode.none, "Stable", [member])


def test_classic_group_errors_every_version(shared_broker):
    with RawConnection(shared_broker.bootstrap) as conn:
        for v in range(10):
            j = conn.request(req(11, v, group_id="versions-jg", session_timeout=MS, rebalance_timeout=MS,
                                 protocol_type="consumer", protocols=(
                                     nested(11, v, "JoinGroupRequestProtocol", name="range", metadata=b""),)))
            assert (j.error_code, j.generation_id, j.leader, j.member_id, j.members) == (
                ErrorCode.invalid_session_timeout, -1, "", "", ())
            assert j.protocol_name == ("" if v < 7 else None)
        for v in range(6):
            s = conn.request(req(14, v, group_id="versions-jg", generation_id=1, member_id="m"))
            assert (s.error_code, s.assignment) == (ErrorCode.unknown_member_id, b"")
        for v in range(5):
            h = conn.request(req(12, v, group_id="versions-jg", generation_id=1, member_id="m"))
            assert h.error_code == ErrorCode.unknown_member_id
        for v in range(6):
            fields: dict[str, object] = {"group_id": "versions-jg", "member_id": "m"}
            if v >= 3:
                fields["members"] = (nested(13, v, "MemberIdentity", member_id="m"),)
            left = conn.request(req(13, v, **fields))
            if v < 3:
                assert left.error_code == ErrorCode.unknown_member_id
            else:
                assert left.error_code == ErrorCode.none
                assert [(m.member_id, m.error_code) for m in left.members] == [("m", ErrorCode.unknown_member_id)]


def test_share_fetch_acknowledge_and_state_every_version(shared_broker, topic_name):
    port = int(shared_broker.bootstrap.rsplit(":", 1)[1])
    with RawConnection(shared_broker.bootstrap) as conn:
        create_topic(conn, topic_name, 2)
        tid = topic_id(conn, topic_name)
        for v in (1, 2):
            group, member = f"{topic_name}-s{v}", f"versions-share-member-{v}"
            hb = conn.request(req(76, 1, group_id=group, member_id=member, member_epoch=0,
                                  subscribed_topic_names=(topic_name,)))
            assert hb.error_code == ErrorCode.none
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:  # until both partitions are assigned (initialized)
                hb = conn.request(req(76, 1, group_id=group, member_id=member, member_epoch=hb.member_epoch))
                assigned = [p for t in (hb.assignment.topic_partitions if hb.assignment else ()) for p in t.partitions]
                if sorted(assigned) == [0, 1]:
                    break
                time.sleep(0.2)
            starts = [produce(conn, topic_name, p, [b"s0", b"s1"]) for p in (0, 1)]
            extra = {"share_acquire_mode": 0} if v >= 2 else {}
            f = conn.request(req(78, v, group_id=group, member_id=member, share_session_epoch=0, max_wait=5000 * MS,
                                 min_bytes=1, max_bytes=1 << 20, max_records=500, batch_size=500, topics=(
                                     nested(78, v, "FetchTopic", topic_id=tid, partitions=tuple(
                                         nested(78, v, "FetchPartition", partition_index=p) for p in (0, 1))),),
                                 **extra))
            assert (f.error_code, f.error_message, f.acquisition_lock_timeout) == (
                ErrorCode.none, None, datetime.timedelta(seconds=30))
            assert [(e.node_id, e.host, e.port, e.rack) for e in f.node_endpoints] == [(0, "127.0.0.1", port, None)]
            got = {}
            for t in f.responses:
                assert t.topic_id == tid
                for p in t.partitions:
                    assert (p.error_code, p.error_message, p.acknowledge_error_code) == (ErrorCode.none, None, 0)
                    assert (p.current_leader.leader_id, p.current_leader.leader_epoch) == (0, 0)
                    got[p.partition_index] = [(a.first_offset, a.last_offset, a.delivery_count)
                                              for a in p.acquired_records]
                    assert p.records  # the batches holding the acquired records
            assert got == {p: [(starts[p], starts[p] + 1, 1)] for p in (0, 1)}
            ack = conn.request(req(79, v, group_id=group, member_id=member, share_session_epoch=1, topics=(
                nested(79, v, "AcknowledgeTopic", topic_id=tid, partitions=tuple(
                    nested(79, v, "AcknowledgePartition", partition_index=p, acknowledgement_batches=(
                        nested(79, v, "AcknowledgementBatch", first_offset=starts[p], last_offset=starts[p] + 1,
                               acknowledge_types=(1,)),)) for p in (0, 1))),)))
            assert (ack.error_code, ack.error_message) == (ErrorCode.none, None)
            assert [(t.topic_id, [(p.partition_index, p.error_code, p.current_leader.leader_id)
                                  for p in t.partitions]) for t in ack.responses] == [
                (tid, [(0, ErrorCode.none, 0), (1, ErrorCode.none, 0)])]
            if v >= 2:
                assert ack.acquisition_lock_timeout == datetime.timedelta(seconds=30)
            bad = conn.request(req(79, v, group_id=group, member_id=member, share_session_epoch=9))
            assert (bad.error_code, bad.responses, bad.node_endpoints) == (
                ErrorCode.invalid_share_session_epoch, (), ())
            invalid = conn.request(req(78, v, group_id=group, member_id="", share_session_epoch=0, **extra))
            assert (invalid.error_code, invalid.error_message, invalid.responses) == (
                ErrorCode.invalid_request, "Invalid member id in the request.", ())

        # the share-state RPCs of the persister
        group = f"{topic_name}-state"

        def state(api_key: int, version: int, topic_entity: str, partitions: list[dict[str, object]]) -> object:
            r = load_request_schema(api_key, version)
            return conn.request(make(r, group_id=group, topics=(make(sub(r, topic_entity), topic_id=tid, partitions=tuple(
                make(sub(r, "PartitionData"), **p) for p in partitions)),)))

        init = state(83, 0, "InitializeStateData", [dict(partition=0, state_epoch=5, start_offset=1)])
        assert [(t.topic_id, [(p.partition, p.error_code) for p in t.partitions]) for t in init.results] == [
            (tid, [(0, ErrorCode.none)])]
        write_cls = load_request_schema(85, 1)
        write = state(85, 1, "WriteStateData", [dict(partition=0, state_epoch=5, leader_epoch=3, start_offset=2,
                                                     state_batches=(make(sub(write_cls, "StateBatch"), first_offset=2,
                                                                         last_offset=2, delivery_state=2,
                                                                         delivery_count=1),))])
        assert [p.error_code for t in write.results for p in t.partitions] == [ErrorCode.none]
        read = state(84, 0, "ReadStateData", [dict(partition=0, leader_epoch=-1)])
        (p,) = read.results[0].partitions
        assert (p.error_code, p.state_epoch, p.start_offset) == (ErrorCode.none, 5, 2)
        assert [(b.first_offset, b.last_offset, b.delivery_state, b.delivery_count) for b in p.state_batches] == [
            (2, 2, 2, 1)]
        summary = state(87, 1, "ReadStateSummaryData", [dict(partition=0, leader_epoch=-1)])
        (s,) = summary.results[0].partitions
        assert (s.error_code, s.state_epoch, s.leader_epoch, s.start_offset) == (ErrorCode.none, 5, 3, 2)
        deleted = state(86, 0, "DeleteStateData", [dict(partition=0)])
        assert [p.error_code for t in deleted.results for p in t.partitions] == [ErrorCode.none]
        assert conn.request(req(84, 0, group_id=group, topics=())).results == ()


def test_share_group_offsets_admin_every_version(shared_broker, topic_name):
    group = f"{topic_name}-admin"
    with RawConnection(shared_broker.bootstrap) as conn:
        create_topic(conn, topic_name, 2)
        produce(conn, topic_name, 0, [b"a", b"b", b"c"])
        altered = conn.request(req(91, 0, group_id=group, topics=(
            nested(91, 0, "AlterShareGroupOffsetsRequestTopic", topic_name=topic_name, partitions=tuple(
                nested(91, 0, "AlterShareGroupOffsetsRequestPartition", partition_index=p, start_offset=o)
                for p, o in ((0, 1), (1, 99), (7, 0)))),)))
        assert (altered.error_code, altered.error_message) == (ErrorCode.none, None)
        (t,) = altered.responses
        assert t.topic_name == topic_name
        assert [(p.partition_index, p.error_code) for p in t.partitions] == [
            (0, ErrorCode.none), (1, ErrorCode.offset_out_of_range), (7, ErrorCode.unknown_topic_or_partition)]
        assert t.partitions[1].error_message == f"offset 99 is outside {topic_name}-1's range [0, 0]"
        for v in (0, 1):
            d = conn.request(req(90, v, groups=(
                nested(90, v, "DescribeShareGroupOffsetsRequestGroup", group_id=group, topics=(
                    nested(90, v, "DescribeShareGroupOffsetsRequestTopic", topic_name=topic_name, partitions=(0, 9)),)),
                nested(90, v, "DescribeShareGroupOffsetsRequestGroup", group_id=f"{group}-none", topics=None))))
            known, unknown = d.groups
            assert (unknown.group_id, unknown.error_code, unknown.topics) == (
                f"{group}-none", ErrorCode.group_id_not_found, ())
            assert (known.error_code, [x.topic_name for x in known.topics]) == (ErrorCode.none, [topic_name])
            parts = [(p.partition_index, p.start_offset, p.leader_epoch, p.error_code)
                     for p in known.topics[0].partitions]
            assert parts == [(0, 1, 0, ErrorCode.none), (9, -1, -1, ErrorCode.unknown_topic_or_partition)]
            if v >= 1:
                assert [p.lag for p in known.topics[0].partitions] == [2, -1]
        deleted = conn.request(req(92, 0, group_id=group, topics=(
            nested(92, 0, "DeleteShareGroupOffsetsRequestTopic", topic_name=topic_name),
            nested(92, 0, "DeleteShareGroupOffsetsRequestTopic", topic_name=f"{topic_name}-none"))))
        assert [(x.topic_name, x.error_code) for x in deleted.responses] == [
            (topic_name, ErrorCode.none), (f"{topic_name}-none", ErrorCode.unknown_topic_or_partition)]
        unknown_group = conn.request(req(92, 0, group_id=f"{group}-none", topics=()))
        assert (unknown_group.error_code, unknown_group.responses) == (ErrorCode.group_id_not_found, ())
