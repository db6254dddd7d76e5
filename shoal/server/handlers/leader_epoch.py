"""OffsetsForLeaderEpoch (key 23), v2-v4: where a leader epoch ended in this leader's log.

A follower of a new leader asks it for its own latest epoch and cuts what follows the
answer (shoal/cluster/leader_epochs.py). Cluster mode answers from the partition's
leader-epoch cache, only on the leader (NOT_LEADER_OR_FOLLOWER elsewhere; FENCED_ /
UNKNOWN_LEADER_EPOCH for a stale / newer current leader epoch). One broker has a single
epoch, 0, that spans its whole log.
"""

from __future__ import annotations

from typing import Any

from ...errors import ApiError, ErrorCode
from ...protocol.entities import make, sub
from ...security.acls import Operation
from ...security.authz import CLUSTER, CLUSTER_RESOURCE, DESCRIBE, allowed, per_topic
from ..dispatch import api

CLUSTER_ACTION = Operation.CLUSTER_ACTION


@api(23, 2, 4)
def handle_offsets_for_leader_epoch(ctx: Any, request: Any) -> Any:
    """Kafka's check: CLUSTER_ACTION on the CLUSTER for a follower, else DESCRIBE on each topic."""
    tcls = sub(ctx.response_type, "OffsetForLeaderTopicResult")
    pcls = sub(ctx.response_type, "EpochEndOffset")

    def refused(t: Any) -> Any:
        return make(tcls, topic=t.topic, partitions=tuple(make(
            pcls, partition=p.partition, leader_epoch=-1, end_offset=-1,
            error_code=ErrorCode.topic_authorization_failed if replica < 0
            else ErrorCode.cluster_authorization_failed) for p in t.partitions))

    replica = getattr(request, "replica_id", -1)
    if replica >= 0 and ctx.broker.authorizer is not None:
        if not allowed(ctx, CLUSTER_ACTION, CLUSTER, CLUSTER_RESOURCE):
            return make(ctx.response_type, throttle_time=0, topics=tuple(refused(t) for t in request.topics))
        return _offsets_for_leader_epoch(ctx, request)
    return per_topic(ctx, request, _offsets_for_leader_epoch, DESCRIBE, "topics", "topics", refused,
                     lambda t: t.topic)


def _offsets_for_leader_epoch(ctx: Any, request: Any) -> Any:
    broker = ctx.broker
    cls = ctx.response_type
    tcls = sub(cls, "OffsetForLeaderTopicResult")
    pcls = sub(cls, "EpochEndOffset")
    replicas = broker.replicas
    topics = []
    for t in request.topics:
        parts = []
        for p in t.partitions:
            r: dict[str, Any] = {"partition": p.partition, "leader_epoch": -1, "end_offset": -1}
            try:
                meta = broker.store.get_topic(t.topic)
                if meta is None or not 0 <= p.partition < meta.num_partitions:
                    raise ApiError(ErrorCode.unknown_topic_or_partition)
                if replicas is None:
                    plog = broker.store.partition(t.topic, p.partition)
                    if p.current_leader_epoch > 0:
                        raise ApiError(ErrorCode.unknown_leader_epoch)
                    if p.leader_epoch >= 0:
                        r.update(leader_epoch=0, end_offset=plog.log_end_offset)
                else:
                    replica = replicas.leader_replica(t.topic, p.partition)
                    if p.current_leader_epoch >= 0 and p.current_leader_epoch != replica.leader_epoch:
                        raise ApiError(ErrorCode.fenced_leader_epoch if p.current_leader_epoch < replica.leader_epoch
                                       else ErrorCode.unknown_leader_epoch)
                    epoch, end = replica.epochs.end_offset_for(p.leader_epoch, replica.plog.log_end_offset)
                    r.update(leader_epoch=epoch, end_offset=end)
                r["error_code"] = ErrorCode.none
            except ApiError as e:
                r["error_code"] = e.error_code
            parts.append(make(pcls, **r))
        topics.append(make(tcls, topic=t.topic, partitions=tuple(parts)))
    return make(cls, throttle_time=0, topics=tuple(topics))
