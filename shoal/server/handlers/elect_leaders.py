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

from typing import Any

from ...errors import ApiError, ErrorCode
from ...protocol.entities import make, sub
from ...security.authz import ALTER, cluster_refusal
from ..dispatch import api
from .metadata import INTERNAL_TOPICS

PREFERRED, UNCLEAN = 0, 1


def _targets(broker: Any, request: Any) -> list[tuple[str, list[int]]]:
    if request.topic_partitions is None:
        return [(m.name, list(range(m.num_partitions))) for m in broker.store.topics() if m.name not in INTERNAL_TOPICS]
    return [(t.topic, list(t.partitions)) for t in request.topic_partitions]


@api(43, 0, 2)
async def handle_elect_leaders(ctx: Any, request: Any) -> Any:
    if (denied := cluster_refusal(ctx, ALTER, replica_election_results=())) is not None:
        return denied
    broker = ctx.broker
    cls = ctx.response_type
    rcls = sub(cls, "ReplicaElectionResult")
    pcls = sub(cls, "PartitionResult")
    election_type = getattr(request, "election_type", PREFERRED)
    results = []
    for topic, partitions in _targets(broker, request):
        meta = broker.store.get_topic(topic)
        out = []
        for index in partitions:
            code, message = ErrorCode.none, None
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
            out.append(make(pcls, partition_id=index, error_code=code, error_message=message))
        results.append(make(rcls, topic=topic, partition_result=tuple(out)))
    return make(cls, throttle_time=0, error_code=ErrorCode.none, replica_election_results=tuple(results))
