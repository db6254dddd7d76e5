"""A data directory whose internal topics hold the JSON records earlier shoal versions
wrote is read at start, and rewritten in Kafka's binary layouts.

The test builds such a directory: a broker runs a classic consumer group (a committed
offset, group metadata) and a share group (accepted records), stops, and the records of
``__consumer_offsets`` and ``__share_group_state`` are turned back into the JSON form
with the encoder earlier versions used (kept below). A broker started on it must know
the group, the committed offset and the share-partition's start offset, must not deliver
the accepted records again, and must leave no JSON record behind. Records of later
formats earlier versions wrote (member states in shoal's old numbering, the share group's
record 9) are read and replaced too.
"""

from __future__ import annotations

import base64
import datetime
import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import AcknowledgeType, TopicPartition

from shoal.config import BrokerConfig
from shoal.coordinator.records import CONSUMER_OFFSETS, SHARE_GROUP_STATE, CoordinatorRecord, is_legacy_json
from shoal.log.compaction import rewrite_records
from shoal.log.store import LogStore
from shoal.protocol.batch import decode_records
from tests.integration.test_share_consumer import poll_until, produce, set_group_configs, share_consumer
from tests.integration.test_share_durability import _describe_start_offset
from tests.support.broker import BrokerProcess
from tests.support.clients import admin_client, consumer, create_topic, wait_until

pytestmark = pytest.mark.integration


# -- the JSON form earlier versions wrote --------------------------------------------------
def _old_dump(fields: dict[str, Any]) -> bytes:
    return json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()


def _old_bytes_fields(value: dict[str, Any]) -> dict[str, Any]:
    """Earlier versions kept a classic member's subscription and assignment as base64 text."""
    out = dict(value)
    if "members" in out:
        out["members"] = [dict(m, subscription=base64.b64encode(m["subscription"]).decode(),
                               assignment=base64.b64encode(m["assignment"]).decode()) for m in out["members"]]
    return out


def _to_old_json(topic: str):  # type: ignore[no-untyped-def]
    def transform(key: bytes | None, value: bytes | None) -> tuple[bytes, bytes | None] | None:
        if key is None:
            return None
        rec = CoordinatorRecord.from_bytes(key, value, topic)
        k = key[:2] + _old_dump(rec.key)
        if rec.value is None:
            return k, None
        fields = _old_bytes_fields(rec.value)
        if topic == SHARE_GROUP_STATE:
            fields["delivery_complete_count"] = -1
        return k, value[:2] + _old_dump(fields)  # type: ignore[index]
    return transform


def _internal_partitions(data_dir: Path) -> list[tuple[str, int]]:
    out = []
    for d in sorted(data_dir.iterdir()):
        for topic in (CONSUMER_OFFSETS, SHARE_GROUP_STATE):
            if d.is_dir() and d.name.startswith(topic + "-"):
                out.append((topic, int(d.name.rsplit("-", 1)[1])))
    return out


def _count_records(data_dir: Path) -> tuple[int, int]:
    """(JSON records, binary records) in the internal topics' logs."""
    store = LogStore(data_dir, BrokerConfig())
    legacy = binary = 0
    try:
        for topic, i in _internal_partitions(data_dir):
            plog = store.partition(topic, i)
            for header, data in plog.read_batches(plog.log_start_offset):
                if header.is_control:
                    continue
                for r in decode_records(data, header):
                    if is_legacy_json(r.key) or is_legacy_json(r.value):
                        legacy += 1
                    else:
                        binary += 1
    finally:
        store.close()
    return legacy, binary


def _rewrite_as_json(data_dir: Path) -> None:
    store = LogStore(data_dir, BrokerConfig())
    try:
        for topic, i in _internal_partitions(data_dir):
            rewrite_records(store.partition(topic, i), _to_old_json(topic))
    finally:
        store.close()


def test_json_records_are_read_at_start_and_rewritten(start_broker: Any, topic_name: str) -> None:
    b: BrokerProcess = start_broker()
    bs = b.bootstrap
    create_topic(bs, topic_name)
    produce(bs, topic_name, 30)

    # A classic consumer group with a committed offset.
    c = consumer(bs, **{"group.id": "cg", "auto.offset.reset": "earliest", "enable.auto.commit": False})
    c.subscribe([topic_name])
    wait_until("a record", lambda: (m := c.poll(0.5)) is not None and m.error() is None, timeout_s=20)
    c.commit(offsets=[TopicPartition(topic_name, 0, 12)], asynchronous=False)
    c.close()

    # A share group that accepted its first records.
    set_group_configs(bs, "sg", share_auto_offset_reset="earliest")
    sc = share_consumer(bs, "sg", topic_name, **{"share.acknowledgement.mode": "explicit", "max.poll.records": 10})
    got: list[Any] = []
    poll_until(sc, lambda: bool(got), 20, got.append)
    accepted = sorted(m.offset() for m in got)
    for m in got:
        sc.acknowledge(m, AcknowledgeType.ACCEPT)
    sc.commit_sync()
    sc.close()
    assert accepted and accepted[0] == 0
    spso = _describe_start_offset(bs, "sg", topic_name)
    assert spso == accepted[-1] + 1
    b.stop()

    _rewrite_as_json(b.data_dir)
    legacy, binary = _count_records(b.data_dir)
    assert legacy > 0 and binary == 0

    b.start()
    bs = b.bootstrap
    c = consumer(bs, **{"group.id": "cg", "enable.auto.commit": False})
    committed = c.committed([TopicPartition(topic_name, 0)], timeout=10)
    c.close()
    assert committed[0].offset == 12
    admin = admin_client(bs)
    groups = {g.group_id for g in admin.list_consumer_groups().result(10).valid}
    assert "cg" in groups
    assert _describe_start_offset(bs, "sg", topic_name) == spso

    # The accepted records are not delivered again; the rest are.
    sc = share_consumer(bs, "sg", topic_name)
    seen: set[int] = set()

    poll_until(sc, lambda: len(seen) >= 30 - len(accepted), 30, lambda m: seen.add(m.offset()))
    sc.close()
    assert seen == set(range(accepted[-1] + 1, 30))
    b.stop()

    legacy, binary = _count_records(b.data_dir)
    assert legacy == 0 and binary > 0


# -- member records with the member-state ids earlier versions wrote ------------------------
_EARLIER_IDS = {0: 2, 1: 0, 2: 1}
"""Kafka's MemberState id -> the id earlier versions wrote (STABLE 2, UNREVOKED 0, UNRELEASED 1)."""


def _to_earlier_member_states(key: bytes | None, value: bytes | None) -> tuple[bytes, bytes | None] | None:
    if key is None or value is None:
        return None
    rec = CoordinatorRecord.from_bytes(key, value)
    if rec.record_type not in (8, 14):
        return None
    assert rec.value is not None and rec.value["state_numbering"] == 1
    fields = dict(rec.value, state=_EARLIER_IDS[rec.value["state"]], state_numbering=0)
    return CoordinatorRecord(rec.record_type, rec.key, fields, rec.version).to_bytes()


def _member_states(data_dir: Path) -> list[tuple[int, int, int]]:
    """(record type, State, StateNumbering) of every member record in ``__consumer_offsets``."""
    store = LogStore(data_dir, BrokerConfig())
    out = []
    try:
        for topic, i in _internal_partitions(data_dir):
            if topic != CONSUMER_OFFSETS:
                continue
            plog = store.partition(topic, i)
            for header, data in plog.read_batches(plog.log_start_offset):
                for r in ([] if header.is_control else decode_records(data, header)):
                    rec = CoordinatorRecord.from_bytes(r.key, r.value)
                    if rec.record_type in (8, 14) and rec.value is not None:
                        out.append((rec.record_type, rec.value["state"], rec.value["state_numbering"]))
    finally:
        store.close()
    return out


def test_member_records_with_earlier_member_state_ids_are_read_and_rewritten(start_broker: Any,
                                                                              topic_name: str) -> None:
    from shoal.client.connection import Connection

    b: BrokerProcess = start_broker()
    create_topic(b.bootstrap, topic_name, partitions=2)
    member = str(uuid.uuid4())

    def heartbeat(conn: Connection, member_id: str, epoch: int, **fields: Any) -> Any:
        resp = conn.call(68, 1, group_id="kg", member_id=member_id, member_epoch=epoch, instance_id=None,
                         rack_id=None, rebalance_timeout=datetime.timedelta(milliseconds=fields.pop("rebalance_ms", -1)),
                         subscribed_topic_names=fields.pop("subscribed_topic_names", None),
                         server_assignor=None, topic_partitions=fields.pop("topic_partitions", None))
        assert resp.error_code == 0, resp
        return resp

    def describe(conn: Connection) -> Any:
        d = conn.call(69, 0, group_ids=("kg",), include_authorized_operations=False).groups[0]
        assert d.error_code == 0, d
        return d

    with Connection.to(b.bootstrap) as conn:
        r = heartbeat(conn, member, 0, rebalance_ms=60000, subscribed_topic_names=(topic_name,),
                      topic_partitions=())
        assert r.member_epoch == 1
        assert describe(conn).group_state == "Stable"
        # A share group's member record (type 14) too.
        sr = conn.call(76, 1, group_id="sg2", member_id=str(uuid.uuid4()), member_epoch=0, rack_id=None,
                       subscribed_topic_names=(topic_name,))
        assert sr.error_code == 0, sr
    b.stop()
    assert (8, 0, 1) in _member_states(b.data_dir) and (14, 0, 1) in _member_states(b.data_dir)

    # The data directory as an earlier version left it: STABLE written as 2, no StateNumbering.
    store = LogStore(b.data_dir, BrokerConfig())
    try:
        for topic, i in _internal_partitions(b.data_dir):
            if topic == CONSUMER_OFFSETS:
                rewrite_records(store.partition(topic, i), _to_earlier_member_states)
    finally:
        store.close()
    assert {(t, s) for t, s, n in _member_states(b.data_dir)} == {(8, 2), (14, 2)}

    b.start()
    with Connection.to(b.bootstrap) as conn:
        # Read as STABLE: the group is Stable (not Reconciling, as Kafka's id 2, UNRELEASED_PARTITIONS, would say)
        # and the member goes on at its epoch.
        d = describe(conn)
        assert d.group_state == "Stable" and d.group_epoch == 1
        assert [m.member_id for m in d.members] == [member]
        assert heartbeat(conn, member, 1).member_epoch == 1
    b.stop()
    # Rewritten at start in Kafka's ids, so Kafka's decoders read them as shoal means them.
    states = _member_states(b.data_dir)
    assert states and all(n == 1 and s == 0 for _, s, n in states)


def _group_records(data_dir: Path, group: str) -> list[tuple[int, int, dict[str, Any] | None]]:
    """(partition, record type, value) of every record of ``group`` in ``__consumer_offsets``."""
    store = LogStore(data_dir, BrokerConfig())
    out = []
    try:
        for topic, i in _internal_partitions(data_dir):
            if topic != CONSUMER_OFFSETS:
                continue
            plog = store.partition(topic, i)
            for header, data in plog.read_batches(plog.log_start_offset):
                for r in ([] if header.is_control else decode_records(data, header)):
                    rec = CoordinatorRecord.from_bytes(r.key, r.value)
                    if rec.key.get("group_id") == group or rec.key.get("group") == group:
                        out.append((i, rec.record_type, rec.value))
    finally:
        store.close()
    return out


def test_share_group_partition_metadata_of_earlier_versions_is_read_then_tombstoned(start_broker: Any,
                                                                                    topic_name: str) -> None:
    """Earlier versions wrote ShareGroupPartitionMetadata (record type 9, removed by Kafka 4.1)
    and a ShareGroupMetadata without a metadata hash. A broker started on such a data
    directory knows the group and its member; the member's next heartbeat bumps the group
    epoch once (the hash was 0), writes the hash, and tombstones the old record 9."""
    from shoal.client.connection import Connection
    from shoal.protocol.batch import build_batch

    b: BrokerProcess = start_broker()
    create_topic(b.bootstrap, topic_name, partitions=2)
    group, member = "sg9", str(uuid.uuid4())

    def heartbeat(conn: Connection, epoch: int) -> Any:
        r = conn.call(76, 1, group_id=group, member_id=member, member_epoch=epoch, rack_id=None,
                      subscribed_topic_names=(topic_name,) if epoch == 0 else None)
        assert r.error_code == 0, r
        return r

    with Connection.to(b.bootstrap) as conn:
        assert heartbeat(conn, 0).member_epoch == 1
    b.stop()
    written = _group_records(b.data_dir, group)
    assert {t for _, t, _ in written} >= {10, 11, 12, 13, 14} and 9 not in {t for _, t, _ in written}
    [(partition, _, first)] = [(p, t, v) for p, t, v in written if t == 11]
    assert first is not None and first["epoch"] == 1 and first["metadata_hash"] != 0

    # The directory as an earlier version left it: record 11 without a hash, and a record 9.
    def without_hash(key: bytes | None, value: bytes | None) -> tuple[bytes, bytes | None] | None:
        if key is None or value is None:
            return None
        rec = CoordinatorRecord.from_bytes(key, value)
        if rec.record_type != 11:
            return None
        return CoordinatorRecord(11, rec.key, dict(rec.value, metadata_hash=0)).to_bytes()

    old9 = CoordinatorRecord(9, {"group_id": group}, {"topics": [{
        "topic_id": str(uuid.uuid4()), "topic_name": topic_name, "num_partitions": 2, "partition_metadata": []}]})
    store = LogStore(b.data_dir, BrokerConfig())
    try:
        plog = store.partition(CONSUMER_OFFSETS, partition)
        rewrite_records(plog, without_hash)
        plog.append(bytearray(build_batch([(*old9.to_bytes(), [], 0)])), 0)
    finally:
        store.close()
    assert [(t, v is None) for _, t, v in _group_records(b.data_dir, group) if t in (9, 11)] == [
        (11, False), (9, False)]

    b.start()
    with Connection.to(b.bootstrap) as conn:
        d = conn.call(77, 1, group_ids=(group,), include_authorized_operations=False).groups[0]
        assert (d.error_code, d.group_epoch, [m.member_id for m in d.members]) == (0, 1, [member])
        r = heartbeat(conn, 1)
        assert r.member_epoch == 2
        assert heartbeat(conn, 2).member_epoch == 2  # nothing changed since: no more bumps
    b.stop()
    after = [(t, v) for _, t, v in _group_records(b.data_dir, group) if t in (9, 11)]
    assert [(t, v is None) for t, v in after] == [(11, False), (9, False), (11, False), (9, True)]
    assert after[2][1] == {"epoch": 2, "metadata_hash": first["metadata_hash"]}
