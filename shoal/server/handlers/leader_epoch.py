"""OffsetsForLeaderEpoch (key 23), v2-v4: where a leader epoch ended in this leader's log.

A follower of a new leader asks it for its own latest epoch and cuts what follows the
answer (shoal/cluster/leader_epochs.py). Cluster mode answers from the partition's
leader-epoch cache, only on the leader (NOT_LEADER_OR_FOLLOWER elsewhere; FENCED_ /
UNKNOWN_LEADER_EPOCH for a stale / newer current leader epoch). One broker has a single
epoch, 0, that spans its whole log.
"""

from __future__ import annotations

from ...errors import ApiError, ErrorCode
from ...protocol.messages.offset_for_leader_epoch_request import (
    OffsetForLeaderEpochRequest,
    OffsetForLeaderPartition,
    OffsetForLeaderTopic,
)
from ...protocol.messages.offset_for_leader_epoch_response import (
    EpochEndOffset,
    OffsetForLeaderEpochResponse,
    OffsetForLeaderTopicResult,
)
from ...security.acls import Operation
from ...security.authz import CLUSTER, CLUSTER_RESOURCE, DESCRIBE, allowed, per_topic
from ..context import RequestContext
from ..dispatch import api

CLUSTER_ACTION = Operation.CLUSTER_ACTION


def _topic(t: OffsetForLeaderTopic) -> str:
    return t.topic


@api(23, 2, 4)
def handle_offsets_for_leader_epoch(ctx: RequestContext,
                                    request: OffsetForLeaderEpochRequest) -> OffsetForLeaderEpochResponse:
    """Kafka's check: CLUSTER_ACTION on the CLUSTER for a follower, else DESCRIBE on each topic."""
    replica = request.replica_id if ctx.api_version >= 3 else -1  # ReplicaId from v3

    def refused(t: OffsetForLeaderTopic) -> OffsetForLeaderTopicResult:
        code = ErrorCode.topic_authorization_failed if replica < 0 else ErrorCode.cluster_authorization_failed
        return OffsetForLeaderTopicResult(topic=t.topic, partitions=tuple(
            EpochEndOffset(partition=p.partition, leader_epoch=-1, end_offset=-1, error_code=code)
            for p in t.partitions))

    if replica >= 0 and ctx.broker.authorizer is not None:
        if not allowed(ctx, CLUSTER_ACTION, CLUSTER, CLUSTER_RESOURCE):
            return OffsetForLeaderEpochResponse(topics=tuple(refused(t) for t in request.topics))
        return _offsets_for_leader_epoch(ctx, request)
    response: OffsetForLeaderEpochResponse = per_topic(ctx, request, _offsets_for_leader_epoch, DESCRIBE, "topics",
                                                       "topics", refused, _topic)
    return response


def _end_offset(ctx: RequestContext, topic: str, p: OffsetForLeaderPartition) -> EpochEndOffset:
    broker = ctx.broker
    replicas = broker.replicas
    try:
        meta = broker.fetch_service.store().get_topic(topic)
        if meta is None or not 0 <= p.partition < meta.num_partitions:
            raise ApiError(ErrorCode.unknown_topic_or_partition)
        if replicas is None:
            plog = broker.fetch_service.store().partition(topic, p.partition)
            if p.current_leader_epoch > 0:
                raise ApiError(ErrorCode.unknown_leader_epoch)
            if p.leader_epoch >= 0:
                return EpochEndOffset(partition=p.partition, error_code=ErrorCode.none, leader_epoch=0,
                                      end_offset=plog.log_end_offset)
            return EpochEndOffset(partition=p.partition, error_code=ErrorCode.none, leader_epoch=-1, end_offset=-1)
        replica = replicas.leader_replica(topic, p.partition)
        if p.current_leader_epoch >= 0 and p.current_leader_epoch != replica.leader_epoch:
            raise ApiError(ErrorCode.fenced_leader_epoch if p.current_leader_epoch < replica.leader_epoch
                           else ErrorCode.unknown_leader_epoch)
        epoch, end = replica.epochs.end_offset_for(p.leader_epoch, replica.plog.log_end_offset)
        return EpochEndOffset(partition=p.partition, error_code=ErrorCode.none, leader_epoch=epoch, end_offset=end)
    except ApiError as e:
        return EpochEndOffset(partition=p.partition, error_code=e.error_code, leader_epoch=-1, end_offset=-1)


def _offsets_for_leader_epoch(ctx: RequestContext, request: OffsetForLeaderEpochRequest) -> OffsetForLeaderEpochResponse:
    return OffsetForLeaderEpochResponse(topics=tuple(
        OffsetForLeaderTopicResult(topic=t.topic, partitions=tuple(_end_offset(ctx, t.topic, p) for p in t.partitions))
        for t in request.topics))
