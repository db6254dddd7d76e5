"""JoinGroup / SyncGroup / Heartbeat / LeaveGroup of classic groups, through the shard."""

from __future__ import annotations

from kio.schema.errors import ErrorCode as E

from tests.unit.groups.helpers import Shell, req, stable_group, subscription


def state(sh: Shell, group: str = "g") -> str:
    return sh.shard.groups[group].state_name


# ------------------------------------------------------------------ JoinGroup
def test_member_id_required_from_v4_then_join_with_assigned_id():
    sh = Shell()
    _, resp = sh.join(4, 0)
    assert resp.error_code == E.member_id_required
    assert resp.member_id == "c-1"
    tok, resp = sh.join(4, 0, member_id="c-1")
    assert resp is None  # parked during the initial rebalance delay
    sh.expire(0)
    r = sh.replies[tok]
    assert r.error_code == E.none and r.generation_id == 1 and r.leader == "c-1" and r.member_id == "c-1"
    assert [m.member_id for m in r.members] == ["c-1"]
    assert state(sh) == "CompletingRebalance"


def test_v3_joins_without_member_id_round_trip():
    sh = Shell()
    tok, resp = sh.join(3, 0)
    assert resp is None
    sh.expire(0)
    assert sh.replies[tok].member_id == "c-1" and sh.replies[tok].generation_id == 1


def test_invalid_session_timeout_bounds():
    sh = Shell()
    _, resp = sh.join(9, 0, session_ms=5999)
    assert resp.error_code == E.invalid_session_timeout
    _, resp = sh.join(9, 0, session_ms=1_800_001)
    assert resp.error_code == E.invalid_session_timeout
    assert "g" not in sh.shard.groups


def test_invalid_group_id_and_unknown_member_of_missing_group():
    sh = Shell()
    _, resp = sh.join(9, 0, group="")
    assert resp.error_code == E.invalid_group_id
    _, resp = sh.join(9, 0, member_id="ghost")
    assert resp.error_code == E.unknown_member_id


def test_inconsistent_protocol_type_and_names():
    sh = Shell()
    members, _ = stable_group(sh, n=1)
    _, resp = sh.join(9, 0, protocol_type="connect")
    assert resp.error_code == E.inconsistent_group_protocol
    _, resp = sh.join(9, 0, protocols=(("roundrobin", b""),))
    assert resp.error_code == E.inconsistent_group_protocol
    _, resp = sh.join(9, 0, protocol_type="")
    assert resp.error_code == E.inconsistent_group_protocol


def test_empty_group_needs_protocol_type_and_protocols():
    sh = Shell()
    _, resp = sh.join(9, 0, protocol_type="")
    assert resp.error_code == E.inconsistent_group_protocol
    _, resp = sh.join(9, 0, protocols=())
    assert resp.error_code == E.inconsistent_group_protocol


def test_unknown_member_id_for_existing_group():
    sh = Shell()
    stable_group(sh, n=1)
    _, resp = sh.join(9, 0, member_id="nobody")
    assert resp.error_code == E.unknown_member_id


def test_group_max_size_reached():
    sh = Shell({"group.max.size": 2})
    members, gen = stable_group(sh, n=2)
    _, resp = sh.join(9, 10, member_id="")
    assert resp.error_code == E.group_max_size_reached
    # existing members are still accepted
    _, resp = sh.join(9, 10, member_id=members[1], protocols=(("range", subscription("t")),))
    assert resp.error_code == E.none


def test_protocol_selection_by_vote():
    sh = Shell()
    t1, _ = sh.join(3, 0, protocols=(("range", b"a"), ("sticky", b"b")))
    t2, _ = sh.join(3, 0, protocols=(("sticky", b"c"), ("range", b"d")))
    t3, _ = sh.join(3, 0, protocols=(("sticky", b"e"),))
    sh.expire(0)
    assert {sh.replies[t].protocol_name for t in (t1, t2, t3)} == {"sticky"}
    leader = sh.replies[t1]
    assert [m.metadata for m in leader.members] == [b"b", b"c", b"e"]
    assert sh.replies[t2].members == ()


def test_initial_rebalance_delay_waits_and_extends():
    sh = Shell({"group.initial.rebalance.delay.ms": 3000})
    t1, _ = sh.join(3, 0, rebalance_ms=10_000)
    assert sh.deadlines == [3000]
    sh.expire(2999)
    assert t1 not in sh.replies
    t2, _ = sh.join(3, 1000, rebalance_ms=10_000)
    sh.expire(3000)  # a member arrived during the delay: extended
    assert t1 not in sh.replies
    sh.expire(6000)
    assert sh.replies[t1].generation_id == 1 and len(sh.replies[t1].members) == 2
    assert sh.replies[t2].error_code == E.none


def test_full_rebalance_three_members_and_rejoin():
    sh = Shell()
    members, gen = stable_group(sh, n=3)
    assert gen == 1 and state(sh) == "Stable"
    leader = members[0]
    # a follower heartbeats fine; then the leader rejoins: rebalance
    assert sh.heartbeat(4, 100, members[1], gen) == E.none
    lt, resp = sh.join(9, 100, member_id=leader, protocols=(("range", subscription("t")),))
    assert resp is None and state(sh) == "PreparingRebalance"
    assert sh.heartbeat(4, 100, members[1], gen) == E.rebalance_in_progress
    _, resp = sh.sync(5, 100, members[1], gen)
    assert resp.error_code == E.rebalance_in_progress
    t1, _ = sh.join(9, 200, member_id=members[1], protocols=(("range", subscription("t")),))
    assert lt not in sh.replies
    t2, own = sh.join(9, 300, member_id=members[2], protocols=(("range", subscription("t")),))
    # all three rejoined: the join phase completes at once (not an initial rebalance);
    # the last joiner's own answer is immediate, the others' are completions
    assert own.generation_id == 2 and own.members == ()
    for t in (lt, t1):
        assert sh.replies[t].generation_id == 2
    assert len(sh.replies[lt].members) == 3 and sh.replies[t1].members == ()
    # followers sync first: parked until the leader's arrives
    s1, r = sh.sync(5, 400, members[1], 2)
    assert r is None
    _, r = sh.sync(5, 400, members[0], 2, assignments={members[1]: b"x"})
    assert r.assignment == b"" and r.error_code == E.none
    assert sh.replies[s1].assignment == b"x"
    assert sh.replies[s1].protocol_type == "consumer" and sh.replies[s1].protocol_name == "range"
    assert state(sh) == "CompletingRebalance" or state(sh) == "Stable"
    assert state(sh) == "Stable"
    # the late member gets the stored assignment at once
    _, r = sh.sync(3, 500, members[2], 2)
    assert r.error_code == E.none and r.assignment == b""


def test_rebalance_timeout_drops_members_that_did_not_rejoin():
    sh = Shell()
    members, gen = stable_group(sh, n=3)
    lt, _ = sh.join(9, 0, member_id=members[0], protocols=(("range", subscription("t")),))
    t1, _ = sh.join(9, 0, member_id=members[1], protocols=(("range", subscription("t")),))
    assert sh.shard.next_deadline_ms() <= 30_000
    sh.heartbeat(4, 5000, members[2], gen)
    sh.expire(30_000)
    assert sh.replies[lt].generation_id == 2
    assert [m.member_id for m in sh.replies[lt].members] == members[:2]
    assert members[2] not in sh.shard.groups["g"].members


def test_existing_member_joining_in_completing_rebalance_gets_same_answer():
    sh = Shell()
    t1, _ = sh.join(3, 0)
    sh.expire(0)
    mid = sh.replies[t1].member_id
    _, resp = sh.join(3, 1, member_id=mid)
    assert resp.error_code == E.none and resp.generation_id == 1 and len(resp.members) == 1
    # changed metadata forces a new rebalance
    t3, resp = sh.join(3, 2, member_id=mid, protocols=(("range", b"other"),))
    assert t3 not in sh.replies and resp.generation_id == 2


def test_follower_join_in_stable_without_change_returns_current_generation():
    sh = Shell()
    members, gen = stable_group(sh, n=2)
    _, resp = sh.join(9, 10, member_id=members[1], protocols=(("range", subscription("t")),))
    assert resp.error_code == E.none and resp.generation_id == gen and resp.members == ()
    assert state(sh) == "Stable"


# ----------------------------------------------------------- static members
def test_static_member_replacement_in_stable_group():
    sh = Shell()
    proto = (("range", subscription("t")),)
    t1, _ = sh.join(9, 0, instance="i1", protocols=proto)
    t2, _ = sh.join(9, 0, instance="i2", protocols=proto)
    sh.expire(0)
    m1, m2 = sh.replies[t1].member_id, sh.replies[t2].member_id
    assert (m1, m2) == ("i1-1", "i2-2")
    s2, _ = sh.sync(5, 0, m2, 1, instance="i2")
    sh.sync(5, 0, m1, 1, instance="i1", assignments={m1: b"A", m2: b"B"})
    assert state(sh) == "Stable"
    # i1 (the leader) restarts with no member id: replaced, no rebalance, told to skip assignment
    n = len(sh.log)
    _, resp = sh.join(9, 100, instance="i1", protocols=proto)
    assert resp.error_code == E.none and resp.member_id == "i1-3" and resp.skip_assignment is True
    assert resp.leader == "i1-3" and len(resp.members) == 2 and resp.generation_id == 1
    assert len(sh.log) == n + 1  # the new member id is persisted
    assert state(sh) == "Stable"
    # before v9 the leader gets no member list instead
    _, resp = sh.join(8, 200, instance="i1", protocols=proto)
    assert resp.members == () and resp.member_id == "i1-4"
    # the old incarnation is fenced
    assert sh.heartbeat(4, 300, "i1-3", 1, instance="i1") == E.fenced_instance_id
    _, r = sh.sync(5, 300, "i1-3", 1, instance="i1")
    assert r.error_code == E.fenced_instance_id
    _, r = sh.join(9, 300, member_id="i1-3", instance="i1", protocols=proto)
    assert r.error_code == E.fenced_instance_id
    # the new one works and gets its stored assignment
    _, r = sh.sync(5, 300, "i1-4", 1, instance="i1")
    assert r.assignment == b"A"
    assert sh.heartbeat(4, 300, "i2-2", 1, instance="i2") == E.none


def test_static_member_replacement_fences_parked_join():
    sh = Shell()
    t1, _ = sh.join(9, 0, instance="i1")
    t2, _ = sh.join(9, 0, instance="i1")  # same instance restarted while the first join is parked
    assert sh.replies[t1].error_code == E.fenced_instance_id
    sh.expire(0)
    assert sh.replies[t2].member_id == "i1-2"


def test_static_member_unknown_instance_heartbeat():
    sh = Shell()
    members, gen = stable_group(sh, n=1)
    assert sh.heartbeat(4, 0, members[0], gen, instance="zzz") == E.unknown_member_id


def test_static_member_is_kept_through_rebalance_until_session_expires():
    sh = Shell()
    proto = (("range", subscription("t")),)
    t1, _ = sh.join(9, 0, instance="i1", protocols=proto, session_ms=10_000)
    t2, _ = sh.join(9, 0, instance="i2", protocols=proto, session_ms=60_000)
    sh.expire(0)
    m1, m2 = sh.replies[t1].member_id, sh.replies[t2].member_id
    sh.sync(5, 0, m2, 1)
    sh.sync(5, 0, m1, 1, assignments={m1: b"1", m2: b"2"})
    # i2 rejoins (metadata change); i1 is silent
    t3, _ = sh.join(9, 1000, member_id=m2, instance="i2", protocols=(("range", subscription("t", "u")),))
    for now in range(2000, 12_000, 2000):
        sh.heartbeat(4, now, m2, 1, instance="i2")
    sh.expire(10_000)  # i1's session expires: it leaves, the join phase completes
    assert sh.replies[t3].generation_id == 2
    assert list(sh.shard.groups["g"].members) == [m2]


# --------------------------------------------------------------- SyncGroup
def test_sync_errors():
    sh = Shell()
    _, r = sh.sync(5, 0, "m", 1, group="nope")
    assert r.error_code == E.unknown_member_id
    _, r = sh.sync(5, 0, "m", 1, group="")
    assert r.error_code == E.invalid_group_id
    members, gen = stable_group(sh, n=2)
    _, r = sh.sync(5, 0, "ghost", gen)
    assert r.error_code == E.unknown_member_id
    _, r = sh.sync(5, 0, members[1], gen + 1)
    assert r.error_code == E.illegal_generation
    _, r = sh.sync(5, 0, members[1], gen, protocol_type="connect")
    assert r.error_code == E.inconsistent_group_protocol
    _, r = sh.sync(5, 0, members[1], gen, protocol_name="sticky")
    assert r.error_code == E.inconsistent_group_protocol
    _, r = sh.sync(5, 0, members[1], gen, protocol_type="consumer", protocol_name="range")
    assert r.error_code == E.none and r.protocol_name == "range" and r.protocol_type == "consumer"
    # v4 and below: protocol fields are not checked (absent)
    _, r = sh.sync(4, 0, members[1], gen)
    assert r.error_code == E.none


def test_parked_syncs_get_rebalance_in_progress_when_a_member_leaves():
    sh = Shell()
    t1, _ = sh.join(3, 0)
    t2, _ = sh.join(3, 0)
    sh.expire(0)
    m1, m2 = sh.replies[t1].member_id, sh.replies[t2].member_id
    s2, r = sh.sync(5, 0, m2, 1)
    assert r is None
    leave = req("leave_group", 5, group_id="g", members=[{"member_id": m1, "group_instance_id": None}])
    sh.call("handle_leave_group", leave, 10)
    assert sh.replies[s2].error_code == E.rebalance_in_progress


def test_pending_sync_expiry_removes_silent_members():
    sh = Shell()
    t1, _ = sh.join(3, 0, rebalance_ms=20_000)
    t2, _ = sh.join(3, 0, rebalance_ms=20_000)
    sh.expire(0)
    m1, m2 = sh.replies[t1].member_id, sh.replies[t2].member_id
    sh.sync(5, 0, m1, 1, assignments={m1: b"a", m2: b"b"})  # leader syncs; m2 never does
    sh.heartbeat(4, 8000, m1, 1)
    sh.heartbeat(4, 8000, m2, 1)
    sh.heartbeat(4, 16_000, m1, 1)
    sh.heartbeat(4, 16_000, m2, 1)
    sh.expire(20_000)
    g = sh.shard.groups["g"]
    assert m2 not in g.members and g.state_name == "PreparingRebalance"


# --------------------------------------------------------------- Heartbeat
def test_heartbeat_errors():
    sh = Shell()
    assert sh.heartbeat(4, 0, "m", 0, group="nope") == E.unknown_member_id
    members, gen = stable_group(sh, n=1)
    assert sh.heartbeat(0, 0, members[0], gen) == E.none
    assert sh.heartbeat(4, 0, members[0], gen + 1) == E.illegal_generation
    assert sh.heartbeat(4, 0, "x", gen) == E.unknown_member_id


def test_heartbeat_in_completing_rebalance_is_ok():
    sh = Shell()
    t1, _ = sh.join(3, 0)
    sh.expire(0)
    assert sh.heartbeat(4, 1, sh.replies[t1].member_id, 1) == E.none


def test_session_expiry_removes_member_and_empties_group():
    sh = Shell()
    members, gen = stable_group(sh, n=1)
    n = len(sh.log)
    sh.expire(10_000)
    g = sh.shard.groups["g"]
    assert g.state_name == "Empty" and g.generation_id == gen + 1 and not g.members
    assert len(sh.log) == n + 1 and sh.log[-1].value["members"] == []


def test_pending_member_expires():
    sh = Shell()
    _, resp = sh.join(4, 0, session_ms=10_000)
    assert sh.shard.groups["g"].pending_members == {resp.member_id: 10_000}
    sh.expire(10_000)
    assert sh.shard.groups["g"].pending_members == {}


def test_new_member_join_timeout_answers_unknown_member():
    sh = Shell()
    ta, _ = sh.join(3, 0, session_ms=1_000_000, rebalance_ms=600_000)
    sh.expire(0)
    a = sh.replies[ta].member_id
    sh.sync(5, 0, a, 1, assignments={a: b""})
    # a new member parks; A never rejoins but keeps heartbeating
    tb, _ = sh.join(3, 1000, rebalance_ms=600_000)
    assert sh.heartbeat(4, 200_000, a, 1) == E.rebalance_in_progress
    sh.expire(301_000)  # the new member's 5-minute join timeout
    assert sh.replies[tb].error_code == E.unknown_member_id
    assert list(sh.shard.groups["g"].members) == [a]


# -------------------------------------------------------------- LeaveGroup
def test_leave_group_batched_with_per_member_errors():
    sh = Shell()
    proto = (("range", subscription("t")),)
    t1, _ = sh.join(9, 0, instance="i1", protocols=proto)
    t2, _ = sh.join(9, 0, instance="i2", protocols=proto)
    t3, _ = sh.join(3, 0, protocols=proto)
    sh.expire(0)
    m1, m2, m3 = (sh.replies[t].member_id for t in (t1, t2, t3))
    leave = req("leave_group", 5, group_id="g", members=[
        {"member_id": "", "group_instance_id": "i1"},   # by instance id only
        {"member_id": "wrong", "group_instance_id": "i2"},  # fenced
        {"member_id": m3, "group_instance_id": None},
        {"member_id": "ghost", "group_instance_id": None},
    ])
    r = sh.call("handle_leave_group", leave, 5).response
    assert r.error_code == E.none
    assert [m.error_code for m in r.members] == [E.none, E.fenced_instance_id, E.none, E.unknown_member_id]
    assert list(sh.shard.groups["g"].members) == [m2]


def test_leave_group_v0_single_member():
    sh = Shell()
    members, gen = stable_group(sh, n=2)
    r = sh.call("handle_leave_group", req("leave_group", 0, group_id="g", member_id="ghost"), 0).response
    assert r.error_code == E.unknown_member_id
    r = sh.call("handle_leave_group", req("leave_group", 1, group_id="g", member_id=members[1]), 0).response
    assert r.error_code == E.none
    assert state(sh) == "PreparingRebalance"
    r = sh.call("handle_leave_group", req("leave_group", 2, group_id="nope", member_id="x"), 0).response
    assert r.error_code == E.unknown_member_id


def test_last_member_leaving_empties_the_group():
    sh = Shell()
    members, gen = stable_group(sh, n=1)
    sh.call("handle_leave_group", req("leave_group", 3, group_id="g", members=[{"member_id": members[0]}]), 0)
    assert state(sh) == "Empty" and sh.shard.groups["g"].generation_id == gen + 1
    assert sh.heartbeat(4, 0, members[0], gen + 1) == E.unknown_member_id


def test_join_leave_pending_member_completes_join_phase():
    sh = Shell()
    members, gen = stable_group(sh, n=1)
    _, resp = sh.join(9, 0)  # a newcomer gets an id: pending
    pending = resp.member_id
    t, _ = sh.join(9, 0, member_id=members[0], protocols=(("range", subscription("t")),))
    assert t not in sh.replies  # waits for the pending member
    sh.call("handle_leave_group", req("leave_group", 3, group_id="g", members=[{"member_id": pending}]), 0)
    assert sh.replies[t].generation_id == gen + 1
