"""Share groups (KIP-932): membership, epochs, assignment and share-partition state lifecycle.

Theory of operation
-------------------
A share group is a set of members that subscribe to topic names and *share* the
partitions of those topics: the ``simple`` assignor may give one partition to several
members (when members outnumber partitions), and records are handed out per record
by the share-partition leader (``shoal.share``), not here. So, unlike KIP-848 consumer
groups, there is no revocation handshake: a member gets its target assignment as soon
as the target is computed, and its member epoch becomes the assignment epoch.

Epochs: the *group epoch* grows when a member joins or leaves, a subscription changes,
or a subscribed topic appears or changes partition count. As in Kafka 4.1+ (KIP-1101)
the group keeps no copy of its subscribed topics' metadata, only a hash of it
(``MetadataHash`` of record 11, ShareGroupMetadata, computed as Kafka does, see
``shoal.groups.metadata_hash``): each heartbeat hashes the current metadata of the
subscribed topics and bumps the epoch when the hash differs. Record 9
(ShareGroupPartitionMetadata), which Kafka 4.1 removed and earlier shoal versions wrote,
is still read from old data directories and otherwise ignored; the group's next epoch
bump (or its deletion) writes a tombstone for it. The target is recomputed in the same step, so the
*assignment epoch* equals the group epoch after every handler. A heartbeat with
``member_epoch`` 0 joins (v1: the client chose the member id, a UUID string), -1
leaves, a positive epoch must be the member's epoch (or its previous one, for a
heartbeat that crossed a bump); otherwise FENCED_MEMBER_EPOCH. A member that does not
heartbeat within the session timeout is removed by ``expire``; the shell then releases
its acquisition locks (the removed members are in ``Result.after``).

States (ListGroups/ShareGroupDescribe): EMPTY (no members), STABLE (members), DEAD
(deleted; only ever reported for unknown ids).

Share-partition state (record 15, ShareGroupStatePartitionMetadata, from the later
revision of KIP-932): the persisted state of a share-partition (SPSO, state epoch) lives
on the share coordinator and must be created before use and deleted with the group,
each in two stages so that a crash in between is retried:

* when a partition first enters the target assignment it is recorded as
  *initializing*; the shell then sends InitializeShareGroupState for it (the
  heartbeat's ``Result.after.initialize`` lists what to send, and
  ``partitions_to_initialize`` answers the same after a restart) and, on success,
  calls ``mark_initialized`` (the partition becomes *initialized*) or, on failure,
  ``mark_initialize_failed`` (it is retried on the next heartbeat);
* ``begin_delete_group`` moves all of an empty group's partitions to *deleting*; the
  shell sends DeleteShareGroupState, then ``complete_delete_group`` writes the
  tombstones.

A member is given only the partitions of its target that are *initialized* (KIP-932:
until the state exists, the heartbeat "responds ... but the list of assignments is
empty"), so a share-partition leader only ever serves partitions with persisted state.
The heartbeat handler initializes what the heartbeat made *initializing* before it
answers, then ``refresh_assignment`` adds what became initialized to the member's
assignment, so a joining member gets its partitions in its first answer when the
initialization succeeds; the others get them at their next heartbeat. The state epoch
an initialization writes is the group epoch at that time (as Kafka's group
coordinator does), so state initialized again after DeleteShareGroupOffsets carries a
higher epoch than the state a stale share-partition leader still holds.

Handlers never change durable state: each works on a copy of the group (``scratch``: new
maps of the same immutable members and assignments), applies its own records to the copy
with the code ``replay`` uses, and answers from the copy.
The shell appends the records, replays them, then replies. The only thing handlers
touch is the volatile session-timer table (not durable, like Kafka's timers); after
loading, ``on_loaded(now_ms)`` starts a session for every member.

Group configs (share.session.timeout.ms, share.heartbeat.interval.ms) and
group.share.max.size are resolved by the shell and passed to each call; the group does
not know the log either: ``topics`` (name -> (topic_id, partition count)) is an input.

How manager.py uses it
----------------------
``groups = ShareGroups(max_size=cfg["group.share.max.size"], session_timeout_ms=...,
heartbeat_interval_ms=...)``

* ShareGroupHeartbeat (api 76): ``groups.handle_heartbeat(request, now_ms, topics,
  client_id=..., client_host=..., session_timeout_ms=..., heartbeat_interval_ms=...,
  max_size=...)`` -> ``Result[ShareGroupHeartbeatResponse]``, ``after`` a ``ShareEffects``.
* ShareGroupDescribe (api 77): ``groups.handle_describe(request)`` or
  ``groups.describe_group(id)`` per id.
* ListGroups: ``list_groups()``; DeleteGroups: ``begin_delete_group`` /
  ``complete_delete_group``.
* Records 9..15: ``replay(record)``; timers: ``expire(now_ms, topics)`` -> ``Result`` whose
  ``after`` is a ``ShareEffects`` (``removed_members`` to release locks for).

Event loop only; never awaits; not thread-safe.
"""

from __future__ import annotations

import enum
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from kio.schema.errors import ErrorCode
from kio.schema.share_group_describe.v1 import request as describe_req
from kio.schema.share_group_describe.v1 import response as describe_resp
from kio.schema.share_group_heartbeat.v1 import request as hb_req
from kio.schema.share_group_heartbeat.v1 import response as hb_resp
from kio.schema.types import GroupId, TopicName
from kio.static.primitive import i32

from shoal.coordinator.records import CoordinatorRecord, RecordType, record, tombstone
from shoal.coordinator.result import Result
from shoal.errors import ApiError

from .assignors import (
    SHARE_ASSIGNORS,
    Assignment,
    MemberSubscription,
    assignment_from_json,
    assignment_to_json,
    from_partitions,
    normalize,
    partitions_of,
)
from .consumer import (
    KAFKA_STATE_NUMBERING,
    GroupKindQueries,
    MemberState,
    TopicsMetadata,
    _td,
)
from .metadata_hash import metadata_hash

__all__ = [
    "GROUP_TYPE",
    "ShareEffects",
    "ShareGroup",
    "ShareGroupState",
    "ShareGroups",
    "ShareMember",
    "heartbeat_assignment",
]

GROUP_TYPE = "share"
ASSIGNOR_NAME = "simple"
_RECORD_TYPES = frozenset(range(RecordType.SHARE_GROUP_PARTITION_METADATA,
                                RecordType.SHARE_GROUP_STATE_PARTITION_METADATA + 1))


class _WouldWrite(Exception):
    """A heartbeat tried on the live group would write records: it is done again on a copy."""


class ShareGroupState(enum.Enum):
    EMPTY = "Empty"
    STABLE = "Stable"
    DEAD = "Dead"


@dataclass(slots=True)
class ShareEffects:
    """What the shell must do once a share-group Result's records are durable."""

    removed_members: list[tuple[str, str]] = field(default_factory=list)
    """(group_id, member_id) that left or were fenced: release their acquisition locks."""
    initialize: dict[str, Assignment] = field(default_factory=dict)
    """group_id -> partitions newly *initializing*: send InitializeShareGroupState."""


@dataclass(frozen=True, slots=True)
class ShareMember:
    member_id: str
    rack_id: str | None = None
    client_id: str = ""
    client_host: str = ""
    subscribed_topic_names: tuple[str, ...] = ()
    """Sorted, without duplicates."""
    member_epoch: int = 0
    previous_member_epoch: int = -1
    assigned: Assignment = field(default_factory=dict)

    def metadata_value(self) -> dict[str, Any]:
        return {"rack_id": self.rack_id, "client_id": self.client_id, "client_host": self.client_host,
                "subscribed_topic_names": list(self.subscribed_topic_names)}

    def assignment_value(self) -> dict[str, Any]:
        return {"member_epoch": self.member_epoch, "previous_member_epoch": self.previous_member_epoch,
                "state": int(MemberState.STABLE), "assigned_partitions": assignment_to_json(self.assigned),
                "state_numbering": KAFKA_STATE_NUMBERING}


@dataclass(slots=True)
class ShareGroup:
    """Durable state of one share group: exactly what records 9..15 say."""

    group_id: str
    group_epoch: int = 0
    assignment_epoch: int = 0
    members: dict[str, ShareMember] = field(default_factory=dict)
    target: dict[str, Assignment] = field(default_factory=dict)
    metadata_hash: int = 0
    """Hash of the subscribed topics' metadata (record 11's MetadataHash; 0 in records of
    earlier shoal versions, so their first heartbeat bumps the epoch)."""
    legacy_partition_metadata: bool = False
    """A record 9 of an earlier shoal version is live for this group (to tombstone)."""
    initializing: Assignment = field(default_factory=dict)
    """Share-partitions whose state InitializeShareGroupState has not yet confirmed."""
    initialized: Assignment = field(default_factory=dict)
    """Share-partitions with persisted state on the share coordinator."""
    deleting: Assignment = field(default_factory=dict)
    """Share-partitions whose state is being deleted (DeleteShareGroupState)."""
    topic_names: dict[uuid.UUID, str] = field(default_factory=dict)
    """Names of the topics in the three sets above (for describing and the shell)."""
    _holders: dict[tuple[uuid.UUID, int], int] = field(default_factory=dict, compare=False, repr=False)
    """Partition -> how many members' targets hold it (kept by ``apply``, derived)."""
    _subscribers: dict[str, int] = field(default_factory=dict, compare=False, repr=False)
    """Topic name -> how many members subscribe to it (kept by ``apply``, derived)."""
    _single: int = field(default=0, compare=False, repr=False)
    """How many members' targets hold exactly one partition (kept by ``apply``, derived)."""
    _assigned: frozenset[tuple[uuid.UUID, int]] | None = field(default=None, compare=False, repr=False)
    """The keys of ``_holders`` (None until asked for after one came or went)."""
    _wanted: frozenset[str] | None = field(default=None, compare=False, repr=False)
    """The keys of ``_subscribers`` (None until asked for after one came or went)."""

    group_type = GROUP_TYPE

    def assigned_partitions(self) -> frozenset[tuple[uuid.UUID, int]]:
        """The partitions the target assignment gives some member. Kept up to date by each
        record (a count per partition), so that neither a heartbeat nor a target change
        walks every member's target."""
        if self._assigned is None:
            self._assigned = frozenset(self._holders)
        return self._assigned

    def wanted_topics(self) -> frozenset[str]:
        """The topic names some member subscribes to (a count per name, kept by each record)."""
        if self._wanted is None:
            self._wanted = frozenset(self._subscribers)
        return self._wanted

    def _count_subscriptions(self, names: Iterable[str], delta: int) -> None:
        counts = self._subscribers
        for n in names:
            c = counts.get(n, 0) + delta
            if c > 0:
                counts[n] = c
                if c == delta:
                    self._wanted = None
            else:
                counts.pop(n, None)
                self._wanted = None

    def _count_target(self, a: Assignment | None, delta: int) -> None:
        if not a:
            return
        if len(a) == 1 and len(next(iter(a.values()))) == 1:
            self._single += delta
        counts = self._holders
        for t, ps in a.items():
            for p in ps:
                c = counts.get((t, p), 0) + delta
                if c > 0:
                    counts[(t, p)] = c
                    if c == delta:
                        self._assigned = None
                else:
                    counts.pop((t, p), None)
                    self._assigned = None

    @property
    def state(self) -> ShareGroupState:
        return ShareGroupState.STABLE if self.members else ShareGroupState.EMPTY

    def scratch(self) -> ShareGroup:
        """A copy to apply a handler's records to, leaving this group as it is.

        ``apply`` never changes a member, an assignment or a partition set in place: it
        puts new ones in their place (members are frozen, assignments hold frozensets). So
        the copy shares them all and only the maps that ``apply`` writes into are new: a
        copy of a group of N members copies N references, where a deep copy rebuilt every
        member, target and topic id, milliseconds per heartbeat in a group of a thousand.
        """
        return replace(self, members=dict(self.members), target=dict(self.target),
                       topic_names=dict(self.topic_names), _holders=dict(self._holders),
                       _subscribers=dict(self._subscribers))

    def apply(self, rec: CoordinatorRecord) -> None:
        t, v = rec.record_type, rec.value
        if t == RecordType.SHARE_GROUP_METADATA:
            self.group_epoch = 0 if v is None else int(v["epoch"])
            self.metadata_hash = 0 if v is None else int(v.get("metadata_hash") or 0)
        elif t == RecordType.SHARE_GROUP_PARTITION_METADATA:
            # Written by earlier shoal versions only; the hash in record 11 replaces it.
            self.legacy_partition_metadata = v is not None
        elif t == RecordType.SHARE_GROUP_MEMBER_METADATA:
            mid = rec.key["member_id"]
            old = self.members.get(mid)
            if old is not None:
                self._count_subscriptions(old.subscribed_topic_names, -1)
            if v is None:
                self.members.pop(mid, None)
                return
            base = old or ShareMember(member_id=mid)
            self.members[mid] = updated = replace(
                base, rack_id=v.get("rack_id"), client_id=v.get("client_id", ""),
                client_host=v.get("client_host", ""),
                subscribed_topic_names=tuple(v.get("subscribed_topic_names") or ()))
            self._count_subscriptions(updated.subscribed_topic_names, 1)
        elif t == RecordType.SHARE_GROUP_TARGET_ASSIGNMENT_METADATA:
            self.assignment_epoch = 0 if v is None else int(v["assignment_epoch"])
        elif t == RecordType.SHARE_GROUP_TARGET_ASSIGNMENT_MEMBER:
            mid = rec.key["member_id"]
            self._count_target(self.target.get(mid), -1)
            if v is None:
                self.target.pop(mid, None)
            else:
                self.target[mid] = assignment_from_json(v["topic_partitions"])
                self._count_target(self.target[mid], 1)
        elif t == RecordType.SHARE_GROUP_CURRENT_MEMBER_ASSIGNMENT:
            mid = rec.key["member_id"]
            m = self.members.get(mid)
            if m is None:
                if v is None:
                    return
                m = ShareMember(member_id=mid)
            if v is None:
                self.members[mid] = replace(m, member_epoch=0, previous_member_epoch=-1, assigned={})
            else:
                self.members[mid] = replace(
                    m, member_epoch=int(v["member_epoch"]), previous_member_epoch=int(v["previous_member_epoch"]),
                    assigned=assignment_from_json(v["assigned_partitions"]))
        elif t == RecordType.SHARE_GROUP_STATE_PARTITION_METADATA:
            if v is None:
                self.initializing, self.initialized, self.deleting, self.topic_names = {}, {}, {}, {}
                return
            names: dict[uuid.UUID, str] = {}

            def load(entries: Iterable[Mapping[str, Any]]) -> Assignment:
                out: dict[uuid.UUID, Iterable[int]] = {}
                for e in entries:
                    tid = uuid.UUID(e["topic_id"])
                    names[tid] = e.get("topic_name", "")
                    out[tid] = e["partitions"]
                return normalize(out)

            self.initializing = load(v["initializing_topics"])
            self.initialized = load(v["initialized_topics"])
            self.deleting = load(v["deleting_topics"])
            self.topic_names = names
        else:
            raise ValueError(f"not a share-group record type: {t}")

    def state_metadata_value(self, initializing: Assignment, initialized: Assignment, deleting: Assignment,
                             names: Mapping[uuid.UUID, str]) -> dict[str, Any]:
        def dump(a: Assignment) -> list[dict[str, Any]]:
            return [dict(e, topic_name=names.get(uuid.UUID(e["topic_id"]), "")) for e in assignment_to_json(a)]

        return {"initializing_topics": dump(initializing), "initialized_topics": dump(initialized),
                "deleting_topics": dump(deleting)}


# --- record builders ----------------------------------------------------------------


def _group_key(group_id: str) -> dict[str, Any]:
    return {"group_id": group_id}


def _member_key(group_id: str, member_id: str) -> dict[str, Any]:
    return {"group_id": group_id, "member_id": member_id}


def _member_tombstones(group_id: str, member_id: str) -> list[CoordinatorRecord]:
    key = _member_key(group_id, member_id)
    return [tombstone(RecordType.SHARE_GROUP_CURRENT_MEMBER_ASSIGNMENT, key),
            tombstone(RecordType.SHARE_GROUP_TARGET_ASSIGNMENT_MEMBER, key),
            tombstone(RecordType.SHARE_GROUP_MEMBER_METADATA, key)]


def _subtract(a: Assignment, b: Mapping[uuid.UUID, Iterable[int]]) -> Assignment:
    return from_partitions(partitions_of(a) - partitions_of(b))


def _union(a: Assignment, b: Mapping[uuid.UUID, Iterable[int]]) -> Assignment:
    return from_partitions(partitions_of(a) | partitions_of(b))


def heartbeat_assignment(a: Assignment) -> hb_resp.Assignment:
    """A member's assignment as ShareGroupHeartbeat's response carries it."""
    return hb_resp.Assignment(topic_partitions=tuple(
        hb_resp.TopicPartitions(topic_id=t, partitions=tuple(i32(p) for p in sorted(ps)))
        for t, ps in sorted(a.items(), key=lambda kv: str(kv[0]))))


def _intersect(a: Assignment, b: Mapping[uuid.UUID, Iterable[int]]) -> Assignment:
    return from_partitions(partitions_of(a) & partitions_of(b))


def _random_member_id() -> str:
    return str(uuid.uuid4())


class ShareGroups(GroupKindQueries[ShareGroup]):
    """All share groups of one ``__consumer_offsets`` partition."""

    group_type = GROUP_TYPE
    protocol_type = "share"
    record_types = _RECORD_TYPES

    def __init__(self, *, max_size: int = 200, session_timeout_ms: int = 45_000,
                 heartbeat_interval_ms: int = 5000) -> None:
        self.max_size = max_size
        self.session_timeout_ms = session_timeout_ms
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self._groups: dict[str, ShareGroup] = {}
        self._session_deadlines: dict[tuple[str, str], int] = {}
        """Volatile: (group_id, member_id) -> session deadline. Not durable."""
        self._topics_seen: TopicsMetadata = {}
        """Volatile: the topic metadata the last heartbeat was given (names for describing,
        metadata for ``expire`` when the shell passes none)."""

    # --- queries --------------------------------------------------------------------

    def is_member(self, group_id: str, member_id: str) -> bool:
        """Whether ``member_id`` is a member (ShareFetch/ShareAcknowledge checks)."""
        g = self._groups.get(group_id)
        return g is not None and member_id in g.members

    def assignment_of(self, group_id: str, member_id: str) -> Assignment:
        g = self._groups.get(group_id)
        m = None if g is None else g.members.get(member_id)
        return {} if m is None else dict(m.assigned)

    def partitions_to_initialize(self, group_id: str | None = None) -> dict[str, Assignment]:
        """group_id -> partitions still *initializing* (all groups if ``group_id`` is None)."""
        ids = [group_id] if group_id is not None else sorted(self._groups)
        return {gid: dict(g.initializing) for gid in ids
                if (g := self._groups.get(gid)) is not None and g.initializing}

    def partitions_to_delete(self, group_id: str | None = None) -> dict[str, Assignment]:
        """group_id -> partitions in *deleting* (a deletion to finish after a restart)."""
        ids = [group_id] if group_id is not None else sorted(self._groups)
        return {gid: dict(g.deleting) for gid in ids
                if (g := self._groups.get(gid)) is not None and g.deleting}

    def initialized_partitions(self, group_id: str) -> Assignment:
        g = self._groups.get(group_id)
        return {} if g is None else dict(g.initialized)

    # --- replay -------------------------------------------------------------------------

    def replay(self, rec: CoordinatorRecord) -> None:
        """Applies one durable record of types 9..15 (ValueError for any other type)."""
        if rec.record_type not in _RECORD_TYPES:
            raise ValueError(f"not a share-group record type: {rec.record_type}")
        gid = rec.key["group_id"]
        if rec.record_type == RecordType.SHARE_GROUP_METADATA and rec.value is None:
            self._groups.pop(gid, None)
            for k in [k for k in self._session_deadlines if k[0] == gid]:
                del self._session_deadlines[k]
            return
        g = self._groups.get(gid)
        if g is None:
            if rec.value is None:
                return
            g = self._groups[gid] = ShareGroup(gid)
        g.apply(rec)
        if rec.record_type == RecordType.SHARE_GROUP_MEMBER_METADATA and rec.value is None:
            self._session_deadlines.pop((gid, rec.key["member_id"]), None)

    # --- ShareGroupHeartbeat ----------------------------------------------------------

    def handle_heartbeat(
        self,
        request: hb_req.ShareGroupHeartbeatRequest,
        now_ms: int,
        topics: TopicsMetadata,
        *,
        client_id: str = "",
        client_host: str = "",
        session_timeout_ms: int | None = None,
        heartbeat_interval_ms: int | None = None,
        max_size: int | None = None,
    ) -> Result[hb_resp.ShareGroupHeartbeatResponse]:
        """Answers one ShareGroupHeartbeat (join, heartbeat or leave).

        Errors come back in the response (INVALID_REQUEST, UNKNOWN_MEMBER_ID,
        FENCED_MEMBER_EPOCH, GROUP_MAX_SIZE_REACHED). ``after`` is a ``ShareEffects``.
        """
        session_ms = session_timeout_ms or self.session_timeout_ms
        interval_ms = heartbeat_interval_ms or self.heartbeat_interval_ms
        limit = max_size or self.max_size
        self._topics_seen = topics
        try:
            return self._heartbeat(request, now_ms, topics, client_id, client_host, session_ms, interval_ms, limit)
        except ApiError as e:
            return Result(response=hb_resp.ShareGroupHeartbeatResponse(
                throttle_time=_td(0), error_code=e.error_code, error_message=e.message, member_id=None,
                member_epoch=i32(0), heartbeat_interval=_td(0), assignment=None), after=ShareEffects())

    @staticmethod
    def _validate(r: hb_req.ShareGroupHeartbeatRequest) -> None:
        def bad(msg: str) -> ApiError:
            return ApiError(ErrorCode.invalid_request, msg)

        if not r.group_id:
            raise bad("GroupId can't be empty.")
        if not r.member_id:
            raise bad("MemberId can't be empty.")
        if r.rack_id is not None and not r.rack_id:
            raise bad("RackId can't be empty.")
        if r.member_epoch == 0:
            if not r.subscribed_topic_names:
                raise bad("SubscribedTopicNames must be set in first request.")
        elif r.member_epoch < -1:
            raise bad(f"MemberEpoch is invalid: {r.member_epoch}.")

    def _heartbeat(self, r: hb_req.ShareGroupHeartbeatRequest, now_ms: int, topics: TopicsMetadata,
                   client_id: str, client_host: str, session_ms: int, interval_ms: int,
                   limit: int) -> Result[hb_resp.ShareGroupHeartbeatResponse]:
        self._validate(r)
        live = self._groups.get(r.group_id)
        if live is None and r.member_epoch != 0:
            raise ApiError(ErrorCode.unknown_member_id, f"Group {r.group_id} not found.")
        if live is not None:
            # Most heartbeats change nothing: they are tried on the live group itself, and
            # only one that would write records is done again on a copy (its records change
            # the live group when they are replayed, once written). A group of N members
            # then costs a steady heartbeat no copy of N members.
            try:
                return self._heartbeat_in(live, False, r, now_ms, topics, client_id, client_host, session_ms,
                                          interval_ms, limit)
            except _WouldWrite:
                pass
        g = live.scratch() if live is not None else ShareGroup(r.group_id)
        return self._heartbeat_in(g, True, r, now_ms, topics, client_id, client_host, session_ms, interval_ms,
                                  limit)

    def _heartbeat_in(self, g: ShareGroup, writable: bool, r: hb_req.ShareGroupHeartbeatRequest, now_ms: int,
                      topics: TopicsMetadata, client_id: str, client_host: str, session_ms: int,
                      interval_ms: int, limit: int) -> Result[hb_resp.ShareGroupHeartbeatResponse]:
        """The heartbeat on ``g``: the live group when not ``writable`` (then the first record
        to emit raises _WouldWrite before anything changed), else a scratch copy."""
        gid, mid, epoch = r.group_id, r.member_id, r.member_epoch
        records: list[CoordinatorRecord] = []
        effects = ShareEffects()

        def emit(rec: CoordinatorRecord) -> None:
            if not writable:
                raise _WouldWrite
            records.append(rec)
            g.apply(rec)

        member = g.members.get(mid)
        if epoch == -1:
            if member is None:
                raise ApiError(ErrorCode.unknown_member_id, f"Member {mid} is not in group {gid}.")
            self._remove_member(g, mid, emit, effects, topics)
            response = hb_resp.ShareGroupHeartbeatResponse(
                throttle_time=_td(0), error_code=ErrorCode.none, error_message=None, member_id=mid,
                member_epoch=i32(-1), heartbeat_interval=_td(0), assignment=None)
            return Result(records=records, response=response, after=effects)

        new_member = member is None
        if member is None:
            if epoch != 0:
                raise ApiError(ErrorCode.unknown_member_id, f"Member {mid} is not in group {gid}.")
            if len(g.members) >= limit:
                raise ApiError(ErrorCode.group_max_size_reached,
                               f"The share group has reached its maximum capacity of {limit} members "
                               f"(group.share.max.size={limit}): stop a member of share group {gid} or raise "
                               f"group.share.max.size (at most 1000).")
            member = ShareMember(member_id=mid)
        elif epoch > 0:
            if epoch > member.member_epoch:
                raise ApiError(ErrorCode.fenced_member_epoch,
                               f"The share group member has a greater member epoch ({epoch}) than the one known "
                               f"by the group coordinator ({member.member_epoch}).")
            if epoch < member.member_epoch and epoch != member.previous_member_epoch:
                raise ApiError(ErrorCode.fenced_member_epoch,
                               f"The share group member has a smaller member epoch ({epoch}) than the one known "
                               f"by the group coordinator ({member.member_epoch}).")
        before = member

        names = member.subscribed_topic_names
        if r.subscribed_topic_names is not None:
            names = tuple(sorted(set(r.subscribed_topic_names)))
        updated = replace(member, rack_id=r.rack_id if r.rack_id is not None else member.rack_id,
                          client_id=client_id or member.client_id, client_host=client_host or member.client_host,
                          subscribed_topic_names=names)
        bump = False
        if new_member or updated.metadata_value() != member.metadata_value():
            emit(record(RecordType.SHARE_GROUP_MEMBER_METADATA, _member_key(gid, mid), updated.metadata_value()))
        if new_member or names != member.subscribed_topic_names:
            bump = True
        meta = self._subscribed_metadata(g, topics)
        digest = metadata_hash(meta, topics)
        if bump or digest != g.metadata_hash:
            self._bump(g, digest, emit)
        if g.group_epoch > g.assignment_epoch:
            self._compute_target(g, meta, emit, effects, joined=mid if new_member else None)

        current = g.members[mid]
        target = _intersect(g.target.get(mid, {}), g.initialized)
        if new_member or current.member_epoch != g.assignment_epoch or current.assigned != target:
            nxt = replace(current, previous_member_epoch=current.member_epoch, member_epoch=g.assignment_epoch,
                          assigned=dict(target))
            emit(record(RecordType.SHARE_GROUP_CURRENT_MEMBER_ASSIGNMENT, _member_key(gid, mid),
                        nxt.assignment_value()))
        nxt = g.members[mid]

        self._session_deadlines[(gid, mid)] = now_ms + session_ms
        assignment = None
        if epoch == 0 or partitions_of(nxt.assigned) != partitions_of(before.assigned):
            assignment = heartbeat_assignment(nxt.assigned)
        response = hb_resp.ShareGroupHeartbeatResponse(
            throttle_time=_td(0), error_code=ErrorCode.none, error_message=None, member_id=mid,
            member_epoch=i32(nxt.member_epoch), heartbeat_interval=_td(interval_ms), assignment=assignment)
        return Result(records=records, response=response, deadlines=[now_ms + session_ms], after=effects)

    @staticmethod
    def _subscribed_metadata(g: ShareGroup, topics: TopicsMetadata) -> dict[str, tuple[uuid.UUID, int]]:
        """name -> (topic id, partition count) of the subscribed topics that exist."""
        wanted = g.wanted_topics()
        return {n: (topics[n][0], int(topics[n][1])) for n in sorted(wanted) if n in topics}

    @staticmethod
    def _bump(g: ShareGroup, digest: int, emit: Callable[[CoordinatorRecord], None]) -> None:
        """The next group epoch, with the subscribed topics' metadata hash (record 11)."""
        emit(record(RecordType.SHARE_GROUP_METADATA, _group_key(g.group_id),
                    {"epoch": g.group_epoch + 1, "metadata_hash": digest}))
        if g.legacy_partition_metadata:
            emit(tombstone(RecordType.SHARE_GROUP_PARTITION_METADATA, _group_key(g.group_id)))

    def _compute_target(self, g: ShareGroup, meta: Mapping[str, tuple[uuid.UUID, int]],
                        emit: Callable[[CoordinatorRecord], None], effects: ShareEffects,
                        joined: str | None = None) -> None:
        """The target for the group's epoch: computed once per group epoch (never for a
        heartbeat that bumped nothing), and only the members whose target moved get a record.

        ``joined``: the member whose join bumped the epoch. A join to, or a removal from, a
        balanced group whose members all subscribe alike and hold one partition each (more
        members than partitions: the shape of a large share group) is placed from the
        group's per-partition holder counts, in O(partitions) instead of the assignor's
        O(members); the result is the one the ``simple`` assignor gives (see
        ``_balanced_change``)."""
        quick = self._balanced_change(g, meta, joined)
        if quick is not None:
            self._emit_target(g, meta, quick, quick, emit, effects)
            return
        counts = {tid: c for tid, c in meta.values()}
        ids_of: dict[tuple[str, ...], frozenset[uuid.UUID]] = {}  # per distinct subscription, not per member
        subs: dict[str, MemberSubscription] = {}
        target = g.target
        for mid, m in g.members.items():
            names = m.subscribed_topic_names
            ids = ids_of.get(names)
            if ids is None:
                ids = ids_of[names] = frozenset(meta[n][0] for n in names if n in meta)
            subs[mid] = MemberSubscription(ids, target.get(mid, {}), m.rack_id)
        new_target = SHARE_ASSIGNORS[ASSIGNOR_NAME](subs, counts)
        moved = [mid for mid, a in new_target.items() if target.get(mid) != normalize(a)]
        self._emit_target(g, meta, new_target, moved, emit, effects)

    def _emit_target(self, g: ShareGroup, meta: Mapping[str, tuple[uuid.UUID, int]],
                     new_target: Mapping[str, Assignment], moved: Iterable[str],
                     emit: Callable[[CoordinatorRecord], None], effects: ShareEffects) -> None:
        for mid in sorted(moved):
            emit(record(RecordType.SHARE_GROUP_TARGET_ASSIGNMENT_MEMBER, _member_key(g.group_id, mid),
                        {"topic_partitions": assignment_to_json(new_target[mid])}))
        emit(record(RecordType.SHARE_GROUP_TARGET_ASSIGNMENT_METADATA, _group_key(g.group_id),
                    {"assignment_epoch": g.group_epoch}))
        # Partitions assigned for the first time start their two-stage initialization.
        assigned = g.assigned_partitions()
        fresh = assigned - partitions_of(g.initializing) - partitions_of(g.initialized)
        if fresh:
            names = dict(g.topic_names)
            names.update({tid: n for n, (tid, _) in meta.items()})
            emit(record(RecordType.SHARE_GROUP_STATE_PARTITION_METADATA, _group_key(g.group_id),
                        g.state_metadata_value(_union(g.initializing, from_partitions(fresh)), g.initialized,
                                               g.deleting, names)))
            effects.initialize[g.group_id] = _union(effects.initialize.get(g.group_id, {}), from_partitions(fresh))

    @staticmethod
    def _balanced_change(g: ShareGroup, meta: Mapping[str, tuple[uuid.UUID, int]],
                         joined: str | None) -> dict[str, Assignment] | None:
        """The target changes of a join (``joined``) or of a removal (None) when the group
        has the shape below; None when the assignor must run.

        Shape: every member subscribes to the same topics; every member but ``joined`` has
        a target of exactly one partition; every partition of those topics is held, by
        holder counts within one of each other; the members (without ``joined``) outnumber
        the partitions. The ``simple`` assignor then keeps every member on its partition
        (a partition keeps its holders up to the fair share, and the partitions over it
        are exactly as many as the extra members), so a joining member goes to the first
        partition (topic id order, then partition order) with the fewest holders and
        nobody else moves; a removal that leaves the counts within one moves nobody.
        """
        n = len(g.members)
        subscribers = g._subscribers
        if not n or not subscribers or any(c != n for c in subscribers.values()):
            return None
        if joined is None:
            expected = n
        elif joined in g.members and joined not in g.target:
            expected = n - 1
        else:
            return None
        if len(g.target) != expected or g._single != expected:
            return None
        tps = [(tid, p) for tid, c in sorted((meta[name] for name in subscribers if name in meta),
                                            key=lambda tc: str(tc[0]))
               for p in range(c)]
        holders = g._holders
        if not tps or len(holders) != len(tps) or expected <= len(tps):
            return None
        counts = [holders.get(tp, 0) for tp in tps]
        low = min(counts)
        if low == 0 or max(counts) - low > 1:
            return None
        if joined is None:
            return {}
        t, p = tps[counts.index(low)]
        return {joined: {t: frozenset((p,))}}

    def _remove_member(self, g: ShareGroup, member_id: str, emit: Callable[[CoordinatorRecord], None],
                       effects: ShareEffects, topics: TopicsMetadata) -> None:
        for rec in _member_tombstones(g.group_id, member_id):
            emit(rec)
        meta = self._subscribed_metadata(g, topics)
        self._bump(g, metadata_hash(meta, topics), emit)
        self._compute_target(g, meta, emit, effects)
        # Remaining members get their new target at once (no revocation handshake);
        # their epochs move when they next heartbeat.
        effects.removed_members.append((g.group_id, member_id))

    # --- timers -----------------------------------------------------------------------

    def expire(self, now_ms: int, topics: TopicsMetadata | None = None) -> Result[None]:
        """Removes members whose session expired.

        ``topics`` is the current topic metadata, for the remaining members' new target
        (None: the metadata the last heartbeat saw). ``after`` is a ``ShareEffects``
        whose ``removed_members`` the shell must release acquisition locks for;
        ``deadlines`` holds the next session deadline.
        """
        if topics is None:
            topics = self._topics_seen
        due = sorted(k for k, d in self._session_deadlines.items() if d <= now_ms)
        records: list[CoordinatorRecord] = []
        effects = ShareEffects()
        scratch: dict[str, ShareGroup] = {}
        for gid, mid in due:
            live = self._groups.get(gid)
            if live is None or mid not in live.members:
                self._session_deadlines.pop((gid, mid), None)
                continue
            g = scratch.get(gid)
            if g is None:
                g = scratch[gid] = live.scratch()

            def emit(rec: CoordinatorRecord, g: ShareGroup = g) -> None:
                records.append(rec)
                g.apply(rec)

            self._remove_member(g, mid, emit, effects, topics)
        removed = set(effects.removed_members)
        pending = [d for k, d in self._session_deadlines.items() if d > now_ms and k not in removed]
        return Result(records=records, response=None, deadlines=[min(pending)] if pending else [], after=effects)

    def on_loaded(self, now_ms: int, session_timeout_ms: int | None = None) -> Result[None]:
        """After loading: a fresh session for every member; lists pending initializations."""
        session_ms = session_timeout_ms or self.session_timeout_ms
        for gid, g in self._groups.items():
            for mid in g.members:
                self._session_deadlines.setdefault((gid, mid), now_ms + session_ms)
        pending = list(self._session_deadlines.values())
        return Result(deadlines=[min(pending)] if pending else [],
                      after=ShareEffects(initialize=self.partitions_to_initialize()))

    # --- share-partition state lifecycle ----------------------------------------------

    def _state_record(self, g: ShareGroup, initializing: Assignment, initialized: Assignment,
                      deleting: Assignment) -> CoordinatorRecord:
        return record(RecordType.SHARE_GROUP_STATE_PARTITION_METADATA, _group_key(g.group_id),
                      g.state_metadata_value(initializing, initialized, deleting, g.topic_names))

    def mark_initialized(self, group_id: str, partitions: Mapping[uuid.UUID, Iterable[int]]) -> Result[ErrorCode]:
        """InitializeShareGroupState succeeded for ``partitions``: initializing -> initialized.

        Partitions that are not initializing are ignored. GROUP_ID_NOT_FOUND if the
        group is gone; no records if nothing changes.
        """
        g = self._groups.get(group_id)
        if g is None:
            return Result(response=ErrorCode.group_id_not_found)
        done = partitions_of(partitions) & partitions_of(g.initializing)
        if not done:
            return Result(response=ErrorCode.none)
        moved = from_partitions(done)
        return Result(records=[self._state_record(g, _subtract(g.initializing, moved),
                                                  _union(g.initialized, moved), g.deleting)],
                      response=ErrorCode.none)

    def refresh_assignment(self, group_id: str, member_id: str) -> Result[Assignment | None]:
        """After initializations: give the member the partitions of its target that are
        initialized now, at its current epoch. Returns the record and the member's new
        assignment, or no records and None when it is unchanged (or not a member)."""
        g = self._groups.get(group_id)
        m = None if g is None else g.members.get(member_id)
        if g is None or m is None:
            return Result(response=None)
        wanted = _intersect(g.target.get(member_id, {}), g.initialized)
        if partitions_of(wanted) == partitions_of(m.assigned):
            return Result(response=None)
        nxt = replace(m, assigned=wanted)
        return Result(records=[record(RecordType.SHARE_GROUP_CURRENT_MEMBER_ASSIGNMENT,
                                      _member_key(group_id, member_id), nxt.assignment_value())],
                      response=wanted)

    def mark_initialize_failed(self, group_id: str,
                               partitions: Mapping[uuid.UUID, Iterable[int]]) -> Result[ErrorCode]:
        """InitializeShareGroupState failed: forget the partitions' initializing mark.

        Those still assigned go back to initializing at the group's next target
        computation; call ``retry_initialize`` to do so at once.
        """
        g = self._groups.get(group_id)
        if g is None:
            return Result(response=ErrorCode.group_id_not_found)
        failed = partitions_of(partitions) & partitions_of(g.initializing)
        if not failed:
            return Result(response=ErrorCode.none)
        return Result(records=[self._state_record(g, _subtract(g.initializing, from_partitions(failed)),
                                                  g.initialized, g.deleting)], response=ErrorCode.none)

    def retry_initialize(self, group_id: str) -> Result[ErrorCode]:
        """Marks assigned partitions that are neither initializing nor initialized as
        initializing again; ``after.initialize`` lists them."""
        g = self._groups.get(group_id)
        effects = ShareEffects()
        if g is None:
            return Result(response=ErrorCode.group_id_not_found, after=effects)
        assigned = g.assigned_partitions()
        fresh = assigned - partitions_of(g.initializing) - partitions_of(g.initialized)
        if not fresh:
            return Result(response=ErrorCode.none, after=effects)
        effects.initialize[group_id] = from_partitions(fresh)
        return Result(records=[self._state_record(g, _union(g.initializing, from_partitions(fresh)),
                                                  g.initialized, g.deleting)],
                      response=ErrorCode.none, after=effects)

    def handle_alter_offsets(self, group_id: str, partitions: Mapping[uuid.UUID, Iterable[int]],
                             names: Mapping[uuid.UUID, str]) -> Result[ErrorCode]:
        """AlterShareGroupOffsets, once the shell has written the share-partitions' new state.

        KIP-932: only an empty group (no members) may be altered, NON_EMPTY_GROUP
        otherwise. A group that does not exist is created, empty, with these
        share-partitions (so resetting offsets before the first consumer joins works, and
        the group is listed). ``partitions`` become *initialized*: a member's first
        heartbeat uses their state instead of share.auto.offset.reset. ``names``: topic
        names for the state record.
        """
        g = self._groups.get(group_id)
        if g is not None and g.members:
            return Result(response=ErrorCode.non_empty_group)
        records: list[CoordinatorRecord] = []
        if g is None:
            g = ShareGroup(group_id)
            records.append(record(RecordType.SHARE_GROUP_METADATA, _group_key(group_id),
                                  {"epoch": 0, "metadata_hash": 0}))
        done = from_partitions(partitions_of(partitions))
        initialized = _union(g.initialized, done)
        if initialized != g.initialized or records:
            all_names = dict(g.topic_names)
            all_names.update(names)
            records.append(record(RecordType.SHARE_GROUP_STATE_PARTITION_METADATA, _group_key(group_id),
                                  g.state_metadata_value(_subtract(g.initializing, done), initialized,
                                                         _subtract(g.deleting, done), all_names)))
        return Result(records=records, response=ErrorCode.none)

    def handle_delete_offsets(self, group_id: str, partitions: Mapping[uuid.UUID, Iterable[int]]) -> Result[ErrorCode]:
        """DeleteShareGroupOffsets, once the shell deleted the share-partitions' state:
        they are no longer initialized (a member's next heartbeat initializes them again,
        from share.auto.offset.reset). GROUP_ID_NOT_FOUND / NON_EMPTY_GROUP refuse."""
        g = self._groups.get(group_id)
        if g is None:
            return Result(response=ErrorCode.group_id_not_found)
        if g.members:
            return Result(response=ErrorCode.non_empty_group)
        gone = from_partitions(partitions_of(partitions))
        if not (partitions_of(gone) & (partitions_of(g.initialized) | partitions_of(g.initializing))):
            return Result(response=ErrorCode.none)
        return Result(records=[self._state_record(g, _subtract(g.initializing, gone), _subtract(g.initialized, gone),
                                                  g.deleting)], response=ErrorCode.none)

    def begin_delete_group(self, group_id: str) -> Result[tuple[ErrorCode, Assignment]]:
        """DeleteGroups, first stage. Returns (error, partitions whose state to delete).

        GROUP_ID_NOT_FOUND / NON_EMPTY_GROUP refuse. If the group has no share-partition
        state the records are already the final tombstones and the partitions empty;
        otherwise everything initializing or initialized moves to *deleting*, the shell
        sends DeleteShareGroupState for the partitions returned, then calls
        ``complete_delete_group``.
        """
        g = self._groups.get(group_id)
        if g is None:
            return Result(response=(ErrorCode.group_id_not_found, {}))
        if g.members:
            return Result(response=(ErrorCode.non_empty_group, {}))
        to_delete = _union(_union(g.initializing, g.initialized), g.deleting)
        if not to_delete:
            return Result(records=self._group_tombstones(group_id), response=(ErrorCode.none, {}))
        return Result(records=[self._state_record(g, {}, {}, to_delete)], response=(ErrorCode.none, to_delete))

    def complete_delete_group(self, group_id: str) -> Result[ErrorCode]:
        """DeleteShareGroupState succeeded: the group's tombstones (NON_EMPTY_GROUP if a
        member joined meanwhile; the partitions stay *deleting*, to be retried)."""
        g = self._groups.get(group_id)
        if g is None:
            return Result(response=ErrorCode.group_id_not_found)
        if g.members:
            return Result(response=ErrorCode.non_empty_group)
        return Result(records=self._group_tombstones(group_id), response=ErrorCode.none)

    def _group_tombstones(self, group_id: str) -> list[CoordinatorRecord]:
        key = _group_key(group_id)
        g = self._groups.get(group_id)
        legacy = [tombstone(RecordType.SHARE_GROUP_PARTITION_METADATA, key)] if (
            g is not None and g.legacy_partition_metadata) else []
        return [tombstone(RecordType.SHARE_GROUP_STATE_PARTITION_METADATA, key),
                tombstone(RecordType.SHARE_GROUP_TARGET_ASSIGNMENT_METADATA, key),
                *legacy,
                tombstone(RecordType.SHARE_GROUP_METADATA, key)]

    # --- ShareGroupDescribe ---------------------------------------------------------

    def describe_group(self, group_id: str) -> describe_resp.DescribedGroup:
        """One ShareGroupDescribe entry; GROUP_ID_NOT_FOUND if no such share group."""
        g = self._groups.get(group_id)
        if g is None:
            return describe_resp.DescribedGroup(
                error_code=ErrorCode.group_id_not_found, error_message=f"Group {group_id} not found.",
                group_id=GroupId(group_id), group_state=ShareGroupState.DEAD.value, group_epoch=i32(0),
                assignment_epoch=i32(0), assignor_name="", members=())
        names = dict(g.topic_names)
        wanted = {n for m in g.members.values() for n in m.subscribed_topic_names}
        names.update({tid: n for n, (tid, _) in self._topics_seen.items() if n in wanted})
        members = tuple(
            describe_resp.Member(
                member_id=m.member_id, rack_id=m.rack_id, member_epoch=i32(m.member_epoch),
                client_id=m.client_id, client_host=m.client_host,
                subscribed_topic_names=tuple(TopicName(n) for n in m.subscribed_topic_names),
                assignment=describe_resp.Assignment(topic_partitions=tuple(
                    describe_resp.TopicPartitions(topic_id=t, topic_name=TopicName(names.get(t, "")),
                                                  partitions=tuple(i32(p) for p in sorted(ps)))
                    for t, ps in sorted(m.assigned.items(), key=lambda kv: str(kv[0])))))
            for _, m in sorted(g.members.items()))
        return describe_resp.DescribedGroup(
            error_code=ErrorCode.none, error_message=None, group_id=GroupId(group_id), group_state=g.state.value,
            group_epoch=i32(g.group_epoch), assignment_epoch=i32(g.assignment_epoch),
            assignor_name=ASSIGNOR_NAME, members=members)

    def handle_describe(
        self, request: describe_req.ShareGroupDescribeRequest
    ) -> Result[describe_resp.ShareGroupDescribeResponse]:
        return Result(response=describe_resp.ShareGroupDescribeResponse(
            throttle_time=_td(0), groups=tuple(self.describe_group(gid) for gid in request.group_ids)))
