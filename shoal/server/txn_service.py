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

Ending a transaction (EndTxn, a fenced or timed-out transaction) is done before the
request is answered: the PrepareCommit / PrepareAbort record is made durable, then a
commit or abort marker is appended to every partition of the transaction (directly to
this broker's logs, waking parked Fetch requests; for EndTxn the markers are appended
without an fsync each and then made durable together by the flusher's worker threads,
as Produce's appends are), then CompleteCommit / CompleteAbort is recorded. EndTxn does
not wait for that last record's fsync (it shares the next one of its partition): if a
crash loses it, the replay finds the Prepare state and completes the transaction again,
and a second marker for a closed transaction changes nothing. AddPartitionsToTxn waits
for its record's fsync, shared with concurrent writes (``apply_durable``). A marker that cannot be written (a
full disk) leaves the transaction in its Prepare state (clients get
CONCURRENT_TRANSACTIONS) and is retried every second; a restart finishes what a crash
interrupted (the shard lists its Prepare states after the replay).

Expiry: every ``transaction.remove.expired.transaction.cleanup.interval.ms`` each shard
forgets the transactional ids idle for ``transactional.id.expiration.ms`` (tombstones).

Timeouts: one ``loop.call_later`` at the earliest deadline of any open transaction
(its start plus its ``transaction.timeout.ms``); then every expired transaction is
fenced and aborted (:meth:`TransactionCoordinatorShard.fence_and_abort`).

One broker only: in cluster mode the service is not started, the transaction APIs
(:data:`TRANSACTION_APIS`) are left out of this broker's routes (so ApiVersions does not
advertise them), and InitProducerId and Produce refuse transactional ids (the coordinator
does not follow the leadership of ``__transaction_state`` and markers are not sent to
other brokers yet).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from ..coordinator.partitioning import coordinator_partition
from ..coordinator.records import TRANSACTION_STATE
from ..coordinator.result import Result
from ..errors import ApiError, ErrorCode
from ..protocol.batch import CorruptBatchError, read_header
from ..transactions.coordinator import Completion, TransactionCoordinatorShard
from .broker import on_start, on_stop
from .internal_topics import OFFSETS_TOPIC
from .runtime import CoordinatorRuntime

log = logging.getLogger("shoal.transactions")

__all__ = ["TransactionService", "transaction_service", "check_transactional_produce", "TRANSACTION_STATE"]

RETRY_MARKERS_S = 1.0

TRANSACTION_APIS = frozenset({24, 25, 26, 27, 28, 65, 66})
"""AddPartitionsToTxn, AddOffsetsToTxn, EndTxn, WriteTxnMarkers, TxnOffsetCommit,
DescribeTransactions, ListTransactions: not advertised in cluster mode, where the
transaction coordinator is not served (ApiVersions advertises only what works)."""


def transaction_service(broker: Any) -> TransactionService | None:
    """The service, or None when transactions are not served (cluster mode)."""
    return broker.extensions.get("transactions")


class TransactionService:
    def __init__(self, broker: Any) -> None:
        self.broker = broker
        cfg = broker.config
        self.runtime: CoordinatorRuntime[TransactionCoordinatorShard] = CoordinatorRuntime(
            broker, TRANSACTION_STATE, "transaction.state.log.num.partitions", self._new_shard,
            topic_configs={"cleanup.policy": "compact",
                           "segment.bytes": str(cfg["transaction.state.log.segment.bytes"])})
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
        created only when transactions are first used (:meth:`ensure_loaded`)."""
        if self.broker.store.get_topic(TRANSACTION_STATE) is not None:
            self._load_now()

    def ensure_loaded(self) -> None:
        """Create (and load) ``__transaction_state`` if it does not exist yet."""
        if not self.runtime.shards:
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

    def close(self) -> None:
        self._closed = True
        for h in (self._timer, self._retry, self._cleanup):
            if h is not None:
                h.cancel()
        self._timer = self._retry = self._cleanup = None

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
                log.info("forgot %d idle transactional id(s): %s", len(result.response), ", ".join(result.response))
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
            self._finish(result.after)
        return result.response

    async def add_partitions(self, txn_id: str, producer_id: int, producer_epoch: int,
                             partitions: list[tuple[str, int]]) -> ErrorCode:
        """Answered once the new partitions are durable (an fsync shared with concurrent writes)."""
        self.ensure_loaded()
        result = self.shard_of(txn_id).add_partitions(txn_id, producer_id, producer_epoch, partitions,
                                                      self.now_ms())
        await self.runtime.apply_durable(self.partition_for(txn_id), result)
        if result.records:
            self._arm()
        return result.response

    async def end_txn(self, txn_id: str, producer_id: int, producer_epoch: int, commit: bool) -> ErrorCode:
        """Answered once PrepareCommit / PrepareAbort and the markers are durable (the
        markers' fsyncs run together, off the event loop) and the completion is recorded."""
        self.ensure_loaded()
        p = self.partition_for(txn_id)
        result = self.shard_of(txn_id).end_txn(txn_id, producer_id, producer_epoch, commit, self.now_ms())
        await self.runtime.apply_durable(p, result)
        if result.after is not None:
            # Prepare* is durable: the outcome is decided, as Kafka answers; if a marker cannot
            # be written now it is retried, and clients see CONCURRENT_TRANSACTIONS meanwhile
            await self._finish_durable(result.after)
        return result.response

    def verify(self, txn_id: str, producer_id: int, producer_epoch: int, topic: str, partition: int) -> ErrorCode:
        if not self.loaded:
            return ErrorCode.invalid_producer_id_mapping if txn_id else ErrorCode.invalid_request
        return self.shard_of(txn_id).verify(txn_id, producer_id, producer_epoch, topic, partition)

    # ------------------------------------------------------------ markers
    def _finish(self, c: Completion) -> bool:
        """Write the markers of ``c``, then record its completion. False (and a retry is
        scheduled) if a marker could not be written."""
        store = self.broker.store
        now = self.now_ms()
        for topic, p in c.partitions:
            meta = store.get_topic(topic)
            if meta is None or not 0 <= p < meta.num_partitions:
                continue  # deleted meanwhile: nothing to mark
            plog = store.partition(topic, p)
            try:
                plog.append_marker(c.producer_id, c.producer_epoch, c.commit, 0, now)
            except ApiError as e:
                if e.error_code == ErrorCode.invalid_producer_epoch:
                    # the partition has a newer epoch already: a later marker supersedes this one
                    log.warning("%s-%d: %s", topic, p, e.message)
                    continue
                log.error("%s-%d: cannot write the %s marker of transactional id %s (%s); retrying", topic, p,
                          "commit" if c.commit else "abort", c.transactional_id, e.message)
                self._schedule_retry()
                return False
            except OSError as e:
                log.error("%s-%d: fsync of a transaction marker failed: %s", topic, p, e)
                self._schedule_retry()
                return False
            self.broker.append_waiters.notify(topic, p)
            if topic == OFFSETS_TOPIC:
                groups = self.broker.extensions.get("groups")
                if groups is not None:  # the transaction's offsets become visible, or are dropped
                    groups.runtime.shards[p].replay_marker(c.producer_id, c.commit)
        try:
            self._apply(c.transactional_id, self.shard_of(c.transactional_id).complete(c, self.now_ms()))
        except ApiError:
            self._schedule_retry()
            return False
        return True

    async def _finish_durable(self, c: Completion) -> bool:
        """:meth:`_finish` with the markers appended without an fsync each, then made
        durable together by the flusher (worker threads), then the completion recorded."""
        store = self.broker.store
        now = self.now_ms()
        waits = []
        for topic, p in c.partitions:
            meta = store.get_topic(topic)
            if meta is None or not 0 <= p < meta.num_partitions:
                continue
            plog = store.partition(topic, p)
            try:
                appended = plog.append_marker(c.producer_id, c.producer_epoch, c.commit, 0, now, defer_flush=True)
            except ApiError as e:
                if e.error_code == ErrorCode.invalid_producer_epoch:
                    log.warning("%s-%d: %s", topic, p, e.message)
                    continue
                log.error("%s-%d: cannot write the %s marker of transactional id %s (%s); retrying", topic, p,
                          "commit" if c.commit else "abort", c.transactional_id, e.message)
                self._schedule_retry()
                return False
            except OSError as e:
                log.error("%s-%d: a transaction marker could not be written: %s", topic, p, e)
                self._schedule_retry()
                return False
            self.broker.append_waiters.notify(topic, p)
            if topic == OFFSETS_TOPIC:
                groups = self.broker.extensions.get("groups")
                if groups is not None:
                    groups.runtime.shards[p].replay_marker(c.producer_id, c.commit)
            waits.append(self.broker.flusher.durable(plog, appended.last_offset + 1))
        try:
            await asyncio.gather(*waits)
        except OSError as e:
            log.error("fsync of transaction markers failed: %s", e)
            self._schedule_retry()
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
                    self._finish(result.after)
        self._arm()


@on_start
async def _start(broker: Any) -> None:
    try:
        clustered = broker.config["metadata.store"] != "local"
    except (KeyError, TypeError):
        clustered = False
    if clustered:
        broker.routes = {k: r for k, r in broker.routes.items() if k not in TRANSACTION_APIS}
        return
    svc = TransactionService(broker)
    svc.load()
    broker.extensions["transactions"] = svc


@on_stop
async def _stop(broker: Any) -> None:
    svc = broker.extensions.get("transactions")
    if svc is not None:
        svc.close()


def check_transactional_produce(broker: Any, txn_id: str, topic: str, partition: int, records: Any) -> None:
    """Produce with a transactional id: a transactional batch needs its producer's open
    transaction to hold the partition. Raises ApiError (TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    when transactions are not served, INVALID_PRODUCER_ID_MAPPING, INVALID_PRODUCER_EPOCH,
    INVALID_TXN_STATE); a batch that cannot be framed is left to the validation."""
    svc = transaction_service(broker)
    if svc is None:
        raise ApiError(ErrorCode.transactional_id_authorization_failed,
                       "transactions are served by a single broker only, not in cluster mode")
    if not records:
        return
    try:
        h = read_header(memoryview(records), 0)
    except CorruptBatchError:
        return
    if not h.is_transactional:
        return
    code = svc.verify(txn_id, h.producer_id, h.producer_epoch, topic, partition)
    if code != ErrorCode.none:
        raise ApiError(code, f"producer {h.producer_id} epoch {h.producer_epoch} has no open transaction "
                             f"of {txn_id!r} holding {topic}-{partition}" if code == ErrorCode.invalid_txn_state
                       else f"transactional id {txn_id!r}: {code.name}")
