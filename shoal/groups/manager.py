"""GroupCoordinatorShard: the one object the shell talks to for a ``__consumer_offsets`` partition.

Theory of operation
-------------------
The shard routes every group request by group id. A group id names exactly one group
object in ``self.groups``; each has a ``group_type`` attribute: ``"classic"``
(``classic.ClassicGroup``), ``"consumer"`` (KIP-848) or ``"share"`` (KIP-932).
Offsets of every kind live in ``self.offsets`` (``offsets.OffsetStore``).

Contract with the shell (``shoal.server.runtime``), one operation at a time per shard:

1. call ``handle_<api>(request, now_ms, ...)`` with the decoded kio request (any version);
2. append ``result.records`` to the partition, then call ``replay(record)`` for each;
3. send ``result.response`` (a kio entity of the request's version) unless it is None;
4. send every ``Completion(token, response)`` in ``result.after``: answers to JoinGroup
   or SyncGroup requests parked earlier, possibly by other members;
5. arrange to call ``expire(now_ms)`` at ``min(result.deadlines)`` (or use
   ``next_deadline_ms()``); ``expire`` returns a Result handled like any other.

JoinGroup and SyncGroup take ``token=`` (any hashable the shell chooses, unique per
in-flight request). ``response`` None means the request is parked; its answer arrives
later as a Completion with that token. When the answer is ready at once it is in
``response`` (never also in ``after``). At start-up: ``replay`` every record, then call
``on_loaded(now_ms)`` and schedule its deadlines.

Other group kinds plug in with :meth:`GroupCoordinatorShard.register_kind`: the kind
names the record types it owns and a ``replay(shard, record)`` function; its group
objects go in ``shard.groups``. To take part in ListGroups, DeleteGroups and offsets
they provide ``group_type``, ``protocol_type``, ``state_name``, ``validate_offset_commit``,
``validate_offset_fetch``, ``validate_offset_delete``, ``validate_delete_group``,
``is_subscribed_to_topic``, ``offset_expiration_base``, ``should_expire``,
``tombstone_records`` (see ``offsets.py``) and optionally ``next_deadline()``.
Classic APIs against another kind's group answer as Kafka does for a non-classic group.

Pure: no clock, no I/O, no asyncio; event loop only, never awaits.
"""

from __future__ import annotations

import dataclasses
import datetime
import importlib
import types
import typing
import uuid
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kio.schema.errors import ErrorCode

from shoal.coordinator.records import CoordinatorRecord, RecordType
from shoal.coordinator.result import Result

from .classic import ClassicConfig, ClassicGroup, Effects, JoinRequest, Parked, Reply, join_error, sync_error
from .consumer import with_kafka_member_state
from .offsets import CommitPartition, OffsetStore
from .records import decode_group_metadata

__all__ = ["Completion", "GroupCoordinatorShard", "GroupKind", "build_response", "response_class"]

_MS = datetime.timedelta(milliseconds=1)


# ---------------------------------------------------------------- kio responses
@dataclass(frozen=True, slots=True)
class Completion:
    """The response of a parked request, identified by the token the shell passed in."""

    token: Hashable
    response: Any


def response_class(request: Any) -> type:
    """The kio response class matching a kio request object's API and version."""
    module = type(request).__module__.rsplit(".", 1)[0] + ".response"
    name = type(request).__name__.removesuffix("Request") + "Response"
    return getattr(importlib.import_module(module), name)


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    h = _HINTS.get(cls)
    if h is None:
        h = _HINTS[cls] = typing.get_type_hints(cls)
    return h


def _convert(tp: Any, value: Any) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None:
            return None
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        return _convert(inner[0], value)
    if origin is tuple:
        (elem, *_rest) = typing.get_args(tp)
        return tuple(_convert(elem, v) for v in value)
    if isinstance(tp, type):
        if dataclasses.is_dataclass(tp):
            return value if isinstance(value, tp) else build_response(tp, value)
        if issubclass(tp, datetime.timedelta):
            return value if isinstance(value, datetime.timedelta) else datetime.timedelta(milliseconds=value)
        if tp is ErrorCode:
            return ErrorCode(value)
    return value


def _zero(tp: Any) -> Any:
    origin = typing.get_origin(tp)
    if origin is tuple:
        return ()
    if origin is not None:
        return None
    if tp is ErrorCode:
        return ErrorCode.none
    if isinstance(tp, type):
        if issubclass(tp, datetime.timedelta):
            return datetime.timedelta(0)
        if issubclass(tp, bool):
            return False
        if issubclass(tp, int):
            return 0
        if issubclass(tp, bytes):
            return b""
        if issubclass(tp, str):
            return ""
    return None


def build_response(cls: type, fields: Mapping[str, Any]) -> Any:
    """Build kio entity ``cls`` from a version-free dict.

    Keys the version lacks are dropped; fields the dict lacks take the schema default,
    else a zero value (throttle time 0, empty string ...). Nested dicts become the
    nested entity types; ints become timedeltas where the schema wants milliseconds.
    """
    hints = _hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name in fields:
            kwargs[f.name] = _convert(hints[f.name], fields[f.name])
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            kwargs[f.name] = _zero(hints[f.name])
    return cls(**kwargs)


def _version(entity: Any) -> int:
    return int(type(entity).__version__)


def _ms(value: Any, default: int = -1) -> int:
    if value is None:
        return default
    if isinstance(value, datetime.timedelta):
        return value // _MS
    return int(value)


def _join_fields_for_version(cls: Any, fields: dict[str, Any]) -> dict[str, Any]:
    # As Kafka's JoinGroupResponse: before v7 the protocol name is not nullable; before
    # v9 a leader told to skip the assignment gets no member list instead.
    version = int(cls.__version__)
    if version < 7 and fields.get("protocol_name") is None:
        fields = {**fields, "protocol_name": ""}
    if version < 9 and fields.get("skip_assignment"):
        fields = {**fields, "members": []}
    return fields


# ------------------------------------------------------------------ group kinds
@dataclass(slots=True)
class GroupKind:
    group_type: str
    record_types: frozenset[int]
    replay: Callable[[GroupCoordinatorShard, CoordinatorRecord], None]


# ------------------------------------------------------------------ the shard
class GroupCoordinatorShard:
    """Groups and offsets of one ``__consumer_offsets`` partition."""

    def __init__(
        self,
        config: Mapping[str, Any] | None = None,
        *,
        new_member_id: Callable[[str], str] | None = None,
    ) -> None:
        cfg = dict(config or {})
        self.retention_ms: int = int(cfg.get("offsets.retention.minutes", 7 * 24 * 60)) * 60_000
        self.retention_check_interval_ms: int = int(cfg.get("offsets.retention.check.interval.ms", 600_000))
        self.classic_config = ClassicConfig(
            initial_rebalance_delay_ms=int(cfg.get("group.initial.rebalance.delay.ms", 3000)),
            min_session_timeout_ms=int(cfg.get("group.min.session.timeout.ms", 6000)),
            max_session_timeout_ms=int(cfg.get("group.max.session.timeout.ms", 1_800_000)),
            max_size=int(cfg.get("group.max.size", 2**31 - 1)),
            new_member_id=new_member_id or (lambda prefix: f"{prefix}-{uuid.uuid4()}"),
        )
        self.groups: dict[str, Any] = {}
        self.offsets = OffsetStore()
        self.kinds: dict[str, GroupKind] = {}
        self._replayers: dict[int, Callable[[GroupCoordinatorShard, CoordinatorRecord], None]] = {}
        self.next_retention_check_ms: int | None = None

    # ---------------------------------------------------------------- plumbing
    def register_kind(
        self, group_type: str, record_types: Iterable[int], replay: Callable[[GroupCoordinatorShard, CoordinatorRecord], None]
    ) -> None:
        """Let another group kind (consumer, share) replay its own record types here."""
        kind = GroupKind(group_type, frozenset(int(t) for t in record_types), replay)
        for t in kind.record_types:
            if t in (RecordType.OFFSET_COMMIT_LEGACY, RecordType.OFFSET_COMMIT, RecordType.GROUP_METADATA) or t in self._replayers:
                raise ValueError(f"record type {t} is already handled")
            self._replayers[t] = replay
        self.kinds[group_type] = kind

    def next_deadline_ms(self) -> int | None:
        times = [self.next_retention_check_ms] if self.next_retention_check_ms is not None else []
        for g in self.groups.values():
            nd = getattr(g, "next_deadline", None)
            if nd is not None and (t := nd()) is not None:
                times.append(t)
        return min(times, default=None)

    def _finish(self, response: Any, eff: Effects | None = None, token: Hashable | None = None, now_ms: int | None = None) -> Result:
        completions: list[Completion] = []
        records: list[CoordinatorRecord] = []
        if eff is not None:
            records = eff.records
            for r in eff.replies:
                entity = self._entity(r)
                if response is None and token is not None and r.token == token:
                    response = entity
                else:
                    completions.append(Completion(r.token, entity))
        if self.next_retention_check_ms is None and now_ms is not None:
            self.next_retention_check_ms = now_ms + self.retention_check_interval_ms
        nd = self.next_deadline_ms()
        return Result(records=records, response=response, deadlines=[nd] if nd is not None else [], after=completions)

    def _entity(self, r: Reply) -> Any:
        name = r.response_cls.__name__
        fields = r.fields
        if name == "JoinGroupResponse":
            fields = _join_fields_for_version(r.response_cls, fields)
        return build_response(r.response_cls, fields)

    def _classic(self, group_id: str) -> ClassicGroup | None:
        g = self.groups.get(group_id)
        return g if isinstance(g, ClassicGroup) else None

    # --------------------------------------------------------------- JoinGroup
    def handle_join_group(
        self, request: Any, now_ms: int, *, token: Hashable, client_id: str = "", client_host: str = ""
    ) -> Result:
        cls = response_class(request)
        version = _version(request)
        parked = Parked(token, cls)

        def answer(fields: dict[str, Any]) -> Result:
            return self._finish(build_response(cls, _join_fields_for_version(cls, fields)), now_ms=now_ms)

        group_id = request.group_id
        instance_id = getattr(request, "group_instance_id", None)
        session_ms = _ms(request.session_timeout)
        rebalance_ms = _ms(getattr(request, "rebalance_timeout", None), -1)
        if rebalance_ms < 0:
            rebalance_ms = session_ms
        if not group_id:
            return answer(join_error(ErrorCode.invalid_group_id, request.member_id))
        group = self.groups.get(group_id)
        if group is not None and not isinstance(group, ClassicGroup):
            return answer(join_error(ErrorCode.inconsistent_group_protocol, request.member_id))
        c = self.classic_config
        if session_ms < c.min_session_timeout_ms or session_ms > c.max_session_timeout_ms:
            return answer(join_error(ErrorCode.invalid_session_timeout, request.member_id))
        created = False
        if group is None:
            if request.member_id:
                return answer(join_error(ErrorCode.unknown_member_id, request.member_id))
            group = ClassicGroup(group_id, c, now_ms)
            created = True
        j = JoinRequest(
            member_id=request.member_id,
            group_instance_id=instance_id,
            protocol_type=request.protocol_type,
            protocols=tuple((p.name, bytes(p.metadata)) for p in request.protocols),
            session_timeout_ms=session_ms,
            rebalance_timeout_ms=rebalance_ms,
            require_known_member_id=version >= 4 and instance_id is None,
            client_id=client_id,
            client_host=client_host,
        )
        eff = Effects()
        fields = group.join(j, parked, now_ms, eff)
        if created and (group.members or group.pending_members):
            self.groups[group_id] = group
        response = None if fields is None else build_response(cls, _join_fields_for_version(cls, fields))
        return self._finish(response, eff, token, now_ms)

    # --------------------------------------------------------------- SyncGroup
    def handle_sync_group(
        self, request: Any, now_ms: int, *, token: Hashable, client_id: str = "", client_host: str = ""
    ) -> Result:
        cls = response_class(request)
        group = self._classic(request.group_id)
        if not request.group_id:
            return self._finish(build_response(cls, sync_error(ErrorCode.invalid_group_id)), now_ms=now_ms)
        if group is None:
            return self._finish(build_response(cls, sync_error(ErrorCode.unknown_member_id)), now_ms=now_ms)
        eff = Effects()
        fields = group.sync(
            request.member_id,
            getattr(request, "group_instance_id", None),
            int(request.generation_id),
            getattr(request, "protocol_type", None),
            getattr(request, "protocol_name", None),
            {a.member_id: bytes(a.assignment) for a in request.assignments},
            Parked(token, cls),
            now_ms,
            eff,
        )
        response = None if fields is None else build_response(cls, fields)
        return self._finish(response, eff, token, now_ms)

    # --------------------------------------------------------------- Heartbeat
    def handle_heartbeat(self, request: Any, now_ms: int) -> Result:
        cls = response_class(request)
        group = self._classic(request.group_id)
        if not request.group_id:
            code = ErrorCode.invalid_group_id
        elif group is None:
            code = ErrorCode.unknown_member_id
        else:
            code = group.heartbeat(
                request.member_id, getattr(request, "group_instance_id", None), int(request.generation_id), now_ms
            )
        return self._finish(build_response(cls, {"error_code": code}), now_ms=now_ms)

    # -------------------------------------------------------------- LeaveGroup
    def handle_leave_group(self, request: Any, now_ms: int) -> Result:
        cls = response_class(request)
        version = _version(request)
        if version >= 3:
            identities = [(m.member_id, m.group_instance_id) for m in request.members]
        else:
            identities = [(request.member_id, None)]
        group = self._classic(request.group_id)
        eff = Effects()
        top = ErrorCode.none
        if not request.group_id:
            top, codes = ErrorCode.invalid_group_id, []
        elif group is None:
            codes = [ErrorCode.unknown_member_id] * len(identities)
        elif group.state.name == "DEAD":
            top, codes = ErrorCode.coordinator_not_available, []
        else:
            codes = group.leave(identities, now_ms, eff)
        if version < 3 and top is ErrorCode.none and codes:
            top = codes[0]
        fields = {
            "error_code": top,
            "members": [
                {"member_id": mid, "group_instance_id": iid, "error_code": code}
                for (mid, iid), code in zip(identities, codes)
            ],
        }
        return self._finish(build_response(cls, fields), eff, None, now_ms)

    # ------------------------------------------------------------ OffsetCommit
    def handle_offset_commit(self, request: Any, now_ms: int) -> Result:
        cls = response_class(request)
        version = _version(request)
        topics = [
            (
                t.name,
                [
                    CommitPartition(
                        int(p.partition_index),
                        int(p.committed_offset),
                        int(getattr(p, "committed_leader_epoch", -1)),
                        p.committed_metadata,
                    )
                    for p in t.partitions
                ],
            )
            for t in request.topics
        ]
        retention = getattr(request, "retention_time", None)
        records, fields = self.offsets.commit(
            request.group_id,
            self.groups.get(request.group_id),
            member_id=request.member_id,
            group_instance_id=getattr(request, "group_instance_id", None),
            generation_id=int(request.generation_id_or_member_epoch),
            api_version=version,
            topics=topics,
            retention_ms=_ms(retention, -1),
            now_ms=now_ms,
        )
        return self._finish(build_response(cls, fields), Effects(records=records), None, now_ms)

    # ------------------------------------------------------------ TxnOffsetCommit
    def handle_txn_offset_commit(self, request: Any, now_ms: int) -> Result:
        """Offsets committed inside a transaction: OFFSET_COMMIT records appended as a
        transactional batch of the producer, pending until its commit marker. The group
        checks member and generation as for OffsetCommit; a request without them
        (generation -1 and no member id: versions before 3) is not checked, as Kafka does."""
        cls = response_class(request)
        topics = [(t.name, [CommitPartition(int(p.partition_index), int(p.committed_offset),
                                            int(getattr(p, "committed_leader_epoch", -1)), p.committed_metadata)
                            for p in t.partitions])
                  for t in request.topics]
        generation = int(getattr(request, "generation_id", -1))
        member_id = getattr(request, "member_id", "") or ""
        group = self.groups.get(request.group_id)
        records, fields = self.offsets.commit(
            request.group_id, group if (generation >= 0 or member_id) else None, member_id=member_id,
            group_instance_id=getattr(request, "group_instance_id", None), generation_id=generation,
            api_version=8, topics=topics, retention_ms=-1, now_ms=now_ms)
        result = self._finish(build_response(cls, fields), Effects(records=records), None, now_ms)
        result.producer_id = int(request.producer_id)
        result.producer_epoch = int(request.producer_epoch)
        return result

    def replay_transactional(self, record: CoordinatorRecord, producer_id: int) -> None:
        """A record of a transactional batch: offsets stay pending until the marker."""
        if record.record_type in (RecordType.OFFSET_COMMIT, RecordType.OFFSET_COMMIT_LEGACY):
            self.offsets.replay_pending(record, producer_id)
        else:
            self.replay(record)

    def replay_marker(self, producer_id: int, commit: bool) -> None:
        """A commit or abort marker of ``producer_id`` in this partition."""
        for group_id in self.offsets.complete_transaction(producer_id, commit):
            if group_id not in self.groups and self.offsets.has_offsets(group_id):
                self.groups[group_id] = ClassicGroup(group_id, self.classic_config, None)

    # ------------------------------------------------------------- OffsetFetch
    def handle_offset_fetch(self, request: Any, now_ms: int) -> Result:
        cls = response_class(request)
        version = _version(request)

        def topics_of(ts: Any) -> list[tuple[str, list[int]]] | None:
            if ts is None:
                return None
            return [(t.name, [int(p) for p in t.partition_indexes]) for t in ts]

        require_stable = bool(getattr(request, "require_stable", False))
        if version >= 8:
            groups = [
                self.offsets.fetch(
                    g.group_id,
                    self.groups.get(g.group_id),
                    member_id=getattr(g, "member_id", None),
                    member_epoch=int(getattr(g, "member_epoch", -1)),
                    topics=topics_of(g.topics),
                    require_stable=require_stable,
                )
                for g in request.groups
            ]
            return self._finish(build_response(cls, {"groups": groups}), now_ms=now_ms)
        one = self.offsets.fetch(
            request.group_id,
            self.groups.get(request.group_id),
            topics=topics_of(request.topics),
            require_stable=require_stable,
        )
        if version < 2 and one["error_code"] is not ErrorCode.none:
            # v1 has no top-level error: it goes on every requested partition.
            code = one["error_code"]
            one["topics"] = [
                {"name": n, "partitions": [{"partition_index": p, "committed_offset": -1, "metadata": "", "error_code": code} for p in ps]}
                for n, ps in (topics_of(request.topics) or [])
            ]
        return self._finish(build_response(cls, {"error_code": one["error_code"], "topics": one["topics"]}), now_ms=now_ms)

    # ------------------------------------------------------------ OffsetDelete
    def handle_offset_delete(self, request: Any, now_ms: int) -> Result:
        cls = response_class(request)
        topics = [(t.name, [int(p.partition_index) for p in t.partitions]) for t in request.topics]
        records, fields = self.offsets.delete(request.group_id, self.groups.get(request.group_id), topics)
        return self._finish(build_response(cls, fields), Effects(records=records), None, now_ms)

    def on_topics_deleted(self, topics: Iterable[str], now_ms: int) -> Result:
        """Tombstones for every committed offset of the deleted topics, in every group."""
        return self._finish(None, Effects(records=self.offsets.tombstones_for_topics(topics)), None, now_ms)

    # --------------------------------------------------- Describe/List/Delete
    def handle_describe_groups(self, request: Any, now_ms: int) -> Result:
        cls = response_class(request)
        version = _version(request)
        out = []
        for group_id in request.groups:
            g = self.groups.get(group_id)
            if isinstance(g, ClassicGroup):
                out.append(g.describe())
                continue
            entry: dict[str, Any] = {"group_id": group_id, "group_state": "Dead", "error_code": ErrorCode.none,
                                     "protocol_type": "", "protocol_data": "", "members": []}
            if version >= 6:
                entry["error_code"] = ErrorCode.group_id_not_found
                entry["error_message"] = (
                    f"Group {group_id} not found." if g is None else f"Group {group_id} is not a classic group."
                )
            out.append(entry)
        return self._finish(build_response(cls, {"groups": out}), now_ms=now_ms)

    def handle_list_groups(self, request: Any, now_ms: int) -> Result:
        cls = response_class(request)
        states = {s.lower() for s in getattr(request, "states_filter", ())}
        types = {t.lower() for t in getattr(request, "types_filter", ())}
        out = []
        for group_id, g in self.groups.items():
            state = getattr(g, "state_name", "")
            if states and state.lower() not in states:
                continue
            if types and g.group_type.lower() not in types:
                continue
            out.append(
                {
                    "group_id": group_id,
                    "protocol_type": getattr(g, "protocol_type", None) or "",
                    "group_state": state,
                    "group_type": g.group_type,
                }
            )
        return self._finish(build_response(cls, {"error_code": ErrorCode.none, "groups": out}), now_ms=now_ms)

    def handle_delete_groups(self, request: Any, now_ms: int) -> Result:
        cls = response_class(request)
        records: list[CoordinatorRecord] = []
        results = []
        for group_id in request.groups_names:
            g = self.groups.get(group_id)
            code = ErrorCode.group_id_not_found if g is None else g.validate_delete_group()
            if code is ErrorCode.none and g is not None:
                records += self.offsets.tombstones_for_group(group_id)
                records += g.tombstone_records()
            results.append({"group_id": group_id, "error_code": code})
        return self._finish(build_response(cls, {"results": results}), Effects(records=records), None, now_ms)

    # ------------------------------------------------------------------ timers
    def expire(self, now_ms: int) -> Result:
        """Process everything due at ``now_ms``: sessions, rebalance and sync timeouts,
        pending members, and (every offsets.retention.check.interval.ms) offset expiry.
        Early or repeated calls are harmless."""
        eff = Effects()
        for g in list(self.groups.values()):
            if isinstance(g, ClassicGroup):
                g.expire(now_ms, eff)
        if self.next_retention_check_ms is None:
            self.next_retention_check_ms = now_ms + self.retention_check_interval_ms
        elif now_ms >= self.next_retention_check_ms:
            self.next_retention_check_ms = now_ms + self.retention_check_interval_ms
            eff.records += self._expired_offsets(now_ms)
        return self._finish(None, eff, None, now_ms)

    def _expired_offsets(self, now_ms: int) -> list[CoordinatorRecord]:
        records: list[CoordinatorRecord] = []
        for group_id in sorted(set(self.groups) | set(self.offsets.group_ids())):
            g = self.groups.get(group_id)
            recs, none_left = self.offsets.expired(group_id, g, now_ms, self.retention_ms)
            records += recs
            if none_left and g is not None and g.should_expire() and not getattr(g, "pending_members", None):
                records += g.tombstone_records()
        return records

    # ------------------------------------------------------------------ replay
    def replay(self, record: CoordinatorRecord) -> None:
        """Apply one durable record (live after an append, or while loading)."""
        t = record.record_type
        if t in (RecordType.OFFSET_COMMIT, RecordType.OFFSET_COMMIT_LEGACY):
            group_id = self.offsets.replay(record)
            if record.value is not None and group_id not in self.groups:
                # A commit to an unknown group creates a "simple" classic group.
                self.groups[group_id] = ClassicGroup(group_id, self.classic_config, None)
            return
        if t == RecordType.GROUP_METADATA:
            group_id, value = decode_group_metadata(record)
            if value is None:
                g = self.groups.pop(group_id, None)
                if isinstance(g, ClassicGroup):
                    g.mark_dead()
                return
            g = self.groups.get(group_id)
            if not isinstance(g, ClassicGroup):
                g = self.groups[group_id] = ClassicGroup(group_id, self.classic_config, value.current_state_timestamp)
            g.replay_metadata(value)
            return
        replay = self._replayers.get(t)
        if replay is not None:
            replay(self, record)

    @staticmethod
    def upgraded(record: CoordinatorRecord) -> CoordinatorRecord | None:
        """``record`` as this version writes it, if an earlier version wrote it otherwise (the
        runtime rewrites such records in place after loading); None when it is current."""
        return with_kafka_member_state(record)

    def on_loaded(self, now_ms: int) -> list[int]:
        """After start-up replay: start every loaded member's session; returns deadlines."""
        for g in self.groups.values():
            if isinstance(g, ClassicGroup):
                g.on_loaded(now_ms)
        self.next_retention_check_ms = now_ms + self.retention_check_interval_ms
        nd = self.next_deadline_ms()
        return [nd] if nd is not None else []
