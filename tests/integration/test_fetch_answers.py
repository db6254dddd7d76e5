"""The exact bytes of Fetch, ListOffsets and OffsetsForLeaderEpoch answers, every version.

Each answer's body must be byte for byte kio's encoding of the entity the test expects
for that version (every field spelled out here), so a change in how the handlers build
their answers cannot change what a client receives.
"""

from __future__ import annotations

import datetime
import io
import uuid
from typing import Any

import pytest
from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode
from kio.serial import entity_writer

from shoal.protocol.batch import build_batch, read_header
from shoal.protocol.entities import has_field, make, sub
from tests.support.clients import create_topic
from tests.support.wire import RawConnection, request_bytes

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def _versions(api_key: int, lo: int, hi: int) -> list[tuple[int, type]]:
    return [(v, load_request_schema(api_key, v)) for v in range(lo, hi + 1)]


def _answer(conn: RawConnection, request: Any, cid: int) -> tuple[bytes, Any]:
    """The response body after its header, and kio's response class for the version."""
    conn.send(request_bytes(request, cid))
    body = conn.read_frame()
    assert body is not None
    rcls = load_response_schema(type(request).__api_key__, type(request).__version__)
    start = 5 if rcls.__flexible__ else 4
    assert int.from_bytes(body[:4], "big") == cid
    return body[start:], rcls


def _encoded(entity: Any) -> bytes:
    buf = io.BytesIO()
    entity_writer(type(entity))(buf, entity)
    return buf.getvalue()


def _produce(conn: RawConnection, topic: str, i: int) -> None:
    cls = load_request_schema(0, 9)
    batch = build_batch([(b"k%d" % i, b"value %d" % i, [("h", b"%d" % i)], 1_700_000_000_000 + i)])
    resp = conn.request(make(cls, transactional_id=None, acks=-1, timeout=datetime.timedelta(seconds=5),
                             topic_data=(make(sub(cls, "TopicProduceData"), name=topic, partition_data=(
                                 make(sub(cls, "PartitionProduceData"), index=0, records=batch),)),)))
    assert resp.responses[0].partition_responses[0].error_code == ErrorCode.none


def _topic_id(conn: RawConnection, topic: str) -> uuid.UUID:
    cls = load_request_schema(3, 12)
    resp = conn.request(make(cls, topics=(make(sub(cls, "MetadataRequestTopic"), name=topic),),
                             allow_auto_topic_creation=False))
    return resp.topics[0].topic_id


def _fetch(cls: type, topic: str, topic_id: uuid.UUID, offset: int, *, session_id: int = 0, session_epoch: int = -1,
           max_wait_ms: int = 10) -> Any:
    part = make(sub(cls, "FetchPartition"), partition=0, current_leader_epoch=-1, fetch_offset=offset,
                last_fetched_epoch=-1, log_start_offset=-1, partition_max_bytes=1 << 20)
    fields: dict[str, Any] = dict(replica_id=-1, max_wait=datetime.timedelta(milliseconds=max_wait_ms), min_bytes=1,
                                  max_bytes=1 << 20, isolation_level=0, session_id=session_id,
                                  session_epoch=session_epoch, forgotten_topics_data=(), rack_id="",
                                  topics=(make(sub(cls, "FetchTopic"), topic=topic, topic_id=topic_id,
                                               partitions=(part,)),))
    if has_field(cls, "replica_state"):
        fields["replica_state"] = make(sub(cls, "ReplicaState"), replica_id=-1, replica_epoch=-1)
    return make(cls, **fields)


def _fetch_answer(rcls: type, topic: str, topic_id: uuid.UUID, partitions: tuple[Any, ...], session_id: int = 0,
                  error_code: ErrorCode = ErrorCode.none) -> Any:
    tcls = sub(rcls, "FetchableTopicResponse")
    topics = (make(tcls, topic=topic, topic_id=topic_id, partitions=partitions),) if partitions else ()
    return make(rcls, throttle_time=datetime.timedelta(0), error_code=error_code, session_id=session_id,
                responses=topics)


def _partition(rcls: type, error_code: ErrorCode, hw: int, lso: int, log_start: int, records: bytes) -> Any:
    return make(sub(rcls, "PartitionData"), partition_index=0, error_code=error_code, high_watermark=hw,
                last_stable_offset=lso, log_start_offset=log_start, aborted_transactions=None,
                preferred_read_replica=-1, records=records)


def test_fetch_answers_every_version(broker, topic_name):
    bs = broker.bootstrap
    create_topic(bs, topic_name, 1)
    with RawConnection(bs) as conn:
        for i in range(2):
            _produce(conn, topic_name, i)
        topic_id = _topic_id(conn, topic_name)
        records: bytes | None = None
        for v, cls in _versions(1, 4, 17):
            # a full fetch without a session: both batches
            body, rcls = _answer(conn, _fetch(cls, topic_name, topic_id, 0), 100 + v)
            if records is None:
                (t,) = _decode(rcls, body).responses
                records = bytes(t.partitions[0].records)
                pos, offsets = 0, []
                while pos < len(records):
                    h = read_header(records, pos)
                    offsets.append(h.base_offset)
                    pos += h.size
                assert offsets == [0, 1]
            expected = _fetch_answer(rcls, topic_name, topic_id,
                                     (_partition(rcls, ErrorCode.none, 2, 2, 0, records),))
            assert body == _encoded(expected), v

            # at the log end: an empty long poll that times out
            body, rcls = _answer(conn, _fetch(cls, topic_name, topic_id, 2), 200 + v)
            assert body == _encoded(_fetch_answer(rcls, topic_name, topic_id,
                                                  (_partition(rcls, ErrorCode.none, 2, 2, 0, b""),))), v

            # a partition the topic does not have
            req = _fetch(cls, topic_name, topic_id, 0)
            req = _with_partition(req, 5)
            body, rcls = _answer(conn, req, 300 + v)
            bad = make(sub(rcls, "PartitionData"), partition_index=5, error_code=ErrorCode.unknown_topic_or_partition,
                       high_watermark=-1, last_stable_offset=-1, log_start_offset=-1, aborted_transactions=None,
                       preferred_read_replica=-1, records=b"")
            assert body == _encoded(_fetch_answer(rcls, topic_name, topic_id, (bad,))), v

            if v < 7:
                continue
            # a new session (its id is the broker's), then an incremental fetch with nothing new
            body, rcls = _answer(conn, _fetch(cls, topic_name, topic_id, 0, session_epoch=0), 400 + v)
            session_id = _decode(rcls, body).session_id
            assert session_id > 0
            assert body == _encoded(_fetch_answer(rcls, topic_name, topic_id, (
                _partition(rcls, ErrorCode.none, 2, 2, 0, records),), session_id=session_id)), v
            body, rcls = _answer(conn, _fetch(cls, topic_name, topic_id, 2, session_id=session_id, session_epoch=1),
                                 500 + v)
            # no records, the same high watermark and log start: the partition is not listed
            assert body == _encoded(_fetch_answer(rcls, topic_name, topic_id, (), session_id=session_id)), v
            body, rcls = _answer(conn, _fetch_incremental(cls, session_id, 2), 600 + v)
            assert body == _encoded(_fetch_answer(rcls, topic_name, topic_id, (), session_id=session_id)), v
            # an unknown session
            body, rcls = _answer(conn, _fetch(cls, topic_name, topic_id, 0, session_id=2**31 - 7, session_epoch=1),
                                 700 + v)
            assert body == _encoded(_fetch_answer(rcls, topic_name, topic_id, (),
                                                  error_code=ErrorCode.fetch_session_id_not_found)), v

        # an unknown topic id (v13+)
        for v, cls in _versions(1, 13, 17):
            unknown = uuid.uuid4()
            body, rcls = _answer(conn, _fetch(cls, topic_name, unknown, 0, max_wait_ms=5000), 800 + v)
            part = make(sub(rcls, "PartitionData"), partition_index=0, error_code=ErrorCode.unknown_topic_id,
                        high_watermark=-1, last_stable_offset=-1, log_start_offset=-1, aborted_transactions=None,
                        preferred_read_replica=-1, records=b"")
            assert body == _encoded(_fetch_answer(rcls, topic_name, unknown, (part,))), v


def _decode(rcls: type, body: bytes) -> Any:
    from kio.serial import entity_reader

    value, used = entity_reader(rcls)(body, 0)
    assert used == len(body)
    return value


def _with_partition(req: Any, index: int) -> Any:
    import dataclasses

    (t,) = req.topics
    return dataclasses.replace(req, topics=(dataclasses.replace(t, partitions=(
        dataclasses.replace(t.partitions[0], partition=index),)),))


def _fetch_incremental(cls: type, session_id: int, epoch: int) -> Any:
    import dataclasses

    req = _fetch(cls, "unused", uuid.uuid4(), 0, session_id=session_id, session_epoch=epoch)
    return dataclasses.replace(req, topics=())


def test_list_offsets_and_leader_epoch_answers_every_version(broker, topic_name):
    bs = broker.bootstrap
    create_topic(bs, topic_name, 1)
    with RawConnection(bs) as conn:
        for i in range(3):
            _produce(conn, topic_name, i)
        for v, cls in _versions(2, 1, 10):
            tcls, pcls = sub(cls, "ListOffsetsTopic"), sub(cls, "ListOffsetsPartition")
            for spec, (offset, ts) in ((-1, (3, -1)), (-2, (0, -1)), (-3, (2, 1_700_000_000_002)),
                                       (1_700_000_000_001, (1, 1_700_000_000_001))):
                req = make(cls, replica_id=-1, isolation_level=0, timeout=datetime.timedelta(seconds=5), topics=(
                    make(tcls, name=topic_name, partitions=(
                        make(pcls, partition_index=0, current_leader_epoch=-1, timestamp=spec),
                        make(pcls, partition_index=3, current_leader_epoch=-1, timestamp=spec))),
                    make(tcls, name=topic_name + "-none", partitions=(
                        make(pcls, partition_index=0, current_leader_epoch=-1, timestamp=spec),))))
                body, rcls = _answer(conn, req, 100 + v)
                rt, rp = sub(rcls, "ListOffsetsTopicResponse"), sub(rcls, "ListOffsetsPartitionResponse")
                missing = ErrorCode.unknown_topic_or_partition
                expected = make(rcls, throttle_time=datetime.timedelta(0), topics=(
                    make(rt, name=topic_name, partitions=(
                        make(rp, partition_index=0, error_code=ErrorCode.none, timestamp=ts, offset=offset,
                             leader_epoch=0),
                        make(rp, partition_index=3, error_code=missing, timestamp=-1, offset=-1, leader_epoch=-1))),
                    make(rt, name=topic_name + "-none", partitions=(
                        make(rp, partition_index=0, error_code=missing, timestamp=-1, offset=-1, leader_epoch=-1),))))
                assert body == _encoded(expected), (v, spec)

        for v, cls in _versions(23, 2, 4):
            tcls, pcls = sub(cls, "OffsetForLeaderTopic"), sub(cls, "OffsetForLeaderPartition")
            req = make(cls, replica_id=-1, topics=(make(tcls, topic=topic_name, partitions=(
                make(pcls, partition=0, current_leader_epoch=-1, leader_epoch=0),
                make(pcls, partition=0, current_leader_epoch=3, leader_epoch=0),
                make(pcls, partition=0, current_leader_epoch=-1, leader_epoch=-1),
                make(pcls, partition=2, current_leader_epoch=-1, leader_epoch=0))),))
            body, rcls = _answer(conn, req, 200 + v)
            rt, rp = sub(rcls, "OffsetForLeaderTopicResult"), sub(rcls, "EpochEndOffset")
            expected = make(rcls, throttle_time=datetime.timedelta(0), topics=(make(rt, topic=topic_name, partitions=(
                make(rp, partition=0, error_code=ErrorCode.none, leader_epoch=0, end_offset=3),
                make(rp, partition=0, error_code=ErrorCode.unknown_leader_epoch, leader_epoch=-1, end_offset=-1),
                make(rp, partition=0, error_code=ErrorCode.none, leader_epoch=-1, end_offset=-1),
                make(rp, partition=2, error_code=ErrorCode.unknown_topic_or_partition, leader_epoch=-1,
                     end_offset=-1))),))
            assert body == _encoded(expected), v
