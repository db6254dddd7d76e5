"""Batches whose CRC matches but whose records are not valid: refused, never stored.

Each poisoned batch goes to the broker as a raw Produce v9 request between valid records;
it must get CORRUPT_MESSAGE or INVALID_RECORD and leave the log untouched, so that a
classic consumer and a share group reading the topic afterwards get every valid record,
in order, none skipped. Also: a refused acks=0 produce closes its connection.
"""

from __future__ import annotations

import datetime
import gzip
import os
import struct
import time
from typing import Any

import pytest
from confluent_kafka import ShareConsumer, TopicPartition
from kio.schema.api_versions.v3.request import ApiVersionsRequest
from kio.schema.errors import ErrorCode
from kio.schema.produce.v9 import request as produce9

from shoal.protocol.batch import Compression, build_batch
from tests.support.broker import BrokerProcess
from tests.support.clients import consumer, consume_exact, create_topic, rdkafka_conf
from tests.support.wire import RawConnection, raw_batch, request_bytes

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

T = 10


def produce_request(topic: str, records: bytes, acks: int = -1) -> produce9.ProduceRequest:
    return produce9.ProduceRequest(
        transactional_id=None, acks=acks, timeout=datetime.timedelta(seconds=5),
        topic_data=(produce9.TopicProduceData(name=topic, partition_data=(
            produce9.PartitionProduceData(index=0, records=records),)),),
    )


def valid(values: list[bytes], compression: int = Compression.NONE) -> bytes:
    now = int(time.time() * 1000)
    return build_batch([(b"k", v, (("h", b"v"),), now) for v in values], compression=compression)


def records_payload(n: int) -> bytes:
    """The record bytes of an uncompressed batch of ``n`` valid records."""
    return valid([b"r%d" % i for i in range(n)])[61:]


def compress(codec: int, data: bytes) -> bytes:
    if codec == Compression.GZIP:
        return gzip.compress(data)
    if codec == Compression.SNAPPY:
        import cramjam
        return bytes(cramjam.snappy.compress_raw(data))
    if codec == Compression.LZ4:
        import lz4.frame
        return lz4.frame.compress(data)
    import zstandard
    return zstandard.ZstdCompressor().compress(data)


CONTROL = 0x20
POISON: dict[str, tuple[bytes, set[int]]] = {
    "garbage-records": (raw_batch(os.urandom(40), 3), {87}),
    "garbage-records-gzip": (raw_batch(gzip.compress(os.urandom(40)), 3, attributes=1), {87}),
    "garbage-records-zstd": (raw_batch(compress(Compression.ZSTD, os.urandom(40)), 3, attributes=4), {87}),
    "corrupt-gzip": (raw_batch(b"\x1f\x8b\x08\x00" + os.urandom(30), 2, attributes=1), {2}),
    "corrupt-snappy": (raw_batch(b"\xff\xff\xff\xff\x0f" + os.urandom(30), 2, attributes=2), {2}),
    "corrupt-lz4": (raw_batch(b"\x04\x22\x4d\x18" + os.urandom(30), 2, attributes=3), {2}),
    "corrupt-zstd": (raw_batch(b"\x28\xb5\x2f\xfd" + os.urandom(30), 2, attributes=4), {2}),
    "codec-5": (raw_batch(records_payload(2), 2, attributes=5), {2}),
    "codec-7": (raw_batch(records_payload(2), 2, attributes=7), {2}),
    "count-too-large": (raw_batch(records_payload(3), 5), {87}),
    "count-too-large-lz4": (raw_batch(compress(Compression.LZ4, records_payload(3)), 5, attributes=3), {87}),
    "count-too-small": (raw_batch(records_payload(3), 2), {87}),
    "control-batch": (raw_batch(records_payload(1), 1, attributes=CONTROL), {87}),
    "offset-delta-mismatch": (raw_batch(records_payload(3), 3, last_offset_delta=7), {87}),
}


def send_poison(bootstrap: str, topic: str) -> dict[str, Any]:
    """Send every poisoned batch; return each one's partition response."""
    out = {}
    with RawConnection(bootstrap) as conn:
        for i, (name, (batch, _)) in enumerate(POISON.items()):
            resp = conn.request(produce_request(topic, batch), correlation_id=100 + i)
            (pr,) = resp.responses[0].partition_responses
            out[name] = pr
    return out


def log_end_offset(bootstrap: str, topic: str) -> int:
    c = consumer(bootstrap)
    try:
        return c.get_watermark_offsets(TopicPartition(topic, 0), timeout=T)[1]
    finally:
        c.close()


@pytest.fixture(scope="module")
def poisoned_topic(shared_broker: BrokerProcess) -> tuple[str, str, list[bytes]]:
    """A topic holding valid records with every poisoned batch sent in between."""
    bs = shared_broker.bootstrap
    topic = "poisoned"
    create_topic(bs, topic, 1)
    expected: list[bytes] = []
    with RawConnection(bs) as conn:
        for j, codec in enumerate((Compression.NONE, Compression.GZIP, Compression.LZ4)):
            values = [b"before-%d-%d" % (j, i) for i in range(5)]
            resp = conn.request(produce_request(topic, valid(values, codec)), correlation_id=j + 1)
            assert resp.responses[0].partition_responses[0].error_code == ErrorCode.none
            expected += values
    responses = send_poison(bs, topic)
    for name, pr in responses.items():
        assert pr.error_code in POISON[name][1], f"{name}: {pr.error_code!r} ({pr.error_message})"
        assert pr.base_offset == -1, name
    with RawConnection(bs) as conn:
        for j, codec in enumerate((Compression.ZSTD, Compression.SNAPPY, Compression.NONE)):
            values = [b"after-%d-%d" % (j, i) for i in range(5)]
            resp = conn.request(produce_request(topic, valid(values, codec)), correlation_id=j + 10)
            assert resp.responses[0].partition_responses[0].error_code == ErrorCode.none
            expected += values
    return bs, topic, expected


def test_every_poisoned_batch_is_refused_and_not_stored(poisoned_topic: tuple[str, str, list[bytes]]) -> None:
    bs, topic, expected = poisoned_topic
    assert log_end_offset(bs, topic) == len(expected)


def test_record_errors_name_the_record_at_fault(shared_broker: BrokerProcess) -> None:
    bs = shared_broker.bootstrap
    create_topic(bs, "record-errors", 1)
    payload = bytearray(records_payload(4))
    # make the third record's offset delta wrong: records are [len][attr][ts][offset delta]...
    pos = 0
    for _ in range(2):
        pos += 1 + (payload[pos] >> 1)
    assert payload[pos + 3] == 2 << 1
    payload[pos + 3] = 9 << 1
    with RawConnection(bs) as conn:
        resp = conn.request(produce_request("record-errors", raw_batch(bytes(payload), 4)))
    (pr,) = resp.responses[0].partition_responses
    assert pr.error_code == ErrorCode.invalid_record
    assert [e.batch_index for e in pr.record_errors] == [2]
    with RawConnection(bs) as conn:
        resp = conn.request(produce_request("record-errors", raw_batch(records_payload(3), 5)))
    (pr,) = resp.responses[0].partition_responses
    assert pr.error_code == ErrorCode.invalid_record
    assert [e.batch_index for e in pr.record_errors] == [3]
    assert log_end_offset(bs, "record-errors") == 0


def test_classic_consumer_gets_every_valid_record(poisoned_topic: tuple[str, str, list[bytes]]) -> None:
    bs, topic, expected = poisoned_topic
    c = consumer(bs)
    try:
        c.assign([TopicPartition(topic, 0, 0)])
        got = consume_exact(c, len(expected), timeout_s=20)
    finally:
        c.close()
    assert [r.value for r in got] == expected
    assert [r.offset for r in got] == list(range(len(expected)))


def test_share_group_gets_every_valid_record(poisoned_topic: tuple[str, str, list[bytes]]) -> None:
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

    from tests.support.clients import admin_client

    bs, topic, expected = poisoned_topic
    res = ConfigResource(ResourceType.GROUP, "poison-share", incremental_configs=[
        ConfigEntry("share.auto.offset.reset", "earliest", incremental_operation=AlterConfigOpType.SET)])
    admin = admin_client(bs)
    admin.incremental_alter_configs([res])[res].result(timeout=T)
    c = ShareConsumer(rdkafka_conf(bs, **{"group.id": "poison-share"}))
    try:
        c.subscribe([topic])
        seen: dict[int, bytes] = {}
        deadline = time.monotonic() + 30
        while len(seen) < len(expected) and time.monotonic() < deadline:
            for m in c.poll(0.5):
                if m.error() is None:
                    seen[m.offset()] = m.value()
        c.commit_sync()
    finally:
        c.close()
    assert [seen[o] for o in sorted(seen)] == expected
    assert sorted(seen) == list(range(len(expected)))


def test_refused_acks0_produce_closes_the_connection(shared_broker: BrokerProcess) -> None:
    bs = shared_broker.bootstrap
    create_topic(bs, "acks0", 1)
    with RawConnection(bs) as conn:
        conn.send(request_bytes(produce_request("acks0", valid([b"ok"]), acks=0), 1))
        assert not conn.is_closed_by_peer(1.0), "a valid acks=0 produce closed the connection"
        conn.send(request_bytes(produce_request("acks0", raw_batch(records_payload(3), 5), acks=0), 2))
        assert conn.is_closed_by_peer(), "a refused acks=0 produce left the connection open"
    with RawConnection(bs) as conn:
        conn.send(request_bytes(produce_request("acks0", raw_batch(b"\x28\xb5\x2f\xfd" + os.urandom(30), 2,
                                                                   attributes=4), acks=0), 3))
        assert conn.is_closed_by_peer(), "a refused compressed acks=0 produce left the connection open"
    assert log_end_offset(bs, "acks0") == 1


def test_bytes_after_a_request_body_are_ignored_as_kafka_does(shared_broker: BrokerProcess) -> None:
    """Kafka's parser reads the body and ignores what follows; librdkafka relies on it.

    The frame is the one confluent-kafka's AdminClient.list_topics sends (Metadata v12,
    client id "rdkafka", three bytes after the body); closing it would break that client.
    """
    frame_body = bytes.fromhex("0003000c00000004000772646b61666b610000000000010000")
    with RawConnection(shared_broker.bootstrap) as conn:
        conn.send(struct.pack(">i", len(frame_body)) + frame_body)
        body = conn.read_frame()
        assert body is not None and struct.unpack_from(">i", body, 0)[0] == 4
    req = request_bytes(ApiVersionsRequest(client_software_name="t", client_software_version="1"), 7)
    body = req[4:] + b"\x00\x01\x02"
    with RawConnection(shared_broker.bootstrap) as conn:
        conn.send(struct.pack(">i", len(body)) + body)
        assert conn.read_frame() is not None
    shared_broker.assert_alive()


def test_pipelined_compressed_and_plain_produces_keep_their_order(shared_broker: BrokerProcess) -> None:
    """Compressed batches are validated in a worker thread; later plain ones must not overtake them."""
    bs = shared_broker.bootstrap
    create_topic(bs, "ordering", 1)
    codecs = [Compression.ZSTD, Compression.NONE, Compression.GZIP, Compression.NONE, Compression.LZ4,
              Compression.NONE] * 3
    expected: list[bytes] = []
    with RawConnection(bs) as conn:
        for i, codec in enumerate(codecs):
            values = [b"%d-%d-" % (i, j) + b"x" * 200 for j in range(2000 if codec else 3)]
            expected += values
            conn.send(request_bytes(produce_request("ordering", valid(values, codec)), 1000 + i))
        offsets = []
        for i in range(len(codecs)):
            cid, resp = conn.read_response(0, 9)
            assert cid == 1000 + i
            pr = resp.responses[0].partition_responses[0]
            assert pr.error_code == ErrorCode.none
            offsets.append(pr.base_offset)
    assert offsets == sorted(offsets)
    c = consumer(bs)
    try:
        c.assign([TopicPartition("ordering", 0, 0)])
        got = consume_exact(c, len(expected), timeout_s=30)
    finally:
        c.close()
    assert [r.value for r in got] == expected


def test_a_connection_closed_during_validation_does_not_block_the_partition(shared_broker: BrokerProcess) -> None:
    bs = shared_broker.bootstrap
    create_topic(bs, "closed-early", 1)
    big = valid([b"v%d" % i * 50 for i in range(5000)], Compression.GZIP)
    with RawConnection(bs) as conn:
        conn.send(request_bytes(produce_request("closed-early", big), 1))
    with RawConnection(bs) as conn:
        resp = conn.request(produce_request("closed-early", valid([b"after"])), correlation_id=2)
        assert resp.responses[0].partition_responses[0].error_code == ErrorCode.none
    assert log_end_offset(bs, "closed-early") == 5001


def record_start(payload: bytes, index: int) -> int:
    """Where record ``index`` starts in uncompressed record bytes (lengths of one or two bytes)."""
    pos = 0
    for _ in range(index):
        b = payload[pos]
        length, width = (b >> 1, 1) if b < 0x80 else ((((b & 0x7F) | (payload[pos + 1] << 7)) >> 1), 2)
        pos += width + length
    return pos


def test_a_bad_record_deep_in_one_partition_of_a_multi_partition_request(shared_broker: BrokerProcess) -> None:
    """One Produce request, four partitions of 300 producer-shaped records each (the shape
    the run walk checks a byte column at a time): a wrong offset delta at record 250 of
    one partition and a value length that overruns record 120 of another are found and
    named by index; those two partitions store nothing, the other two everything."""
    bs = shared_broker.bootstrap
    topic = "multi-batch"
    create_topic(bs, topic, 4)
    now = int(time.time() * 1000)
    good = build_batch([(None, b"v" * 200, (), now + i // 40) for i in range(300)])
    payload = good[61:]
    bad_offset = bytearray(payload)
    at = record_start(payload, 250)
    # [length: 2 bytes][attributes][timestamp delta: 1 byte][offset delta: 2 bytes from 64]
    assert bad_offset[at + 4 : at + 6] == bytes([(500 & 0x7F) | 0x80, 500 >> 7])
    bad_offset[at + 4] = (502 & 0x7F) | 0x80
    bad_value = bytearray(payload)
    at = record_start(payload, 120)
    # then [key length: null][value length: 200, two bytes]
    assert bad_value[at + 6 : at + 9] == bytes([1, (400 & 0x7F) | 0x80, 400 >> 7])
    bad_value[at + 7] = (404 & 0x7F) | 0x80
    batches = {0: good, 1: raw_batch(bytes(bad_offset), 300, base_timestamp=now, max_timestamp=now + 7),
               2: raw_batch(bytes(bad_value), 300, base_timestamp=now, max_timestamp=now + 7), 3: good}
    request = produce9.ProduceRequest(
        transactional_id=None, acks=-1, timeout=datetime.timedelta(seconds=5),
        topic_data=(produce9.TopicProduceData(name=topic, partition_data=tuple(
            produce9.PartitionProduceData(index=i, records=b) for i, b in batches.items())),),
    )
    with RawConnection(bs) as conn:
        resp = conn.request(request)
    got = {pr.index: pr for pr in resp.responses[0].partition_responses}
    assert [got[i].error_code for i in range(4)] == [ErrorCode.none, ErrorCode.invalid_record,
                                                     ErrorCode.invalid_record, ErrorCode.none]
    assert [e.batch_index for e in got[1].record_errors] == [250]
    assert [e.batch_index for e in got[2].record_errors] == [120]
    c = consumer(bs)
    try:
        ends = [c.get_watermark_offsets(TopicPartition(topic, i), timeout=T)[1] for i in range(4)]
    finally:
        c.close()
    assert ends == [300, 0, 0, 300]
