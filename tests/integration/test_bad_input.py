"""Hostile and malformed input on raw sockets: the broker answers or closes that connection, and keeps serving."""

from __future__ import annotations

import datetime
import os
import struct
import time

import pytest
from confluent_kafka import TopicPartition
from kio.schema.api_versions.v0.response import ApiVersionsResponse as ApiVersionsResponseV0
from kio.schema.api_versions.v3.request import ApiVersionsRequest
from kio.schema.errors import ErrorCode
from kio.schema.fetch.v12 import request as fetch12
from kio.schema.list_offsets.v7 import request as list_offsets7
from kio.schema.metadata.v12 import request as metadata12
from kio.schema.produce.v9 import request as produce9
from kio.serial import entity_reader

from shoal.protocol.batch import build_batch
from tests.support.clients import consumer, create_topic, produce_all, producer, records_of
from tests.support.wire import RawConnection, frame, request_bytes

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

T = 10


def still_serves(b, topic: str) -> None:
    """The process is alive and a fresh librdkafka client can produce and consume."""
    b.assert_alive()
    marker = b"alive-%d" % time.monotonic_ns()
    (report,) = produce_all(producer(b.bootstrap, **{"linger.ms": 0}), topic, [{"value": marker}])
    (r,) = records_of(b.bootstrap, topic, [0], 1, start=report.offset())
    assert r.value == marker
    b.assert_alive()


@pytest.fixture(scope="module")
def probe_topic(shared_broker) -> str:
    create_topic(shared_broker.bootstrap, "probe", 1)
    return "probe"


def api_versions(**kw) -> ApiVersionsRequest:
    return ApiVersionsRequest(client_software_name="shoal-tests", client_software_version="1", **kw)


def produce_request(topic: str, parts: dict[int, bytes], acks: int = -1) -> produce9.ProduceRequest:
    return produce9.ProduceRequest(
        transactional_id=None, acks=acks, timeout=datetime.timedelta(seconds=5),
        topic_data=(produce9.TopicProduceData(name=topic, partition_data=tuple(
            produce9.PartitionProduceData(index=i, records=data) for i, data in parts.items())),),
    )


def log_end_offset(bs: str, topic: str, partition: int) -> int:
    c = consumer(bs)
    try:
        return c.get_watermark_offsets(TopicPartition(topic, partition), timeout=T)[1]
    finally:
        c.close()


@pytest.mark.parametrize("garbage", [
    b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",                 # size prefix of ~1.2 GB
    frame(os.urandom(64)),                                 # a frame of random bytes
    frame(b"\x00\x12\x00"),                                # too short for a request header
    frame(struct.pack(">hhih", 3, 12, 7, 50) + b"abc"),    # client_id longer than the frame
    frame(struct.pack(">hhih", 3, 12, 7, -1) + b"\x00" + b"\xff" * 20),  # undecodable Metadata body
    struct.pack(">i", -5) + b"abcd",                       # negative size
], ids=["http", "random-frame", "short-frame", "bad-client-id", "bad-body", "negative-size"])
def test_garbage_closes_only_that_connection(shared_broker, probe_topic, garbage):
    with RawConnection(shared_broker.bootstrap) as conn:
        conn.send(garbage)
        assert conn.is_closed_by_peer(), "the broker kept a connection that sent garbage"
    still_serves(shared_broker, probe_topic)


def test_frame_announcing_2_gib_is_refused_without_buffering(shared_broker, probe_topic):
    with RawConnection(shared_broker.bootstrap) as conn:
        conn.send(struct.pack(">i", 2**31 - 1) + b"\x00" * 1000)
        assert conn.is_closed_by_peer()
    still_serves(shared_broker, probe_topic)


def test_truncated_frame_then_close(shared_broker, probe_topic):
    full = request_bytes(api_versions(), 1)
    with RawConnection(shared_broker.bootstrap) as conn:
        conn.send(full[: len(full) // 2])
    with RawConnection(shared_broker.bootstrap) as conn:
        conn.send(struct.pack(">i", 100))  # only the size
    still_serves(shared_broker, probe_topic)


def test_unknown_api_key_closes_connection(shared_broker, probe_topic):
    with RawConnection(shared_broker.bootstrap) as conn:
        conn.send(request_bytes(api_versions(), 5, api_key=999))
        assert conn.is_closed_by_peer()
    with RawConnection(shared_broker.bootstrap) as conn:
        # A known API at a version the broker does not serve (Metadata v99).
        conn.send(frame(struct.pack(">hhih", 3, 99, 6, -1)))
        assert conn.is_closed_by_peer()
    still_serves(shared_broker, probe_topic)


@pytest.mark.parametrize("version", [5, 99, 32767])
def test_api_versions_unknown_version_gets_v0_reply(shared_broker, probe_topic, version):
    """KIP-511: reply in v0 format with UNSUPPORTED_VERSION and the list of served APIs."""
    with RawConnection(shared_broker.bootstrap) as conn:
        # The body of an unknown version cannot be known; send a v3-shaped one.
        conn.send(request_bytes(api_versions(), 4242, api_version=version))
        body = conn.read_frame()
        assert body is not None
        (cid,) = struct.unpack_from(">i", body, 0)
        assert cid == 4242
        resp, used = entity_reader(ApiVersionsResponseV0)(body, 4)
        assert 4 + used == len(body)
        assert resp.error_code == ErrorCode.unsupported_version
        assert int(resp.error_code) == 35
        keys = {k.api_key: (k.min_version, k.max_version) for k in resp.api_keys}
        assert keys[18][0] == 0 and keys[18][1] >= 3
        assert 0 in keys and 1 in keys and 3 in keys
        # The connection stays usable: the client retries with a version it knows.
        resp3 = conn.request(api_versions(), correlation_id=4243)
        assert resp3.error_code == ErrorCode.none
        assert {k.api_key for k in resp3.api_keys} == set(keys)
    still_serves(shared_broker, probe_topic)


def test_produce_with_corrupt_crc_writes_nothing(shared_broker, probe_topic, topic_name):
    bs = shared_broker.bootstrap
    create_topic(bs, topic_name, 2)
    produce_all(producer(bs), topic_name, [{"partition": 0, "value": b"first"}])
    good = build_batch([(b"k", b"good value", [], 1_700_000_000_000)])
    bad = bytearray(build_batch([(b"k", b"bad value", [], 1_700_000_000_000)]))
    bad[-3] ^= 0xFF  # a byte of the record, covered by the CRC
    with RawConnection(bs) as conn:
        resp = conn.request(produce_request(topic_name, {0: bytes(bad), 1: good}))
    (t,) = resp.responses
    by_part = {p.index: p for p in t.partition_responses}
    assert by_part[0].error_code == ErrorCode.corrupt_message
    assert int(by_part[0].error_code) == 2
    assert by_part[0].base_offset == -1
    assert by_part[1].error_code == ErrorCode.none
    assert by_part[1].base_offset == 0
    assert log_end_offset(bs, topic_name, 0) == 1
    assert log_end_offset(bs, topic_name, 1) == 1
    assert [r.value for r in records_of(bs, topic_name, [0], 1)] == [b"first"]
    assert [r.value for r in records_of(bs, topic_name, [1], 1)] == [b"good value"]
    still_serves(shared_broker, probe_topic)


@pytest.mark.parametrize("mangle", ["truncated", "bad-magic", "length-past-end", "empty"])
def test_produce_with_malformed_batch_is_corrupt_message(shared_broker, probe_topic, topic_name, mangle):
    bs = shared_broker.bootstrap
    create_topic(bs, topic_name, 1)
    batch = bytearray(build_batch([(None, b"x" * 50, [], 1_700_000_000_000)]))
    if mangle == "truncated":
        batch = batch[:-10]
    elif mangle == "bad-magic":
        batch[16] = 7
    elif mangle == "length-past-end":
        struct.pack_into(">i", batch, 8, len(batch) + 100)
    else:
        batch = bytearray()
    with RawConnection(bs) as conn:
        resp = conn.request(produce_request(topic_name, {0: bytes(batch)}))
    (p,) = resp.responses[0].partition_responses
    assert p.error_code in (ErrorCode.corrupt_message, ErrorCode.invalid_record, ErrorCode.unsupported_for_message_format)
    assert log_end_offset(bs, topic_name, 0) == 0
    still_serves(shared_broker, probe_topic)


def test_too_large_batch_is_message_too_large(shared_broker, probe_topic, topic_name):
    bs = shared_broker.bootstrap
    create_topic(bs, topic_name, 1, {"max.message.bytes": "1000"})
    big = build_batch([(None, b"x" * 5000, [], 1_700_000_000_000)])
    small = build_batch([(None, b"y" * 100, [], 1_700_000_000_000)])
    with RawConnection(bs) as conn:
        resp = conn.request(produce_request(topic_name, {0: big}))
        (p,) = resp.responses[0].partition_responses
        assert p.error_code == ErrorCode.message_too_large
        assert log_end_offset(bs, topic_name, 0) == 0
        resp = conn.request(produce_request(topic_name, {0: small}), correlation_id=2)
        (p,) = resp.responses[0].partition_responses
        assert (p.error_code, p.base_offset) == (ErrorCode.none, 0)
    still_serves(shared_broker, probe_topic)


def test_produce_to_unknown_topic_and_partition(shared_broker, probe_topic, topic_name):
    bs = shared_broker.bootstrap
    create_topic(bs, topic_name, 1)
    batch = build_batch([(None, b"v", [], 1_700_000_000_000)])
    with RawConnection(bs) as conn:
        resp = conn.request(produce_request(topic_name + "-missing", {0: batch}))
        assert resp.responses[0].partition_responses[0].error_code == ErrorCode.unknown_topic_or_partition
        resp = conn.request(produce_request(topic_name, {5: batch}), correlation_id=2)
        assert resp.responses[0].partition_responses[0].error_code == ErrorCode.unknown_topic_or_partition
    assert log_end_offset(bs, topic_name, 0) == 0
    still_serves(shared_broker, probe_topic)


def test_pipelined_requests_are_answered_in_order(shared_broker, probe_topic, topic_name):
    """Many requests written at once; a slow one (a long-poll Fetch) must not be overtaken."""
    bs = shared_broker.bootstrap
    create_topic(bs, topic_name, 1)
    slow_fetch = fetch12.FetchRequest(
        cluster_id=None, replica_id=-1, max_wait=datetime.timedelta(milliseconds=700), min_bytes=1_000_000,
        max_bytes=1_000_000, isolation_level=0, session_id=0, session_epoch=-1,
        topics=(fetch12.FetchTopic(topic=topic_name, partitions=(fetch12.FetchPartition(
            partition=0, current_leader_epoch=-1, fetch_offset=0, last_fetched_epoch=-1, log_start_offset=-1,
            partition_max_bytes=1_000_000),)),),
        forgotten_topics_data=(), rack_id="",
    )
    metadata = metadata12.MetadataRequest(topics=(metadata12.MetadataRequestTopic(name=topic_name, topic_id=None),),
                                          allow_auto_topic_creation=False, include_topic_authorized_operations=False)
    offsets = list_offsets7.ListOffsetsRequest(replica_id=-1, isolation_level=0, topics=(
        list_offsets7.ListOffsetsTopic(name=topic_name, partitions=(
            list_offsets7.ListOffsetsPartition(partition_index=0, current_leader_epoch=-1, timestamp=-1),)),))
    batch = build_batch([(None, b"pipelined", [], 1_700_000_000_000)])
    plan = [api_versions(), slow_fetch, metadata, produce_request(topic_name, {0: batch}), offsets, slow_fetch,
            api_versions()] * 3
    with RawConnection(bs, timeout_s=20) as conn:
        start = time.monotonic()
        conn.send(b"".join(request_bytes(req, 100 + i) for i, req in enumerate(plan)))
        seen = []
        for i, req in enumerate(plan):
            cid, resp = conn.read_response(type(req).__api_key__, type(req).__version__)
            seen.append(cid)
            if isinstance(req, produce9.ProduceRequest):
                p = resp.responses[0].partition_responses[0]
                assert (p.error_code, p.base_offset) == (ErrorCode.none, sum(
                    isinstance(r, produce9.ProduceRequest) for r in plan[:i]))
        assert seen == [100 + i for i in range(len(plan))]
        # The fetches returned as soon as data was there or at their deadline; never early and empty forever.
        assert time.monotonic() - start < 15
    still_serves(shared_broker, probe_topic)


def test_acks_0_produce_gets_no_response_but_is_written(shared_broker, probe_topic, topic_name):
    bs = shared_broker.bootstrap
    create_topic(bs, topic_name, 1)
    batch = build_batch([(None, b"fire and forget", [], 1_700_000_000_000)])
    with RawConnection(bs) as conn:
        conn.send(request_bytes(produce_request(topic_name, {0: batch}, acks=0), 1))
        # The next response on the connection is the ApiVersions one: acks=0 took no slot.
        resp = conn.request(api_versions(), correlation_id=2)
        assert resp.error_code == ErrorCode.none
    assert [r.value for r in records_of(bs, topic_name, [0], 1)] == [b"fire and forget"]
    still_serves(shared_broker, probe_topic)


def test_many_connections_opened_and_dropped(shared_broker, probe_topic):
    conns = [RawConnection(shared_broker.bootstrap) for _ in range(100)]
    for i, c in enumerate(conns):
        c.send(request_bytes(api_versions(), i))
    for c in conns[::2]:
        c.close()  # closed before reading the response
    for i, c in enumerate(conns[1::2]):
        cid, resp = c.read_response(18, 3)
        assert cid == 2 * i + 1 and resp.error_code == ErrorCode.none
        c.close()
    still_serves(shared_broker, probe_topic)


def test_tagged_fields_the_version_lacks_are_skipped(shared_broker, probe_topic, topic_name):
    """A newer client may add tagged fields to a version this broker serves: Kafka skips the
    ones it does not know, and so does shoal (kio's reader alone refuses the frame)."""
    create_topic(shared_broker.bootstrap, topic_name, 1)
    value = b"tagged-%d" % time.monotonic_ns()
    body = bytearray(request_bytes(produce_request(topic_name, {0: build_batch([(None, value, [], 1_700_000_000_000)])}),
                                   correlation_id=5))
    # Produce v9 ends with the partition's, the topic's and the request's tagged-field counts
    # (0 each): give the partition tag 4 (2 bytes) and the request tags 7 and 12.
    assert body[-3:] == b"\x00\x00\x00"
    body[-3:] = b"\x01\x04\x02hi" + b"\x00" + b"\x02\x07\x00\x0c\x03abc"
    body[:4] = struct.pack(">i", len(body) - 4)
    with RawConnection(shared_broker.bootstrap) as conn:
        conn.send(bytes(body))
        cid, response = conn.read_response(0, 9)
    assert cid == 5
    (part,) = response.responses[0].partition_responses
    assert part.error_code == ErrorCode.none
    (r,) = records_of(shared_broker.bootstrap, topic_name, [0], 1)
    assert r.value == value
    still_serves(shared_broker, probe_topic)
