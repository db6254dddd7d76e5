"""KIP-848 consumer groups: joins, epochs, reconciliation, leaves, fencing, expiry, replay."""

from __future__ import annotations

import datetime
import json
import uuid

import pytest
from kio.schema.consumer_group_describe.v1.request import ConsumerGroupDescribeRequest
from kio.schema.consumer_group_heartbeat.v1.request import ConsumerGroupHeartbeatRequest, TopicPartitions
from kio.schema.errors import ErrorCode
from kio.static.primitive import i32, i32Timedelta

from shoal.coordinator.records import CoordinatorRecord
from shoal.groups.assignors import partitions_of
from shoal.groups.consumer import ConsumerGroups, ConsumerGroupState, MemberState, member_state

FOO = uuid.UUID(int=1)
BAR = uuid.UUID(int=2)
TOPICS = {"foo": (FOO, 4), "bar": (BAR, 2)}


class Shell:
    """Plays the I/O shell: appends (records the log), replays, returns the response."""

    def __init__(self, **kwargs) -> None:
        self.groups = ConsumerGroups(**kwargs)
        self.log: list[CoordinatorRecord] = []
        self.topics = dict(TOPICS)

    def apply(self, result):
        for rec in result.records:
            # Records must survive their byte form unchanged.
            rec = CoordinatorRecord.from_bytes(*rec.to_bytes())
            self.log.append(rec)
            self.groups.replay(rec)
        return result

    def hb(self, member_id, epoch, *, now=0, owned=None, names=None, instance_id=None, regex=None,
           assignor=None, group="g", version=1):
        join = epoch == 0
        req = ConsumerGroupHeartbeatRequest(
            group_id=group, member_id=member_id, member_epoch=i32(epoch), instance_id=instance_id,
            rebalance_timeout=i32Timedelta.parse(datetime.timedelta(milliseconds=30_000 if join else -1)),
            subscribed_topic_names=tuple(names) if names is not None else (("foo",) if join and regex is None else None),
            subscribed_topic_regex=regex, server_assignor=assignor,
            topic_partitions=() if join else (None if owned is None else tuple(
                TopicPartitions(topic_id=t, partitions=tuple(i32(p) for p in ps)) for t, ps in owned.items())))
        return self.apply(self.groups.handle_heartbeat(req, now, self.topics, api_version=version)).response


def assigned(resp):
    if resp.assignment is None:
        return None
    return {tp.topic_id: set(tp.partitions) for tp in resp.assignment.topic_partitions}


def replayed(shell: Shell) -> ConsumerGroups:
    fresh = ConsumerGroups()
    for rec in shell.log:
        fresh.replay(rec)
    return fresh


def test_first_member_gets_everything_and_epoch_1():
    s = Shell()
    r = s.hb("a", 0)
    assert r.error_code == ErrorCode.none
    assert (r.member_id, r.member_epoch) == ("a", 1)
    assert r.heartbeat_interval == datetime.timedelta(milliseconds=5000)
    assert assigned(r) == {FOO: {0, 1, 2, 3}}
    g = s.groups.group("g")
    assert (g.group_epoch, g.assignment_epoch, g.state) == (1, 1, ConsumerGroupState.STABLE)
    assert s.groups.has_group("g") and s.groups.group_type == "consumer"


def test_partitions_move_only_after_revocation():
    s = Shell()
    s.hb("a", 0)
    rb = s.hb("b", 0)
    # b joins at epoch 2 but gets nothing yet: a still owns everything.
    assert rb.member_epoch == 2 and assigned(rb) == {}
    assert s.groups.group("g").state == ConsumerGroupState.RECONCILING
    assert s.groups.group("g").members["b"].state == MemberState.UNRELEASED_PARTITIONS
    # a is told to keep half; it stays at epoch 1 until it confirms the revocation.
    ra = s.hb("a", 1, owned={FOO: [0, 1, 2, 3]})
    assert ra.member_epoch == 1 and assigned(ra) == {FOO: {0, 1}}
    assert s.groups.group("g").members["a"].state == MemberState.UNREVOKED_PARTITIONS
    # b still cannot get 2 and 3.
    rb = s.hb("b", 2, owned={})
    assert assigned(rb) is None and rb.member_epoch == 2
    ra = s.hb("a", 1, owned={FOO: [0, 1]})
    assert ra.member_epoch == 2
    rb = s.hb("b", 2, owned={})
    assert assigned(rb) == {FOO: {2, 3}}
    assert s.groups.group("g").state == ConsumerGroupState.STABLE
    owners = s.groups.group("g").owners
    assert owners == {(FOO, 0): "a", (FOO, 1): "a", (FOO, 2): "b", (FOO, 3): "b"}


def test_member_records_hold_kafka_member_state_ids_and_earlier_ones_still_read():
    s = Shell()
    s.hb("a", 0)
    s.hb("b", 0)
    s.hb("a", 1, owned={FOO: [0, 1, 2, 3]})
    states = {r.key["member_id"]: r.value for r in s.log if r.record_type == 8}
    # Kafka's MemberState ids: STABLE 0, UNREVOKED_PARTITIONS 1, UNRELEASED_PARTITIONS 2.
    assert (states["a"]["state"], states["b"]["state"]) == (1, 2)
    assert states["a"]["state_numbering"] == states["b"]["state_numbering"] == 1
    assert replayed(s).group("g").members["a"].state == MemberState.UNREVOKED_PARTITIONS

    # The same log as earlier versions wrote it (UNREVOKED 0, UNRELEASED 1, STABLE 2, no
    # StateNumbering) replays to the same states, in binary and in the JSON form.
    earlier = {MemberState.UNREVOKED_PARTITIONS: 0, MemberState.UNRELEASED_PARTITIONS: 1, MemberState.STABLE: 2}
    for form in ("binary", "json"):
        fresh = ConsumerGroups()
        for rec in s.log:
            if rec.record_type == 8 and rec.value is not None:
                value = {k: v for k, v in rec.value.items() if k != "state_numbering"}
                value["state"] = earlier[MemberState(rec.value["state"])]
                old = CoordinatorRecord(rec.record_type, rec.key, value, rec.version, rec.topic)
                key, data = old.to_bytes()
                if form == "json":
                    data = data[:2] + json.dumps(value).encode()
                rec = CoordinatorRecord.from_bytes(key, data)
                assert "state_numbering" not in rec.value or rec.value["state_numbering"] == 0
            fresh.replay(rec)
        members = fresh.group("g").members
        assert members["a"].state == MemberState.UNREVOKED_PARTITIONS
        assert members["b"].state == MemberState.UNRELEASED_PARTITIONS
    # An id neither numbering knows is UNKNOWN, not a failed replay.
    assert member_state({"state": 7, "state_numbering": 1}) == MemberState.UNKNOWN
    assert member_state({"state": -1}) == MemberState.UNKNOWN


def test_epoch_validation():
    s = Shell()
    s.hb("a", 0)
    assert s.hb("a", 5).error_code == ErrorCode.fenced_member_epoch
    assert s.hb("zz", 1).error_code == ErrorCode.unknown_member_id
    assert s.hb("a", 1, group="other").error_code == ErrorCode.unknown_member_id
    s.hb("b", 0)  # a is now being asked to revoke at epoch 1 (target epoch 2)
    s.hb("a", 1, owned={FOO: [0, 1]})
    assert s.groups.group("g").members["a"].member_epoch == 2
    # The previous epoch is accepted while what it owns is within its assignment.
    assert s.hb("a", 1, owned={FOO: [0, 1]}).error_code == ErrorCode.none
    assert s.hb("a", 1, owned={FOO: [0, 1, 2]}).error_code == ErrorCode.fenced_member_epoch


def test_request_validation():
    s = Shell()
    assert s.hb("", 0).error_code == ErrorCode.invalid_request  # v1: client picks the id
    assert s.hb("a", -3).error_code == ErrorCode.invalid_request
    assert s.hb("a", 0, assignor="nope").error_code == ErrorCode.unsupported_assignor
    assert s.hb("a", 0, regex="(").error_code == ErrorCode.invalid_regular_expression
    assert not s.log


def test_v0_server_generates_member_id():
    s = Shell(new_member_id=lambda: "generated")
    r = s.hb("", 0, version=0)
    assert r.member_id == "generated" and r.member_epoch == 1


def test_leave_bumps_epoch_and_reassigns():
    s = Shell()
    s.hb("a", 0)
    s.hb("b", 0)
    s.hb("a", 1, owned={FOO: [0, 1]})
    r = s.hb("b", -1)
    assert (r.error_code, r.member_epoch) == (ErrorCode.none, -1)
    g = s.groups.group("g")
    assert set(g.members) == {"a"} and g.group_epoch == 3 and g.target["a"] == {FOO: frozenset(range(4))}
    assert assigned(s.hb("a", 2, owned={FOO: [0, 1]})) == {FOO: {0, 1, 2, 3}}
    assert s.hb("a", -1).member_epoch == -1
    assert s.groups.group("g").state == ConsumerGroupState.EMPTY
    assert s.hb("a", -1).error_code == ErrorCode.unknown_member_id


def test_max_size():
    s = Shell(max_size=1)
    s.hb("a", 0)
    assert s.hb("b", 0).error_code == ErrorCode.group_max_size_reached


def test_subscription_change_and_regex():
    s = Shell()
    s.hb("a", 0)
    r = s.hb("a", 1, names=["foo", "bar"])
    assert r.member_epoch == 2 and assigned(r) == {FOO: {0, 1, 2, 3}, BAR: {0, 1}}
    r = s.hb("b", 0, names=[], regex="b.*")
    s.hb("a", 2, owned={FOO: [0, 1, 2, 3], BAR: [0, 1]})
    s.hb("a", 2, owned={FOO: [0, 1, 2, 3]})
    r = s.hb("b", 3, owned={})
    assert assigned(r) == {BAR: {0, 1}}
    assert s.groups.is_subscribed_to_topic("g", "bar")


def test_new_partitions_trigger_rebalance():
    s = Shell()
    s.hb("a", 0)
    s.topics["foo"] = (FOO, 6)
    r = s.hb("a", 1)
    assert r.member_epoch == 2 and assigned(r) == {FOO: set(range(6))}


def test_static_member_temporary_leave_and_replacement():
    s = Shell()
    s.hb("a", 0, instance_id="i1")
    s.hb("b", 0)
    s.hb("a", 1, owned={FOO: [0, 1, 2, 3]}, instance_id="i1")
    s.hb("a", 1, owned={FOO: [0, 1]}, instance_id="i1")
    epoch_before = s.groups.group("g").group_epoch
    r = s.hb("a", -2, instance_id="i1")
    assert r.member_epoch == -2
    assert s.groups.group("g").members["a"].member_epoch == -2
    # Another process with the same instance id, while a is still active, is refused.
    s2 = Shell()
    s2.hb("x", 0, instance_id="i9")
    assert s2.hb("y", 0, instance_id="i9").error_code == ErrorCode.unreleased_instance_id
    # The replacement takes over a's assignment without a rebalance.
    r = s.hb("a2", 0, instance_id="i1")
    assert r.error_code == ErrorCode.none and r.member_epoch == 2 and assigned(r) == {FOO: {0, 1}}
    g = s.groups.group("g")
    assert "a" not in g.members and g.group_epoch == epoch_before and g.static_members == {"i1": "a2"}
    assert s.hb("a", 2, instance_id="i1").error_code == ErrorCode.fenced_instance_id


def test_session_expiry_fences_member():
    s = Shell()
    s.hb("a", 0, now=0)
    s.hb("b", 0, now=10_000)
    res = s.groups.expire(44_999)
    assert not res.records and res.deadlines == [45_000]
    res = s.apply(s.groups.expire(45_000))
    assert res.after == [("g", "a")]
    assert set(s.groups.group("g").members) == {"b"}
    assert res.deadlines == [55_000]
    r = s.hb("a", 1, now=45_001)
    assert r.error_code == ErrorCode.unknown_member_id


def test_revocation_timeout_fences_member():
    s = Shell()
    s.hb("a", 0, now=0)
    s.hb("b", 0, now=0)
    s.hb("a", 1, now=1000, owned={FOO: [0, 1, 2, 3]})  # asked to revoke; rebalance timeout 30 s
    s.hb("a", 1, now=20_000, owned={FOO: [0, 1, 2, 3]})
    s.hb("b", 2, now=20_000, owned={})
    res = s.apply(s.groups.expire(31_000))
    assert res.after == [("g", "a")]
    r = s.hb("b", 2, now=31_000, owned={})
    assert r.member_epoch == 3 and assigned(r) == {FOO: {0, 1, 2, 3}}


def test_offset_commit_validation():
    s = Shell()
    assert s.groups.validate_offset_commit("g", "", -1) == ErrorCode.none
    s.hb("a", 0)
    assert s.groups.validate_offset_commit("g", "a", 1) == ErrorCode.none
    assert s.groups.validate_offset_commit("g", "a", 0) == ErrorCode.stale_member_epoch
    assert s.groups.validate_offset_commit("g", "zz", 1) == ErrorCode.unknown_member_id
    assert s.groups.validate_offset_commit("g", "", -1) == ErrorCode.unknown_member_id
    assert s.groups.validate_offset_fetch("g", None, -1) == ErrorCode.none
    assert s.groups.validate_offset_fetch("g", "a", 3) == ErrorCode.stale_member_epoch


def test_offset_commit_with_an_older_epoch_for_partitions_owned_since_then():
    """KIP-1251 (Kafka 4.3): a commit whose member epoch is older than the member's is
    accepted when every committed partition is owned by the member since an epoch no
    newer than the one sent; the epochs survive the records and a replay."""
    s = Shell()
    s.hb("a", 0)  # a gets foo-0..3 at epoch 1
    s.hb("b", 0)  # epoch 2: a must give up foo-2 and foo-3
    s.hb("a", 1, owned={FOO: [0, 1, 2, 3]})
    s.hb("a", 1, owned={FOO: [0, 1]})  # a moves to epoch 2, keeping foo-0 and foo-1 (since epoch 1)
    s.hb("b", 2, owned={})  # b gets foo-2 and foo-3 at epoch 2
    s.topics["foo"] = (FOO, 6)
    s.hb("a", 2, owned={FOO: [0, 1]})  # epoch 3: more partitions, a gets some at epoch 3
    a = s.groups.group("g").members["a"]
    assert a.member_epoch == 3
    new = sorted(p for t, p in partitions_of(a.assigned) if (t, p) not in {(FOO, 0), (FOO, 1)})
    assert new and {a.assignment_epoch((FOO, p)) for p in new} == {3}
    assert (a.assignment_epoch((FOO, 0)), a.assignment_epoch((FOO, 1))) == (1, 1)
    for groups in (s.groups, replayed(s)):
        v = groups.validate_offset_commit
        assert v("g", "a", 3, [("foo", 0), ("foo", new[0])]) == ErrorCode.none
        assert v("g", "a", 1, [("foo", 0), ("foo", 1)]) == ErrorCode.none
        assert v("g", "a", 2, [("foo", 0)]) == ErrorCode.none
        # A partition assigned after the epoch sent, not owned, or of another topic: stale.
        assert v("g", "a", 2, [("foo", 0), ("foo", new[0])]) == ErrorCode.stale_member_epoch
        assert v("g", "a", 1, [("foo", 2)]) == ErrorCode.stale_member_epoch
        assert v("g", "a", 1, [("bar", 0)]) == ErrorCode.stale_member_epoch
        # Newer than the member's epoch: stale, whatever the partitions.
        assert v("g", "a", 4, [("foo", 0)]) == ErrorCode.stale_member_epoch
        assert v("g", "b", 2, [("foo", 2)]) == ErrorCode.none


def test_describe_list_delete():
    s = Shell()
    s.hb("a", 0)
    resp = s.groups.handle_describe(ConsumerGroupDescribeRequest(
        group_ids=("g", "nope"), include_authorized_operations=False)).response
    g, missing = resp.groups
    assert g.error_code == ErrorCode.none and g.group_state == "Stable" and g.assignor_name == "uniform"
    assert g.members[0].assignment.topic_partitions[0].topic_name == "foo"
    assert missing.error_code == ErrorCode.group_id_not_found
    [listing] = s.groups.list_groups()
    assert (listing.group_id, listing.group_state, listing.group_type) == ("g", "Stable", "consumer")
    assert s.groups.list_groups(["empty"]) == []
    assert s.groups.delete_group("g").response == ErrorCode.non_empty_group
    s.hb("a", -1)
    res = s.apply(s.groups.delete_group("g"))
    assert res.response == ErrorCode.none and not s.groups.has_group("g")
    assert s.groups.delete_group("g").response == ErrorCode.group_id_not_found


def test_handlers_do_not_mutate_state():
    s = Shell()
    s.hb("a", 0)
    before = replayed(s).groups["g"]
    s.groups.handle_heartbeat(ConsumerGroupHeartbeatRequest(
        group_id="g", member_id="b", member_epoch=i32(0),
        rebalance_timeout=i32Timedelta.parse(datetime.timedelta(milliseconds=1000)),
        subscribed_topic_names=("foo",), topic_partitions=()), 0, TOPICS)
    s.groups.expire(10**9)
    assert s.groups.group("g") == before


@pytest.mark.parametrize("steps", [1, 2, 3])
def test_replay_equivalence(steps):
    s = Shell()
    s.hb("a", 0, instance_id="i1")
    s.hb("b", 0, names=["foo", "bar"])
    s.hb("a", 1, owned={FOO: [0, 1, 2, 3]}, instance_id="i1")
    if steps > 1:
        s.hb("c", 0, regex="ba.*", names=[])
        s.hb("a", -2, instance_id="i1")
        s.hb("a3", 0, instance_id="i1")
    if steps > 2:
        s.apply(s.groups.expire(10**9))
        s.hb("d", 0, now=10**9)
    fresh = replayed(s)
    assert dict(fresh.groups) == dict(s.groups.groups)
