"""Produce (key 0), v3-v12: the request read, one call into the produce service, the answer written.

The handler checks what concerns the request as a whole, as Kafka's KafkaApis does
before the append: a request without a transactional id that holds a batch with the
transactional bit is refused, every partition TRANSACTIONAL_ID_AUTHORIZATION_FAILED
(otherwise a read_committed reader would see records that were never committed); with
an authorizer, a request with a transactional batch also needs WRITE on its
TRANSACTIONAL_ID (else refused the same way), and each topic needs WRITE (its
partitions TOPIC_AUTHORIZATION_FAILED). Everything else (validation, the append, the
transaction checks, waiting for the fsync and the in-sync replicas) is one call,
:meth:`ProduceService.produce` (``server/produce_service.py``), with plain inputs: the
transactional id, acks, the timeout, and each topic's (partition, records).

The service hands back each partition's result once final; the answer is written from
them (``_answer``): packed directly (``protocol/produce_response.py``; the answer of
one partition that succeeded from a template kept per version, topic and partition),
except when it carries KIP-951 leader hints (cluster mode, v10+: a
NOT_LEADER_OR_FOLLOWER partition names its current leader and the response the
leader's endpoint) or for acks=0, which gets no response at all: the connection reads
the answer's partitions for errors instead (it closes when one failed, as Kafka does,
so that the client notices). Those are built as the typed response view. When the
service waits for an fsync the answer is a future, resolved by callbacks on the flush's
futures, with no task of its own.
"""

from __future__ import annotations

import datetime
import struct
from collections.abc import Awaitable

from ...cluster.metadata import ClusterMetadata
from ...errors import ErrorCode
from ...protocol.batch import CorruptBatchError, iter_batches
from ...protocol.codec import EncodedBody
from ...protocol.messages.produce_request import ProduceRequest
from ...protocol.messages.produce_response import (
    BatchIndexAndErrorMessage,
    LeaderIdAndEpoch,
    NodeEndpoint,
    PartitionProduceResponse,
    ProduceResponse,
    TopicProduceResponse,
)
from ...protocol.produce_response import write_one_partition, write_produce_response
from ...security.authz import TRANSACTIONAL_ID, WRITE, allowed, topic_allowed
from ..context import RequestContext
from ..dispatch import api
from ..produce_service import PartitionResult, TopicInput, TopicResults, produce_service
from .leader_hints import current_leader, leader_endpoints

Answer = EncodedBody | ProduceResponse

_EPOCH = datetime.datetime.fromtimestamp(0, datetime.UTC)

_BATCH_FRAMING = struct.Struct(">i4xb4xh")
"""From byte 8 of a record batch: its length, magic and attributes."""
_BATCH_ATTRIBUTES_END = 8 + _BATCH_FRAMING.size
_TRANSACTIONAL_BIT = 0x10
_NOTHING_REFUSED: frozenset[str] = frozenset()
_LEADER_HINTS_VERSION = 10
"""Produce v10 added current_leader and node_endpoints (KIP-951)."""


def _has_transactional_batch(topics: list[TopicInput]) -> bool:
    """Whether any batch of the request has the transactional bit (Kafka's
    ``RequestUtils.hasTransactionalRecords``); batches that cannot be framed are left to
    the validation."""
    for _name, partitions in topics:
        for _index, records in partitions:
            if not records:
                continue
            if len(records) >= _BATCH_ATTRIBUTES_END:
                length, magic, attributes = _BATCH_FRAMING.unpack_from(records, 8)
                if length + 12 == len(records) and magic == 2 and not attributes & _TRANSACTIONAL_BIT:
                    continue  # one batch (what producers send), not transactional: no need to parse it
            try:
                if any(h.is_transactional for h in iter_batches(memoryview(records))):
                    return True
            except CorruptBatchError:  # malformed: the validation answers it
                continue
    return False


@api(0, 3, 12)
def handle_produce(ctx: RequestContext, request: ProduceRequest) -> Answer | Awaitable[Answer]:
    broker = ctx.broker
    version = ctx.api_version
    acks = request.acks
    txn_id = request.transactional_id
    topics: list[TopicInput] = [(t.name, [(pd.index, pd.records) for pd in t.partition_data])
                                for t in request.topic_data]
    cluster = broker.cluster if broker.replicas is not None else None

    def respond(results: TopicResults) -> Answer:
        return _answer(version, acks, results, cluster)

    refusal = None
    if txn_id is None and _has_transactional_batch(topics):
        # Kafka refuses the whole request: a transactional batch needs a transactional id
        # (otherwise a read_committed reader would see records that were never committed).
        refusal = "a transactional batch in a Produce request without a transactional id"
    elif (txn_id is not None and broker.authorizer is not None and _has_transactional_batch(topics)
          and not allowed(ctx, WRITE, TRANSACTIONAL_ID, txn_id)):
        refusal = "Transactional Id authorization failed."
    if refusal is not None:
        refused_results: TopicResults = []
        for name, partitions in topics:
            results = []
            for index, _records in partitions:
                r = PartitionResult(index)
                r.error_code = ErrorCode.transactional_id_authorization_failed
                r.error_message = refusal
                results.append(r)
            refused_results.append((name, results))
        return _answer(version, acks, refused_results, None)
    refused: frozenset[str] | set[str] = _NOTHING_REFUSED
    if broker.authorizer is not None:
        refused = {name for name, _ in topics if not topic_allowed(ctx, WRITE, name)}
    timeout_ms = int(request.timeout.total_seconds() * 1000)
    return produce_service(broker).produce(txn_id, acks, timeout_ms, topics, respond, version=version,
                                           client_id=ctx.header.client_id, refused=refused)


def _answer(version: int, acks: int, topic_results: TopicResults, cluster: ClusterMetadata | None) -> Answer:
    """The response; in cluster mode with KIP-951 leader hints for NOT_LEADER_OR_FOLLOWER partitions (v10+).

    Without leader hints it is packed directly (``protocol/produce_response.py``; the
    answer of one partition that succeeded from a template), except for acks=0, whose
    view the connection reads for errors instead of sending it.
    """
    hints: tuple[dict[int, LeaderIdAndEpoch], tuple[NodeEndpoint, ...]] | None = None
    if cluster is not None and version >= _LEADER_HINTS_VERSION:
        hints = _leader_hints(cluster, topic_results)
    if hints is None and acks != 0:
        if len(topic_results) == 1 and len(topic_results[0][1]) == 1:
            r = topic_results[0][1][0]
            if r.error_code == ErrorCode.none and r.error_message is None and not r.record_errors:
                return EncodedBody(write_one_partition(version, topic_results[0][0], r.index, r.base_offset,
                                                       r.log_append_time_ms, r.log_start_offset))
        return EncodedBody(write_produce_response(version, [
            (name, [(r.index, r.error_code, r.base_offset, r.log_append_time_ms, r.log_start_offset,
                     r.error_message, r.record_errors) for r in results])
            for name, results in topic_results]))
    leaders, endpoints = hints if hints is not None else ({}, ())
    return ProduceResponse(
        responses=tuple(
            TopicProduceResponse(name=name, partition_responses=tuple(
                _partition_view(r, leaders.get(id(r))) for r in results))
            for name, results in topic_results),
        node_endpoints=endpoints,
    )


def _partition_view(r: PartitionResult, leader: LeaderIdAndEpoch | None) -> PartitionProduceResponse:
    append_time = (None if r.log_append_time_ms < 0
                   else _EPOCH + datetime.timedelta(milliseconds=r.log_append_time_ms))
    return PartitionProduceResponse(
        index=r.index, error_code=r.error_code, base_offset=r.base_offset, log_append_time=append_time,
        log_start_offset=r.log_start_offset, error_message=r.error_message,
        record_errors=tuple(BatchIndexAndErrorMessage(batch_index=i, batch_index_error_message=m)
                            for i, m in r.record_errors),
        current_leader=LeaderIdAndEpoch() if leader is None else leader)


def _leader_hints(cluster: ClusterMetadata,
                  topic_results: TopicResults) -> tuple[dict[int, LeaderIdAndEpoch], tuple[NodeEndpoint, ...]] | None:
    """KIP-951: the current leader of each NOT_LEADER_OR_FOLLOWER partition (by the id of
    its result) and the endpoints of the leaders named; None when no endpoint is named."""
    leaders: dict[int, LeaderIdAndEpoch] = {}
    for name, results in topic_results:
        for r in results:
            if r.error_code == ErrorCode.not_leader_or_follower:
                leader = current_leader(cluster, name, r.index)
                if leader is not None:
                    leaders[id(r)] = LeaderIdAndEpoch(leader_id=leader[0], leader_epoch=leader[1])
    endpoints = tuple(NodeEndpoint(node_id=e.node_id, host=e.host, port=e.port, rack=e.rack)
                      for e in leader_endpoints(cluster, (h.leader_id for h in leaders.values())))
    if not endpoints:  # no endpoint to name: the partitions' errors go without hints
        return None
    return leaders, endpoints
