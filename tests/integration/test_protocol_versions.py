"""Every advertised version of the core APIs, sent raw: each answer decodes exactly and says the same.

Requests are built from kio's entities for each version; responses are decoded with
kio's reader for that version and must consume the whole frame.
"""

from __future__ import annotations

import datetime

import pytest
from kio.index import load_request_schema
from kio.schema.api_versions.v3.request import ApiVersionsRequest
from kio.schema.errors import ErrorCode

from shoal.protocol.batch import build_batch, read_header
from shoal.protocol.entities import has_field, make, sub
from tests.support.clients import create_topic
from tests.support.wire import RawConnection

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

NO_REPLICA = -1


def served_versions(bs: str) -> dict[int, tuple[int, int]]:
    with RawConnection(bs) as conn:
        resp = conn.request(ApiVersionsRequest(client_software_name="t", client_software_version="1"))
    return {k.api_key: (k.min_version, k.max_version) for k in resp.api_keys}


@pytest.fixture(scope="module")
def versions(shared_broker) -> dict[int, tuple[int, int]]:
    return served_versions(shared_broker.bootstrap)


def each_version(versions, api_key):
    lo, hi = versions[api_key]
    return [(v, load_request_schema(api_key, v)) for v in range(lo, hi + 1)]


def test_api_versions_every_version(shared_broker, versions):
    with RawConnection(shared_broker.bootstrap) as conn:
        for v, cls in each_version(versions, 18):
            resp = conn.request(make(cls, client_software_name="t", client_software_version="1"), correlation_id=v)
            assert resp.error_code == ErrorCode.none
            assert {k.api_key: (k.min_version, k.max_version) for k in resp.api_keys} == versions


def test_produce_fetch_list_offsets_metadata_every_version(shared_broker, versions, topic_name):
    bs = shared_broker.bootstrap
    create_topic(bs, topic_name, 1)
    topic_id = None
    with RawConnection(bs) as conn:
        # Metadata: every version finds the topic with one partition led by broker 0.
        for v, cls in each_version(versions, 3):
            tcls = sub(cls, "MetadataRequestTopic")
            resp = conn.request(make(cls, topics=(make(tcls, name=topic_name),), allow_auto_topic_creation=False),
                                correlation_id=v)
            (t,) = resp.topics
            assert (t.error_code, t.name, len(t.partitions)) == (ErrorCode.none, topic_name, 1)
            assert t.partitions[0].leader_id == 0
            assert [b.node_id for b in resp.brokers] == [0]
            if has_field(type(t), "topic_id"):
                topic_id = t.topic_id
        assert topic_id is not None and topic_id.int != 0

        # Produce: one batch per version, offsets follow each other.
        produced = []
        for i, (v, cls) in enumerate(each_version(versions, 0)):
            tcls = sub(cls, "TopicProduceData")
            pcls = sub(cls, "PartitionProduceData")
            batch = build_batch([(b"k%d" % v, b"produce v%d" % v, [("v", b"%d" % v)], 1_700_000_000_000 + v)])
            req = make(cls, transactional_id=None, acks=-1, timeout=datetime.timedelta(seconds=5),
                       topic_data=(make(tcls, name=topic_name, partition_data=(make(pcls, index=0, records=batch),)),))
            resp = conn.request(req, correlation_id=100 + v)
            (p,) = resp.responses[0].partition_responses
            assert (p.error_code, p.base_offset) == (ErrorCode.none, i), v
            produced.append(i)
        end = len(produced)

        # ListOffsets: latest is the end, earliest 0, every version.
        for v, cls in each_version(versions, 2):
            tcls = sub(cls, "ListOffsetsTopic")
            pcls = sub(cls, "ListOffsetsPartition")
            for spec, expected in ((-1, end), (-2, 0)):
                req = make(cls, replica_id=NO_REPLICA, isolation_level=0, topics=(make(tcls, name=topic_name, partitions=(
                    make(pcls, partition_index=0, current_leader_epoch=-1, timestamp=spec, max_num_offsets=1),)),))
                resp = conn.request(req, correlation_id=200 + v)
                (p,) = resp.topics[0].partitions
                assert p.error_code == ErrorCode.none
                offset = p.offset if has_field(type(p), "offset") else p.old_style_offsets[0]
                assert offset == expected, (v, spec)

        # Fetch: every version returns all batches from offset 0 (topic ids from v13).
        for v, cls in each_version(versions, 1):
            tcls = sub(cls, "FetchTopic")
            pcls = sub(cls, "FetchPartition")
            part = make(pcls, partition=0, current_leader_epoch=-1, fetch_offset=0, last_fetched_epoch=-1,
                        log_start_offset=-1, partition_max_bytes=1 << 20)
            fields = dict(replica_id=NO_REPLICA, max_wait=datetime.timedelta(milliseconds=10), min_bytes=1,
                          max_bytes=1 << 20, isolation_level=0, session_id=0, session_epoch=-1,
                          topics=(make(tcls, topic=topic_name, topic_id=topic_id, partitions=(part,)),),
                          forgotten_topics_data=(), rack_id="")
            if has_field(cls, "replica_state"):
                fields["replica_state"] = make(sub(cls, "ReplicaState"), replica_id=NO_REPLICA, replica_epoch=-1)
            resp = conn.request(make(cls, **fields), correlation_id=300 + v)
            assert getattr(resp, "error_code", ErrorCode.none) == ErrorCode.none  # top-level from v7
            (t,) = resp.responses
            (p,) = t.partitions
            assert (p.error_code, p.high_watermark) == (ErrorCode.none, end), v
            assert getattr(p, "log_start_offset", 0) == 0  # from v5
            offsets = []
            pos = 0
            while pos < len(p.records):
                h = read_header(p.records, pos)
                offsets.append(h.base_offset)
                pos += h.size
            assert offsets == list(range(end)), (v, len(p.records))


def test_fetch_by_unknown_topic_id(shared_broker, versions):
    import uuid

    v = versions[1][1]
    assert v >= 13
    cls = load_request_schema(1, v)
    part = make(sub(cls, "FetchPartition"), partition=0, current_leader_epoch=-1, fetch_offset=0,
                last_fetched_epoch=-1, log_start_offset=-1, partition_max_bytes=1000)
    req = make(cls, replica_state=make(sub(cls, "ReplicaState"), replica_id=-1, replica_epoch=-1),
               max_wait=datetime.timedelta(milliseconds=10), min_bytes=1, max_bytes=1000, session_id=0,
               session_epoch=-1, topics=(make(sub(cls, "FetchTopic"), topic_id=uuid.uuid4(), partitions=(part,)),))
    with RawConnection(shared_broker.bootstrap) as conn:
        resp = conn.request(req)
    (p,) = resp.responses[0].partitions
    assert p.error_code == ErrorCode.unknown_topic_id


def test_init_producer_id_and_idempotent_duplicates(shared_broker, versions, topic_name):
    bs = shared_broker.bootstrap
    create_topic(bs, topic_name, 1)
    pcls_ = load_request_schema(22, versions[22][1])
    with RawConnection(bs) as conn:
        ids = conn.request(make(pcls_, transactional_id=None, transaction_timeout=datetime.timedelta(seconds=60),
                                producer_id=-1, producer_epoch=-1))
        assert ids.error_code == ErrorCode.none and ids.producer_id >= 0
        pid, epoch = ids.producer_id, ids.producer_epoch
        cls = load_request_schema(0, versions[0][1])

        def produce(seq: int, n: int = 2, ep: int = epoch):
            batch = build_batch([(None, b"s%d-%d" % (seq, i), [], 1_700_000_000_000) for i in range(n)],
                                producer_id=pid, producer_epoch=ep, base_sequence=seq)
            req = make(cls, transactional_id=None, acks=-1, timeout=datetime.timedelta(seconds=5),
                       topic_data=(make(sub(cls, "TopicProduceData"), name=topic_name, partition_data=(
                           make(sub(cls, "PartitionProduceData"), index=0, records=batch),)),))
            (p,) = conn.request(req).responses[0].partition_responses
            return p.error_code, p.base_offset

        assert produce(0) == (ErrorCode.none, 0)
        assert produce(2) == (ErrorCode.none, 2)
        assert produce(2) == (ErrorCode.none, 2)  # a retry of the last batch: acknowledged, not written
        assert produce(0) == (ErrorCode.none, 0)  # an older batch still remembered
        assert produce(9)[0] == ErrorCode.out_of_order_sequence_number
        assert produce(4) == (ErrorCode.none, 4)
        # A new id for a fresh producer; the old epoch is fenced once the id is bumped (KIP-360).
        bumped = conn.request(make(pcls_, transactional_id=None, transaction_timeout=datetime.timedelta(seconds=60),
                                   producer_id=pid, producer_epoch=epoch), correlation_id=9)
        assert bumped.error_code == ErrorCode.none and bumped.producer_id == pid
        assert bumped.producer_epoch == epoch + 1
        assert produce(0, ep=epoch + 1) == (ErrorCode.none, 6)
        assert produce(6, ep=epoch)[0] == ErrorCode.invalid_producer_epoch

    from tests.support.clients import consumer
    from confluent_kafka import TopicPartition

    c = consumer(bs)
    try:
        assert c.get_watermark_offsets(TopicPartition(topic_name, 0), timeout=10) == (0, 8)
    finally:
        c.close()


def test_broker_fetch_max_bytes_caps_responses(start_broker, topic_name):
    """A Fetch response stops at the broker's fetch.max.bytes, but always carries one batch."""
    b = start_broker({"fetch.max.bytes": "4096"})
    create_topic(b.bootstrap, topic_name, 2)
    cls = load_request_schema(1, 12)
    pcls = load_request_schema(0, 9)
    big = build_batch([(None, b"x" * 10_000, [], 1_700_000_000_000)])
    small = build_batch([(None, b"y" * 1000, [], 1_700_000_000_000)])
    with RawConnection(b.bootstrap) as conn:
        for partition, batches in ((0, [small] * 8), (1, [big])):
            for batch in batches:
                req = make(pcls, transactional_id=None, acks=-1, timeout=datetime.timedelta(seconds=5),
                           topic_data=(make(sub(pcls, "TopicProduceData"), name=topic_name, partition_data=(
                               make(sub(pcls, "PartitionProduceData"), index=partition, records=batch),)),))
                assert conn.request(req).responses[0].partition_responses[0].error_code == ErrorCode.none

        def fetch(partitions: list[int]) -> dict[int, bytes]:
            parts = tuple(make(sub(cls, "FetchPartition"), partition=p, current_leader_epoch=-1, fetch_offset=0,
                               last_fetched_epoch=-1, log_start_offset=-1, partition_max_bytes=1 << 20)
                          for p in partitions)
            req = make(cls, replica_id=-1, max_wait=datetime.timedelta(milliseconds=10), min_bytes=1,
                       max_bytes=50 << 20, isolation_level=0, session_id=0, session_epoch=-1,
                       topics=(make(sub(cls, "FetchTopic"), topic=topic_name, partitions=parts),))
            return {p.partition_index: p.records for p in conn.request(req).responses[0].partitions}

        got = fetch([0])[0]
        assert 1000 < len(got) <= 4096  # whole batches, no more than fetch.max.bytes
        assert len(got) % len(small) == 0
        got = fetch([1])[1]
        assert got == big  # larger than the cap, yet returned whole: the consumer can progress
