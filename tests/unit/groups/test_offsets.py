"""OffsetCommit, OffsetFetch (incl. KIP-709 many groups), OffsetDelete, topic deletion, expiry."""

from __future__ import annotations

import pytest
from kio.schema.errors import ErrorCode as E

from tests.unit.groups.helpers import Shell, req, stable_group


def fetch(sh: Shell, version: int, now: int = 0, group: str = "g", topics=None, **kw):
    ts = None if topics is None else [{"name": t, "partition_indexes": ps} for t, ps in topics.items()]
    return sh.call("handle_offset_fetch", req("offset_fetch", version, group_id=group, topics=ts, **kw), now).response


def offsets_of(resp) -> dict:
    return {(t.name, p.partition_index): p.committed_offset for t in resp.topics for p in t.partitions}


# --------------------------------------------------------------- OffsetCommit
@pytest.mark.parametrize("version", [2, 3, 4, 5, 6, 7, 8, 9])
def test_simple_group_commit_and_fetch_every_version(version):
    sh = Shell()
    codes = sh.commit(version, 1000, {("t", 0): 5, ("t", 1): 7, ("u", 0): 1}, group="simple")
    assert set(codes.values()) == {E.none}
    g = sh.shard.groups["simple"]  # created by replaying the commit
    assert g.group_type == "classic" and g.state_name == "Empty" and g.protocol_type is None
    v = sh.shard.offsets.get("simple", "t", 1)
    assert v.offset == 7 and v.metadata == "meta" and v.commit_timestamp == 1000
    assert v.leader_epoch == (3 if version >= 6 else -1)


def test_commit_to_missing_group_with_generation():
    sh = Shell()
    assert set(sh.commit(8, 0, {("t", 0): 1}, member_id="m", generation=1).values()) == {E.illegal_generation}
    assert set(sh.commit(9, 0, {("t", 0): 1}, member_id="m", generation=1).values()) == {E.group_id_not_found}
    assert set(sh.commit(9, 0, {("t", 0): 1}, group="").values()) == {E.invalid_group_id}
    assert sh.log == []


def test_commit_member_and_generation_checks():
    sh = Shell()
    members, gen = stable_group(sh, n=2)
    ok = sh.commit(8, 0, {("t", 0): 10}, member_id=members[0], generation=gen)
    assert ok == {("t", 0): E.none}
    assert sh.commit(8, 0, {("t", 0): 1}, member_id="ghost", generation=gen) == {("t", 0): E.unknown_member_id}
    assert sh.commit(8, 0, {("t", 0): 1}, member_id=members[0], generation=gen + 1) == {("t", 0): E.illegal_generation}
    # generation -1 without member into a non-empty group
    assert sh.commit(8, 0, {("t", 0): 1}) == {("t", 0): E.unknown_member_id}
    assert sh.commit(8, 0, {("t", 0): 1}, member_id=members[0], generation=gen, instance="x") == {("t", 0): E.unknown_member_id}
    assert sh.shard.offsets.get("g", "t", 0).offset == 10


def test_commit_rebalance_in_progress_while_completing():
    sh = Shell()
    t1, _ = sh.join(3, 0)
    sh.expire(0)
    mid = sh.replies[t1].member_id
    assert sh.commit(7, 0, {("t", 0): 1}, member_id=mid, generation=1) == {("t", 0): E.rebalance_in_progress}


def test_commit_fenced_instance():
    sh = Shell()
    t1, _ = sh.join(9, 0, instance="i")
    sh.expire(0)
    mid = sh.replies[t1].member_id
    sh.sync(5, 0, mid, 1, instance="i", assignments={mid: b""})
    assert sh.commit(8, 0, {("t", 0): 1}, member_id="old", generation=1, instance="i") == {("t", 0): E.fenced_instance_id}
    assert sh.commit(8, 0, {("t", 0): 1}, member_id=mid, generation=1, instance="i") == {("t", 0): E.none}


def test_commit_metadata_too_large_is_per_partition():
    sh = Shell()
    codes = sh.commit(8, 0, {("t", 0): 1}, metadata="x" * 5000)
    assert codes == {("t", 0): E.offset_metadata_too_large}
    assert sh.shard.offsets.get("g", "t", 0) is None


# ---------------------------------------------------------------- OffsetFetch
@pytest.mark.parametrize("version", [1, 2, 3, 4, 5, 6, 7])
def test_fetch_single_group_versions(version):
    sh = Shell()
    sh.commit(8, 0, {("t", 0): 5, ("t", 1): 6})
    r = fetch(sh, version, topics={"t": [0, 1, 2]})
    assert offsets_of(r) == {("t", 0): 5, ("t", 1): 6, ("t", 2): -1}
    if version >= 2:
        assert r.error_code == E.none
        assert offsets_of(fetch(sh, version)) == {("t", 0): 5, ("t", 1): 6}  # null topics: all
    if version >= 5:
        assert {p.committed_leader_epoch for t in r.topics for p in t.partitions} == {3, -1}
    missing = fetch(sh, version, group="nobody", topics={"t": [0]})
    assert offsets_of(missing) == {("t", 0): -1}


@pytest.mark.parametrize("version", [8, 9])
def test_fetch_many_groups_kip_709(version):
    sh = Shell()
    sh.commit(8, 0, {("t", 0): 1}, group="a")
    sh.commit(8, 0, {("t", 0): 2, ("u", 3): 4}, group="b")
    groups = [
        {"group_id": "a", "topics": [{"name": "t", "partition_indexes": [0, 1]}]},
        {"group_id": "b", "topics": None},
        {"group_id": "c", "topics": None},
    ]
    r = sh.call("handle_offset_fetch", req("offset_fetch", version, groups=groups, require_stable=True), 0).response
    by = {g.group_id: g for g in r.groups}
    assert list(by) == ["a", "b", "c"]
    assert offsets_of(by["a"]) == {("t", 0): 1, ("t", 1): -1}
    assert offsets_of(by["b"]) == {("t", 0): 2, ("u", 3): 4}
    assert by["c"].topics == () and by["c"].error_code == E.none


# --------------------------------------------------------------- OffsetDelete
def delete(sh: Shell, group: str, topics: dict):
    r = req("offset_delete", 0, group_id=group,
            topics=[{"name": t, "partitions": [{"partition_index": p} for p in ps]} for t, ps in topics.items()])
    return sh.call("handle_offset_delete", r, 0).response


def test_offset_delete():
    sh = Shell()
    members, gen = stable_group(sh, n=1, topics=("t",))
    sh.commit(8, 0, {("t", 0): 1, ("u", 0): 2}, member_id=members[0], generation=gen)
    r = delete(sh, "g", {"t": [0], "u": [0, 9]})
    assert r.error_code == E.none
    codes = {(t.name, p.partition_index): p.error_code for t in r.topics for p in t.partitions}
    assert codes == {("t", 0): E.group_subscribed_to_topic, ("u", 0): E.none, ("u", 9): E.none}
    assert sh.shard.offsets.get("g", "u", 0) is None and sh.shard.offsets.get("g", "t", 0).offset == 1
    assert delete(sh, "nope", {"t": [0]}).error_code == E.group_id_not_found


def test_offset_delete_non_consumer_group_with_members():
    sh = Shell()
    t, _ = sh.join(3, 0, protocol_type="connect")
    sh.expire(0)
    assert delete(sh, "g", {"t": [0]}).error_code == E.non_empty_group


def test_topic_deletion_tombstones_offsets_of_every_group():
    sh = Shell()
    sh.commit(8, 0, {("t", 0): 1, ("keep", 0): 2}, group="a")
    sh.commit(8, 0, {("t", 1): 1}, group="b")
    res = sh.apply(sh.shard.on_topics_deleted(["t"], 0))
    assert len(res.records) == 2 and all(r.value is None for r in res.records)
    assert sh.shard.offsets.get("a", "t", 0) is None and sh.shard.offsets.get("a", "keep", 0).offset == 2
    assert not sh.shard.offsets.has_offsets("b")


# --------------------------------------------------------------------- expiry
def test_offsets_of_simple_group_expire_by_commit_time_then_group_is_deleted():
    sh = Shell({"offsets.retention.minutes": 1, "offsets.retention.check.interval.ms": 1000})
    sh.commit(8, 0, {("t", 0): 1}, group="s")
    sh.commit(8, 30_000, {("t", 1): 1}, group="s")
    sh.expire(1000)  # schedules the check
    sh.expire(60_000)
    assert sh.shard.offsets.get("s", "t", 0) is None and sh.shard.offsets.get("s", "t", 1) is not None
    sh.expire(90_000)
    assert not sh.shard.offsets.has_offsets("s") and "s" not in sh.shard.groups


def test_offsets_of_active_group_do_not_expire_until_empty():
    sh = Shell({"offsets.retention.minutes": 1, "offsets.retention.check.interval.ms": 1000})
    members, gen = stable_group(sh, n=1, topics=("t",))
    sh.commit(8, 0, {("t", 0): 1, ("gone", 0): 1}, member_id=members[0], generation=gen)
    for now in range(5000, 120_000, 5000):
        sh.heartbeat(4, now, members[0], gen)
        sh.expire(now)
    # subscribed topic kept; an unsubscribed topic's offset expired (stable consumer group)
    assert sh.shard.offsets.get("g", "t", 0) is not None
    assert sh.shard.offsets.get("g", "gone", 0) is None
    sh.call("handle_leave_group", req("leave_group", 3, group_id="g", members=[{"member_id": members[0]}]), 120_000)
    sh.expire(150_000)
    assert sh.shard.offsets.get("g", "t", 0) is not None  # retention counts from when it became empty
    sh.expire(181_000)
    assert sh.shard.offsets.get("g", "t", 0) is None and "g" not in sh.shard.groups


def test_explicit_retention_time_v2():
    sh = Shell({"offsets.retention.minutes": 100, "offsets.retention.check.interval.ms": 1000})
    sh.commit(2, 0, {("t", 0): 1}, retention_ms=5000)
    sh.expire(1)
    sh.expire(4000)
    assert sh.shard.offsets.get("g", "t", 0) is not None
    sh.expire(5001)
    assert sh.shard.offsets.get("g", "t", 0) is None
