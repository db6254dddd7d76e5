"""Produce as one operation: validate, append, wait for durability and the ISR.

The Produce handler (``handlers/produce.py``) reads the request, checks what is the
request's as a whole (authorization, a transactional batch without a transactional id),
and makes one call, :meth:`ProduceService.produce`, with plain inputs: the transactional
id, acks, the timeout and the records of each (topic, partition). The service answers
each partition with a :class:`PartitionResult` and hands them, once final, to the
handler's ``respond`` callback (as Kafka's ReplicaManager.appendRecords calls its
response callback): at once when nothing needs waiting for, else from a future resolved
by the fsyncs' callbacks or, with acks=all in cluster mode, from a coroutine that waits
for the in-sync replicas (Kafka's DelayedProduce).

Per partition: the topic and partition must exist and not be internal; the records are
validated as Kafka's LogValidator does (``protocol/records.py``: one batch, every record
walked, no control batch, a known codec, compressed payloads decompressed), and a
refused partition is answered with CORRUPT_MESSAGE or INVALID_RECORD (with the index of
the record at fault, which Produce v8+ carry in ``record_errors``) and nothing of it is
written. The validation checks the CRC-32C (or computes it for a batch it rewrites), so
the log's append does not compute it again; the log then checks framing, size and
producer sequence, assigns offsets and, for LogAppendTime topics, the timestamp.

Transactions (KIP-890 part 1): with a transactional id, a transactional batch is
appended only while its producer's transaction is open and holds the partition (the
transaction coordinator checks producer id and epoch: INVALID_PRODUCER_EPOCH;
INVALID_TXN_STATE, or TRANSACTION_ABORTABLE from Produce v11, when the partition is not
in the transaction). On one broker every transactional batch is checked at once; in
cluster mode the leader asks the coordinator (often another broker) before the
producer's first transactional batch on the partition, which waits meanwhile in the
partition's queue (``_verify_then_append``), and later batches of the transaction are
checked by the partition's producer state (INVALID_PRODUCER_EPOCH below the last
marker's epoch). Produce v12 (transaction version 2, KIP-890 part 2): the producer does
not add its partitions itself; the leader adds the partition to the transaction before
its first batch there.

A compressed batch is decompressed, walked (and, for a topic whose compression.type
differs, recompressed) in a worker thread, so the event loop keeps serving meanwhile.
Appends to one partition stay in arrival order: while a partition has a batch in a
worker (or waiting for the coordinator), later produces to it wait their turn (the
service's per-partition tails).

In cluster mode (``broker.replicas`` set) only the partition's leader appends
(NOT_LEADER_OR_FOLLOWER elsewhere), stamping its leader epoch into each batch; acks=all
fails with NOT_ENOUGH_REPLICAS when the ISR is smaller than ``min.insync.replicas`` and
otherwise also waits until every in-sync replica has the records (the high watermark
passed them), one timeout for all the request's partitions.

When the flush policy (``flush.messages``, ``flush.ms``; by default every append) asks
for an fsync, the answer waits for it: the fsync starts in the next pass of the event
loop and is shared by every produce that appended to the partition by then (group
commit); a small one runs on the event loop while the disk is quick, the others in a
worker thread (``Flusher`` in server/broker.py). The answer is then a future, resolved
by callbacks on the flush's futures, with no task of its own. So an acknowledged record
is written and, where the policy says so, fsynced. A write the disk refuses (nothing of
it is left in the log) or an fsync that fails answers KAFKA_STORAGE_ERROR for that
partition, logged once per partition until it writes again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Container, Sequence
from typing import TYPE_CHECKING, TypeVar

from ..errors import ApiError, ErrorCode
from ..protocol.records import (
    RecordsError,
    Validated,
    codec_of_compression_type,
    needs_worker,
    validate_produce_batch,
)
from .broker import on_start
from .handlers.metadata import INTERNAL_TOPICS
from .txn_service import (
    VerificationGuard,
    check_transactional_produce,
    has_ongoing_transaction,
    transaction_service,
    verification_error,
)

if TYPE_CHECKING:
    from ..cluster.replica_manager import Replica, ReplicaManager
    from ..log.partition_log import PartitionLog
    from ..log.store import LogStore
    from .broker import Broker

__all__ = ["PartitionResult", "ProduceService", "TopicInput", "TopicResults", "produce_service"]

T = TypeVar("T")

Key = tuple[str, int]
TopicInput = tuple[str, Sequence[tuple[int, "bytes | None"]]]
"""A topic's name and its partitions' (index, records) as the request carries them."""


class PartitionResult:
    """A partition's answer: its offsets, or its error."""

    __slots__ = ("base_offset", "error_code", "error_message", "index", "log_append_time_ms", "log_start_offset",
                 "record_errors")

    def __init__(self, index: int) -> None:
        self.index = index
        self.error_code = ErrorCode.none
        self.error_message: str | None = None
        self.base_offset = -1
        self.log_append_time_ms = -1
        """The LogAppendTime the log stamped, or -1 (CreateTime topics, errors)."""
        self.log_start_offset = -1
        self.record_errors: tuple[tuple[int, str | None], ...] = ()
        """(index of the record at fault in its batch, message) each."""

    def fail(self, code: ErrorCode) -> None:
        self.error_code = code
        self.base_offset = -1

    def set_error(self, e: ApiError) -> None:
        self.error_code = e.error_code
        self.error_message = e.message if e.message != e.error_code.name else None
        if isinstance(e, RecordsError) and e.record_index is not None:
            self.record_errors = ((e.record_index, e.message),)


TopicResults = list[tuple[str, list[PartitionResult]]]
"""Per topic of the request, in its order: the name and its partitions' results."""

Flush = tuple[PartitionResult, "asyncio.Future[None] | None", "Key | None", "PartitionLog | None"]
"""A partition's wait for the fsync the flush policy asked for: (its result, the flusher's
future or None when already durable, its key and log; key and log are None for the task
of a produce validated in a worker thread, which reports its partition itself)."""

IsrWait = tuple[PartitionResult, "Replica", int]
"""acks=all in cluster mode: a partition's result, its replica and the offset every in-sync replica must reach."""

Verification = tuple["asyncio.Future[dict[Key, ErrorCode]]", "VerificationGuard", int, int, int]
"""The coordinator's answer to come, the partition's guard, producer id, Produce version, producer epoch."""


def _validate(records: bytes, plog: PartitionLog) -> Validated:
    cfg = plog.config
    return validate_produce_batch(records, target_codec=codec_of_compression_type(cfg.compression_type),
                                  log_append_time=cfg.log_append_time, require_keys=cfg.compact)


class ProduceService:
    """The broker's appends for Produce (event loop only)."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self._tails: dict[Key, asyncio.Future[None]] = {}
        """Per partition, the last produce still being validated in a worker thread (or
        waiting for the coordinator): a later produce to the partition waits for it before
        appending, so a later request never overtakes an earlier one (idempotent
        producers pipeline)."""

    @property
    def _store(self) -> LogStore:
        store = self.broker.store
        assert store is not None
        return store

    def produce(self, txn_id: str | None, acks: int, timeout_ms: int, topics: Sequence[TopicInput],
                respond: Callable[[TopicResults], T], *, version: int, client_id: str | None,
                refused: Container[str] = ()) -> T | Awaitable[T]:
        """Append each partition's records; ``respond(results)`` once every partition's
        outcome is final, returning what it returns, or a future or coroutine of it.

        ``version`` is the Produce version (transaction errors depend on it),
        ``client_id`` names the client in the log, ``refused`` are the topics the
        request may not write (TOPIC_AUTHORIZATION_FAILED).
        """
        broker = self.broker
        store = self._store
        now_ms = broker.clock.now_ms()
        tails = self._tails
        topic_results: TopicResults = []
        flushes: list[Flush] = []
        isr_waits: list[IsrWait] = []
        to_verify: list[tuple[Key, bytes, PartitionResult, tuple[int, int]]] = []
        for name, partitions in topics:
            meta = store.get_topic(name)
            results: list[PartitionResult] = []
            for index, records in partitions:
                r = PartitionResult(index)
                results.append(r)
                try:
                    if acks not in (0, 1, -1):
                        raise ApiError(ErrorCode.invalid_required_acks)
                    if name in refused:
                        raise ApiError(ErrorCode.topic_authorization_failed)
                    if name in INTERNAL_TOPICS:
                        raise ApiError(ErrorCode.invalid_topic_exception, f"cannot produce to internal topic {name}")
                    if meta is None:
                        broker.note_unknown_topic(client_id, name, "Produce does not create topics")
                        raise ApiError(ErrorCode.unknown_topic_or_partition)
                    if not 0 <= index < meta.num_partitions:
                        raise ApiError(ErrorCode.unknown_topic_or_partition)
                    producer = None
                    if txn_id is not None:
                        producer = check_transactional_produce(broker, txn_id, name, index, records, version)
                    plog = store.partition(name, index)
                    if not records:
                        raise ApiError(ErrorCode.corrupt_message, "empty record set")
                    key = (name, index)
                    if producer is not None:  # asked of the coordinator first, then appended in turn
                        to_verify.append((key, records, r, producer))
                        continue
                    if needs_worker(records) or key in tails:
                        prev, mine = self._enqueue(key)
                        # A task of its own: the append happens even if this connection goes away
                        # meanwhile (as a synchronous one would have), and the tail is always released.
                        task = asyncio.ensure_future(self._append_later(key, records, prev, mine, r, acks, timeout_ms))
                        flushes.append((r, asyncio.shield(task), None, None))
                        continue
                    self._append(plog, key, _validate(records, plog), now_ms, r, flushes, isr_waits, acks)
                except ApiError as e:
                    r.set_error(e)
            topic_results.append((name, results))
        if to_verify:
            assert txn_id is not None
            self._verify_then_append(txn_id, to_verify, acks, timeout_ms, version, flushes)
        if isr_waits:
            return self._after_isr(respond, topic_results, flushes, isr_waits, timeout_ms)
        if flushes:
            return self._after_flush(respond, topic_results, flushes)
        return respond(topic_results)

    # -- the partition queue ------------------------------------------------------------
    def _enqueue(self, key: Key) -> tuple[asyncio.Future[None] | None, asyncio.Future[None]]:
        prev = self._tails.get(key)
        mine: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._tails[key] = mine
        return prev, mine

    def _dequeue(self, key: Key, mine: asyncio.Future[None]) -> None:
        if not mine.done():
            mine.set_result(None)
        if self._tails.get(key) is mine:
            del self._tails[key]

    # -- append ---------------------------------------------------------------------------
    def _append(self, plog: PartitionLog, key: Key, validated: Validated, now_ms: int, r: PartitionResult,
                flushes: list[Flush], isr_waits: list[IsrWait], acks: int) -> None:
        """Append a validated batch; queue its fsync (flush policy) and, in cluster mode,
        its ISR wait.

        Raises ApiError; KAFKA_STORAGE_ERROR when the disk refuses the write (nothing of it
        is left in the log) or the fsync of a rolled segment fails, reported to
        ``broker.storage_errors`` (logged once per partition).
        """
        broker = self.broker
        replicas: ReplicaManager | None = broker.replicas
        batch = validated.batch
        try:
            if replicas is not None:
                replica = replicas.leader_replica(*key)
                state = replica.state
                assert state is not None  # a leader's replica has its partition state
                if acks == -1 and len(state.isr) < replicas.min_insync_replicas(key[0]):
                    raise ApiError(ErrorCode.not_enough_replicas,
                                   f"ISR {list(state.isr)} is smaller than min.insync.replicas")
                result = plog.append(batch, now_ms, defer_flush=True, leader_epoch=replica.leader_epoch,
                                     crc_checked=True, header=validated.header)
                replicas.maybe_advance_hw(replica)
                if acks == -1:
                    isr_waits.append((r, replica, result.last_offset + 1))
            else:
                result = plog.append(batch, now_ms, defer_flush=True, crc_checked=True, header=validated.header)
        except OSError as e:  # the fsync of the segment a roll sealed
            broker.storage_errors.failed(key, f"fsync failed: {e}")
            raise ApiError(ErrorCode.kafka_storage_error, f"append failed: {e}") from e
        except ApiError as e:
            if e.error_code == ErrorCode.kafka_storage_error:
                broker.storage_errors.failed(key, e.message)
            raise
        if plog.flush_due(now_ms):
            # the flush starts in the next loop pass, shared with every append until then;
            # the answer waits for it (_after_flush, _wait_flushes)
            flushes.append((r, broker.flusher.waiter(plog, plog.log_end_offset, inline_if_small=True), key, plog))
        else:
            broker.storage_errors.ok(key)
        r.base_offset = result.base_offset
        r.log_append_time_ms = result.log_append_time_ms
        r.log_start_offset = plog.log_start_offset
        if result.record_count:
            broker.append_waiters.notify(*key)
        if broker.metrics is not None:
            broker.metrics.produced(key[0], result.record_count, len(batch))

    async def _append_later(self, key: Key, records: bytes, prev: asyncio.Future[None] | None,
                            mine: asyncio.Future[None], r: PartitionResult, acks: int, timeout_ms: int,
                            verification: Verification | None = None) -> None:
        """Validate in a worker thread (and wait for the coordinator's verification), wait for
        the partition's earlier produces, then append."""
        broker = self.broker
        store = self._store
        flushes: list[Flush] = []
        isr_waits: list[IsrWait] = []
        try:
            plog = store.partition(*key)
            validated: Validated | ApiError
            try:
                validated = await asyncio.to_thread(_validate, records, plog)
            except ApiError as e:
                validated = e
            if verification is not None:
                await asyncio.wait([verification[0]])  # its outcome, even a failure, is read by _verified
            if prev is not None:
                await prev
            if verification is not None:
                self._verified(key, plog, verification)
            if isinstance(validated, ApiError):
                raise validated
            meta = store.get_topic(key[0])
            if meta is None or key[1] >= meta.num_partitions or store.partition(*key) is not plog:
                raise ApiError(ErrorCode.unknown_topic_or_partition)
            self._append(plog, key, validated, broker.clock.now_ms(), r, flushes, isr_waits, acks)
        except ApiError as e:
            r.set_error(e)
            return
        finally:
            self._dequeue(key, mine)
            if verification is not None:
                self._end_verification(key, verification)
        await self._wait_flushes(flushes)
        if r.error_code != ErrorCode.none:
            return
        replicas: ReplicaManager | None = broker.replicas
        for _, replica, end in isr_waits:
            assert replicas is not None
            code = await replicas.wait_for_isr(replica, end, timeout_ms)
            if code != ErrorCode.none:
                r.fail(code)

    # -- transactions (KIP-890) -------------------------------------------------------------
    def _verify_then_append(self, txn_id: str, to_verify: list[tuple[Key, bytes, PartitionResult, tuple[int, int]]],
                            acks: int, timeout_ms: int, version: int, flushes: list[Flush]) -> None:
        """The first transactional batches of a producer on these partitions wait for the
        coordinator's word (cluster mode: is each in the transaction; Produce v12: each
        added to it; one question for all of them), each queued behind its partition's
        earlier produces, and later ones behind it."""
        svc = transaction_service(self.broker)
        assert svc is not None
        producers = {producer for _k, _rec, _r, producer in to_verify}
        if len({pid for pid, _epoch in producers}) > 1:  # Kafka refuses such a request's transactional batches
            for _k, _rec, r, _p in to_verify:
                r.set_error(ApiError(ErrorCode.invalid_producer_id_mapping,
                                     "transactional records of more than one producer id"))
            return
        pid, epoch = next(iter(producers))
        keys = [k for k, _rec, _r, _p in to_verify]
        guards = {k: svc.start_verification(k[0], k[1], pid) for k in keys}
        # Produce v12 (transaction version 2): the leader adds the partitions to the transaction
        answer = asyncio.ensure_future(svc.verify_in_transaction(txn_id, pid, epoch, keys, add=version >= 12))
        for key, records, r, _p in to_verify:
            prev, mine = self._enqueue(key)
            task = asyncio.ensure_future(self._append_later(key, records, prev, mine, r, acks, timeout_ms,
                                                            (answer, guards[key], pid, version, epoch)))
            flushes.append((r, asyncio.shield(task), None, None))

    def _end_verification(self, key: Key, verification: Verification) -> bool:
        svc = transaction_service(self.broker)
        return svc is not None and svc.end_verification(key[0], key[1], verification[2], verification[1])

    def _verified(self, key: Key, plog: PartitionLog, verification: Verification) -> None:
        """Raise the Produce error for a partition the coordinator did not verify, or one
        whose verification a marker voided meanwhile (unless the producer's transaction on
        it is open again: a later batch of it was appended)."""
        answer, _guard, pid, version, epoch = verification
        still_valid = self._end_verification(key, verification)
        if answer.cancelled() or answer.exception() is not None:
            code = ErrorCode.network_exception
        else:
            code = answer.result()[key]
        error = verification_error(code, version)
        if error is not None:
            raise error
        if not still_valid and not has_ongoing_transaction(plog, pid, epoch):
            raise ApiError(ErrorCode.invalid_txn_state, "Record was not part of an ongoing transaction")

    # -- waiting --------------------------------------------------------------------------
    async def _wait_flushes(self, flushes: list[Flush]) -> None:
        """Wait for each fsync the flush policy asked for (they run meanwhile, together), then
        report each partition's outcome (:meth:`_flush_outcome`). The waits are the flushes'
        own futures: no task per partition."""
        pending = [waiter for _, waiter, _, _ in flushes if waiter is not None and not waiter.done()]
        if pending:
            await asyncio.wait(pending)  # raises only if this task itself is cancelled
        for r, waiter, key, plog in flushes:
            self._flush_outcome(r, waiter, key, plog)

    def _flush_outcome(self, r: PartitionResult, waiter: asyncio.Future[None] | None, key: Key | None,
                       plog: PartitionLog | None) -> None:
        """Report a partition's fsync, done (or not needed: ``waiter`` None), to
        ``broker.storage_errors``, and mark the partition's result failed if it failed."""
        storage_errors = self.broker.storage_errors
        if waiter is None:
            if key is not None:
                storage_errors.ok(key)
            return
        if waiter.cancelled():
            r.fail(ErrorCode.kafka_storage_error)  # the flusher stopped
            return
        e = waiter.exception()
        if e is None:
            if key is not None:
                storage_errors.ok(key)
            return
        if isinstance(e, OSError) and key is not None and plog is not None:
            storage_errors.failed(key, plog.offline or f"fsync failed: {e}")
        r.fail(ErrorCode.kafka_storage_error)

    def _after_flush(self, respond: Callable[[TopicResults], T], topic_results: TopicResults,
                     flushes: list[Flush]) -> T | asyncio.Future[T]:
        """The answer once the fsyncs the flush policy asked for are done (group commit): a
        future the connection answers from when it resolves, with no task of its own (the
        waits are callbacks on the flushes' futures); the answer itself when none is pending.
        Cancelling the future (the connection closed) leaves the flushes to others."""
        answer: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        pending = [waiter for _, waiter, _, _ in flushes if waiter is not None]
        left = [len(pending)]

        def finish() -> None:
            try:
                for r, waiter, key, plog in flushes:
                    self._flush_outcome(r, waiter, key, plog)
                answer.set_result(respond(topic_results))
            except Exception as e:  # a bug: the connection logs it and closes
                answer.set_exception(e)

        def one_done(waiter: asyncio.Future[None]) -> None:
            if not waiter.cancelled():
                waiter.exception()  # read, even when nobody waits for the answer any more
            left[0] -= 1
            if not left[0] and not answer.done():
                finish()

        if not pending:
            finish()
            return answer.result()
        for waiter in pending:
            waiter.add_done_callback(one_done)
        return answer

    async def _after_isr(self, respond: Callable[[TopicResults], T], topic_results: TopicResults,
                         flushes: list[Flush], isr_waits: list[IsrWait], timeout_ms: int) -> T:
        """acks=all in cluster mode: the local fsyncs, then every in-sync replica (one timeout
        for all the request's partitions, as Kafka's DelayedProduce)."""
        replicas: ReplicaManager = self.broker.replicas
        if flushes:
            await self._wait_flushes(flushes)
        waits = [(r, replica, replicas.isr_waiter(replica, end)) for r, replica, end in isr_waits]
        pending = [fut for _, _, fut in waits if fut is not None]
        if pending:
            await asyncio.wait(pending, timeout=max(timeout_ms, 1) / 1000)
        for r, replica, fut in waits:
            code = replicas.isr_outcome(replica, fut)
            if code != ErrorCode.none and r.error_code == ErrorCode.none:
                r.fail(code)
        return respond(topic_results)


def produce_service(broker: Broker) -> ProduceService:
    svc: ProduceService = broker.extensions["produce"]
    return svc


@on_start
async def _start(broker: Broker) -> None:
    broker.extensions["produce"] = ProduceService(broker)
