"""This broker's replicas: leader or follower of each partition, as etcd says (asyncio shell).

Theory of operation
-------------------
Every new metadata snapshot is applied in one pass (``apply``):

* topics: the local log store mirrors the topics in etcd (created, grown, reconfigured,
  deleted), so the handlers keep reading topic metadata from the store;
  ``__consumer_offsets`` and ``__share_group_state`` are such replicated topics once
  created (``server/internal_topics.py``);
* every change of this broker's leadership of a partition is reported to
  ``broker.leadership_changed`` (the group coordinator loads and unloads its shards);
* partitions this broker is a replica of: it *leads* one when the partition state names
  it leader under its current registration epoch, else it *follows* the named leader (or
  does nothing while there is none). Every broker has a log for every partition; one
  that is not a replica keeps it empty: when a reassignment removes this broker (or
  removed it while it was down) the partition's records are deleted.

Becoming leader at epoch ``e``: the leader-epoch cache gets ``(e, log end offset)``, the
followers' progress is forgotten (each counts as caught up now, so none is dropped before
it had a chance to fetch), and parked acks=all produces keep waiting. Becoming follower:
acks=all waiters fail with NOT_LEADER_OR_FOLLOWER, the partition joins the fetcher of its
leader, which truncates it first (OffsetsForLeaderEpoch).

As leader, each follower Fetch reports the follower's log end offset (its fetch offset),
once checked (``replication.follower_fetch_error``): a replica id outside the partition's
replicas, a fetch offset outside [log start, log end offset] or a broker epoch that is not
the follower's current registration is refused and moves nothing.
The high watermark is the smallest log end offset among the ISR (the leader's own
included); it only grows. It advancing completes acks=all produces waiting for it and
wakes consumers' long polls (consumers read only below it). A follower that has not
caught up with the leader's log end for ``replica.lag.time.max.ms`` leaves the ISR; one
that reached the high watermark joins it again. Both are compare-and-swap writes to etcd
that the leader makes only under its current leader epoch: a leader that lost leadership
(paused, partitioned) cannot change the ISR, so it cannot acknowledge acks=all writes alone.

A failed write to any partition log (``broker.storage_errors`` reports it) takes the log
directory offline (Kafka's KIP-112, for shoal's one directory): every replica goes
offline, the fetchers close, ``log_dir_offline`` is set in the broker's registration (the
controller then drops it from every ISR and elects it nowhere), and a probe write in the
data directory, retried with a backoff, brings it back: the flag is cleared and the next
``apply`` follows and leads again.

Concurrency: event loop only; ``apply`` never awaits between reading a snapshot and
acting on it, except for etcd writes whose outcome is re-read through the next snapshot.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import struct
from typing import TYPE_CHECKING, Any

from ..errors import ApiError, ErrorCode
from ..log.partition_log import atomic_write
from .etcd_store import Snapshot
from .fetcher import Fetcher
from .leader_epochs import LeaderEpochCache, divergence_offset
from .partition_state import PartitionState, expand_isr, shrink_isr
from .replication import caught_up_at, follower_fetch_error, high_watermark, lagging

if TYPE_CHECKING:
    from .node import ClusterNode

log = logging.getLogger("shoal.cluster.replicas")

LEADER, FOLLOWER, OFFLINE = "leader", "follower", "offline"
PROBE_MIN_S, PROBE_MAX_S = 1.0, 30.0
"""While the log directory is offline, a probe write every PROBE_MIN_S; after each relapse
within RELAPSE_S of coming back, twice as long (at most PROBE_MAX_S)."""
RELAPSE_S = 60.0
PROBE_FILE = ".log-dir-probe"
INTERNAL_TOPICS = frozenset({"__consumer_offsets", "__share_group_state", "__transaction_state"})
EPOCH_FILE = "leader-epoch-checkpoint"
_I64 = struct.Struct(">q")


class Replica:
    """This broker's replica of one partition."""

    __slots__ = (
        "caught_up_ms",
        "epochs",
        "follower_leo",
        "index",
        "isr_write_pending",
        "last_fetch_leo",
        "last_fetch_ms",
        "leader_epoch",
        "leader_hw",
        "leader_id",
        "mod_revision",
        "plog",
        "role",
        "state",
        "topic",
        "waiters",
    )

    def __init__(self, topic: str, index: int, plog: Any) -> None:
        self.topic, self.index, self.plog = topic, index, plog
        self.role = OFFLINE
        self.leader_id = -1
        self.leader_epoch = -1
        self.state: PartitionState | None = None
        self.mod_revision = 0
        try:
            text = (plog.dir / EPOCH_FILE).read_text()
        except FileNotFoundError:
            text = ""
        self.epochs = LeaderEpochCache.from_text(text)
        if text and self.epochs.to_text() != text:
            # a damaged checkpoint: the log's batches say which epoch wrote them (as Kafka
            # rebuilds the cache while it recovers segments)
            self.epochs = LeaderEpochCache(getattr(plog, "epochs_in_log", None))
            log.warning("partition %s-%d: the %s file does not hold leader epochs (%r); taken from the log's "
                        "batches instead: %s", topic, index, EPOCH_FILE, text[:32], self.epochs.entries)
        past = []
        while self.epochs.entries and self.epochs.entries[-1][1] > plog.log_end_offset:
            past.append(self.epochs.entries.pop())  # the log's end was cut at start: no epoch starts past it
        if past:
            log.warning("partition %s-%d: leader epochs %s start past the log end offset %d; dropped", topic, index,
                        past[::-1], plog.log_end_offset)
        self.follower_leo: dict[int, int] = {}
        self.caught_up_ms: dict[int, int] = {}
        self.last_fetch_leo: dict[int, int] = {}
        self.last_fetch_ms: dict[int, int] = {}
        self.waiters: list[tuple[int, asyncio.Future[ErrorCode]]] = []
        self.isr_write_pending = False
        self.leader_hw = -1
        """As a follower: the leader's high watermark in its last Fetch answer (-1: none yet)."""
        if plog.replicated_high_watermark is None:
            plog.replicated_high_watermark = plog.log_start_offset

    def save_epochs(self) -> None:
        atomic_write(self.plog.dir / EPOCH_FILE, self.epochs.to_text().encode())

    def fail_waiters(self, code: ErrorCode) -> None:
        waiters, self.waiters = self.waiters, []
        for _, fut in waiters:
            if not fut.done():
                fut.set_result(code)


class ReplicaManager:
    def __init__(self, node: ClusterNode) -> None:
        self.node = node
        self.broker = node.broker
        self.config = node.broker.config
        self.node_id: int = node.broker.node_id
        self.replicas: dict[tuple[str, int], Replica] = {}
        self.fetchers: dict[int, Fetcher] = {}
        self._task: asyncio.Task[None] | None = None
        self._emptying: set[tuple[str, int]] = set()
        self.dir_offline: str | None = None
        """Why the log directory is offline (a write to it failed), or None while it is online."""
        self._dir_task: asyncio.Task[None] | None = None
        self._probe_delay_s = PROBE_MIN_S
        self._online_since = -1.0
        node.broker.storage_errors.listeners.append(self._storage_error)

    # -- lookups used by the handlers --------------------------------------------------------
    def leader_replica(self, topic: str, index: int) -> Replica:
        """The partition's replica if this broker leads it; else ApiError(NOT_LEADER_OR_FOLLOWER)."""
        r = self.replicas.get((topic, index))
        if r is None or r.role != LEADER or self.dir_offline is not None:
            raise ApiError(ErrorCode.not_leader_or_follower, f"broker {self.node_id} does not lead {topic}-{index}")
        return r

    def latest_epoch(self, topic: str, index: int) -> int:
        r = self.replicas.get((topic, index))
        return r.epochs.latest_epoch if r is not None else -1

    def min_insync_replicas(self, topic: str) -> int:
        meta = self.broker.store.get_topic(topic)
        if meta is not None and "min.insync.replicas" in meta.configs:
            return int(meta.configs["min.insync.replicas"])
        return int(self.config["min.insync.replicas"])

    # -- applying metadata ----------------------------------------------------------------------
    def apply(self, snap: Snapshot) -> None:
        self._sync_topics(snap)
        me, reg = self.node_id, self.node.registration
        now = self.broker.clock.now_ms()
        seen: set[tuple[str, int]] = set()
        for key, (state, rev) in snap.partitions.items():
            if key[0] not in snap.topics:
                continue
            if me not in state.replicas:
                if key not in self.replicas and self.dir_offline is None:
                    self._empty_stray_log(key)
                continue
            try:
                plog = self.broker.store.partition(*key)
            except ApiError:
                continue
            seen.add(key)
            r = self.replicas.get(key)
            if r is None or r.plog is not plog:
                r = self.replicas[key] = Replica(key[0], key[1], plog)
            r.state, r.mod_revision = state, rev
            if self.dir_offline is not None:
                self._go_offline(r)
            elif state.leader == me and state.leader_registration == reg and reg != 0:
                if r.role != LEADER or r.leader_epoch != state.leader_epoch:
                    self._become_leader(r, state, now)
                else:
                    self.maybe_advance_hw(r)
            elif state.leader >= 0 and state.leader != me:
                if r.role != FOLLOWER or r.leader_epoch != state.leader_epoch or r.leader_id != state.leader:
                    self._become_follower(r, state, snap)
            else:
                self._go_offline(r)
        for key in list(self.replicas):
            if key not in seen:
                self._go_offline(self.replicas.pop(key))
                if key[0] in snap.topics and self.dir_offline is None:
                    self._empty_stray_log(key)  # reassigned away from this broker
        for leader_id, f in list(self.fetchers.items()):
            # A fetcher with partitions stays while its leader is unregistered (partitions
            # move when a new leader is elected) or at another address (handled when they
            # re-add): only a fetcher with nothing to fetch goes.
            if not f.partitions:
                del self.fetchers[leader_id]
                asyncio.ensure_future(f.close())

    def _sync_topics(self, snap: Snapshot) -> None:
        store = self.broker.store
        now = self.broker.clock.now_ms()
        for name, rec in snap.topics.items():
            meta = store.get_topic(name)
            if meta is not None and meta.topic_id != rec.topic_id:
                self._drop_topic(name)
                meta = None
            if meta is None:
                try:
                    store.create_topic(name, rec.num_partitions, rec.configs, topic_id=rec.topic_id, now_ms=now)
                except ApiError as e:
                    log.error("cannot create topic %s locally: %s", name, e)
                continue
            if rec.num_partitions > meta.num_partitions:
                self.broker.create_partitions(name, rec.num_partitions)
            if rec.configs != meta.configs:
                try:
                    store.alter_topic_configs(name, set=rec.configs,
                                              delete=[k for k in meta.configs if k not in rec.configs])
                except ApiError as e:
                    log.error("cannot apply configs of topic %s: %s", name, e)
        for meta in store.topics():
            if meta.name not in snap.topics and meta.name not in INTERNAL_TOPICS:
                self._drop_topic(meta.name)

    def _empty_stray_log(self, key: tuple[str, int]) -> None:
        """Delete the records of a partition this broker is not a replica of (it was moved away,
        maybe while this broker was down): the local log becomes empty, as on any non-replica.

        Done once the log's pending fsync (a follower's last fetch, a coordinator's last
        write) has finished, and only if this broker is still not a replica by then."""
        try:
            plog = self.broker.store.partition(*key)
        except ApiError:
            return
        if (plog.log_end_offset == 0 and plog.log_start_offset == 0) or key in self._emptying:
            return
        self._emptying.add(key)

        async def empty() -> None:
            try:
                with contextlib.suppress(Exception):  # its records are deleted anyway
                    await self.broker.flusher.durable(plog, plog.log_end_offset)
                state = self.node.store.snapshot.state(*key)
                if state is None or self.node_id in state.replicas or key in self.replicas:
                    return
                try:
                    if self.broker.store.partition(*key) is not plog:
                        return
                except ApiError:
                    return
                log.info("%s-%d is no longer a replica on this broker: deleting its log (end offset %d)",
                         key[0], key[1], plog.log_end_offset)
                try:
                    self.broker.store.empty_partition(*key, now_ms=self.broker.clock.now_ms())
                except (ApiError, OSError) as e:
                    log.error("cannot delete the log of %s-%d: %s", key[0], key[1], e)
            finally:
                self._emptying.discard(key)

        asyncio.ensure_future(empty())

    def _drop_topic(self, name: str) -> None:
        for key in [k for k in self.replicas if k[0] == name]:
            self._go_offline(self.replicas.pop(key))
        self.broker.delete_topic(name)

    def _become_leader(self, r: Replica, state: PartitionState, now_ms: int) -> None:
        self._leave_fetcher(r)
        r.role, r.leader_id, r.leader_epoch = LEADER, self.node_id, state.leader_epoch
        if r.epochs.assign(state.leader_epoch, r.plog.log_end_offset):
            r.save_epochs()
        r.follower_leo.clear()
        r.last_fetch_leo.clear()
        r.last_fetch_ms.clear()
        r.caught_up_ms = {b: now_ms for b in state.replicas if b != self.node_id}
        log.info("leading %s-%d at epoch %d (isr %s, log end %d)", r.topic, r.index, state.leader_epoch,
                 list(state.isr), r.plog.log_end_offset)
        self.maybe_advance_hw(r)
        self.broker.leadership_changed(r.topic, r.index, True)

    def _become_follower(self, r: Replica, state: PartitionState, snap: Snapshot) -> None:
        r.fail_waiters(ErrorCode.not_leader_or_follower)
        if r.role == LEADER:
            self.broker.leadership_changed(r.topic, r.index, False)
        self._leave_fetcher(r)
        r.role, r.leader_id, r.leader_epoch = FOLLOWER, state.leader, state.leader_epoch
        info = snap.brokers.get(state.leader)
        if info is None:
            return  # the leader is not registered (yet): the next snapshot tells
        f = self.fetchers.get(state.leader)
        if f is not None and (f.host, f.port) != (info.host, info.port):
            self.fetchers.pop(state.leader)
            asyncio.ensure_future(f.close())
            f = None
        if f is None:
            f = self.fetchers[state.leader] = Fetcher(self, state.leader, info.host, info.port)
        f.add((r.topic, r.index), state.leader_epoch, r.plog.log_end_offset)
        log.info("following %s-%d from broker %d at epoch %d", r.topic, r.index, state.leader,
                 state.leader_epoch)

    def _go_offline(self, r: Replica) -> None:
        r.fail_waiters(ErrorCode.not_leader_or_follower)
        if r.role == LEADER:
            self.broker.leadership_changed(r.topic, r.index, False)
        self._leave_fetcher(r)
        r.role, r.leader_id = OFFLINE, -1

    def _leave_fetcher(self, r: Replica) -> None:
        f = self.fetchers.get(r.leader_id)
        if f is not None:
            f.remove((r.topic, r.index))

    # -- follower side --------------------------------------------------------------------------
    def truncate_follower(self, key: tuple[str, int], asked_epoch: int, leader_epoch: int, end_offset: int) -> int:
        """Cut the divergent tail after the leader's OffsetsForLeaderEpoch answer; returns the new LEO."""
        r = self.replicas.get(key)
        if r is None:
            return 0
        leo = r.plog.log_end_offset
        if asked_epoch < 0:
            target = 0 if leo > r.plog.log_start_offset else leo
        else:
            target = divergence_offset(r.epochs, leader_epoch, end_offset, leo)
        if target < leo:
            log.info("truncating %s-%d from %d to %d (leader epoch %d ends at %d)", key[0], key[1], leo, target,
                     leader_epoch, end_offset)
            r.plog.truncate_to(target)
            r.epochs.truncate_from_end(r.plog.log_end_offset)
            r.save_epochs()
        return r.plog.log_end_offset

    def restart_follower_at(self, key: tuple[str, int], leader_log_start: int, *,
                            allow_earlier: bool = False) -> int | None:
        """The follower's log ends before the leader's log starts (a new replica of an old
        partition): start again with an empty log at the leader's log start. Returns the new LEO.

        ``allow_earlier``: the log is empty and the leader's first batch starts before it
        (the leader's log start is inside that batch): start at the batch's base offset."""
        r = self.replicas.get(key)
        if r is None or r.role != FOLLOWER:
            return None
        if leader_log_start <= r.plog.log_end_offset and not (
                allow_earlier and r.plog.log_end_offset == r.plog.log_start_offset):
            return None
        log.info("%s-%d: restarting this log (end offset %d) empty at %d, where the leader's log starts", key[0],
                 key[1], r.plog.log_end_offset, leader_log_start)
        try:
            r.plog = self.broker.store.empty_partition(*key, start_offset=leader_log_start,
                                                       now_ms=self.broker.clock.now_ms())
        except ApiError as e:
            log.error("cannot restart %s-%d at %d: %s", key[0], key[1], leader_log_start, e)
            return None
        r.plog.replicated_high_watermark = r.plog.log_start_offset
        r.epochs = LeaderEpochCache.from_text("")
        r.save_epochs()
        return r.plog.log_end_offset

    def append_follower(self, key: tuple[str, int], records: bytes, leader_hw: int,
                        leader_log_start: int = -1) -> int | None:
        """Append fetched batches; returns the new LEO, or None when the log must be truncated again.

        The follower's log start offset follows the leader's (DeleteRecords, retention) as
        far as its own high watermark.
        """
        r = self.replicas.get(key)
        if r is None or r.role != FOLLOWER or self.dir_offline is not None:
            return None
        plog = r.plog
        r.leader_hw = leader_hw
        if records and len(records) >= 8 and plog.log_end_offset == plog.log_start_offset:
            (base,) = _I64.unpack_from(records, 0)
            if 0 <= base < plog.log_end_offset:
                # an empty log started at the leader's log start, which is inside a batch:
                # start at that batch instead (Kafka's follower does the same)
                if self.restart_follower_at(key, base, allow_earlier=True) is None:
                    return None
                plog = r.plog
        if records:
            try:
                epochs = plog.append_as_follower(records, self.broker.clock.now_ms())
            except ApiError as e:
                if e.error_code == ErrorCode.kafka_storage_error:
                    self.broker.storage_errors.failed(key, e.message)  # the log directory goes offline
                else:
                    log.warning("follower append to %s-%d failed: %s", key[0], key[1], e)
                return None
            self.broker.storage_errors.ok(key)
            changed = False
            for epoch, base in epochs:
                changed |= r.epochs.follow(epoch, base)
            if changed:
                r.save_epochs()
            self.broker.append_waiters.notify(*key)
        hw = min(leader_hw, plog.log_end_offset)
        if plog.replicated_high_watermark is None or hw > plog.replicated_high_watermark:
            plog.replicated_high_watermark = hw
        if leader_log_start > plog.log_start_offset:
            try:
                plog.delete_records(min(leader_log_start, plog.high_watermark))
            except (ApiError, OSError) as e:
                log.warning("cannot follow the log start of %s-%d: %s", key[0], key[1], e)
        return plog.log_end_offset

    async def flush_followers(self, keys: list[tuple[str, int]]) -> None:
        """fsync fetched records per the flush policy; a failed fsync halts the broker (as Kafka),
        unless the log was replaced meanwhile (emptied: no longer a replica, or restarted at
        the leader's log start), whose files are gone."""
        now = self.broker.clock.now_ms()
        logs = []
        for key in keys:
            r = self.replicas.get(key)
            if r is not None and r.plog.flush_due(now):
                logs.append((key, r.plog))
        if not logs:
            return
        flusher = self.broker.flusher
        waits = [(key, plog, flusher.waiter(plog, plog.log_end_offset, background=True)) for key, plog in logs]
        for key, plog, waiter in waits:  # the flushes run together; no task per partition
            if waiter is None:
                continue
            try:
                await waiter
            except OSError as e:
                try:
                    current = self.broker.store.partition(*key)
                except ApiError:
                    current = None
                if current is plog:
                    self.broker.halt_on_storage_error(f"fsync of a follower log failed: {e}")
                    return
                log.info("fsync of the replaced log of %s-%d failed (%s); ignored", key[0], key[1], e)

    # -- leader side ----------------------------------------------------------------------------
    def on_follower_fetch(self, r: Replica, follower: int, fetch_offset: int, now_ms: int, *,
                          replica_epoch: int = -1, names_leader_epoch: bool = False) -> ErrorCode:
        """Record a follower's progress (Kafka's Replica.updateFetchState), then HW and ISR;
        a Fetch that is not a valid one of a follower's (``follower_fetch_error``) moves
        nothing and its error is returned."""
        leo = r.plog.log_end_offset
        state = r.state
        reg = self.node.store.snapshot.brokers.get(follower)
        code = follower_fetch_error(follower, fetch_offset, leader=self.node_id,
                                    replicas=state.replicas if state is not None else (),
                                    log_start=r.plog.log_start_offset, leader_leo=leo,
                                    names_leader_epoch=names_leader_epoch, replica_epoch=replica_epoch,
                                    registered_epoch=reg.registration if reg is not None else None)
        if code != ErrorCode.none:
            log.debug("fetch of %s-%d from replica %d at offset %d (broker epoch %d) refused: %s",
                      r.topic, r.index, follower, fetch_offset, replica_epoch, code.name)
            return code
        at = caught_up_at(fetch_offset, leo, r.last_fetch_leo.get(follower), r.last_fetch_ms.get(follower), now_ms)
        if at is not None:
            r.caught_up_ms[follower] = at
        r.last_fetch_leo[follower] = leo
        r.last_fetch_ms[follower] = now_ms
        r.follower_leo[follower] = fetch_offset
        if state is None:
            return ErrorCode.none
        if follower not in state.isr and follower in self.node.store.snapshot.live():
            start = r.epochs.entries[-1][1] if r.epochs.entries else 0
            if fetch_offset >= r.plog.high_watermark and fetch_offset >= start:
                self._write_isr(r, expand_isr(state, self.node_id, r.leader_epoch, follower))
        self.maybe_advance_hw(r)
        return ErrorCode.none

    def maybe_advance_hw(self, r: Replica) -> None:
        state = r.state
        if r.role != LEADER or state is None:
            return
        plog = r.plog
        old = plog.replicated_high_watermark or 0
        hw = high_watermark(old, plog.log_end_offset, self.node_id, state.isr, r.follower_leo)
        if hw > old:
            plog.replicated_high_watermark = hw
            if r.waiters:
                keep = []
                for offset, fut in r.waiters:
                    if offset <= hw:
                        if not fut.done():
                            fut.set_result(ErrorCode.none)
                    else:
                        keep.append((offset, fut))
                r.waiters = keep
            self.broker.append_waiters.notify(r.topic, r.index)

    async def wait_for_isr(self, r: Replica, end_offset: int, timeout_ms: int) -> ErrorCode:
        """acks=all: wait until the high watermark reaches ``end_offset``; the error to answer."""
        fut = self.isr_waiter(r, end_offset)
        if fut is not None:
            await asyncio.wait((fut,), timeout=max(timeout_ms, 1) / 1000)
        return self.isr_outcome(r, fut)

    def isr_waiter(self, r: Replica, end_offset: int) -> asyncio.Future[ErrorCode] | None:
        """acks=all: a future resolved when the high watermark reaches ``end_offset`` (with
        NONE) or the leadership ends (with the error); None when it is there already. Wait
        for it (with the request's timeout), then ask :meth:`isr_outcome`."""
        if r.plog.high_watermark >= end_offset:
            return None
        fut: asyncio.Future[ErrorCode] = asyncio.get_running_loop().create_future()
        r.waiters.append((end_offset, fut))
        return fut

    def isr_outcome(self, r: Replica, fut: asyncio.Future[ErrorCode] | None) -> ErrorCode:
        """The error to answer for a wait on :meth:`isr_waiter`'s future, done or timed out."""
        if fut is not None:
            if not fut.done():
                fut.cancel()  # dropped from the waiters when the high watermark passes it
                return ErrorCode.request_timed_out
            code = fut.result()
            if code != ErrorCode.none:
                return code
        if r.role != LEADER:
            return ErrorCode.not_leader_or_follower
        if r.state is not None and len(r.state.isr) < self.min_insync_replicas(r.topic):
            return ErrorCode.not_enough_replicas_after_append
        return ErrorCode.none

    def _write_isr(self, r: Replica, new: PartitionState | None) -> None:
        if new is None or r.isr_write_pending:
            return
        r.isr_write_pending = True
        rev = r.mod_revision

        async def write() -> None:
            try:
                ok = await self.node.store.compare_and_set([(r.topic, r.index, rev, new)])
                if ok:
                    log.info("ISR of %s-%d is now %s", r.topic, r.index, list(new.isr))
                    # apply at once: the HW may move (shrink) before the watch reports back
                    if r.mod_revision == rev and r.role == LEADER:
                        r.state = new
                        self.maybe_advance_hw(r)
            except Exception as e:
                log.warning("ISR change of %s-%d failed: %s", r.topic, r.index, e)
            finally:
                r.isr_write_pending = False

        asyncio.ensure_future(write())

    # -- a failed log directory (KIP-112) -----------------------------------------------------
    def _storage_error(self, what: Any, cause: str) -> None:
        """``broker.storage_errors`` reports a failed write: one to a partition log takes the
        log directory offline."""
        if isinstance(what, tuple) and len(what) == 2 and isinstance(what[1], int) and self.dir_offline is None:
            self.log_dir_failed(f"a write to {what[0]}-{what[1]} failed: {cause}")

    def log_dir_failed(self, reason: str) -> None:
        """Take the log directory offline, as Kafka does at the first storage error in one:
        stop leading and following every partition (at once: no more appends, no more
        fetches; the roles change on the next loop iteration, outside the failing call),
        tell the controller through the registration (``log_dir_offline``: it leaves every
        ISR and is elected nowhere), then probe the directory until writes succeed again."""
        if self.dir_offline is not None:
            return
        self.dir_offline = reason
        loop = asyncio.get_running_loop()
        if loop.time() - self._online_since < RELAPSE_S and self._online_since >= 0:
            self._probe_delay_s = min(PROBE_MAX_S, self._probe_delay_s * 2)
        else:
            self._probe_delay_s = PROBE_MIN_S
        log.error("log directory %s is offline (%s): this broker leads and follows none of its partitions until"
                  " writes to it succeed again", self.broker.data_dir, reason)
        loop.call_soon(self._stop_replicas)
        if self._dir_task is None:
            self._dir_task = asyncio.ensure_future(self._offline_dir())

    def _stop_replicas(self) -> None:
        if self.dir_offline is None:
            return
        for r in self.replicas.values():
            self._go_offline(r)
        for f in self.fetchers.values():
            asyncio.ensure_future(f.close())
        self.fetchers.clear()

    async def _offline_dir(self) -> None:
        """Tell the controller, probe until the directory takes writes, tell the controller again."""
        try:
            await self._set_offline_flag(True)
            while True:
                await asyncio.sleep(self._probe_delay_s)
                failed = [f"{k[0]}-{k[1]}" for k, r in self.replicas.items() if r.plog.offline is not None]
                if failed:
                    # memory ahead of the disk after a failed fsync: only a restart recovers
                    if self._probe_delay_s < PROBE_MAX_S:
                        log.error("log directory stays offline until a restart: an fsync of %s failed",
                                  ", ".join(failed[:5]))
                        self._probe_delay_s = PROBE_MAX_S
                    continue
                error = await asyncio.to_thread(self._probe, self.broker.data_dir,
                                                int(self.config["replica.fetch.max.bytes"]))
                if error is None:
                    break
                log.debug("log directory probe failed: %s", error)
            await self._set_offline_flag(False)
            self.dir_offline = None
            self._online_since = asyncio.get_running_loop().time()
            log.warning("log directory %s takes writes again: following and leading its partitions again",
                        self.broker.data_dir)
            self.node.store.mark_stale()  # apply the current metadata: follow (and catch up), lead
        finally:
            self._dir_task = None

    async def _set_offline_flag(self, offline: bool) -> None:
        while True:
            try:
                await self.node.store.update_registration(log_dir_offline=offline)
                return
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.warning("cannot mark the log directory %s in etcd (%s); retrying",
                            "offline" if offline else "online", e)
                await asyncio.sleep(0.5)

    @staticmethod
    def _probe(data_dir: Any, size: int) -> str | None:
        """Write ``size`` bytes to a file in the directory, fsync and delete it; None if it worked."""
        path = data_dir / PROBE_FILE
        try:
            try:
                with open(path, "wb") as f:
                    f.write(b"\0" * max(size, 4096))
                    f.flush()
                    os.fsync(f.fileno())
            finally:
                path.unlink(missing_ok=True)
        except OSError as e:
            return str(e)
        return None

    # -- periodic ISR shrink ------------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.ensure_future(self._shrink_loop())

    async def _shrink_loop(self) -> None:
        lag = self.config["replica.lag.time.max.ms"]
        while True:
            await asyncio.sleep(max(0.05, lag / 2000))
            now = self.broker.clock.now_ms()
            for r in list(self.replicas.values()):
                if r.role != LEADER or r.state is None:
                    continue
                out = lagging(r.state.isr, self.node_id, r.caught_up_ms, now, lag)
                if out:
                    log.info("followers %s of %s-%d lag more than %d ms", out, r.topic, r.index, lag)
                    self._write_isr(r, shrink_isr(r.state, self.node_id, r.leader_epoch, out))

    def offset_lag(self, topic: str, index: int) -> int:
        """How far this replica's log end is behind the partition's high watermark: 0 on the
        leader; on a follower, the leader's high watermark in its last Fetch answer minus
        this log's end (0 before the first answer)."""
        r = self.replicas.get((topic, index))
        if r is None or r.role != FOLLOWER or r.leader_hw < 0:
            return 0
        return max(0, r.leader_hw - r.plog.log_end_offset)

    def leaderships(self) -> int:
        return sum(1 for r in self.replicas.values() if r.role == LEADER)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        if self._dir_task is not None:
            self._dir_task.cancel()
        for r in self.replicas.values():
            r.fail_waiters(ErrorCode.not_leader_or_follower)
        for f in list(self.fetchers.values()):
            await f.close()
        self.fetchers.clear()
