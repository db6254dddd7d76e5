"""Produce (key 0), v3-v11: record batch v2 bytes appended as they came.

Per partition: the topic and partition must exist and not be internal; the log
validates every batch (framing, magic, CRC-32C, size, producer sequence) before
writing any of them, assigns offsets and, for LogAppendTime topics, the timestamp.
When the flush policy (``flush.messages``, ``flush.ms``; by default every append) asks
for an fsync, the response waits for it: the fsync runs off the event loop and is shared
by every produce that appended to the partition meanwhile (group commit). So an
acknowledged record is written and, where the policy says so, fsynced. acks=0 gets no
response at all.

In cluster mode (``broker.replicas`` set) only the partition's leader appends
(NOT_LEADER_OR_FOLLOWER elsewhere), stamping its leader epoch into each batch; acks=all
fails with NOT_ENOUGH_REPLICAS when the ISR is smaller than ``min.insync.replicas`` and
otherwise also waits until every in-sync replica has the records (the high watermark
passed them).
"""

from __future__ import annotations

import asyncio
import datetime
import logging
from typing import Any

from ...errors import ApiError, ErrorCode
from ...protocol.entities import make, sub
from ..dispatch import api
from .metadata import INTERNAL_TOPICS

log = logging.getLogger("shoal.produce")

_EPOCH = datetime.datetime.fromtimestamp(0, datetime.UTC)


def _append_time(ms: int) -> datetime.datetime | None:
    if ms < 0:
        return None
    return _EPOCH + datetime.timedelta(milliseconds=ms)


@api(0, 3, 11)
def handle_produce(ctx: Any, request: Any) -> Any:
    broker = ctx.broker
    store = broker.store
    now_ms = ctx.now_ms()
    cls = ctx.response_type
    tcls = sub(cls, "TopicProduceResponse")
    pcls = sub(cls, "PartitionProduceResponse")
    acks = request.acks
    topic_results: list[tuple[str, list[dict[str, Any]]]] = []
    flushes: list[tuple[dict[str, Any], Any]] = []
    replicas = broker.replicas
    isr_waits: list[tuple[dict[str, Any], Any, int]] = []
    for topic in request.topic_data:
        name = topic.name
        meta = store.get_topic(name)
        results: list[dict[str, Any]] = []
        for pd in topic.partition_data:
            r: dict[str, Any] = {"index": pd.index, "base_offset": -1, "log_append_time": None,
                                 "log_start_offset": -1}
            try:
                if acks not in (0, 1, -1):
                    raise ApiError(ErrorCode.invalid_required_acks)
                if name in INTERNAL_TOPICS:
                    raise ApiError(ErrorCode.invalid_topic_exception, f"cannot produce to internal topic {name}")
                if meta is None or not 0 <= pd.index < meta.num_partitions:
                    raise ApiError(ErrorCode.unknown_topic_or_partition)
                if request.transactional_id is not None:
                    raise ApiError(ErrorCode.transactional_id_authorization_failed,
                                   "transactions are not supported yet")
                plog = store.partition(name, pd.index)
                records = pd.records
                if not records:
                    raise ApiError(ErrorCode.corrupt_message, "empty record set")
                if replicas is not None:
                    replica = replicas.leader_replica(name, pd.index)
                    if acks == -1 and len(replica.state.isr) < replicas.min_insync_replicas(name):
                        raise ApiError(ErrorCode.not_enough_replicas,
                                       f"ISR {list(replica.state.isr)} is smaller than min.insync.replicas")
                    result = plog.append(records, now_ms, defer_flush=True, leader_epoch=replica.leader_epoch)
                    replicas.maybe_advance_hw(replica)
                    if acks == -1:
                        isr_waits.append((r, replica, result.last_offset + 1))
                else:
                    result = plog.append(records, now_ms, defer_flush=True)
                if plog.flush_due(now_ms):
                    flushes.append((r, broker.flusher.durable(plog, plog.log_end_offset)))
                r["base_offset"] = result.base_offset
                r["log_append_time"] = _append_time(result.log_append_time_ms)
                r["log_start_offset"] = plog.log_start_offset
                if result.record_count:
                    broker.append_waiters.notify(name, pd.index)
            except ApiError as e:
                r["error_code"] = e.error_code
                r["error_message"] = e.message if e.message != e.error_code.name else None
            results.append(r)
        topic_results.append((name, results))
    if isr_waits:
        return _after_isr(cls, tcls, pcls, acks, topic_results, flushes, isr_waits,
                          int(request.timeout.total_seconds() * 1000), replicas)
    if flushes:
        return _after_flush(cls, tcls, pcls, acks, topic_results, flushes)
    if acks == 0:
        return None
    return _response(cls, tcls, pcls, topic_results)


def _response(cls: type, tcls: type, pcls: type, topic_results: list[tuple[str, list[dict[str, Any]]]]) -> Any:
    return make(
        cls,
        responses=tuple(
            make(tcls, name=name, partition_responses=tuple(make(pcls, **r) for r in results))
            for name, results in topic_results
        ),
        throttle_time=0,
    )


async def _after_flush(cls: type, tcls: type, pcls: type, acks: int,
                       topic_results: list[tuple[str, list[dict[str, Any]]]],
                       flushes: list[tuple[dict[str, Any], Any]]) -> Any:
    """Wait for the fsyncs the flush policy asked for, then answer (group commit)."""
    outcomes = await asyncio.gather(*(f for _, f in flushes), return_exceptions=True)
    for (r, _), outcome in zip(flushes, outcomes):
        if isinstance(outcome, BaseException):
            log.error("fsync of partition %s failed: %s", r["index"], outcome)
            r.update(error_code=ErrorCode.kafka_storage_error, base_offset=-1)
    if acks == 0:
        return None
    return _response(cls, tcls, pcls, topic_results)


async def _after_isr(cls: type, tcls: type, pcls: type, acks: int,
                     topic_results: list[tuple[str, list[dict[str, Any]]]], flushes: list[tuple[dict[str, Any], Any]],
                     isr_waits: list[tuple[dict[str, Any], Any, int]], timeout_ms: int, replicas: Any) -> Any:
    """acks=all in cluster mode: the local fsyncs, then every in-sync replica."""
    if flushes:
        await _after_flush(cls, tcls, pcls, acks, topic_results, flushes)
    codes = await asyncio.gather(*(replicas.wait_for_isr(replica, end, timeout_ms)
                                   for r, replica, end in isr_waits))
    for (r, _, _), code in zip(isr_waits, codes):
        if code != ErrorCode.none and r.get("error_code", ErrorCode.none) == ErrorCode.none:
            r.update(error_code=code, base_offset=-1)
    return _response(cls, tcls, pcls, topic_results)
