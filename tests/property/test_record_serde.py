"""Every internal-topic record type survives encode -> decode, in every version shoal reads.

Values are drawn from each record's own layout (every field present in the version,
nullable ones sometimes null, tagged ones sometimes left at their default), so a new
record type or field is covered without a new strategy. The domain builders'
round trips (offset commits, group metadata, share state) are checked too.
"""

from __future__ import annotations

import uuid
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from shoal.coordinator.records import CoordinatorRecord, decode_key, decode_value, encode_key, encode_value
from shoal.coordinator.schemas import RECORD_SCHEMAS, SHARE_GROUP_STATE, Field
from shoal.groups.records import (
    GroupValue,
    MemberValue,
    OffsetValue,
    decode_group_metadata,
    decode_offset_commit,
    group_metadata_record,
    offset_commit_record,
)
from shoal.share.coordinator import ShareCoordinatorShard, SharePartitionKey, StateBatch

_INTS = {"int8": 8, "int16": 16, "int32": 32, "int64": 64}
_TEXT = st.text(max_size=12)
_UUIDS = st.uuids().map(str)


def _primitive(type_: str) -> st.SearchStrategy[Any]:
    if type_ in _INTS:
        bits = _INTS[type_]
        return st.integers(-(1 << (bits - 1)), (1 << (bits - 1)) - 1)
    return {
        "uint16": st.integers(0, 0xFFFF),
        "bool": st.booleans(),
        "uuid": _UUIDS,
        "string": _TEXT,
        "bytes": st.binary(max_size=16),
    }[type_]


def _field(fd: Field, version: int, tagged: bool = False) -> st.SearchStrategy[Any]:
    if fd.array:
        inner = _struct(fd.fields, version) if fd.type == "struct" else _primitive(fd.type)
        s: st.SearchStrategy[Any] = st.lists(inner, max_size=3)
    elif fd.type == "struct":
        s = _struct(fd.fields, version)
    else:
        s = _primitive(fd.type)
    if fd.is_nullable(version) and not (tagged and fd.array):
        s = st.none() | s
    if tagged:
        s = st.just(fd.default_value()) | s
    return s


def _struct(fields: tuple[Field, ...], version: int) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries({
        fd.name: (_field(fd, version, fd.is_tagged(version)) if fd.present(version) else st.just(fd.default_value()))
        for fd in fields
    })


_CASES = [
    (topic, record_type, version)
    for topic, types in RECORD_SCHEMAS.items()
    for record_type, (_, value_schema) in types.items()
    for version in range(value_schema.versions[0], value_schema.versions[1] + 1)
]


@st.composite
def _records(draw: st.DrawFn) -> tuple[str, int, int, dict[str, Any], dict[str, Any]]:
    topic, record_type, version = draw(st.sampled_from(_CASES))
    key_schema, value_schema = RECORD_SCHEMAS[topic][record_type]
    key = draw(_struct(key_schema.fields, record_type))
    value = draw(_struct(value_schema.fields, version))
    return topic, record_type, version, key, value


def test_every_record_type_and_version_is_covered() -> None:
    assert {(t, r) for t, r, _ in _CASES} == {(t, r) for t, types in RECORD_SCHEMAS.items() for r in types}
    assert len(RECORD_SCHEMAS["__consumer_offsets"]) == 16 and len(RECORD_SCHEMAS[SHARE_GROUP_STATE]) == 2


@settings(max_examples=600, deadline=None)
@given(_records())
def test_key_and_value_round_trip(case: tuple[str, int, int, dict[str, Any], dict[str, Any]]) -> None:
    topic, record_type, version, key, value = case
    kb = encode_key(record_type, key, topic)
    vb = encode_value(record_type, version, value, topic)
    assert decode_key(kb, topic) == (record_type, key)
    assert decode_value(record_type, vb, topic) == (version, value)
    rec = CoordinatorRecord(record_type, key, value, version, topic)
    assert CoordinatorRecord.from_bytes(*rec.to_bytes(), topic) == rec
    assert CoordinatorRecord.from_bytes(kb, None, topic) == CoordinatorRecord(record_type, key, None, 0, topic)


@settings(max_examples=300, deadline=None)
@given(_records(), st.data())
def test_truncated_records_are_refused_never_misread(case: tuple[str, int, int, dict[str, Any], dict[str, Any]],
                                                     data: st.DataObject) -> None:
    topic, record_type, version, _key, value = case
    vb = encode_value(record_type, version, value, topic)
    cut = data.draw(st.integers(2, len(vb) - 1)) if len(vb) > 2 else None
    if cut is None:
        return
    try:
        decode_value(record_type, vb[:cut], topic)
    except ValueError:
        return
    raise AssertionError("a truncated value decoded")


_NAMES = st.text(min_size=1, max_size=10)


@settings(max_examples=200, deadline=None)
@given(_NAMES, _NAMES, st.integers(0, (1 << 31) - 1), st.integers(0, 1 << 62), st.integers(-1, (1 << 31) - 1),
       st.text(max_size=20), st.integers(0, 1 << 50), st.one_of(st.just(-1), st.integers(0, 1 << 50)))
def test_offset_commit_records_round_trip(group: str, topic: str, partition: int, offset: int, epoch: int,
                                          metadata: str, ts: int, expire: int) -> None:
    value = OffsetValue(offset, epoch if expire == -1 else -1, metadata, ts, expire)
    rec = offset_commit_record(group, topic, partition, value)
    assert rec.version == (3 if expire == -1 else 1)
    back = CoordinatorRecord.from_bytes(*rec.to_bytes())
    assert decode_offset_commit(back) == (group, topic, partition, value)


_MEMBERS = st.builds(MemberValue, _NAMES, st.none() | _NAMES, st.text(max_size=8), st.text(max_size=8),
                     st.integers(0, 1 << 30), st.integers(0, 1 << 30), st.binary(max_size=20), st.binary(max_size=20))


@settings(max_examples=200, deadline=None)
@given(_NAMES, st.builds(GroupValue, st.text(max_size=8), st.integers(0, 1 << 30), st.none() | _NAMES,
                         st.none() | _NAMES, st.integers(-1, 1 << 50), st.lists(_MEMBERS, max_size=3).map(tuple)))
def test_group_metadata_records_round_trip(group: str, value: GroupValue) -> None:
    rec = group_metadata_record(group, value)
    assert decode_group_metadata(CoordinatorRecord.from_bytes(*rec.to_bytes())) == (group, value)


_BATCHES = st.lists(st.tuples(st.integers(0, 1000), st.integers(0, 20), st.sampled_from([0, 2, 4]),
                              st.integers(1, 5)), max_size=6)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(-1, 1000), _BATCHES), min_size=1, max_size=8), st.integers(0, 3))
def test_share_state_replayed_from_bytes_equals_the_live_state(writes: list, per_snapshot: int) -> None:
    """The share coordinator's records, written as bytes and replayed into a fresh shard,
    give the state the live shard holds."""
    key = SharePartitionKey("g", str(uuid.UUID(int=7)), 3)
    live = ShareCoordinatorShard(snapshot_update_records_per_snapshot=per_snapshot)
    stored: list[tuple[bytes, bytes | None]] = []

    def apply(result) -> None:  # type: ignore[no-untyped-def]
        for rec in result.records:
            live.replay(rec)
            stored.append(rec.to_bytes())

    apply(live.initialize(key, 0, 0))
    for start, batches in writes:
        apply(live.write(key, 0, 0, start, [StateBatch(f, f + n, s, c) for f, n, s, c in batches]))
    fresh = ShareCoordinatorShard(snapshot_update_records_per_snapshot=per_snapshot)
    for k, v in stored:
        fresh.replay(CoordinatorRecord.from_bytes(k, v, SHARE_GROUP_STATE))
    assert fresh.get(key) == live.get(key)
    assert fresh.update_count(key) == live.update_count(key)
