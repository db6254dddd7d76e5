"""InitProducerId, the transaction APIs and the offset APIs, answered on old and new versions.

Raw requests built from kio's entities of each version; each answer must be exactly
kio's encoding of what it says, and say the same on every version (fields a version
lacks left out).
"""

from __future__ import annotations

import datetime

import pytest
from kio.index import load_request_schema
from kio.schema.errors import ErrorCode

from shoal.protocol.entities import make, sub
from tests.support.clients import create_topic
from tests.support.wire import RawConnection, request_bytes

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

MINUTE = datetime.timedelta(minutes=1)


def call(conn: RawConnection, api_key: int, version: int, correlation_id: int = 1, **fields):
    """Send the request of this version; return its decoded answer, checked byte for byte."""
    conn.send(request_bytes(make(load_request_schema(api_key, version), **fields), correlation_id))
    return conn.read_canonical(api_key, version, correlation_id)


def req(api_key: int, version: int, entity: str, **fields):
    return make(sub(load_request_schema(api_key, version), entity), **fields)


@pytest.fixture(scope="module")
def topic(shared_broker) -> str:
    create_topic(shared_broker.bootstrap, "answers-offsets", 2)
    return "answers-offsets"


@pytest.mark.parametrize("version", (0, 2, 3, 4, 5))
def test_init_producer_id(shared_broker, version):
    with RawConnection(shared_broker.bootstrap) as conn:
        r = call(conn, 22, version, transactional_id=None, transaction_timeout=MINUTE,
                 producer_id=-1, producer_epoch=-1)
        assert (r.error_code, r.producer_epoch) == (ErrorCode.none, 0) and r.producer_id >= 0
        assert r.throttle_time == datetime.timedelta(0)
        if version >= 3:  # KIP-360: the producer bumps its own epoch
            bumped = call(conn, 22, version, 2, transactional_id=None, transaction_timeout=MINUTE,
                          producer_id=r.producer_id, producer_epoch=4)
            assert (bumped.error_code, bumped.producer_id, bumped.producer_epoch) == (ErrorCode.none,
                                                                                      r.producer_id, 5)
        txn = call(conn, 22, version, 3, transactional_id=f"answers-init-{version}", transaction_timeout=MINUTE,
                   producer_id=-1, producer_epoch=-1)
        assert (txn.error_code, txn.producer_epoch) == (ErrorCode.none, 0) and txn.producer_id >= 0


@pytest.mark.parametrize("version", (0, 1, 2, 3))
def test_transaction_apis(shared_broker, topic, version):
    """AddPartitionsToTxn with an unknown partition (nothing added), then the partition
    alone; AddOffsetsToTxn without a group id; TxnOffsetCommit of offsets the transaction
    does not hold; EndTxn of another producer id; EndTxn that commits (transaction version 1)."""
    txn_id = f"answers-txn-{version}"
    with RawConnection(shared_broker.bootstrap) as conn:
        ids = call(conn, 22, min(version, 4), transactional_id=txn_id, transaction_timeout=MINUTE,
                   producer_id=-1, producer_epoch=-1)
        pid, epoch = ids.producer_id, ids.producer_epoch
        common = dict(transactional_id=txn_id, producer_id=pid, producer_epoch=epoch,
                      v3_and_below_transactional_id=txn_id, v3_and_below_producer_id=pid,
                      v3_and_below_producer_epoch=epoch)
        topics = (req(24, version, "AddPartitionsToTxnTopic", name=topic, partitions=(0, 5)),)
        r = call(conn, 24, version, 2, topics=topics, v3_and_below_topics=topics, **common)
        rows = [(t.name, p.partition_index, p.partition_error_code) for t in r.results_by_topic_v3_and_below
                for p in t.results_by_partition]
        assert rows == [(topic, 0, ErrorCode.operation_not_attempted), (topic, 5, ErrorCode.unknown_topic_or_partition)]
        topics = (req(24, version, "AddPartitionsToTxnTopic", name=topic, partitions=(0,)),)
        r = call(conn, 24, version, 3, topics=topics, v3_and_below_topics=topics, **common)
        assert [p.partition_error_code for t in r.results_by_topic_v3_and_below
                for p in t.results_by_partition] == [ErrorCode.none]

        r = call(conn, 25, version, 4, group_id="", **common)
        assert r.error_code == ErrorCode.invalid_group_id

        tversion, end_version = {0: (0, 0), 1: (2, 2), 2: (3, 3), 3: (4, 5)}[version]
        parts = tuple(req(28, tversion, "TxnOffsetCommitRequestPartition", partition_index=p, committed_offset=3,
                          committed_leader_epoch=-1, committed_metadata="") for p in (0, 1))
        r = call(conn, 28, tversion, 5, group_id="answers-group", generation_id=-1, member_id="",
                 group_instance_id=None, topics=(req(28, tversion, "TxnOffsetCommitRequestTopic", name=topic,
                                                     partitions=parts),), **common)
        codes = [(t.name, p.partition_index, p.error_code) for t in r.topics for p in t.partitions]
        assert [c[:2] for c in codes] == [(topic, 0), (topic, 1)]
        assert codes[0][2] != ErrorCode.none and codes[0][2] == codes[1][2]

        other = dict(common, producer_id=pid + 1000)
        r = call(conn, 26, end_version, 6, committed=True, **other)
        assert r.error_code != ErrorCode.none
        if end_version >= 5:
            assert (r.producer_id, r.producer_epoch) == (-1, -1)  # an error: nothing to go on with
        else:
            r = call(conn, 26, end_version, 7, committed=True, **common)
            assert r.error_code == ErrorCode.none


@pytest.mark.parametrize("version", (2, 5, 8, 9))
def test_offset_commit_fetch_delete(shared_broker, topic, version):
    """OffsetCommit of known and unknown partitions (the unknown answered, the others
    committed), of unknown ones only; OffsetFetch of them (v1-v7 and the v8+ groups form);
    OffsetDelete (v0) of the committed partition."""
    group = f"answers-group-{version}"
    with RawConnection(shared_broker.bootstrap) as conn:
        def commit(cid: int, parts: dict[str, tuple[int, ...]]):
            topics = tuple(req(8, version, "OffsetCommitRequestTopic", name=name, partitions=tuple(
                req(8, version, "OffsetCommitRequestPartition", partition_index=p, committed_offset=10 + p,
                    committed_leader_epoch=-1, committed_metadata="m") for p in ps)) for name, ps in parts.items())
            r = call(conn, 8, version, cid, group_id=group, generation_id_or_member_epoch=-1, member_id="",
                     group_instance_id=None, retention_time_ms=-1, topics=topics)
            return [(t.name, p.partition_index, p.error_code) for t in r.topics for p in t.partitions]

        assert commit(1, {topic: (0, 9), "answers-none": (0,)}) == [
            (topic, 0, ErrorCode.none), (topic, 9, ErrorCode.unknown_topic_or_partition),
            ("answers-none", 0, ErrorCode.unknown_topic_or_partition)]
        assert commit(2, {"answers-none": (1,)}) == [("answers-none", 1, ErrorCode.unknown_topic_or_partition)]

        fetch_versions = (1, 5, 7) if version < 8 else (8, 9)
        for i, fv in enumerate(fetch_versions):
            if fv < 8:
                r = call(conn, 9, fv, 10 + i, group_id=group, require_stable=False, topics=(
                    req(9, fv, "OffsetFetchRequestTopic", name=topic, partition_indexes=(0, 1)),))
                assert fv < 2 or r.error_code == ErrorCode.none  # v2 added the top-level error
                rows = [(t.name, p.partition_index, p.committed_offset, p.metadata, p.error_code)
                        for t in r.topics for p in t.partitions]
            else:
                r = call(conn, 9, fv, 10 + i, require_stable=False, groups=(
                    req(9, fv, "OffsetFetchRequestGroup", group_id=group, member_id=None, member_epoch=-1,
                        topics=(req(9, fv, "OffsetFetchRequestTopics", name=topic, partition_indexes=(0, 1)),)),))
                (g,) = r.groups
                assert (g.group_id, g.error_code) == (group, ErrorCode.none)
                rows = [(t.name, p.partition_index, p.committed_offset, p.metadata, p.error_code)
                        for t in g.topics for p in t.partitions]
            assert rows == [(topic, 0, 10, "m", ErrorCode.none), (topic, 1, -1, "", ErrorCode.none)]

        r = call(conn, 47, 0, 20, group_id=group, topics=(
            req(47, 0, "OffsetDeleteRequestTopic", name=topic, partitions=(
                req(47, 0, "OffsetDeleteRequestPartition", partition_index=0),)),))
        assert r.error_code == ErrorCode.none
        assert [(t.name, p.partition_index, p.error_code) for t in r.topics for p in t.partitions] == [
            (topic, 0, ErrorCode.none)]
