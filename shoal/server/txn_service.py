"""The transaction coordinator's shell: ``__transaction_state``, markers, timeouts.

Theory of operation
-------------------
``TransactionService`` (``broker.extensions["transactions"]``, created by an ``on_start``
hook) owns a :class:`~shoal.server.runtime.CoordinatorRuntime` of
:class:`~shoal.transactions.coordinator.TransactionCoordinatorShard` over
``__transaction_state`` (``transaction.state.log.num.partitions`` partitions, compacted,
``transaction.state.log.segment.bytes``), created on first use (FindCoordinator for a
transactional id, or InitProducerId with one), as Kafka creates it. A transactional id lives in partition
``abs(hash(id)) % partitions`` (Kafka's rule). Every write goes through
``runtime.apply``: appended, fsynced and replayed before the answer is computed from it.

Ending a transaction (EndTxn) on one broker: EndTxn is answered once its PrepareCommit /
PrepareAbort record is durable, as Kafka answers once Prepare* is replicated: the outcome
is decided. The commit or abort markers are then appended to every partition of the
transaction (directly to this broker's logs, waking parked Fetch requests), without an
fsync each; a task waits until they are durable (the flusher's worker threads fsync the
partitions concurrently, shared with Produce's fsyncs) and records CompleteCommit /
CompleteAbort, without waiting for that record's own fsync (it shares the next one of
its partition: if a crash loses it, the replay finds the Prepare state and writes the
markers again; a second marker for a closed transaction changes nothing). The completion
is never written before the markers are durable, so a crash cannot leave a completed
transaction without its markers. From the Prepare record's append until the completion
is recorded, a request of the same transactional id (AddPartitionsToTxn,
AddOffsetsToTxn, InitProducerId, EndTxn) is *parked* (``after_completion``), then served
as if it had come a moment later, where Kafka answers CONCURRENT_TRANSACTIONS and the
client retries after a backoff (librdkafka and the Java producer: 20 ms for a
transaction's first AddPartitionsToTxn, ``retry.backoff.ms`` for the others). A
request still parked after ``PARKED_REQUEST_WAIT_S`` is served anyway
(CONCURRENT_TRANSACTIONS); in cluster mode requests wait the same way while the markers
are being sent. A fenced or timed-out
transaction is ended the same way; at load, the transactions found in a Prepare state are
completed before the first request is served (their markers fsynced one by one).
AddPartitionsToTxn waits for its record's fsync, shared with concurrent writes
(``apply_durable``); that fsync also covers the completion it may have been parked
behind, appended before it. A marker that cannot be written (a full disk) leaves the
transaction in its Prepare state (clients get CONCURRENT_TRANSACTIONS) and is retried
every second; a restart finishes what a crash interrupted (the shard lists its Prepare
states after the replay).

Expiry: every ``transaction.remove.expired.transaction.cleanup.interval.ms`` each shard
forgets the transactional ids idle for ``transactional.id.expiration.ms`` (tombstones).

Timeouts: one ``loop.call_later`` at the earliest deadline of any open transaction
(its start plus its ``transaction.timeout.ms``); then every expired transaction is
fenced and aborted (:meth:`TransactionCoordinatorShard.fence_and_abort`).

Cluster mode (``metadata.store`` set): ``__transaction_state`` is a replicated topic
(``transaction.state.log.replication.factor``, ``min.insync.replicas`` from
``transaction.state.log.min.isr``, created by the first FindCoordinator for a
transactional id) and this service serves a partition only while this broker leads it
(``on_leadership_change``): becoming leader replays the partition into a fresh shard
(COORDINATOR_LOAD_IN_PROGRESS meanwhile), losing it drops the shard; requests for a
transactional id of a partition served elsewhere are answered NOT_COORDINATOR. Every
state change is answered once its records are on every in-sync replica
(``runtime.apply_durable``); a new producer id comes from the cluster's allocator.
Markers go to each partition's leader as WriteTxnMarkers (one request per leader, over
:class:`~shoal.cluster.peer.PeerConnection`, the coordinator epoch being the leader epoch
of the transaction's ``__transaction_state`` partition); a partition whose leader is
unknown, moved or answers an error is retried (metadata read again, growing backoff up to
a second) until every marker is written, and only then is CompleteCommit /
CompleteAbort recorded. A coordinator that takes over a partition sends the markers of
every transaction it finds in PrepareCommit / PrepareAbort again. EndTxn is answered
once the Prepare record is replicated and the markers are written, or after
``END_TXN_MARKER_WAIT_S`` with the markers still being retried (the outcome is decided;
as Kafka, which answers before its markers). A TxnOffsetCommit's group coordinator asks
the transactional id's coordinator whether the transaction holds the group's offsets
partition, as a Produce's first batch is asked about (below).

KIP-890 part 1 (no hanging transaction): a partition leader asks the coordinator
before appending a producer's first transactional batch on a partition (one with no
open transaction of that producer there): :meth:`TransactionService.verify_in_transaction`,
directly when this broker coordinates the id, else AddPartitionsToTxn v5 VerifyOnly
over a :class:`_Verifier` per coordinator (one request in flight, the questions that
came meanwhile sent together). A :class:`VerificationGuard` per question is voided by a
marker of the producer written to the partition meanwhile (WriteTxnMarkers calls
:meth:`TransactionService.marker_written`), so a stale answer never lets a batch into
the next transaction. :func:`verification_error` maps the answer to the Produce error
as Kafka does. Later batches of the transaction are checked by the partition's
producer state (markers bump the epoch).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from typing import Any

from ..cluster.peer import PeerConnection
from ..coordinator.partitioning import coordinator_partition
from ..coordinator.records import TRANSACTION_STATE
from ..coordinator.result import Result
from ..errors import ApiError, ErrorCode
from ..protocol.batch import CorruptBatchError, read_header
from ..protocol.codec import codec_for
from ..protocol.entities import make, sub
from ..transactions.coordinator import (
    MAX_EPOCH,
    Completion,
    TransactionCoordinatorShard,
    TxnState,
)
from .broker import on_leadership_change, on_start, on_stop
from .internal_topics import OFFSETS_TOPIC
from .runtime import CoordinatorRuntime

log = logging.getLogger("shoal.transactions")

__all__ = [
    "TRANSACTION_STATE",
    "TransactionService",
    "check_transactional_produce",
    "has_ongoing_transaction",
    "transaction_service",
    "verification_error",
]

RETRY_MARKERS_S = 1.0
SHUTDOWN_WAIT_S = 5.0
"""A clean shutdown waits at most this long for transactions being completed."""
PARKED_REQUEST_WAIT_S = 5.0
"""How long a request of a transactional id waits for its transaction's completion to be recorded."""
END_TXN_MARKER_WAIT_S = 10.0
MARKER_REQUEST_TIMEOUT_S = 30.0
WRITE_TXN_MARKERS, WRITE_TXN_MARKERS_VERSION = 27, 1
ADD_PARTITIONS_TO_TXN, VERIFY_VERSION = 24, 5
VERIFY_TIMEOUT_S = 30.0

# A marker refused for these reasons is retried (the leader moved, or has too few replicas in sync)
_RETRIABLE_MARKER_ERRORS = frozenset({
    ErrorCode.not_leader_or_follower, ErrorCode.not_enough_replicas, ErrorCode.not_enough_replicas_after_append,
    ErrorCode.request_timed_out, ErrorCode.kafka_storage_error, ErrorCode.unknown_server_error,
    ErrorCode.leader_not_available, ErrorCode.network_exception, ErrorCode.fenced_leader_epoch,
    ErrorCode.unknown_leader_epoch, ErrorCode.coordinator_load_in_progress,
})


def transaction_service(broker: Any) -> TransactionService | None:
    """The service, or None before it started."""
    return broker.extensions.get("transactions")


class TransactionService:
    def __init__(self, broker: Any) -> None:
        self.broker = broker
        cfg = broker.config
        self.runtime: CoordinatorRuntime[TransactionCoordinatorShard] = CoordinatorRuntime(
            broker, TRANSACTION_STATE, "transaction.state.log.num.partitions", self._new_shard,
            topic_configs={"cleanup.policy": "compact",
                           "segment.bytes": str(cfg["transaction.state.log.segment.bytes"])},
            follow_leadership=True)
        self.clustered = self.runtime.follow_leadership
        """Cluster mode: shards follow the leadership of their partitions; markers go over the network."""
        self._sending: dict[str, asyncio.Future[bool]] = {}
        """Transactional id -> the task writing its markers and recording its completion
        (one broker: waiting for the markers' fsync; cluster mode: sending them)."""
        self._peers: dict[int, tuple[str, int, PeerConnection, asyncio.Lock]] = {}
        self._verifiers: dict[int, _Verifier] = {}
        """Cluster mode: coordinator node id -> the batcher of this leader's verifications (KIP-890)."""
        self._guards: dict[tuple[str, int, int], set[VerificationGuard]] = {}
        """(topic, partition, producer id) -> the verifications under way there; a marker voids them."""
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: int | None = None
        self._retry: asyncio.TimerHandle | None = None
        self._cleanup: asyncio.TimerHandle | None = None
        self._closed = False

    def _new_shard(self, index: int) -> TransactionCoordinatorShard:
        return TransactionCoordinatorShard(self.broker.config["transaction.max.timeout.ms"])

    def now_ms(self) -> int:
        return self.broker.clock.now_ms()

    # ------------------------------------------------------------ start and stop
    @property
    def loaded(self) -> bool:
        return bool(self.runtime.shards)

    def load(self) -> None:
        """At start: replay ``__transaction_state`` if it exists. As Kafka, the topic is
        created only when transactions are first used (:meth:`ensure_loaded`). Cluster
        mode: empty shards, loaded one by one as this broker becomes their leader."""
        if self.clustered:
            self.runtime.load()
            return
        if self.broker.store.get_topic(TRANSACTION_STATE) is not None:
            self._load_now()

    def ensure_loaded(self) -> None:
        """Create (and load) ``__transaction_state`` if it does not exist yet (one broker;
        in cluster mode FindCoordinator creates it in the cluster metadata)."""
        if not self.runtime.shards and not self.clustered:
            self._load_now()

    def _load_now(self) -> None:
        self.runtime.load()
        pending = [c for shard in self.runtime.shards for c in shard.pending_completions()]
        for c in pending:
            self._finish(c)
        self._arm()
        self._schedule_cleanup()
        count = sum(len(s.txns) for s in self.runtime.shards)
        log.info("transaction coordinator loaded %d transactional id(s)%s", count,
                 f", completed {len(pending)} interrupted transaction(s)" if pending else "")

    async def drain(self, timeout_s: float) -> None:
        """A clean shutdown: let the transactions whose markers and completion are being
        written finish (at most ``timeout_s``), so that the log ends in their Complete*
        state rather than in Prepare* for the next start to finish."""
        tasks = [t for t in self._sending.values() if not t.done()]
        if tasks:
            await asyncio.wait(tasks, timeout=timeout_s)

    def close(self) -> None:
        self._closed = True
        for h in (self._timer, self._retry, self._cleanup):
            if h is not None:
                h.cancel()
        self._timer = self._retry = self._cleanup = None
        for task in self._sending.values():
            task.cancel()
        self._sending.clear()
        for _h, _p, conn, _lock in self._peers.values():
            conn.close()
        self._peers.clear()
        for v in self._verifiers.values():
            v.close()
        self._verifiers.clear()

    # ------------------------------------------------------------ cluster mode
    def leadership_changed(self, topic: str, index: int, leader: bool) -> None:
        if topic != TRANSACTION_STATE or self._closed or not self.clustered:
            return
        n = self.runtime.sync_partition_count()
        if not 0 <= index < n:
            return
        if leader:
            self.runtime.schedule_load(index, lambda: self._closed, self._partition_loaded)
        else:
            self.runtime.unload_partition(index)

    def _partition_loaded(self, index: int) -> None:
        """This broker leads ``__transaction_state``-``index`` now: finish what the previous
        coordinator left in PrepareCommit / PrepareAbort, and watch the timeouts."""
        shard = self.runtime.shards[index]
        pending = shard.pending_completions()
        for c in pending:
            self._start_markers(c)
        self._arm()
        if self._cleanup is None:
            self._schedule_cleanup()
        log.info("transaction coordinator for %s-%d: %d transactional id(s)%s", TRANSACTION_STATE, index,
                 len(shard.txns), f", completing {len(pending)} transaction(s)" if pending else "")

    def owner_error(self, txn_id: str) -> ErrorCode:
        """NOT_COORDINATOR / COORDINATOR_LOAD_IN_PROGRESS when this broker does not serve ``txn_id``."""
        try:
            self.runtime.check_owner(self.partition_for(txn_id))
        except ApiError as e:
            return e.error_code
        return ErrorCode.none

    def _schedule_cleanup(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        interval = self.broker.config["transaction.remove.expired.transaction.cleanup.interval.ms"] / 1000
        self._cleanup = loop.call_later(interval, self._remove_expired)

    def _remove_expired(self) -> None:
        self._cleanup = None
        if self._closed:
            return
        expiration = self.broker.config["transactional.id.expiration.ms"]
        for i, shard in enumerate(self.runtime.shards):
            result = shard.expire_ids(self.now_ms(), expiration)
            if not result.records:
                continue
            try:
                self.runtime.apply(i, result)
                log.info("forgot %d idle transactional id(s): %s", len(result.answer()), ", ".join(result.answer()))
            except ApiError as e:
                log.warning("cannot forget idle transactional ids: %s", e.message)
        self._schedule_cleanup()

    # ------------------------------------------------------------ routing
    def partition_for(self, txn_id: str) -> int:
        return coordinator_partition(txn_id, self.runtime.num_partitions)

    def shard_of(self, txn_id: str) -> TransactionCoordinatorShard:
        return self.runtime.shards[self.partition_for(txn_id)]

    def find(self, txn_id: str) -> Any:
        """The metadata of ``txn_id``, or None (also before the topic exists)."""
        return self.shard_of(txn_id).txns.get(txn_id) if self.loaded else None

    def _apply(self, txn_id: str, result: Result[Any]) -> Result[Any]:
        return self.runtime.apply(self.partition_for(txn_id), result)

    # ------------------------------------------------------------ the operations
    def init_producer_id(self, txn_id: str, timeout_ms: int, producer_id: int,
                         producer_epoch: int) -> tuple[ErrorCode, int, int]:
        self.ensure_loaded()
        now = self.now_ms()
        result = self.shard_of(txn_id).init_producer_id(txn_id, timeout_ms, producer_id, producer_epoch, now,
                                                        self.broker.producer_ids.allocate)
        self._apply(txn_id, result)
        if result.after is not None:  # an open transaction of an earlier instance: fenced and aborted
            log.info("transactional id %s: a new producer instance fences the open transaction; aborting it",
                     txn_id)
            self._complete(result.after)
        return result.answer()

    async def init_producer_id_clustered(self, txn_id: str, timeout_ms: int, producer_id: int,
                                         producer_epoch: int) -> tuple[ErrorCode, int, int]:
        """Cluster mode: as :meth:`init_producer_id`, answered once replicated; a new producer
        id comes from the cluster's allocator (fetched first when the shard will need one)."""
        p = self.partition_for(txn_id)
        result: Result[tuple[ErrorCode, int, int]] | None = None
        try:
            self.runtime.check_owner(p)
            m = self.runtime.shards[p].txns.get(txn_id)
            fresh: list[int] = []
            if m is None or m.state == TxnState.DEAD or m.producer_epoch >= MAX_EPOCH:
                fresh.append(await self.broker.cluster.allocate_producer_id())
                self.runtime.check_owner(p)

            def allocate() -> int:
                if not fresh:  # the state changed while the id was being allocated
                    raise ApiError(ErrorCode.concurrent_transactions, "retry")
                return fresh.pop()

            shard = self.runtime.shards[p]
            result = shard.init_producer_id(txn_id, timeout_ms, producer_id, producer_epoch, self.now_ms(),
                                            allocate)
            await self.runtime.apply_durable(p, result)
        except ApiError as e:
            self._resume_if_prepared(None if result is None else result.after)
            return e.error_code, -1, -1
        if result.after is not None:
            log.info("transactional id %s: a new producer instance fences the open transaction; aborting it",
                     txn_id)
            self._start_markers(result.after)
        return result.answer()

    async def add_partitions(self, txn_id: str, producer_id: int, producer_epoch: int,
                             partitions: list[tuple[str, int]], tv2: bool = False) -> ErrorCode:
        """Answered once the new partitions are durable (an fsync shared with concurrent writes;
        in cluster mode, on every in-sync replica). ``tv2``: added on behalf of a producer of
        transaction version 2 by its partition leader or group coordinator."""
        self.ensure_loaded()
        await self.after_completion(txn_id)
        if (code := self.owner_error(txn_id)) != ErrorCode.none:
            return code
        result = self.shard_of(txn_id).add_partitions(txn_id, producer_id, producer_epoch, partitions,
                                                      self.now_ms(), tv2)
        try:
            await self.runtime.apply_durable(self.partition_for(txn_id), result)
        except ApiError as e:
            if not self.clustered:
                raise
            return e.error_code
        if result.records:
            self._arm()
        return result.answer()

    async def end_txn(self, txn_id: str, producer_id: int, producer_epoch: int, commit: bool,
                      tv2: bool = False) -> ErrorCode:
        """One broker: answered once PrepareCommit / PrepareAbort is durable, the markers
        appended (their fsync and the completion follow in a task). Cluster mode: once the
        Prepare record is replicated and the markers are written (or after
        ``END_TXN_MARKER_WAIT_S``). ``tv2``: EndTxn v5 (the epoch is bumped;
        :meth:`producer_after_end` says to what)."""
        self.ensure_loaded()
        await self.after_completion(txn_id)
        if (code := self.owner_error(txn_id)) != ErrorCode.none:
            return code
        p = self.partition_for(txn_id)
        fresh: list[int] = []
        m = self.shard_of(txn_id).txns.get(txn_id)
        if tv2 and m is not None and m.producer_epoch >= MAX_EPOCH:  # a new producer id at the completion
            if self.clustered:
                fresh.append(await self.broker.cluster.allocate_producer_id())
                if (code := self.owner_error(txn_id)) != ErrorCode.none:
                    return code
            else:
                fresh.append(self.broker.producer_ids.allocate())
        result = self.shard_of(txn_id).end_txn(txn_id, producer_id, producer_epoch, commit, self.now_ms(), tv2,
                                               fresh.pop if fresh else None)
        if result.after is not None and not self.clustered:
            # Prepare* is replayed now; from here on requests of txn_id are parked until the
            # completion is recorded. The answer waits only for Prepare*'s fsync: the outcome
            # is decided, as Kafka answers; if a marker cannot be written now it is retried,
            # and clients see CONCURRENT_TRANSACTIONS meanwhile
            self.runtime.apply_deferred(p, result)
            prepared: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._track(txn_id, asyncio.ensure_future(self._prepare_and_complete(p, result.after, prepared)))
            await prepared
            return result.answer()
        try:
            await self.runtime.apply_durable(p, result)
        except ApiError as e:
            if not self.clustered:
                raise
            self._resume_if_prepared(result.after)
            return e.error_code
        if result.after is not None:
            task = self._start_markers(result.after)
            try:
                await asyncio.wait_for(asyncio.shield(task), END_TXN_MARKER_WAIT_S)
            except TimeoutError:
                pass  # decided and replicated: the markers keep being retried
        return result.answer()

    def producer_after_end(self, txn_id: str) -> tuple[int, int]:
        """EndTxn v5's producer id and epoch for ``txn_id`` (-1, -1 if unknown here)."""
        m = self.find(txn_id) if self.runtime.owns(self.partition_for(txn_id)) else None
        return (-1, -1) if m is None else TransactionCoordinatorShard.producer_after_end(m)

    async def after_completion(self, txn_id: str) -> None:
        """Park a request of ``txn_id`` while its transaction's markers are being written:
        return once its completion is recorded (or the writing failed, or after
        ``PARKED_REQUEST_WAIT_S``); the caller then serves the request from the state."""
        task = self._sending.get(txn_id)
        if task is not None and not task.done():
            await asyncio.wait((task,), timeout=PARKED_REQUEST_WAIT_S)

    def verify_partitions(self, txn_id: str, producer_id: int, producer_epoch: int,
                          partitions: list[tuple[str, int]]) -> dict[tuple[str, int], ErrorCode]:
        """The coordinator's answer to a partition leader's verification (AddPartitionsToTxn
        v4+ VerifyOnly): see :meth:`TransactionCoordinatorShard.verify_partitions`;
        NOT_COORDINATOR / COORDINATOR_LOAD_IN_PROGRESS when this broker does not serve ``txn_id``."""
        if (code := self.owner_error(txn_id)) != ErrorCode.none:
            return dict.fromkeys(partitions, code)
        if not self.loaded:
            return dict.fromkeys(partitions, ErrorCode.invalid_producer_id_mapping if txn_id
                                 else ErrorCode.invalid_request)
        return self.shard_of(txn_id).verify_partitions(txn_id, producer_id, producer_epoch, partitions)

    # ------------------------------------------------------------ KIP-890 part 1: the leader's side
    def start_verification(self, topic: str, partition: int, producer_id: int) -> VerificationGuard:
        """Before asking the coordinator about a producer's first transactional batch on a
        partition: a guard that a marker for that producer there voids meanwhile (Kafka's
        VerificationGuard), so a stale answer never lets a batch into the next transaction."""
        guard = VerificationGuard()
        self._guards.setdefault((topic, partition, producer_id), set()).add(guard)
        return guard

    def end_verification(self, topic: str, partition: int, producer_id: int, guard: VerificationGuard) -> bool:
        """The append is decided: forget ``guard``; whether no marker voided it."""
        key = (topic, partition, producer_id)
        guards = self._guards.get(key)
        if guards is not None:
            guards.discard(guard)
            if not guards:
                del self._guards[key]
        return guard.valid

    def marker_written(self, topic: str, partition: int, producer_id: int) -> None:
        """A commit or abort marker of ``producer_id`` was appended to this leader's partition."""
        for guard in self._guards.pop((topic, partition, producer_id), ()):
            guard.valid = False

    async def verify_in_transaction(self, txn_id: str, producer_id: int, producer_epoch: int,
                                    partitions: list[tuple[str, int]],
                                    add: bool = False) -> dict[tuple[str, int], ErrorCode]:
        """Cluster mode, a partition leader before appending a producer's first transactional
        batch to ``partitions`` (or a group coordinator before a TxnOffsetCommit): the
        transaction coordinator's answer per partition (its codes, mapped by the caller): asked directly when this broker coordinates ``txn_id``, else with
        AddPartitionsToTxn v5 VerifyOnly, batched per coordinator as Kafka's
        AddPartitionsToTxnManager does. COORDINATOR_NOT_AVAILABLE when the coordinator is
        unknown, NETWORK_EXCEPTION when it does not answer. ``add`` (a producer of
        transaction version 2): add the partitions to its transaction instead of asking."""
        p = self.partition_for(txn_id)
        if not self.clustered or self.runtime.owns(p):
            if add:
                try:
                    code = await self.add_partitions(txn_id, producer_id, producer_epoch, partitions, tv2=True)
                except ApiError as e:  # one broker: the record could not be written
                    code = e.error_code
                return dict.fromkeys(partitions, code)
            return self.verify_partitions(txn_id, producer_id, producer_epoch, partitions)
        view = self.broker.cluster.partition(TRANSACTION_STATE, p)
        node = -1 if view is None else view.leader
        if node < 0 or self._closed:
            return dict.fromkeys(partitions, ErrorCode.coordinator_not_available)
        verifier = self._verifiers.get(node)
        if verifier is None:
            verifier = self._verifiers[node] = _Verifier(self, node)
        future = verifier.submit(txn_id, producer_id, producer_epoch, partitions, not add)
        try:
            return await asyncio.wait_for(asyncio.shield(future), VERIFY_TIMEOUT_S)
        except TimeoutError:
            return dict.fromkeys(partitions, ErrorCode.network_exception)

    def _peer(self, node_id: int, peers: dict[int, Any], purpose: str) -> tuple[PeerConnection, asyncio.Lock] | None:
        endpoint = next((e for e in self.broker.cluster.brokers() if e.node_id == node_id), None)
        if endpoint is None:
            return None
        peer = peers.get(node_id)
        if peer is None or (peer[0], peer[1]) != (endpoint.host, endpoint.port):
            if peer is not None:
                peer[2].close()
            conn = PeerConnection(endpoint.host, endpoint.port, f"shoal-{purpose}-{self.broker.node_id}",
                                  getattr(self.broker, "peer_security", None))
            peer = peers[node_id] = (endpoint.host, endpoint.port, conn, asyncio.Lock())
        return peer[2], peer[3]

    # ------------------------------------------------------------ markers
    def _complete(self, c: Completion) -> None:
        """Write the markers of ``c`` and record its completion: appended now and completed
        once durable (one broker), or by a task that sends them to the partitions' leaders
        (cluster mode). Requests of its transactional id wait for it meanwhile."""
        if self.clustered:
            self._start_markers(c)
        else:
            self._complete_in_background(c)

    def _resume_if_prepared(self, c: Completion | None) -> None:
        """Cluster mode, a Prepare record appended and replayed whose replication wait failed:
        its markers are still to be sent (after the record is replicated), or the
        transaction would stay in its Prepare state until the next coordinator."""
        if c is None or not self.runtime.owns(self.partition_for(c.transactional_id)):
            return
        m = self.shard_of(c.transactional_id).txns.get(c.transactional_id)
        want = TxnState.PREPARE_COMMIT if c.commit else TxnState.PREPARE_ABORT
        if m is not None and m.state == want and (m.producer_id, m.producer_epoch) == (c.producer_id,
                                                                                       c.producer_epoch):
            self._start_markers(c)

    def _start_markers(self, c: Completion) -> asyncio.Future[bool]:
        """Cluster mode: the task writing ``c``'s markers (one per transactional id at a time)."""
        task = self._sending.get(c.transactional_id)
        if task is not None and not task.done():
            return task
        task = asyncio.ensure_future(self._send_markers(c))
        self._sending[c.transactional_id] = task
        task.add_done_callback(functools.partial(self._sent, c.transactional_id))
        return task

    async def _send_markers(self, c: Completion) -> bool:
        """Cluster mode: WriteTxnMarkers to the leader of every partition of ``c`` until each is
        written, then CompleteCommit / CompleteAbort. False when this broker stopped
        coordinating the transactional id first (the next coordinator sends them again)."""
        p = self.partition_for(c.transactional_id)
        remaining = set(c.partitions)
        attempt = 0
        prepared_replicated = False
        while True:
            if self._closed or self.broker.shutting_down or not self.runtime.owns(p):
                return False
            try:
                if not prepared_replicated:  # the decision is on every in-sync replica before any marker
                    await self.runtime.wait_durable(p)
                    prepared_replicated = True
                coordinator_epoch = self.broker.replicas.leader_replica(TRANSACTION_STATE, p).leader_epoch
            except ApiError as e:
                if e.error_code in (ErrorCode.not_coordinator, ErrorCode.not_leader_or_follower):
                    return False
                coordinator_epoch = -1
            if prepared_replicated and coordinator_epoch >= 0:
                by_leader: dict[int, list[tuple[str, int]]] = {}
                for topic, i in sorted(remaining):
                    meta = self.broker.store.get_topic(topic)
                    if meta is None or not 0 <= i < meta.num_partitions:
                        remaining.discard((topic, i))  # deleted meanwhile: nothing to mark
                        continue
                    view = self.broker.cluster.partition(topic, i)
                    if view is not None and view.leader >= 0:
                        by_leader.setdefault(view.leader, []).append((topic, i))
                written = await asyncio.gather(*(self._send_to(node, c, parts, coordinator_epoch)
                                                 for node, parts in by_leader.items()))
                for done in written:
                    remaining -= done
                if not remaining:
                    break
            self.broker.cluster.store.mark_stale()  # read the leaders again
            await asyncio.sleep(min(RETRY_MARKERS_S, 0.05 * 2 ** attempt))
            attempt += 1
        if self._closed or not self.runtime.owns(p):
            return False
        try:
            await self.runtime.apply_durable(p, self.shard_of(c.transactional_id).complete(c, self.now_ms()))
        except ApiError as e:
            # replayed already; a new coordinator that does not have it completes the transaction again
            log.warning("transactional id %s: the completion is not replicated yet: %s", c.transactional_id, e.message)
        return True

    async def _send_to(self, node_id: int, c: Completion, parts: list[tuple[str, int]],
                       coordinator_epoch: int) -> set[tuple[str, int]]:
        """One WriteTxnMarkers to ``node_id`` for ``parts``; the partitions written (or
        superseded by a newer epoch)."""
        peer = self._peer(node_id, self._peers, "txn-markers")
        if peer is None:
            return set()
        conn, lock = peer
        codec = codec_for(WRITE_TXN_MARKERS, WRITE_TXN_MARKERS_VERSION)
        assert codec is not None
        cls = codec.request_type
        mcls, tcls = sub(cls, "WritableTxnMarker"), sub(cls, "WritableTxnMarkerTopic")
        by_topic: dict[str, list[int]] = {}
        for topic, i in parts:
            by_topic.setdefault(topic, []).append(i)
        request = make(cls, markers=(make(
            mcls, producer_id=c.producer_id, producer_epoch=c.producer_epoch, transaction_result=c.commit,
            topics=tuple(make(tcls, name=t, partition_indexes=tuple(ps)) for t, ps in by_topic.items()),
            coordinator_epoch=coordinator_epoch),))
        async with lock:
            try:
                response = await asyncio.wait_for(
                    conn.call(WRITE_TXN_MARKERS, WRITE_TXN_MARKERS_VERSION, request), MARKER_REQUEST_TIMEOUT_S)
            except (OSError, TimeoutError, ConnectionError, ValueError) as e:  # refused, reset, timed out
                log.info("WriteTxnMarkers to broker %d failed: %s", node_id, e)
                conn.close()
                return set()
        done: set[tuple[str, int]] = set()
        for m in response.markers:
            for t in m.topics:
                for r in t.partitions:
                    code = ErrorCode(r.error_code)
                    key = (t.name, int(r.partition_index))
                    if code in (ErrorCode.none, ErrorCode.unknown_topic_or_partition):
                        done.add(key)
                    elif code in (ErrorCode.invalid_producer_epoch, ErrorCode.transaction_coordinator_fenced):
                        # a newer epoch or coordinator wrote there already: this marker is superseded
                        log.warning("%s-%d: the %s marker of transactional id %s: %s", t.name, r.partition_index,
                                    "commit" if c.commit else "abort", c.transactional_id, code.name)
                        done.add(key)
                    elif code not in _RETRIABLE_MARKER_ERRORS:
                        log.warning("%s-%d: the %s marker of transactional id %s was refused (%s); retrying",
                                    t.name, r.partition_index, "commit" if c.commit else "abort",
                                    c.transactional_id, code.name)
        return done

    def _append_markers(self, c: Completion, defer_flush: bool) -> list[tuple[Any, Any]] | None:
        """Append the markers of ``c`` to its partitions: (partition log, append result) of
        each written. None (and a retry is scheduled) if a marker could not be written."""
        store = self.broker.store
        now = self.now_ms()
        written = []
        for topic, p in c.partitions:
            meta = store.get_topic(topic)
            if meta is None or not 0 <= p < meta.num_partitions:
                continue  # deleted meanwhile: nothing to mark
            plog = store.partition(topic, p)
            try:
                appended = plog.append_marker(c.producer_id, c.producer_epoch, c.commit, 0, now,
                                              defer_flush=defer_flush)
            except ApiError as e:
                if e.error_code == ErrorCode.invalid_producer_epoch:
                    # the partition has a newer epoch already: a later marker supersedes this one
                    log.warning("%s-%d: %s", topic, p, e.message)
                    continue
                log.error("%s-%d: cannot write the %s marker of transactional id %s (%s); retrying", topic, p,
                          "commit" if c.commit else "abort", c.transactional_id, e.message)
                self._schedule_retry()
                return None
            except OSError as e:
                log.error("%s-%d: a transaction marker could not be written: %s", topic, p, e)
                self._schedule_retry()
                return None
            self.broker.append_waiters.notify(topic, p)
            self.marker_written(topic, p, c.producer_id)
            if topic == OFFSETS_TOPIC:
                groups = self.broker.extensions.get("groups")
                if groups is not None:  # the transaction's offsets become visible, or are dropped
                    groups.runtime.shards[p].replay_marker(c.producer_id, c.commit)
            written.append((plog, appended))
        return written

    def _finish(self, c: Completion) -> bool:
        """Write the markers of ``c``, then record its completion. False (and a retry is
        scheduled) if a marker could not be written."""
        if self._append_markers(c, defer_flush=False) is None:
            return False
        try:
            self._apply(c.transactional_id, self.shard_of(c.transactional_id).complete(c, self.now_ms()))
        except ApiError:
            self._schedule_retry()
            return False
        return True

    def _track(self, txn_id: str, task: asyncio.Future[bool]) -> None:
        """``task`` completes ``txn_id``'s transaction: requests of that id wait for it."""
        self._sending[txn_id] = task
        task.add_done_callback(functools.partial(self._sent, txn_id))

    def _sent(self, txn_id: str, task: asyncio.Future[bool]) -> None:
        """``task``, completing ``txn_id``'s transaction, ended: forget it unless a newer one replaced it."""
        if self._sending.get(txn_id) is task:
            self._sending.pop(txn_id, None)

    def _complete_in_background(self, c: Completion) -> None:
        """One broker, ``c``'s Prepare record durable: append its markers now (without an
        fsync each), then, in a task that parked requests of its transactional id wait for,
        record the completion once every marker is durable."""
        written = self._append_markers(c, defer_flush=True)
        if written is None:
            return  # retried (_schedule_retry); the transaction stays in its Prepare state meanwhile
        self._track(c.transactional_id, asyncio.ensure_future(self._complete_when_durable(c, written)))

    async def _prepare_and_complete(self, p: int, c: Completion, prepared: asyncio.Future[None]) -> bool:
        """EndTxn on one broker, ``c``'s Prepare record appended and replayed: resolve
        ``prepared`` once it is durable (EndTxn's answer; its error if the write failed),
        append the markers, and record the completion once they are durable."""
        try:
            await self.runtime.wait_durable(p, wrote=True)
        except asyncio.CancelledError:
            prepared.cancel()  # the service is closing
            raise
        except Exception as e:  # ApiError: the fsync failed, so did the partition
            if not prepared.done():
                prepared.set_exception(e)
            return False
        if not prepared.done():
            prepared.set_result(None)
        if self._closed:
            return False
        written = self._append_markers(c, defer_flush=True)
        if written is None:
            return False  # retried (_schedule_retry); the transaction stays in its Prepare state meanwhile
        return await self._complete_when_durable(c, written)

    async def _complete_when_durable(self, c: Completion, written: list[tuple[Any, Any]]) -> bool:
        """Wait until the markers ``written`` are durable (the partitions' fsyncs run
        concurrently, off the event loop), then record the completion of ``c``."""
        # Handed to the threads together at the end of the loop's pass, after EndTxn's answer
        # is sent: started at once (``now``), their threads took the GIL from that answer
        flusher = self.broker.flusher
        waits = [w for plog, appended in written
                 if (w := flusher.waiter(plog, appended.last_offset + 1)) is not None]
        try:
            await asyncio.gather(*waits)
        except OSError as e:
            log.error("fsync of transaction markers failed: %s", e)
            self._schedule_retry()
            return False
        if self._closed:
            return False
        try:
            # not awaited durable: if it is lost, the replay finds Prepare* and completes again
            self.runtime.apply_deferred(self.partition_for(c.transactional_id),
                                        self.shard_of(c.transactional_id).complete(c, self.now_ms()))
        except ApiError:
            self._schedule_retry()
            return False
        return True

    def _schedule_retry(self) -> None:
        if self._retry is not None or self._closed:
            return

        def retry() -> None:
            self._retry = None
            for shard in self.runtime.shards:
                for c in shard.pending_completions():
                    if c.transactional_id in self._sending:
                        continue  # its markers are being made durable: that task completes it
                    if not self._finish(c):
                        return

        try:
            self._retry = asyncio.get_running_loop().call_later(RETRY_MARKERS_S, retry)
        except RuntimeError:
            pass  # no loop (tests of the pure parts)

    # ------------------------------------------------------------ timeouts
    def _arm(self) -> None:
        if self._closed:
            return
        deadlines = [d for s in self.runtime.shards if (d := s.next_deadline_ms()) is not None]
        if not deadlines:
            return
        at = min(deadlines)
        if self._timer is not None and self._timer_at is not None and self._timer_at <= at:
            return
        if self._timer is not None:
            self._timer.cancel()
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._timer_at = at
        self._timer = loop.call_later(max(0.0, (at - self.now_ms()) / 1000), self._expire)

    def _expire(self) -> None:
        self._timer = self._timer_at = None
        if self._closed:
            return
        now = self.now_ms()
        for i, shard in enumerate(self.runtime.shards):
            for txn_id in shard.expired(now):
                try:
                    result = self.runtime.apply(i, shard.fence_and_abort(txn_id, now))
                except ApiError as e:
                    log.error("transactional id %s: cannot abort the timed-out transaction: %s", txn_id, e.message)
                    continue
                if result.after is not None:
                    log.info("transactional id %s: the transaction timed out; aborted (producer epoch bumped to %d)",
                             txn_id, result.after.producer_epoch)
                    self._complete(result.after)
        self._arm()


class VerificationGuard:
    """One verification under way (see :meth:`TransactionService.start_verification`)."""

    __slots__ = ("valid",)

    def __init__(self) -> None:
        self.valid = True


class _Verifier:
    """Cluster mode: the verifications (and, for transaction version 2, the additions)
    this broker asks one coordinator, one request at a time, the ones that came meanwhile
    sent together in the next (Kafka's AddPartitionsToTxnManager). One entry per
    transactional id in a request: the partitions of concurrent questions of the same
    producer id, epoch and kind are merged, another waits for the next request."""

    def __init__(self, svc: TransactionService, node_id: int) -> None:
        self.svc = svc
        self.node_id = node_id
        self.pending: list[tuple[str, int, int, bool, list[tuple[str, int]], asyncio.Future[Any]]] = []
        self.peers: dict[int, Any] = {}
        self.task: asyncio.Future[None] | None = None

    def submit(self, txn_id: str, producer_id: int, producer_epoch: int, partitions: list[tuple[str, int]],
               verify_only: bool = True) -> asyncio.Future[dict[tuple[str, int], ErrorCode]]:
        future: asyncio.Future[dict[tuple[str, int], ErrorCode]] = asyncio.get_running_loop().create_future()
        self.pending.append((txn_id, producer_id, producer_epoch, verify_only, partitions, future))
        if self.task is None or self.task.done():
            self.task = asyncio.ensure_future(self._run())
        return future

    def close(self) -> None:
        if self.task is not None:
            self.task.cancel()
        for _txn_id, _pid, _epoch, _verify_only, parts, future in self.pending:
            if not future.done():
                future.set_result(dict.fromkeys(parts, ErrorCode.network_exception))
        self.pending.clear()
        for _h, _p, conn, _lock in self.peers.values():
            conn.close()

    async def _run(self) -> None:
        while self.pending:
            batch, self.pending = self.pending, []
            chosen: dict[str, tuple[int, int, bool, dict[tuple[str, int], None], list[Any]]] = {}
            later = []
            for entry in batch:
                txn_id, pid, epoch, verify_only, parts, _future = entry
                c = chosen.get(txn_id)
                if c is None:
                    chosen[txn_id] = (pid, epoch, verify_only, dict.fromkeys(parts), [entry])
                elif (c[0], c[1], c[2]) == (pid, epoch, verify_only):
                    c[3].update(dict.fromkeys(parts))
                    c[4].append(entry)
                else:
                    later.append(entry)
            self.pending[:0] = later
            codes: dict[str, dict[tuple[str, int], ErrorCode]] = {}
            try:
                codes = await self._send({t: (c[0], c[1], c[2], list(c[3])) for t, c in chosen.items()})
            finally:
                for txn_id, c in chosen.items():
                    for _t, _pid, _epoch, _verify_only, parts, future in c[4]:
                        if not future.done():
                            got = codes.get(txn_id, {})
                            future.set_result({k: got.get(k, ErrorCode.network_exception) for k in parts})

    async def _send(self, txns: dict[str, tuple[int, int, bool, list[tuple[str, int]]]]
                    ) -> dict[str, dict[tuple[str, int], ErrorCode]]:
        def every(code: ErrorCode) -> dict[str, dict[tuple[str, int], ErrorCode]]:
            return {t: dict.fromkeys(parts, code) for t, (_pid, _epoch, _v, parts) in txns.items()}

        peer = self.svc._peer(self.node_id, self.peers, "txn-verify")
        if peer is None:
            return every(ErrorCode.coordinator_not_available)
        conn, _lock = peer
        codec = codec_for(ADD_PARTITIONS_TO_TXN, VERIFY_VERSION)
        assert codec is not None
        cls = codec.request_type
        xcls, tcls = sub(cls, "AddPartitionsToTxnTransaction"), sub(cls, "AddPartitionsToTxnTopic")
        request = make(cls, transactions=tuple(
            make(xcls, transactional_id=t, producer_id=pid, producer_epoch=epoch, verify_only=verify_only,
                 topics=tuple(make(tcls, name=name, partitions=tuple(i for n, i in parts if n == name))
                              for name in dict.fromkeys(n for n, _ in parts)))
            for t, (pid, epoch, verify_only, parts) in txns.items()))
        try:
            response = await asyncio.wait_for(conn.call(ADD_PARTITIONS_TO_TXN, VERIFY_VERSION, request),
                                              VERIFY_TIMEOUT_S)
        except (OSError, TimeoutError, ConnectionError, ValueError) as e:
            log.info("AddPartitionsToTxn (verification) to broker %d failed: %s", self.node_id, e)
            conn.close()
            return every(ErrorCode.network_exception)
        top = ErrorCode(response.error_code)
        if top != ErrorCode.none:
            log.warning("AddPartitionsToTxn (verification) to broker %d: %s", self.node_id, top.name)
            # a client must not see CLUSTER_AUTHORIZATION_FAILED: the partition is not verified
            return every(ErrorCode.invalid_txn_state if top == ErrorCode.cluster_authorization_failed else top)
        out: dict[str, dict[tuple[str, int], ErrorCode]] = {}
        for r in response.results_by_transaction:
            codes = out.setdefault(r.transactional_id, {})
            for t in r.topic_results:
                for x in t.results_by_partition:
                    codes[(t.name, int(x.partition_index))] = ErrorCode(x.partition_error_code)
        if any(c == ErrorCode.not_coordinator for codes in out.values() for c in codes.values()):
            self.svc.broker.cluster.store.mark_stale()  # the coordinator moved: read the leaders again
        return out


@on_start
async def _start(broker: Any) -> None:
    svc = TransactionService(broker)
    svc.load()
    broker.extensions["transactions"] = svc


@on_stop
async def _stop(broker: Any) -> None:
    svc = broker.extensions.get("transactions")
    if svc is not None:
        await svc.drain(SHUTDOWN_WAIT_S)
        svc.close()


@on_leadership_change
def _leadership(broker: Any, topic: str, index: int, leader: bool) -> None:
    svc = broker.extensions.get("transactions")
    if svc is not None:
        svc.leadership_changed(topic, index, leader)


def has_ongoing_transaction(plog: Any, producer_id: int, producer_epoch: int) -> bool:
    """Whether the partition has an open transaction of this producer id at this epoch
    (Kafka's hasOngoingTransaction): a batch of it needs no question to the coordinator.
    Another epoch (transaction version 2 bumps it at every end) is a new transaction,
    even while the previous one's marker has not arrived yet."""
    if producer_id not in plog.txns.ongoing:
        return False
    entry = plog.producers.entries.get(producer_id)
    return entry is not None and entry.epoch == producer_epoch


_RETRY_VERIFICATION = frozenset({
    ErrorCode.concurrent_transactions, ErrorCode.network_exception, ErrorCode.coordinator_load_in_progress,
    ErrorCode.coordinator_not_available, ErrorCode.not_coordinator,
})


def verification_error(code: ErrorCode, produce_version: int) -> ApiError | None:
    """The Produce answer for a partition the coordinator did not verify (Kafka's
    ReplicaManager and AddPartitionsToTxnManager): PRODUCER_FENCED as INVALID_PRODUCER_EPOCH,
    TRANSACTION_ABORTABLE from Produce v11 (INVALID_TXN_STATE before), and the errors a
    client should retry as NOT_ENOUGH_REPLICAS (older clients do not retry the
    coordinator's errors on a Produce; that one does not refresh metadata either)."""
    if code == ErrorCode.none:
        return None
    if code == ErrorCode.producer_fenced:
        code = ErrorCode.invalid_producer_epoch
    if code == ErrorCode.transaction_abortable and produce_version < 11:
        code = ErrorCode.invalid_txn_state
    if code in (ErrorCode.invalid_txn_state, ErrorCode.transaction_abortable):
        return ApiError(code, "Partition was not added to the transaction")
    if code in _RETRY_VERIFICATION:
        return ApiError(ErrorCode.not_enough_replicas,
                        f"Unable to verify the partition has been added to the transaction. Underlying error: "
                        f"{code.name.upper()}")
    return ApiError(code)


def check_transactional_produce(broker: Any, txn_id: str, topic: str, partition: int, records: Any,
                                produce_version: int) -> tuple[int, int] | None:
    """Produce with a transactional id: a transactional batch is appended only if its
    producer's open transaction holds the partition (KIP-890 part 1). One broker: asked
    of the coordinator here for every transactional batch; raises ApiError
    (:func:`verification_error`); Produce v12 (transaction version 2, KIP-890 part 2):
    the producer's first batch on the partition returns (producer id, epoch), to be
    added to its transaction first. Cluster mode: returns (producer id, epoch) when this
    leader must ask the coordinator first (:meth:`TransactionService.verify_in_transaction`),
    the producer having no open transaction on the partition yet (a later batch of the
    transaction needs no question: the coordinator knows, and a marker ends it); None
    otherwise. A batch that cannot be framed is left to the validation."""
    svc = transaction_service(broker)
    if svc is None:
        raise ApiError(ErrorCode.coordinator_not_available, "the transaction coordinator is not started")
    if not records:
        return None
    try:
        h = read_header(memoryview(records), 0)
    except CorruptBatchError:
        return None
    if not h.is_transactional:
        return None
    if svc.clustered:
        try:
            broker.replicas.leader_replica(topic, partition)
        except ApiError:
            return None  # not the leader: the append answers that
        if has_ongoing_transaction(broker.store.partition(topic, partition), h.producer_id, h.producer_epoch):
            return None
        return h.producer_id, h.producer_epoch
    if produce_version >= 12 and not has_ongoing_transaction(broker.store.partition(topic, partition),
                                                             h.producer_id, h.producer_epoch):
        return h.producer_id, h.producer_epoch  # transaction version 2: added to the transaction first
    code = svc.verify_partitions(txn_id, h.producer_id, h.producer_epoch, [(topic, partition)])[(topic, partition)]
    error = verification_error(code, produce_version)
    if error is not None:
        raise error
    return None
