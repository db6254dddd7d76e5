"""Consumer groups of the KIP-848 protocol (ConsumerGroupHeartbeat): a pure state machine.

Theory of operation
-------------------
A consumer group is a set of members, each subscribed to topic names (or a regular
expression), plus three epochs:

* the *group epoch* grows whenever the inputs of the assignment change: a member
  joins or leaves, a subscription changes, or a subscribed topic appears or changes
  its partition count (the group keeps the subscribed topics' metadata, record 4);
* the *assignment epoch* is the group epoch that the current *target assignment* was
  computed for. Here the target is recomputed in the same step that bumps the group
  epoch, so the ASSIGNING state is only ever transient;
* each *member epoch* says which target epoch the member has reconciled to.

Reconciliation (KIP-848 "current assignment"): a member moves towards its target
without ever letting two members own one partition. Partitions it must give up are
first put in ``pending_revocation`` (member state UNREVOKED_PARTITIONS, epoch
unchanged); only once the member reports (``topic_partitions`` in the heartbeat) that
it no longer owns them does it move to the target epoch. Partitions it should get that
another member still owns (assigned or pending revocation) are withheld (state
UNRELEASED_PARTITIONS) until released. A member that does not revoke within its
rebalance timeout is fenced, as is one that stops heartbeating for the session timeout.

Epoch rules: a heartbeat with ``member_epoch`` 0 joins (a new member, or a restart of a
known one); -1 leaves; -2 is a static member's temporary leave (it keeps its
assignment, epoch -2, and the same ``instance_id`` may rejoin under a new member id
and take it over without a rebalance, KIP-345 semantics). A positive epoch must equal
the member's epoch, or its previous epoch provided what it owns is a subset of its
assignment; otherwise FENCED_MEMBER_EPOCH. Each partition a member owns keeps the
member epoch at which it was assigned (KIP-1251, record 8's AssignmentEpochs), so that an
OffsetCommit sent just before an epoch bump is still accepted for the partitions the
member owned at the epoch it sent (``validate_offset_commit``).

Handlers never change durable state. Each one works on a deep copy ("scratch") of the
group, applies every record it emits to that copy with the very code ``replay`` uses,
and builds its response from the copy. The shell appends the records, then calls
``replay`` for each, then sends the response; replaying the same records into a fresh
``ConsumerGroups`` therefore rebuilds the same groups. The one exception is the
*volatile timer table* (session and revocation deadlines), which is not durable, like
Kafka's coordinator timers: handlers refresh it, ``expire`` reads it, and a broker
that loads the topic calls ``on_loaded(now_ms)`` to give every member a fresh session.

The group does not know the log: ``topics`` (name -> (topic_id, partition count)) is an
input of the heartbeat. Group configs are resolved by the shell and passed in.

What it does not do: client-side assignors (``ConsumerGroupPrepareAssignment``), rack
awareness, the classic-protocol upgrade path (classic members in a consumer group),
offsets (``offsets.py``; see ``validate_offset_commit``).

How manager.py uses it
----------------------
``groups = ConsumerGroups(assignors=cfg["group.consumer.assignors"],
max_size=cfg["group.consumer.max.size"], session_timeout_ms=..., heartbeat_interval_ms=...)``

* ConsumerGroupHeartbeat (api 68): ``groups.handle_heartbeat(request, now_ms, topics,
  client_id=..., client_host=..., api_version=v)`` -> ``Result[ConsumerGroupHeartbeatResponse]``.
  Before calling, the manager makes sure the group id is not another kind's
  (answer GROUP_ID_NOT_FOUND / INCONSISTENT_GROUP_PROTOCOL itself if it is).
* ConsumerGroupDescribe (api 69): ``groups.handle_describe(request)``; for ids of other
  kinds use ``groups.describe_group(id)`` per id (answers GROUP_ID_NOT_FOUND).
* ListGroups: ``groups.list_groups()`` -> ``[GroupListing]``; DeleteGroups:
  ``groups.delete_group(group_id)`` -> ``Result[ErrorCode]`` (offsets are the manager's).
* OffsetCommit/OffsetFetch from consumer-protocol members:
  ``groups.validate_offset_commit(group_id, member_id, member_epoch, partitions)`` -> ErrorCode.
* Records 3..8: ``groups.replay(record)``. Timers: ``groups.expire(now_ms)``
  -> ``Result`` (``after`` = list of (group_id, member_id) removed); after loading,
  ``groups.on_loaded(now_ms)``. Every Result's ``deadlines`` lists when to call expire.

Event loop only; never awaits; not thread-safe.
"""

from __future__ import annotations

import copy
import datetime
import enum
import re
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Generic, TypeVar

from kio.schema.consumer_group_describe.v1 import request as describe_req
from kio.schema.consumer_group_describe.v1 import response as describe_resp
from kio.schema.consumer_group_heartbeat.v1 import request as hb_req
from kio.schema.consumer_group_heartbeat.v1 import response as hb_resp
from kio.schema.errors import ErrorCode
from kio.schema.types import GroupId, TopicName
from kio.static.primitive import i8, i32, i32Timedelta

from shoal.coordinator.records import CoordinatorRecord, RecordType, record, tombstone
from shoal.coordinator.result import Result
from shoal.errors import ApiError

from .assignors import (
    CONSUMER_ASSIGNORS,
    Assignment,
    MemberSubscription,
    assignment_from_json,
    assignment_to_json,
    from_partitions,
    normalize,
    partitions_of,
)

__all__ = [
    "GROUP_TYPE",
    "JOIN_GROUP_MEMBER_EPOCH",
    "KAFKA_STATE_NUMBERING",
    "LEAVE_GROUP_MEMBER_EPOCH",
    "LEAVE_GROUP_STATIC_MEMBER_EPOCH",
    "ConsumerGroup",
    "ConsumerGroupState",
    "ConsumerGroups",
    "ConsumerMember",
    "GroupListing",
    "MemberState",
    "TopicsMetadata",
    "member_state",
    "with_kafka_member_state",
]

GROUP_TYPE = "consumer"
JOIN_GROUP_MEMBER_EPOCH = 0
LEAVE_GROUP_MEMBER_EPOCH = -1
LEAVE_GROUP_STATIC_MEMBER_EPOCH = -2

TopicsMetadata = Mapping[str, tuple[uuid.UUID, int]]
"""topic name -> (topic_id, partition count): what the shell knows of the log."""

_RECORD_TYPES = frozenset(range(RecordType.CONSUMER_GROUP_METADATA, RecordType.CONSUMER_GROUP_CURRENT_MEMBER_ASSIGNMENT + 1))


class MemberState(enum.IntEnum):
    """Reconciliation state of a member, with Kafka's MemberState ids (what records 8 and 14
    hold in ``State``)."""

    STABLE = 0
    UNREVOKED_PARTITIONS = 1
    UNRELEASED_PARTITIONS = 2
    UNKNOWN = -1


KAFKA_STATE_NUMBERING = 1
"""``state_numbering`` of a member record whose ``state`` holds Kafka's ids (shoal writes it)."""

_EARLIER_STATE_IDS = {0: MemberState.UNREVOKED_PARTITIONS, 1: MemberState.UNRELEASED_PARTITIONS,
                      2: MemberState.STABLE}
"""The ids earlier shoal versions wrote, in records without ``state_numbering``."""


def member_state(value: Mapping[str, Any]) -> MemberState:
    """The state a replayed record 8 or 14 says, whichever numbering wrote it (an id that
    neither knows is UNKNOWN)."""
    raw = int(value.get("state", -1))
    if int(value.get("state_numbering", 0)) == KAFKA_STATE_NUMBERING:
        try:
            return MemberState(raw)
        except ValueError:
            return MemberState.UNKNOWN
    return _EARLIER_STATE_IDS.get(raw, MemberState.UNKNOWN)


def with_kafka_member_state(rec: CoordinatorRecord) -> CoordinatorRecord | None:
    """A member record (type 8 or 14) of an earlier shoal version, restated with Kafka's
    MemberState ids and ``state_numbering``; None for any other record (nothing to change)."""
    if rec.record_type not in (RecordType.CONSUMER_GROUP_CURRENT_MEMBER_ASSIGNMENT,
                               RecordType.SHARE_GROUP_CURRENT_MEMBER_ASSIGNMENT) or rec.value is None:
        return None
    if int(rec.value.get("state_numbering", 0)) == KAFKA_STATE_NUMBERING:
        return None
    value = dict(rec.value, state=int(member_state(rec.value)), state_numbering=KAFKA_STATE_NUMBERING)
    return replace(rec, value=value)


class ConsumerGroupState(enum.Enum):
    """Group states as ListGroups/ConsumerGroupDescribe spell them."""

    EMPTY = "Empty"
    ASSIGNING = "Assigning"
    RECONCILING = "Reconciling"
    STABLE = "Stable"
    DEAD = "Dead"


@dataclass(frozen=True, slots=True)
class GroupListing:
    """One ListGroups entry."""

    group_id: str
    protocol_type: str
    group_state: str
    group_type: str


@dataclass(frozen=True, slots=True)
class ConsumerMember:
    member_id: str
    instance_id: str | None = None
    rack_id: str | None = None
    client_id: str = ""
    client_host: str = ""
    subscribed_topic_names: tuple[str, ...] = ()
    """Sorted, without duplicates."""
    subscribed_topic_regex: str | None = None
    server_assignor: str | None = None
    rebalance_timeout_ms: int = -1
    # --- current assignment (record 8) ---
    member_epoch: int = 0
    previous_member_epoch: int = -1
    state: MemberState = MemberState.STABLE
    assigned: Assignment = field(default_factory=dict)
    """Partitions the member may use now."""
    pending_revocation: Assignment = field(default_factory=dict)
    """Partitions the member must give up before moving on; still owned by it."""
    assignment_epochs: Mapping[tuple[uuid.UUID, int], int] = field(default_factory=dict)
    """KIP-1251: the member epoch at which each partition of ``assigned`` and
    ``pending_revocation`` was assigned to it (record 8's AssignmentEpochs)."""

    def assignment_epoch(self, tp: tuple[uuid.UUID, int]) -> int | None:
        """The epoch at which the member got ``tp``, or None if it does not own it.
        Records of earlier versions carry no epochs: their partitions count as assigned
        at the member's current epoch."""
        if tp not in partitions_of(self.assigned) and tp not in partitions_of(self.pending_revocation):
            return None
        return self.assignment_epochs.get(tp, self.member_epoch)

    def _with_epochs(self, a: Assignment) -> list[dict[str, Any]]:
        return [dict(e, assignment_epochs=[self.assignment_epoch((uuid.UUID(e["topic_id"]), p))
                                           for p in e["partitions"]])
                for e in assignment_to_json(a)]

    def metadata_value(self) -> dict[str, Any]:
        return {
            "instance_id": self.instance_id,
            "rack_id": self.rack_id,
            "client_id": self.client_id,
            "client_host": self.client_host,
            "subscribed_topic_names": list(self.subscribed_topic_names),
            "subscribed_topic_regex": self.subscribed_topic_regex,
            "server_assignor": self.server_assignor,
            "rebalance_timeout_ms": self.rebalance_timeout_ms,
        }

    def assignment_value(self) -> dict[str, Any]:
        return {
            "member_epoch": self.member_epoch,
            "previous_member_epoch": self.previous_member_epoch,
            "state": int(self.state),
            "assigned_partitions": self._with_epochs(self.assigned),
            "partitions_pending_revocation": self._with_epochs(self.pending_revocation),
            "state_numbering": KAFKA_STATE_NUMBERING,
        }


@dataclass(slots=True)
class ConsumerGroup:
    """Durable state of one consumer group: exactly what records 3..8 say."""

    group_id: str
    group_epoch: int = 0
    assignment_epoch: int = 0
    members: dict[str, ConsumerMember] = field(default_factory=dict)
    target: dict[str, Assignment] = field(default_factory=dict)
    """member_id -> target assignment (record 7)."""
    subscribed_topics: dict[str, tuple[uuid.UUID, int]] = field(default_factory=dict)
    """Metadata of the topics some member subscribes to (record 4)."""
    static_members: dict[str, str] = field(default_factory=dict)
    """instance_id -> member_id; derived from members."""
    owners: dict[tuple[uuid.UUID, int], str] = field(default_factory=dict)
    """partition -> member owning it (assigned or pending revocation); derived."""

    group_type = GROUP_TYPE

    @property
    def state(self) -> ConsumerGroupState:
        if not self.members:
            return ConsumerGroupState.EMPTY
        if self.group_epoch > self.assignment_epoch:
            return ConsumerGroupState.ASSIGNING
        for m in self.members.values():
            if m.member_epoch != self.assignment_epoch or m.state != MemberState.STABLE:
                return ConsumerGroupState.RECONCILING
        return ConsumerGroupState.STABLE

    def preferred_assignor(self, default: str) -> str:
        """The assignor most members ask for (ties: by name); else ``default``."""
        counts: dict[str, int] = {}
        for m in self.members.values():
            if m.server_assignor:
                counts[m.server_assignor] = counts.get(m.server_assignor, 0) + 1
        if not counts:
            return default
        return min(counts, key=lambda a: (-counts[a], a))

    def member_topics(self, member: ConsumerMember, names: Iterable[str]) -> set[str]:
        """Names among ``names`` that ``member`` subscribes to (by name or regex)."""
        names = set(names)
        out = set(member.subscribed_topic_names) & names
        if member.subscribed_topic_regex:
            try:
                pattern = re.compile(member.subscribed_topic_regex)
            except re.error:
                return out
            out |= {n for n in names if pattern.fullmatch(n)}
        return out

    # --- replay of one record of this group -------------------------------------

    def apply(self, rec: CoordinatorRecord) -> None:
        t, v = rec.record_type, rec.value
        if t == RecordType.CONSUMER_GROUP_METADATA:
            self.group_epoch = 0 if v is None else int(v["epoch"])
        elif t == RecordType.CONSUMER_GROUP_PARTITION_METADATA:
            self.subscribed_topics = {} if v is None else {
                e["topic_name"]: (uuid.UUID(e["topic_id"]), int(e["num_partitions"])) for e in v["topics"]
            }
        elif t == RecordType.CONSUMER_GROUP_MEMBER_METADATA:
            mid = rec.key["member_id"]
            old = self.members.get(mid)
            if v is None:
                if old is not None:
                    self._drop_ownership(old)
                    if old.instance_id is not None and self.static_members.get(old.instance_id) == mid:
                        del self.static_members[old.instance_id]
                    del self.members[mid]
                return
            base = old if old is not None else ConsumerMember(member_id=mid)
            if old is not None and old.instance_id is not None and self.static_members.get(old.instance_id) == mid:
                del self.static_members[old.instance_id]
            new = replace(
                base,
                instance_id=v.get("instance_id"),
                rack_id=v.get("rack_id"),
                client_id=v.get("client_id", ""),
                client_host=v.get("client_host", ""),
                subscribed_topic_names=tuple(v.get("subscribed_topic_names") or ()),
                subscribed_topic_regex=v.get("subscribed_topic_regex"),
                server_assignor=v.get("server_assignor"),
                rebalance_timeout_ms=int(v.get("rebalance_timeout_ms", -1)),
            )
            self.members[mid] = new
            if new.instance_id is not None:
                self.static_members[new.instance_id] = mid
        elif t == RecordType.CONSUMER_GROUP_TARGET_ASSIGNMENT_METADATA:
            self.assignment_epoch = 0 if v is None else int(v["assignment_epoch"])
        elif t == RecordType.CONSUMER_GROUP_TARGET_ASSIGNMENT_MEMBER:
            mid = rec.key["member_id"]
            if v is None:
                self.target.pop(mid, None)
            else:
                self.target[mid] = assignment_from_json(v["topic_partitions"])
        elif t == RecordType.CONSUMER_GROUP_CURRENT_MEMBER_ASSIGNMENT:
            mid = rec.key["member_id"]
            old = self.members.get(mid)
            if old is None:
                if v is None:
                    return
                old = ConsumerMember(member_id=mid)
            self._drop_ownership(old)
            if v is None:
                new = replace(old, member_epoch=0, previous_member_epoch=-1, state=MemberState.STABLE,
                              assigned={}, pending_revocation={}, assignment_epochs={})
            else:
                new = replace(
                    old,
                    member_epoch=int(v["member_epoch"]),
                    previous_member_epoch=int(v["previous_member_epoch"]),
                    state=member_state(v),
                    assigned=assignment_from_json(v["assigned_partitions"]),
                    pending_revocation=assignment_from_json(v["partitions_pending_revocation"]),
                    assignment_epochs=_epochs_from_json(
                        [*v["assigned_partitions"], *v["partitions_pending_revocation"]]),
                )
            self.members[mid] = new
            for tp in partitions_of(new.assigned) | partitions_of(new.pending_revocation):
                self.owners[tp] = mid
        else:
            raise ValueError(f"not a consumer-group record type: {t}")

    def _drop_ownership(self, member: ConsumerMember) -> None:
        for tp in partitions_of(member.assigned) | partitions_of(member.pending_revocation):
            if self.owners.get(tp) == member.member_id:
                del self.owners[tp]


# --- record builders ------------------------------------------------------------------


def _group_key(group_id: str) -> dict[str, Any]:
    return {"group_id": group_id}


def _member_key(group_id: str, member_id: str) -> dict[str, Any]:
    return {"group_id": group_id, "member_id": member_id}


def _epoch_record(group_id: str, epoch: int) -> CoordinatorRecord:
    return record(RecordType.CONSUMER_GROUP_METADATA, _group_key(group_id), {"epoch": epoch})


def _metadata_record(group_id: str, topics: Mapping[str, tuple[uuid.UUID, int]]) -> CoordinatorRecord:
    value = {"topics": [
        {"topic_name": n, "topic_id": str(tid), "num_partitions": count}
        for n, (tid, count) in sorted(topics.items())
    ]}
    return record(RecordType.CONSUMER_GROUP_PARTITION_METADATA, _group_key(group_id), value)


def _member_record(group_id: str, m: ConsumerMember) -> CoordinatorRecord:
    return record(RecordType.CONSUMER_GROUP_MEMBER_METADATA, _member_key(group_id, m.member_id), m.metadata_value())


def _target_epoch_record(group_id: str, epoch: int) -> CoordinatorRecord:
    return record(RecordType.CONSUMER_GROUP_TARGET_ASSIGNMENT_METADATA, _group_key(group_id), {"assignment_epoch": epoch})


def _target_record(group_id: str, member_id: str, a: Mapping[uuid.UUID, frozenset[int]]) -> CoordinatorRecord:
    return record(RecordType.CONSUMER_GROUP_TARGET_ASSIGNMENT_MEMBER, _member_key(group_id, member_id),
                  {"topic_partitions": assignment_to_json(a)})


def _current_record(group_id: str, m: ConsumerMember) -> CoordinatorRecord:
    return record(RecordType.CONSUMER_GROUP_CURRENT_MEMBER_ASSIGNMENT, _member_key(group_id, m.member_id),
                  m.assignment_value())


def _member_tombstones(group_id: str, member_id: str) -> list[CoordinatorRecord]:
    key = _member_key(group_id, member_id)
    return [
        tombstone(RecordType.CONSUMER_GROUP_CURRENT_MEMBER_ASSIGNMENT, key),
        tombstone(RecordType.CONSUMER_GROUP_TARGET_ASSIGNMENT_MEMBER, key),
        tombstone(RecordType.CONSUMER_GROUP_MEMBER_METADATA, key),
    ]


# --- reconciliation -----------------------------------------------------------------


def _owns_any(owned: Assignment | None, partitions: Mapping[uuid.UUID, frozenset[int]]) -> bool:
    """Whether the member still owns any of ``partitions``; unknown (None) counts as yes."""
    if owned is None:
        return True
    return bool(partitions_of(owned) & partitions_of(partitions))


def _epochs_from_json(entries: Iterable[Mapping[str, Any]]) -> dict[tuple[uuid.UUID, int], int]:
    """Record 8's AssignmentEpochs (absent in records of earlier versions)."""
    out: dict[tuple[uuid.UUID, int], int] = {}
    for e in entries:
        epochs = e.get("assignment_epochs")
        if epochs is not None and len(epochs) == len(e["partitions"]):
            tid = uuid.UUID(e["topic_id"])
            out.update({(tid, int(p)): int(ep) for p, ep in zip(e["partitions"], epochs, strict=True)})
    return out


def reconcile(
    member: ConsumerMember,
    target_epoch: int,
    target: Mapping[uuid.UUID, frozenset[int]],
    owned: Assignment | None,
    owner_of: Callable[[tuple[uuid.UUID, int]], str | None],
) -> ConsumerMember:
    """The member's next current assignment (KIP-848 reconciliation); pure.

    ``owned`` is what the member reported owning (None: not reported this time);
    ``owner_of`` gives the member currently owning a partition, or None if free.
    """
    if member.state == MemberState.STABLE and member.member_epoch == target_epoch:
        return member
    if member.state == MemberState.UNREVOKED_PARTITIONS and _owns_any(owned, member.pending_revocation):
        return member
    current = partitions_of(member.assigned)
    wanted = partitions_of(target)
    keep = current & wanted
    revoke = current - wanted
    if revoke and _owns_any(owned, from_partitions(revoke)):
        return replace(
            member,
            state=MemberState.UNREVOKED_PARTITIONS,
            previous_member_epoch=member.member_epoch,
            assigned=from_partitions(keep),
            pending_revocation=from_partitions(revoke),
            assignment_epochs={tp: e for tp in current if (e := member.assignment_epoch(tp)) is not None},
        )
    add = wanted - current
    free = {tp for tp in add if owner_of(tp) in (None, member.member_id)}
    # KIP-1251: kept partitions keep the epoch they were assigned at; new ones get the
    # epoch the member moves to.
    epochs = {tp: target_epoch if (e := member.assignment_epoch(tp)) is None else e for tp in keep}
    epochs.update({tp: target_epoch for tp in free})
    return replace(
        member,
        state=MemberState.UNRELEASED_PARTITIONS if add - free else MemberState.STABLE,
        previous_member_epoch=member.member_epoch,
        member_epoch=target_epoch,
        assigned=from_partitions(keep | free),
        pending_revocation={},
        assignment_epochs=epochs,
    )


def _ms(td: Any) -> int:
    if isinstance(td, datetime.timedelta):
        return int(td / datetime.timedelta(milliseconds=1))
    return int(td)


def _td(ms: int) -> i32Timedelta:
    return i32Timedelta.parse(datetime.timedelta(milliseconds=ms))


def _random_member_id() -> str:
    return str(uuid.uuid4())


# --- the manager-facing class -----------------------------------------------------------


G = TypeVar("G")


class GroupKindQueries(Generic[G]):
    """Look-ups shared by the heartbeat-driven group kinds (consumer and share groups).

    A subclass keeps its groups in ``self._groups`` (group id -> group with a ``state``
    enum) and names its ``protocol_type`` and ``group_type``.
    """

    protocol_type: ClassVar[str]
    group_type: ClassVar[str]
    _groups: dict[str, G]

    def has_group(self, group_id: str) -> bool:
        return group_id in self._groups

    def group(self, group_id: str) -> G | None:
        return self._groups.get(group_id)

    @property
    def groups(self) -> Mapping[str, G]:
        return self._groups

    def list_groups(self, states: Iterable[str] = ()) -> list[GroupListing]:
        """ListGroups entries; ``states`` filters case-insensitively (empty: all)."""
        wanted = {s.lower() for s in states}
        out = []
        for gid in sorted(self._groups):
            st = self._groups[gid].state.value  # type: ignore[attr-defined]
            if not wanted or st.lower() in wanted:
                out.append(GroupListing(gid, self.protocol_type, st, self.group_type))
        return out


class ConsumerGroups(GroupKindQueries[ConsumerGroup]):
    """All consumer-protocol groups of one ``__consumer_offsets`` partition."""

    group_type = GROUP_TYPE
    protocol_type = "consumer"
    record_types = _RECORD_TYPES

    def __init__(
        self,
        *,
        assignors: Iterable[str] = ("uniform", "range"),
        max_size: int = 2**31 - 1,
        session_timeout_ms: int = 45_000,
        heartbeat_interval_ms: int = 5000,
        new_member_id: Callable[[], str] = _random_member_id,
    ) -> None:
        names = [a for a in assignors if a in CONSUMER_ASSIGNORS]
        if not names:
            raise ValueError(f"no known consumer assignor in {list(assignors)}")
        self.assignor_names = names
        self.max_size = max_size
        self.session_timeout_ms = session_timeout_ms
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self._new_member_id = new_member_id
        self._groups: dict[str, ConsumerGroup] = {}
        # Volatile timers: (group_id, member_id) -> deadline_ms. Not durable.
        self._session_deadlines: dict[tuple[str, str], int] = {}
        self._revocation_deadlines: dict[tuple[str, str], int] = {}

    # --- queries ------------------------------------------------------------------------

    def is_subscribed_to_topic(self, group_id: str, topic_name: str) -> bool:
        """For OffsetDelete (GROUP_SUBSCRIBED_TO_TOPIC)."""
        g = self._groups.get(group_id)
        return g is not None and topic_name in g.subscribed_topics

    def validate_offset_commit(self, group_id: str, member_id: str, member_epoch: int,
                               partitions: Iterable[tuple[str, int]] | None = None) -> ErrorCode:
        """Checks an OffsetCommit (or TxnOffsetCommit) against the group's members.

        Returns ``ErrorCode.none`` if allowed. A commit without a member (epoch < 0,
        as admin tools send) is allowed only while the group is empty; otherwise an
        unknown member gets UNKNOWN_MEMBER_ID and a wrong epoch STALE_MEMBER_EPOCH.
        KIP-1251 (Kafka 4.3): an epoch older than the member's is accepted when every
        committed partition (``partitions``: (topic name, partition)) is owned by the
        member since an epoch no newer than the one sent, so a commit that crossed an
        epoch bump is not refused.
        """
        g = self._groups.get(group_id)
        if member_epoch < 0 and (g is None or not g.members):
            return ErrorCode.none
        if g is None:
            return ErrorCode.unknown_member_id
        m = g.members.get(member_id)
        if m is None:
            return ErrorCode.unknown_member_id
        if member_epoch > m.member_epoch or (member_epoch < m.member_epoch and partitions is None):
            return ErrorCode.stale_member_epoch
        if member_epoch < m.member_epoch:
            for name, p in partitions or ():  # not None here: checked above
                # A partition the member owns is of a topic it subscribes to (record 4).
                topic = g.subscribed_topics.get(name)
                assigned_at = None if topic is None else m.assignment_epoch((topic[0], p))
                if assigned_at is None or member_epoch < assigned_at:
                    return ErrorCode.stale_member_epoch
        return ErrorCode.none

    def validate_offset_fetch(self, group_id: str, member_id: str | None, member_epoch: int) -> ErrorCode:
        """OffsetFetch v9+: epoch -1 (or no member id) means an admin fetch, always allowed."""
        if member_epoch < 0 or not member_id:
            return ErrorCode.none
        g = self._groups.get(group_id)
        m = None if g is None else g.members.get(member_id)
        if m is None:
            return ErrorCode.unknown_member_id
        if member_epoch != m.member_epoch:
            return ErrorCode.stale_member_epoch
        return ErrorCode.none

    # --- replay ------------------------------------------------------------------------

    def replay(self, rec: CoordinatorRecord) -> None:
        """Applies one durable record of types 3..8 (ValueError for any other type)."""
        if rec.record_type not in _RECORD_TYPES:
            raise ValueError(f"not a consumer-group record type: {rec.record_type}")
        gid = rec.key["group_id"]
        g = self._groups.get(gid)
        if rec.record_type == RecordType.CONSUMER_GROUP_METADATA and rec.value is None:
            self._groups.pop(gid, None)
            for table in (self._session_deadlines, self._revocation_deadlines):
                for k in [k for k in table if k[0] == gid]:
                    del table[k]
            return
        if g is None:
            if rec.value is None:
                return
            g = self._groups[gid] = ConsumerGroup(gid)
        g.apply(rec)
        if rec.record_type == RecordType.CONSUMER_GROUP_MEMBER_METADATA and rec.value is None:
            self._session_deadlines.pop((gid, rec.key["member_id"]), None)
            self._revocation_deadlines.pop((gid, rec.key["member_id"]), None)

    # --- ConsumerGroupHeartbeat -------------------------------------------------------

    def handle_heartbeat(
        self,
        request: hb_req.ConsumerGroupHeartbeatRequest,
        now_ms: int,
        topics: TopicsMetadata,
        *,
        client_id: str = "",
        client_host: str = "",
        api_version: int = 1,
        session_timeout_ms: int | None = None,
        heartbeat_interval_ms: int | None = None,
    ) -> Result[hb_resp.ConsumerGroupHeartbeatResponse]:
        """Answers one heartbeat (join, heartbeat, leave). Errors come back in the response.

        v0: a joining member sends an empty member id and the coordinator picks one;
        v1+: the client picks it. ``topics`` maps every existing topic name to
        (topic_id, partition count); regexes are matched against it (Python ``re``,
        full match, close to Kafka's RE2J).
        """
        session_ms = session_timeout_ms or self.session_timeout_ms
        interval_ms = heartbeat_interval_ms or self.heartbeat_interval_ms
        try:
            return self._heartbeat(request, now_ms, topics, client_id, client_host, api_version,
                                   session_ms, interval_ms)
        except ApiError as e:
            return Result(response=hb_resp.ConsumerGroupHeartbeatResponse(
                throttle_time=_td(0), error_code=e.error_code, error_message=e.message,
                member_id=None, member_epoch=i32(0), heartbeat_interval=_td(0), assignment=None))

    def _validate(self, r: hb_req.ConsumerGroupHeartbeatRequest, api_version: int) -> None:
        def bad(msg: str) -> ApiError:
            return ApiError(ErrorCode.invalid_request, msg)

        if not r.group_id:
            raise bad("GroupId can't be empty.")
        if r.instance_id is not None and not r.instance_id:
            raise bad("InstanceId can't be empty.")
        if r.rack_id is not None and not r.rack_id:
            raise bad("RackId can't be empty.")
        if api_version >= 1 and not r.member_id:
            raise bad("MemberId can't be empty.")
        epoch = r.member_epoch
        if epoch == JOIN_GROUP_MEMBER_EPOCH:
            if _ms(r.rebalance_timeout) == -1:
                raise bad("RebalanceTimeoutMs must be provided in first request.")
            if r.topic_partitions is None or len(r.topic_partitions) != 0:
                raise bad("TopicPartitions must be empty when (re-)joining.")
            if r.subscribed_topic_names is None and r.subscribed_topic_regex is None:
                raise bad("SubscribedTopicNames or SubscribedTopicRegex must be set in first request.")
        elif epoch == LEAVE_GROUP_STATIC_MEMBER_EPOCH:
            if r.instance_id is None:
                raise bad("InstanceId can't be null.")
        elif epoch < LEAVE_GROUP_STATIC_MEMBER_EPOCH:
            raise bad(f"MemberEpoch is invalid: {epoch}.")
        if r.subscribed_topic_regex:
            try:
                re.compile(r.subscribed_topic_regex)
            except re.error as e:
                raise ApiError(ErrorCode.invalid_regular_expression, f"SubscribedTopicRegex is invalid: {e}") from e
        if r.server_assignor is not None and r.server_assignor not in self.assignor_names:
            raise ApiError(ErrorCode.unsupported_assignor, f"ServerAssignor {r.server_assignor} is not supported.")

    def _heartbeat(
        self,
        r: hb_req.ConsumerGroupHeartbeatRequest,
        now_ms: int,
        topics: TopicsMetadata,
        client_id: str,
        client_host: str,
        api_version: int,
        session_ms: int,
        interval_ms: int,
    ) -> Result[hb_resp.ConsumerGroupHeartbeatResponse]:
        self._validate(r, api_version)
        gid, epoch = r.group_id, r.member_epoch
        if epoch in (LEAVE_GROUP_MEMBER_EPOCH, LEAVE_GROUP_STATIC_MEMBER_EPOCH):
            return self._leave(r)

        live = self._groups.get(gid)
        if live is None and epoch != JOIN_GROUP_MEMBER_EPOCH:
            raise ApiError(ErrorCode.unknown_member_id, f"Group {gid} not found.")
        g = copy.deepcopy(live) if live is not None else ConsumerGroup(gid)
        records: list[CoordinatorRecord] = []

        def emit(rec: CoordinatorRecord) -> None:
            records.append(rec)
            g.apply(rec)

        member_id = r.member_id
        if not member_id and epoch == JOIN_GROUP_MEMBER_EPOCH:
            member_id = self._new_member_id()
        member: ConsumerMember | None
        bump = False
        if r.instance_id is not None:
            holder = g.static_members.get(r.instance_id)
            if epoch == JOIN_GROUP_MEMBER_EPOCH:
                if holder is None or holder == member_id:
                    member = g.members.get(member_id)
                else:
                    old = g.members[holder]
                    if old.member_epoch != LEAVE_GROUP_STATIC_MEMBER_EPOCH:
                        raise ApiError(ErrorCode.unreleased_instance_id,
                                       f"Static member {holder} with instance id {r.instance_id} is not released.")
                    # Static member replacement: the new member id takes over the old one's
                    # epoch, target and current assignment without a rebalance.
                    old_target = g.target.get(holder, {})
                    for rec in _member_tombstones(gid, holder):
                        emit(rec)
                    member = replace(old, member_id=member_id, member_epoch=max(old.previous_member_epoch, 0))
                    emit(_member_record(gid, member))
                    emit(_target_record(gid, member_id, old_target))
                    emit(_current_record(gid, member))
                    member = g.members[member_id]
            else:
                if holder is None:
                    raise ApiError(ErrorCode.unknown_member_id, f"Instance id {r.instance_id} is unknown.")
                if holder != member_id:
                    raise ApiError(ErrorCode.fenced_instance_id,
                                   f"Instance id {r.instance_id} belongs to another member.")
                member = g.members[member_id]
        else:
            member = g.members.get(member_id)
            if member is None and epoch != JOIN_GROUP_MEMBER_EPOCH:
                raise ApiError(ErrorCode.unknown_member_id, f"Member {member_id} is not in group {gid}.")

        new_member = member is None
        if new_member:
            if len(g.members) >= self.max_size:
                raise ApiError(ErrorCode.group_max_size_reached,
                               f"The consumer group has reached its maximum capacity of {self.max_size} members "
                               f"(group.consumer.max.size={self.max_size}): stop a member of group {gid} or "
                               f"raise group.consumer.max.size.")
            member = ConsumerMember(member_id=member_id)
        assert member is not None
        before = member

        owned = None if r.topic_partitions is None else normalize(
            {tp.topic_id: tp.partitions for tp in r.topic_partitions if tp.topic_id is not None})
        if epoch > 0:
            if epoch > member.member_epoch:
                raise ApiError(ErrorCode.fenced_member_epoch,
                               f"The consumer group member has a greater member epoch ({epoch}) than the one known "
                               f"by the group coordinator ({member.member_epoch}).")
            if epoch < member.member_epoch and (
                epoch != member.previous_member_epoch
                or (owned is not None and not partitions_of(owned) <= partitions_of(member.assigned))
            ):
                raise ApiError(ErrorCode.fenced_member_epoch,
                               f"The consumer group member has a smaller member epoch ({epoch}) than the one known "
                               f"by the group coordinator ({member.member_epoch}).")

        # 1. Member metadata and subscription.
        names = member.subscribed_topic_names
        if r.subscribed_topic_names is not None:
            names = tuple(sorted(set(r.subscribed_topic_names)))
        regex = member.subscribed_topic_regex
        if r.subscribed_topic_regex is not None:
            regex = r.subscribed_topic_regex or None
        rebalance_ms = _ms(r.rebalance_timeout)
        updated = replace(
            member,
            instance_id=r.instance_id if r.instance_id is not None else member.instance_id,
            rack_id=r.rack_id if r.rack_id is not None else member.rack_id,
            client_id=client_id or member.client_id,
            client_host=client_host or member.client_host,
            subscribed_topic_names=names,
            subscribed_topic_regex=regex,
            server_assignor=r.server_assignor if r.server_assignor is not None else member.server_assignor,
            rebalance_timeout_ms=rebalance_ms if rebalance_ms != -1 else member.rebalance_timeout_ms,
        )
        if new_member or updated.metadata_value() != member.metadata_value():
            emit(_member_record(gid, updated))
        if new_member or (names, regex) != (member.subscribed_topic_names, member.subscribed_topic_regex):
            bump = True

        # 2. Metadata of the subscribed topics.
        bump |= self._maybe_update_metadata(g, topics, emit)

        # 3. Group epoch and target assignment.
        if bump:
            emit(_epoch_record(gid, g.group_epoch + 1))
        if g.group_epoch > g.assignment_epoch:
            self._compute_target(g, emit)

        # 4. Reconcile this member towards its target.
        current = g.members[member_id]
        nxt = reconcile(current, g.assignment_epoch, g.target.get(member_id, {}), owned, g.owners.get)
        if nxt.assignment_value() != current.assignment_value() or new_member:
            emit(_current_record(gid, nxt))
        nxt = g.members[member_id]

        # 5. Timers (volatile) and response.
        key = (gid, member_id)
        deadlines = [now_ms + session_ms]
        self._session_deadlines[key] = now_ms + session_ms
        if nxt.state == MemberState.UNREVOKED_PARTITIONS:
            if key not in self._revocation_deadlines or current.state != MemberState.UNREVOKED_PARTITIONS:
                timeout = nxt.rebalance_timeout_ms if nxt.rebalance_timeout_ms > 0 else session_ms
                self._revocation_deadlines[key] = now_ms + timeout
            deadlines.append(self._revocation_deadlines[key])
        else:
            self._revocation_deadlines.pop(key, None)

        send_assignment = (
            epoch == JOIN_GROUP_MEMBER_EPOCH
            or partitions_of(nxt.assigned) != partitions_of(before.assigned)
            or (owned is not None and partitions_of(owned) != partitions_of(nxt.assigned))
        )
        assignment = None
        if send_assignment:
            assignment = hb_resp.Assignment(topic_partitions=tuple(
                hb_resp.TopicPartitions(topic_id=t, partitions=tuple(i32(p) for p in sorted(ps)))
                for t, ps in sorted(nxt.assigned.items(), key=lambda kv: str(kv[0]))
            ))
        response = hb_resp.ConsumerGroupHeartbeatResponse(
            throttle_time=_td(0), error_code=ErrorCode.none, error_message=None,
            member_id=member_id, member_epoch=i32(nxt.member_epoch),
            heartbeat_interval=_td(interval_ms), assignment=assignment)
        return Result(records=records, response=response, deadlines=deadlines)

    def _maybe_update_metadata(self, g: ConsumerGroup, topics: TopicsMetadata,
                               emit: Callable[[CoordinatorRecord], None]) -> bool:
        """Refreshes record 4 from ``topics``; True if it changed (the epoch must bump)."""
        wanted: set[str] = set()
        for m in g.members.values():
            wanted |= g.member_topics(m, topics.keys())
        meta = {n: (topics[n][0], int(topics[n][1])) for n in sorted(wanted) if n in topics}
        if meta != g.subscribed_topics:
            emit(_metadata_record(g.group_id, meta))
            return True
        return False

    def _compute_target(self, g: ConsumerGroup, emit: Callable[[CoordinatorRecord], None]) -> None:
        name = g.preferred_assignor(self.assignor_names[0])
        assignor = CONSUMER_ASSIGNORS.get(name, CONSUMER_ASSIGNORS[self.assignor_names[0]])
        counts = {tid: n for tid, n in g.subscribed_topics.values()}
        subs = {
            mid: MemberSubscription(
                frozenset(g.subscribed_topics[n][0] for n in g.member_topics(m, g.subscribed_topics.keys())),
                g.target.get(mid, {}),
                m.rack_id,
            )
            for mid, m in g.members.items()
        }
        new_target = assignor(subs, counts)
        for mid in sorted(new_target):
            if mid not in g.target or normalize(new_target[mid]) != g.target[mid]:
                emit(_target_record(g.group_id, mid, new_target[mid]))
        emit(_target_epoch_record(g.group_id, g.group_epoch))

    def _remove_member(self, g: ConsumerGroup, member_id: str, emit: Callable[[CoordinatorRecord], None]) -> None:
        """Emits the member's tombstones, a group epoch bump and the new target."""
        for rec in _member_tombstones(g.group_id, member_id):
            emit(rec)
        # Topics nobody subscribes to any more leave the metadata.
        still = {n: v for n, v in g.subscribed_topics.items()
                 if any(n in g.member_topics(m, [n]) for m in g.members.values())}
        if still != g.subscribed_topics:
            emit(_metadata_record(g.group_id, still))
        emit(_epoch_record(g.group_id, g.group_epoch + 1))
        self._compute_target(g, emit)

    def _leave(self, r: hb_req.ConsumerGroupHeartbeatRequest) -> Result[hb_resp.ConsumerGroupHeartbeatResponse]:
        gid = r.group_id
        live = self._groups.get(gid)
        if live is None:
            raise ApiError(ErrorCode.unknown_member_id, f"Group {gid} not found.")
        g = copy.deepcopy(live)
        records: list[CoordinatorRecord] = []

        def emit(rec: CoordinatorRecord) -> None:
            records.append(rec)
            g.apply(rec)

        if r.instance_id is not None:
            holder = g.static_members.get(r.instance_id)
            if holder is None:
                raise ApiError(ErrorCode.unknown_member_id, f"Instance id {r.instance_id} is unknown.")
            if holder != r.member_id:
                raise ApiError(ErrorCode.fenced_instance_id,
                               f"Instance id {r.instance_id} belongs to another member.")
        member = g.members.get(r.member_id)
        if member is None:
            raise ApiError(ErrorCode.unknown_member_id, f"Member {r.member_id} is not in group {gid}.")
        if r.member_epoch == LEAVE_GROUP_STATIC_MEMBER_EPOCH:
            # Temporary leave: keep the assignment, mark the epoch; the session timer
            # keeps running and removes the member if its instance does not come back.
            emit(_current_record(gid, replace(member, member_epoch=LEAVE_GROUP_STATIC_MEMBER_EPOCH,
                                              previous_member_epoch=member.member_epoch,
                                              pending_revocation={})))
        else:
            self._remove_member(g, r.member_id, emit)
        response = hb_resp.ConsumerGroupHeartbeatResponse(
            throttle_time=_td(0), error_code=ErrorCode.none, error_message=None,
            member_id=r.member_id, member_epoch=i32(r.member_epoch), heartbeat_interval=_td(0), assignment=None)
        return Result(records=records, response=response, after=[(gid, r.member_id)]
                      if r.member_epoch == LEAVE_GROUP_MEMBER_EPOCH else [])

    # --- timers -------------------------------------------------------------------------

    def expire(self, now_ms: int) -> Result[None]:
        """Fences members whose session or revocation deadline has passed.

        Returns the records removing them (one group epoch bump and new target each),
        ``after`` = [(group_id, member_id)] removed, and ``deadlines`` = the next
        pending deadline, if any. Entries stay in the timer table until the removal
        is replayed, so a failed append is retried by the next ``expire``.
        """
        due: list[tuple[str, str]] = sorted(
            {k for k, d in self._session_deadlines.items() if d <= now_ms}
            | {k for k, d in self._revocation_deadlines.items() if d <= now_ms})
        records: list[CoordinatorRecord] = []
        removed: list[tuple[str, str]] = []
        scratch: dict[str, ConsumerGroup] = {}
        for gid, mid in due:
            live = self._groups.get(gid)
            if live is None or mid not in live.members:
                self._session_deadlines.pop((gid, mid), None)
                self._revocation_deadlines.pop((gid, mid), None)
                continue
            g = scratch.get(gid)
            if g is None:
                g = scratch[gid] = copy.deepcopy(live)

            def emit(rec: CoordinatorRecord, g: ConsumerGroup = g) -> None:
                records.append(rec)
                g.apply(rec)

            self._remove_member(g, mid, emit)
            removed.append((gid, mid))
        pending = [d for k, d in self._session_deadlines.items() if d > now_ms and k not in removed]
        pending += [d for k, d in self._revocation_deadlines.items() if d > now_ms and k not in removed]
        return Result(records=records, response=None, deadlines=[min(pending)] if pending else [], after=removed)

    def on_loaded(self, now_ms: int, session_timeout_ms: int | None = None) -> Result[None]:
        """After loading the partition: starts a fresh session timer for every member."""
        session_ms = session_timeout_ms or self.session_timeout_ms
        for gid, g in self._groups.items():
            for mid in g.members:
                self._session_deadlines.setdefault((gid, mid), now_ms + session_ms)
        pending = list(self._session_deadlines.values())
        return Result(deadlines=[min(pending)] if pending else [])

    # --- admin --------------------------------------------------------------------------

    def describe_group(self, group_id: str) -> describe_resp.DescribedGroup:
        """One ConsumerGroupDescribe entry; GROUP_ID_NOT_FOUND if no such consumer group."""
        g = self._groups.get(group_id)
        if g is None:
            return describe_resp.DescribedGroup(
                error_code=ErrorCode.group_id_not_found, error_message=f"Group {group_id} not found.",
                group_id=GroupId(group_id), group_state=ConsumerGroupState.DEAD.value, group_epoch=i32(0),
                assignment_epoch=i32(0), assignor_name="", members=())
        names = {tid: n for n, (tid, _) in g.subscribed_topics.items()}

        def described(a: Mapping[uuid.UUID, frozenset[int]]) -> describe_resp.Assignment:
            return describe_resp.Assignment(topic_partitions=tuple(
                describe_resp.TopicPartitions(topic_id=t, topic_name=TopicName(names.get(t, "")),
                                              partitions=tuple(i32(p) for p in sorted(ps)))
                for t, ps in sorted(a.items(), key=lambda kv: str(kv[0]))))

        members = tuple(
            describe_resp.Member(
                member_id=m.member_id, instance_id=m.instance_id, rack_id=m.rack_id,
                member_epoch=i32(m.member_epoch), client_id=m.client_id, client_host=m.client_host,
                subscribed_topic_names=tuple(TopicName(n) for n in m.subscribed_topic_names),
                subscribed_topic_regex=m.subscribed_topic_regex,
                assignment=described(m.assigned), target_assignment=described(g.target.get(m.member_id, {})),
                member_type=i8(1))
            for _, m in sorted(g.members.items()))
        return describe_resp.DescribedGroup(
            error_code=ErrorCode.none, error_message=None, group_id=GroupId(group_id), group_state=g.state.value,
            group_epoch=i32(g.group_epoch), assignment_epoch=i32(g.assignment_epoch),
            assignor_name=g.preferred_assignor(self.assignor_names[0]), members=members)

    def handle_describe(
        self, request: describe_req.ConsumerGroupDescribeRequest
    ) -> Result[describe_resp.ConsumerGroupDescribeResponse]:
        """ConsumerGroupDescribe for ids that are all consumer groups (or unknown)."""
        return Result(response=describe_resp.ConsumerGroupDescribeResponse(
            throttle_time=_td(0), groups=tuple(self.describe_group(gid) for gid in request.group_ids)))

    def delete_group(self, group_id: str) -> Result[ErrorCode]:
        """DeleteGroups for one consumer group: tombstones, or NON_EMPTY_GROUP/GROUP_ID_NOT_FOUND.

        The manager adds the tombstones of the group's committed offsets itself.
        """
        g = self._groups.get(group_id)
        if g is None:
            return Result(response=ErrorCode.group_id_not_found)
        if g.members:
            return Result(response=ErrorCode.non_empty_group)
        key = _group_key(group_id)
        records = [
            tombstone(RecordType.CONSUMER_GROUP_TARGET_ASSIGNMENT_METADATA, key),
            tombstone(RecordType.CONSUMER_GROUP_PARTITION_METADATA, key),
            tombstone(RecordType.CONSUMER_GROUP_METADATA, key),
        ]
        return Result(records=records, response=ErrorCode.none)
