"""The same raw request sequences sent to Apache Kafka's broker and to shoal.

Each scenario runs once against a single-node Apache Kafka 4.4 broker (KRaft, share
groups on; tests/support/kafka_ref.py) and once against shoal, both with the same topics
and the same short group settings; the responses are compared field by field after
:func:`normalize` drops what legitimately differs (ids, timestamps, throttle times,
addresses, error messages). Share-group APIs first.
"""

from __future__ import annotations

import struct
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType
from kio.schema.errors import ErrorCode
from kio.schema.produce.v9 import request as produce9

from shoal.protocol.batch import build_batch
from shoal.protocol.entities import make, ms, sub
from tests.reference.differential import Side, normalize
from tests.support.clients import admin_client, create_topic, produce_all, producer
from tests.support.kafka_ref import KafkaBroker
from tests.support.wire import RawConnection, request_bytes

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

TOPIC = "diff-t"


@pytest.fixture(scope="module")
def sides(shoal, tmp_path_factory: pytest.TempPathFactory, kafka_classpath: str) -> Iterator[tuple[Side, Side]]:
    kafka = KafkaBroker(tmp_path_factory.mktemp("kafka"))
    kafka.start()
    try:
        pair = (Side("kafka", kafka.bootstrap), Side("shoal", shoal.bootstrap))
        for side in pair:  # the same topic, records and group config on both (librdkafka: no JVM to start)
            create_topic(side.bootstrap, TOPIC, 2)
            produce_all(producer(side.bootstrap), TOPIC, [{"value": f"v{i}", "partition": i % 2} for i in range(10)])
            group = ConfigResource(ResourceType.GROUP, "diff-g", incremental_configs=[ConfigEntry(
                "share.auto.offset.reset", "earliest", incremental_operation=AlterConfigOpType.SET)])
            admin = admin_client(side.bootstrap)
            admin.incremental_alter_configs([group])[group].result(timeout=30)
        yield pair
    finally:
        for side in pair:
            side.close()
        kafka.stop()


def both(sides: tuple[Side, Side], scenario) -> tuple[list[tuple[str, Any]], list[tuple[str, Any]]]:
    kafka, shoal = sides
    return ([(n, normalize(r)) for n, r in scenario(kafka)], [(n, normalize(r)) for n, r in scenario(shoal)])


def assert_same(sides: tuple[Side, Side], scenario) -> None:
    want, got = both(sides, scenario)
    assert [n for n, _ in got] == [n for n, _ in want]
    diffs = [(n, w, g) for (n, w), (_, g) in zip(want, got) if w != g]
    assert diffs == [], "\n".join(f"{n}:\n  kafka: {w}\n  shoal: {g}" for n, w, g in diffs)


def heartbeat(conn, group: str, member: str, epoch: int, topics: tuple[str, ...] | None = (TOPIC,)) -> Any:
    return conn.call(76, 1, group_id=group, member_id=member, member_epoch=epoch, rack_id=None,
                     subscribed_topic_names=topics)


_NOT_READY = {"not_coordinator", "coordinator_load_in_progress", "coordinator_not_available"}


def code(value: Any) -> str:
    return ErrorCode(int(value)).name


def join(conn, group: str, member: str) -> Any:
    """Heartbeat until the member has its assignment (Kafka may assign asynchronously).

    A coordinator that is still loading (Kafka creates __consumer_offsets on the first
    FindCoordinator) is waited for first."""
    deadline = time.monotonic() + 60
    while True:
        fc = conn.call(10, 6, key_type=0, coordinator_keys=(group,))
        r = heartbeat(conn, group, member, 0)
        if code(r.error_code) not in _NOT_READY or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    del fc
    deadline = time.monotonic() + 20
    while (code(r.error_code) == "none" and not (r.assignment and r.assignment.topic_partitions)
           and time.monotonic() < deadline):
        time.sleep(0.3)
        r = heartbeat(conn, group, member, r.member_epoch, None)
    return r


def test_share_group_heartbeat(sides) -> None:
    def scenario(side: Side) -> list[tuple[str, Any]]:
        conn = side.connect()
        member = str(uuid.uuid4())
        j = join(conn, "diff-hb", member)
        # epochs are the coordinator's own count (Kafka bumps the group epoch more often)
        steps = [("join", (code(j.error_code), j.member_id == member, j.member_epoch > 0, j.heartbeat_interval,
                           j.assignment))]
        steps.append(("empty group id", heartbeat(conn, "", str(uuid.uuid4()), 0)))
        steps.append(("empty member id", heartbeat(conn, "diff-hb", "", 0)))
        steps.append(("first heartbeat without topics", heartbeat(conn, "diff-hb", str(uuid.uuid4()), 0, None)))
        steps.append(("unknown member", heartbeat(conn, "diff-hb", str(uuid.uuid4()), 5, None)))
        steps.append(("epoch ahead", heartbeat(conn, "diff-hb", member, 99, None)))
        steps.append(("leave", heartbeat(conn, "diff-hb", member, -1, None)))
        steps.append(("after leaving", heartbeat(conn, "diff-hb", member, 1, None)))
        steps.append(("bad epoch -2", heartbeat(conn, "diff-hb", str(uuid.uuid4()), -2, None)))
        return steps

    assert_same(sides, scenario)


def share_fetch(conn, side: Side, member: str | None, epoch: int, partitions: list[int], *, group: str = "diff-g",
                acks: dict[int, list[tuple[int, int, int]]] | None = None, topic_id: uuid.UUID | None = None) -> Any:
    req = conn.request_type(78, 1)
    tid = topic_id if topic_id is not None else side.topic_id(conn, TOPIC)
    topic = make(sub(req, "FetchTopic"), topic_id=tid, partitions=tuple(
        make(sub(req, "FetchPartition"), partition_index=p, acknowledgement_batches=tuple(
            make(sub(req, "AcknowledgementBatch"), first_offset=a, last_offset=b, acknowledge_types=(t,))
            for a, b, t in (acks or {}).get(p, [])))
        for p in partitions))
    return conn.send(make(req, group_id=group, member_id=member, share_session_epoch=epoch, max_wait=ms(200),
                          min_bytes=1, max_bytes=1 << 20, max_records=100, batch_size=100,
                          topics=(topic,) if partitions else ()))


def share_ack(conn, side: Side, member: str, epoch: int, acks: dict[int, list[tuple[int, int, int]]],
              group: str = "diff-g") -> Any:
    req = conn.request_type(79, 1)
    topic = make(sub(req, "AcknowledgeTopic"), topic_id=side.topic_id(conn, TOPIC), partitions=tuple(
        make(sub(req, "AcknowledgePartition"), partition_index=p, acknowledgement_batches=tuple(
            make(sub(req, "AcknowledgementBatch"), first_offset=a, last_offset=b, acknowledge_types=(t,))
            for a, b, t in batches)) for p, batches in acks.items()))
    return conn.send(make(req, group_id=group, member_id=member, share_session_epoch=epoch, topics=(topic,)))


def fetch_summary(r: Any) -> dict[str, Any]:
    """What a ShareFetch answered, per partition: errors and acquired offsets with delivery counts."""
    out: dict[str, Any] = {"error": code(r.error_code)}
    for t in r.responses:
        for p in t.partitions:
            out[str(p.partition_index)] = {
                "error": code(p.error_code), "ack_error": code(p.acknowledge_error_code),
                "acquired": [(a.first_offset, a.last_offset, a.delivery_count) for a in p.acquired_records]}
    return out


def test_share_fetch_and_acknowledge(sides) -> None:
    def scenario(side: Side) -> list[tuple[str, Any]]:
        conn = side.connect()
        member = str(uuid.uuid4())
        steps: list[tuple[str, Any]] = [("join", join(conn, "diff-g", member).error_code)]
        steps.append(("no session, epoch 1", share_fetch(conn, side, member, 1, [0, 1])))
        steps.append(("acks in epoch 0", share_fetch(conn, side, member, 0, [0], acks={0: [(0, 0, 1)]})))
        steps.append(("unknown topic id", share_fetch(conn, side, member, 0, [0], topic_id=uuid.uuid4())))
        # open the session and acquire every record of both partitions; Kafka may answer one
        # partition per ShareFetch, so the acquired batches of several answers are merged
        acquired: dict[str, Any] = {}
        summary = fetch_summary(share_fetch(conn, side, member, 0, [0, 1]))
        epoch = 1
        deadline = time.monotonic() + 20
        while True:
            acquired["error"] = summary["error"]
            for p in ("0", "1"):
                if p in summary:
                    into = acquired.setdefault(p, {"error": "none", "ack_error": "none", "acquired": []})
                    into["error"], into["ack_error"] = summary[p]["error"], summary[p]["ack_error"]
                    into["acquired"] += summary[p]["acquired"]
            if sum(b - a + 1 for p in ("0", "1") for a, b, _ in acquired.get(p, {}).get("acquired", [])) >= 10 \
                    or time.monotonic() > deadline:
                break
            summary = fetch_summary(share_fetch(conn, side, member, epoch, []))
            epoch += 1
        steps.append(("acquire", acquired))
        steps.append(("wrong session epoch", share_fetch(conn, side, member, epoch + 5, [])))
        # release offset 0 of partition 0, accept the rest, reject nothing
        acks = {0: [(0, 0, 2), (1, 4, 1)], 1: [(0, 4, 1)]}
        steps.append(("acknowledge", share_ack(conn, side, member, epoch, acks)))
        epoch += 1
        steps.append(("acknowledge again", share_ack(conn, side, member, epoch, acks)))
        epoch += 1
        steps.append(("refetch released", fetch_summary(share_fetch(conn, side, member, epoch, []))))
        epoch += 1
        unknown = share_ack(conn, side, member, epoch, {0: [(50, 60, 1)]})
        epoch += 1
        steps.append(("ack epoch 0", share_ack(conn, side, member, 0, {0: [(0, 0, 1)]})))
        steps.append(("close session", share_fetch(conn, side, member, -1, [])))
        steps.append(("ack offsets never fetched", unknown))
        return steps

    want, got = both(sides, scenario)
    assert [n for n, _ in got] == [n for n, _ in want]
    diffs = [(n, w, g) for (n, w), (_, g) in zip(want, got) if w != g]
    assert diffs == [], "\n".join(f"{n}:\n  kafka: {w}\n  shoal: {g}" for n, w, g in diffs)

    def errors(steps: list[tuple[str, Any]], name: str) -> dict[int, str]:
        [r] = [r for n, r in steps if n == name]
        return {p["partition_index"]: p["error_code"] for t in r["responses"] for p in t["partitions"]}

    # Accepting again records below the share-partition start offset (all of partition 1 was
    # accepted) is a success; offsets never fetched are an invalid request.
    assert errors(got, "acknowledge again") == {0: "invalid_record_state", 1: "none"}
    assert errors(got, "ack offsets never fetched") == {0: "invalid_request"}


def test_share_fetch_from_a_member_not_in_the_group(sides) -> None:
    """Kafka's share-partition leader checks share sessions, not the group membership: a
    member id the group does not have opens a session, acquires records, acknowledges and
    closes; only a member id that is null, empty or longer than 36 characters is refused
    (INVALID_REQUEST)."""
    def scenario(side: Side) -> list[tuple[str, Any]]:
        conn = side.connect()
        group = ConfigResource(ResourceType.GROUP, "diff-stranger", incremental_configs=[ConfigEntry(
            "share.auto.offset.reset", "earliest", incremental_operation=AlterConfigOpType.SET)])
        admin = admin_client(side.bootstrap)
        admin.incremental_alter_configs([group])[group].result(timeout=30)
        join(conn, "diff-stranger", str(uuid.uuid4()))
        stranger = str(uuid.uuid4())

        def fetched(r: Any) -> list[tuple[int, str, list[tuple[int, int, int]]]]:
            return sorted((p.partition_index, code(p.error_code),
                           [(a.first_offset, a.last_offset, a.delivery_count) for a in p.acquired_records])
                          for t in r.responses for p in t.partitions)

        opened = share_fetch(conn, side, stranger, 0, [0], group="diff-stranger")
        acked = share_fetch(conn, side, stranger, 1, [0], group="diff-stranger", acks={0: [(0, 4, 1)]})
        closed = share_fetch(conn, side, stranger, -1, [], group="diff-stranger")
        no_session = share_ack(conn, side, str(uuid.uuid4()), 1, {0: [(0, 0, 1)]}, group="diff-stranger")
        return [
            ("open a session", (code(opened.error_code), fetched(opened))),
            ("accept, fetch again", (code(acked.error_code), fetched(acked))),
            ("close", code(closed.error_code)),
            ("acknowledge without a session", code(no_session.error_code)),
            ("member id of 37 characters", code(share_fetch(conn, side, "m" * 37, 0, [0], group="diff-stranger")
                                                .error_code)),
            ("empty member id", code(share_fetch(conn, side, "", 0, [0], group="diff-stranger").error_code)),
            ("null member id", code(share_fetch(conn, side, None, 0, [0], group="diff-stranger").error_code)),
        ]

    want, got = both(sides, scenario)
    diffs = [(n, w, g) for (n, w), (_, g) in zip(want, got) if w != g]
    assert diffs == [], "\n".join(f"{n}:\n  kafka: {w}\n  shoal: {g}" for n, w, g in diffs)
    assert dict(got)["open a session"][0] == "none" and dict(got)["open a session"][1]


def test_describe_group_configs(sides) -> None:
    def scenario(side: Side) -> list[tuple[str, Any]]:
        conn = side.connect()
        req = conn.request_type(32, 4)
        r = conn.send(make(req, resources=(make(sub(req, "DescribeConfigsResource"), resource_type=32,
                                                resource_name="diff-g", configuration_keys=None),),
                           include_synonyms=False, include_documentation=False))
        [res] = r.results
        configs = {c.name: (c.value, c.read_only, c.config_source, c.is_sensitive) for c in res.configs}
        return [("error", res.error_code),
                ("configs both brokers have", {k: v for k, v in configs.items() if k not in KAFKA_ONLY_GROUP_CONFIGS}),
                ("configs only Kafka has", sorted(k for k in configs if k in KAFKA_ONLY_GROUP_CONFIGS))]

    want, got = both(sides, scenario)
    assert want[0] == got[0]
    common_w, common_g = want[1][1], got[1][1]
    assert sorted(common_w) == sorted(common_g)
    assert {k: v for k, v in common_w.items()} == {k: v for k, v in common_g.items()}, [
        (k, common_w[k], common_g[k]) for k in common_w if common_w[k] != common_g[k]]
    # shoal lacks the streams group configs (docs/COMPATIBILITY.md); Kafka has every one of them
    assert want[2] == ("configs only Kafka has", sorted(KAFKA_ONLY_GROUP_CONFIGS))
    assert got[2] == ("configs only Kafka has", [])


# Group configs of Apache Kafka 4.4 that shoal does not have (streams groups are not served).
KAFKA_ONLY_GROUP_CONFIGS = frozenset({
    "streams.assignment.interval.ms", "streams.assignor.name",
    "streams.heartbeat.interval.ms", "streams.initial.rebalance.delay.ms", "streams.num.standby.replicas",
    "streams.rack.aware.assignment.tags", "streams.session.timeout.ms",
})


def create_topics(conn, topics: list[dict[str, Any]], validate_only: bool = False) -> Any:
    req = conn.request_type(19, 7)
    return conn.send(make(req, timeout=ms(15000), validate_only=validate_only, topics=tuple(
        make(sub(req, "CreatableTopic"), name=t["name"], num_partitions=t.get("partitions", 1),
             replication_factor=t.get("rf", 1), assignments=tuple(
                 make(sub(req, "CreatableReplicaAssignment"), partition_index=i, broker_ids=tuple(b))
                 for i, b in enumerate(t.get("assignments", []))),
             configs=tuple(make(sub(req, "CreatableTopicConfig"), name=k, value=v)
                           for k, v in t.get("configs", {}).items()))
        for t in topics)))


def create_partitions(conn, name: str, count: int, validate_only: bool = False) -> Any:
    req = conn.request_type(37, 3)
    return conn.send(make(req, timeout=ms(15000), validate_only=validate_only, topics=(
        make(sub(req, "CreatePartitionsTopic"), name=name, count=count, assignments=None),)))


def test_create_topics_and_partitions_validation(sides) -> None:
    """CreateTopics v7 and CreatePartitions v3 refusals: per topic error codes."""
    def scenario(side: Side) -> list[tuple[str, Any]]:
        conn = side.connect()

        def codes(r: Any) -> list[tuple[str, str]]:
            items = r.topics if hasattr(r, "topics") else r.results
            return sorted((str(t.name), code(t.error_code)) for t in items)

        return [
            ("bad names", codes(create_topics(conn, [{"name": "bad name"}, {"name": "a" * 250}, {"name": "."}]))),
            ("zero partitions", codes(create_topics(conn, [{"name": "diff-zero", "partitions": 0}]))),
            ("too many replicas", codes(create_topics(conn, [{"name": "diff-rf3", "rf": 3}]))),
            ("zero replicas", codes(create_topics(conn, [{"name": "diff-rf0", "rf": 0}]))),
            ("unknown config", codes(create_topics(conn, [{"name": "diff-cfg", "configs": {"no.such": "1"}}]))),
            ("bad config value", codes(create_topics(conn, [{"name": "diff-cfg2", "configs": {"retention.ms": "x"}}]))),
            ("duplicate in request", codes(create_topics(conn, [{"name": "diff-dup"}, {"name": "diff-dup"}]))),
            ("was the duplicate created", codes(create_partitions(conn, "diff-dup", 2, validate_only=True))),
            ("exists", codes(create_topics(conn, [{"name": TOPIC}]))),
            ("validate only", codes(create_topics(conn, [{"name": "diff-validate"}], validate_only=True))),
            ("not created by validate only", codes(create_partitions(conn, "diff-validate", 2))),
            ("fewer partitions", codes(create_partitions(conn, TOPIC, 1))),
            ("same partitions", codes(create_partitions(conn, TOPIC, 2))),
            ("unknown topic", codes(create_partitions(conn, "diff-no-such", 3))),
            ("more partitions, validate only", codes(create_partitions(conn, TOPIC, 3, validate_only=True))),
        ]

    want, got = both(sides, scenario)
    diffs = [(n, w, g) for (n, w), (_, g) in zip(want, got) if w != g]
    assert diffs == [], "\n".join(f"{n}:\n  kafka: {w}\n  shoal: {g}" for n, w, g in diffs)
    # A topic named twice in one CreateTopics: one INVALID_REQUEST for the name, nothing created.
    assert dict(got)["duplicate in request"] == [["diff-dup", "invalid_request"]]
    assert dict(got)["was the duplicate created"] == [["diff-dup", "unknown_topic_or_partition"]]


def list_offsets(conn, topic: str, partitions: dict[int, int]) -> list[tuple[int, str, int]]:
    req = conn.request_type(2, 10)
    r = conn.send(make(req, replica_id=-1, isolation_level=0, timeout=ms(10000), topics=(
        make(sub(req, "ListOffsetsTopic"), name=topic, partitions=tuple(
            make(sub(req, "ListOffsetsPartition"), partition_index=p, current_leader_epoch=-1, timestamp=ts)
            for p, ts in partitions.items())),)))
    return sorted((p.partition_index, code(p.error_code), p.offset) for t in r.topics for p in t.partitions)


def offset_commit(conn, group: str, topic: str, offsets: dict[int, int], *, member: str = "",
                  generation: int = -1) -> list[tuple[int, str]]:
    req = conn.request_type(8, 9)
    r = conn.send(make(req, group_id=group, generation_id_or_member_epoch=generation, member_id=member,
                       group_instance_id=None, topics=(make(sub(req, "OffsetCommitRequestTopic"), name=topic,
                       partitions=tuple(make(sub(req, "OffsetCommitRequestPartition"), partition_index=p,
                                             committed_offset=o, committed_leader_epoch=-1, committed_metadata="m")
                                        for p, o in offsets.items())),)))
    return sorted((p.partition_index, code(p.error_code)) for t in r.topics for p in t.partitions)


def offset_fetch(conn, group: str, topic: str | None) -> Any:
    req = conn.request_type(9, 9)
    topics = None if topic is None else (
        make(sub(req, "OffsetFetchRequestTopics"), name=topic, partition_indexes=(0, 1)),)
    r = conn.send(make(req, require_stable=False, groups=(
        make(sub(req, "OffsetFetchRequestGroup"), group_id=group, member_id=None, member_epoch=-1, topics=topics),)))
    return [(code(g.error_code), sorted((t.name, p.partition_index, p.committed_offset, p.metadata, code(p.error_code))
                                        for t in g.topics for p in t.partitions)) for g in r.groups]


def test_list_offsets_and_offset_commit_fetch(sides) -> None:
    def scenario(side: Side) -> list[tuple[str, Any]]:
        conn = side.connect()
        conn.call(10, 6, key_type=0, coordinator_keys=("diff-oc",))
        deadline = time.monotonic() + 60
        while True:  # Kafka's coordinator for the group may still be loading
            first = offset_commit(conn, "diff-oc", TOPIC, {0: 3, 1: 5})
            if all(c not in _NOT_READY for _, c in first) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        return [
            ("latest and earliest", list_offsets(conn, TOPIC, {0: -1, 1: -2})),
            ("max timestamp", [(p, c) for p, c, _ in list_offsets(conn, TOPIC, {0: -3})]),
            ("unknown partition", list_offsets(conn, TOPIC, {7: -1})),
            ("unknown topic", list_offsets(conn, "diff-no-such", {0: -1})),
            ("commit without a member", first),
            ("fetch", offset_fetch(conn, "diff-oc", TOPIC)),
            ("fetch all topics", offset_fetch(conn, "diff-oc", None)),
            ("commit to an unknown topic", offset_commit(conn, "diff-oc", "diff-no-such", {0: 1})),
            ("commit to an unknown partition", offset_commit(conn, "diff-oc", TOPIC, {9: 1})),
            ("commit with an unknown member", offset_commit(conn, "diff-oc", TOPIC, {0: 1}, member="x", generation=3)),
            ("fetch of an unknown group", offset_fetch(conn, "diff-no-group", TOPIC)),
        ]

    assert_same(sides, scenario)



def test_tagged_fields_a_version_lacks_are_skipped(sides) -> None:
    """A Produce v9 whose partition and request carry tagged fields the schema does not
    know: Kafka's reader skips them and answers; so does shoal (kio alone refuses it)."""

    def scenario(side: Side) -> list[tuple[str, Any]]:
        create_topic(side.bootstrap, "diff-tags", 1)
        answers = []
        with RawConnection(side.bootstrap) as conn:
            for i, tags in enumerate((b"\x00\x00\x00", b"\x01\x04\x02hi\x00\x02\x07\x00\x0c\x03abc")):
                entity = produce9.ProduceRequest(
                    transactional_id=None, acks=-1, timeout=ms(10_000), topic_data=(produce9.TopicProduceData(
                        name="diff-tags", partition_data=(produce9.PartitionProduceData(index=0, records=build_batch(
                            [(None, b"tagged-%d" % i, [], 1_700_000_000_000)])),)),))
                frame = bytearray(request_bytes(entity, correlation_id=i + 1))
                # Produce v9 ends with the partition's, the topic's and the request's
                # tagged-field counts (0 each): the second request gives the partition
                # tag 4 and the request tags 7 and 12.
                assert frame[-3:] == b"\x00\x00\x00"
                frame[-3:] = tags
                frame[:4] = struct.pack(">i", len(frame) - 4)
                conn.send(bytes(frame))
                answers.append((f"produce {i}", conn.read_response(0, 9)))
        return answers

    assert_same(sides, scenario)
