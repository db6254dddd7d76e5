"""The coordinator runtime: pure shards over the partitions of an internal topic.

Theory of operation
-------------------
A coordinator (the group coordinator on ``__consumer_offsets``, the share coordinator
on ``__share_group_state``) is split into one *shard* per partition of its internal
topic. A shard is a pure state machine (``shoal.groups.manager``,
``shoal.share.coordinator``) with request handlers that return a
:class:`~shoal.coordinator.result.Result` and a ``replay(record)`` method.

Three ways to make a result durable, all appending its records as one uncompressed
batch to the partition's log and replaying them into the shard without awaiting in
between, so no other operation on the shard can interleave between computing a result
and applying it: one shard's operations are serial, as Kafka's runtime guarantees with
its queue. If the append fails, nothing is replayed, the call raises
ApiError(COORDINATOR_NOT_AVAILABLE) and the shard is unchanged. A write the disk refuses
(no space, no descriptors) is such a failure, not a fatal one: the log took the whole
append back, so the same operation succeeds once space returns; it is logged once per
partition through ``broker.storage_errors``.

* ``apply(partition, result)``: append, fsync on the event loop, replay. When it
  returns, the records are durable; the caller may answer at once.
* ``await apply_durable(partition, result)`` (group commit): append without fsync,
  replay at once (so later operations see the change), then await
  ``broker.flusher.durable(plog, end_offset)``. The fsync runs in a worker thread and is
  shared by every write appended to the partition meanwhile; the event loop keeps
  serving. The caller answers its client only after the await returns. A result with
  no records still waits until everything already appended to the partition is
  durable, so no answer is ever computed from state that is not on disk yet.
* ``apply_deferred(partition, result)`` then ``flush_now(partition)`` or ``await
  wait_durable(partition, inline=False)``: for a caller that batches writes itself
  (the share-state RPCs; the share service's commit rounds): append and replay now,
  and later one fsync for everything appended since, on the event loop or in the
  flusher's worker thread.

A failed fsync leaves the shard's memory ahead of the disk, and after a failed fsync
the kernel may have dropped the unwritten pages while a later fsync reports success.
So, as Kafka halts when flushing a log fails, it is fatal: the partition is marked
failed (every later operation on it, and every write still waiting on it, fails with
COORDINATOR_NOT_AVAILABLE, so nobody is told of a success), the error is logged, and
``broker.halt_on_storage_error`` stops the process without a clean shutdown. A restart
replays only what is on disk; no client was told that anything beyond it succeeded.

Transactions (the group coordinator's TxnOffsetCommit): a result with a ``producer_id``
is appended as a transactional batch of that producer and replayed with the shard's
``replay_transactional(record, producer_id)``; a commit or abort marker found in the
partition at load is replayed with ``replay_marker(producer_id, commit)`` (the
transaction coordinator calls the same method when it appends one live).

At start, ``load`` creates the topic if needed (compacted unless ``topic_configs`` says
otherwise, Kafka's partition count key) and replays every record at or above the log
start offset of every partition into a fresh shard, batch by batch. With
``replay_offsets=True`` the shard's ``replay`` also gets each record's offset (the
share coordinator uses it to tell which records are superseded).

Records are in Kafka's binary layouts (``shoal.coordinator.records``). A partition that
still holds records in the JSON form earlier shoal versions wrote, or records the shard's
``upgraded(record)`` restates (the group coordinator's member records with shoal's
earlier member-state ids), is read as usual, and then rewritten once, segment by segment
(``shoal.log.compaction.rewrite_records``): each such record is re-encoded in place, at
its offset. Until then, and if the rewrite is interrupted, those records stay readable
(each says which form it is in), and the next start finishes the job.

Cluster mode (``follow_leadership=True``, only with ``broker.replicas``): the internal
topic is a replicated topic in the cluster metadata, and a shard is *owned* only while
this broker leads its partition. ``load`` then creates nothing and owns nothing;
``load_partition(i)`` (called when this broker becomes the leader) replays partition
``i`` into a fresh shard, ``unload_partition(i)`` (leadership lost) replaces it with an
empty one. Every operation on a partition that is not owned raises
ApiError(NOT_COORDINATOR), one still loading COORDINATOR_LOAD_IN_PROGRESS. Appends carry
the leader epoch, and ``wait_durable`` (so ``apply_durable``) returns only once the
partition's high watermark covers everything appended, i.e. the records are on every
in-sync replica (``offsets.commit.timeout.ms``). The synchronous ``apply`` fsyncs the
leader's log only: its caller answers only after ``wait_durable`` (the group service's
``answer``). Without ``follow_leadership`` nothing of this runs.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from ..coordinator.partitioning import coordinator_partition
from ..coordinator.records import CoordinatorRecord, is_legacy_json
from ..coordinator.result import Result
from ..errors import ApiError, ErrorCode
from ..log.compaction import rewrite_records
from ..protocol.batch import build_batch, decode_records
from ..protocol.markers import COMMIT, marker_type

log = logging.getLogger("shoal.runtime")

S = TypeVar("S")

__all__ = ["CoordinatorRuntime"]


class CoordinatorRuntime(Generic[S]):
    def __init__(self, broker: Any, topic: str, num_partitions_key: str, new_shard: Callable[[int], S], *,
                 topic_configs: dict[str, str] | None = None, replay_offsets: bool = False,
                 follow_leadership: bool = False) -> None:
        self.broker = broker
        self.topic = topic
        self.topic_configs = dict(topic_configs) if topic_configs is not None else {"cleanup.policy": "compact"}
        self.replay_offsets = replay_offsets
        self._num_partitions_key = num_partitions_key
        self._new_shard = new_shard
        self.shards: list[S] = []
        self._failed: set[int] = set()
        """Partitions whose fsync failed: memory may be ahead of the disk."""
        try:
            clustered = broker.config["metadata.store"] != "local"
        except (AttributeError, KeyError, TypeError):
            clustered = False
        self.follow_leadership = follow_leadership and clustered
        self.owned: set[int] | None = None
        """Cluster mode: partitions this broker leads and has loaded (None: every partition)."""
        self.loading: set[int] = set()

    @property
    def num_partitions(self) -> int:
        return len(self.shards)

    def partition_for_group(self, group_id: str) -> int:
        """The partition holding ``group_id``, by Kafka's rule."""
        return coordinator_partition(group_id, len(self.shards))

    def load(self) -> None:
        if self.follow_leadership:
            meta = self.broker.store.get_topic(self.topic)  # the local copy of the cluster's topic, if any
            n = meta.num_partitions if meta is not None else self.broker.config[self._num_partitions_key]
            self.shards = [self._new_shard(i) for i in range(n)]
            self.owned = set()
            return
        store = self.broker.store
        meta = store.get_topic(self.topic)
        if meta is None:
            n = self.broker.config[self._num_partitions_key]
            meta = store.create_topic(self.topic, n, self.topic_configs, now_ms=self.broker.clock.now_ms())
        want = self.topic_configs.get("segment.bytes")
        if want is not None and meta.configs.get("segment.bytes") != want:
            # the broker key decides, also for a topic created before it was set or changed
            store.alter_topic_configs(self.topic, set={"segment.bytes": want})
            log.info("%s: segment.bytes set to %s", self.topic, want)
        self.shards = [self._new_shard(i) for i in range(meta.num_partitions)]
        total = 0
        for i in range(len(self.shards)):
            total += self._replay_partition(i)
        log.info("%s: replayed %d records into %d shard(s)", self.topic, total, len(self.shards))

    def _replay_partition(self, i: int) -> int:
        """Replay partition ``i``'s log into ``self.shards[i]``; returns the record count."""
        shard = self.shards[i]
        store = self.broker.store
        total = 0
        plog = store.partition(self.topic, i)
        legacy = 0
        upgraded = getattr(shard, "upgraded", None)
        replay_marker = getattr(shard, "replay_marker", None)
        for header, data in plog.read_batches(plog.log_start_offset):
            if header.is_control:
                if replay_marker is not None and header.producer_id >= 0:
                    try:
                        kind = marker_type(data)
                    except ApiError:
                        kind = None
                    if kind is not None:
                        replay_marker(header.producer_id, kind == COMMIT)
                continue
            transactional = header.is_transactional and header.producer_id >= 0
            for rec in decode_records(data, header):
                if rec.key is None or rec.offset < plog.log_start_offset:
                    continue
                json_form = is_legacy_json(rec.key) or is_legacy_json(rec.value)
                try:
                    record = CoordinatorRecord.from_bytes(rec.key, rec.value, self.topic)
                except ValueError:
                    log.error("%s-%d: skipping undecodable record at offset %d", self.topic, i, rec.offset)
                    continue
                if json_form or (upgraded is not None and upgraded(record) is not None):
                    legacy += 1
                if transactional:
                    shard.replay_transactional(record, header.producer_id)  # type: ignore[attr-defined]
                elif self.replay_offsets:
                    shard.replay(record, rec.offset)  # type: ignore[attr-defined]
                else:
                    shard.replay(record)  # type: ignore[attr-defined]
                total += 1
        if legacy:
            self._upgrade(plog, i, legacy, upgraded)
        on_loaded = getattr(shard, "on_loaded", None)
        if on_loaded is not None:
            on_loaded(self.broker.clock.now_ms())
        return total

    # -- cluster mode: shards follow the leadership of their partitions ---------------
    def sync_partition_count(self) -> int:
        """Cluster mode: one shard per partition of the topic as it exists (its partition count
        decides where a key lives, whatever this broker's ``num_partitions_key`` says); returns
        the count. Called before a leadership change of the topic is applied."""
        meta = self.broker.store.get_topic(self.topic)
        n = len(self.shards) if meta is None else meta.num_partitions
        if n > len(self.shards):
            self.shards.extend(self._new_shard(i) for i in range(len(self.shards), n))
        elif n < len(self.shards):
            del self.shards[n:]
            if self.owned is not None:
                self.owned = {p for p in self.owned if p < n}
            self.loading = {p for p in self.loading if p < n}
        return n

    def begin_load(self, partition: int) -> None:
        """Leadership gained: answer COORDINATOR_LOAD_IN_PROGRESS until ``load_partition``."""
        if self.owned is not None:
            self.owned.discard(partition)
            self.loading.add(partition)

    def schedule_load(self, partition: int, closed: Callable[[], bool],
                      on_loaded: Callable[[int], None] | None = None) -> None:
        """Leadership gained: answer COORDINATOR_LOAD_IN_PROGRESS at once and replay
        ``partition`` on the next loop iteration, unless leadership was lost again or
        ``closed()`` meanwhile; then call ``on_loaded(partition)``. A replay that fails is
        logged and the partition unloaded."""
        self.begin_load(partition)

        def load() -> None:
            if closed() or partition not in self.loading:
                return  # lost again meanwhile
            try:
                self.load_partition(partition)
            except Exception:
                log.exception("%s-%d: loading failed", self.topic, partition)
                self.unload_partition(partition)
                return
            if on_loaded is not None:
                on_loaded(partition)

        asyncio.get_running_loop().call_soon(load)

    def load_partition(self, partition: int) -> int:
        """Replay ``partition`` into a fresh shard and own it; returns the record count."""
        self.shards[partition] = self._new_shard(partition)
        self._failed.discard(partition)
        total = self._replay_partition(partition)
        self.loading.discard(partition)
        if self.owned is not None:
            self.owned.add(partition)
        log.info("%s-%d: loaded %d records (this broker leads it now)", self.topic, partition, total)
        return total

    def unload_partition(self, partition: int) -> bool:
        """Leadership lost: drop the shard (an empty one takes its place). Whether it was owned."""
        if self.owned is None:
            return False
        was = partition in self.owned or partition in self.loading
        self.owned.discard(partition)
        self.loading.discard(partition)
        if was:
            self.shards[partition] = self._new_shard(partition)
            log.info("%s-%d: unloaded (another broker leads it now)", self.topic, partition)
        return was

    def owns(self, partition: int) -> bool:
        return self.owned is None or partition in self.owned

    def check_owner(self, partition: int) -> None:
        """Raise NOT_COORDINATOR / COORDINATOR_LOAD_IN_PROGRESS unless this broker serves ``partition``."""
        if self.owned is None or partition in self.owned:
            return
        if partition in self.loading:
            raise ApiError(ErrorCode.coordinator_load_in_progress, f"{self.topic}-{partition} is loading")
        raise ApiError(ErrorCode.not_coordinator, f"this broker does not lead {self.topic}-{partition}")

    def apply(self, partition: int, result: Result[Any]) -> Result[Any]:
        """Append ``result.records``, fsync on the event loop, then replay them into the shard.

        Returns ``result``. Raises ApiError(COORDINATOR_NOT_AVAILABLE) if the append fails
        (nothing replayed) or the partition failed; a failed fsync is fatal (see above).
        """
        if not result.records:
            return result
        plog, base_offset, durable = self._append(partition, result)
        if not durable:
            try:
                plog.flush(self.broker.clock.now_ms())
            except OSError as e:
                self._fail(partition, e)
                raise ApiError(ErrorCode.coordinator_not_available, "coordinator state could not be written") from e
        self._replay(partition, result, base_offset)
        return result

    def apply_deferred(self, partition: int, result: Result[Any]) -> Result[Any]:
        """Append and replay ``result.records`` now, without waiting for their fsync.

        The caller must ``await wait_durable(partition)`` before telling anyone the
        result succeeded. Raises ApiError(COORDINATOR_NOT_AVAILABLE) if the append fails
        (then nothing is replayed).
        """
        if result.records:
            _plog, base_offset, _durable = self._append(partition, result, defer_flush=True)
            self._replay(partition, result, base_offset)
        return result

    async def apply_durable(self, partition: int, result: Result[Any]) -> Result[Any]:
        """Append and replay ``result.records`` now, return once they are fsynced (group commit).

        Returns ``result``. Raises ApiError(COORDINATOR_NOT_AVAILABLE) if the append fails
        (nothing replayed; raised before the first await), or if the partition failed or
        fails before the records are durable.
        """
        self.apply_deferred(partition, result)
        await self.wait_durable(partition, wrote=bool(result.records))
        return result

    def needs_wait(self, partition: int) -> bool:
        """Whether an answer computed now from ``partition``'s shard must wait: some record
        appended to it is not fsynced yet, or (cluster mode) not yet under the high watermark.
        Also True for a partition that failed or is not owned (``wait_durable`` then raises)."""
        if partition in self._failed or not self.owns(partition):
            return True
        plog = self.broker.store.partition(self.topic, partition)
        if plog.unflushed_messages:
            return True
        return self.owned is not None and plog.high_watermark < plog.log_end_offset

    async def wait_durable(self, partition: int, *, wrote: bool = False, inline: bool = True) -> None:
        """Return once every record appended to ``partition`` so far is fsynced and, in cluster
        mode, under the partition's high watermark (on every in-sync replica).

        For an answer computed from the shard's state, which may include replayed records
        whose fsync (or replication) is still running. ``wrote``: the caller appended records
        of its own, which then also need ``min.insync.replicas`` in-sync replicas, as an
        acks=all append does. Raises ApiError(COORDINATOR_NOT_AVAILABLE) if the partition
        failed or the replication did not finish within ``offsets.commit.timeout.ms``,
        ApiError(NOT_COORDINATOR) if this broker stopped leading the partition meanwhile.
        ``inline``: the fsync runs on the event loop (small, rare writes); else in the
        flusher's worker thread, so the loop serves other requests meanwhile.
        """
        self._check(partition)
        plog = self.broker.store.partition(self.topic, partition)
        if plog.unflushed_messages:  # else everything appended so far is already durable
            try:
                await self.broker.flusher.durable(plog, plog.log_end_offset, inline=inline)
            except OSError as e:
                self._fail(partition, e)
        self._check(partition)
        if self.owned is not None:
            await self._wait_replicated(partition, plog.log_end_offset, wrote)

    async def _wait_replicated(self, partition: int, end_offset: int, wrote: bool) -> None:
        replicas = self.broker.replicas
        try:
            r = replicas.leader_replica(self.topic, partition)
        except ApiError:
            raise ApiError(ErrorCode.not_coordinator, f"this broker no longer leads {self.topic}-{partition}")
        code = await replicas.wait_for_isr(r, end_offset, self.broker.config["offsets.commit.timeout.ms"])
        if code == ErrorCode.not_enough_replicas_after_append and not wrote:
            code = ErrorCode.none  # replicated to the whole (shrunken) ISR; only new writes need min.insync
        if code == ErrorCode.not_leader_or_follower:
            raise ApiError(ErrorCode.not_coordinator, f"this broker no longer leads {self.topic}-{partition}")
        if code != ErrorCode.none:
            # as Kafka's coordinator runtime maps a failed or timed-out replicated append
            raise ApiError(ErrorCode.coordinator_not_available, f"{self.topic}-{partition}: {code.name}")

    def flush_now(self, partition: int) -> None:
        """fdatasync ``partition`` on the event loop now, covering every append so far.

        For a caller that batches its own appends (``apply_deferred``) and answers them
        all after one sync. Raises ApiError(COORDINATOR_NOT_AVAILABLE) if the partition
        failed or the sync fails (the partition is then failed and the broker halts).
        """
        self._check(partition)
        plog = self.broker.store.partition(self.topic, partition)
        if not plog.unflushed_messages:
            return
        try:
            ticket = plog.begin_flush()
            ticket.sync()
        except OSError as e:
            self._fail(partition, e)
            raise ApiError(ErrorCode.coordinator_not_available, "coordinator state could not be written") from e
        plog.end_flush(ticket, self.broker.clock.now_ms())

    def run(self, partition: int, operation: Callable[[S], Result[Any]]) -> Result[Any]:
        """Compute ``operation(shard)`` and apply its result; returns the result."""
        return self.apply(partition, operation(self.shards[partition]))

    def run_deferred(self, partition: int, operation: Callable[[S], Result[Any]]) -> Result[Any]:
        """Compute ``operation(shard)`` and ``apply_deferred`` its result; returns the result.

        Raises ApiError(COORDINATOR_NOT_AVAILABLE) without computing anything if the
        partition failed.
        """
        self._check(partition)
        return self.apply_deferred(partition, operation(self.shards[partition]))

    def failed(self, partition: int) -> bool:
        """Whether an fsync of this partition failed (it then refuses every operation)."""
        return partition in self._failed

    # -- internals -------------------------------------------------------------------
    def _upgrade(self, plog: Any, partition: int, count: int,
                 upgraded: Callable[[CoordinatorRecord], CoordinatorRecord | None] | None) -> None:
        """Rewrite the records of ``plog`` an earlier version wrote otherwise (the JSON form,
        and what the shard's ``upgraded`` restates) in Kafka's binary layout, in place."""
        topic = self.topic

        def transform(key: bytes | None, value: bytes | None) -> tuple[bytes, bytes | None] | None:
            if key is None:
                return None
            json_form = is_legacy_json(key) or is_legacy_json(value)
            try:
                rec = CoordinatorRecord.from_bytes(key, value, topic)
                new = upgraded(rec) if upgraded is not None else None
                if new is None and not json_form:
                    return None
                return (new or rec).to_bytes()
            except Exception as e:  # kept as it is: still readable, never lost
                log.error("%s-%d: cannot re-encode a record of an earlier version (%s); kept as it is", topic,
                          partition, e)
                return None

        segments = rewrite_records(plog, transform)
        log.info("%s-%d: rewrote %d record(s) of an earlier version in Kafka's binary format (%d segment(s))",
                 topic, partition, count, segments)

    def _check(self, partition: int) -> None:
        self.check_owner(partition)
        if partition in self._failed:
            raise ApiError(ErrorCode.coordinator_not_available,
                           f"{self.topic}-{partition} failed to write its state")

    def _append(self, partition: int, result: Result[Any], *, defer_flush: bool = False) -> tuple[Any, int, bool]:
        self._check(partition)
        now_ms = self.broker.clock.now_ms()
        pairs = [r.to_bytes() for r in result.records]
        if result.producer_id >= 0:
            batch = build_batch([(k, v, (), now_ms) for k, v in pairs], producer_id=result.producer_id,
                                producer_epoch=result.producer_epoch, transactional=True)
        else:
            batch = build_batch([(k, v, (), now_ms) for k, v in pairs])
        plog = self.broker.store.partition(self.topic, partition)
        replica = None
        if self.owned is not None:
            try:
                replica = self.broker.replicas.leader_replica(self.topic, partition)
            except ApiError:
                raise ApiError(ErrorCode.not_coordinator, f"this broker no longer leads {self.topic}-{partition}")
        try:
            appended = plog.append(batch, now_ms, defer_flush=defer_flush,
                                   **({} if replica is None else {"leader_epoch": replica.leader_epoch}))
        except OSError as e:  # the fsync of a non-deferred append
            self._fail(partition, e)
            raise ApiError(ErrorCode.coordinator_not_available, "coordinator state could not be written") from e
        except ApiError as e:
            # A refused write (no space, no descriptors): nothing was appended or replayed.
            self.broker.storage_errors.failed((self.topic, partition), e.message)
            raise ApiError(ErrorCode.coordinator_not_available, "coordinator state could not be written") from e
        self.broker.storage_errors.ok((self.topic, partition))
        if replica is not None:
            self.broker.replicas.maybe_advance_hw(replica)
            self.broker.append_waiters.notify(self.topic, partition)  # the followers' parked Fetch
        return plog, appended.base_offset, appended.durable

    def _replay(self, partition: int, result: Result[Any], base_offset: int) -> None:
        shard = self.shards[partition]
        for i, record in enumerate(result.records):
            if result.producer_id >= 0:
                shard.replay_transactional(record, result.producer_id)  # type: ignore[attr-defined]
            elif self.replay_offsets:
                shard.replay(record, base_offset + i)  # type: ignore[attr-defined]
            else:
                shard.replay(record)  # type: ignore[attr-defined]

    def _fail(self, partition: int, error: BaseException) -> None:
        if partition in self._failed:
            return
        self._failed.add(partition)
        log.error("%s-%d: fsync failed (%s); its coordinator state in memory is ahead of the disk", self.topic,
                  partition, error)
        self.broker.halt_on_storage_error(f"fsync of {self.topic}-{partition} failed: {error}")
