"""Produce answers, byte for byte, on old and new versions (raw wire requests).

Each answer must be exactly kio's encoding of what it says (the broker packs most of
them itself, see protocol/produce_response.py), and say what Kafka answers: offsets,
the append time of LogAppendTime topics, the log start offset (v5+), the record at
fault (v8+), errors that refuse the request as a whole, and none at all for acks=0.
"""

from __future__ import annotations

import datetime
import importlib
import time

import pytest
from kio.schema.errors import ErrorCode

from shoal.protocol.batch import Compression, build_batch
from tests.support.clients import create_topic
from tests.support.wire import RawConnection, request_bytes

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

VERSIONS = (3, 4, 5, 7, 8, 9, 11, 12)
TS = 1_700_000_000_000


def _modules(version: int):
    return (importlib.import_module(f"kio.schema.produce.v{version}.request"),
            importlib.import_module(f"kio.schema.produce.v{version}.response"))


def _request(version: int, topics: dict[str, dict[int, bytes]], acks: int = -1, txn_id: str | None = None):
    req, _ = _modules(version)
    return req.ProduceRequest(
        transactional_id=txn_id, acks=acks, timeout=datetime.timedelta(seconds=10),
        topic_data=tuple(req.TopicProduceData(name=name, partition_data=tuple(
            req.PartitionProduceData(index=i, records=data) for i, data in parts.items()))
            for name, parts in topics.items()))


def _exchange(conn: RawConnection, version: int, entity, correlation_id: int):
    """Send; return the decoded answer, after checking its body is kio's encoding of it."""
    conn.send(request_bytes(entity, correlation_id))
    return _read(conn, version, correlation_id)


def _read(conn: RawConnection, version: int, correlation_id: int):
    return conn.read_canonical(0, version, correlation_id)


def _said(version: int, answer) -> list[tuple]:
    """Per partition: what the version carries of it."""
    out = []
    for t in answer.responses:
        for p in t.partition_responses:
            row = [t.name, p.index, p.error_code, p.base_offset, p.log_append_time]
            if version >= 5:
                row.append(p.log_start_offset)
            if version >= 8:
                row += [tuple((e.batch_index, e.batch_index_error_message) for e in p.record_errors),
                        p.error_message]
            out.append(tuple(row))
    assert answer.throttle_time == datetime.timedelta(0)
    return out


def _batch(*values: bytes, keys: list[bytes | None] | None = None, transactional: bool = False,
           producer_id: int = -1, compression: int = Compression.NONE) -> bytes:
    keys = keys or [None] * len(values)
    return build_batch([(k, v, [], TS) for k, v in zip(keys, values, strict=True)], transactional=transactional,
                       compression=compression,
                       producer_id=producer_id, producer_epoch=0 if producer_id >= 0 else -1,
                       base_sequence=0 if producer_id >= 0 else -1)


@pytest.fixture(scope="module")
def topics(shared_broker) -> dict[str, str]:
    bs = shared_broker.bootstrap
    names = {"plain": "answers-plain", "append_time": "answers-append-time", "compact": "answers-compact"}
    create_topic(bs, names["plain"], 2)
    create_topic(bs, names["append_time"], 1, {"message.timestamp.type": "LogAppendTime"})
    create_topic(bs, names["compact"], 1, {"cleanup.policy": "compact"})
    return names


@pytest.mark.parametrize("version", VERSIONS)
def test_one_partition_and_two(shared_broker, topics, version):
    plain = topics["plain"]
    with RawConnection(shared_broker.bootstrap) as conn:
        first = _exchange(conn, version, _request(version, {plain: {0: _batch(b"a")}}), 1)
        (row,) = _said(version, first)
        base = row[3]
        assert row[:5] == (plain, 0, ErrorCode.none, base, None)
        assert row[5:] == ((0,) if version >= 5 else ()) + (((), None) if version >= 8 else ())
        two = _exchange(conn, version, _request(version, {plain: {0: _batch(b"b", b"c"), 1: _batch(b"d")}}), 2)
        rows = _said(version, two)
    assert [r[:4] for r in rows] == [(plain, 0, ErrorCode.none, base + 1), (plain, 1, ErrorCode.none, rows[1][3])]
    assert all(r[4] is None for r in rows)


@pytest.mark.parametrize("version", VERSIONS)
def test_compressed_batches_keep_their_order(shared_broker, topics, version):
    """Compressed batches are validated in a worker thread; a plain one sent after them
    to the same partition is appended (and answered) after them."""
    plain = topics["plain"]
    gz = _batch(b"g" * 300, b"h" * 300, compression=Compression.GZIP)
    with RawConnection(shared_broker.bootstrap) as conn:
        conn.send(request_bytes(_request(version, {plain: {1: gz}}), 1))
        conn.send(request_bytes(_request(version, {plain: {1: _batch(b"after")}}), 2))
        conn.send(request_bytes(_request(version, {plain: {1: gz, 0: _batch(b"other")}}), 3))
        answers = [_said(version, _read(conn, version, cid)) for cid in (1, 2, 3)]
    (first,), (second,), (third, other) = answers
    assert [r[2] for r in (first, second, third, other)] == [ErrorCode.none] * 4
    assert second[3] == first[3] + 2 and third[3] == second[3] + 1
    assert other[:2] == (plain, 0)


@pytest.mark.parametrize("version", VERSIONS)
def test_log_append_time_is_answered(shared_broker, topics, version):
    before = datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=5)
    with RawConnection(shared_broker.bootstrap) as conn:
        answer = _exchange(conn, version, _request(version, {topics["append_time"]: {0: _batch(b"x")}}), 1)
    (row,) = _said(version, answer)
    assert row[2] == ErrorCode.none
    assert row[4] is not None and before <= row[4] <= datetime.datetime.now(datetime.UTC) + datetime.timedelta(5)


@pytest.mark.parametrize("version", VERSIONS)
def test_errors_per_partition(shared_broker, topics, version):
    """A record without a key on a compacted topic (INVALID_RECORD, the record's index
    from v8), an unknown topic and partition, next to a partition that is written."""
    plain, compact = topics["plain"], topics["compact"]
    request = _request(version, {
        compact: {0: _batch(b"v1", b"v2", keys=[b"k", None])},
        plain: {1: _batch(b"ok"), 7: _batch(b"nowhere")},
        "answers-missing": {0: _batch(b"lost")},
    })
    with RawConnection(shared_broker.bootstrap) as conn:
        rows = _said(version, _exchange(conn, version, request, 1))
    assert [r[:3] for r in rows] == [
        (compact, 0, ErrorCode.invalid_record), (plain, 1, ErrorCode.none),
        (plain, 7, ErrorCode.unknown_topic_or_partition), ("answers-missing", 0, ErrorCode.unknown_topic_or_partition)]
    assert [r[3] for r in rows if r[2] != ErrorCode.none] == [-1, -1, -1]
    if version >= 8:
        record_errors, message = rows[0][6], rows[0][7]
        assert [i for i, _ in record_errors] == [1] and message is not None
        assert record_errors[0][1] == message
        assert rows[2][6:] == ((), None)


@pytest.mark.parametrize("version", VERSIONS)
def test_request_refused_as_a_whole(shared_broker, topics, version):
    """A transactional batch without a transactional id: every partition refused, with
    the reason (v8+); invalid acks: every partition INVALID_REQUIRED_ACKS."""
    plain = topics["plain"]
    txn = _request(version, {plain: {0: _batch(b"t", transactional=True, producer_id=4242), 1: _batch(b"u")}})
    with RawConnection(shared_broker.bootstrap) as conn:
        rows = _said(version, _exchange(conn, version, txn, 1))
        assert [r[:4] for r in rows] == [(plain, 0, ErrorCode.transactional_id_authorization_failed, -1),
                                         (plain, 1, ErrorCode.transactional_id_authorization_failed, -1)]
        if version >= 8:
            assert all(r[6] == () and "transactional" in r[7] for r in rows)
        rows = _said(version, _exchange(conn, version, _request(version, {plain: {0: _batch(b"v")}}, acks=2), 2))
        assert [r[:4] for r in rows] == [(plain, 0, ErrorCode.invalid_required_acks, -1)]


@pytest.mark.parametrize("version", (3, 9, 12))
def test_acks_0(shared_broker, topics, version):
    """No answer when it succeeds (the next request's answer comes first); the connection
    closes when a partition fails."""
    plain = topics["plain"]
    with RawConnection(shared_broker.bootstrap) as conn:
        conn.send(request_bytes(_request(version, {plain: {0: _batch(b"quiet")}}, acks=0), 1))
        (row,) = _said(version, _exchange(conn, version, _request(version, {plain: {0: _batch(b"loud")}}), 2))
        assert row[2] == ErrorCode.none
        conn.send(request_bytes(_request(version, {"answers-missing": {0: _batch(b"x")}}, acks=0), 3))
        deadline = time.monotonic() + 10
        assert conn.is_closed_by_peer(timeout_s=max(deadline - time.monotonic(), 1))
