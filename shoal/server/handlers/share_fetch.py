"""ShareFetch (78) and ShareAcknowledge (79), v1-v2 (KIP-932): translation only.

Each handler turns the kio request of the version received into a plain
:class:`~shoal.share.requests.ShareFetchParams` / ``ShareAcknowledgeParams`` (fields a
version lacks take Kafka's values), makes one call into the share service
(``ShareService.fetch`` / ``ShareService.acknowledge``, as Kafka's KafkaApis hands the
request to SharePartitionManager) and turns its ``ShareResult`` into the kio response,
adding each partition's current leader and the node endpoints (the leaders named in
NOT_LEADER_OR_FOLLOWER results). With an authorizer, ``authorized_share_request`` checks
the group and topics first.

What the service does, in order:

A ShareFetch is first checked as Kafka checks it (INVALID_REQUEST for the whole
request, nothing applied): acknowledgements in a request that opens a session (epoch
0), partitions to fetch (without acknowledgements) in one that closes it (epoch -1), an
unknown ShareAcquireMode, a negative MinBytes or MaxWaitMs. It then goes through the
member's share session (``ShareSessionCache``: epoch 0 opens, -1 closes, any other must
match). As in Kafka 4.4, the group id must not be null and the member id must be 1 to
36 characters (INVALID_REQUEST otherwise), but the group membership is not checked:
Kafka's share-partition leader (usually not the group's coordinator) knows only share
sessions, so a member id the group does not have (yet, or any more) opens a session and
is served, and a member removed from the group goes on with its session. The assignment
decides what a client puts in its session; what a stray session acquires is released
when it closes, when its connection closes, or when the locks expire. A fetch serves the
partitions its session names.

Acknowledgements (ShareAcknowledge, or riding on a ShareFetch) are applied first, per
partition, all or nothing; the partition's acknowledge error code is sent only after
the write carrying them committed (or failed). Then, for a ShareFetch that did not
close its session: for each session partition in rotated order, whole batches are read
from the log at ``next_fetch_offset()``, their (base, last) offsets go to
``SharePartition.acquire``, and the batches overlapping the acquired ranges are
returned (never a split batch; ``acquired_records`` says which offsets the member
owns). Until the acquired records add up to MinBytes the request is a delayed operation
in the share service's purgatory (``server/share_purgatory.py``), watched under each of
its share-partitions and data partitions: an append, an acknowledgement or release that
makes records available again, a lock timeout or the end of a load completes it, and
what it then acquires is added to the answer; at most MaxWaitMs. A parked request whose
session was closed or replaced meanwhile acquires nothing.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import Any

from ...errors import ErrorCode
from ...protocol.entities import ZERO_UUID, make, sub
from ...security.authz import authorized_share_request
from ...security.serving import client_endpoint, own_endpoint
from ...share.requests import (
    AcknowledgementBatch,
    ShareAcknowledgeParams,
    ShareFetchParams,
    SharePartitionRequest,
    ShareResult,
)
from ...share.state import AcquireMode
from ..dispatch import api
from ..share_service import share_service


def _uuid(topic_id: uuid.UUID | None) -> uuid.UUID:
    return topic_id or ZERO_UUID  # kio reads the zero uuid as None


def _partitions(topics: Any) -> tuple[SharePartitionRequest, ...]:
    """The request's partitions, in request order, with their acknowledgement batches."""
    return tuple(
        SharePartitionRequest(_uuid(t.topic_id), int(p.partition_index), tuple(
            AcknowledgementBatch(int(b.first_offset), int(b.last_offset), tuple(int(x) for x in b.acknowledge_types))
            for b in p.acknowledgement_batches))
        for t in topics for p in t.partitions)


def _node_endpoints(ctx: Any, cls: Any, others: Iterable[int] = ()) -> tuple[Any, ...]:
    """This broker's endpoint, and those of the leaders named in NOT_LEADER_OR_FOLLOWER results."""
    b = ctx.broker
    ecls = sub(cls, "NodeEndpoint")
    host, port = own_endpoint(ctx)
    out = [make(ecls, node_id=b.node_id, host=host, port=port, rack=None)]
    wanted = set(others) - {b.node_id}
    if wanted:
        out.extend(make(ecls, node_id=e.node_id, host=hp[0], port=hp[1], rack=e.rack)
                   for e in b.cluster.brokers() if e.node_id in wanted and (hp := client_endpoint(ctx, e)) is not None)
    return tuple(out)


def _leader(ctx: Any, cls: Any, key: tuple[uuid.UUID, int], moved: bool) -> Any:
    """This broker at its leader epoch; when ``moved`` (NOT_LEADER_OR_FOLLOWER), the partition's
    leader (cluster mode)."""
    b = ctx.broker
    lcls = sub(cls, "LeaderIdAndEpoch")
    if getattr(b, "replicas", None) is not None:
        meta = b.store.topic_by_id(key[0])
        if meta is not None:
            view = b.cluster.partition(meta.name, key[1])
            if view is not None and (moved or view.leader == b.node_id):
                return make(lcls, leader_id=view.leader, leader_epoch=view.leader_epoch)
    return make(lcls, leader_id=b.node_id, leader_epoch=0)


def _failed(cls: Any, result: ShareResult) -> Any:
    return make(cls, throttle_time=0, error_code=result.error_code, error_message=result.error_message,
                acquisition_lock_timeout=result.acquisition_lock_timeout_ms, responses=(), node_endpoints=())


@api(78, 1, 2)
async def handle_share_fetch(ctx: Any, request: Any) -> Any:
    if ctx.broker.authorizer is not None:
        return await authorized_share_request(ctx, request, _share_fetch)
    return await _share_fetch(ctx, request)


async def _share_fetch(ctx: Any, request: Any) -> Any:
    v2 = ctx.api_version >= 2
    result = await share_service(ctx.broker).fetch(ShareFetchParams(
        group_id=request.group_id, member_id=request.member_id, session_epoch=int(request.share_session_epoch),
        partitions=_partitions(request.topics),
        forgotten=tuple((_uuid(t.topic_id), int(p)) for t in request.forgotten_topics_data for p in t.partitions),
        version=ctx.api_version, max_wait_ms=int(request.max_wait.total_seconds() * 1000),
        min_bytes=int(request.min_bytes), max_bytes=int(request.max_bytes), max_records=int(request.max_records),
        batch_size=int(request.batch_size),
        acquire_mode=int(request.share_acquire_mode) if v2 else int(AcquireMode.BATCH_OPTIMIZED),
        renew_only=bool(request.is_renew_ack) if v2 else False,
        connection_id=ctx.connection.connection_id,
    ))
    cls = ctx.response_type
    if result.error_code != ErrorCode.none:
        return _failed(cls, result)
    tcls = sub(cls, "ShareFetchableTopicResponse")
    pcls = sub(cls, "PartitionData")
    acls = sub(cls, "AcquiredRecords")
    by_topic: dict[uuid.UUID, list[Any]] = {}
    leaders: set[int] = set()
    for p in result.partitions:
        moved = ErrorCode.not_leader_or_follower in (p.error_code, p.acknowledge_error_code)
        leader = _leader(ctx, cls, (p.topic_id, p.partition), moved)
        if moved:
            leaders.add(leader.leader_id)
        by_topic.setdefault(p.topic_id, []).append(make(
            pcls, partition_index=p.partition, error_code=p.error_code, error_message=None,
            acknowledge_error_code=p.acknowledge_error_code, acknowledge_error_message=None,
            current_leader=leader, records=p.records(),
            acquired_records=tuple(make(acls, first_offset=a.first_offset, last_offset=a.last_offset,
                                        delivery_count=a.delivery_count) for a in p.acquired),
        ))
    topics = tuple(make(tcls, topic_id=t, partitions=tuple(ps)) for t, ps in by_topic.items())
    return make(cls, throttle_time=0, error_code=ErrorCode.none, error_message=None,
                acquisition_lock_timeout=result.acquisition_lock_timeout_ms, responses=topics,
                node_endpoints=_node_endpoints(ctx, cls, leaders))


@api(79, 1, 2)
async def handle_share_acknowledge(ctx: Any, request: Any) -> Any:
    if ctx.broker.authorizer is not None:
        return await authorized_share_request(ctx, request, _share_acknowledge)
    return await _share_acknowledge(ctx, request)


async def _share_acknowledge(ctx: Any, request: Any) -> Any:
    result = await share_service(ctx.broker).acknowledge(ShareAcknowledgeParams(
        group_id=request.group_id, member_id=request.member_id, session_epoch=int(request.share_session_epoch),
        partitions=_partitions(request.topics), version=ctx.api_version,
        connection_id=ctx.connection.connection_id,
    ))
    cls = ctx.response_type
    if result.error_code != ErrorCode.none:
        return _failed(cls, result)
    tcls = sub(cls, "ShareAcknowledgeTopicResponse")
    pcls = sub(cls, "PartitionData")
    by_topic: dict[uuid.UUID, list[Any]] = {}
    leaders: set[int] = set()
    for p in result.partitions:
        moved = p.error_code == ErrorCode.not_leader_or_follower
        leader = _leader(ctx, cls, (p.topic_id, p.partition), moved)
        if moved:
            leaders.add(leader.leader_id)
        by_topic.setdefault(p.topic_id, []).append(make(
            pcls, partition_index=p.partition, error_code=p.error_code, error_message=None, current_leader=leader))
    topics = tuple(make(tcls, topic_id=t, partitions=tuple(ps)) for t, ps in by_topic.items())
    return make(cls, throttle_time=0, error_code=ErrorCode.none, error_message=None,
                acquisition_lock_timeout=result.acquisition_lock_timeout_ms, responses=topics,
                node_endpoints=_node_endpoints(ctx, cls, leaders))
