"""Server-side partition assignors of the modern group protocols: pure functions.

Theory of operation
-------------------
An assignor maps the members of a group onto the partitions of the topics they
subscribe to. It sees only three things, all passed in:

* each member's subscribed topic ids (already resolved from names by the group);
* each member's *current target* assignment, so that it can stay sticky;
* the partition count of every topic (``topic_id -> count``).

It returns ``member_id -> {topic_id: frozenset(partitions)}`` for every member given
(members with nothing get an empty dict). It never reads a clock, never draws random
numbers and iterates in sorted order, so the same input always gives the same output:
replaying the group's records on another broker computes the same targets.

Assignors here:

* ``uniform`` (consumer groups, KIP-848's default): every subscribed partition goes to
  exactly one member; with identical subscriptions the counts are within one of each
  other, with different ones no single partition move could improve the balance.
  Sticky: a member keeps what it has unless moving it is needed for balance.
* ``range`` (consumer groups): per topic, the subscribed members sorted by member id
  take contiguous ranges; the first ``count % members`` get one more. Members that
  subscribe to co-partitioned topics thus get the same partition numbers of each
  (the point of range). Not sticky: the layout is a function of the member set.
* ``simple`` (share groups, KIP-932): partitions may be shared. While there are at
  least as many partitions as members it behaves like ``uniform`` (disjoint,
  balanced within one); with more members than partitions, each member gets exactly
  one partition and every partition gets ``members // partitions`` or one more
  members. Every subscribed partition has at least one member whenever a member
  subscribes to its topic. Sticky in the same way as ``uniform``.

The helpers at the bottom convert assignments to and from the JSON-able form used in
coordinator records (``[{"topic_id": str, "partitions": [int]}]``, sorted).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

__all__ = [
    "CONSUMER_ASSIGNORS",
    "SHARE_ASSIGNORS",
    "Assignment",
    "Assignor",
    "MemberSubscription",
    "assignment_from_json",
    "assignment_to_json",
    "from_partitions",
    "normalize",
    "partitions_of",
    "range_assign",
    "simple_assign",
    "uniform_assign",
]

Assignment = dict[uuid.UUID, frozenset[int]]
"""topic_id -> partition indexes; never holds an empty set (see ``normalize``)."""

TopicPartition = tuple[uuid.UUID, int]


@dataclass(frozen=True, slots=True)
class MemberSubscription:
    """What an assignor knows of one member."""

    subscribed_topic_ids: frozenset[uuid.UUID]
    """Topics the member subscribes to that exist (ids resolved by the group)."""
    current: Mapping[uuid.UUID, frozenset[int]] = field(default_factory=dict)
    """The member's current target assignment; used only for stickiness."""
    rack_id: str | None = None
    """Unused by these assignors (no rack awareness); kept for the record."""


Assignor = Callable[[Mapping[str, MemberSubscription], Mapping[uuid.UUID, int]], dict[str, Assignment]]

K = TypeVar("K", bound=Hashable)
I = TypeVar("I", bound=Hashable)


# --- assignment helpers ----------------------------------------------------------


def normalize(assignment: Mapping[uuid.UUID, Iterable[int]]) -> Assignment:
    """A copy with frozensets and without empty topics."""
    return {t: frozenset(ps) for t, ps in assignment.items() if ps}


def partitions_of(assignment: Mapping[uuid.UUID, Iterable[int]]) -> set[TopicPartition]:
    return {(t, p) for t, ps in assignment.items() for p in ps}


def from_partitions(tps: Iterable[TopicPartition]) -> Assignment:
    out: dict[uuid.UUID, set[int]] = {}
    for t, p in tps:
        out.setdefault(t, set()).add(p)
    return {t: frozenset(ps) for t, ps in out.items()}


def assignment_to_json(assignment: Mapping[uuid.UUID, Iterable[int]]) -> list[dict[str, Any]]:
    """Deterministic JSON form for records: sorted topics, sorted partitions, no empties."""
    return [
        {"topic_id": str(t), "partitions": sorted(ps)}
        for t, ps in sorted(assignment.items(), key=lambda kv: str(kv[0]))
        if ps
    ]


def assignment_from_json(data: Iterable[Mapping[str, Any]] | None) -> Assignment:
    if not data:
        return {}
    return normalize({uuid.UUID(e["topic_id"]): e["partitions"] for e in data})


# --- the balancing core ----------------------------------------------------------


def _balance_sticky(
    items: Sequence[I],
    bins: Sequence[K],
    current: Mapping[K, Iterable[I]],
) -> dict[K, list[I]]:
    """Places every item in exactly one bin; bin sizes differ by at most one.

    ``bins`` is ordered by preference: when the item count does not divide evenly,
    the bins earliest in the order get the extra item (after stickiness). A bin keeps
    items of ``current`` that are still in ``items`` (each item at most once) up to
    its fair share. Requires ``bins`` non-empty when ``items`` is non-empty.
    """
    out: dict[K, list[I]] = {b: [] for b in bins}
    if not items:
        return out
    valid = set(items)
    base, extra = divmod(len(items), len(bins))
    taken: set[I] = set()
    overflow: dict[K, list[I]] = {}
    for b in bins:
        for it in sorted(set(current.get(b, ())) & valid, key=_sort_key):
            if it in taken:
                continue
            if len(out[b]) < base:
                out[b].append(it)
                taken.add(it)
            else:
                overflow.setdefault(b, []).append(it)
    extra_left = extra
    for b in bins:
        if extra_left == 0:
            break
        for it in overflow.get(b, ()):
            if it not in taken:
                out[b].append(it)
                taken.add(it)
                extra_left -= 1
                break
    free = [it for it in items if it not in taken]
    free.reverse()  # pop() from the end yields items in their given order
    for b in bins:
        while len(out[b]) < base and free:
            out[b].append(free.pop())
    for b in bins:
        if not free or extra_left == 0:
            break
        if len(out[b]) == base:
            out[b].append(free.pop())
            extra_left -= 1
    assert not free, "balance: items left over"
    return out


def _sort_key(x: Any) -> Any:
    if isinstance(x, tuple):
        return tuple(str(e) if isinstance(e, uuid.UUID) else e for e in x)
    return str(x) if isinstance(x, uuid.UUID) else x


def _subscription_groups(
    members: Mapping[str, MemberSubscription], partition_counts: Mapping[uuid.UUID, int]
) -> list[tuple[list[str], list[TopicPartition]]]:
    """Topics grouped by the exact set of members subscribing to them.

    Returns [(sorted member ids, sorted partitions)], in a deterministic order.
    Topics nobody subscribes to, or that have no partitions, are left out.
    """
    # Members first grouped by their subscription (few distinct ones, however many
    # members): each topic then asks each subscription, not each member.
    by_subscription: dict[frozenset[uuid.UUID], list[str]] = {}
    for m, s in members.items():
        by_subscription.setdefault(s.subscribed_topic_ids, []).append(m)
    by_members: dict[tuple[str, ...], list[uuid.UUID]] = {}
    for topic_id in sorted(partition_counts, key=str):
        if partition_counts[topic_id] <= 0:
            continue
        subs = tuple(sorted(m for ids, ms in by_subscription.items() if topic_id in ids for m in ms))
        if subs:
            by_members.setdefault(subs, []).append(topic_id)
    groups = []
    for subs in sorted(by_members):
        tps = [(t, p) for t in by_members[subs] for p in range(partition_counts[t])]
        groups.append((list(subs), tps))
    return groups


def _within(current: Mapping[uuid.UUID, Iterable[int]], topics: Mapping[uuid.UUID, int]) -> set[TopicPartition]:
    """The partitions of ``current`` that are among ``topics``' (topic id -> partition count)."""
    return {(t, p) for t, ps in current.items() if t in topics for p in ps if 0 <= p < topics[t]}


def _as_assignment(tps: set[TopicPartition], one: dict[TopicPartition, Assignment]) -> Assignment:
    """``from_partitions(tps)``; a single partition's assignment is built once per partition
    (``one``), as most members of a group larger than its partition count hold one."""
    if len(tps) == 1:
        (tp,) = tps
        a = one.get(tp)
        if a is None:
            a = one[tp] = {tp[0]: frozenset((tp[1],))}
        return dict(a)
    return from_partitions(tps)


# --- assignors ---------------------------------------------------------------------


def uniform_assign(
    members: Mapping[str, MemberSubscription], partition_counts: Mapping[uuid.UUID, int]
) -> dict[str, Assignment]:
    """KIP-848 ``uniform``: disjoint, balanced, sticky.

    Each member first keeps the valid partitions it has; unowned partitions go to the
    least-loaded subscriber (partitions with fewest subscribers first); then a
    partition moves from its owner to its least-loaded subscriber while that owner has
    two or more partitions more. Each move lowers the sum of squared loads, so this
    ends; at the end no single move can improve balance, which for identical
    subscriptions means counts within one of each other.
    """
    subscribers: dict[uuid.UUID, list[str]] = {}
    for topic_id in partition_counts:
        subscribers[topic_id] = sorted(m for m, s in members.items() if topic_id in s.subscribed_topic_ids)
    all_tps = sorted(
        ((t, p) for t, n in partition_counts.items() if subscribers[t] for p in range(n)), key=_sort_key)
    owner: dict[TopicPartition, str] = {}
    load = {m: 0 for m in members}
    for m in sorted(members):
        for tp in sorted(partitions_of(members[m].current), key=_sort_key):
            t, p = tp
            if tp in owner or t not in members[m].subscribed_topic_ids or not 0 <= p < partition_counts.get(t, 0):
                continue
            owner[tp] = m
            load[m] += 1
    for tp in sorted(all_tps, key=lambda tp: (len(subscribers[tp[0]]), _sort_key(tp))):
        if tp not in owner:
            best = min(subscribers[tp[0]], key=lambda m: (load[m], m))
            owner[tp] = best
            load[best] += 1
    moved = True
    while moved:
        moved = False
        for tp in reversed(all_tps):  # shed the highest partitions first
            cur = owner[tp]
            best = min(subscribers[tp[0]], key=lambda m: (load[m], m))
            if load[cur] > load[best] + 1:
                owner[tp] = best
                load[cur] -= 1
                load[best] += 1
                moved = True
    out: dict[str, set[TopicPartition]] = {m: set() for m in members}
    for tp, m in owner.items():
        out[m].add(tp)
    return {m: from_partitions(tps) for m, tps in out.items()}


def range_assign(
    members: Mapping[str, MemberSubscription], partition_counts: Mapping[uuid.UUID, int]
) -> dict[str, Assignment]:
    """KIP-848 ``range``: per topic, contiguous ranges over members sorted by id."""
    out: dict[str, dict[uuid.UUID, frozenset[int]]] = {m: {} for m in members}
    for topic_id in sorted(partition_counts, key=str):
        count = partition_counts[topic_id]
        subs = sorted(m for m, s in members.items() if topic_id in s.subscribed_topic_ids)
        if not subs or count <= 0:
            continue
        base, extra = divmod(count, len(subs))
        start = 0
        for i, m in enumerate(subs):
            n = base + (1 if i < extra else 0)
            if n:
                out[m][topic_id] = frozenset(range(start, start + n))
            start += n
    return out


def simple_assign(
    members: Mapping[str, MemberSubscription], partition_counts: Mapping[uuid.UUID, int]
) -> dict[str, Assignment]:
    """KIP-932 ``simple``: balanced; shares partitions when members outnumber them."""
    load = dict.fromkeys(members, 0)
    out: dict[str, set[TopicPartition]] = {m: set() for m in members}
    for subs, tps in _subscription_groups(members, partition_counts):
        topics = {t: partition_counts[t] for t in dict.fromkeys(t for t, _ in tps)}
        current = {m: _within(members[m].current, topics) for m in subs}
        if len(tps) >= len(subs):
            order = sorted(subs, key=lambda m: (load[m], m))
            placed = _balance_sticky(tps, order, current)
            for m, got in placed.items():
                out[m].update(got)
                load[m] += len(got)
        else:
            # More members than partitions: place members into partitions instead.
            holders: dict[TopicPartition, list[str]] = {tp: [] for tp in tps}
            for m in subs:
                for tp in current[m]:
                    holders[tp].append(m)
            by_partition = _balance_sticky(sorted(subs, key=lambda m: (load[m], m)), tps, holders)
            for tp, ms in by_partition.items():
                for m in ms:
                    out[m].add(tp)
                    load[m] += 1
    one: dict[TopicPartition, Assignment] = {}
    return {m: _as_assignment(tps, one) for m, tps in out.items()}


CONSUMER_ASSIGNORS: dict[str, Assignor] = {"uniform": uniform_assign, "range": range_assign}
"""Consumer-group assignors by the name clients send in ``server_assignor``."""

SHARE_ASSIGNORS: dict[str, Assignor] = {"simple": simple_assign}
"""Share-group assignors by name (``group.share.assignors``)."""
