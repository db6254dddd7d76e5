"""The follower's Fetch v12 response reader against kio's writer and reader."""

from __future__ import annotations

import datetime
import io

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.serial import entity_reader, entity_writer

from shoal.errors import ErrorCode, ProtocolViolation
from shoal.protocol.codec import codec_for
from shoal.protocol.entities import make, sub
from shoal.protocol.fetch_response import read_fetch_response_v12

RESPONSE = codec_for(1, 12).response_type  # type: ignore[union-attr]
TOPIC, PART = sub(RESPONSE, "FetchableTopicResponse"), sub(RESPONSE, "PartitionData")
ABORTED, EPOCH = sub(PART, "AbortedTransaction"), sub(PART, "EpochEndOffset")

partitions = st.builds(
    dict,
    partition_index=st.integers(0, 2**31 - 1),
    error_code=st.sampled_from([ErrorCode.none, ErrorCode.not_leader_or_follower, ErrorCode.offset_out_of_range]),
    high_watermark=st.integers(-1, 2**63 - 1),
    last_stable_offset=st.integers(-1, 2**40),
    log_start_offset=st.integers(-1, 2**63 - 1),
    aborted=st.one_of(st.none(), st.lists(st.tuples(st.integers(0, 2**40), st.integers(0, 2**40)), max_size=3)),
    diverging=st.one_of(st.none(), st.tuples(st.integers(0, 1000), st.integers(0, 2**40))),
    preferred_read_replica=st.integers(-1, 5),
    records=st.one_of(st.none(), st.binary(max_size=300)),
)
topics = st.lists(st.tuples(st.text(min_size=1, max_size=20), st.lists(partitions, max_size=4)), max_size=4)


def encode(error_code: ErrorCode, spec: list) -> bytes:
    tops = []
    for name, parts in spec:
        ps = []
        for p in parts:
            fields = dict(p)
            aborted = fields.pop("aborted")
            diverging = fields.pop("diverging")
            extra = {}
            if diverging is not None:
                extra["diverging_epoch"] = make(EPOCH, epoch=diverging[0], end_offset=diverging[1])
            ps.append(make(PART, aborted_transactions=None if aborted is None else tuple(
                make(ABORTED, producer_id=a, first_offset=b) for a, b in aborted), **fields, **extra))
        tops.append(make(TOPIC, topic=name, partitions=tuple(ps)))
    buf = io.BytesIO()
    entity_writer(RESPONSE)(buf, make(RESPONSE, throttle_time=datetime.timedelta(milliseconds=3),
                                      error_code=error_code, session_id=7, responses=tuple(tops)))
    return buf.getvalue()


@settings(max_examples=200, deadline=None)
@given(st.sampled_from([ErrorCode.none, ErrorCode.unknown_server_error]), topics)
def test_reads_what_kio_reads_with_records_as_views(error_code: ErrorCode, spec: list) -> None:
    data = bytearray(encode(error_code, spec))
    code, parts = read_fetch_response_v12(memoryview(data).toreadonly())
    want, _ = entity_reader(RESPONSE)(bytes(data), 0)
    assert code == want.error_code
    assert [(p.topic, p.partition_index, p.error_code, p.high_watermark, p.log_start_offset,
             None if p.records is None else bytes(p.records)) for p in parts] == [
        (t.topic, q.partition_index, q.error_code, q.high_watermark, q.log_start_offset, q.records)
        for t in want.responses for q in t.partitions]
    for p in parts:  # views of the frame, not copies
        if p.records:
            assert p.records.obj is data


def test_a_truncated_response_is_a_protocol_violation() -> None:
    data = encode(ErrorCode.none, [("t", [dict(partition_index=0, error_code=ErrorCode.none, high_watermark=5,
                                               last_stable_offset=5, log_start_offset=0, aborted=[(1, 2)],
                                               diverging=(3, 4), preferred_read_replica=-1,
                                               records=b"x" * 100)])])
    read_fetch_response_v12(memoryview(data))
    for cut in (3, 12, 20, 40, 60, len(data) - 50, len(data) - 1):
        with pytest.raises(ProtocolViolation):
            read_fetch_response_v12(memoryview(data[:cut]))


# -- the writer ---------------------------------------------------------------------

answers = st.lists(st.tuples(st.integers(0, 2**31 - 1), st.sampled_from([0, 1, 3, 6, 74]),
                             st.integers(-1, 2**63 - 1), st.integers(-1, 2**63 - 1), st.integers(-1, 2**63 - 1),
                             st.binary(max_size=300)), max_size=4)


@settings(max_examples=100, deadline=None)
@pytest.mark.parametrize("version", range(12, 18))
@given(error_code=st.sampled_from([0, 70]), session_id=st.integers(0, 2**31 - 1),
       spec=st.lists(st.tuples(st.one_of(st.text(min_size=1, max_size=20), st.uuids()), answers), max_size=4))
def test_the_writer_writes_what_kio_writes(version: int, error_code: int, session_id: int, spec: list) -> None:
    import uuid

    from shoal.protocol.fetch_response import write_fetch_response

    cls = codec_for(1, version).response_type  # type: ignore[union-attr]
    tcls, pcls = sub(cls, "FetchableTopicResponse"), sub(cls, "PartitionData")
    topics = []
    entities = []
    for name, parts in spec:
        if version >= 13:
            topic_id = name if isinstance(name, uuid.UUID) else uuid.uuid5(uuid.NAMESPACE_DNS, name)
            topics.append((topic_id.bytes, parts))
            naming = {"topic_id": topic_id}
        else:
            text = name if isinstance(name, str) else str(name)
            topics.append((text, parts))
            naming = {"topic": text}
        entities.append(make(tcls, partitions=tuple(
            make(pcls, partition_index=i, error_code=ErrorCode(code), high_watermark=hw, last_stable_offset=lso,
                 log_start_offset=start, aborted_transactions=None, preferred_read_replica=-1, records=records)
            for i, code, hw, lso, start, records in parts), **naming))
    out = io.BytesIO()
    entity_writer(cls)(out, make(cls, throttle_time=0, error_code=ErrorCode(error_code), session_id=session_id,
                                  responses=tuple(entities)))
    pieces = write_fetch_response(version, error_code, session_id, topics)
    assert b"".join(bytes(p) for p in pieces) == out.getvalue()
    records = [r for _, parts in spec for *_, r in parts if r]
    assert [p for p in pieces if type(p) is bytes and p in records] or not records  # records stay pieces
