"""The group coordinator service: the asyncio shell around the pure group cores.

Theory of operation
-------------------
``GroupCoordinatorService`` (``broker.extensions["groups"]``, created by an ``on_start``
hook registered when this module is imported) owns a :class:`CoordinatorRuntime` over
``__consumer_offsets``: one :class:`GroupCoordinatorShard` per partition, each with the
consumer-group (KIP-848, :class:`ConsumerGroups`) and share-group (KIP-932,
:class:`ShareGroups`) kinds plugged in through ``register_kind``. A group id routes to
the shard of its partition (``partition_for_group``, Kafka's hash) and names exactly one
group of one kind there: every kind's groups appear in ``shard.groups`` (consumer and
share groups as small views), so offsets, ListGroups, DeleteGroups and the classic
APIs see one namespace.

Every write goes through :meth:`GroupCoordinatorService.apply` (append, fsync, replay)
or, for OffsetCommit, :meth:`GroupCoordinatorService.apply_durable` (append and replay
at once, then await a group-commit fsync shared with concurrent writes); then parked
JoinGroup/SyncGroup requests named in the result's completions are answered, removed
share members are reported, and the shard's timer is moved to its earliest deadline.
OffsetFetch answers only once everything its shard had appended is durable. Handlers are plain functions
of (shard, request, now_ms) and never await between computing a result and applying
it, so one shard's operations never interleave.

Timers: one ``loop.call_later`` per shard for the earliest deadline any result asked
for (a heap; early firings are harmless). Deadlines are rounded up to ``TIMER_TICK_MS``
and each is kept once, so the members' heartbeats (each one pushing its session's new
deadline) add at most one entry and one firing per tick rather than one per heartbeat:
a firing scans the shard's groups, and with a thousand members heartbeating it would
otherwise run for nearly every heartbeat. Firing runs ``expire(now_ms)`` of the classic
shard, the consumer groups and the share groups, each through ``apply``.

Parked requests: JoinGroup and SyncGroup get a token; a request the shard cannot answer
yet waits on a future registered under its token, which a later completion resolves.
If the client's connection closes, the connection cancels the handler task and so the
future; the member then times out in the shard as in Kafka.

Contract with the share service (``broker.extensions["share"]``, optional):

* it may call ``share_assignment(group_id, member_id)`` -> ``{topic_id: frozenset}`` or
  None (not a member), ``share_group_exists(group_id)`` and ``group_type(group_id)``
  (``"classic"``/``"consumer"``/``"share"``/None);
* once the records removing share members (leave, fencing, session expiry) are durable,
  this service calls ``share.on_share_member_removed(group_id, member_id)``;
* share-partitions entering a share group's target assignment are initialized before
  the heartbeat that made them *initializing* is answered: after the heartbeat's records
  are durable, ``await share.initialize_share_state(group_id, {topic_id: [partitions]},
  earliest_topics=..., state_epoch=<group epoch>)`` (``earliest_topics``: topics whose new
  partitions start at the earliest offset); on success ``mark_initialized`` is applied
  and the member gets them (``refresh_assignment``); if it raises
  ``mark_initialize_failed`` is applied, the heartbeat is answered without them and the
  next heartbeat of the group retries. A member is never assigned a partition that is
  not initialized. A second heartbeat that needs partitions being initialized waits for
  that attempt. Without a share service the partitions are marked initialized at once;
* DeleteGroups of a share group: ``begin_delete_group`` (applied), then
  ``await share.delete_share_state(group_id, {topic_id: [partitions]})`` for those and
  every other key ``share.state_keys(group_id)`` knows with state, then
  ``complete_delete_group`` (applied). A successful DeleteGroups of any kind also
  deletes the group's dynamic configs.

Cluster mode: ``__consumer_offsets`` is a replicated topic and this service serves a
partition only while this broker leads it (``on_leadership_change``): becoming leader
schedules the replay of the partition into a fresh shard (COORDINATOR_LOAD_IN_PROGRESS
meanwhile); losing it drops the shard, its timers and its parked JoinGroup/SyncGroup
requests (NOT_COORDINATOR). ``partition_for`` raises NOT_COORDINATOR for a group whose
partition this broker does not serve. Every answer waits for the partition's high
watermark to cover what the partition held when it was computed (``answer``,
``answer_per_partition``, ``wait_replicated``; OffsetCommit and OffsetFetch through
``runtime.wait_durable``): a write's own records, and anything an earlier write or a
timer appended. On one broker these return at once.

Event loop only.
"""

from __future__ import annotations

import asyncio
import dataclasses
import heapq
import inspect
import itertools
import logging
import uuid
from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Any

from ..coordinator.records import CoordinatorRecord
from ..coordinator.result import Result
from ..errors import ApiError, ErrorCode
from ..groups.assignors import from_partitions, partitions_of
from ..groups.classic import ClassicGroup
from ..groups.consumer import ConsumerGroups
from ..groups.manager import Completion, GroupCoordinatorShard
from ..groups.share_group import ShareEffects, ShareGroups
from .broker import on_leadership_change, on_start, on_stop, on_topic_deleted
from .runtime import CoordinatorRuntime

__all__ = ["GroupCoordinatorService", "client_host", "group_service"]

log = logging.getLogger("shoal.groups")

OFFSETS_TOPIC = "__consumer_offsets"
_INTERNAL_TOPICS = frozenset({"__consumer_offsets", "__share_group_state", "__transaction_state"})
_SHARD_CONFIG_KEYS = (
    "offsets.retention.minutes", "offsets.retention.check.interval.ms", "group.initial.rebalance.delay.ms",
    "group.min.session.timeout.ms", "group.max.session.timeout.ms", "group.max.size",
)


# ----------------------------------------------------------------- kind views
class _KindView:
    """A heartbeat-driven group as ``shard.groups`` sees it (``manager.py``'s kind contract)."""

    __slots__ = ("group_id", "kind")

    def __init__(self, kind: Any, group_id: str) -> None:
        self.kind = kind
        self.group_id = group_id

    @property
    def group_type(self) -> str:
        return self.kind.group_type

    @property
    def protocol_type(self) -> str:
        return self.kind.protocol_type

    @property
    def state_name(self) -> str:
        g = self.kind.group(self.group_id)
        return "Dead" if g is None else g.state.value


class _ConsumerGroupView(_KindView):
    """A consumer group: committed offsets checked against member epochs."""

    __slots__ = ()
    kind: ConsumerGroups

    def validate_offset_commit(self, member_id: str, group_instance_id: str | None, generation_id: int,
                               api_version: int, partitions: list[tuple[str, int]] | None = None) -> ErrorCode:
        return self.kind.validate_offset_commit(self.group_id, member_id, generation_id, partitions)

    def validate_offset_fetch(self, member_id: str | None, member_epoch: int) -> ErrorCode:
        return self.kind.validate_offset_fetch(self.group_id, member_id, member_epoch)

    def validate_offset_delete(self) -> ErrorCode:
        return ErrorCode.none

    def validate_delete_group(self) -> ErrorCode:
        return self.kind.delete_group(self.group_id).response  # type: ignore[return-value]

    def is_subscribed_to_topic(self, topic: str) -> bool:
        return self.kind.is_subscribed_to_topic(self.group_id, topic)

    def offset_expiration_base(self, commit_timestamp_ms: int) -> int | None:
        return commit_timestamp_ms

    def should_expire(self) -> bool:
        g = self.kind.group(self.group_id)
        return g is None or not g.members

    def tombstone_records(self) -> list[CoordinatorRecord]:
        return self.kind.delete_group(self.group_id).records


class _ShareGroupView(_KindView):
    """A share group: no committed offsets of its own."""

    __slots__ = ()
    kind: ShareGroups

    def validate_offset_commit(self, *args: Any, **kwargs: Any) -> ErrorCode:
        return ErrorCode.group_id_not_found

    def validate_offset_fetch(self, member_id: str | None, member_epoch: int) -> ErrorCode:
        return ErrorCode.group_id_not_found

    def validate_offset_delete(self) -> ErrorCode:
        return ErrorCode.group_id_not_found

    def validate_delete_group(self) -> ErrorCode:
        g = self.kind.group(self.group_id)
        return ErrorCode.group_id_not_found if g is None else (
            ErrorCode.non_empty_group if g.members else ErrorCode.none)

    def is_subscribed_to_topic(self, topic: str) -> bool:
        g = self.kind.group(self.group_id)
        return g is not None and any(topic in m.subscribed_topic_names for m in g.members.values())

    def offset_expiration_base(self, commit_timestamp_ms: int) -> int | None:
        return None

    def should_expire(self) -> bool:
        return False

    def tombstone_records(self) -> list[CoordinatorRecord]:
        return []


def _bridge(kind: Any, view_cls: type) -> Any:
    """Replay for ``register_kind``: the kind replays, ``shard.groups`` follows."""

    def replay(shard: GroupCoordinatorShard, rec: CoordinatorRecord) -> None:
        kind.replay(rec)
        group_id = rec.key["group_id"]
        current = shard.groups.get(group_id)
        if kind.has_group(group_id):
            if not isinstance(current, view_cls):
                # Replaces nothing, or an empty classic group converted by this kind.
                shard.groups[group_id] = view_cls(kind, group_id)
        elif isinstance(current, view_cls):
            del shard.groups[group_id]

    return replay


class _Partition:
    """Everything the service keeps for one ``__consumer_offsets`` partition."""

    __slots__ = ("consumer", "deadlines", "queued", "share", "timer", "timer_at")

    def __init__(self, consumer: ConsumerGroups, share: ShareGroups) -> None:
        self.consumer = consumer
        self.share = share
        self.deadlines: list[int] = []
        self.queued: set[int] = set()
        """The deadlines in ``deadlines`` (each kept once)."""
        self.timer: asyncio.TimerHandle | None = None
        self.timer_at: int | None = None


def _epoch(inner: Any) -> int:
    """A group's generation (classic) or group epoch (consumer, share); -1 for a vanished group."""
    if inner is None:
        return -1
    epoch = getattr(inner, "generation_id", None)
    return int(epoch if epoch is not None else getattr(inner, "group_epoch", 0))


def _members(inner: Any) -> dict[str, tuple[str, str]]:
    """{member id: (client id, client host)} of any group kind."""
    if inner is None:
        return {}
    return {mid: (getattr(m, "client_id", ""), getattr(m, "client_host", "")) for mid, m in inner.members.items()}


GROUP_SCAN_INTERVAL_S = 0.1
"""Longest delay before a group change that wrote no record is logged."""

TIMER_TICK_MS = 50
"""Group deadlines (sessions, rebalance timeouts, retention) are rounded up to this: a
shard's timer fires at most once per tick, however many members heartbeat."""

_REBALANCING = {"PreparingRebalance", "CompletingRebalance", "Assigning", "Reconciling"}


def _rebalance_note(old: str | None, new: str) -> str:
    if new in _REBALANCING and old not in _REBALANCING:
        return " (rebalance started)"
    if old in _REBALANCING and new not in _REBALANCING:
        return " (rebalance completed)"
    return ""


def client_host(ctx: Any) -> str:
    """Kafka's form of a client address: ``/IP``."""
    peer = getattr(ctx.connection, "peer", "") or ""
    host = peer.rsplit(":", 1)[0] if ":" in peer else peer
    return "/" + host if host and host != "?" else ""


def group_service(broker: Any) -> GroupCoordinatorService:
    svc = broker.extensions.get("groups")
    if svc is None:
        raise ApiError(ErrorCode.coordinator_not_available, "the group coordinator is not loaded")
    return svc


# ------------------------------------------------------------------ the service
class GroupCoordinatorService:
    def __init__(self, broker: Any) -> None:
        self.broker = broker
        self.config = broker.config
        self.runtime: CoordinatorRuntime[GroupCoordinatorShard] = CoordinatorRuntime(
            broker, OFFSETS_TOPIC, "offsets.topic.num.partitions", self._new_shard,
            topic_configs={"cleanup.policy": "compact",
                           "segment.bytes": str(broker.config["offsets.topic.segment.bytes"])},
            follow_leadership=True)
        self._parts: dict[int, _Partition] = {}
        self._parked_in: dict[Hashable, int] = {}
        self._tokens = itertools.count(1)
        self._parked: dict[Hashable, asyncio.Future[Any]] = {}
        self._initializing: dict[str, dict[tuple[uuid.UUID, int], asyncio.Future[None]]] = {}
        self._closed = False
        self._scans: dict[int, asyncio.TimerHandle] = {}
        """Per partition: the pending scan of its groups for changes to log."""
        self._seen: dict[int, dict[str, tuple[str, int, dict[str, tuple[str, str]]]]] = {}
        """Per partition: group id -> (state, generation or epoch, {member id: (client id, host)}) last logged."""

    # ------------------------------------------------------------ set-up
    def _new_shard(self, index: int) -> GroupCoordinatorShard:
        cfg = self.config
        shard = GroupCoordinatorShard({k: cfg[k] for k in _SHARD_CONFIG_KEYS})
        consumer = ConsumerGroups(
            assignors=cfg["group.consumer.assignors"], max_size=cfg["group.consumer.max.size"],
            session_timeout_ms=cfg["group.consumer.session.timeout.ms"],
            heartbeat_interval_ms=cfg["group.consumer.heartbeat.interval.ms"])
        share = ShareGroups(max_size=cfg["group.share.max.size"],
                            session_timeout_ms=cfg["group.share.session.timeout.ms"],
                            heartbeat_interval_ms=cfg["group.share.heartbeat.interval.ms"])
        shard.register_kind("consumer", ConsumerGroups.record_types, _bridge(consumer, _ConsumerGroupView))
        shard.register_kind("share", ShareGroups.record_types, _bridge(share, _ShareGroupView))
        self._parts[index] = _Partition(consumer, share)
        return shard

    def group_kinds(self) -> list[tuple[ConsumerGroups, ShareGroups]]:
        """(consumer groups, share groups) of every loaded ``__consumer_offsets`` partition (read-only use)."""
        return [(part.consumer, part.share) for _i, part in sorted(self._parts.items())]

    def load(self) -> None:
        """Replay ``__consumer_offsets``, start every loaded member's session, arm timers."""
        self.runtime.load()
        for p in range(len(self.runtime.shards)):
            if self.runtime.owns(p):
                self._start_partition(p)
        counts: dict[str, int] = {}
        for shard in self.runtime.shards:
            for g in shard.groups.values():
                kind = getattr(g, "group_type", "classic")
                counts[kind] = counts.get(kind, 0) + 1
        log.info("group coordinator loaded %s", ", ".join(f"{n} {k} group(s)" for k, n in sorted(counts.items()))
                 or "no groups")

    def _start_partition(self, p: int) -> None:
        """Start the sessions of partition ``p``'s loaded members and arm its timer."""
        shard = self.runtime.shards[p]
        now = self.now_ms()
        part = self._parts[p]
        deadlines = list(part.consumer.on_loaded(now).deadlines) + list(part.share.on_loaded(now).deadlines)
        nd = shard.next_deadline_ms()
        if nd is not None:
            deadlines.append(nd)
        self._track(p, deadlines)
        self._seen[p] = {gid: (g.state_name, _epoch(inner), _members(inner))
                         for gid, g in shard.groups.items()
                         for inner in [g.kind.group(g.group_id) if isinstance(g, _KindView) else g]}

    # ------------------------------------------------------------ cluster mode
    def leadership_changed(self, topic: str, index: int, leader: bool) -> None:
        if topic != OFFSETS_TOPIC or self._closed:
            return
        n = self.runtime.sync_partition_count()
        for gone in [i for i in self._parts if i >= n]:
            self._drop_partition(gone)
            del self._parts[gone]
        if not 0 <= index < n:
            return
        self._drop_partition(index)
        if leader:
            self.runtime.schedule_load(index, lambda: self._closed, self._start_partition)
        else:
            self.runtime.unload_partition(index)

    def _drop_partition(self, index: int) -> None:
        """Timers and parked requests of partition ``index`` (its shard is being replaced)."""
        part = self._parts.get(index)
        if part is not None:
            if part.timer is not None:
                part.timer.cancel()
            part.timer, part.timer_at = None, None
            part.deadlines.clear()
            part.queued.clear()
        for token in [t for t, p in self._parked_in.items() if p == index]:
            self._parked_in.pop(token, None)
            fut = self._parked.pop(token, None)
            if fut is not None and not fut.done():
                fut.set_exception(ApiError(ErrorCode.not_coordinator, "the coordinator moved"))
        self._seen.pop(index, None)

    def close(self) -> None:
        self._closed = True
        for handle in self._scans.values():
            handle.cancel()
        self._scans.clear()
        for part in self._parts.values():
            if part.timer is not None:
                part.timer.cancel()
                part.timer = None
        for fut in self._parked.values():
            if not fut.done():
                fut.cancel()
        self._parked.clear()

    def now_ms(self) -> int:
        return self.broker.clock.now_ms()

    # ------------------------------------------------------------ routing
    def partition_for(self, group_id: str) -> int:
        """The partition of ``group_id``; ApiError(NOT_COORDINATOR / COORDINATOR_LOAD_IN_PROGRESS)
        when this broker does not serve it (cluster mode)."""
        p = self.runtime.partition_for_group(group_id)
        self.runtime.check_owner(p)
        return p

    def describe(self, kind_of: Any, group_id: str) -> Any:
        """``kind_of(partition).describe_group(group_id)``, with NOT_COORDINATOR /
        COORDINATOR_LOAD_IN_PROGRESS in the entry when this broker does not serve the group."""
        p = self.runtime.partition_for_group(group_id)
        described = kind_of(p).describe_group(group_id)
        try:
            self.runtime.check_owner(p)
        except ApiError as e:
            return dataclasses.replace(described, error_code=e.error_code, error_message=e.message)
        return described

    def with_error(self, described: Any, errors: Mapping[int, ApiError]) -> Any:
        """A describe entry (with ``group_id``, ``error_code``, ``error_message``) carrying the
        error of its group's partition in ``errors`` (see :meth:`answer_per_partition`)."""
        e = errors.get(self.runtime.partition_for_group(described.group_id))
        if e is None or described.error_code != ErrorCode.none:
            return described
        if hasattr(described, "error_message"):
            return dataclasses.replace(described, error_code=e.error_code, error_message=e.message)
        return dataclasses.replace(described, error_code=e.error_code)

    def owned_partitions(self) -> list[int]:
        return [p for p in range(self.runtime.num_partitions) if self.runtime.owns(p)]

    def shard(self, partition: int) -> GroupCoordinatorShard:
        return self.runtime.shards[partition]

    def consumer_groups(self, partition: int) -> ConsumerGroups:
        return self._parts[partition].consumer

    def share_groups(self, partition: int) -> ShareGroups:
        return self._parts[partition].share

    @property
    def partitions(self) -> range:
        return range(self.runtime.num_partitions)

    def group_type(self, group_id: str) -> str | None:
        g = self.shard(self.runtime.partition_for_group(group_id)).groups.get(group_id)
        return None if g is None else g.group_type

    def topics_metadata(self) -> dict[str, tuple[uuid.UUID, int]]:
        """name -> (topic_id, partition count) of every user topic, for the assignors."""
        return {t.name: (t.topic_id, t.num_partitions) for t in self.broker.store.topics()
                if t.name not in _INTERNAL_TOPICS}

    def group_config(self, group_id: str, name: str) -> Any:
        return self.broker.dynamic_configs.group_value(group_id, name, self.config)

    # ------------------------------------------------------------ writes
    def apply(self, partition: int, result: Result[Any]) -> Result[Any]:
        """Make ``result`` durable (fsync on the event loop), then deliver what it says.

        Raises ApiError(COORDINATOR_NOT_AVAILABLE) if the records cannot be written; the
        parked requests the result would have answered then get that error.
        """
        try:
            self.runtime.apply(partition, result)
        except ApiError as e:
            self._fail_completions(result, e)
            raise
        return self._deliver(partition, result)

    async def apply_durable(self, partition: int, result: Result[Any]) -> Result[Any]:
        """As :meth:`apply`, but the fsync is shared with concurrent writes to the partition
        and runs off the event loop (``CoordinatorRuntime.apply_durable``): the result is
        replayed at once and delivered once durable. Raises as :meth:`apply` does."""
        try:
            await self.runtime.apply_durable(partition, result)
        except ApiError as e:
            self._fail_completions(result, e)
            raise
        return self._deliver(partition, result)

    def answer(self, partition: int, response: Any, *, wrote: bool = False) -> Any:
        """``response``, to be sent only once the partition's state it was computed from is safe.

        Single broker: ``response`` itself (``apply`` fsynced already). Cluster mode: a
        coroutine that returns it once the partition's high watermark covers every record
        appended to it so far, this request's own (``wrote``: they also need
        ``min.insync.replicas``) and earlier ones (a session expiry, another member's
        join), or ``response`` itself when the high watermark covers them already. Raises
        (or the coroutine raises) ApiError(NOT_COORDINATOR) when leadership moved,
        ApiError(COORDINATOR_NOT_AVAILABLE) when the replicas did not catch up within
        ``offsets.commit.timeout.ms``. Kafka's coordinator runtime likewise answers a
        write once it is committed, and reads only committed state.
        """
        rt = self.runtime
        if rt.owned is None or not (wrote or rt.needs_wait(partition)):
            return response
        return self._when_replicated(partition, response, wrote)

    async def _when_replicated(self, partition: int, response: Any, wrote: bool) -> Any:
        await self.runtime.wait_durable(partition, wrote=wrote)
        return response

    def answer_per_partition(self, partitions: Iterable[int], build: Callable[[dict[int, ApiError]], Any]) -> Any:
        """For an answer over several partitions with per-group errors (describes): ``build(errors)``,
        ``errors`` mapping each partition whose wait failed (see :meth:`answer`) to its error;
        a coroutine in cluster mode when any of them must wait first. Partitions this broker
        does not serve are skipped (their groups carry NOT_COORDINATOR already)."""
        rt = self.runtime
        waiting = [] if rt.owned is None else [p for p in dict.fromkeys(partitions)
                                               if rt.owns(p) and rt.needs_wait(p)]
        if not waiting:
            return build({})

        async def wait() -> Any:
            errors: dict[int, ApiError] = {}
            for p in waiting:
                try:
                    await rt.wait_durable(p)
                except ApiError as e:
                    errors[p] = e
            return build(errors)

        return wait()

    async def wait_replicated(self, partition: int, *, wrote: bool = False) -> None:
        """Cluster mode: ``runtime.wait_durable``; a single broker returns at once (``apply``
        fsynced already)."""
        if self.runtime.owned is not None:
            await self.runtime.wait_durable(partition, wrote=wrote)

    def _fail_completions(self, result: Result[Any], e: ApiError) -> None:
        if isinstance(result.after, list):
            for c in result.after:
                if isinstance(c, Completion):
                    fut = self._parked.pop(c.token, None)
                    if fut is not None and not fut.done():
                        fut.set_exception(ApiError(e.error_code, e.message))

    def _deliver(self, partition: int, result: Result[Any]) -> Result[Any]:
        after = result.after
        if isinstance(after, list):
            for c in after:
                if isinstance(c, Completion):
                    fut = self._parked.pop(c.token, None)
                    if fut is not None and not fut.done():
                        fut.set_result(c.response)
        elif isinstance(after, ShareEffects) and after.removed_members:
            if self.runtime.owned is None:
                self._share_members_removed(after.removed_members)
            else:  # cluster mode: once the removal is on every in-sync replica
                asyncio.ensure_future(self._share_members_removed_when_replicated(partition, after.removed_members))
        if result.records:  # a change written to the log: its groups are logged at once
            touched: dict[str | None, set[str]] = {}
            for r in result.records:
                ids = touched.setdefault(r.key.get("group_id", r.key.get("group")), set())
                if "member_id" in r.key:
                    ids.add(r.key["member_id"])
            self._log_group_changes(partition, touched.keys(), touched)
        self._schedule_group_scan(partition)
        deadlines = list(result.deadlines or ())
        nd = self.shard(partition).next_deadline_ms()
        if nd is not None:
            deadlines.append(nd)
        self._track(partition, deadlines)
        return result

    def _schedule_group_scan(self, partition: int) -> None:
        """Compare every group of the shard with what was logged, at most every GROUP_SCAN_INTERVAL_S.

        Changes that write no record (a classic group entering PreparingRebalance, a member
        joining it) are found by this scan; bounded so that a shard with many groups does
        not pay O(groups) per request.
        """
        if partition in self._scans or self._closed:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # called outside the event loop (tests of the service): scan now
            self._log_group_changes(partition)
            return

        def run() -> None:
            self._scans.pop(partition, None)
            if not self._closed:
                self._log_group_changes(partition)

        self._scans[partition] = loop.call_later(GROUP_SCAN_INTERVAL_S, run)

    def _log_group_changes(self, partition: int, group_ids: Iterable[str | None] | None = None,
                           member_ids: Mapping[str | None, set[str]] | None = None) -> None:
        """Log, one line each, the group state changes and members joining or leaving since last time.

        Compares the groups named (every group of the shard if None) with what was last
        logged of them: O(1) per unchanged group, O(members) for a group whose state,
        generation or member count moved, unless ``member_ids`` names the members whose
        records were just written (consumer and share groups keep one record per member):
        then only those are looked at, so that each of a thousand members joining a group
        does not compare the group's whole member list.
        """
        seen = self._seen.setdefault(partition, {})
        groups = self.shard(partition).groups
        for group_id in (list(groups) if group_ids is None else group_ids):
            if group_id is None:
                continue
            g = groups.get(group_id)
            if g is None:
                if seen.pop(group_id, None) is not None:
                    log.info("group %s: removed (Dead)", group_id)
                continue
            inner = g.kind.group(g.group_id) if isinstance(g, _KindView) else g
            state = g.state_name
            epoch = _epoch(inner)
            count = len(inner.members) if inner is not None else 0
            before = seen.get(group_id)
            if before is not None and before[0] == state and before[1] == epoch and len(before[2]) == count:
                continue  # a membership change moves the generation (classic) or the group epoch
            kind = getattr(g, "group_type", "classic")
            old_state, old_members = (before[0], before[2]) if before is not None else (None, {})
            named = None if member_ids is None or inner is None or not isinstance(g, _KindView) \
                else member_ids.get(group_id)
            current = inner.members if inner is not None else {}
            if named is not None and before is not None and len(old_members) + sum(
                    (m in current) - (m in old_members) for m in named) == count:
                members = old_members  # the members named are all that changed: updated in place
                joined = sorted(m for m in named if m in current and m not in old_members)
                left = sorted(m for m in named if m not in current and m in old_members)
                for member_id in joined:
                    m = current[member_id]
                    members[member_id] = (getattr(m, "client_id", ""), getattr(m, "client_host", ""))
                for member_id in left:
                    del members[member_id]
            else:
                members = _members(inner)
                joined = list(members.keys() - old_members.keys())
                left = list(old_members.keys() - members.keys())
            for member_id in joined:
                log.info("group %s (%s): member %s joined (client %s %s)", group_id, kind, member_id,
                         *members[member_id])
            for member_id in left:
                log.info("group %s (%s): member %s left", group_id, kind, member_id)
            if state != old_state:
                log.info("group %s (%s): %s -> %s%s, generation %d, %d member(s)", group_id, kind,
                         old_state or "new", state, _rebalance_note(old_state, state), epoch, len(members))
            seen[group_id] = (state, epoch, members)
        if group_ids is None:
            for group_id in [k for k in seen if k not in groups]:
                log.info("group %s: removed (Dead)", group_id)
                del seen[group_id]

    def new_token(self) -> Hashable:
        return next(self._tokens)

    async def apply_and_wait(self, partition: int, result: Result[Any], token: Hashable) -> Any:
        """Apply a JoinGroup/SyncGroup result; its response now, or once a completion names ``token``."""
        if result.response is not None:
            self.apply(partition, result)
            await self.wait_replicated(partition, wrote=bool(result.records))
            return result.response
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._parked[token] = fut
        self._parked_in[token] = partition
        try:
            self.apply(partition, result)
            response = await fut
        finally:
            self._parked.pop(token, None)
            self._parked_in.pop(token, None)
        await self.wait_replicated(partition, wrote=bool(result.records))
        return response

    # ------------------------------------------------------------ timers
    def _track(self, partition: int, deadlines: Iterable[int | None]) -> None:
        part = self._parts[partition]
        for d in deadlines:
            if d is not None:
                at = -(-int(d) // TIMER_TICK_MS) * TIMER_TICK_MS  # rounded up: never early
                if at not in part.queued:
                    part.queued.add(at)
                    heapq.heappush(part.deadlines, at)
        self._reschedule(partition)

    def _reschedule(self, partition: int) -> None:
        part = self._parts[partition]
        if self._closed or not part.deadlines:
            return
        earliest = part.deadlines[0]
        if part.timer is not None and part.timer_at is not None and part.timer_at <= earliest:
            return
        if part.timer is not None:
            part.timer.cancel()
        delay_s = max(0, earliest - self.now_ms()) / 1000 + 0.001
        part.timer = asyncio.get_running_loop().call_later(delay_s, self._fire, partition)
        part.timer_at = earliest

    def _fire(self, partition: int) -> None:
        part = self._parts[partition]
        part.timer = None
        part.timer_at = None
        if self._closed:
            return
        now = self.now_ms()
        while part.deadlines and part.deadlines[0] <= now:
            part.queued.discard(heapq.heappop(part.deadlines))
        try:
            self.expire(partition, now)
        except Exception:
            log.exception("%s-%d: expiring group timers failed; retrying in 1s", OFFSETS_TOPIC, partition)
            self._track(partition, [now + 1000])
        self._reschedule(partition)

    def expire(self, partition: int, now_ms: int) -> None:
        """Sessions, rebalance timeouts and offset retention of every kind, due at ``now_ms``."""
        part = self._parts[partition]
        self.apply(partition, self.shard(partition).expire(now_ms))
        self.apply(partition, part.consumer.expire(now_ms))
        self.apply(partition, part.share.expire(now_ms, self.topics_metadata()))

    # ------------------------------------------------------------ topics
    def on_topic_deleted(self, topic: str) -> None:
        now = self.now_ms()
        for p in self.owned_partitions():
            self.apply(p, self.shard(p).on_topics_deleted([topic], now))

    # ------------------------------------------------------------ share contract
    def share_assignment(self, group_id: str, member_id: str) -> dict[uuid.UUID, frozenset[int]] | None:
        g = self.share_groups(self.runtime.partition_for_group(group_id)).group(group_id)
        if g is None or member_id not in g.members:
            return None
        return {tid: frozenset(ps) for tid, ps in g.members[member_id].assigned.items()}

    def share_group_count(self) -> int:
        """How many share groups exist (for ``group.share.max.groups``)."""
        return sum(len(part.share.groups) for part in self._parts.values())

    def share_group_exists(self, group_id: str) -> bool:
        return self.share_groups(self.runtime.partition_for_group(group_id)).has_group(group_id)

    def _share_service(self) -> Any:
        return self.broker.extensions.get("share")

    def _share_members_removed(self, removed: Iterable[tuple[str, str]]) -> None:
        share = self._share_service()
        if share is None:
            return
        for group_id, member_id in removed:
            try:
                out = share.on_share_member_removed(group_id, member_id)
                if inspect.isawaitable(out):
                    asyncio.ensure_future(out)
            except Exception:
                log.exception("share service failed to release member %s of %s", member_id, group_id)

    async def _share_members_removed_when_replicated(self, partition: int,
                                                     removed: Iterable[tuple[str, str]]) -> None:
        try:
            await self.runtime.wait_durable(partition)
        except ApiError as e:  # the records are on this broker's log; release what the members held anyway
            log.info("%s-%d: removal of share members not confirmed by the replicas (%s)", OFFSETS_TOPIC,
                     partition, e.message)
        if not self._closed:
            self._share_members_removed(removed)

    async def initialize_share_partitions(self, partition: int, group_id: str,
                                          fresh: Mapping[uuid.UUID, Iterable[int]]) -> None:
        """Initialize ``fresh`` plus anything the group still has pending; wait for every
        initialization of the group in flight (so a heartbeat is answered only after the
        partitions it may use have state). Never raises for a failed initialization."""
        share_groups = self.share_groups(partition)
        wanted = partitions_of(fresh)
        wanted |= partitions_of(share_groups.partitions_to_initialize(group_id).get(group_id, {}))
        inflight = self._initializing.setdefault(group_id, {})
        new = {tp for tp in wanted if tp not in inflight}
        if new:
            task = asyncio.ensure_future(self._initialize(partition, group_id, new))
            for tp in new:
                inflight[tp] = task
        waiting = set(inflight.values())
        if waiting:
            await asyncio.gather(*(asyncio.shield(f) for f in waiting), return_exceptions=True)

    async def _initialize(self, partition: int, group_id: str, tps: set[tuple[uuid.UUID, int]]) -> None:
        parts = from_partitions(tps)
        request = {tid: sorted(ps) for tid, ps in parts.items()}
        # KIP-932 "Managing the SPSO and SPEO": a partition added to a topic the group
        # already has state for starts at the earliest offset (0 for a new partition),
        # whatever share.auto.offset.reset says, so that nothing produced to it before
        # the group noticed it is skipped. Only the partitions of a topic the group meets
        # for the first time follow share.auto.offset.reset.
        known_topics = frozenset(self.share_groups(partition).initialized_partitions(group_id))
        group = self.share_groups(partition).group(group_id)
        state_epoch = group.group_epoch if group is not None else 0
        ok = True
        try:
            share = self._share_service()
            if share is not None:
                await share.initialize_share_state(group_id, request, earliest_topics=known_topics,
                                                   state_epoch=state_epoch)
        except Exception as e:
            ok = False
            log.warning("share state of group %s could not be initialized (%s); retrying on its next heartbeat",
                        group_id, e)
        finally:
            inflight = self._initializing.get(group_id, {})
            for tp in tps:
                inflight.pop(tp, None)
            if not inflight:
                self._initializing.pop(group_id, None)
        if self._closed:
            return
        share_groups = self.share_groups(partition)
        result = share_groups.mark_initialized(group_id, parts) if ok else \
            share_groups.mark_initialize_failed(group_id, parts)
        self.apply(partition, result)

    async def delete_share_group(self, partition: int, group_id: str) -> ErrorCode:
        """DeleteGroups of one share group, in two stages (see the module docstring)."""
        share_groups = self.share_groups(partition)
        begun = self.apply(partition, share_groups.begin_delete_group(group_id))
        code, to_delete = begun.answer()
        await self.wait_replicated(partition, wrote=bool(begun.records))
        if code is not ErrorCode.none:
            return code
        share = self._share_service()
        # Every share-partition of the group with state goes, also one the group's metadata
        # does not list (state a share-partition leader of an earlier version created).
        wanted = {tid: set(ps) for tid, ps in to_delete.items()}
        if share is not None:
            for key in share.state_keys(group_id):
                wanted.setdefault(uuid.UUID(str(key.topic_id)), set()).add(key.partition)
        if not wanted:
            return code
        if share is not None:
            try:
                await share.delete_share_state(group_id, {tid: sorted(ps) for tid, ps in wanted.items()})
            except Exception as e:
                log.warning("share state of group %s could not be deleted: %s", group_id, e)
                return ErrorCode.coordinator_not_available
        done = self.apply(partition, share_groups.complete_delete_group(group_id))
        await self.wait_replicated(partition, wrote=bool(done.records))
        return done.answer()


def is_empty_classic(group: Any) -> bool:
    return isinstance(group, ClassicGroup) and group.is_empty()


# ------------------------------------------------------------------ hooks
@on_start
async def _start(broker: Any) -> None:
    svc = GroupCoordinatorService(broker)
    svc.load()
    broker.extensions["groups"] = svc


@on_stop
async def _stop(broker: Any) -> None:
    svc = broker.extensions.get("groups")
    if svc is not None:
        svc.close()


@on_leadership_change
def _leadership(broker: Any, topic: str, index: int, leader: bool) -> None:
    svc = broker.extensions.get("groups")
    if svc is not None:
        svc.leadership_changed(topic, index, leader)


@on_topic_deleted
def _topic_deleted(broker: Any, meta: Any) -> None:
    svc = broker.extensions.get("groups")
    if svc is not None and meta is not None:
        svc.on_topic_deleted(meta.name)
