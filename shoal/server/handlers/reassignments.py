"""AlterPartitionReassignments (45) and ListPartitionReassignments (46).

Cluster mode: the receiving broker records each partition's target replica set in etcd
(``ClusterNode.reassign``; the partition's ``adding``/``removing`` replicas, a
compare-and-swap on its record) and answers once its own metadata shows it; the
controller completes a reassignment when every target replica is in the ISR (see
``shoal/cluster/partition_state.py``). A null replica list cancels (reverts) one:
NO_REASSIGNMENT_IN_PROGRESS when none runs. ListPartitionReassignments lists the ongoing
ones (every partition, or the ones asked for) with their adding and removing replicas.

One broker (local metadata) holds every partition on itself: a target other than this
broker is INVALID_REPLICA_ASSIGNMENT, this broker alone changes nothing, a cancel is
NO_REASSIGNMENT_IN_PROGRESS, and the list is always empty.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...errors import ApiError, ErrorCode
from ...protocol.messages.alter_partition_reassignments_request import AlterPartitionReassignmentsRequest
from ...protocol.messages.alter_partition_reassignments_response import (
    AlterPartitionReassignmentsResponse,
    ReassignablePartitionResponse,
    ReassignableTopicResponse,
)
from ...protocol.messages.list_partition_reassignments_request import ListPartitionReassignmentsRequest
from ...protocol.messages.list_partition_reassignments_response import (
    ListPartitionReassignmentsResponse,
    OngoingPartitionReassignment,
    OngoingTopicReassignment,
)
from ...security.authz import CLUSTER, CLUSTER_RESOURCE, DESCRIBE, allowed
from ..context import RequestContext
from ..dispatch import api
from .metadata import log_store

if TYPE_CHECKING:
    from ..broker import Broker

Ongoing = dict[tuple[str, int], tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]]
"""(topic, partition) -> (replicas, adding, removing) of each ongoing reassignment."""


def _local_outcome(broker: Broker, target: list[int] | None) -> ApiError | None:
    if target is None:
        return ApiError(ErrorCode.no_reassignment_in_progress)
    if list(target) != [broker.node_id]:
        return ApiError(ErrorCode.invalid_replica_assignment,
                        f"the only broker is {broker.node_id}; cannot place replicas on {list(target)}")
    return None


@api(45, 0, 1)
async def handle_alter_partition_reassignments(
        ctx: RequestContext, request: AlterPartitionReassignmentsRequest) -> AlterPartitionReassignmentsResponse:
    broker = ctx.broker
    store = log_store(broker)
    allow_rf_change = request.allow_replication_factor_change  # v0 has none: reads True, as Kafka's default
    targets: list[tuple[str, int, list[int] | None]] = []
    early: dict[tuple[str, int], ApiError] = {}
    for t in request.topics:
        meta = store.get_topic(t.name)
        for p in t.partitions:
            key = (t.name, p.partition_index)
            target = list(p.replicas) if p.replicas is not None else None
            if meta is None or not 0 <= p.partition_index < meta.num_partitions:
                early[key] = ApiError(ErrorCode.unknown_topic_or_partition)
            elif target is not None and not allow_rf_change and broker.cluster.clustered:
                view = broker.cluster.partition(t.name, p.partition_index)
                current = broker.cluster.reassignments().get(key)
                rf = (len(view.replicas) - len(current[1]) if current else len(view.replicas)) if view else len(target)
                if len(target) != rf:
                    early[key] = ApiError(ErrorCode.invalid_replication_factor,
                                          f"the replication factor would change from {rf} to {len(target)}")
            if key not in early:
                targets.append((t.name, p.partition_index, target))
    outcomes: list[ApiError | None]
    if broker.cluster.clustered:
        outcomes = await broker.cluster.reassign(targets)
    else:
        outcomes = [_local_outcome(broker, target) for _, _, target in targets]
    results = dict(early)
    for (topic, index, _), outcome in zip(targets, outcomes):
        if outcome is not None:
            results[(topic, index)] = outcome
    topics = []
    for t in request.topics:
        parts = []
        for p in t.partitions:
            e = results.get((t.name, p.partition_index))
            parts.append(ReassignablePartitionResponse(partition_index=p.partition_index,
                                                       error_code=e.error_code if e else ErrorCode.none,
                                                       error_message=e.message if e else None))
        topics.append(ReassignableTopicResponse(name=t.name, partitions=tuple(parts)))
    return AlterPartitionReassignmentsResponse(throttle_time=0, error_code=ErrorCode.none, error_message=None,
                                               responses=tuple(topics),
                                               allow_replication_factor_change=allow_rf_change)


@api(46, 0, 0)
def handle_list_partition_reassignments(
        ctx: RequestContext, request: ListPartitionReassignmentsRequest) -> ListPartitionReassignmentsResponse:
    broker = ctx.broker
    if broker.authorizer is not None and not allowed(ctx, DESCRIBE, CLUSTER, CLUSTER_RESOURCE):
        return ListPartitionReassignmentsResponse(throttle_time=0, error_code=ErrorCode.cluster_authorization_failed,
                                                  error_message="Cluster authorization failed.")
    ongoing: Ongoing = broker.cluster.reassignments() if broker.cluster.clustered else {}
    if request.topics is not None:
        wanted = {(t.name, i) for t in request.topics for i in t.partition_indexes}
        ongoing = {k: v for k, v in ongoing.items() if k in wanted}
    by_topic: dict[str, list[OngoingPartitionReassignment]] = {}
    for (topic, index), (replicas, adding, removing) in sorted(ongoing.items()):
        by_topic.setdefault(topic, []).append(OngoingPartitionReassignment(
            partition_index=index, replicas=replicas, adding_replicas=adding, removing_replicas=removing))
    return ListPartitionReassignmentsResponse(
        throttle_time=0, error_code=ErrorCode.none, error_message=None,
        topics=tuple(OngoingTopicReassignment(name=t, partitions=tuple(ps)) for t, ps in by_topic.items()))
