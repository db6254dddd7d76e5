"""KIP-932 share groups: membership, epochs, sharing, expiry, state-partition lifecycle, replay."""

from __future__ import annotations

import copy
import dataclasses
import datetime
import uuid

from kio.schema.errors import ErrorCode
from kio.schema.share_group_describe.v1.request import ShareGroupDescribeRequest
from kio.schema.share_group_heartbeat.v1.request import ShareGroupHeartbeatRequest
from kio.static.primitive import i32

from shoal.coordinator.records import CoordinatorRecord, RecordType
from shoal.groups.metadata_hash import metadata_hash
from shoal.groups.share_group import (
    ShareEffects,
    ShareGroups,
    ShareGroupState,
    heartbeat_assignment,
)

FOO = uuid.UUID(int=1)
BAR = uuid.UUID(int=2)
TOPICS = {"foo": (FOO, 2), "bar": (BAR, 3)}


class Shell:
    def __init__(self, *, initialize: bool = True, **kwargs) -> None:
        self.initialize = initialize
        self.groups = ShareGroups(**kwargs)
        self.log: list[CoordinatorRecord] = []
        self.topics = dict(TOPICS)

    def apply(self, result):
        for rec in result.records:
            rec = CoordinatorRecord.from_bytes(*rec.to_bytes())
            self.log.append(rec)
            self.groups.replay(rec)
        return result

    def hb_result(self, member_id, epoch, *, now=0, names=None, group="s", initialize=None, **kwargs):
        """One heartbeat; with ``initialize``, the shell's part as the handler does it: the
        partitions the heartbeat made initializing are initialized, and the member gets them."""
        if names is None and epoch == 0:
            names = ["foo"]
        req = ShareGroupHeartbeatRequest(group_id=group, member_id=member_id, member_epoch=i32(epoch),
                                         subscribed_topic_names=None if names is None else tuple(names))
        result = self.apply(self.groups.handle_heartbeat(req, now, self.topics, **kwargs))
        if initialize is None:
            initialize = self.initialize
        if initialize and result.response.error_code == ErrorCode.none and epoch != -1:
            self.apply(self.groups.retry_initialize(group))
            pending = self.groups.partitions_to_initialize(group).get(group)
            if pending:
                self.apply(self.groups.mark_initialized(group, pending))
            refreshed = self.apply(self.groups.refresh_assignment(group, member_id))
            if refreshed.response is not None:
                result = dataclasses.replace(result, response=dataclasses.replace(
                    result.response, assignment=heartbeat_assignment(refreshed.response)))
        return result

    def hb(self, *args, **kwargs):
        return self.hb_result(*args, **kwargs).response


def assigned(resp):
    if resp.assignment is None:
        return None
    return {tp.topic_id: set(tp.partitions) for tp in resp.assignment.topic_partitions}


def test_join_gets_assignment_directly():
    s = Shell()
    res = s.hb_result("m1", 0, session_timeout_ms=50_000, heartbeat_interval_ms=6000)
    r = res.response
    assert (r.error_code, r.member_id, r.member_epoch) == (ErrorCode.none, "m1", 1)
    assert r.heartbeat_interval == datetime.timedelta(milliseconds=6000)
    assert assigned(r) == {FOO: {0, 1}}
    assert res.deadlines == [50_000]
    assert s.groups.group("s").state == ShareGroupState.STABLE
    assert s.groups.has_group("s") and s.groups.group_type == "share"
    # A second member takes one partition at once: no revocation handshake.
    r2 = s.hb("m2", 0)
    assert r2.member_epoch == 2 and len(assigned(r2)[FOO]) == 1
    r1 = s.hb("m1", 1)
    assert r1.member_epoch == 2 and assigned(r1)[FOO] == {0, 1} - assigned(r2)[FOO]


def test_partitions_are_assigned_only_once_initialized():
    # KIP-932: until the share coordinator has the state, the heartbeat answers with an
    # empty assignment; the member gets the partitions once their initialization succeeded.
    s = Shell()
    r = s.hb("m1", 0, initialize=False)
    assert r.error_code == ErrorCode.none and assigned(r) == {}
    assert s.groups.partitions_to_initialize("s") == {"s": {FOO: frozenset({0, 1})}}
    assert s.groups.assignment_of("s", "m1") == {}
    # One of the two initializations fails: only the other is assigned.
    s.apply(s.groups.mark_initialized("s", {FOO: [0]}))
    s.apply(s.groups.mark_initialize_failed("s", {FOO: [1]}))
    refreshed = s.apply(s.groups.refresh_assignment("s", "m1"))
    assert refreshed.response == {FOO: frozenset({0})}
    assert [rec.record_type for rec in refreshed.records] == [RecordType.SHARE_GROUP_CURRENT_MEMBER_ASSIGNMENT]
    assert s.groups.refresh_assignment("s", "m1").records == []  # nothing more to give
    # The next heartbeat retries the failed one, and the member's epoch stays.
    r = s.hb("m1", 1)
    assert r.member_epoch == 1 and assigned(r) == {FOO: {0, 1}}
    # Replayed from the log, the member has what it was given.
    fresh = ShareGroups()
    for rec in s.log:
        fresh.replay(rec)
    assert fresh.assignment_of("s", "m1") == {FOO: frozenset({0, 1})}


def test_members_share_partitions_when_they_outnumber_them():
    s = Shell()
    for i in range(5):
        s.hb(f"m{i}", 0)
    g = s.groups.group("s")
    holders = {p: sum(1 for a in g.target.values() if p in a.get(FOO, ())) for p in range(2)}
    assert sorted(holders.values()) == [2, 3]
    for i in range(5):
        r = s.hb(f"m{i}", g.members[f"m{i}"].member_epoch)
        assert r.member_epoch == 5


def test_epochs_and_errors():
    s = Shell()
    assert s.hb("", 0).error_code == ErrorCode.invalid_request
    assert s.hb("m1", 0, names=[]).error_code == ErrorCode.invalid_request
    assert s.hb("m1", -2).error_code == ErrorCode.invalid_request
    assert s.hb("m1", 1).error_code == ErrorCode.unknown_member_id
    s.hb("m1", 0)
    assert s.hb("m1", 7).error_code == ErrorCode.fenced_member_epoch
    assert s.hb("other", 1).error_code == ErrorCode.unknown_member_id
    s.hb("m2", 0)
    # m1 is at epoch 1, the group at 2: epoch 1 is still current for m1.
    assert s.hb("m1", 1).member_epoch == 2
    assert s.hb("m1", 1).error_code == ErrorCode.none  # previous epoch still accepted
    s.hb("m3", 0)
    s.hb("m1", 2)
    assert s.hb("m1", 1).error_code == ErrorCode.fenced_member_epoch


def test_max_size_from_parameter():
    s = Shell()
    s.hb("m1", 0, max_size=1)
    assert s.hb("m2", 0, max_size=1).error_code == ErrorCode.group_max_size_reached


def test_subscription_change_and_new_topic():
    s = Shell()
    s.hb("m1", 0, names=["foo", "nope"])
    r = s.hb("m1", 1, names=["foo", "bar"])
    assert r.member_epoch == 2 and assigned(r) == {FOO: {0, 1}, BAR: {0, 1, 2}}
    s.topics["nope"] = (uuid.UUID(int=3), 1)
    r = s.hb("m1", 2, names=["foo", "nope"])
    assert assigned(r) == {FOO: {0, 1}, uuid.UUID(int=3): {0}}


def test_leave_reports_removed_member():
    s = Shell()
    s.hb("m1", 0)
    s.hb("m2", 0)
    res = s.hb_result("m2", -1)
    assert res.response.member_epoch == -1
    assert res.after.removed_members == [("s", "m2")]
    g = s.groups.group("s")
    assert set(g.members) == {"m1"} and g.group_epoch == 3 and g.target["m1"] == {FOO: frozenset({0, 1})}
    s.hb("m1", -1)
    assert s.groups.group("s").state == ShareGroupState.EMPTY
    assert s.hb("m1", -1).error_code == ErrorCode.unknown_member_id


def test_session_expiry():
    s = Shell()
    s.hb("m1", 0, now=0)
    s.hb("m2", 0, now=1000)
    assert not s.groups.expire(44_999).records
    res = s.apply(s.groups.expire(45_000))
    assert res.after.removed_members == [("s", "m1")]
    assert res.deadlines == [46_000]
    assert set(s.groups.group("s").members) == {"m2"}
    assert s.hb("m1", 1).error_code == ErrorCode.unknown_member_id
    # The shell's resolved group config wins over the broker default.
    s.hb("m3", 0, now=50_000, session_timeout_ms=60_000)
    assert s.apply(s.groups.expire(106_000)).after.removed_members == [("s", "m2")]
    assert s.groups.is_member("s", "m3")


def test_two_stage_initialization():
    s = Shell(initialize=False)
    res = s.hb_result("m1", 0)
    assert res.after.initialize == {"s": {FOO: frozenset({0, 1})}}
    assert s.groups.partitions_to_initialize("s") == {"s": {FOO: frozenset({0, 1})}}
    assert [r for r in res.records if r.record_type == RecordType.SHARE_GROUP_STATE_PARTITION_METADATA]
    # Nothing new to initialize on the next heartbeat.
    assert s.hb_result("m1", 1).after.initialize == {}
    s.apply(s.groups.mark_initialized("s", {FOO: [0]}))
    g = s.groups.group("s")
    assert g.initializing == {FOO: frozenset({1})} and g.initialized == {FOO: frozenset({0})}
    s.apply(s.groups.mark_initialize_failed("s", {FOO: [1]}))
    assert s.groups.partitions_to_initialize() == {}
    res = s.apply(s.groups.retry_initialize("s"))
    assert res.after.initialize == {"s": {FOO: frozenset({1})}}
    s.apply(s.groups.mark_initialized("s", {FOO: [1]}))
    assert s.groups.initialized_partitions("s") == {FOO: frozenset({0, 1})}
    # A newly subscribed topic starts initializing; the initialized ones stay.
    res = s.hb_result("m1", 1, names=["foo", "bar"])
    assert res.after.initialize == {"s": {BAR: frozenset({0, 1, 2})}}
    assert s.groups.initialized_partitions("s") == {FOO: frozenset({0, 1})}


def test_delete_two_stages():
    s = Shell()
    s.hb("m1", 0)
    s.apply(s.groups.mark_initialized("s", {FOO: [0, 1]}))
    assert s.groups.begin_delete_group("s").response[0] == ErrorCode.non_empty_group
    s.hb("m1", -1)
    res = s.apply(s.groups.begin_delete_group("s"))
    assert res.response == (ErrorCode.none, {FOO: frozenset({0, 1})})
    assert s.groups.partitions_to_delete() == {"s": {FOO: frozenset({0, 1})}}
    assert s.groups.group("s").initialized == {}
    s.apply(s.groups.complete_delete_group("s"))
    assert not s.groups.has_group("s")
    assert s.groups.begin_delete_group("s").response[0] == ErrorCode.group_id_not_found


def test_delete_without_state_is_immediate():
    s = Shell()
    s.hb("m1", 0, names=["missing-topic"])
    s.hb("m1", -1)
    res = s.apply(s.groups.begin_delete_group("s"))
    assert res.response == (ErrorCode.none, {}) and not s.groups.has_group("s")


def test_describe_and_list():
    s = Shell()
    s.hb("m1", 0, client_id="cli", client_host="/127.0.0.1")
    resp = s.groups.handle_describe(ShareGroupDescribeRequest(
        group_ids=("s", "x"), include_authorized_operations=False)).response
    g, missing = resp.groups
    assert (g.group_state, g.group_epoch, g.assignment_epoch, g.assignor_name) == ("Stable", 1, 1, "simple")
    [m] = g.members
    assert (m.member_id, m.client_id, m.client_host, m.subscribed_topic_names) == ("m1", "cli", "/127.0.0.1", ("foo",))
    assert m.assignment.topic_partitions[0].topic_name == "foo"
    assert missing.error_code == ErrorCode.group_id_not_found
    [listing] = s.groups.list_groups()
    assert (listing.group_state, listing.group_type, listing.protocol_type) == ("Stable", "share", "share")
    assert s.groups.list_groups(["Empty"]) == []


def test_on_loaded_restarts_sessions_and_lists_pending_work():
    s = Shell(initialize=False)
    s.hb("m1", 0)
    fresh = ShareGroups()
    for rec in s.log:
        fresh.replay(rec)
    res = fresh.on_loaded(1000)
    assert res.deadlines == [46_000]
    assert isinstance(res.after, ShareEffects) and res.after.initialize == {"s": {FOO: frozenset({0, 1})}}


def test_replay_equivalence():
    s = Shell(initialize=False)
    s.hb("m1", 0, names=["foo", "bar"])
    s.hb("m2", 0)
    s.hb("m3", 0, names=["bar"])
    s.apply(s.groups.mark_initialized("s", {FOO: [0, 1]}))
    s.hb("m1", 3)
    s.hb("m2", -1)
    s.apply(s.groups.expire(10**9))
    s.hb("m4", 0, now=10**9)
    s.hb("m1", 0, group="t")
    fresh = ShareGroups()
    for rec in s.log:
        fresh.replay(rec)
    assert dict(fresh.groups) == dict(s.groups.groups)
    assert fresh.groups["s"].initialized == {FOO: frozenset({0, 1})}


def test_handlers_do_not_mutate_durable_state():
    s = Shell()
    s.hb("m1", 0)
    import copy
    before = copy.deepcopy(s.groups.group("s"))
    s.groups.handle_heartbeat(ShareGroupHeartbeatRequest(
        group_id="s", member_id="m2", member_epoch=i32(0), subscribed_topic_names=("bar",)), 0, TOPICS)
    s.groups.expire(10**9)
    s.groups.mark_initialized("s", {FOO: [0, 1]})
    assert s.groups.group("s") == before


def test_alter_offsets_creates_an_empty_group_whose_partitions_are_initialized():
    s = Shell()
    assert s.apply(s.groups.handle_alter_offsets("new", {FOO: [0, 1]}, {FOO: "foo"})).response == ErrorCode.none
    g = s.groups.group("new")
    assert g is not None and g.state == ShareGroupState.EMPTY and g.group_epoch == 0
    assert s.groups.initialized_partitions("new") == {FOO: frozenset({0, 1})}
    assert [x.group_id for x in s.groups.list_groups()] == ["new"]
    # The first member uses that state: nothing to initialize.
    res = s.hb_result("m1", 0, group="new")
    assert res.response.member_epoch == 1 and res.after.initialize == {}
    # A group with members may not be altered; one without may, again.
    assert s.apply(s.groups.handle_alter_offsets("new", {FOO: [0]}, {})).response == ErrorCode.non_empty_group
    s.hb("m1", -1, group="new")
    assert s.apply(s.groups.handle_alter_offsets("new", {BAR: [2]}, {BAR: "bar"})).response == ErrorCode.none
    assert s.groups.initialized_partitions("new") == {FOO: frozenset({0, 1}), BAR: frozenset({2})}


def test_delete_offsets_forgets_initialized_partitions():
    s = Shell()
    s.apply(s.groups.handle_alter_offsets("g", {FOO: [0, 1]}, {FOO: "foo"}))
    assert s.apply(s.groups.handle_delete_offsets("g", {FOO: [1]})).response == ErrorCode.none
    assert s.groups.initialized_partitions("g") == {FOO: frozenset({0})}
    assert s.groups.handle_delete_offsets("nope", {FOO: [0]}).response == ErrorCode.group_id_not_found


# -- KIP-1101: the subscribed topics' metadata is a hash in record 11, no record 9 ----------

def _group_records(s, record_type):
    return [r for r in s.log if r.record_type == record_type]


def test_group_record_carries_the_metadata_hash_and_no_record_9_is_written():
    s = Shell()
    s.hb("m1", 0)
    s.hb("m2", 0, names=["foo", "bar", "nope"])
    s.hb("m1", 1)
    assert not _group_records(s, RecordType.SHARE_GROUP_PARTITION_METADATA)
    last = _group_records(s, RecordType.SHARE_GROUP_METADATA)[-1].value
    assert last == {"epoch": 2, "metadata_hash": metadata_hash(["foo", "bar"], TOPICS)} and last["metadata_hash"]
    g = s.groups.group("s")
    assert (g.group_epoch, g.metadata_hash) == (2, last["metadata_hash"])
    # Nothing changed: no bump. More partitions: the hash changes, the epoch bumps and the
    # new partition is assigned.
    assert s.hb("m1", 2).member_epoch == 2
    s.topics["bar"] = (BAR, 4)
    r = s.hb("m2", 2)
    assert r.member_epoch == 3 and BAR in assigned(r) and 3 in assigned(r)[BAR]
    assert s.groups.group("s").metadata_hash == metadata_hash(["foo", "bar"], s.topics) != last["metadata_hash"]
    # A member leaving with the only subscription to a topic changes the hash too.
    s.hb("m2", -1)
    assert s.groups.group("s").metadata_hash == metadata_hash(["foo"], s.topics)
    assert not _group_records(s, RecordType.SHARE_GROUP_PARTITION_METADATA)
    s.hb("m1", -1)
    res = s.apply(s.groups.begin_delete_group("s"))
    assert RecordType.SHARE_GROUP_PARTITION_METADATA not in {r.record_type for r in res.records}


def _as_earlier_versions_wrote(log):
    """The log as shoal wrote it before KIP-1101: record 11 without a hash, each followed
    by a record 9 with the subscribed topics' metadata."""
    out = []
    for rec in log:
        if rec.record_type == RecordType.SHARE_GROUP_METADATA and rec.value is not None:
            out.append(CoordinatorRecord.from_bytes(*dataclasses.replace(
                rec, value=dict(rec.value, metadata_hash=0)).to_bytes()))
            out.append(CoordinatorRecord.from_bytes(*CoordinatorRecord(
                int(RecordType.SHARE_GROUP_PARTITION_METADATA), dict(rec.key), {"topics": [
                    {"topic_id": str(FOO), "topic_name": "foo", "num_partitions": 2, "partition_metadata": []}]},
            ).to_bytes()))
        else:
            out.append(rec)
    return out


def test_records_9_of_earlier_versions_are_read_then_tombstoned():
    s = Shell()
    s.hb("m1", 0)
    s.hb("m2", 0)
    old = _as_earlier_versions_wrote(s.log)
    assert any(r.record_type == RecordType.SHARE_GROUP_PARTITION_METADATA for r in old)
    s2 = Shell()
    for rec in old:
        s2.groups.replay(rec)
    g = s2.groups.group("s")
    assert (g.group_epoch, g.metadata_hash, g.legacy_partition_metadata) == (2, 0, True)
    assert set(g.members) == {"m1", "m2"} and g.target == s.groups.group("s").target
    # The first heartbeat finds the hash changed (it was 0): one bump, with the hash, and
    # the old record 9 tombstoned; later heartbeats change nothing.
    res = s2.hb_result("m2", 2)
    assert res.response.error_code == ErrorCode.none and res.response.member_epoch == 3
    types = [(r.record_type, r.value is None) for r in res.records]
    assert (RecordType.SHARE_GROUP_PARTITION_METADATA, True) in types
    assert (RecordType.SHARE_GROUP_PARTITION_METADATA, False) not in types
    g = s2.groups.group("s")
    assert (g.group_epoch, g.metadata_hash, g.legacy_partition_metadata) == (3, metadata_hash(["foo"], TOPICS), False)
    assert not s2.hb_result("m2", 3).records


def test_deleting_a_group_of_earlier_versions_tombstones_its_record_9():
    s = Shell()
    s.hb("m1", 0, names=["missing-topic"])
    s.hb("m1", -1)
    s2 = Shell()
    for rec in _as_earlier_versions_wrote(s.log):
        s2.groups.replay(rec)
    res = s2.apply(s2.groups.begin_delete_group("s"))
    assert res.response == (ErrorCode.none, {}) and not s2.groups.has_group("s")
    assert (RecordType.SHARE_GROUP_PARTITION_METADATA, None) in {(r.record_type, r.value) for r in res.records}


def test_a_steady_heartbeat_copies_no_group(monkeypatch):
    # A heartbeat that changes nothing is answered from the live group: copying a group of
    # N members for each heartbeat made heartbeats cost O(N), and a round of them O(N^2).
    from shoal.groups import share_group

    s = Shell()
    for m in ("m1", "m2", "m3"):
        s.hb(m, 0)
    g = s.groups.group("s")
    epochs = {m: s.hb(m, g.members[m].member_epoch).member_epoch for m in ("m1", "m2", "m3")}
    real = share_group.ShareGroup.scratch
    copied = []
    monkeypatch.setattr(share_group.ShareGroup, "scratch", lambda self: copied.append(self) or real(self))
    before = copy.deepcopy(s.groups.group("s"))
    res = s.hb_result("m2", epochs["m2"], now=5_000, session_timeout_ms=45_000)
    assert (res.response.error_code, res.response.member_epoch, res.response.assignment) == (
        ErrorCode.none, epochs["m2"], None)
    assert res.records == [] and res.deadlines == [50_000]
    assert copied == []
    assert s.groups.group("s") == before
    # One that changes the group is done on a copy: the live group changes only by replay.
    res = s.groups.handle_heartbeat(ShareGroupHeartbeatRequest(
        group_id="s", member_id="m2", member_epoch=i32(epochs["m2"]), subscribed_topic_names=("foo", "bar")),
        6_000, TOPICS)
    assert res.response.error_code == ErrorCode.none and res.records and len(copied) == 1
    assert s.groups.group("s") == before
    s.apply(res)
    assert s.groups.group("s").members["m2"].subscribed_topic_names == ("bar", "foo")


def _work_per_heartbeat(monkeypatch, n: int) -> tuple[list[int], list[int]]:
    """In a group of ``n`` members on a topic of 2 partitions: how many members each kind of
    heartbeat that writes copies, and how often the assignor runs for it: a join; a member
    taking the epoch that join made; a subscription change; a leave; a session expiry."""
    from shoal.groups import share_group

    s = Shell(max_size=1000)
    for i in range(n):
        s.hb(f"m{i:04d}", 0)
    g = s.groups.group("s")
    for i in range(1, n):  # every member but m0000 at the group's epoch, its session renewed
        s.hb(f"m{i:04d}", g.members[f"m{i:04d}"].member_epoch, now=10_000)
    copied: list[object] = []
    monkeypatch.setattr(share_group.ShareMember, "__deepcopy__", lambda self, memo: copied.append(self) or self,
                        raising=False)
    monkeypatch.setattr(share_group.ShareMember, "__copy__", lambda self: copied.append(self) or self, raising=False)
    runs: list[int] = []
    real = share_group.SHARE_ASSIGNORS["simple"]
    monkeypatch.setitem(share_group.SHARE_ASSIGNORS, "simple", lambda *a: runs.append(1) or real(*a))
    counts, assignor_runs = [], []
    for step in (lambda: s.hb("new", 0, now=10_000),
                 lambda: s.hb("m0001", g.members["m0001"].member_epoch, now=10_000),
                 lambda: s.hb("m0002", g.members["m0002"].member_epoch, names=["foo", "bar"], now=10_000),
                 lambda: s.hb("m0003", -1, now=10_000),
                 lambda: s.apply(s.groups.expire(45_000, s.topics))):  # m0000's session
        copied.clear()
        runs.clear()
        step()
        counts.append(len(copied))
        assignor_runs.append(len(runs))
    assert "m0000" not in g.members and len(g.members) == n - 1
    assert g.members["new"].assigned  # the joining member got a partition
    return counts, assignor_runs


def test_heartbeats_that_write_copy_no_member(monkeypatch):
    # A heartbeat that writes records works on a copy of its group; a deep copy rebuilt every
    # member, target and topic id of the group, so in a group of a thousand members each join,
    # and each member's heartbeat that took the new epoch after it, cost milliseconds of
    # copying: the joins of a thousand members queued heartbeats for seconds and the members
    # were fenced. The copy now shares the immutable members.
    small, small_runs = _work_per_heartbeat(monkeypatch, 10)
    large, large_runs = _work_per_heartbeat(monkeypatch, 300)
    assert small == large == [0, 0, 0, 0, 0]
    # The assignor (O(members)) runs once per group epoch, and not for a join to a balanced
    # group where everybody subscribes alike (placed from the partitions' holder counts):
    # only the subscription change and the removals after it, which leave the group unlike.
    assert small_runs == large_runs == [0, 0, 1, 1, 1]


def test_balanced_joins_and_removals_place_members_as_the_assignor_does():
    # Joins and removals placed from the holder counts give exactly the target (and the
    # records) the simple assignor gives, whatever the order of joins, leaves and expiries.
    import random

    rng = random.Random(31)
    quick, full = Shell(max_size=1000), Shell(max_size=1000)
    quick.topics = full.topics = {"foo": (FOO, 5), "bar": (BAR, 3)}
    full.groups._balanced_change = lambda *a: None  # type: ignore[method-assign]
    taken = 0
    real = quick.groups._balanced_change

    def counting(*a):
        nonlocal taken
        out = real(*a)
        taken += out is not None
        return out

    quick.groups._balanced_change = counting  # type: ignore[method-assign]
    names = ["foo", "bar"]
    now, ids = 0, 0
    for step in range(400):
        now += 100
        g = quick.groups.group("s")
        members = sorted(g.members) if g is not None else []
        op = rng.random()
        if op < 0.55 or len(members) < 3:
            ids += 1
            # mostly alike; now and then one member subscribes to one topic only
            sub = names if rng.random() < 0.98 else ["foo"]
            args = (f"m{ids:04d}", 0)
            kw = {"names": sub, "now": now}
        elif op < 0.8:
            mid = rng.choice(members)
            args, kw = (mid, -1), {"now": now}
        elif op < 0.9:
            mid = rng.choice(members)
            args, kw = (mid, g.members[mid].member_epoch), {"now": now}
        else:
            # the longest-silent member's session runs out
            got = [s.apply(s.groups.expire(now + 45_000 - 100 * len(members) // 2, s.topics)) for s in (quick, full)]
            assert [r.records for r in got[0:1]] == [r.records for r in got[1:2]]
            continue
        a, b = quick.hb_result(*args, **kw), full.hb_result(*args, **kw)
        assert a.records == b.records and a.response == b.response, step
        assert quick.groups.group("s") == full.groups.group("s"), step
    assert taken > 50, taken


def test_derived_partitions_and_topics_follow_every_change():
    # A heartbeat reads the target's partitions and the subscribed topics from values kept
    # on the group (walking every member for them made each heartbeat O(members)); they
    # must follow joins, subscription changes, leaves and expiry.
    from shoal.groups.assignors import partitions_of

    s = Shell()

    def check():
        for g in s.groups.groups.values():
            assert g.assigned_partitions() == frozenset().union(*(partitions_of(a) for a in g.target.values()))
            assert g.wanted_topics() == {n for m in g.members.values() for n in m.subscribed_topic_names}

    s.hb("m1", 0)
    check()
    s.hb("m2", 0, names=["foo", "bar"])
    check()
    g = s.groups.group("s")
    kept = (g.assigned_partitions(), g.wanted_topics())
    r = s.hb("m1", g.members["m1"].member_epoch)
    assert r.error_code == ErrorCode.none
    assert (g.assigned_partitions(), g.wanted_topics()) == kept and g.assigned_partitions() is kept[0]
    s.hb("m1", g.members["m1"].member_epoch, names=["bar"])
    check()
    assert g.wanted_topics() == {"foo", "bar"}
    s.hb("m2", -1)
    check()
    assert g.wanted_topics() == {"bar"} and {t for t, _ in g.assigned_partitions()} == {BAR}
    s.apply(s.groups.expire(10**9))
    check()
    assert g.assigned_partitions() == frozenset() and g.wanted_topics() == frozenset()
    fresh = ShareGroups()
    for rec in s.log:
        fresh.replay(rec)
    assert dict(fresh.groups) == dict(s.groups.groups)
