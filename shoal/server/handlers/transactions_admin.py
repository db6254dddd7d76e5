"""Transactions for operators: DescribeProducers (61), DescribeTransactions (65),
ListTransactions (66) v0-v2, WriteTxnMarkers (27) v1-v2.

DescribeProducers reports each partition's producer state (epoch, last sequence and
timestamp, the first offset of the open transaction); DescribeTransactions and
ListTransactions report the transaction coordinator's state (Kafka's state names), and
WriteTxnMarkers appends commit or abort markers to this broker's partitions: the
transaction coordinator of another broker would send it, and Kafka's admin client sends
it to abort a hanging transaction (``kafka-transactions abort``). In cluster mode
DescribeTransactions answers NOT_COORDINATOR for a transactional id whose
``__transaction_state`` partition another broker leads (and, on any broker, for every id
before the topic exists: no transaction was begun yet), ListTransactions lists the
transactional ids of the partitions this broker leads (Kafka's admin client asks every
broker), and WriteTxnMarkers, sent by the coordinator to each partition's leader, is
answered once the markers are on every in-sync replica (as an acks=all append, within
``offsets.commit.timeout.ms``; NOT_ENOUGH_REPLICAS_AFTER_APPEND otherwise, and the
coordinator retries).

With an authorizer, as Kafka's broker checks them: DescribeProducers needs READ on each
topic (TOPIC_AUTHORIZATION_FAILED), DescribeTransactions DESCRIBE on each transactional id
(TRANSACTIONAL_ID_AUTHORIZATION_FAILED; the topics of the transaction the principal may not
DESCRIBE are left out), ListTransactions lists only the transactional ids the principal
may DESCRIBE, and WriteTxnMarkers (a broker's request) needs CLUSTER_ACTION on the
cluster (every partition CLUSTER_AUTHORIZATION_FAILED).
"""

from __future__ import annotations

import asyncio
import datetime
import re
from typing import Any

from ...errors import ApiError, ErrorCode
from ...protocol.messages import describe_producers_response as producers_resp
from ...protocol.messages import describe_transactions_response as describe_resp
from ...protocol.messages import list_transactions_response as list_resp
from ...protocol.messages import write_txn_markers_response as markers_resp
from ...protocol.messages.describe_producers_request import DescribeProducersRequest
from ...protocol.messages.describe_transactions_request import DescribeTransactionsRequest
from ...protocol.messages.list_transactions_request import ListTransactionsRequest
from ...protocol.messages.write_txn_markers_request import WriteTxnMarkersRequest
from ...security.acls import Operation
from ...security.authz import CLUSTER, CLUSTER_RESOURCE, DESCRIBE, READ, TRANSACTIONAL_ID, allowed, topic_allowed
from ...transactions.coordinator import TxnState
from ..context import RequestContext
from ..dispatch import api
from ..internal_topics import OFFSETS_TOPIC
from ..txn_service import transaction_service

_STATES = {s.kafka_name: s for s in TxnState}


def _partition_error(ctx: RequestContext, topic: str, partition: int) -> ErrorCode:
    store = ctx.broker.store
    meta = None if store is None else store.get_topic(topic)
    if meta is None or not 0 <= partition < meta.num_partitions:
        return ErrorCode.unknown_topic_or_partition
    replicas = ctx.broker.replicas
    if replicas is not None:
        try:
            replicas.leader_replica(topic, partition)
        except ApiError as e:
            return e.error_code
    return ErrorCode.none


@api(61, 0, 0)
def handle_describe_producers(
        ctx: RequestContext, request: DescribeProducersRequest) -> producers_resp.DescribeProducersResponse:
    pcls = producers_resp.PartitionResponse
    store = ctx.broker.store
    topics = []
    for t in request.topics:
        parts = []
        readable = topic_allowed(ctx, READ, t.name)
        for p in t.partition_indexes:
            code = _partition_error(ctx, t.name, p) if readable else ErrorCode.topic_authorization_failed
            if code != ErrorCode.none or store is None:
                parts.append(pcls(partition_index=p, error_code=code))
                continue
            plog = store.partition(t.name, p)
            ongoing = plog.txns.ongoing
            producers = tuple(
                producers_resp.ProducerState(producer_id=e.producer_id, producer_epoch=e.epoch, last_sequence=e.last_seq,
                     last_timestamp=e.last_timestamp, coordinator_epoch=e.coordinator_epoch,
                     current_txn_start_offset=ongoing.get(e.producer_id, -1))
                for e in sorted(plog.producers.entries.values(), key=lambda e: e.producer_id))
            parts.append(pcls(partition_index=p, active_producers=producers))
        topics.append(producers_resp.TopicResponse(name=t.name, partitions=tuple(parts)))
    return producers_resp.DescribeProducersResponse(topics=tuple(topics))


def _ms_time(ms: int) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC)


@api(65, 0, 0)
def handle_describe_transactions(
        ctx: RequestContext, request: DescribeTransactionsRequest) -> describe_resp.DescribeTransactionsResponse:
    scls = describe_resp.TransactionState
    svc = transaction_service(ctx.broker)
    out = []
    for txn_id in request.transactional_ids:
        permitted = ctx.broker.authorizer is None or allowed(ctx, DESCRIBE, TRANSACTIONAL_ID, txn_id)
        if svc is None:
            owner = ErrorCode.coordinator_not_available
        elif not svc.loaded:  # no __transaction_state yet: this broker coordinates no id, as Kafka says
            owner = ErrorCode.not_coordinator
        else:
            owner = svc.owner_error(txn_id)
        m = None if svc is None or owner != ErrorCode.none or not permitted else svc.find(txn_id)
        if m is None:
            code = (ErrorCode.transactional_id_authorization_failed if not permitted else
                    owner if owner != ErrorCode.none else ErrorCode.transactional_id_not_found)
            out.append(scls(error_code=code, transactional_id=txn_id, transaction_start_time=_ms_time(0),
                            producer_id=-1, producer_epoch=-1))
            continue
        by_topic: dict[str, list[int]] = {}
        for topic, p in sorted(m.partitions):
            if topic_allowed(ctx, DESCRIBE, topic, log_denied=False):
                by_topic.setdefault(topic, []).append(p)
        out.append(scls(transactional_id=txn_id, transaction_state=m.state.kafka_name,
                        transaction_timeout=m.timeout_ms, transaction_start_time=_ms_time(m.start_ms),
                        producer_id=m.producer_id, producer_epoch=m.producer_epoch,
                        topics=tuple(describe_resp.TopicData(topic=t, partitions=tuple(ps))
                                     for t, ps in by_topic.items())))
    return describe_resp.DescribeTransactionsResponse(transaction_states=tuple(out))


@api(66, 0, 2)
def handle_list_transactions(ctx: RequestContext, request: ListTransactionsRequest) -> list_resp.ListTransactionsResponse:
    svc = transaction_service(ctx.broker)
    states = list(request.state_filters or ())
    unknown = tuple(s for s in states if s not in _STATES)
    wanted = {_STATES[s] for s in states if s in _STATES}
    pids = set(request.producer_id_filters or ())
    duration = request.duration_filter  # v0 has none: reads -1 (no filter)
    pattern = request.transactional_id_pattern  # v2's: reads None before
    regex = None
    if pattern:
        try:
            regex = re.compile(pattern)
        except re.error:
            return list_resp.ListTransactionsResponse(error_code=ErrorCode.invalid_regular_expression,
                                                      unknown_state_filters=unknown)
    now = ctx.now_ms()
    out = []
    if svc is not None and not (states and not wanted):
        for shard in svc.runtime.shards:
            for m in shard.txns.values():
                if wanted and m.state not in wanted:
                    continue
                if pids and m.producer_id not in pids:
                    continue
                if duration >= 0 and (m.start_ms < 0 or now - m.start_ms < duration):
                    continue
                if regex is not None and not regex.fullmatch(m.transactional_id):
                    continue
                if ctx.broker.authorizer is not None and not allowed(
                        ctx, DESCRIBE, TRANSACTIONAL_ID, m.transactional_id, log_denied=False):
                    continue
                out.append(list_resp.TransactionState(transactional_id=m.transactional_id, producer_id=m.producer_id,
                                                      transaction_state=m.state.kafka_name))
    return list_resp.ListTransactionsResponse(unknown_state_filters=unknown, transaction_states=tuple(out))


@api(27, 1, 2)
async def handle_write_txn_markers(ctx: RequestContext, request: WriteTxnMarkersRequest) -> markers_resp.WriteTxnMarkersResponse:
    mcls, tcls, pcls = (markers_resp.WritableTxnMarkerResult, markers_resp.WritableTxnMarkerTopicResult,
                        markers_resp.WritableTxnMarkerPartitionResult)
    broker = ctx.broker
    if broker.authorizer is not None and not allowed(ctx, Operation.CLUSTER_ACTION, CLUSTER, CLUSTER_RESOURCE):
        code = ErrorCode.cluster_authorization_failed
        return markers_resp.WriteTxnMarkersResponse(markers=tuple(mcls(producer_id=m.producer_id, topics=tuple(
            tcls(name=t.name, partitions=tuple(pcls(partition_index=p, error_code=code) for p in t.partition_indexes))
            for t in m.topics)) for m in request.markers))
    now = ctx.now_ms()
    txns = transaction_service(broker)
    store = broker.store
    out: list[tuple[int, list[tuple[str, list[tuple[int, ErrorCode]]]]]] = []
    waits: list[tuple[list[tuple[int, ErrorCode]], int, Any, int]] = []
    """(the topic's results, the index of the partition's, its leader replica, the end offset to replicate)"""
    for marker in request.markers:
        topics: list[tuple[str, list[tuple[int, ErrorCode]]]] = []
        for t in marker.topics:
            parts: list[tuple[int, ErrorCode]] = []
            for p in t.partition_indexes:
                code = _partition_error(ctx, t.name, p)
                if code == ErrorCode.none and store is not None:
                    plog = store.partition(t.name, p)
                    try:
                        replica = None if broker.replicas is None else broker.replicas.leader_replica(t.name, p)
                        appended = plog.append_marker(marker.producer_id, marker.producer_epoch,
                                                      bool(marker.transaction_result), marker.coordinator_epoch,
                                                      now, leader_epoch=None if replica is None
                                                      else replica.leader_epoch)
                        if replica is not None:
                            broker.replicas.maybe_advance_hw(replica)
                        if txns is not None:  # a verification under way for this producer is void
                            txns.marker_written(t.name, p, marker.producer_id)
                        broker.append_waiters.notify(t.name, p)
                        if t.name == OFFSETS_TOPIC:
                            groups = broker.extensions.get("groups")
                            if groups is not None:
                                groups.runtime.shards[p].replay_marker(marker.producer_id,
                                                                       bool(marker.transaction_result))
                        if replica is not None:  # acks=all: answered once on every in-sync replica
                            waits.append((parts, len(parts), replica, appended.last_offset + 1))
                    except ApiError as e:
                        code = e.error_code
                    except OSError:
                        code = ErrorCode.kafka_storage_error
                parts.append((p, code))
            topics.append((t.name, parts))
        out.append((marker.producer_id, topics))
    if waits:
        timeout_ms = broker.config["offsets.commit.timeout.ms"]
        codes = await asyncio.gather(*(broker.replicas.wait_for_isr(r, end, timeout_ms) for _, _, r, end in waits))
        for (parts, at, _r, _end), code in zip(waits, codes):
            parts[at] = (parts[at][0], code)
    return markers_resp.WriteTxnMarkersResponse(markers=tuple(
        mcls(producer_id=pid, topics=tuple(
            tcls(name=name, partitions=tuple(pcls(partition_index=p, error_code=code) for p, code in parts))
            for name, parts in topics))
        for pid, topics in out))
