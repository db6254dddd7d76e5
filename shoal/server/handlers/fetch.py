"""Fetch (key 1), v4-v17: the request translated into one call of the fetch service.

The handler turns the request into a plain ``FetchParams`` (topic ids resolved to names
from v13, the replica id and epoch from ``ReplicaState`` from v15, the incremental fetch
session from v7), makes one call, ``broker.fetch_service.fetch`` (reads, the long poll as
a delayed operation, the session's choice of partitions: ``server/fetch_service.py``), and
turns its result into the answer. Partitions of topic ids the broker does not know are
answered UNKNOWN_TOPIC_ID (and the fetch does not wait). In cluster mode a partition
answered NOT_LEADER_OR_FOLLOWER carries the current leader (v12+) and the response the
leaders' endpoints (v16+, KIP-951). The common answer of v12-v17 (no leader hints) is
packed directly (``protocol/fetch_response.py``); the others are the response view.
"""

from __future__ import annotations

import uuid

from ...errors import ErrorCode
from ...log.store import LogStore
from ...protocol.codec import EncodedPieces
from ...protocol.entities import ZERO_UUID
from ...protocol.fetch_response import write_fetch_response
from ...protocol.messages.fetch_request import FetchRequest
from ...protocol.messages.fetch_response import (
    AbortedTransaction,
    FetchableTopicResponse,
    FetchResponse,
    LeaderIdAndEpoch,
    NodeEndpoint,
    PartitionData,
)
from ...security.authz import READ, topic_allowed
from ..context import RequestContext
from ..dispatch import api
from ..fetch_service import FetchParams, PartitionRead
from ..fetch_session import PartitionKey, SessionPartition
from .leader_hints import current_leader, leader_endpoints

_UNKNOWN_ID = PartitionRead(ErrorCode.unknown_topic_id)
_NO_LEADER = LeaderIdAndEpoch()


def _requested(store: LogStore, request: FetchRequest, use_ids: bool) -> tuple[
        dict[PartitionKey, SessionPartition], dict[PartitionKey, int], dict[PartitionKey, uuid.UUID],
        list[PartitionKey]]:
    """The request's partitions keyed by (topic name, partition), the current leader epochs
    named, the partitions of unknown topic ids (with the id), the forgotten partitions."""
    wanted: dict[PartitionKey, SessionPartition] = {}
    epochs: dict[PartitionKey, int] = {}
    unknown: dict[PartitionKey, uuid.UUID] = {}
    for t in request.topics:
        if use_ids:
            topic_id = t.topic_id or ZERO_UUID  # kio reads the zero uuid as None
            meta = store.topic_by_id(topic_id)
            if meta is None:
                name = f"<unknown {topic_id}>"
                for p in t.partitions:
                    unknown[(name, p.partition)] = topic_id
                continue
            name = meta.name
        else:
            name = t.topic
        for p in t.partitions:
            wanted[(name, p.partition)] = SessionPartition(p.fetch_offset, p.partition_max_bytes)
            epoch = p.current_leader_epoch  # -1 before v9
            if epoch >= 0:
                epochs[(name, p.partition)] = epoch
    forgotten: list[PartitionKey] = []
    for f in request.forgotten_topics_data:  # () before v7
        if use_ids:
            found = store.topic_by_id(f.topic_id or ZERO_UUID)
            if found is None:
                continue
            name = found.name
        else:
            name = f.topic
        forgotten.extend((name, p) for p in f.partitions)
    return wanted, epochs, unknown, forgotten


def _leader_hints(ctx: RequestContext, results: list[tuple[PartitionKey, PartitionRead]]) -> tuple[
        dict[PartitionKey, LeaderIdAndEpoch], tuple[NodeEndpoint, ...]]:
    """KIP-951: the current leader of each partition answered NOT_LEADER_OR_FOLLOWER (v12+),
    and the endpoints of the leaders named on the request's listener (v16+)."""
    if ctx.api_version < 12:  # CurrentLeader from v12
        return {}, ()
    cluster = ctx.broker.cluster
    hints: dict[PartitionKey, LeaderIdAndEpoch] = {}
    for key, r in results:
        if r.error_code == ErrorCode.not_leader_or_follower:
            leader = current_leader(cluster, *key)
            if leader is not None:
                hints[key] = LeaderIdAndEpoch(leader_id=leader[0], leader_epoch=leader[1])
    if not hints or ctx.api_version < 16:  # NodeEndpoints from v16
        return hints, ()
    return hints, tuple(NodeEndpoint(node_id=e.node_id, host=e.host, port=e.port, rack=e.rack)
                        for e in leader_endpoints(cluster, (h.leader_id for h in hints.values())))


def _partition_data(index: int, r: PartitionRead, leader: LeaderIdAndEpoch) -> PartitionData:
    aborted = r.aborted
    return PartitionData(
        partition_index=index, error_code=ErrorCode(r.error_code), high_watermark=r.high_watermark,
        last_stable_offset=r.last_stable_offset, log_start_offset=r.log_start_offset, records=r.records,
        preferred_read_replica=-1, current_leader=leader,
        aborted_transactions=None if aborted is None else tuple(
            AbortedTransaction(producer_id=pid, first_offset=first) for pid, first in aborted))


@api(1, 4, 17)
async def handle_fetch(ctx: RequestContext, request: FetchRequest) -> FetchResponse | EncodedPieces:
    broker = ctx.broker
    store = broker.fetch_service.store()
    version = ctx.api_version
    use_ids = version >= 13
    wanted, epochs, unknown, forgotten = _requested(store, request, use_ids)
    if version >= 15:  # ReplicaState from v15, ReplicaId before
        replica_id, replica_epoch = request.replica_state.replica_id, request.replica_state.replica_epoch
    else:
        replica_id, replica_epoch = request.replica_id, -1
    params = FetchParams(
        partitions=wanted, epochs=epochs, forgotten=forgotten,
        # a partition of an unknown topic id is an error: answered at once
        max_wait_ms=0 if unknown else int(request.max_wait.total_seconds() * 1000),
        min_bytes=request.min_bytes, max_bytes=request.max_bytes, committed=request.isolation_level == 1,
        replica_id=replica_id, replica_epoch=replica_epoch,
        use_session=version >= 7, session_id=request.session_id, session_epoch=request.session_epoch,
        file_slices=ctx.connection.sends_file_slices,
        readable=None if broker.authorizer is None else lambda name: topic_allowed(ctx, READ, name))
    result = await broker.fetch_service.fetch(params)
    if result.error_code:
        return FetchResponse(error_code=ErrorCode(result.error_code))

    hints: dict[PartitionKey, LeaderIdAndEpoch] = {}
    endpoints: tuple[NodeEndpoint, ...] = ()
    if broker.replicas is not None and any(r.error_code == ErrorCode.not_leader_or_follower
                                           for _, r in result.partitions):
        hints, endpoints = _leader_hints(ctx, result.partitions)
    answered: dict[str, list[tuple[int, PartitionRead]]] = {}
    for (name, index), r in result.partitions:
        answered.setdefault(name, []).append((index, r))
    for name, index in unknown:
        answered.setdefault(name, []).append((index, _UNKNOWN_ID))

    def topic_id(name: str, first_index: int) -> uuid.UUID:
        meta = store.get_topic(name)
        return meta.topic_id if meta is not None else unknown.get((name, first_index), ZERO_UUID)

    if version >= 12 and not hints:
        # the common answer, packed directly (no leader hints to add)
        return EncodedPieces(write_fetch_response(version, ErrorCode.none, result.session_id, [
            (topic_id(name, plist[0][0]).bytes if use_ids else name,
             [(index, r.error_code, r.high_watermark, r.last_stable_offset, r.log_start_offset, r.records, r.aborted)
              for index, r in plist])
            for name, plist in answered.items()]))
    return FetchResponse(session_id=result.session_id, node_endpoints=endpoints, responses=tuple(
        FetchableTopicResponse(
            topic=name, topic_id=topic_id(name, plist[0][0]) if use_ids else None,
            partitions=tuple(_partition_data(index, r, hints.get((name, index), _NO_LEADER)) for index, r in plist))
        for name, plist in answered.items()))
