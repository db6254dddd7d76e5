"""ElectLeaders (key 43), v0-v2: move leadership to each partition's preferred replica.

Preferred elections only (``election_type`` 0); an unclean election (1) is refused with
INVALID_REQUEST, as ``unclean.leader.election.enable`` only supports false. One broker
already leads everything: ELECTION_NOT_NEEDED. In cluster mode the receiving broker
writes the change (a compare-and-swap on the partition's record) and answers once its
copy of the metadata shows it: ELECTION_NOT_NEEDED when the preferred replica already
leads, PREFERRED_LEADER_NOT_AVAILABLE when it is not live and in the ISR.
A null topic list means every partition (internal topics excepted).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...errors import ApiError, ErrorCode
from ...protocol.messages.elect_leaders_request import ElectLeadersRequest
from ...protocol.messages.elect_leaders_response import (
    ElectLeadersResponse,
    PartitionResult,
    ReplicaElectionResult,
)
from ...security.authz import ALTER, CLUSTER, CLUSTER_RESOURCE, allowed
from ..context import RequestContext
from ..dispatch import api
from .metadata import INTERNAL_TOPICS, log_store

if TYPE_CHECKING:
    from ..broker import Broker

PREFERRED, UNCLEAN = 0, 1


def _targets(broker: Broker, request: ElectLeadersRequest) -> list[tuple[str, list[int]]]:
    if request.topic_partitions is None:
        return [(m.name, list(range(m.num_partitions))) for m in log_store(broker).topics()
                if m.name not in INTERNAL_TOPICS]
    return [(t.topic, list(t.partitions)) for t in request.topic_partitions]


@api(43, 0, 2)
async def handle_elect_leaders(ctx: RequestContext, request: ElectLeadersRequest) -> ElectLeadersResponse:
    broker = ctx.broker
    if broker.authorizer is not None and not allowed(ctx, ALTER, CLUSTER, CLUSTER_RESOURCE):
        return ElectLeadersResponse(throttle_time=0, error_code=ErrorCode.cluster_authorization_failed)
    election_type = request.election_type  # v0 has none: reads 0, PREFERRED
    store = log_store(broker)
    results = []
    for topic, partitions in _targets(broker, request):
        meta = store.get_topic(topic)
        out = []
        for index in partitions:
            code: ErrorCode = ErrorCode.none
            message: str | None = None
            try:
                if meta is None or not 0 <= index < meta.num_partitions or topic in INTERNAL_TOPICS:
                    raise ApiError(ErrorCode.unknown_topic_or_partition)
                if election_type != PREFERRED:
                    raise ApiError(ErrorCode.invalid_request, "only preferred leader elections are supported")
                if not broker.cluster.clustered:
                    raise ApiError(ErrorCode.election_not_needed)
                await broker.cluster.elect_preferred(topic, index)
            except ApiError as e:
                code, message = e.error_code, e.message if e.message != e.error_code.name else None
            out.append(PartitionResult(partition_id=index, error_code=code, error_message=message))
        results.append(ReplicaElectionResult(topic=topic, partition_result=tuple(out)))
    return ElectLeadersResponse(throttle_time=0, error_code=ErrorCode.none, replica_election_results=tuple(results))
