"""The follower's Fetch v12 request body against kio's writer and reader."""

from __future__ import annotations

import datetime
import io

from hypothesis import given, settings
from hypothesis import strategies as st
from kio.serial import entity_reader, entity_writer

from shoal.protocol.codec import codec_for
from shoal.protocol.entities import make, sub
from shoal.protocol.fetch_request import write_fetch_request_v12

REQUEST = codec_for(1, 12).request_type  # type: ignore[union-attr]
TOPIC, PART = sub(REQUEST, "FetchTopic"), sub(REQUEST, "FetchPartition")

int32 = st.integers(-1, 2**31 - 1)
parts = st.lists(st.tuples(st.integers(0, 2**31 - 1), int32, st.integers(0, 2**63 - 1), st.integers(0, 2**31 - 1)),
                 max_size=5)
topics = st.lists(st.tuples(st.text(min_size=1, max_size=300), parts), max_size=5)


def kio_body(replica_id: int, max_wait: int, min_bytes: int, max_bytes: int, spec: list) -> bytes:
    request = make(
        REQUEST, replica_id=replica_id, max_wait=datetime.timedelta(milliseconds=max_wait), min_bytes=min_bytes,
        max_bytes=max_bytes, isolation_level=0, session_id=0, session_epoch=-1,
        topics=tuple(make(TOPIC, topic=name, partitions=tuple(
            make(PART, partition=i, current_leader_epoch=e, fetch_offset=o, last_fetched_epoch=-1,
                 log_start_offset=-1, partition_max_bytes=m) for i, e, o, m in ps)) for name, ps in spec),
        forgotten_topics_data=(), rack_id="")
    out = io.BytesIO()
    entity_writer(REQUEST)(out, request)
    return out.getvalue()


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(0, 2**31 - 1), st.integers(0, 2**31 - 1), st.integers(0, 2**31 - 1),
       topics)
def test_the_body_is_what_kio_writes_and_reads_back(replica_id: int, max_wait: int, min_bytes: int, max_bytes: int,
                                                    spec: list) -> None:
    body = write_fetch_request_v12(replica_id, max_wait, min_bytes, max_bytes, spec)
    assert body == kio_body(replica_id, max_wait, min_bytes, max_bytes, spec)
    request, end = entity_reader(REQUEST)(memoryview(body), 0)
    assert end == len(body)
    assert request.replica_id == replica_id and request.min_bytes == min_bytes
    assert [(t.topic, [(p.partition, p.current_leader_epoch, p.fetch_offset, p.partition_max_bytes)
                       for p in t.partitions]) for t in request.topics] == [(n, list(ps)) for n, ps in spec]
