"""Properties of the server-side assignors: coverage, exclusivity, balance, stickiness."""

from __future__ import annotations

import uuid

from hypothesis import given, settings
from hypothesis import strategies as st

from shoal.groups.assignors import (
    MemberSubscription,
    partitions_of,
    range_assign,
    simple_assign,
    uniform_assign,
)

TOPICS = [uuid.UUID(int=i + 1) for i in range(4)]


@st.composite
def scenarios(draw, homogeneous: bool = False):
    counts = {t: draw(st.integers(0, 7)) for t in TOPICS[: draw(st.integers(1, 4))]}
    n = draw(st.integers(1, 9))
    members = {}
    common = frozenset(draw(st.sets(st.sampled_from(sorted(counts)), min_size=1)))
    for i in range(n):
        subs = common if homogeneous else frozenset(draw(st.sets(st.sampled_from(sorted(counts)))))
        # Arbitrary (possibly stale or overlapping) current assignments exercise stickiness.
        current = {}
        for t in draw(st.sets(st.sampled_from(TOPICS))):
            current[t] = frozenset(draw(st.sets(st.integers(0, 8), max_size=4)))
        members[f"m{i:02d}"] = MemberSubscription(subs, current)
    return members, counts


def subscribed_partitions(members, counts):
    return {(t, p) for s in members.values() for t in s.subscribed_topic_ids for p in range(counts[t])}


def check_common(members, counts, out):
    assert set(out) == set(members)
    for m, a in out.items():
        for t, ps in a.items():
            assert t in members[m].subscribed_topic_ids
            assert ps and all(0 <= p < counts[t] for p in ps)
    covered = set().union(*(partitions_of(a) for a in out.values()))
    assert covered == subscribed_partitions(members, counts)


@settings(max_examples=150, deadline=None)
@given(scenarios())
def test_consumer_assignors_cover_disjointly(scenario):
    members, counts = scenario
    for assign in (uniform_assign, range_assign):
        out = assign(members, counts)
        check_common(members, counts, out)
        total = sum(len(partitions_of(a)) for a in out.values())
        assert total == len(subscribed_partitions(members, counts)), "a partition went to two members"


@settings(max_examples=150, deadline=None)
@given(scenarios(homogeneous=True))
def test_uniform_and_simple_balance_within_one(scenario):
    members, counts = scenario
    for assign in (uniform_assign, simple_assign):
        out = assign(members, counts)
        sizes = [len(partitions_of(a)) for a in out.values()]
        assert max(sizes) - min(sizes) <= 1


@settings(max_examples=150, deadline=None)
@given(scenarios())
def test_range_balances_each_topic_within_one(scenario):
    members, counts = scenario
    out = range_assign(members, counts)
    for t, count in counts.items():
        subs = [m for m, s in members.items() if t in s.subscribed_topic_ids]
        if not subs or not count:
            continue
        sizes = [len(out[m].get(t, ())) for m in subs]
        assert max(sizes) - min(sizes) <= 1


@settings(max_examples=150, deadline=None)
@given(scenarios())
def test_simple_covers_every_partition(scenario):
    members, counts = scenario
    out = simple_assign(members, counts)
    check_common(members, counts, out)
    subscribed = subscribed_partitions(members, counts)
    members_per_partition = {}
    for m, a in out.items():
        for tp in partitions_of(a):
            members_per_partition.setdefault(tp, set()).add(m)
    assert set(members_per_partition) == subscribed


@settings(max_examples=150, deadline=None)
@given(scenarios(homogeneous=True))
def test_simple_shares_only_when_members_outnumber_partitions(scenario):
    members, counts = scenario
    out = simple_assign(members, counts)
    n_partitions = len(subscribed_partitions(members, counts))
    holders = [sum(1 for a in out.values() if tp in partitions_of(a)) for tp in subscribed_partitions(members, counts)]
    if len(members) <= n_partitions:
        assert all(h == 1 for h in holders)
    elif n_partitions:
        assert all(len(partitions_of(a)) == 1 for a in out.values())
        assert max(holders) - min(holders) <= 1


@settings(max_examples=200, deadline=None)
@given(scenarios())
def test_assignors_are_deterministic(scenario):
    members, counts = scenario
    for assign in (uniform_assign, range_assign, simple_assign):
        assert assign(members, counts) == assign(dict(reversed(list(members.items()))), counts)


def test_uniform_is_sticky_when_a_member_joins():
    t = TOPICS[0]
    counts = {t: 6}
    first = uniform_assign({"a": MemberSubscription(frozenset([t])), "b": MemberSubscription(frozenset([t]))}, counts)
    again = uniform_assign({
        "a": MemberSubscription(frozenset([t]), first["a"]),
        "b": MemberSubscription(frozenset([t]), first["b"]),
        "c": MemberSubscription(frozenset([t])),
    }, counts)
    assert again["a"][t] <= first["a"][t] and again["b"][t] <= first["b"][t]
    assert len(again["a"][t]) == len(again["b"][t]) == len(again["c"][t]) == 2


def test_simple_shares_partitions_between_extra_members():
    t = TOPICS[0]
    out = simple_assign({f"m{i}": MemberSubscription(frozenset([t])) for i in range(5)}, {t: 2})
    assert all(len(a[t]) == 1 for a in out.values())
    holders = sorted(sum(1 for a in out.values() if p in a[t]) for p in range(2))
    assert holders == [2, 3]


def test_range_gives_co_partitioned_topics_the_same_numbers():
    t1, t2 = TOPICS[:2]
    subs = frozenset([t1, t2])
    out = range_assign({"a": MemberSubscription(subs), "b": MemberSubscription(subs)}, {t1: 3, t2: 3})
    assert out["a"][t1] == out["a"][t2] == frozenset({0, 1})
    assert out["b"][t1] == out["b"][t2] == frozenset({2})
