"""Describe/List/Delete groups, the token mechanism, other kinds' hooks, replay equivalence."""

from __future__ import annotations

from kio.schema.errors import ErrorCode as E

from shoal.coordinator.records import CoordinatorRecord
from shoal.groups.manager import GroupCoordinatorShard, build_response, response_class
from tests.unit.groups.helpers import Shell, req, stable_group, subscription


def test_describe_groups():
    sh = Shell()
    members, gen = stable_group(sh, n=2)
    r = sh.call("handle_describe_groups", req("describe_groups", 5, groups=["g", "nope"]), 0).response
    g, nope = r.groups
    assert g.group_state == "Stable" and g.protocol_type == "consumer" and g.protocol_data == "range"
    assert [m.member_id for m in g.members] == members
    assert g.members[0].member_assignment == members[0].encode()
    assert g.members[0].member_metadata == subscription("t") and g.members[0].client_host == "/127.0.0.1"
    assert nope.group_state == "Dead" and nope.error_code == E.none
    r6 = sh.call("handle_describe_groups", req("describe_groups", 6, groups=["nope"]), 0).response
    assert r6.groups[0].error_code == E.group_id_not_found
    # during a rebalance no metadata or assignment is shown
    sh.join(9, 0, member_id=members[0], protocols=(("range", subscription("t")),))
    r = sh.call("handle_describe_groups", req("describe_groups", 0, groups=["g"]), 0).response
    assert r.groups[0].group_state == "PreparingRebalance" and r.groups[0].protocol_data == ""
    assert r.groups[0].members[0].member_assignment == b""


def test_list_groups_with_filters():
    sh = Shell()
    stable_group(sh, n=1, group="a")
    sh.commit(8, 0, {("t", 0): 1}, group="simple")

    class Other:
        group_type = "consumer"
        protocol_type = "consumer"
        state_name = "Stable"

    sh.shard.groups["c"] = Other()
    r = sh.call("handle_list_groups", req("list_groups", 0), 0).response
    assert {(g.group_id, g.protocol_type) for g in r.groups} == {("a", "consumer"), ("simple", ""), ("c", "consumer")}
    r = sh.call("handle_list_groups", req("list_groups", 4, states_filter=["stable"]), 0).response
    assert sorted(g.group_id for g in r.groups) == ["a", "c"]
    r = sh.call("handle_list_groups", req("list_groups", 5, states_filter=[], types_filter=["Classic"]), 0).response
    assert sorted((g.group_id, g.group_type, g.group_state) for g in r.groups) == [
        ("a", "classic", "Stable"), ("simple", "classic", "Empty")]
    # a classic API against another kind's group
    _, resp = sh.join(9, 0, group="c")
    assert resp.error_code == E.inconsistent_group_protocol


def test_delete_groups():
    sh = Shell()
    stable_group(sh, n=1, group="busy")
    sh.commit(8, 0, {("t", 0): 1, ("t", 1): 2}, group="idle")
    r = sh.call("handle_delete_groups", req("delete_groups", 2, groups_names=["busy", "idle", "nope"]), 0)
    codes = {x.group_id: x.error_code for x in r.response.results}
    assert codes == {"busy": E.non_empty_group, "idle": E.none, "nope": E.group_id_not_found}
    assert len(r.records) == 3 and all(x.value is None for x in r.records)
    assert "idle" not in sh.shard.groups and not sh.shard.offsets.has_offsets("idle")


def test_response_class_and_builder_cover_versions():
    for v in range(0, 10):
        cls = response_class(req("join_group", v, group_id="g", session_timeout=10_000, member_id="",
                                 protocol_type="consumer", protocols=[]))
        assert cls.__version__ == v and cls.__name__ == "JoinGroupResponse"
        build_response(cls, {"error_code": E.none, "members": [{"member_id": "m", "metadata": b""}]})


def test_join_responses_for_every_version():
    for v in range(0, 10):
        sh = Shell()
        t, resp = sh.join(v, 0)
        if v >= 4:
            assert resp.error_code == E.member_id_required
            t, resp = sh.join(v, 0, member_id=resp.member_id)
        sh.expire(0)
        r = sh.replies[t]
        assert type(r).__version__ == v and r.error_code == E.none and r.protocol_name == "range"


def test_register_kind_routes_records():
    sh = Shell()
    seen = []
    sh.shard.register_kind("consumer", [3, 5], lambda shard, rec: seen.append(rec.record_type))
    sh.shard.replay(CoordinatorRecord(5, {"group": "x"}, {"a": 1}))
    sh.shard.replay(CoordinatorRecord(9, {"group": "x"}, {"a": 1}))  # nobody owns it: ignored
    assert seen == [5]


def _snapshot(shard: GroupCoordinatorShard) -> dict:
    groups = {}
    for gid, g in shard.groups.items():
        groups[gid] = (
            g.state_name, g.generation_id, g.protocol_type, g.protocol_name, g.leader_id,
            [(m.member_id, m.group_instance_id, m.client_id, m.client_host, m.session_timeout_ms,
              m.rebalance_timeout_ms, m.metadata(g.protocol_name), m.assignment) for m in g.members.values()],
        )
    return {"groups": groups, "offsets": shard.offsets.offsets}


def test_replay_of_all_records_rebuilds_the_same_state():
    sh = Shell({"offsets.retention.minutes": 1, "offsets.retention.check.interval.ms": 1000})
    members, gen = stable_group(sh, n=3, group="a")
    sh.commit(8, 10, {("t", 0): 5, ("t", 1): 6}, group="a", member_id=members[0], generation=gen)
    # a static group with a replaced member
    proto = (("range", subscription("t")),)
    t1, _ = sh.join(9, 0, group="s", instance="i1", protocols=proto)
    sh.expire(0)
    m1 = sh.replies[t1].member_id
    sh.sync(5, 0, m1, 1, group="s", instance="i1", assignments={m1: b"z"})
    sh.join(9, 50, group="s", instance="i1", protocols=proto)
    # a member of "a" leaves: new generation with two members
    sh.call("handle_leave_group", req("leave_group", 3, group_id="a", members=[{"member_id": members[2]}]), 100)
    for m in members[:2]:
        sh.join(9, 100, group="a", member_id=m, protocols=proto)
    sync_tok, _ = sh.sync(5, 100, members[1], gen + 1, group="a")
    sh.sync(5, 100, members[0], gen + 1, group="a", assignments={members[0]: b"p", members[1]: b"q"})
    # simple groups, deletions, a group that emptied
    sh.commit(8, 200, {("x", 0): 1}, group="simple")
    sh.commit(8, 200, {("x", 0): 1}, group="doomed")
    sh.call("handle_delete_groups", req("delete_groups", 2, groups_names=["doomed"]), 300)
    members_e, gen_e = stable_group(sh, n=1, group="e")
    sh.expire(10_500)  # "e"'s member session expires; "a" and "s" heartbeat-less too
    sh.apply(sh.shard.on_topics_deleted(["x"], 11_000))

    fresh = GroupCoordinatorShard({}, new_member_id=lambda p: p)
    for rec in sh.log:
        fresh.replay(rec)
    assert _snapshot(fresh) == _snapshot(sh.shard)
    assert fresh.on_loaded(20_000)


def test_loaded_stable_group_serves_members():
    sh = Shell()
    members, gen = stable_group(sh, n=2)
    fresh = Shell()
    for rec in sh.log:
        fresh.shard.replay(rec)
    assert fresh.shard.on_loaded(1000) == [11_000]
    assert fresh.heartbeat(4, 1000, members[1], gen) == E.none
    _, r = fresh.sync(5, 1000, members[1], gen)
    assert r.assignment == members[1].encode()
    assert fresh.commit(8, 1000, {("t", 0): 1}, member_id=members[0], generation=gen) == {("t", 0): E.none}
    assert fresh.heartbeat(4, 5000, members[1], gen) == E.none
    fresh.expire(11_000)  # member 0 never heartbeats after the load: removed
    assert list(fresh.shard.groups["g"].members) == [members[1]]
