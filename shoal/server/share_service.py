"""The share-group shell: share coordinator, persister, share-partition manager, sessions.

Theory of operation
-------------------
``ShareService`` (``broker.extensions["share"]``) wires the pure share cores to I/O:

* **Share coordinator.** A :class:`~shoal.server.runtime.CoordinatorRuntime` of
  :class:`~shoal.share.coordinator.ShareCoordinatorShard` over ``__share_group_state``.
  All updates of one share-partition share a record key, so the topic is created with
  ``cleanup.policy=delete`` and ``retention.ms=-1``, never compacted; instead records
  below each shard's ``last_redundant_offset()`` are deleted (``delete_records``) by a
  timer. Keys are routed with :func:`shoal.share.coordinator.partition_for` (Kafka's
  ``hash("group:topicId:partition")``).
* **Persister.** Kafka's five operations (initialize, read, write, delete,
  read_summary). ``initialize``, ``read``, ``delete`` and ``read_summary`` run the
  shard operation and ``runtime.apply`` (append, fsync, replay) on the event loop:
  when they return, the state is durable or the call failed. A write is split in two:
  ``append_write`` appends and replays it at once, and ``durable``
  makes every write appended so far durable. A failure comes back as the outcome's
  error code (COORDINATOR_NOT_AVAILABLE when the append or the fsync failed; a failed
  fsync also halts the broker).
* **Share-partition manager.** One :class:`~shoal.share.partition.SharePartition` per
  ``(group_id, topic_id, partition)``, created on first use from the persisted state,
  which exists only where the group coordinator initialized it (a start offset of -1
  is resolved from ``share.auto.offset.reset`` then); a partition without state is not
  part of the group and answers UNKNOWN_TOPIC_OR_PARTITION, creating nothing. After any change
  the share-partition is queued (:meth:`ShareService.schedule_persist`) for the next
  *commit round* of its ``__share_group_state`` partition: one callback, on the next
  loop iteration, that takes a write of every queued share-partition, appends them,
  fsyncs once in the flusher's worker thread (the event loop serves other requests
  meanwhile; rounds that start during an fsync share the next one) and commits (or
  rolls back) each. Every acknowledgement received before a round shares its fsync, and
  an acknowledgement is answered once it is durable; a rolled-back write is retried by
  a timer.
  Acknowledgements are answered after :meth:`ShareService.wait_for`. Lock
  expiry: one ``loop.call_at`` per share-partition at ``next_deadline_ms()``. Whenever
  records become acquirable again (released, expired, rolled back, or the in-flight
  limit freed), :meth:`ShareService.wake` completes the ShareFetches parked on that
  share-partition.
* **ShareFetch and ShareAcknowledge.** One call per request, as Kafka's
  SharePartitionManager.fetchMessages / acknowledge: :meth:`ShareService.fetch` and
  :meth:`ShareService.acknowledge` take a plain request (``shoal/share/requests.py``; the
  handlers translate kio's) and return a ``ShareResult``. They check the request and the
  share session, apply the acknowledgements, release what the member no longer fetches,
  load (cluster mode), acquire, and answer once the acknowledgements are durable. A
  ShareFetch short of MinBytes parks in ``self.purgatory`` (``share_purgatory.py``, a
  DelayedShareFetch watched under its share-partitions and data partitions; it listens
  to ``broker.append_waiters`` for appends), until a wake, an append or MaxWaitMs.
* **Sessions.** A :class:`~shoal.share.session.ShareSessionCache`. Closing a session
  or a disconnect releases the member's acquired records; a member that leaves the
  group keeps them until its session closes (see :meth:`ShareService.on_share_member_removed`).
  Replacing a session (epoch 0) keeps them in the partitions the new session names.

Cluster mode (``metadata.store`` set): ``__share_group_state`` is replicated and the
runtime follows its partitions' leadership (:meth:`ShareService.state_leadership_changed`).
The persister's ``*_state`` methods then go to the key's share coordinator: in process
when this broker leads the key's state partition (answered once the in-sync replicas
have the records), else over the network (``share_persister.py``). Share-partitions are
loaded asynchronously (:meth:`ShareService.load_partitions`, with the data partition's
leader epoch) before the handlers use them; a commit round for a state partition this
broker leads awaits the high watermark after its fsync (:meth:`_durable_round`), one
for another broker's sends the writes there (:meth:`_remote_round`). A write fenced by
the share coordinator (FENCED_LEADER_EPOCH / FENCED_STATE_EPOCH), or refused because its
state no longer exists (INVALID_REQUEST, UNKNOWN_TOPIC_OR_PARTITION), drops the share-partition.

Event loop only. The group service calls :meth:`on_share_member_removed`,
:meth:`initialize_share_state` and :meth:`delete_share_state`.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Hashable, Iterable, Mapping
from time import perf_counter
from typing import Any, cast

from ..errors import ApiError, ErrorCode
from ..protocol.batch import iter_batches
from ..share.coordinator import (
    SNAPSHOT_UPDATE_RECORDS_PER_SNAPSHOT,
    UNINITIALIZED_START_OFFSET,
    PartitionOutcome,
    ShareCoordinatorShard,
    SharePartitionKey,
    StateBatch,
    partition_for,
)
from ..share.partition import AcquiredRecords, PendingUpdate, SharePartition, StateWrite, UpdateStatus
from ..share.requests import (
    DEFAULT_MAX_RECORDS,
    PartitionResult,
    ShareAcknowledgeParams,
    ShareFetchParams,
    SharePartitionRequest,
    ShareResult,
    invalid_ids,
    invalid_share_fetch,
)
from ..share.session import INITIAL_EPOCH, ShareSessionCache
from ..share.state import AcknowledgeType, AcquireMode
from ..share.state_rpc import RETRIABLE, Rpc, StateOp
from .broker import on_disconnect, on_leadership_change, on_start, on_stop, on_topic_deleted
from .dlq import DeadLetterWriter
from .internal_topics import SHARE_STATE_TOPIC
from .runtime import CoordinatorRuntime
from .share_persister import RemoteStates
from .share_purgatory import SharePurgatory

log = logging.getLogger("shoal.share")

__all__ = ["SHARE_STATE_TOPIC", "Persister", "ShareService", "share_service"]

PRUNE_INTERVAL_S = 30.0
RETRY_WRITE_S = 0.5

PartitionId = tuple[str, uuid.UUID, int]
"""(group_id, topic_id, partition)."""
Key = tuple[uuid.UUID, int]
"""(topic_id, partition) of a request."""


def _partition_id(sp: SharePartition) -> PartitionId:
    """The service's key of ``sp``: the service creates its share-partitions with UUID topic ids."""
    return sp.group_id, cast(uuid.UUID, sp.topic_id), sp.partition


PARTITION_MAX_READ_BYTES = 1 << 20
"""A ShareFetch reads at most this much of one partition's log at a time."""

_WAIT_OUT = frozenset({ErrorCode.coordinator_not_available, ErrorCode.kafka_storage_error})
"""Partition errors of state that cannot be written: a ShareFetch still waits out its max wait."""

FENCED = frozenset({ErrorCode.fenced_leader_epoch, ErrorCode.fenced_state_epoch})
"""A load answered with one of these: a newer leader (or state) exists."""

STALE = FENCED | {ErrorCode.invalid_request, ErrorCode.unknown_topic_or_partition}
"""A write answered with one of these comes from a stale share-partition leader: fenced,
or its state was deleted (Kafka refuses a write of uninitialized state with INVALID_REQUEST)."""


class Persister:
    """Kafka's share-group state persister over the in-process share coordinator.

    Every method returns a :class:`~shoal.share.coordinator.PartitionOutcome`; it never
    raises for a failed write (the outcome carries COORDINATOR_NOT_AVAILABLE).
    """

    def __init__(self, runtime: CoordinatorRuntime[ShareCoordinatorShard]) -> None:
        self.runtime = runtime
        self.remote: RemoteStates | None = None
        """Cluster mode: the operations on keys other brokers coordinate go over the network."""
        if runtime.follow_leadership:
            self.remote = RemoteStates(runtime.broker, runtime.sync_partition_count)

    def partition_of(self, key: SharePartitionKey) -> int:
        return partition_for(key, self.runtime.num_partitions)

    def _now_ms(self) -> int:
        """The clock for the snapshots' create and write timestamps."""
        return int(self.runtime.broker.clock.now_ms())

    def _run(self, key: SharePartitionKey, op: Any) -> PartitionOutcome:
        try:
            result = self.runtime.run(self.partition_of(key), op)
        except ApiError as e:
            return PartitionOutcome(e.error_code, str(e), None)
        return result.answer()

    def initialize(self, key: SharePartitionKey, state_epoch: int, start_offset: int) -> PartitionOutcome:
        return self._run(key, lambda s: s.initialize(key, state_epoch, start_offset, now_ms=self._now_ms()))

    def read(self, key: SharePartitionKey, leader_epoch: int = -1) -> PartitionOutcome:
        return self._run(key, lambda s: s.read(key, leader_epoch, now_ms=self._now_ms()))

    def append_write(self, key: SharePartitionKey, state_epoch: int, leader_epoch: int, start_offset: int,
                     batches: Iterable[StateBatch], delivery_complete_count: int = -1) -> tuple[int, PartitionOutcome]:
        """Append and replay a share-partition's state write now, without its fsync.

        Returns (``__share_group_state`` partition, outcome). A write whose outcome is ok
        is durable only once :meth:`durable` of that partition returns ok.
        """
        partition = self.partition_of(key)
        batches = tuple(batches)
        try:
            result = self.runtime.run_deferred(
                partition,
                lambda s: s.write(key, state_epoch, leader_epoch, start_offset, batches, delivery_complete_count,
                                  now_ms=self._now_ms()))
        except ApiError as e:
            return partition, PartitionOutcome(e.error_code, str(e), None)
        return partition, result.answer()

    async def durable(self, partition: int, *, inline: bool = True) -> PartitionOutcome | None:
        """Wait until every write appended to ``partition`` is fsynced (in cluster mode: and
        replicated to the in-sync replicas); None, or the failure. ``inline``: as
        ``CoordinatorRuntime.wait_durable``."""
        try:
            await self.runtime.wait_durable(partition, wrote=True, inline=inline)
        except ApiError as e:
            return PartitionOutcome(e.error_code, str(e), None)
        return None

    async def write(self, key: SharePartitionKey, state_epoch: int, leader_epoch: int, start_offset: int,
                    batches: Iterable[StateBatch], delivery_complete_count: int = -1) -> PartitionOutcome:
        """Write a share-partition's state; returns once it is durable (group commit).

        The record is appended and replayed at once, so writes of many share-partitions
        to one ``__share_group_state`` partition share one fsync.
        """
        partition, outcome = self.append_write(key, state_epoch, leader_epoch, start_offset, batches,
                                               delivery_complete_count)
        if outcome.ok:
            outcome = await self.durable(partition) or outcome
        return outcome

    def delete(self, key: SharePartitionKey) -> PartitionOutcome:
        return self._run(key, lambda s: s.delete(key))

    def read_summary(self, key: SharePartitionKey, leader_epoch: int = -1) -> PartitionOutcome:
        return self._run(key, lambda s: s.read_summary(key, leader_epoch))

    # -- wherever the key's coordinator is ------------------------------------------------
    # One broker: the in-process operations above. Cluster mode: the key's share
    # coordinator, this broker (in process, answered once every in-sync replica has the
    # records) or another one (share-state RPCs, retried on coordinator errors).

    def local(self, key: SharePartitionKey) -> bool:
        """Whether this broker coordinates ``key``'s state now (always, on one broker)."""
        return self.runtime.owns(self.partition_of(key))

    async def call(self, op: StateOp) -> PartitionOutcome:
        if self.remote is None:
            return self._local_now(op)
        return await self.remote.call(op, self._local_replicated)

    def _local_now(self, op: StateOp) -> PartitionOutcome:
        key = op.key
        if op.rpc is Rpc.INITIALIZE:
            return self.initialize(key, op.state_epoch, op.start_offset)
        if op.rpc is Rpc.READ:
            return self.read(key, op.leader_epoch)
        if op.rpc is Rpc.SUMMARY:
            return self.read_summary(key, op.leader_epoch)
        if op.rpc is Rpc.DELETE:
            return self.delete(key)
        return self._run(key, lambda s: s.write(key, op.state_epoch, op.leader_epoch, op.start_offset, op.batches,
                                                 op.delivery_complete_count, now_ms=self._now_ms()))

    async def _local_replicated(self, op: StateOp) -> PartitionOutcome:
        partition = self.partition_of(op.key)
        try:
            self.runtime.check_owner(partition)
        except ApiError as e:
            return PartitionOutcome(e.error_code, str(e), None)
        plog = self.runtime.broker.store.partition(self.runtime.topic, partition)
        before = plog.log_end_offset
        outcome = self._local_now(op)
        if outcome.ok:
            try:
                await self.runtime.wait_durable(partition, wrote=plog.log_end_offset > before)
            except ApiError as e:
                return PartitionOutcome(e.error_code, str(e), None)
        return outcome

    async def initialize_state(self, key: SharePartitionKey, state_epoch: int, start_offset: int) -> PartitionOutcome:
        return await self.call(StateOp(Rpc.INITIALIZE, key, state_epoch=state_epoch, start_offset=start_offset))

    async def read_state(self, key: SharePartitionKey, leader_epoch: int = -1) -> PartitionOutcome:
        return await self.call(StateOp(Rpc.READ, key, leader_epoch=leader_epoch))

    async def read_state_summary(self, key: SharePartitionKey, leader_epoch: int = -1) -> PartitionOutcome:
        return await self.call(StateOp(Rpc.SUMMARY, key, leader_epoch=leader_epoch))

    async def delete_state(self, key: SharePartitionKey) -> PartitionOutcome:
        return await self.call(StateOp(Rpc.DELETE, key))

    async def write_state(self, key: SharePartitionKey, state_epoch: int, leader_epoch: int, start_offset: int,
                          batches: Iterable[StateBatch], delivery_complete_count: int = -1) -> PartitionOutcome:
        return await self.call(StateOp(Rpc.WRITE, key, state_epoch=state_epoch, leader_epoch=leader_epoch,
                                       start_offset=start_offset, batches=tuple(batches),
                                       delivery_complete_count=delivery_complete_count))


class ShareService:
    def __init__(self, broker: Any) -> None:
        self.broker = broker
        cfg = broker.config
        per_snapshot = int(cfg[SNAPSHOT_UPDATE_RECORDS_PER_SNAPSHOT])
        self.runtime: CoordinatorRuntime[ShareCoordinatorShard] = CoordinatorRuntime(
            broker, SHARE_STATE_TOPIC, "share.coordinator.state.topic.num.partitions",
            lambda _i: ShareCoordinatorShard(snapshot_update_records_per_snapshot=per_snapshot,
                                             partition_count=self._partition_count),
            topic_configs={"cleanup.policy": "delete", "retention.ms": "-1",
                           "segment.bytes": str(cfg["share.coordinator.state.topic.segment.bytes"])},
            replay_offsets=True, follow_leadership=True,
        )
        self.persister = Persister(self.runtime)
        self.dead_letters = DeadLetterWriter(broker)
        self.sessions = ShareSessionCache(int(cfg["group.share.max.share.sessions"]))
        self.purgatory = SharePurgatory()
        """Parked ShareFetches; also told of every append (a listener of ``broker.append_waiters``)."""
        broker.append_waiters.listeners.append(self.purgatory)
        self.partitions: dict[PartitionId, SharePartition] = {}
        self._timers: dict[PartitionId, tuple[int, asyncio.TimerHandle]] = {}
        self._retry: dict[PartitionId, asyncio.TimerHandle] = {}
        self._prune_timer: asyncio.TimerHandle | None = None
        self._loading: dict[PartitionId, asyncio.Future[SharePartition | None]] = {}
        """Cluster mode: share-partitions whose state is being read (``_load``)."""
        self._queued: dict[int, dict[SharePartition, None]] = {}
        """Per ``__share_group_state`` partition: share-partitions waiting for its next commit round."""
        self._state_partitions: dict[SharePartition, int] = {}
        self._settled: dict[SharePartition, list[asyncio.Future[bool]]] = {}
        """Completed (True if it committed) when the share-partition's queued write settles."""
        self._load_errors: dict[PartitionId, ApiError] = {}
        """Cluster mode: why the last load of a share-partition failed (reported once)."""
        self._rounds: set[asyncio.Future[None]] = set()
        """Cluster mode: commit rounds still waiting for their state partition's replicas or coordinator."""
        self._closed = False

    def _partition_count(self, topic_id: uuid.UUID) -> int | None:
        """The share coordinator's view of the metadata: a topic's partition count, or None."""
        meta = self.broker.store.topic_by_id(topic_id)
        return None if meta is None else int(meta.num_partitions)

    # -- lifecycle --------------------------------------------------------------------
    def start(self) -> None:
        self.runtime.load()
        self.prune()
        self._schedule_prune()

    async def drain(self) -> None:
        """Wait for the queued commit rounds (at shutdown, before the log closes)."""
        while self._queued:
            await asyncio.sleep(0)
        if self._rounds:
            await asyncio.wait(set(self._rounds), timeout=self.broker.config["shutdown.timeout.ms"] / 1000)

    async def close(self) -> None:
        self._closed = True
        if self.persister.remote is not None:
            await self.persister.remote.close()

    def stop(self) -> None:
        listeners = self.broker.append_waiters.listeners
        if self.purgatory in listeners:
            listeners.remove(self.purgatory)
        self.purgatory.wake_all()
        for _d, h in self._timers.values():
            h.cancel()
        for h in self._retry.values():
            h.cancel()
        self._timers.clear()
        self._retry.clear()
        if self._prune_timer is not None:
            self._prune_timer.cancel()

    def _schedule_prune(self) -> None:
        def run() -> None:
            if self.broker.shutting_down:
                return
            try:
                self.prune()
            except Exception:
                log.exception("pruning %s failed", SHARE_STATE_TOPIC)
            self._schedule_prune()

        self._prune_timer = asyncio.get_running_loop().call_later(PRUNE_INTERVAL_S, run)

    def prune(self) -> None:
        """Delete ``__share_group_state`` records every shard no longer needs."""
        store = self.broker.store
        for i, shard in enumerate(self.runtime.shards):
            if self.runtime.owned is not None and i not in self.runtime.owned:
                continue  # cluster mode: the leader of the partition prunes it; followers follow
            cut = shard.last_redundant_offset()
            if cut is None:
                continue
            plog = store.partition(SHARE_STATE_TOPIC, i)
            cut = min(cut, plog.high_watermark)
            if cut > plog.log_start_offset:
                plog.delete_records(cut)

    # -- configuration ------------------------------------------------------------------
    def _group_value(self, group_id: str, name: str) -> Any:
        return self.broker.dynamic_configs.group_value(group_id, name, self.broker.config)

    def _configure(self, sp: SharePartition) -> None:
        sp.record_lock_duration_ms = int(self._group_value(sp.group_id, "share.record.lock.duration.ms"))
        sp.delivery_count_limit = int(self._group_value(sp.group_id, "share.delivery.count.limit"))
        sp.max_in_flight_records = int(self._group_value(sp.group_id, "share.partition.max.record.locks"))

    def renew_acknowledge_enabled(self, group_id: str) -> bool:
        """share.renew.acknowledge.enable of the group: whether RENEW acknowledgements are taken."""
        return bool(self._group_value(group_id, "share.renew.acknowledge.enable"))

    def read_committed(self, group_id: str) -> bool:
        """Whether the group's ``share.isolation.level`` is read_committed."""
        return str(self._group_value(group_id, "share.isolation.level")) == "read_committed"

    def record_lock_duration_ms(self, group_id: str) -> int:
        return int(self._group_value(group_id, "share.record.lock.duration.ms"))

    def initial_start_offset(self, group_id: str, topic_name: str, partition: int) -> int:
        """The SPSO a new share-partition starts at, from ``share.auto.offset.reset``."""
        from .handlers.configs import parse_by_duration

        plog = self.broker.store.partition(topic_name, partition)
        reset = str(self._group_value(group_id, "share.auto.offset.reset"))
        if reset == "earliest":
            return plog.log_start_offset
        if reset.startswith("by_duration:"):
            since = self.broker.clock.now_ms() - parse_by_duration(reset.split(":", 1)[1])
            found = plog.offset_for_timestamp(since)
            return found[0] if found is not None else plog.high_watermark
        return plog.high_watermark

    # -- share-partitions -----------------------------------------------------------------
    def _topic_name(self, topic_id: uuid.UUID) -> str:
        meta = self.broker.store.topic_by_id(topic_id)
        if meta is None:
            raise ApiError(ErrorCode.unknown_topic_id, f"unknown topic id {topic_id}")
        return meta.name

    def _start_offset(self, key: SharePartitionKey, topic_name: str, earliest: bool = False) -> int:
        """The SPSO to initialize ``key`` with. Cluster mode: -1 (the share-partition leader
        applies ``share.auto.offset.reset`` when it first loads the state, from its own log),
        except for ``earliest`` partitions, which start at this replica's log start offset."""
        if self.persister.remote is not None:
            if not earliest:
                return UNINITIALIZED_START_OFFSET
            try:
                return int(self.broker.store.partition(topic_name, key.partition).log_start_offset)
            except ApiError:
                return UNINITIALIZED_START_OFFSET  # not a replica here
        if earliest:
            return int(self.broker.store.partition(topic_name, key.partition).log_start_offset)
        return self.initial_start_offset(key.group_id, topic_name, key.partition)

    def _initialize(self, key: SharePartitionKey, topic_name: str, state_epoch: int,
                    earliest: bool = False) -> PartitionOutcome:
        return self.persister.initialize(key, state_epoch, self._start_offset(key, topic_name, earliest))

    def get_partition(self, group_id: str, topic_id: uuid.UUID, partition: int) -> SharePartition:
        """The share-partition, loaded (or initialized) through the persister on first use.

        One broker: loaded here, synchronously. Cluster mode: only this partition's leader
        has it, and it must have been loaded by :meth:`load_partitions` first (the
        handlers await that); until then this raises the load's error, or
        COORDINATOR_NOT_AVAILABLE.

        Raises ApiError: UNKNOWN_TOPIC_ID / UNKNOWN_TOPIC_OR_PARTITION for a topic or
        partition that does not exist, NOT_LEADER_OR_FOLLOWER (cluster mode), or the
        persister's error.
        """
        pid = (group_id, topic_id, partition)
        replicas = getattr(self.broker, "replicas", None)
        if replicas is not None:
            # cluster mode: only the partition's leader has a share-partition for it
            meta = self.broker.store.topic_by_id(topic_id)
            if meta is not None:
                replicas.leader_replica(meta.name, partition)
        sp = self.partitions.get(pid)
        if sp is not None:
            return sp
        name, _meta = self._check_partition(topic_id, partition)
        if self.persister.remote is not None:
            error = self._load_errors.pop(pid, None)
            raise error or ApiError(ErrorCode.coordinator_not_available, "share-partition state is loading")
        key = SharePartitionKey.of(group_id, topic_id, partition)
        outcome = self.persister.read(key)
        # No state (UNKNOWN_TOPIC_OR_PARTITION): the group coordinator has not initialized
        # this share-partition, so it is not part of the group; nothing is created here.
        if outcome.ok and outcome.state is not None and outcome.state.start_offset == UNINITIALIZED_START_OFFSET:
            outcome = self._initialize(key, name, outcome.state.state_epoch)
        if not outcome.ok or outcome.state is None:
            raise ApiError(outcome.error_code, outcome.error_message or "share-partition state unavailable")
        st = outcome.state
        sp = self._new_partition(group_id, topic_id, partition, st, max(0, st.leader_epoch))
        self.partitions[pid] = sp
        return sp

    def _check_partition(self, topic_id: uuid.UUID, partition: int) -> tuple[str, Any]:
        name = self._topic_name(topic_id)
        meta = self.broker.store.get_topic(name)
        if not 0 <= partition < meta.num_partitions:
            raise ApiError(ErrorCode.unknown_topic_or_partition, f"{name} has no partition {partition}")
        return name, meta

    def _new_partition(self, group_id: str, topic_id: uuid.UUID, partition: int, st: Any,
                       leader_epoch: int) -> SharePartition:
        config = {
            "record_lock_duration_ms": int(self._group_value(group_id, "share.record.lock.duration.ms")),
            "delivery_count_limit": int(self._group_value(group_id, "share.delivery.count.limit")),
            "max_in_flight_records": int(self._group_value(group_id, "share.partition.max.record.locks")),
        }
        return SharePartition.from_persisted(
            group_id, topic_id, partition, start_offset=st.start_offset, state_epoch=st.state_epoch,
            state_batches=[(b.first_offset, b.last_offset, b.delivery_state, b.delivery_count)
                           for b in st.state_batches],
            leader_epoch=leader_epoch, **config,
        )

    async def load_partitions(self, group_id: str, keys: Iterable[tuple[uuid.UUID, int]],
                              timeout_s: float | None = None) -> None:
        """Cluster mode: load every share-partition of ``keys`` this broker leads and has not
        loaded, concurrently; a failure is kept for the next :meth:`get_partition`. Returns
        after ``timeout_s`` at the latest (the loads go on). One broker: nothing to do
        (``get_partition`` loads)."""
        if self.persister.remote is None:
            return
        replicas = self.broker.replicas
        waits = []
        for topic_id, partition in dict.fromkeys(keys):
            pid = (group_id, topic_id, partition)
            if pid in self.partitions:
                continue
            meta = self.broker.store.topic_by_id(topic_id)
            if meta is None or replicas is None:
                continue
            try:
                replicas.leader_replica(meta.name, partition)
            except ApiError:
                continue  # get_partition answers NOT_LEADER_OR_FOLLOWER
            fut = self._loading.get(pid)
            if fut is None:
                fut = self._loading[pid] = asyncio.ensure_future(self._load(pid))
            waits.append(fut)
        if waits:
            await asyncio.wait(waits, timeout=timeout_s)

    def is_loading(self, group_id: str, topic_id: uuid.UUID, partition: int) -> bool:
        """Cluster mode: whether the share-partition's state is being read right now."""
        return (group_id, topic_id, partition) in self._loading

    async def drop_if_reset(self, group_id: str, keys: Iterable[tuple[uuid.UUID, int]],
                            timeout_s: float | None = None) -> None:
        """Cluster mode: drop the loaded share-partitions of ``keys`` whose state was reset
        or deleted since they loaded it (AlterShareGroupOffsets or DeleteShareGroupOffsets
        through another broker's group coordinator); the next use reloads the new state.

        Called when a share session starts (ShareFetch epoch 0): those admin calls need
        an empty group, so a consumer coming after them opens a new session. One broker:
        nothing to do (the group coordinator drops them itself). A share-partition whose
        state cannot be read within ``timeout_s`` is kept.
        """
        if self.persister.remote is None:
            return
        loaded = [(pid, sp) for topic_id, partition in dict.fromkeys(keys)
                  if (sp := self.partitions.get(pid := (group_id, topic_id, partition))) is not None]
        if not loaded:
            return
        tasks = [asyncio.ensure_future(self.persister.read_state_summary(
            SharePartitionKey.of(group_id, pid[1], pid[2]))) for pid, _sp in loaded]
        await asyncio.wait(tasks, timeout=timeout_s)
        for (pid, sp), task in zip(loaded, tasks):
            if not task.done():
                continue  # the check goes on in the background; its answer is dropped
            o = task.result()
            reset = (o.ok and o.state is not None and o.state.state_epoch > sp.state_epoch) or (
                o.error_code == ErrorCode.unknown_topic_or_partition)
            if reset and self.partitions.get(pid) is sp:
                log.info("share-partition %s-%s-%d: its state was reset elsewhere; reloading", *pid)
                self._drop(pid)
                self.wake(sp)

    async def _load(self, pid: PartitionId) -> SharePartition | None:
        """Read (or initialize) a share-partition's state through the persister and keep it."""
        group_id, topic_id, partition = pid
        try:
            name, _meta = self._check_partition(topic_id, partition)
            replica = self.broker.replicas.leader_replica(name, partition)
            leader_epoch = replica.leader_epoch
            key = SharePartitionKey.of(group_id, topic_id, partition)
            # The read records this leader's epoch with the state: from then on the share
            # coordinator fences writes of any earlier leader of the partition.
            outcome = await self.persister.read_state(key, leader_epoch)
            # No state: not initialized by the group coordinator, so not part of the group.
            if outcome.ok and outcome.state is not None and outcome.state.start_offset == UNINITIALIZED_START_OFFSET:
                start = self.initial_start_offset(group_id, name, partition)
                outcome = await self.persister.initialize_state(key, outcome.state.state_epoch, start)
                if outcome.ok:
                    outcome = await self.persister.read_state(key, leader_epoch)
            if not outcome.ok or outcome.state is None:
                code = ErrorCode(outcome.error_code)
                if code in FENCED:
                    code = ErrorCode.not_leader_or_follower  # a newer leader read the state
                elif code in RETRIABLE:
                    code = ErrorCode.coordinator_not_available
                raise ApiError(code, outcome.error_message or "share-partition state unavailable")
            current = self.broker.replicas.leader_replica(name, partition)
            if current is not replica or current.leader_epoch != leader_epoch:
                raise ApiError(ErrorCode.not_leader_or_follower, "leadership changed while loading")
            sp = self.partitions.get(pid)
            if sp is None:
                sp = self.partitions[pid] = self._new_partition(group_id, topic_id, partition, outcome.state,
                                                                leader_epoch)
                remote = self.persister.remote
                coordinator = remote.coordinator(StateOp(Rpc.READ, key)) if remote is not None else None
                log.info("share-partition %s-%s-%d loaded at SPSO %d (state epoch %d, leader epoch %d; state %s)",
                         group_id, name, partition, sp.start_offset, outcome.state.state_epoch, leader_epoch,
                         "in process" if coordinator == self.broker.node_id else f"on broker {coordinator}")
                self.wake(sp)  # ShareFetches parked while it loaded
            self._load_errors.pop(pid, None)
            return sp
        except ApiError as e:
            self._load_errors[pid] = e
            return None
        except Exception as e:
            log.exception("share-partition %s-%s-%d: loading failed", group_id, topic_id, partition)
            self._load_errors[pid] = ApiError(ErrorCode.unknown_server_error, str(e))
            return None
        finally:
            self._loading.pop(pid, None)

    def follow_log_start(self, sp: SharePartition, log_start_offset: int) -> None:
        """Move the SPSO up to the log start offset if retention or DeleteRecords passed it.

        The records below can never be delivered; the in-flight state below is dropped
        and the new SPSO is persisted at once. Parked fetches are woken if that freed
        in-flight room.
        """
        if not sp.advance_start_to(log_start_offset):
            return
        log.info("share-partition %s-%s-%d: log start %d is past the SPSO; SPSO moved up",
                 sp.group_id, sp.topic_id, sp.partition, log_start_offset)
        self.schedule_persist(sp)
        self.wake(sp)

    def refresh_config(self, sp: SharePartition) -> None:
        self._configure(sp)

    def forget_partition(self, group_id: str, topic_id: uuid.UUID, partition: int) -> None:
        """Drop the in-memory share-partition, if loaded, without writing anything.

        For when its persisted state was changed by someone else (the share-state RPCs
        over the wire): the next use reloads it from the persisted state.
        """
        pid = (group_id, topic_id, partition)
        if pid in self.partitions:
            log.info("share-partition %s-%s-%d: persisted state changed over the wire; reloading",
                     group_id, topic_id, partition)
        self._drop(pid)

    def _drop(self, pid: PartitionId) -> None:
        sp = self.partitions.pop(pid, None)
        if sp is not None and not self._is_queued(sp):
            self._state_partitions.pop(sp, None)
        t = self._timers.pop(pid, None)
        if t is not None:
            t[1].cancel()
        r = self._retry.pop(pid, None)
        if r is not None:
            r.cancel()

    # -- durability and timers --------------------------------------------------------------
    def schedule_persist(self, sp: SharePartition) -> None:
        """Have ``sp``'s changes written in the next commit round of its state partition.

        A commit round (:meth:`_commit_round`) runs on the next loop iteration. It takes
        one write of every share-partition queued for that ``__share_group_state``
        partition, appends them, fsyncs once, and commits them (or rolls them back),
        all in one step: every acknowledgement received before the round shares its
        fsync, and no write is outstanding between rounds.
        """
        if not sp.needs_write:
            return
        partition = self._state_partition(sp)
        queued = self._queued.get(partition)
        if queued is None:
            queued = self._queued[partition] = {}
            asyncio.get_running_loop().call_soon(self._commit_round, partition)
        queued[sp] = None

    def _state_partition(self, sp: SharePartition) -> int:
        partition = self._state_partitions.get(sp)
        if partition is None:
            partition = self._state_partitions[sp] = self.persister.partition_of(
                SharePartitionKey.of(sp.group_id, sp.topic_id, sp.partition))
        return partition

    def _is_queued(self, sp: SharePartition) -> bool:
        queued = self._queued.get(self._state_partition(sp))
        return queued is not None and sp in queued

    async def persist(self, sp: SharePartition) -> bool:
        """Write ``sp``'s changes; True once they are durable, False if the write failed.

        The acknowledgements pending when this is called are COMMITTED or ROLLED_BACK
        when it returns.
        """
        self.schedule_persist(sp)
        if not self._is_queued(sp) and sp.write_in_flight is None:
            return True
        settled: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._settled.setdefault(sp, []).append(settled)
        return await settled

    async def wait_for(self, sp: SharePartition, update: PendingUpdate) -> None:
        """Return once ``update`` is COMMITTED (its write is durable) or ROLLED_BACK."""
        while not update.done:
            self.schedule_persist(sp)
            if not self._is_queued(sp) and sp.write_in_flight is None:
                break  # nothing to write: only a dropped partition's leftovers
            # One future per waiter: a cancelled waiter cancels nobody else's wait.
            settled: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
            self._settled.setdefault(sp, []).append(settled)
            await settled

    def _wake_settled(self, sp: SharePartition, ok: bool) -> None:
        for settled in self._settled.pop(sp, ()):
            if not settled.done():
                settled.set_result(ok)

    def _start_write(self, sp: SharePartition, append: bool = True
                     ) -> tuple[StateWrite, int | None, PartitionOutcome | None] | None:
        """Take ``sp``'s next write and append it (no fsync yet).

        None if there is nothing to write. Otherwise (write, state partition, outcome):
        partition None if ``sp`` was dropped (nothing appended); an outcome that is not
        ok if the append failed.
        """
        w = sp.take_write()
        if w is None:
            return None
        if self.partitions.get((sp.group_id, sp.topic_id, sp.partition)) is not sp:  # type: ignore[arg-type]
            return w, None, None  # dropped: its persisted state was replaced; write nothing more of it
        if w.dead_letters:
            try:
                self._write_dead_letters(w)
            except ApiError as e:
                log.warning("share-partition %s-%s-%d: dead-letter write failed (%s); state write retried",
                            w.group_id, w.topic_id, w.partition, e)
                return w, -1, PartitionOutcome(e.error_code, str(e), None)
            except Exception as e:
                log.exception("share-partition %s-%s-%d: dead-letter write raised", w.group_id, w.topic_id,
                              w.partition)
                return w, -1, PartitionOutcome(ErrorCode.unknown_server_error, str(e), None)
        if not append:
            return w, -1, None
        key = SharePartitionKey.of(w.group_id, w.topic_id, w.partition)
        try:
            partition, outcome = self.persister.append_write(
                key, w.state_epoch, w.leader_epoch, w.start_offset,
                [StateBatch(b.first_offset, b.last_offset, b.delivery_state, b.delivery_count)
                 for b in w.state_batches],
                w.delivery_complete_count,
            )
        except Exception as e:
            log.exception("share-partition %s-%s-%d: state write raised", w.group_id, w.topic_id, w.partition)
            return w, -1, PartitionOutcome(ErrorCode.unknown_server_error, str(e), None)
        return w, partition, outcome

    def _write_dead_letters(self, w: StateWrite) -> None:
        """Write ``w``'s dead-letter records, durably, before ``w`` is appended (see shoal/server/dlq.py)."""
        meta = self.broker.store.topic_by_id(w.topic_id)
        if meta is None:
            return
        written = self.dead_letters.write(w.group_id, meta.name, w.partition, w.spso, w.dead_letters)
        if written:
            log.debug("share-partition %s-%s-%d: %d dead-letter record(s) written", w.group_id, meta.name,
                      w.partition, written)

    def _commit_round(self, partition: int) -> None:
        """Append the queued share-partitions' writes, fsync once, commit or roll back each.

        The fsync runs off the event loop (:meth:`_durable_round`). Cluster mode: the same
        round, but answered once the state partition's in-sync replicas have it too, or,
        when another broker coordinates the partition, sent there as one request
        (:meth:`_remote_round`).
        """
        queued = self._queued.pop(partition, {})
        if self.persister.remote is not None and not self.runtime.owns(partition):
            task = asyncio.ensure_future(self._remote_round(queued))
        else:
            round_started = perf_counter()
            appended = self._take_writes(queued, True)
            if not appended:
                return
            task = asyncio.ensure_future(self._durable_round(partition, appended, round_started))
        self._rounds.add(task)
        task.add_done_callback(self._rounds.discard)

    def _take_writes(self, queued: Iterable[SharePartition], append: bool,
                     ) -> list[tuple[SharePartition, StateWrite]]:
        """Start the write of every queued share-partition; settle those that failed to start."""
        started_writes: list[tuple[SharePartition, StateWrite]] = []
        for sp in queued:
            started = self._start_write(sp, append)
            if started is None:
                self._wake_settled(sp, True)
                continue
            w, state_partition, outcome = started
            if state_partition is None:
                sp.rollback(w, self.broker.clock.now_ms())
                self._wake_settled(sp, False)
            elif outcome is not None and not outcome.ok:
                self._settle(sp, w, outcome)
            else:
                started_writes.append((sp, w))
        return started_writes

    async def _durable_round(self, partition: int, appended: list[tuple[SharePartition, StateWrite]],
                             round_started: float) -> None:
        """The fsync of a round's appended writes, then each committed or rolled back.

        The fsync runs in the flusher's worker thread (``Flusher``), so the event loop
        goes on serving fetches and acknowledgements meanwhile; writes appended by the
        rounds that start meanwhile are covered by the next fsync, shared by all of them.
        A share-partition has one write out at a time, so its later changes wait for the
        next round after this one settles. In cluster mode the round is also answered
        only once every in-sync replica has the writes (the high watermark covers them).
        """
        failure = await self.persister.durable(partition, inline=False)
        if self.broker.metrics is not None:
            self.broker.metrics.persister_write(perf_counter() - round_started, failure is None)
        for sp, w in appended:
            self._settle(sp, w, failure)

    async def _remote_round(self, queued: Iterable[SharePartition]) -> None:
        """Cluster mode, another broker coordinates the state: every write of the round goes
        to it together (one WriteShareGroupState per group, see ``share_persister.py``)."""
        round_started = perf_counter()
        taken = self._take_writes(queued, False)
        if not taken:
            return
        outcomes = await asyncio.gather(*(
            self.persister.write_state(
                SharePartitionKey.of(w.group_id, w.topic_id, w.partition), w.state_epoch, w.leader_epoch,
                w.start_offset, [StateBatch(b.first_offset, b.last_offset, b.delivery_state, b.delivery_count)
                                 for b in w.state_batches], w.delivery_complete_count)
            for _sp, w in taken))
        if self.broker.metrics is not None:
            self.broker.metrics.persister_write(perf_counter() - round_started, all(o.ok for o in outcomes))
        for (sp, w), outcome in zip(taken, outcomes):
            self._settle(sp, w, None if outcome.ok else outcome)

    def _settle(self, sp: SharePartition, w: StateWrite, failure: PartitionOutcome | None) -> None:
        pid: PartitionId = (sp.group_id, sp.topic_id, sp.partition)  # type: ignore[assignment]
        live = self.partitions.get(pid) is sp
        before = sp.next_fetch_offset()
        errors_key = ("share-partition state", pid)
        if failure is None:
            self.broker.storage_errors.ok(errors_key)
            sp.commit(w)
            # A release commits to AVAILABLE, and the SPSO may have moved.
            released = bool(w.updates) and (before is None or sp.has_available_in_flight())
        else:
            self.broker.storage_errors.failed(
                errors_key, f"{failure.error_code.name}; acknowledgements rolled back",
                label=f"share-partition {w.group_id}-{w.topic_id}-{w.partition}")
            sp.rollback(w, self.broker.clock.now_ms())
            released = True
            if live and failure.error_code in STALE:
                # A newer leader of the partition (or a reset of the group's offsets) owns
                # the state now, or the state was deleted: this share-partition is stale.
                # Its acknowledgements rolled back; clients get an error and fetch from the
                # current leader, which reloads the state (if there is any).
                log.warning("share-partition %s-%s-%d: write refused as stale (%s); dropped", w.group_id,
                            w.topic_id, w.partition, ErrorCode(failure.error_code).name)
                self._drop(pid)
                live = False
                self.wake(sp)
        self._wake_settled(sp, failure is None)
        if live:
            if released:
                self.wake(sp)
            self.reschedule(sp)
            if failure is not None:
                self._schedule_retry(sp)
            elif sp.needs_write:  # changed while its write was out (cluster mode's rounds await)
                self.schedule_persist(sp)

    def _schedule_retry(self, sp: SharePartition) -> None:
        pid = _partition_id(sp)
        if pid in self._retry:
            return

        def run() -> None:
            self._retry.pop(pid, None)
            if self.partitions.get(pid) is sp and not self.broker.shutting_down:
                self.schedule_persist(sp)

        self._retry[pid] = asyncio.get_running_loop().call_later(RETRY_WRITE_S, run)

    def wake(self, sp: SharePartition) -> None:
        """Complete the ShareFetches parked on this share-partition (records may be acquirable again)."""
        self.purgatory.check_and_complete((sp.group_id, sp.topic_id, sp.partition))

    def reschedule(self, sp: SharePartition) -> None:
        """Keep one lock-expiry timer at ``sp.next_deadline_ms()``."""
        pid: PartitionId = (sp.group_id, sp.topic_id, sp.partition)  # type: ignore[assignment]
        deadline = sp.next_deadline_ms()
        current = self._timers.get(pid)
        if current is not None and current[0] == deadline:
            return
        if current is not None:
            current[1].cancel()
            del self._timers[pid]
        if deadline is None or self.broker.shutting_down:
            return
        loop = asyncio.get_running_loop()
        delay_s = max(0.0, (deadline - self.broker.clock.now_ms()) / 1000)

        def fire() -> None:
            self._timers.pop(pid, None)
            if self.partitions.get(pid) is not sp:
                return
            released = sp.expire(self.broker.clock.now_ms())
            if released:
                self.wake(sp)
                self._count_lock_timeouts(sp, released)
            self.schedule_persist(sp)
            self.reschedule(sp)

        self._timers[pid] = (deadline, loop.call_at(loop.time() + delay_s, fire))

    def _count_lock_timeouts(self, sp: SharePartition, released: list[tuple[int, int]]) -> None:
        metrics = self.broker.metrics
        meta = self.broker.store.topic_by_id(sp.topic_id)
        if metrics is not None and meta is not None:
            metrics.lock_timed_out(sp.group_id, meta.name, sp.partition, sum(hi - lo + 1 for lo, hi in released))

    # -- ShareFetch and ShareAcknowledge ------------------------------------------------------
    # One call per request, as Kafka's SharePartitionManager.fetchMessages / acknowledge: the
    # handlers translate the kio request into a ShareFetchParams / ShareAcknowledgeParams and
    # the ShareResult back; the session, acknowledgements, releases, loading, acquisition,
    # persistence and the long poll are all done here.

    async def acknowledge(self, request: ShareAcknowledgeParams) -> ShareResult:
        """ShareAcknowledge: check the share session, apply each partition's acknowledgements
        (all or nothing per partition) and answer once their writes are durable (or failed);
        a final epoch (-1) then closes the session and releases what the member holds."""
        group_id = request.group_id or ""
        member_id = request.member_id or ""
        result = ShareResult(self.record_lock_duration_ms(group_id))
        invalid = invalid_ids(request.group_id, request.member_id)
        if invalid is not None:
            result.error_code, result.error_message = ErrorCode.invalid_request, invalid
            return result
        # A member that left the group keeps its share session until the client closes it,
        # and may still acknowledge what it holds (see on_share_member_removed).
        previous = self.sessions.get(group_id, member_id)
        previous_parts = tuple(previous.partitions) if previous is not None else ()
        outcome = self.sessions.share_acknowledge(group_id, member_id, request.session_epoch,
                                                  connection_id=request.connection_id)
        if not outcome.ok:
            result.error_code = outcome.error_code
            return result
        with_acks = [p for p in request.partitions if p.acknowledgements]
        await self.load_partitions(group_id, [p.key for p in with_acks])
        codes = await self._acknowledgement_codes(
            self._apply_acknowledgements(group_id, member_id, with_acks, request.version))
        if outcome.closed:
            self.release_member(group_id, member_id, previous_parts)
        result.partitions = [PartitionResult(p.topic_id, p.partition, codes.get(p.key, ErrorCode.none))
                             for p in request.partitions]
        return result

    async def fetch(self, request: ShareFetchParams) -> ShareResult:
        """ShareFetch: session, acknowledgements, releases, then acquisition with its long poll.

        See the handler module's docstring for the order of things and what is answered.
        """
        group_id = request.group_id or ""
        member_id = request.member_id or ""
        result = ShareResult(self.record_lock_duration_ms(group_id))
        invalid = invalid_ids(request.group_id, request.member_id) or invalid_share_fetch(request)
        if invalid is not None:
            result.error_code, result.error_message = ErrorCode.invalid_request, invalid
            return result
        previous = self.sessions.get(group_id, member_id)
        previous_parts = tuple(previous.partitions) if previous is not None else ()
        outcome = self.sessions.share_fetch(
            group_id, member_id, request.session_epoch,
            add=[(str(p.topic_id), p.partition) for p in request.partitions],
            forget=[(str(t), p) for t, p in request.forgotten], connection_id=request.connection_id)
        if not outcome.ok:
            result.error_code = outcome.error_code
            return result

        # Cluster mode: the share-partitions' state may have to come from another broker first
        # (and a new session checks that no offsets reset happened behind their back).
        if request.session_epoch == INITIAL_EPOCH and outcome.partitions:
            await self.drop_if_reset(group_id, [(uuid.UUID(t), p) for t, p in outcome.partitions],
                                     max(1.0, request.max_wait_ms / 1000))
        with_acks = [p for p in request.partitions if p.acknowledgements]
        await self.load_partitions(group_id, [p.key for p in with_acks])
        acks = self._apply_acknowledgements(group_id, member_id, with_acks, request.version)
        settle_first = outcome.closed or bool(outcome.replaced) or bool(outcome.forgotten)
        if settle_first:
            # Settle the acknowledgements before releasing: a write that fails leaves its
            # records acquired by the member, and the release below must see them.
            ack_codes = await self._acknowledgement_codes(acks)

        # Release what the member held where it no longer fetches. A session replaced by
        # epoch 0 (the client reset it after an error) keeps the member's records in the
        # partitions the new session still names, as in Kafka: they stay the member's to
        # acknowledge, and are not released and re-acquired by this very request with a
        # delivery count one higher.
        if outcome.closed:
            self.release_member(group_id, member_id, previous_parts)
        else:
            dropped = [sp for sp in outcome.replaced if sp not in outcome.added] + list(outcome.forgotten)
            if dropped:
                self.release_member(group_id, member_id, dropped)

        errors: dict[Key, ErrorCode] = {}
        fetched: dict[Key, tuple[dict[int, bytes], list[AcquiredRecords]]] = {}
        if not outcome.closed and not request.renew_only and outcome.partitions:
            await self._acquire_with_long_poll(group_id, member_id, request,
                                               [(uuid.UUID(t), p) for t, p in outcome.partitions], errors, fetched)

        # The fetch ran while the acknowledgements' writes were in flight; answer only once
        # they are durable (or failed).
        if not settle_first:
            ack_codes = await self._acknowledgement_codes(acks)
        for key in dict.fromkeys([*ack_codes, *errors, *fetched]):
            batches, acquired = fetched.get(key, ({}, []))
            result.partitions.append(PartitionResult(key[0], key[1], errors.get(key, ErrorCode.none),
                                                     ack_codes.get(key, ErrorCode.none), batches, sorted(acquired)))
        return result

    def _apply_acknowledgements(self, group_id: str, member_id: str, partitions: Iterable[SharePartitionRequest],
                                version: int) -> list[tuple[Key, SharePartition | None, Any]]:
        """Apply every partition's acknowledgement batches in memory and start their writes.

        Returns one (key, share-partition, PendingUpdate or ErrorCode) per partition; pass
        it to :meth:`_acknowledgement_codes` before answering.
        """
        now = self.broker.clock.now_ms()
        metrics = self.broker.metrics
        pending: list[tuple[Key, SharePartition | None, Any]] = []
        for p in partitions:
            key = p.key
            batches = p.acknowledgements
            try:
                if any(x == AcknowledgeType.RENEW for b in batches for x in b.acknowledge_types):
                    if version < 2:
                        raise ApiError(ErrorCode.invalid_request, "renew needs version 2")
                    if not self.renew_acknowledge_enabled(group_id):
                        # As Kafka: the partition's acknowledgements fail, none of them applied.
                        raise ApiError(ErrorCode.invalid_record_state,
                                       "Renewing acquisition locks is not enabled for the group.")
                sp = self.get_partition(group_id, key[0], key[1])
                update = sp.acknowledge(member_id, [(b.first_offset, b.last_offset, b.acknowledge_types)
                                                    for b in batches], now)
            except ApiError as e:
                pending.append((key, None, ErrorCode(e.error_code)))
                continue
            pending.append((key, sp, update))
            if metrics is not None:
                _count_acknowledgements(metrics, group_id, batches)
            self.schedule_persist(sp)
            self.reschedule(sp)  # renewals move deadlines
        return pending

    async def _acknowledgement_codes(self, pending: list[tuple[Key, SharePartition | None, Any]]
                                     ) -> dict[Key, ErrorCode]:
        """Wait until each acknowledgement's write is durable (or failed); its error code per partition."""
        codes: dict[Key, ErrorCode] = {}
        for key, sp, update in pending:
            if sp is None:
                codes[key] = update
                continue
            await self.wait_for(sp, update)
            codes[key] = ErrorCode.none if update.status is UpdateStatus.COMMITTED \
                else ErrorCode.coordinator_not_available
        return codes

    async def _acquire_with_long_poll(self, group_id: str, member_id: str, request: ShareFetchParams,
                                      order: list[Key], errors: dict[Key, ErrorCode],
                                      fetched: dict[Key, tuple[dict[int, bytes], list[AcquiredRecords]]]) -> None:
        """Acquire for ``member_id`` from the session's partitions (``order``: rotated) until the
        acquired records add up to MinBytes, at most MaxWaitMs; fills ``errors`` and ``fetched``."""
        broker = self.broker
        session = self.sessions.get(group_id, member_id)
        max_records = request.max_records if request.max_records > 0 else DEFAULT_MAX_RECORDS
        mode = AcquireMode(request.acquire_mode)
        batch_size = request.batch_size if request.batch_size > 0 else None
        max_bytes = request.max_bytes if request.max_bytes > 0 else 2**31 - 1
        deadline = broker.clock.now_ms() + request.max_wait_ms
        # MinBytes: the request waits (up to MaxWaitMs) until the records it acquired
        # add up to MinBytes; what each pass acquires is kept and added to.
        min_bytes = max(1, request.min_bytes)
        remaining_records = max_records
        budget = max_bytes
        watch: list[Hashable] | None = None
        while True:
            # Cluster mode: load (or, after a failover, reload) what is not loaded yet, for at
            # most the fetch's wait; a share-partition still loading gives nothing this time.
            await self.load_partitions(group_id, [k for k in order if k not in errors],
                                       max(0.0, deadline - broker.clock.now_ms()) / 1000)
            for key in order:
                if key in errors or remaining_records <= 0 or budget <= 0:
                    continue
                if self.is_loading(group_id, key[0], key[1]):
                    continue  # nothing to acquire yet; its load wakes this fetch when done
                try:
                    data, acquired = self._acquire_one(group_id, member_id, key[0], key[1], remaining_records,
                                                       budget, mode, batch_size)
                except ApiError as e:
                    errors[key] = ErrorCode(e.error_code)
                    continue
                if acquired:
                    # A batch may hold records of two passes (one split by RECORD_LIMIT):
                    # it is sent once.
                    parts, got = fetched.setdefault(key, ({}, []))
                    budget -= sum(len(b) for base, b in data.items() if base not in parts)
                    parts.update(data)
                    got.extend(acquired)
                    remaining_records -= sum(a.last_offset - a.first_offset + 1 for a in acquired)
            left = deadline - broker.clock.now_ms()
            got_bytes = max_bytes - budget
            if (fetched and (got_bytes >= min_bytes or remaining_records <= 0 or budget <= 0)) \
                    or left <= 0 or broker.shutting_down:
                return
            if any(c not in _WAIT_OUT for c in errors.values()):
                return
            # A partition whose state cannot be written (a full disk) does not end the long
            # poll: its error is answered at the deadline, with whatever the others found, so
            # a client that retries at once does not spin.
            if watch is None:
                watch = self._watch_keys(group_id, order)
            await self.purgatory.park(watch, left / 1000)
            # While parked, the session may have been closed (final epoch, disconnect) or
            # replaced by a new one (epoch 0): this request then acquires nothing; the
            # client no longer waits for its answer.
            if self.sessions.get(group_id, member_id) is not session:
                return

    def _watch_keys(self, group_id: str, order: list[Key]) -> list[Hashable]:
        """What a parked ShareFetch of ``order`` is watched under: each share-partition, and
        each data partition (see ``share_purgatory.py``)."""
        keys: list[Hashable] = []
        for t, p in order:
            keys.append((group_id, t, p))
            meta = self.broker.store.topic_by_id(t)
            if meta is not None:
                keys.append((meta.name, p))
        return keys

    def _acquire_one(self, group_id: str, member_id: str, topic_id: uuid.UUID, partition: int,
                     max_records: int, budget: int, mode: AcquireMode,
                     batch_size: int | None) -> tuple[dict[int, bytes], list[AcquiredRecords]]:
        """Acquire what ``member_id`` may get of one share-partition.

        Returns ({base offset: batch bytes} of the log batches holding acquired records,
        the acquired ranges).
        """
        store = self.broker.store
        sp = self.get_partition(group_id, topic_id, partition)
        self._configure(sp)
        if budget <= 0:
            return {}, []
        meta = store.topic_by_id(topic_id)
        plog = store.partition(meta.name, partition)
        self.follow_log_start(sp, plog.log_start_offset)
        offset = sp.next_fetch_offset()
        if offset is None:
            return {}, []
        # Read a little at a time: the records wanted are usually few batches, and every
        # batch read is parsed and offered to acquire.
        chunk = max(8192, max_records * 128)
        acquired: list[AcquiredRecords] = []
        parts: dict[int, bytes] = {}
        # share.isolation.level read_committed: nothing at or above the last stable offset, and
        # aborted transactions' batches are left out (acquire archives what it is not offered)
        committed = self.read_committed(group_id)
        end = plog.last_stable_offset if committed else plog.high_watermark
        skipped_from: int | None = None  # read_committed: where the trailing batches with nothing to deliver begin
        while max_records > 0 and budget > 0 and offset < end:
            try:
                data = plog.read(offset, min(budget, chunk, PARTITION_MAX_READ_BYTES))
            except ApiError as e:
                if e.error_code != ErrorCode.offset_out_of_range or offset >= plog.log_start_offset:
                    raise
                # Retention or DeleteRecords removed what was to be read: SPSO follows.
                self.follow_log_start(sp, plog.log_start_offset)
                nxt = sp.next_fetch_offset()
                if nxt is None or nxt <= offset:
                    break
                offset = nxt
                continue
            if not data:
                break
            headers = list(iter_batches(data))
            if committed:
                headers = [h for h in headers if h.next_offset <= end]
                if not headers:
                    break
            offset = headers[-1].next_offset
            first_read = headers[0].base_offset
            headers = [h for h in headers if not h.is_control]
            if committed:
                headers = plog.without_aborted(headers)
                if headers:
                    skipped_from = headers[-1].next_offset if headers[-1].next_offset < offset else None
                elif skipped_from is None:
                    skipped_from = first_read
            got = sp.acquire(member_id, [(h.base_offset, h.last_offset) for h in headers], self.broker.clock.now_ms(),
                             max_records, acquire_mode=mode, batch_size=batch_size)
            j = 0
            for h in headers:
                while j < len(got) and got[j].last_offset < h.base_offset:
                    j += 1
                if j < len(got) and got[j].first_offset <= h.last_offset:
                    parts[h.base_offset] = bytes(data[h.position:h.position + h.size])
                    budget -= h.size
            acquired.extend(got)
            max_records -= sum(a.last_offset - a.first_offset + 1 for a in got)
            chunk *= 4
            if sp.next_fetch_offset() is None:
                break
        if skipped_from is not None and offset > skipped_from:
            sp.archive_gap(skipped_from, offset - 1)  # markers and aborted records up to the LSO
        if sp.needs_write:
            self.schedule_persist(sp)
        if acquired:
            self.reschedule(sp)
            metrics = self.broker.metrics
            if metrics is not None:
                metrics.acquired(group_id, meta.name, sum(a.last_offset - a.first_offset + 1 for a in acquired))
                metrics.fetched(meta.name, sum(len(b) for b in parts.values()))
        return parts, acquired

    # -- releases ---------------------------------------------------------------------------
    def release_member(self, group_id: str, member_id: str,
                       where: Iterable[tuple[str, int]] | None = None) -> None:
        """Release ``member_id``'s acquired records (in ``where`` = (topic_id str, partition),
        or in every loaded share-partition of the group)."""
        now = self.broker.clock.now_ms()
        wanted = None if where is None else {(str(t), int(p)) for t, p in where}
        for (g, topic_id, partition), sp in list(self.partitions.items()):
            if g != group_id or (wanted is not None and (str(topic_id), partition) not in wanted):
                continue
            if sp.release_member(member_id, now):
                self.wake(sp)
            self.schedule_persist(sp)
            self.reschedule(sp)

    def on_share_member_removed(self, group_id: str, member_id: str) -> None:
        """The member left the group or was fenced.

        A member with a share session on an open connection keeps the session and its
        acquired records: a closing client sends its leave heartbeat (to the group
        coordinator) and its final ShareAcknowledge/ShareFetch (epoch -1, carrying the
        last acknowledgements, to the partition leader) at the same time, on different
        connections. Releasing here would let the records it is just accepting be
        redelivered, and fail its final acknowledgement. As in Kafka, the member's records
        are released when that session closes, when its connection closes, or when their
        locks expire; the member can no longer fetch (it is not a member). Without a live
        session, everything it still holds is released now.
        """
        session = self.sessions.get(group_id, member_id)
        if session is not None and session.connection_id is not None:
            return
        self.sessions.remove_member(group_id, member_id)
        self.release_member(group_id, member_id)

    def on_connection_closed(self, connection_id: Any) -> None:
        for group_id, member_id in self.sessions.disconnect(connection_id):
            self.release_member(group_id, member_id)

    # -- group service contract ----------------------------------------------------------------
    async def initialize_share_state(self, group_id: str, partitions: Mapping[uuid.UUID, Iterable[int]],
                                     earliest_topics: Iterable[uuid.UUID] = (), state_epoch: int = 0) -> None:
        """Persist the initial state of each share-partition (InitializeShareGroupState).

        The group coordinator calls this for partitions entering the group, none of
        which the group uses yet: whatever state a key holds is replaced, as Kafka's
        initialization does, so nothing left from elsewhere is inherited. The state epoch
        is ``state_epoch`` (the group epoch), or the stored one if that is higher.
        Partitions of ``earliest_topics`` (topics the group already had state for, whose
        partition count grew) start at the earliest offset; the others as
        ``share.auto.offset.reset`` says. Raises ApiError when a topic is unknown or the
        persister fails.
        """
        earliest = frozenset(earliest_topics)
        for topic_id, parts in partitions.items():
            name = self._topic_name(topic_id)
            for p in parts:
                key = SharePartitionKey.of(group_id, topic_id, p)
                o = await self.persister.read_state_summary(key)
                epoch = state_epoch
                if o.ok and o.state is not None:
                    epoch = max(epoch, o.state.state_epoch)
                self._drop((group_id, topic_id, int(p)))
                o = await self.persister.initialize_state(
                    key, epoch, self._start_offset(key, name, earliest=topic_id in earliest))
                if not o.ok:
                    raise ApiError(o.error_code, o.error_message or "cannot initialize share-partition state")

    async def delete_share_state(self, group_id: str, partitions: Mapping[uuid.UUID, Iterable[int]]) -> None:
        """Delete the persisted state of each share-partition and forget it in memory."""
        for topic_id, parts in partitions.items():
            for p in parts:
                o = await self.delete_partition_state(group_id, topic_id, int(p))
                if not o.ok:
                    raise ApiError(o.error_code, o.error_message or "cannot delete share-partition state")

    async def delete_partition_state(self, group_id: str, topic_id: uuid.UUID, partition: int) -> PartitionOutcome:
        self._drop((group_id, topic_id, partition))
        return await self.persister.delete_state(SharePartitionKey.of(group_id, topic_id, partition))

    # -- admin helpers --------------------------------------------------------------------------
    def state_keys(self, group_id: str) -> list[SharePartitionKey]:
        """Every share-partition of ``group_id`` with persisted state: those in the state
        partitions this broker coordinates, and those the group's metadata names as
        initialized (in a cluster the others are coordinated elsewhere)."""
        out: set[SharePartitionKey] = set()
        for i, shard in enumerate(self.runtime.shards):
            if self.runtime.owns(i):
                out.update(k for k in shard.keys() if k.group_id == group_id)  # noqa: SIM118 (a shard, not a dict)
        groups = self.broker.extensions.get("groups")
        if groups is not None:
            try:
                p = groups.partition_for(group_id)
            except ApiError:
                p = None
            if p is not None:
                for topic_id, parts in groups.share_groups(p).initialized_partitions(group_id).items():
                    out.update(SharePartitionKey.of(group_id, topic_id, q) for q in parts)
        return sorted(out)

    def group_has_sessions(self, group_id: str) -> bool:
        return any(g == group_id for g, _m in self.sessions._sessions)

    def close_group_sessions(self, group_id: str) -> None:
        """Close every share session of ``group_id`` and release its members' records
        (for a group whose members are all gone)."""
        for g, member_id in [k for k in self.sessions._sessions if k[0] == group_id]:
            self.sessions.remove_member(g, member_id)
            self.release_member(g, member_id)

    async def reset_start_offset(self, group_id: str, topic_id: uuid.UUID, partition: int,
                                 start_offset: int) -> PartitionOutcome:
        """AlterShareGroupOffsets: a new state epoch starting at ``start_offset``.

        The share-partition leader (in a cluster, maybe another broker) holds an older
        state epoch: its next write is fenced and it reloads the new state."""
        key = SharePartitionKey.of(group_id, topic_id, partition)
        current = await self.persister.read_state_summary(key)
        epoch = current.state.state_epoch + 1 if current.ok and current.state is not None else 0
        self._drop((group_id, topic_id, partition))
        return await self.persister.initialize_state(key, epoch, start_offset)

    def state_leadership_changed(self, index: int, leader: bool) -> None:
        """Cluster mode: this broker started or stopped leading ``__share_group_state``-``index``.

        Becoming leader replays the partition into a fresh shard on the next loop
        iteration (COORDINATOR_LOAD_IN_PROGRESS until then); losing it empties the shard
        (NOT_COORDINATOR). Share-partitions whose state it holds are not touched: their
        next writes go to the new coordinator.
        """
        if self._closed:
            return
        # The cluster's topic decides the partition count, whatever this broker's setting says.
        if not 0 <= index < self.runtime.sync_partition_count():
            return
        if not leader:
            self.runtime.unload_partition(index)
            return
        self.runtime.schedule_load(index, lambda: self._closed)

    def leadership_lost(self, topic: str, partition: int) -> None:
        """Cluster mode: another broker leads ``topic``-``partition`` now. Its share-partitions
        are dropped with their acquisition locks; the new leader loads the persisted state,
        where those records are available again with their persisted delivery counts."""
        meta = self.broker.store.get_topic(topic)
        if meta is None:
            return
        pids = [p for p in self.partitions if p[1] == meta.topic_id and p[2] == partition]
        for pid in pids:
            self._drop(pid)
        if pids:
            log.info("%s-%d: dropped %d share-partition(s) (this broker no longer leads it)", topic, partition,
                     len(pids))
            self.broker.append_waiters.notify(topic, partition)

    def forget_topic(self, topic_id: uuid.UUID) -> None:
        for pid in [p for p in self.partitions if p[1] == topic_id]:
            self._drop(pid)


def _count_acknowledgements(metrics: Any, group_id: str, batches: Iterable[Any]) -> None:
    """Add one partition's applied acknowledgements to the metrics, by type (gaps are not records)."""
    metrics.acknowledgement_request(group_id)
    for b in batches:
        types = b.acknowledge_types
        if len(types) == 1:
            if types[0] != AcknowledgeType.GAP:
                metrics.acknowledged(group_id, AcknowledgeType(types[0]).name, b.last_offset - b.first_offset + 1)
        else:
            for t in types:
                if t != AcknowledgeType.GAP:
                    metrics.acknowledged(group_id, AcknowledgeType(t).name, 1)


def share_service(broker: Any) -> ShareService:
    svc = broker.extensions.get("share")
    if svc is None:
        raise ApiError(ErrorCode.coordinator_not_available, "share service not started")
    return svc  # type: ignore[no-any-return]


@on_start
async def _start(broker: Any) -> None:
    svc = ShareService(broker)
    svc.start()
    broker.extensions["share"] = svc


@on_stop
async def _stop(broker: Any) -> None:
    svc = broker.extensions.get("share")
    if svc is not None:
        await svc.drain()
        svc.stop()
        await svc.close()


@on_disconnect
def _disconnected(broker: Any, conn: Any) -> None:
    svc = broker.extensions.get("share")
    if svc is not None and not broker.shutting_down:
        svc.on_connection_closed(conn.connection_id)


@on_leadership_change
def _leadership(broker: Any, topic: str, index: int, leader: bool) -> None:
    svc = broker.extensions.get("share")
    if svc is None:
        return
    if topic == SHARE_STATE_TOPIC:
        svc.state_leadership_changed(index, leader)
    elif not leader:
        svc.leadership_lost(topic, index)


@on_topic_deleted
def _topic_deleted(broker: Any, meta: Any) -> None:
    svc = broker.extensions.get("share")
    if svc is not None:
        svc.forget_topic(meta.topic_id)
