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

import datetime
import functools
import uuid
from collections.abc import Iterable

from ...errors import ErrorCode
from ...protocol.entities import ZERO_UUID
from ...protocol.messages import share_acknowledge_response as ack_resp
from ...protocol.messages import share_fetch_response as fetch_resp
from ...protocol.messages.share_acknowledge_request import AcknowledgeTopic, ShareAcknowledgeRequest
from ...protocol.messages.share_fetch_request import FetchTopic, ShareFetchRequest
from ...security.authz import authorized_share_request
from ...security.serving import client_endpoint, own_endpoint
from ...share.requests import (
    AcknowledgementBatch,
    ShareAcknowledgeParams,
    ShareFetchParams,
    SharePartitionRequest,
    ShareResult,
)
from ..context import RequestContext
from ..dispatch import api
from ..share_service import share_service

_MS = datetime.timedelta(milliseconds=1)

Endpoint = tuple[int, str, int, str | None]
"""A node endpoint of an answer: (node id, host, port, rack)."""


def _uuid(topic_id: uuid.UUID | None) -> uuid.UUID:
    return topic_id or ZERO_UUID  # kio reads the zero uuid as None


def _partitions(topics: Iterable[FetchTopic] | Iterable[AcknowledgeTopic]) -> tuple[SharePartitionRequest, ...]:
    """The request's partitions, in request order, with their acknowledgement batches."""
    return tuple(
        SharePartitionRequest(_uuid(t.topic_id), p.partition_index, tuple(
            AcknowledgementBatch(b.first_offset, b.last_offset, tuple(b.acknowledge_types))
            for b in p.acknowledgement_batches))
        for t in topics for p in t.partitions)


def _node_endpoints(ctx: RequestContext, others: Iterable[int] = ()) -> list[Endpoint]:
    """This broker's endpoint, and those of the leaders named in NOT_LEADER_OR_FOLLOWER results."""
    b = ctx.broker
    host, port = own_endpoint(ctx)
    out: list[Endpoint] = [(b.node_id, host, port, None)]
    wanted = set(others) - {b.node_id}
    if wanted:
        out.extend((e.node_id, hp[0], hp[1], e.rack)
                   for e in b.cluster.brokers() if e.node_id in wanted and (hp := client_endpoint(ctx, e)) is not None)
    return out


@functools.lru_cache(maxsize=1024)
def _fetch_leader(leader_id: int, leader_epoch: int) -> fetch_resp.LeaderIdAndEpoch:
    """A ShareFetch partition's leader (answers share these immutable views: none built per partition)."""
    return fetch_resp.LeaderIdAndEpoch(leader_id=leader_id, leader_epoch=leader_epoch)


@functools.lru_cache(maxsize=1024)
def _ack_leader(leader_id: int, leader_epoch: int) -> ack_resp.LeaderIdAndEpoch:
    return ack_resp.LeaderIdAndEpoch(leader_id=leader_id, leader_epoch=leader_epoch)


def _leader(ctx: RequestContext, key: tuple[uuid.UUID, int], moved: bool) -> tuple[int, int]:
    """(leader id, leader epoch): this broker at its leader epoch; when ``moved``
    (NOT_LEADER_OR_FOLLOWER), the partition's leader (cluster mode)."""
    b = ctx.broker
    if b.replicas is not None and b.store is not None:
        meta = b.store.topic_by_id(key[0])
        if meta is not None:
            view = b.cluster.partition(meta.name, key[1])
            if view is not None and (moved or view.leader == b.node_id):
                return view.leader, view.leader_epoch
    return b.node_id, 0


@api(78, 1, 2)
async def handle_share_fetch(ctx: RequestContext, request: ShareFetchRequest) -> fetch_resp.ShareFetchResponse:
    if ctx.broker.authorizer is not None:
        response: fetch_resp.ShareFetchResponse = await authorized_share_request(ctx, request, _share_fetch)
        return response
    return await _share_fetch(ctx, request)


async def _share_fetch(ctx: RequestContext, request: ShareFetchRequest) -> fetch_resp.ShareFetchResponse:
    # v1 has no ShareAcquireMode (reads 0, BATCH_OPTIMIZED) nor IsRenewAck (reads False).
    result = await share_service(ctx.broker).fetch(ShareFetchParams(
        group_id=request.group_id, member_id=request.member_id, session_epoch=request.share_session_epoch,
        partitions=_partitions(request.topics),
        forgotten=tuple((_uuid(t.topic_id), p) for t in request.forgotten_topics_data for p in t.partitions),
        version=ctx.api_version, max_wait_ms=request.max_wait // _MS,
        min_bytes=request.min_bytes, max_bytes=request.max_bytes, max_records=request.max_records,
        batch_size=request.batch_size, acquire_mode=request.share_acquire_mode, renew_only=request.is_renew_ack,
        connection_id=ctx.connection.connection_id,
    ))
    if result.error_code != ErrorCode.none:
        return fetch_resp.ShareFetchResponse(error_code=result.error_code, error_message=result.error_message,
                                             acquisition_lock_timeout=result.acquisition_lock_timeout_ms)
    by_topic: dict[uuid.UUID, list[fetch_resp.PartitionData]] = {}
    leaders: set[int] = set()
    for p in result.partitions:
        moved = ErrorCode.not_leader_or_follower in (p.error_code, p.acknowledge_error_code)
        leader_id, leader_epoch = _leader(ctx, (p.topic_id, p.partition), moved)
        if moved:
            leaders.add(leader_id)
        by_topic.setdefault(p.topic_id, []).append(fetch_resp.PartitionData(
            partition_index=p.partition, error_code=p.error_code, acknowledge_error_code=p.acknowledge_error_code,
            current_leader=_fetch_leader(leader_id, leader_epoch),
            records=p.records(),
            acquired_records=tuple(fetch_resp.AcquiredRecords(first_offset=a.first_offset, last_offset=a.last_offset,
                                                              delivery_count=a.delivery_count) for a in p.acquired),
        ))
    return fetch_resp.ShareFetchResponse(
        acquisition_lock_timeout=result.acquisition_lock_timeout_ms,
        responses=tuple(fetch_resp.ShareFetchableTopicResponse(topic_id=t, partitions=tuple(ps))
                        for t, ps in by_topic.items()),
        node_endpoints=tuple(fetch_resp.NodeEndpoint(node_id=n, host=h, port=port, rack=r)
                             for n, h, port, r in _node_endpoints(ctx, leaders)))


@api(79, 1, 2)
async def handle_share_acknowledge(
        ctx: RequestContext, request: ShareAcknowledgeRequest) -> ack_resp.ShareAcknowledgeResponse:
    if ctx.broker.authorizer is not None:
        response: ack_resp.ShareAcknowledgeResponse = await authorized_share_request(ctx, request, _share_acknowledge)
        return response
    return await _share_acknowledge(ctx, request)


async def _share_acknowledge(ctx: RequestContext, request: ShareAcknowledgeRequest) -> ack_resp.ShareAcknowledgeResponse:
    result = await share_service(ctx.broker).acknowledge(ShareAcknowledgeParams(
        group_id=request.group_id, member_id=request.member_id, session_epoch=request.share_session_epoch,
        partitions=_partitions(request.topics), version=ctx.api_version,
        connection_id=ctx.connection.connection_id,
    ))
    if result.error_code != ErrorCode.none:
        return _ack_failed(result)
    by_topic: dict[uuid.UUID, list[ack_resp.PartitionData]] = {}
    leaders: set[int] = set()
    for p in result.partitions:
        moved = p.error_code == ErrorCode.not_leader_or_follower
        leader_id, leader_epoch = _leader(ctx, (p.topic_id, p.partition), moved)
        if moved:
            leaders.add(leader_id)
        by_topic.setdefault(p.topic_id, []).append(ack_resp.PartitionData(
            partition_index=p.partition, error_code=p.error_code,
            current_leader=_ack_leader(leader_id, leader_epoch)))
    return ack_resp.ShareAcknowledgeResponse(
        acquisition_lock_timeout=result.acquisition_lock_timeout_ms,
        responses=tuple(ack_resp.ShareAcknowledgeTopicResponse(topic_id=t, partitions=tuple(ps))
                        for t, ps in by_topic.items()),
        node_endpoints=tuple(ack_resp.NodeEndpoint(node_id=n, host=h, port=port, rack=r)
                             for n, h, port, r in _node_endpoints(ctx, leaders)))


def _ack_failed(result: ShareResult) -> ack_resp.ShareAcknowledgeResponse:
    return ack_resp.ShareAcknowledgeResponse(error_code=result.error_code, error_message=result.error_message,
                                             acquisition_lock_timeout=result.acquisition_lock_timeout_ms)
