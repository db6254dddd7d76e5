"""Produce (key 0), v3-v12: record batch v2 bytes appended as they came.

A request without a transactional id that holds a batch with the transactional bit is
refused as a whole, every partition TRANSACTIONAL_ID_AUTHORIZATION_FAILED, as Kafka
does. With a transactional id, a transactional batch is appended only while its
producer's transaction is open and holds the partition (KIP-890 part 1: the transaction
coordinator checks producer id and epoch: INVALID_PRODUCER_EPOCH; INVALID_TXN_STATE, or
TRANSACTION_ABORTABLE from v11, when the partition is not in the transaction). On one
broker every transactional batch is checked; in cluster mode the leader asks the
coordinator (often another broker) before the producer's first transactional batch on
the partition, which waits meanwhile in the partition's queue (``_verify_then_append``),
and later batches of the transaction are checked by the partition's producer state
(INVALID_PRODUCER_EPOCH below the last marker's epoch). Produce v12 (transaction
version 2, KIP-890 part 2): the producer does not add its partitions itself; the
leader adds the partition to the transaction before its first batch there.
With an authorizer, a request with a transactional batch also needs WRITE on its
TRANSACTIONAL_ID, else it is refused as a whole the same way (as Kafka does).

Per partition: the topic and partition must exist and not be internal; the records are
validated as Kafka's LogValidator does (``protocol/records.py``: one batch, every record
walked, no control batch, a known codec, compressed payloads decompressed), and a
refused partition is answered with CORRUPT_MESSAGE or INVALID_RECORD (v8+: the index of
the record at fault in ``record_errors``) and nothing of it is written. The validation
checks the CRC-32C (or computes it for a batch it rewrites), so the log's append does
not compute it again; the log then checks framing, size and producer sequence, assigns
offsets and, for LogAppendTime topics, the timestamp.

A compressed batch is decompressed, walked (and, for a topic whose compression.type
differs, recompressed) in a worker thread, so the event loop keeps serving meanwhile.
Appends to one partition stay in arrival order: while a partition has a batch in a
worker, later produces to it wait their turn (``_PartitionQueue``).

In cluster mode (``broker.replicas`` set) only the partition's leader appends
(NOT_LEADER_OR_FOLLOWER elsewhere), stamping its leader epoch into each batch; acks=all
fails with NOT_ENOUGH_REPLICAS when the ISR is smaller than ``min.insync.replicas`` and
otherwise also waits until every in-sync replica has the records (the high watermark
passed them).
When the flush policy (``flush.messages``, ``flush.ms``; by default every append) asks
for an fsync, the response waits for it: the fsync starts in the next pass of the event
loop and is shared by every produce that appended to the partition by then (group
commit); a small one runs on the event loop while the disk is quick, the others in a
worker thread (``Flusher`` in server/broker.py). The answer is then a future, resolved
by callbacks on the flush's futures, with no task of its own. So an
acknowledged record is written and, where the policy says so, fsynced. acks=0 gets no
response at all: the connection drops the response, or closes when it carries an error
(as Kafka does, so that the client notices). A write the disk refuses (nothing of it is
left in the log) or an fsync that fails answers KAFKA_STORAGE_ERROR for that partition,
logged once per partition until it writes again.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import struct
import sys
from typing import Any

from ...errors import ApiError, ErrorCode
from ...protocol.batch import CorruptBatchError, iter_batches
from ...protocol.codec import EncodedBody
from ...protocol.entities import make, sub
from ...protocol.produce_response import write_one_partition, write_produce_response
from ...protocol.records import codec_of_compression_type, needs_worker, validate_produce_batch
from ...security.authz import TRANSACTIONAL_ID, WRITE, allowed, topic_allowed
from ..dispatch import api
from ..txn_service import (
    check_transactional_produce,
    has_ongoing_transaction,
    transaction_service,
    verification_error,
)
from .leader_hints import leader_hints
from .metadata import INTERNAL_TOPICS

log = logging.getLogger("shoal.produce")

_EPOCH = datetime.datetime.fromtimestamp(0, datetime.UTC)
_ONE_MS = datetime.timedelta(milliseconds=1)

Flush = tuple[dict[str, Any], "asyncio.Future[Any] | None", "tuple[str, int] | None", Any]
"""A partition's wait for the fsync the flush policy asked for: (its result, the flusher's
future or None when already durable, its key and log; key and log are None for the task
of a produce validated in a worker thread, which reports its partition itself)."""


_BATCH_FRAMING = struct.Struct(">i4xb4xh")
"""From byte 8 of a record batch: its length, magic and attributes."""
_BATCH_ATTRIBUTES_END = 8 + _BATCH_FRAMING.size
_TRANSACTIONAL_BIT = 0x10


def _append_time(ms: int) -> datetime.datetime | None:
    if ms < 0:
        return None
    return _EPOCH + datetime.timedelta(milliseconds=ms)


def _append_time_ms(when: datetime.datetime | None) -> int:
    return -1 if when is None else (when - _EPOCH) // _ONE_MS


class _PartitionQueue:
    """Per-partition tails of the produces still being validated in a worker thread.

    Event loop only. A produce to a partition with a tail waits for it before appending,
    so a later request never overtakes an earlier one (idempotent producers pipeline).
    """

    def __init__(self) -> None:
        self.tails: dict[tuple[str, int], asyncio.Future[None]] = {}

    def enqueue(self, key: tuple[str, int]) -> tuple[asyncio.Future[None] | None, asyncio.Future[None]]:
        prev = self.tails.get(key)
        mine: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.tails[key] = mine
        return prev, mine

    def done(self, key: tuple[str, int], mine: asyncio.Future[None]) -> None:
        if not mine.done():
            mine.set_result(None)
        if self.tails.get(key) is mine:
            del self.tails[key]


def _queue(broker: Any) -> _PartitionQueue:
    q = getattr(broker, "_produce_queue", None)
    if q is None:
        q = broker._produce_queue = _PartitionQueue()
    return q


def _set_error(r: dict[str, Any], e: ApiError, ecls: type | None) -> None:
    r["error_code"] = e.error_code
    r["error_message"] = e.message if e.message != e.error_code.name else None
    index = getattr(e, "record_index", None)
    if index is not None and ecls is not None:
        r["record_errors"] = (make(ecls, batch_index=index, batch_index_error_message=e.message),)


def _has_transactional_batch(request: Any) -> bool:
    """Whether any batch of the request has the transactional bit (Kafka's
    ``RequestUtils.hasTransactionalRecords``); batches that cannot be framed are left to
    the validation."""
    for topic in request.topic_data:
        for pd in topic.partition_data:
            records = pd.records
            if not records:
                continue
            if len(records) >= _BATCH_ATTRIBUTES_END:
                length, magic, attributes = _BATCH_FRAMING.unpack_from(records, 8)
                if length + 12 == len(records) and magic == 2 and not attributes & _TRANSACTIONAL_BIT:
                    continue  # one batch (what producers send), not transactional: no need to parse it
            try:
                if any(h.is_transactional for h in iter_batches(memoryview(pd.records))):
                    return True
            except CorruptBatchError:  # malformed: the validation answers it
                continue
    return False


def _validate(records: Any, plog: Any) -> Any:
    cfg = plog.config
    return validate_produce_batch(records, target_codec=codec_of_compression_type(cfg.compression_type),
                                  log_append_time=cfg.log_append_time, require_keys=cfg.compact)


@api(0, 3, 12)
def handle_produce(ctx: Any, request: Any) -> Any:
    broker = ctx.broker
    store = broker.store
    now_ms = ctx.now_ms()
    cls = ctx.response_type
    tcls = sub(cls, "TopicProduceResponse")
    pcls = sub(cls, "PartitionProduceResponse")
    ecls = getattr(sys.modules[cls.__module__], "BatchIndexAndErrorMessage", None)
    acks = request.acks
    queue = _queue(broker)
    timeout_ms = int(request.timeout.total_seconds() * 1000)
    topic_results: list[tuple[str, list[dict[str, Any]]]] = []
    txn_id = request.transactional_id
    refusal = None
    if txn_id is None and _has_transactional_batch(request):
        # Kafka refuses the whole request: a transactional batch needs a transactional id
        # (otherwise a read_committed reader would see records that were never committed).
        refusal = "a transactional batch in a Produce request without a transactional id"
    elif (txn_id is not None and broker.authorizer is not None and _has_transactional_batch(request)
          and not allowed(ctx, WRITE, TRANSACTIONAL_ID, txn_id)):
        refusal = "Transactional Id authorization failed."
    if refusal is not None:
        for topic in request.topic_data:
            topic_results.append((topic.name, [
                {"index": pd.index, "base_offset": -1, "log_append_time": None, "log_start_offset": -1,
                 "error_code": ErrorCode.transactional_id_authorization_failed, "error_message": refusal}
                for pd in topic.partition_data]))
        return _response(cls, tcls, pcls, topic_results, None, acks)
    flushes: list[Flush] = []
    isr_waits: list[tuple[dict[str, Any], Any, int]] = []
    to_verify: list[tuple[tuple[str, int], Any, dict[str, Any], tuple[int, int]]] = []
    for topic in request.topic_data:
        name = topic.name
        meta = store.get_topic(name)
        writable = topic_allowed(ctx, WRITE, name)
        results: list[dict[str, Any]] = []
        for pd in topic.partition_data:
            r: dict[str, Any] = {"index": pd.index, "base_offset": -1, "log_append_time": None,
                                 "log_start_offset": -1}
            try:
                if acks not in (0, 1, -1):
                    raise ApiError(ErrorCode.invalid_required_acks)
                if not writable:
                    raise ApiError(ErrorCode.topic_authorization_failed)
                if name in INTERNAL_TOPICS:
                    raise ApiError(ErrorCode.invalid_topic_exception, f"cannot produce to internal topic {name}")
                if meta is None:
                    broker.note_unknown_topic(ctx.header.client_id, name, "Produce does not create topics")
                    raise ApiError(ErrorCode.unknown_topic_or_partition)
                if not 0 <= pd.index < meta.num_partitions:
                    raise ApiError(ErrorCode.unknown_topic_or_partition)
                producer = None
                if txn_id is not None:
                    producer = check_transactional_produce(broker, txn_id, name, pd.index, pd.records,
                                                           ctx.api_version)
                plog = store.partition(name, pd.index)
                records = pd.records
                if not records:
                    raise ApiError(ErrorCode.corrupt_message, "empty record set")
                key = (name, pd.index)
                if producer is not None:  # asked of the coordinator first, then appended in turn
                    to_verify.append((key, records, r, producer))
                    results.append(r)
                    continue
                if needs_worker(records) or key in queue.tails:
                    prev, mine = queue.enqueue(key)
                    # A task of its own: the append happens even if this connection goes away
                    # meanwhile (as a synchronous one would have), and the tail is always released.
                    task = asyncio.ensure_future(
                        _append_later(broker, key, records, prev, mine, r, ecls, acks, timeout_ms))
                    flushes.append((r, asyncio.shield(task), None, None))
                    results.append(r)
                    continue
                validated = _validate(records, plog)
                _append(broker, plog, key, validated, now_ms, r, flushes, isr_waits, acks)
            except ApiError as e:
                _set_error(r, e, ecls)
            results.append(r)
        topic_results.append((name, results))
    if to_verify:
        _verify_then_append(broker, txn_id, to_verify, ecls, acks, timeout_ms, ctx.api_version, flushes)
    cluster = broker.cluster if broker.replicas is not None else None
    if isr_waits:
        return _after_isr(broker, cls, tcls, pcls, acks, topic_results, flushes, isr_waits, timeout_ms, cluster)
    if flushes:
        return _after_flush(broker, cls, tcls, pcls, acks, topic_results, flushes, cluster)
    return _response(cls, tcls, pcls, topic_results, cluster, acks)


def _append(broker: Any, plog: Any, key: tuple[str, int], validated: Any, now_ms: int, r: dict[str, Any],
            flushes: list[Flush], isr_waits: list[tuple[dict[str, Any], Any, int]],
            acks: int) -> None:
    """Append a validated batch (``protocol/records.py``'s Validated); queue its fsync
    (flush policy) and, in cluster mode, its ISR wait.

    Raises ApiError; KAFKA_STORAGE_ERROR when the disk refuses the write (nothing of it
    is left in the log) or the fsync of a rolled segment fails, reported to
    ``broker.storage_errors`` (logged once per partition).
    """
    replicas = broker.replicas
    batch = validated.batch
    try:
        if replicas is not None:
            replica = replicas.leader_replica(*key)
            if acks == -1 and len(replica.state.isr) < replicas.min_insync_replicas(key[0]):
                raise ApiError(ErrorCode.not_enough_replicas,
                               f"ISR {list(replica.state.isr)} is smaller than min.insync.replicas")
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
        # the request waits for it (_after_flush, _wait_flushes)
        flushes.append((r, broker.flusher.waiter(plog, plog.log_end_offset, inline_if_small=True), key, plog))
    else:
        broker.storage_errors.ok(key)
    r["base_offset"] = result.base_offset
    r["log_append_time"] = _append_time(result.log_append_time_ms)
    r["log_start_offset"] = plog.log_start_offset
    if result.record_count:
        broker.append_waiters.notify(*key)
    if broker.metrics is not None:
        broker.metrics.produced(key[0], result.record_count, len(batch))


async def _wait_flushes(broker: Any, flushes: list[Flush]) -> None:
    """Wait for each fsync the flush policy asked for (they run meanwhile, together), then
    report each partition's outcome (:func:`_flush_outcome`). The waits are the flushes'
    own futures: no task per partition."""
    pending = [waiter for _, waiter, _, _ in flushes if waiter is not None and not waiter.done()]
    if pending:
        await asyncio.wait(pending)  # raises only if this task itself is cancelled
    for r, waiter, key, plog in flushes:
        _flush_outcome(broker, r, waiter, key, plog)


def _flush_outcome(broker: Any, r: dict[str, Any], waiter: asyncio.Future[Any] | None, key: Any,
                   plog: Any) -> None:
    """Report a partition's fsync, done (or not needed: ``waiter`` None), to
    ``broker.storage_errors``, and mark the partition's result failed if it failed."""
    if waiter is None:
        if key is not None:
            broker.storage_errors.ok(key)
        return
    if waiter.cancelled():
        r.update(error_code=ErrorCode.kafka_storage_error, base_offset=-1)  # the flusher stopped
        return
    e = waiter.exception()
    if e is None:
        if key is not None:
            broker.storage_errors.ok(key)
        return
    if isinstance(e, OSError) and key is not None:
        broker.storage_errors.failed(key, plog.offline or f"fsync failed: {e}")
    r.update(error_code=ErrorCode.kafka_storage_error, base_offset=-1)


def _verify_then_append(broker: Any, txn_id: str,
                        to_verify: list[tuple[tuple[str, int], Any, dict[str, Any], tuple[int, int]]],
                        ecls: type | None, acks: int, timeout_ms: int, version: int, flushes: list[Flush]) -> None:
    """KIP-890: the first transactional batches of a producer on these partitions wait for
    the coordinator's word (cluster mode: is each in the transaction; Produce v12: each
    added to it; one question for all of them), each queued behind its partition's
    earlier produces, and later ones behind it."""
    svc = transaction_service(broker)
    assert svc is not None
    producers = {producer for _k, _rec, _r, producer in to_verify}
    if len({pid for pid, _epoch in producers}) > 1:  # Kafka refuses such a request's transactional batches
        for _k, _rec, r, _p in to_verify:
            _set_error(r, ApiError(ErrorCode.invalid_producer_id_mapping,
                                   "transactional records of more than one producer id"), ecls)
        return
    pid, epoch = next(iter(producers))
    keys = [k for k, _rec, _r, _p in to_verify]
    guards = {k: svc.start_verification(k[0], k[1], pid) for k in keys}
    # Produce v12 (transaction version 2): the leader adds the partitions to the transaction
    answer = asyncio.ensure_future(svc.verify_in_transaction(txn_id, pid, epoch, keys, add=version >= 12))
    queue = _queue(broker)
    for key, records, r, _p in to_verify:
        prev, mine = queue.enqueue(key)
        task = asyncio.ensure_future(_append_later(broker, key, records, prev, mine, r, ecls, acks, timeout_ms,
                                                   (answer, guards[key], pid, version, epoch)))
        flushes.append((r, asyncio.shield(task), None, None))


def _end_verification(broker: Any, key: tuple[str, int], verification: tuple[Any, Any, int, int, int]) -> bool:
    svc = transaction_service(broker)
    return svc is not None and svc.end_verification(key[0], key[1], verification[2], verification[1])


def _verified(broker: Any, key: tuple[str, int], plog: Any,
              verification: tuple[asyncio.Future[Any], Any, int, int, int]) -> None:
    """Raise the Produce error for a partition the coordinator did not verify, or one
    whose verification a marker voided meanwhile (unless the producer's transaction on
    it is open again: a later batch of it was appended)."""
    answer, _guard, pid, version, epoch = verification
    still_valid = _end_verification(broker, key, verification)
    if answer.cancelled() or answer.exception() is not None:
        code = ErrorCode.network_exception
    else:
        code = answer.result()[key]
    error = verification_error(code, version)
    if error is not None:
        raise error
    if not still_valid and not has_ongoing_transaction(plog, pid, epoch):
        raise ApiError(ErrorCode.invalid_txn_state, "Record was not part of an ongoing transaction")


async def _append_later(broker: Any, key: tuple[str, int], records: Any, prev: asyncio.Future[None] | None,
                        mine: asyncio.Future[None], r: dict[str, Any], ecls: type | None, acks: int,
                        timeout_ms: int, verification: tuple[asyncio.Future[Any], Any, int, int, int] | None = None,
                        ) -> None:
    """Validate in a worker thread (and wait for the coordinator's verification), wait for
    the partition's earlier produces, then append."""
    queue = _queue(broker)
    try:
        plog = broker.store.partition(*key)
        try:
            validated = await asyncio.to_thread(_validate, records, plog)
        except ApiError as e:
            validated = e
        if verification is not None:
            await asyncio.wait([verification[0]])  # its outcome, even a failure, is read by _verified
        if prev is not None:
            await prev
        if verification is not None:
            _verified(broker, key, plog, verification)
        if isinstance(validated, ApiError):
            raise validated
        meta = broker.store.get_topic(key[0])
        if meta is None or key[1] >= meta.num_partitions or broker.store.partition(*key) is not plog:
            raise ApiError(ErrorCode.unknown_topic_or_partition)
        flushes: list[Flush] = []
        isr_waits: list[tuple[dict[str, Any], Any, int]] = []
        _append(broker, plog, key, validated, broker.clock.now_ms(), r, flushes, isr_waits, acks)
    except ApiError as e:
        _set_error(r, e, ecls)
        return
    finally:
        queue.done(key, mine)
        if verification is not None:
            _end_verification(broker, key, verification)
    await _wait_flushes(broker, flushes)
    if r.get("error_code", ErrorCode.none) != ErrorCode.none:
        return
    for _, replica, end in isr_waits:
        code = await broker.replicas.wait_for_isr(replica, end, timeout_ms)
        if code != ErrorCode.none:
            r.update(error_code=code, base_offset=-1)


def _response(cls: type[Any], tcls: type, pcls: type, topic_results: list[tuple[str, list[dict[str, Any]]]],
              cluster: Any = None, acks: int = -1) -> Any:
    """The response; in cluster mode with KIP-951 leader hints for NOT_LEADER_OR_FOLLOWER partitions.

    Without leader hints it is packed directly (``protocol/produce_response.py``; the
    answer of one partition that succeeded from a template), except for acks=0, whose
    entities the connection reads for errors instead of sending them.
    """
    extra: dict[str, Any] = {}
    if cluster is not None:
        items = [(name, r["index"], r) for name, results in topic_results for r in results]
        node_endpoints = leader_hints(cluster, cls, pcls, items)
        if node_endpoints:
            extra["node_endpoints"] = node_endpoints
    if not extra and acks != 0:
        if len(topic_results) == 1 and len(topic_results[0][1]) == 1:
            r = topic_results[0][1][0]
            if (r.get("error_code", ErrorCode.none) == ErrorCode.none and r.get("error_message") is None
                    and not r.get("record_errors")):
                return EncodedBody(write_one_partition(
                    cls.__version__, topic_results[0][0], r["index"], r["base_offset"],
                    _append_time_ms(r["log_append_time"]), r["log_start_offset"]))
        return EncodedBody(write_produce_response(cls.__version__, [
            (name, [(r["index"], r.get("error_code", ErrorCode.none), r["base_offset"],
                     _append_time_ms(r["log_append_time"]), r["log_start_offset"], r.get("error_message"),
                     [(e.batch_index, e.batch_index_error_message) for e in r.get("record_errors", ())])
                    for r in results])
            for name, results in topic_results]))
    return make(
        cls,
        responses=tuple(
            make(tcls, name=name, partition_responses=tuple(make(pcls, **r) for r in results))
            for name, results in topic_results
        ),
        throttle_time=0,
        **extra,
    )


def _after_flush(broker: Any, cls: type, tcls: type, pcls: type, acks: int,
                 topic_results: list[tuple[str, list[dict[str, Any]]]],
                 flushes: list[Flush], cluster: Any = None) -> Any:
    """The answer once the fsyncs the flush policy asked for are done (group commit): a
    future the connection answers from when it resolves, with no task of its own (the
    waits are callbacks on the flushes' futures); the answer itself when none is pending.
    Cancelling the future (the connection closed) leaves the flushes to others."""
    answer: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    pending = [waiter for _, waiter, _, _ in flushes if waiter is not None]
    left = [len(pending)]

    def finish() -> None:
        try:
            for r, waiter, key, plog in flushes:
                _flush_outcome(broker, r, waiter, key, plog)
            answer.set_result(_response(cls, tcls, pcls, topic_results, cluster, acks))
        except Exception as e:  # a bug: the connection logs it and closes
            answer.set_exception(e)

    def one_done(waiter: asyncio.Future[Any]) -> None:
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


async def _after_isr(broker: Any, cls: type, tcls: type, pcls: type, acks: int,
                     topic_results: list[tuple[str, list[dict[str, Any]]]], flushes: list[Flush],
                     isr_waits: list[tuple[dict[str, Any], Any, int]], timeout_ms: int, cluster: Any) -> Any:
    """acks=all in cluster mode: the local fsyncs, then every in-sync replica (one timeout
    for all the request's partitions, as Kafka's DelayedProduce)."""
    replicas = cluster.replicas
    if flushes:
        await _wait_flushes(broker, flushes)
    waits = [(r, replica, replicas.isr_waiter(replica, end)) for r, replica, end in isr_waits]
    pending = [fut for _, _, fut in waits if fut is not None]
    if pending:
        await asyncio.wait(pending, timeout=max(timeout_ms, 1) / 1000)
    for r, replica, fut in waits:
        code = replicas.isr_outcome(replica, fut)
        if code != ErrorCode.none and r.get("error_code", ErrorCode.none) == ErrorCode.none:
            r.update(error_code=code, base_offset=-1)
    return _response(cls, tcls, pcls, topic_results, cluster, acks)
