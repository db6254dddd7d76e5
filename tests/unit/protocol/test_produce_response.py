"""The Produce response writer against kio's writer, every version shoal answers."""

from __future__ import annotations

import datetime
import io

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.serial import entity_writer

from shoal.errors import ErrorCode
from shoal.protocol.codec import codec_for
from shoal.protocol.entities import make, sub
from shoal.protocol.produce_response import write_one_partition, write_produce_response

EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)

texts = st.one_of(st.none(), st.text(max_size=30))
results = st.lists(st.tuples(
    st.integers(0, 2**31 - 1),
    st.sampled_from([0, 2, 6, 10, 19, 20, 87]),
    st.integers(-1, 2**63 - 1),
    st.one_of(st.just(-1), st.integers(0, 2**41)),
    st.integers(-1, 2**63 - 1),
    texts,
    st.lists(st.tuples(st.integers(0, 2**31 - 1), texts), max_size=3),
), max_size=4)


def kio_bytes(version: int, topics: list) -> bytes:
    cls = codec_for(0, version).response_type  # type: ignore[union-attr]
    tcls, pcls = sub(cls, "TopicProduceResponse"), sub(cls, "PartitionProduceResponse")
    later = {}
    if version >= 8:
        ecls = sub(pcls, "BatchIndexAndErrorMessage")
    entities = []
    for name, parts in topics:
        ps = []
        for index, code, base, append_ms, start, message, errors in parts:
            fields = dict(index=index, error_code=ErrorCode(code), base_offset=base,
                          log_append_time=None if append_ms < 0 else EPOCH + datetime.timedelta(milliseconds=append_ms))
            if version >= 5:
                fields["log_start_offset"] = start
            if version >= 8:
                later = dict(error_message=message, record_errors=tuple(
                    make(ecls, batch_index=i, batch_index_error_message=m) for i, m in errors))
            ps.append(make(pcls, **fields, **later))
        entities.append(make(tcls, name=name, partition_responses=tuple(ps)))
    out = io.BytesIO()
    entity_writer(cls)(out, make(cls, throttle_time=0, responses=tuple(entities)))
    return out.getvalue()


@settings(max_examples=100, deadline=None)
@pytest.mark.parametrize("version", range(3, 13))
@given(topics=st.lists(st.tuples(st.text(min_size=1, max_size=20), results), max_size=4))
def test_the_writer_writes_what_kio_writes(version: int, topics: list) -> None:
    if version < 8:  # no error message or record errors before v8
        topics = [(name, [p[:5] + (None, []) for p in parts]) for name, parts in topics]
    assert write_produce_response(version, topics) == kio_bytes(version, topics)


def test_other_versions_are_refused() -> None:
    for version in (2, 13):
        with pytest.raises(ValueError):
            write_produce_response(version, [])


@settings(max_examples=60, deadline=None)
@pytest.mark.parametrize("version", range(3, 13))
@given(name=st.text(min_size=1, max_size=20), index=st.integers(0, 2**31 - 1),
       answers=st.lists(st.tuples(st.integers(-1, 2**63 - 1), st.one_of(st.just(-1), st.integers(0, 2**41)),
                                  st.integers(-1, 2**63 - 1)), min_size=1, max_size=3))
def test_the_one_partition_template_writes_what_kio_writes(version: int, name: str, index: int,
                                                           answers: list) -> None:
    """The answer of one partition that succeeded, from its template (built once, then
    reused with other offsets), is byte for byte the general writer's and kio's."""
    for base, append_ms, start in answers:
        topics = [(name, [(index, 0, base, append_ms, start if version >= 5 else -1, None, [])])]
        fast = write_one_partition(version, name, index, base, append_ms, start if version >= 5 else -1)
        assert fast == write_produce_response(version, topics) == kio_bytes(version, topics)
