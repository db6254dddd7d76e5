"""The administration APIs at every served version, sent raw: what each version's answer says.

Metadata (v0's empty topic list means every topic, from v1 on none; topics by id from v12,
refused before), CreateTopics (configs from v5, topic ids from v7), DeleteTopics (names
before v6, name or id from v6), CreatePartitions, DeleteRecords, DescribeConfigs (synonyms
when asked, documentation and types from v3), AlterConfigs, IncrementalAlterConfigs,
DescribeLogDirs (volume sizes from v4), DescribeCluster, FindCoordinator (one key before v4,
a list from v4), ElectLeaders, partition reassignments and ApiVersions (features from v3).
Each answer is decoded with kio's reader of that version and must use the whole frame.
"""

from __future__ import annotations

import dataclasses
import typing
import uuid
from typing import Any

import pytest
from kio.index import load_request_schema
from kio.schema.errors import ErrorCode

from shoal.protocol.entities import make
from tests.support.clients import create_topic
from tests.support.wire import RawConnection

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def nested(tp: Any) -> Any:
    """The entity class a field's type holds (in a tuple, possibly nullable)."""
    if dataclasses.is_dataclass(tp):
        return tp
    return next((n for a in typing.get_args(tp) if (n := nested(a)) is not None), None)


def build(cls: type, spec: dict[str, Any]) -> Any:
    """``cls`` from ``spec``: lists of dicts become the nested entities of the field."""
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    kw: dict[str, Any] = {}
    for k, v in spec.items():
        if k not in names:
            continue  # a field this version does not have
        if isinstance(v, list) and v and isinstance(v[0], dict):
            v = tuple(build(nested(hints[k]), x) for x in v)
        elif isinstance(v, list):
            v = tuple(v)
        kw[k] = v
    return make(cls, **kw)


def request(conn: RawConnection, api_key: int, version: int, **spec: Any) -> Any:
    return conn.request(build(load_request_schema(api_key, version), spec), correlation_id=1000 + version)


def has(entity: Any, name: str) -> bool:
    return name in {f.name for f in dataclasses.fields(entity)}


@pytest.fixture(scope="module")
def topic(shared_broker) -> tuple[str, uuid.UUID]:
    """A topic of three partitions with one override, and its id."""
    create_topic(shared_broker.bootstrap, "versions-t", 3, {"retention.ms": "60000"})
    with RawConnection(shared_broker.bootstrap) as conn:
        answer = request(conn, 3, 12, topics=[{"name": "versions-t"}])
    return "versions-t", answer.topics[0].topic_id


def test_metadata_every_version(shared_broker, topic) -> None:
    name, topic_id = topic
    with RawConnection(shared_broker.bootstrap) as conn:
        for v in range(13):
            # v0 has no null list: an empty one is every topic; from v1 an empty list is none
            every = request(conn, 3, v, topics=[] if v == 0 else None, allow_auto_topic_creation=False)
            assert name in {t.name for t in every.topics}, v
            if v >= 1:
                assert request(conn, 3, v, topics=[], allow_auto_topic_creation=False).topics == (), v
            # auto.create.topics.enable is on: v0-v3 cannot refuse auto-creation (their
            # allow_auto_topic_creation reads True), v4 on can
            unknown = f"versions-unknown-{v}"
            named = request(conn, 3, v, topics=[{"name": name}, {"name": unknown}], allow_auto_topic_creation=False)
            assert [(t.name, t.error_code) for t in named.topics] == [
                (name, ErrorCode.none), (unknown, ErrorCode.none if v < 4 else ErrorCode.unknown_topic_or_partition)], v
            assert [p.partition_index for p in named.topics[0].partitions] == [0, 1, 2]
            assert [(b.node_id, b.port) for b in named.brokers] == [(0, shared_broker.port)]
            if has(named.topics[0], "topic_id"):
                assert named.topics[0].topic_id == topic_id
            if has(named.topics[0], "topic_authorized_operations"):
                assert named.topics[0].topic_authorized_operations == -2147483648  # not computed
            if has(named.topics[0].partitions[0], "leader_epoch"):
                assert named.topics[0].partitions[0].leader_epoch == 0
            if v >= 10:
                by_id = request(conn, 3, v, topics=[{"name": None, "topic_id": topic_id}])
                if v < 12:  # topics by id came with v12: before, the request is invalid
                    assert [(t.error_code, t.topic_id) for t in by_id.topics] == [
                        (ErrorCode.invalid_request, topic_id)]
                    assert by_id.brokers == () and by_id.controller_id == -1
                else:
                    assert [(t.error_code, t.name) for t in by_id.topics] == [(ErrorCode.none, name)]
                    unknown = request(conn, 3, v, topics=[{"name": None, "topic_id": uuid.UUID(int=5)}])
                    assert [(t.error_code, t.name) for t in unknown.topics] == [(ErrorCode.unknown_topic_id, None)]


def test_create_topics_every_version(shared_broker, topic) -> None:
    with RawConnection(shared_broker.bootstrap) as conn:
        for v in range(2, 8):
            new = f"versions-new-{v}"
            answer = request(conn, 19, v, validate_only=False, timeout=10_000, topics=[
                {"name": new, "num_partitions": 2, "replication_factor": 1, "assignments": [],
                 "configs": [{"name": "retention.ms", "value": "1000"}]},
                {"name": "versions-dup", "num_partitions": 1, "replication_factor": 1, "assignments": [],
                 "configs": []},
                {"name": "versions-dup", "num_partitions": 1, "replication_factor": 1, "assignments": [],
                 "configs": []},
                {"name": topic[0], "num_partitions": -1, "replication_factor": -1, "assignments": [],
                 "configs": []},
                {"name": "versions-null", "num_partitions": 1, "replication_factor": 1, "assignments": [],
                 "configs": [{"name": "retention.ms", "value": None}]},
            ])
            assert [(t.name, t.error_code) for t in answer.topics] == [
                (new, ErrorCode.none), (topic[0], ErrorCode.topic_already_exists),
                ("versions-null", ErrorCode.invalid_config), ("versions-dup", ErrorCode.invalid_request)], v
            created, exists, _, dup = answer.topics
            if v >= 5:  # the created topic's settings and configs
                assert (created.num_partitions, created.replication_factor) == (2, 1)
                configs = {c.name: (c.value, c.config_source) for c in created.configs}
                assert configs["retention.ms"] == ("1000", 1)  # TOPIC_CONFIG
                assert (exists.num_partitions, exists.configs) == (-1, ())
                assert (dup.num_partitions, dup.error_message) == (-1, "Duplicate topic name.")
            if v >= 7:
                assert created.topic_id is not None and created.topic_id.int != 0
                assert exists.topic_id in (None, uuid.UUID(int=0))


def test_delete_topics_every_version(shared_broker) -> None:
    with RawConnection(shared_broker.bootstrap) as conn:
        for v in range(1, 7):
            name = f"versions-del-{v}"
            create_topic(shared_broker.bootstrap, name, 1)
            if v >= 6:  # by name or by id
                answer = request(conn, 20, v, timeout=10_000, topics=[
                    {"name": name, "topic_id": None}, {"name": None, "topic_id": uuid.UUID(int=9)},
                    {"name": "__consumer_offsets", "topic_id": None}])
                assert [(t.name, t.error_code) for t in answer.responses] == [
                    (name, ErrorCode.none), (None, ErrorCode.unknown_topic_id),
                    ("__consumer_offsets", ErrorCode.invalid_request)], v
                assert answer.responses[0].topic_id.int != 0
                assert answer.responses[1].topic_id == uuid.UUID(int=9)
            else:
                answer = request(conn, 20, v, timeout=10_000, topic_names=[name, "versions-missing"])
                assert [(t.name, t.error_code) for t in answer.responses] == [
                    (name, ErrorCode.none), ("versions-missing", ErrorCode.unknown_topic_or_partition)], v


def test_create_partitions_and_delete_records_every_version(shared_broker, topic) -> None:
    name = topic[0]
    with RawConnection(shared_broker.bootstrap) as conn:
        for v in range(4):
            answer = request(conn, 37, v, timeout=10_000, validate_only=True, topics=[
                {"name": "versions-nope", "count": 3, "assignments": None},
                {"name": name, "count": 1, "assignments": None},
                {"name": name, "count": 5, "assignments": None},
                {"name": name, "count": 5, "assignments": [{"broker_ids": [7]}, {"broker_ids": [7]}]}])
            assert [(r.name, r.error_code) for r in answer.results] == [
                ("versions-nope", ErrorCode.unknown_topic_or_partition), (name, ErrorCode.invalid_partitions),
                (name, ErrorCode.none), (name, ErrorCode.invalid_replica_assignment)], v
        for v in range(3):
            answer = request(conn, 21, v, timeout=10_000, topics=[
                {"name": name, "partitions": [{"partition_index": 1, "offset": 0},
                                              {"partition_index": 2, "offset": 5},
                                              {"partition_index": 9, "offset": 0}]},
                {"name": "__consumer_offsets", "partitions": [{"partition_index": 0, "offset": 0}]}])
            assert [[(p.partition_index, p.error_code, p.low_watermark) for p in t.partitions]
                    for t in answer.topics] == [
                [(1, ErrorCode.none, 0), (2, ErrorCode.offset_out_of_range, -1),
                 (9, ErrorCode.unknown_topic_or_partition, -1)],
                [(0, ErrorCode.invalid_topic_exception, -1)]], v


def test_describe_and_alter_configs_every_version(shared_broker, topic) -> None:
    name = topic[0]
    with RawConnection(shared_broker.bootstrap) as conn:
        for v in range(1, 5):
            for synonyms in (False, True):
                answer = request(conn, 32, v, include_synonyms=synonyms, include_documentation=True, resources=[
                    {"resource_type": 2, "resource_name": name, "configuration_keys": ["retention.ms",
                                                                                        "segment.bytes"]},
                    {"resource_type": 2, "resource_name": "versions-nope", "configuration_keys": None},
                    {"resource_type": 4, "resource_name": "0", "configuration_keys": ["log.retention.ms"]},
                    {"resource_type": 99, "resource_name": "x", "configuration_keys": None}])
                assert [r.error_code for r in answer.results] == [
                    ErrorCode.none, ErrorCode.unknown_topic_or_partition, ErrorCode.none,
                    ErrorCode.invalid_request], v
                configs = {c.name: c for c in answer.results[0].configs}
                assert set(configs) == {"retention.ms", "segment.bytes"}
                retention = configs["retention.ms"]
                assert (retention.value, retention.config_source) == ("60000", 1)
                if synonyms:  # the topic's override, then the broker's chain down to the default
                    assert (retention.synonyms[0].name, retention.synonyms[0].source) == ("retention.ms", 1)
                    assert retention.synonyms[-1].source == 5  # DEFAULT_CONFIG
                else:
                    assert retention.synonyms == ()
                if v >= 3:  # documentation (asked for) and types came with v3
                    assert retention.documentation and retention.config_type == 5  # LONG
                (broker_entry,) = answer.results[2].configs
                assert (broker_entry.name, broker_entry.read_only) == ("log.retention.ms", False)
        for v in range(3):
            answer = request(conn, 33, v, validate_only=True, resources=[
                {"resource_type": 2, "resource_name": name, "configs": [{"name": "retention.ms", "value": "5000"}]},
                {"resource_type": 2, "resource_name": name, "configs": [{"name": "bogus", "value": "1"}]},
                {"resource_type": 7, "resource_name": "x", "configs": []}])
            assert [(r.resource_name, r.error_code) for r in answer.responses] == [
                (name, ErrorCode.none), (name, ErrorCode.invalid_config), ("x", ErrorCode.invalid_request)], v
        for v in range(2):
            answer = request(conn, 44, v, validate_only=True, resources=[
                {"resource_type": 2, "resource_name": name,
                 "configs": [{"name": "retention.ms", "config_operation": 0, "value": "5000"}]},
                {"resource_type": 2, "resource_name": name,
                 "configs": [{"name": "retention.ms", "config_operation": 2, "value": "5000"}]}])
            assert [r.error_code for r in answer.responses] == [ErrorCode.none, ErrorCode.invalid_config], v
        # validate_only left the override as it was
        answer = request(conn, 32, 4, resources=[
            {"resource_type": 2, "resource_name": name, "configuration_keys": ["retention.ms"]}])
        assert answer.results[0].configs[0].value == "60000"


def test_cluster_apis_every_version(shared_broker, topic) -> None:
    name = topic[0]
    with RawConnection(shared_broker.bootstrap) as conn:
        for v in range(5):
            answer = request(conn, 18, v, client_software_name="t", client_software_version="1")
            assert answer.error_code == ErrorCode.none and 3 in {k.api_key for k in answer.api_keys}
            if v >= 3:  # features came with v3
                assert [(f.name, f.min_version, f.max_version) for f in answer.supported_features] == [
                    ("transaction.version", 0, 2)]
                assert answer.finalized_features_epoch == 1
                assert [(f.name, f.min_version_level, f.max_version_level)
                        for f in answer.finalized_features] == [("transaction.version", 2, 2)]
        for v in range(2):
            answer = request(conn, 60, v, endpoint_type=1)
            assert [(b.broker_id, b.port) for b in answer.brokers] == [(0, shared_broker.port)]
            assert (answer.controller_id, answer.cluster_authorized_operations) == (0, -2147483648)
        for v in range(7):
            if v < 4:  # one key per request
                answer = request(conn, 10, v, key="versions-g", key_type=0)
                assert (answer.error_code, answer.node_id, answer.port) == (ErrorCode.none, 0, shared_broker.port)
                empty = request(conn, 10, v, key="", key_type=0)
                assert (empty.error_code, empty.node_id, empty.host, empty.port) == (
                    ErrorCode.invalid_group_id, -1, "", -1)
            else:
                answer = request(conn, 10, v, key_type=0, coordinator_keys=["versions-g", ""])
                assert [(c.key, c.error_code, c.node_id) for c in answer.coordinators] == [
                    ("versions-g", ErrorCode.none, 0), ("", ErrorCode.invalid_group_id, -1)], v
                share = request(conn, 10, v, key_type=2, coordinator_keys=[f"g:{topic[1]}:0"])
                assert share.coordinators[0].error_code == (
                    ErrorCode.none if v >= 6 else ErrorCode.invalid_request), v  # the SHARE key type: v6
        for v in range(1, 5):
            answer = request(conn, 35, v, topics=[{"topic": name, "partitions": [0, 7]}])
            (result,) = answer.results
            assert [(t.name, [p.partition_index for p in t.partitions]) for t in result.topics] == [(name, [0])]
            if v >= 4:  # the volume's size and free space came with v4
                assert result.total_bytes > 0 and 0 <= result.usable_bytes <= result.total_bytes
        for v in range(3):
            answer = request(conn, 43, v, election_type=0, timeout=10_000,
                             topic_partitions=[{"topic": name, "partitions": [0, 9]}])
            assert [(p.partition_id, p.error_code) for p in answer.replica_election_results[0].partition_result] == [
                (0, ErrorCode.election_not_needed), (9, ErrorCode.unknown_topic_or_partition)], v
        for v in range(2):
            answer = request(conn, 45, v, timeout=10_000, allow_replication_factor_change=True, topics=[
                {"name": name, "partitions": [{"partition_index": 0, "replicas": [0]},
                                              {"partition_index": 1, "replicas": [1]},
                                              {"partition_index": 2, "replicas": None}]}])
            assert [p.error_code for p in answer.responses[0].partitions] == [
                ErrorCode.none, ErrorCode.invalid_replica_assignment, ErrorCode.no_reassignment_in_progress], v
            if v >= 1:
                assert answer.allow_replication_factor_change is True
        assert request(conn, 46, 0, timeout=10_000, topics=None).topics == ()
