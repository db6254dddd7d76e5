"""Classic consumer groups: the JoinGroup/SyncGroup/Heartbeat/LeaveGroup protocol.

Theory of operation
-------------------
A classic group moves through Kafka's five states (``ClassicGroup.java``):

* ``EMPTY``: no members (a new group, a group whose last member left, or a "simple"
  group that only stores offsets);
* ``PREPARING_REBALANCE``: members are (re)joining; every JoinGroup is parked until all
  known members have rejoined, or the rebalance timeout (the largest member
  ``rebalance_timeout``) runs out; the first rebalance of an empty group waits
  ``group.initial.rebalance.delay.ms`` more, extended while new members keep arriving
  (never beyond the rebalance timeout);
* ``COMPLETING_REBALANCE``: the join phase ended, the generation was bumped, the
  protocol chosen and the leader elected; every parked JoinGroup got its answer (the
  leader with all members' metadata) and SyncGroups are parked until the leader's
  arrives with the assignment;
* ``STABLE``: the leader's assignment is durable and was handed to every member;
* ``DEAD``: the group is being deleted.

Durable and volatile state. A record carries what Kafka's GroupMetadataValue carries:
generation, protocol type and name, leader, the current-state timestamp and each
member's ids, timeouts, subscription (metadata of the chosen protocol) and assignment.
It is written when the leader's assignment is stored, when a generation ends with no
members, and when a static member's id is replaced in a stable group. Everything else
(joining and pending members, parked requests, heartbeat and rebalance deadlines) is
volatile, exactly as in Kafka, where it is lost on coordinator fail-over and clients
simply rejoin. Handlers change volatile state directly; the assignment of a generation
and the move to STABLE happen only in :meth:`ClassicGroup.replay_metadata`, i.e. once
the record is durable. The shell runs one operation at a time per shard (append and
replay included), so a handler never sees a half-applied record.

Parked requests. A JoinGroup or SyncGroup that cannot be answered yet is remembered as
:class:`Parked` (the shell's opaque token plus the kio response class of the request's
version). When it can be answered, the operation that made it so (any handler or
``expire``) emits a :class:`Reply` for that token. Responses are version-free field
dicts; ``shoal.groups.manager`` turns them into kio entities.

Time. Nothing here reads a clock: every entry point takes ``now_ms``, and
:meth:`ClassicGroup.next_deadline` says when :meth:`ClassicGroup.expire` must run next.

This module knows nothing of offsets (``offsets.py``) nor of other group kinds; it only
answers the questions ``offsets.py`` asks of any group (``validate_offset_commit``,
``is_subscribed_to_topic``, ``offset_expiration_base`` ...). Event loop only, never awaits.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

from kio.schema.errors import ErrorCode

from shoal.coordinator.records import CoordinatorRecord

from .records import GroupValue, MemberValue, group_metadata_record, group_metadata_tombstone

__all__ = [
    "ClassicConfig",
    "ClassicGroup",
    "ClassicGroupState",
    "ClassicMember",
    "Effects",
    "JoinRequest",
    "Parked",
    "Reply",
    "join_error",
    "parse_subscription_topics",
]

CONSUMER_PROTOCOL_TYPE = "consumer"


class ClassicGroupState(enum.Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


S = ClassicGroupState

# Valid previous states of each state (Kafka's ClassicGroupState).
_TRANSITIONS: dict[ClassicGroupState, frozenset[ClassicGroupState]] = {
    S.EMPTY: frozenset({S.PREPARING_REBALANCE}),
    S.PREPARING_REBALANCE: frozenset({S.STABLE, S.COMPLETING_REBALANCE, S.EMPTY}),
    S.COMPLETING_REBALANCE: frozenset({S.PREPARING_REBALANCE}),
    S.STABLE: frozenset({S.COMPLETING_REBALANCE}),
    S.DEAD: frozenset({S.STABLE, S.PREPARING_REBALANCE, S.COMPLETING_REBALANCE, S.EMPTY, S.DEAD}),
}


MEMBER_ID_PREFIX_MAX_BYTES = 0x7FFF - 37
"""A new member's id is a prefix (its group instance id or client id), "-" and a uuid, as
in Kafka. The prefix is cut to this many UTF-8 bytes, so that the id fits the int16-length
strings of every response version that carries it, however long an id the request
brought (up to 32,767 bytes)."""


def member_id_prefix(text: str) -> str:
    raw = text.encode()
    if len(raw) <= MEMBER_ID_PREFIX_MAX_BYTES:
        return text
    return raw[:MEMBER_ID_PREFIX_MAX_BYTES].decode(errors="ignore")  # no half character at the cut


@dataclass(frozen=True, slots=True)
class ClassicConfig:
    initial_rebalance_delay_ms: int = 3000
    min_session_timeout_ms: int = 6000
    max_session_timeout_ms: int = 1_800_000
    max_size: int = 2**31 - 1
    new_member_join_timeout_ms: int = 300_000
    """Kafka's fixed 5-minute limit on a new member's first parked JoinGroup."""
    new_member_id: Callable[[str], str] = lambda prefix: prefix
    """Makes a member id from a prefix (client id or group instance id); the manager injects uuids."""


@dataclass(frozen=True, slots=True)
class Parked:
    token: Hashable
    response_cls: Any


@dataclass(frozen=True, slots=True)
class Reply:
    """A parked request's response, ready to send (after this operation's records are durable)."""

    token: Hashable
    response_cls: Any
    fields: dict[str, Any]


@dataclass(slots=True)
class Effects:
    """What an operation produced besides its own response."""

    records: list[CoordinatorRecord] = field(default_factory=list)
    replies: list[Reply] = field(default_factory=list)

    def reply(self, parked: Parked | None, fields: dict[str, Any]) -> None:
        if parked is not None:
            self.replies.append(Reply(parked.token, parked.response_cls, fields))


@dataclass(frozen=True, slots=True)
class JoinRequest:
    """The version-free content of a JoinGroup request."""

    member_id: str
    group_instance_id: str | None
    protocol_type: str
    protocols: tuple[tuple[str, bytes], ...]
    session_timeout_ms: int
    rebalance_timeout_ms: int
    require_known_member_id: bool
    client_id: str = ""
    client_host: str = ""


def join_error(code: ErrorCode, member_id: str = "") -> dict[str, Any]:
    return {
        "error_code": code,
        "generation_id": -1,
        "protocol_type": None,
        "protocol_name": None,
        "leader": "",
        "skip_assignment": False,
        "member_id": member_id,
        "members": [],
    }


def sync_error(code: ErrorCode) -> dict[str, Any]:
    return {"error_code": code, "protocol_type": None, "protocol_name": None, "assignment": b""}


def parse_subscription_topics(metadata: bytes) -> set[str] | None:
    """Topics of a ConsumerProtocolSubscription (any version), or None if undecodable."""
    try:
        (version,) = struct.unpack_from(">h", metadata, 0)
        if version < 0:
            return None
        (count,) = struct.unpack_from(">i", metadata, 2)
        pos, topics = 6, set()
        for _ in range(max(count, 0)):
            (n,) = struct.unpack_from(">h", metadata, pos)
            pos += 2
            if n < 0 or pos + n > len(metadata):
                return None
            topics.add(metadata[pos : pos + n].decode())
            pos += n
        return topics
    except (struct.error, UnicodeDecodeError):
        return None


@dataclass(slots=True)
class ClassicMember:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    protocol_type: str
    protocols: tuple[tuple[str, bytes], ...]
    """Supported (name, metadata) pairs in the member's order of preference."""
    assignment: bytes = b""
    # --- volatile ---
    join: Parked | None = None
    """The parked JoinGroup; set iff the member is awaiting a join response."""
    sync: Parked | None = None
    """The parked SyncGroup; set iff the member is awaiting a sync response."""
    is_new: bool = False
    """Joined but never got a join response; may expire even while its JoinGroup is parked."""
    heartbeat_deadline_ms: int | None = None
    """When the session expires unless a heartbeat (or a completed join/sync) resets it."""

    def metadata(self, protocol: str | None) -> bytes:
        for name, meta in self.protocols:
            if name == protocol:
                return meta
        return b""

    def protocol_names(self) -> list[str]:
        return [name for name, _ in self.protocols]

    def matches(self, protocols: tuple[tuple[str, bytes], ...]) -> bool:
        return tuple(self.protocols) == tuple(protocols)


@dataclass(slots=True)
class _JoinTimer:
    deadline_ms: int
    initial: bool
    delay_ms: int = 0
    remaining_ms: int = 0


class ClassicGroup:
    """One classic group. See the module docstring for the rules it follows."""

    group_type = "classic"

    def __init__(self, group_id: str, config: ClassicConfig, now_ms: int | None = 0) -> None:
        self.group_id = group_id
        self.config = config
        self.state = S.EMPTY
        self.previous_state = S.EMPTY
        self.state_timestamp_ms: int | None = now_ms
        """When the group entered its current state (Kafka's currentStateTimestamp)."""
        self.generation_id = 0
        self.protocol_type: str | None = None
        self.protocol_name: str | None = None
        self.leader_id: str | None = None
        self.members: dict[str, ClassicMember] = {}
        self.static_members: dict[str, str] = {}
        """group instance id -> member id."""
        self.pending_members: dict[str, int] = {}
        """Member ids handed out with MEMBER_ID_REQUIRED -> deadline of their second JoinGroup."""
        self.pending_sync: set[str] = set()
        """Members of this generation that have not yet sent SyncGroup."""
        self.new_member_added = False
        self.join_timer: _JoinTimer | None = None
        self.sync_timer: tuple[int, int] | None = None
        """(deadline, generation) of the pending-sync check."""
        self.subscribed_topics: set[str] | None = set()

    # ------------------------------------------------------------------ basics
    def __repr__(self) -> str:
        return f"ClassicGroup({self.group_id!r}, {self.state.name}, gen={self.generation_id}, members={list(self.members)})"

    @property
    def state_name(self) -> str:
        return self.state.value

    def is_empty(self) -> bool:
        return self.state is S.EMPTY

    def should_expire(self) -> bool:
        return self.state is S.EMPTY

    def _transition(self, state: ClassicGroupState, now_ms: int | None) -> None:
        if self.state not in _TRANSITIONS[state]:
            raise AssertionError(f"group {self.group_id}: illegal transition {self.state.name} -> {state.name}")
        self.previous_state = self.state
        self.state = state
        self.state_timestamp_ms = now_ms

    def rebalance_timeout_ms(self) -> int:
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)

    def _all_members_joined(self) -> bool:
        return all(m.join is not None for m in self.members.values()) and not self.pending_members

    def _supports_protocols(self, protocol_type: str, protocols: tuple[tuple[str, bytes], ...]) -> bool:
        names = [n for n, _ in protocols]
        if self.state is S.EMPTY or not self.members:
            return bool(protocol_type) and bool(names)
        if protocol_type != self.protocol_type:
            return False
        return any(all(n in m.protocol_names() for m in self.members.values()) for n in names)

    def _select_protocol(self) -> str | None:
        members = list(self.members.values())
        if not members:
            return None
        candidates = [n for n in members[0].protocol_names() if all(n in m.protocol_names() for m in members)]
        if not candidates:
            return None
        votes = {c: 0 for c in candidates}
        for m in members:
            for n in m.protocol_names():
                if n in votes:
                    votes[n] += 1
                    break
        best = max(votes.values())
        return next(c for c in candidates if votes[c] == best)

    def _validate_member(self, member_id: str, group_instance_id: str | None) -> ErrorCode:
        """Kafka's ClassicGroup.validateMember: NONE, UNKNOWN_MEMBER_ID or FENCED_INSTANCE_ID."""
        if group_instance_id is not None:
            existing = self.static_members.get(group_instance_id)
            if existing is None:
                return ErrorCode.unknown_member_id
            if existing != member_id:
                return ErrorCode.fenced_instance_id
            return ErrorCode.none
        return ErrorCode.none if member_id in self.members else ErrorCode.unknown_member_id

    def _accept_joining_member(self, member_id: str) -> bool:
        max_size = self.config.max_size
        if self.state in (S.EMPTY, S.DEAD):
            return True
        if self.state is S.PREPARING_REBALANCE:
            m = self.members.get(member_id)
            awaiting = sum(1 for x in self.members.values() if x.join is not None)
            return (m is not None and m.join is not None) or awaiting < max_size
        return member_id in self.members or len(self.members) < max_size

    def _members_metadata(self) -> list[dict[str, Any]]:
        return [
            {"member_id": m.member_id, "group_instance_id": m.group_instance_id, "metadata": m.metadata(self.protocol_name)}
            for m in self.members.values()
        ]

    def _join_ok(self, member_id: str, *, with_members: bool, skip_assignment: bool = False) -> dict[str, Any]:
        return {
            "error_code": ErrorCode.none,
            "generation_id": self.generation_id,
            "protocol_type": self.protocol_type,
            "protocol_name": self.protocol_name,
            "leader": self.leader_id or "",
            "skip_assignment": skip_assignment,
            "member_id": member_id,
            "members": self._members_metadata() if with_members else [],
        }

    def _sync_ok(self, assignment: bytes) -> dict[str, Any]:
        return {
            "error_code": ErrorCode.none,
            "protocol_type": self.protocol_type,
            "protocol_name": self.protocol_name,
            "assignment": assignment,
        }

    def _snapshot(self, now_ms: int, assignments: dict[str, bytes] | None = None) -> GroupValue:
        return GroupValue(
            protocol_type=self.protocol_type or "",
            generation=self.generation_id,
            protocol=self.protocol_name,
            leader=self.leader_id,
            current_state_timestamp=now_ms,
            members=tuple(
                MemberValue(
                    member_id=m.member_id,
                    group_instance_id=m.group_instance_id,
                    client_id=m.client_id,
                    client_host=m.client_host,
                    rebalance_timeout=m.rebalance_timeout_ms,
                    session_timeout=m.session_timeout_ms,
                    subscription=m.metadata(self.protocol_name),
                    assignment=m.assignment if assignments is None else assignments.get(m.member_id, b""),
                )
                for m in self.members.values()
            ),
        )

    # ------------------------------------------------------------- membership
    def _add_member(self, member: ClassicMember) -> None:
        if not self.members:
            self.protocol_type = member.protocol_type
        self.members[member.member_id] = member
        self.pending_members.pop(member.member_id, None)
        if member.group_instance_id is not None:
            self.static_members[member.group_instance_id] = member.member_id
        if self.leader_id is None:
            self.leader_id = member.member_id

    def _remove_member(self, member_id: str, now_ms: int, eff: Effects) -> None:
        m = self.members.pop(member_id, None)
        if m is None:
            return
        # A parked JoinGroup of a removed member gets UNKNOWN_MEMBER_ID so that the client
        # rejoins if it is still alive (Kafka does the same); so does a parked SyncGroup.
        eff.reply(m.join, join_error(ErrorCode.unknown_member_id))
        eff.reply(m.sync, sync_error(ErrorCode.unknown_member_id))
        m.join = m.sync = None
        if m.group_instance_id is not None and self.static_members.get(m.group_instance_id) == member_id:
            del self.static_members[m.group_instance_id]
        self.pending_sync.discard(member_id)
        if self.leader_id == member_id:
            self.leader_id = next(iter(self.members), None)

    def _remove_member_and_update(self, member_id: str, now_ms: int, eff: Effects) -> None:
        self._remove_member(member_id, now_ms, eff)
        if self.state in (S.STABLE, S.COMPLETING_REBALANCE):
            self._maybe_prepare_rebalance_or_complete_join(now_ms, eff)
        elif self.state is S.PREPARING_REBALANCE:
            self._maybe_complete_join(now_ms, eff)

    def _update_member(self, m: ClassicMember, j: JoinRequest, parked: Parked, eff: Effects) -> None:
        if m.join is not None and m.join.token != parked.token:
            # Superseded JoinGroup (the client gave up on it); answer it so no request leaks.
            eff.reply(m.join, join_error(ErrorCode.rebalance_in_progress, m.member_id))
        m.protocols = j.protocols
        m.rebalance_timeout_ms = j.rebalance_timeout_ms
        m.session_timeout_ms = j.session_timeout_ms
        m.join = parked

    # -------------------------------------------------------------- rebalance
    def _maybe_prepare_rebalance_or_complete_join(self, now_ms: int, eff: Effects) -> None:
        if self.state in (S.STABLE, S.COMPLETING_REBALANCE, S.EMPTY):
            self._prepare_rebalance(now_ms, eff)
        else:
            self._maybe_complete_join(now_ms, eff)

    def _reset_and_propagate_assignment_with_error(self, code: ErrorCode, now_ms: int, eff: Effects) -> None:
        for m in self.members.values():
            m.assignment = b""
            if m.sync is not None:
                eff.reply(m.sync, sync_error(code))
                m.sync = None
                m.heartbeat_deadline_ms = now_ms + m.session_timeout_ms

    def _prepare_rebalance(self, now_ms: int, eff: Effects) -> None:
        if self.state is S.COMPLETING_REBALANCE:
            self._reset_and_propagate_assignment_with_error(ErrorCode.rebalance_in_progress, now_ms, eff)
        self.sync_timer = None
        initial = self.state is S.EMPTY
        self._transition(S.PREPARING_REBALANCE, now_ms)
        if initial:
            delay = self.config.initial_rebalance_delay_ms
            remaining = max(self.rebalance_timeout_ms() - delay, 0)
            self.join_timer = _JoinTimer(now_ms + delay, True, delay, remaining)
        else:
            self.join_timer = _JoinTimer(now_ms + self.rebalance_timeout_ms(), False)
            self._maybe_complete_join(now_ms, eff)

    def _maybe_complete_join(self, now_ms: int, eff: Effects) -> None:
        if (
            self.state is S.PREPARING_REBALANCE
            and self._all_members_joined()
            and self.previous_state is not S.EMPTY
        ):
            self._complete_join(now_ms, eff)

    def _complete_join(self, now_ms: int, eff: Effects) -> None:
        self.join_timer = None
        if self.state is S.DEAD:
            return
        # Dynamic members that did not rejoin in time are dropped; static members stay
        # (KIP-345) until their session expires.
        for m in [m for m in self.members.values() if m.join is None and m.group_instance_id is None]:
            self._remove_member(m.member_id, now_ms, eff)
        if self.members:
            leader = self.members.get(self.leader_id or "")
            if leader is None or leader.join is None:
                joined = next((m.member_id for m in self.members.values() if m.join is not None), None)
                if joined is None:
                    # Nobody rejoined: wait another rebalance timeout for sessions to expire.
                    self.join_timer = _JoinTimer(now_ms + self.rebalance_timeout_ms(), False)
                    return
                self.leader_id = joined
        self.generation_id += 1
        self.pending_sync = set()
        if self.members:
            self.protocol_name = self._select_protocol()
            self._transition(S.COMPLETING_REBALANCE, now_ms)
            self._update_subscribed_topics()
            for m in self.members.values():
                is_leader = m.member_id == self.leader_id
                eff.reply(m.join, self._join_ok(m.member_id, with_members=is_leader))
                m.join = None
                m.is_new = False
                m.heartbeat_deadline_ms = now_ms + m.session_timeout_ms
                self.pending_sync.add(m.member_id)
            self.sync_timer = (now_ms + self.rebalance_timeout_ms(), self.generation_id)
        else:
            self.protocol_name = None
            self._transition(S.EMPTY, now_ms)
            self.subscribed_topics = set()
            eff.records.append(group_metadata_record(self.group_id, self._snapshot(now_ms)))

    def _update_subscribed_topics(self) -> None:
        if self.protocol_type != CONSUMER_PROTOCOL_TYPE:
            self.subscribed_topics = None
            return
        topics: set[str] = set()
        for m in self.members.values():
            t = parse_subscription_topics(m.metadata(self.protocol_name))
            if t is None:
                self.subscribed_topics = None
                return
            topics |= t
        self.subscribed_topics = topics

    # -------------------------------------------------------------- JoinGroup
    def join(self, j: JoinRequest, parked: Parked, now_ms: int, eff: Effects) -> dict[str, Any] | None:
        """Handle a JoinGroup; the response fields, or None if parked (its reply comes later)."""
        if not self._accept_joining_member(j.member_id):
            return join_error(ErrorCode.group_max_size_reached, j.member_id)
        if j.member_id == "":
            return self._join_new_member(j, parked, now_ms, eff)
        return self._join_existing_member(j, parked, now_ms, eff)

    def _join_new_member(self, j: JoinRequest, parked: Parked, now_ms: int, eff: Effects) -> dict[str, Any] | None:
        if self.state is S.DEAD:
            return join_error(ErrorCode.coordinator_not_available)
        if not self._supports_protocols(j.protocol_type, j.protocols):
            return join_error(ErrorCode.inconsistent_group_protocol)
        new_id = self.config.new_member_id(member_id_prefix(j.group_instance_id or j.client_id))
        if j.group_instance_id is not None:
            old_id = self.static_members.get(j.group_instance_id)
            if old_id is not None:
                return self._replace_static_member(old_id, new_id, j, parked, now_ms, eff)
        elif j.require_known_member_id:
            self.pending_members[new_id] = now_ms + j.session_timeout_ms
            return join_error(ErrorCode.member_id_required, new_id)
        self._add_member_and_rebalance(new_id, j, parked, now_ms, eff)
        return None

    def _add_member_and_rebalance(self, member_id: str, j: JoinRequest, parked: Parked, now_ms: int, eff: Effects) -> None:
        m = ClassicMember(
            member_id=member_id,
            group_instance_id=j.group_instance_id,
            client_id=j.client_id,
            client_host=j.client_host,
            rebalance_timeout_ms=j.rebalance_timeout_ms,
            session_timeout_ms=j.session_timeout_ms,
            protocol_type=j.protocol_type,
            protocols=j.protocols,
            join=parked,
            is_new=True,
            heartbeat_deadline_ms=now_ms + self.config.new_member_join_timeout_ms,
        )
        if self.state is S.PREPARING_REBALANCE and self.previous_state is S.EMPTY:
            self.new_member_added = True
        self._add_member(m)
        self._maybe_prepare_rebalance_or_complete_join(now_ms, eff)

    def _replace_static_member(
        self, old_id: str, new_id: str, j: JoinRequest, parked: Parked, now_ms: int, eff: Effects
    ) -> dict[str, Any] | None:
        m = self.members.pop(old_id)
        # The old incarnation is fenced: any request of it still parked is answered so.
        eff.reply(m.join, join_error(ErrorCode.fenced_instance_id, old_id))
        eff.reply(m.sync, sync_error(ErrorCode.fenced_instance_id))
        m.join = m.sync = None
        m.member_id = new_id
        self.members[new_id] = m
        self.static_members[j.group_instance_id or ""] = new_id
        if self.leader_id == old_id:
            self.leader_id = new_id
        if old_id in self.pending_sync:
            self.pending_sync.discard(old_id)
            self.pending_sync.add(new_id)
        m.client_id, m.client_host = j.client_id, j.client_host
        m.heartbeat_deadline_ms = now_ms + j.session_timeout_ms
        self._update_member(m, j, parked, eff)
        if self.state is S.STABLE:
            if self._select_protocol() == self.protocol_name:
                # Nothing changes for the group: persist the new member id and answer at
                # once; a static leader is told to skip the assignment (v9+).
                eff.records.append(group_metadata_record(self.group_id, self._snapshot(now_ms)))
                is_leader = self.leader_id == new_id
                m.join = None
                return self._join_ok(new_id, with_members=is_leader, skip_assignment=is_leader)
            self._prepare_rebalance(now_ms, eff)
        elif self.state is S.COMPLETING_REBALANCE:
            self._prepare_rebalance(now_ms, eff)
        else:
            self._maybe_complete_join(now_ms, eff)
        return None

    def _join_existing_member(self, j: JoinRequest, parked: Parked, now_ms: int, eff: Effects) -> dict[str, Any] | None:
        if self.state is S.DEAD:
            return join_error(ErrorCode.coordinator_not_available, j.member_id)
        if not self._supports_protocols(j.protocol_type, j.protocols):
            return join_error(ErrorCode.inconsistent_group_protocol, j.member_id)
        if j.member_id in self.pending_members:
            if j.group_instance_id is not None:
                return join_error(ErrorCode.unknown_member_id, j.member_id)
            self._add_member_and_rebalance(j.member_id, j, parked, now_ms, eff)
            return None
        err = self._validate_member(j.member_id, j.group_instance_id)
        if err is not ErrorCode.none:
            return join_error(err, j.member_id)
        m = self.members[j.member_id]
        if self.state is S.PREPARING_REBALANCE:
            self._update_member(m, j, parked, eff)
            self._maybe_prepare_rebalance_or_complete_join(now_ms, eff)
            return None
        if self.state is S.COMPLETING_REBALANCE:
            if m.matches(j.protocols):
                # Lost its join response: answer again for the current generation.
                return self._join_ok(m.member_id, with_members=m.member_id == self.leader_id)
            self._update_member(m, j, parked, eff)
            self._maybe_prepare_rebalance_or_complete_join(now_ms, eff)
            return None
        if self.state is S.STABLE:
            if m.member_id == self.leader_id or not m.matches(j.protocols):
                # A leader's JoinGroup forces a rebalance (e.g. topic metadata changed).
                self._update_member(m, j, parked, eff)
                self._maybe_prepare_rebalance_or_complete_join(now_ms, eff)
                return None
            return self._join_ok(m.member_id, with_members=False)
        return join_error(ErrorCode.unknown_member_id, j.member_id)

    # -------------------------------------------------------------- SyncGroup
    def sync(
        self,
        member_id: str,
        group_instance_id: str | None,
        generation_id: int,
        protocol_type: str | None,
        protocol_name: str | None,
        assignments: dict[str, bytes],
        parked: Parked,
        now_ms: int,
        eff: Effects,
    ) -> dict[str, Any] | None:
        """Handle a SyncGroup; the response fields, or None if parked."""
        if self.state is S.DEAD:
            return sync_error(ErrorCode.coordinator_not_available)
        err = self._validate_member(member_id, group_instance_id)
        if err is not ErrorCode.none:
            return sync_error(err)
        if generation_id != self.generation_id:
            return sync_error(ErrorCode.illegal_generation)
        if (protocol_type is not None and self.protocol_type is not None and protocol_type != self.protocol_type) or (
            protocol_name is not None and self.protocol_name is not None and protocol_name != self.protocol_name
        ):
            return sync_error(ErrorCode.inconsistent_group_protocol)
        if self.state is S.PREPARING_REBALANCE:
            return sync_error(ErrorCode.rebalance_in_progress)
        m = self.members[member_id]
        if self.state is S.COMPLETING_REBALANCE:
            if m.sync is not None and m.sync.token != parked.token:
                eff.reply(m.sync, sync_error(ErrorCode.rebalance_in_progress))
            m.sync = parked
            self.pending_sync.discard(member_id)
            if member_id == self.leader_id:
                full = {mid: assignments.get(mid, b"") for mid in self.members}
                eff.records.append(group_metadata_record(self.group_id, self._snapshot(now_ms, full)))
                # Every parked SyncGroup is answered once the record is durable; the
                # assignment itself is applied by replay_metadata.
                for x in self.members.values():
                    if x.sync is not None:
                        eff.reply(x.sync, self._sync_ok(full[x.member_id]))
                        x.sync = None
                        x.heartbeat_deadline_ms = now_ms + x.session_timeout_ms
            return None
        if self.state is S.STABLE:
            self.pending_sync.discard(member_id)
            return self._sync_ok(m.assignment)
        return sync_error(ErrorCode.unknown_member_id)

    # -------------------------------------------------------------- Heartbeat
    def heartbeat(self, member_id: str, group_instance_id: str | None, generation_id: int, now_ms: int) -> ErrorCode:
        if self.state is S.DEAD:
            return ErrorCode.coordinator_not_available
        err = self._validate_member(member_id, group_instance_id)
        if err is not ErrorCode.none:
            return err
        if generation_id != self.generation_id:
            return ErrorCode.illegal_generation
        if self.state is S.EMPTY:
            return ErrorCode.unknown_member_id
        m = self.members[member_id]
        m.heartbeat_deadline_ms = now_ms + m.session_timeout_ms
        if self.state is S.PREPARING_REBALANCE:
            return ErrorCode.rebalance_in_progress
        return ErrorCode.none

    # ------------------------------------------------------------- LeaveGroup
    def leave(self, identities: list[tuple[str, str | None]], now_ms: int, eff: Effects) -> list[ErrorCode]:
        """Remove members; one error code per (member_id, group_instance_id), in order."""
        out: list[ErrorCode] = []
        removed = pending_removed = False
        for member_id, instance_id in identities:
            if self.state is S.DEAD:
                out.append(ErrorCode.coordinator_not_available)
                continue
            if member_id == "":
                existing = self.static_members.get(instance_id) if instance_id is not None else None
                if existing is None:
                    out.append(ErrorCode.unknown_member_id)
                    continue
                self._remove_member(existing, now_ms, eff)
                removed = True
                out.append(ErrorCode.none)
            elif member_id in self.pending_members:
                del self.pending_members[member_id]
                pending_removed = True
                out.append(ErrorCode.none)
            else:
                err = self._validate_member(member_id, instance_id)
                if err is ErrorCode.none:
                    self._remove_member(member_id, now_ms, eff)
                    removed = True
                out.append(err)
        if removed and self.state in (S.STABLE, S.COMPLETING_REBALANCE):
            self._maybe_prepare_rebalance_or_complete_join(now_ms, eff)
        elif (removed or pending_removed) and self.state is S.PREPARING_REBALANCE:
            self._maybe_complete_join(now_ms, eff)
        return out

    # ----------------------------------------------------------------- timers
    def next_deadline(self) -> int | None:
        times = [m.heartbeat_deadline_ms for m in self.members.values() if m.heartbeat_deadline_ms is not None]
        times += list(self.pending_members.values())
        if self.join_timer is not None:
            times.append(self.join_timer.deadline_ms)
        if self.sync_timer is not None:
            times.append(self.sync_timer[0])
        return min(times, default=None)

    def expire(self, now_ms: int, eff: Effects) -> None:
        """Fire every timer due at ``now_ms``, earliest first."""
        for _ in range(10_000):
            due = self.next_deadline()
            if due is None or due > now_ms:
                return
            self._fire_one(due, now_ms, eff)

    def _fire_one(self, due: int, now_ms: int, eff: Effects) -> None:
        jt = self.join_timer
        if jt is not None and jt.deadline_ms == due:
            self.join_timer = None
            if jt.initial and self.new_member_added and jt.remaining_ms != 0:
                # New members keep arriving: extend the initial delay, within the rebalance timeout.
                self.new_member_added = False
                delay = min(self.config.initial_rebalance_delay_ms, jt.remaining_ms)
                remaining = max(jt.remaining_ms - jt.delay_ms, 0)
                self.join_timer = _JoinTimer(now_ms + delay, True, delay, remaining)
            elif self.state is S.PREPARING_REBALANCE:
                self._complete_join(now_ms, eff)
            return
        if self.sync_timer is not None and self.sync_timer[0] == due:
            _, generation = self.sync_timer
            self.sync_timer = None
            if generation == self.generation_id and self.state in (S.COMPLETING_REBALANCE, S.STABLE) and self.pending_sync:
                for member_id in sorted(self.pending_sync):
                    self._remove_member(member_id, now_ms, eff)
                self._prepare_rebalance(now_ms, eff)
            return
        for member_id, deadline in list(self.pending_members.items()):
            if deadline == due:
                del self.pending_members[member_id]
                self._maybe_complete_join(now_ms, eff)
                return
        for m in list(self.members.values()):
            if m.heartbeat_deadline_ms == due:
                m.heartbeat_deadline_ms = None
                if m.is_new or (m.join is None and m.sync is None):
                    self._remove_member_and_update(m.member_id, now_ms, eff)
                # else: a parked request counts as a heartbeat; its answer reschedules one.
                return

    # ----------------------------------------------------- durable state (replay)
    def replay_metadata(self, value: GroupValue) -> None:
        """Apply a durable GroupMetadata record.

        Live, the record describes the group as it already is (same generation and
        member ids): only the assignment is applied and COMPLETING_REBALANCE becomes
        STABLE. Otherwise (loading, or a record from before) the durable state is
        rebuilt from the record: STABLE with its members, or EMPTY; members' volatile
        state starts afresh (``on_loaded`` schedules their sessions).
        """
        ids = [m.member_id for m in value.members]
        if value.generation == self.generation_id and ids == list(self.members) and self.state is not S.DEAD:
            for mv in value.members:
                self.members[mv.member_id].assignment = mv.assignment
            if self.state is S.COMPLETING_REBALANCE:
                self._transition(S.STABLE, value.current_state_timestamp)
            return
        old = self.members
        self.members = {}
        self.static_members = {}
        self.pending_members = {}
        self.pending_sync = set()
        self.join_timer = None
        self.sync_timer = None
        self.generation_id = value.generation
        self.protocol_type = value.protocol_type or None
        self.protocol_name = value.protocol
        self.leader_id = value.leader
        for mv in value.members:
            prev = old.get(mv.member_id)
            m = ClassicMember(
                member_id=mv.member_id,
                group_instance_id=mv.group_instance_id,
                client_id=mv.client_id,
                client_host=mv.client_host,
                rebalance_timeout_ms=mv.rebalance_timeout,
                session_timeout_ms=mv.session_timeout,
                protocol_type=value.protocol_type,
                protocols=((value.protocol or "", mv.subscription),),
                assignment=mv.assignment,
                heartbeat_deadline_ms=prev.heartbeat_deadline_ms if prev is not None else None,
            )
            self.members[m.member_id] = m
            if m.group_instance_id is not None:
                self.static_members[m.group_instance_id] = m.member_id
        ts = value.current_state_timestamp if value.current_state_timestamp >= 0 else None
        self.previous_state = self.state
        self.state = S.STABLE if self.members else S.EMPTY
        self.state_timestamp_ms = ts
        if self.members:
            self._update_subscribed_topics()
        else:
            self.subscribed_topics = set()

    def on_loaded(self, now_ms: int) -> None:
        """After loading: every member gets a fresh session (Kafka's onLoaded)."""
        for m in self.members.values():
            if m.heartbeat_deadline_ms is None:
                m.heartbeat_deadline_ms = now_ms + m.session_timeout_ms

    def mark_dead(self) -> None:
        self.previous_state = self.state
        self.state = S.DEAD

    # ------------------------------------------- questions offsets.py asks any group
    def validate_offset_commit(
        self, member_id: str, group_instance_id: str | None, generation_id: int, api_version: int,
        partitions: list[tuple[str, int]] | None = None,
    ) -> ErrorCode:
        """Kafka's ClassicGroup.validateOffsetCommit (non-transactional); ``partitions``
        (the committed ones) do not matter to a classic group."""
        if self.state is S.DEAD:
            return ErrorCode.coordinator_not_available
        if generation_id < 0 and self.state is S.EMPTY:
            return ErrorCode.none  # admin tools and assign() consumers
        if generation_id >= 0 or member_id != "" or group_instance_id is not None:
            err = self._validate_member(member_id, group_instance_id)
            if err is not ErrorCode.none:
                return err
            if generation_id != self.generation_id:
                return ErrorCode.illegal_generation
        elif self.state is not S.EMPTY:
            return ErrorCode.unknown_member_id
        if self.state is S.COMPLETING_REBALANCE:
            return ErrorCode.rebalance_in_progress
        return ErrorCode.none

    def validate_offset_fetch(self, member_id: str | None, member_epoch: int) -> ErrorCode:
        return ErrorCode.none

    def validate_offset_delete(self) -> ErrorCode:
        if self.state is S.DEAD:
            return ErrorCode.group_id_not_found
        if self.state is not S.EMPTY and self.protocol_type != CONSUMER_PROTOCOL_TYPE:
            return ErrorCode.non_empty_group
        return ErrorCode.none

    def validate_delete_group(self) -> ErrorCode:
        if self.state is S.DEAD:
            return ErrorCode.group_id_not_found
        if self.state is not S.EMPTY:
            return ErrorCode.non_empty_group
        return ErrorCode.none

    def is_subscribed_to_topic(self, topic: str) -> bool:
        return self.subscribed_topics is not None and topic in self.subscribed_topics

    def offset_expiration_base(self, commit_timestamp_ms: int) -> int | None:
        """The time an offset's retention counts from, or None if it cannot expire now (KIP-211)."""
        if self.protocol_type:
            if self.state is S.EMPTY:
                return self.state_timestamp_ms if self.state_timestamp_ms is not None else commit_timestamp_ms
            if self.protocol_type == CONSUMER_PROTOCOL_TYPE and self.subscribed_topics is not None and self.state is S.STABLE:
                return commit_timestamp_ms
            return None
        return commit_timestamp_ms

    def tombstone_records(self) -> list[CoordinatorRecord]:
        return [group_metadata_tombstone(self.group_id)]

    # ------------------------------------------------------------ description
    def describe(self) -> dict[str, Any]:
        stable = self.state is S.STABLE
        return {
            "error_code": ErrorCode.none,
            "group_id": self.group_id,
            "group_state": self.state_name,
            "protocol_type": self.protocol_type or "",
            "protocol_data": (self.protocol_name or "") if stable else "",
            "members": [
                {
                    "member_id": m.member_id,
                    "group_instance_id": m.group_instance_id,
                    "client_id": m.client_id,
                    "client_host": m.client_host,
                    "member_metadata": m.metadata(self.protocol_name) if stable else b"",
                    "member_assignment": m.assignment if stable else b"",
                }
                for m in self.members.values()
            ],
        }
