"""DescribeCluster (60) and FindCoordinator (10).

One broker: it is the whole cluster and every coordinator. Cluster mode: DescribeCluster
lists every live broker; FindCoordinator for a group names the current leader of the
key's ``__consumer_offsets`` partition (Kafka's hash), for a transactional id the leader
of its ``__transaction_state`` partition (the same hash), and for a
share-partition key ``group:topicId:partition`` (KIP-932; the topic id hyphenated or in
Kafka's base64 form) the leader of its ``__share_group_state`` partition. The topic is
created first if it does not exist yet (``server/internal_topics.py``), and
COORDINATOR_NOT_AVAILABLE is answered while the partition has no leader.
"""

from __future__ import annotations

import dataclasses
import uuid
from typing import TYPE_CHECKING

from ...cluster.metadata import BrokerEndpoint
from ...coordinator.partitioning import coordinator_partition
from ...errors import ErrorCode
from ...protocol.messages.describe_cluster_request import DescribeClusterRequest
from ...protocol.messages.describe_cluster_response import DescribeClusterBroker, DescribeClusterResponse
from ...protocol.messages.find_coordinator_request import FindCoordinatorRequest
from ...protocol.messages.find_coordinator_response import Coordinator, FindCoordinatorResponse
from ...security.acls import CLUSTER_NAME, Operation, ResourceType
from ...security.authz import allowed
from ...security.serving import client_endpoint
from ...share.coordinator import SharePartitionKey
from ...share.coordinator import partition_for as share_partition_for
from ..context import RequestContext
from ..dispatch import api
from ..internal_topics import (
    OFFSETS_TOPIC,
    SHARE_STATE_TOPIC,
    TRANSACTION_STATE_TOPIC,
    ensure_internal_topic,
)

if TYPE_CHECKING:
    from ..broker import Broker

GROUP, TRANSACTION, SHARE = 0, 1, 2


@api(60, 0, 1)
def handle_describe_cluster(ctx: RequestContext, request: DescribeClusterRequest) -> DescribeClusterResponse:
    b = ctx.broker
    brokers = tuple(DescribeClusterBroker(broker_id=e.node_id, host=hp[0], port=hp[1], rack=e.rack, is_fenced=False)
                    for e in b.cluster.brokers() if (hp := client_endpoint(ctx, e)) is not None)
    return DescribeClusterResponse(throttle_time=0, error_code=ErrorCode.none, error_message=None, endpoint_type=1,
                                   cluster_id=b.cluster_id, controller_id=b.cluster.controller_id(), brokers=brokers,
                                   cluster_authorized_operations=-2147483648)


def valid_share_key(key: str) -> bool:
    """A share-coordinator key is ``group:topicId:partition`` (KIP-932)."""
    group, sep1, rest = key.rpartition(":")
    if not sep1:
        return False
    group, sep2, topic_id = group.rpartition(":")
    if not sep2 or not group:
        return False
    try:
        uuid.UUID(topic_id) if "-" in topic_id else _b64_uuid(topic_id)
        return int(rest) >= 0
    except ValueError:
        return False


def _b64_uuid(text: str) -> uuid.UUID:
    import base64

    raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    if len(raw) != 16:
        raise ValueError(text)
    return uuid.UUID(bytes=raw)


def _coordinator_error(ctx: RequestContext, key_type: int, key: str) -> tuple[ErrorCode, str | None]:
    if key_type not in (GROUP, TRANSACTION, SHARE):
        return ErrorCode.invalid_request, f"unknown coordinator key type {key_type}"
    if key_type == SHARE and ctx.api_version < 6:
        # Kafka: the share coordinator key type (KIP-932) exists from FindCoordinator v6 on
        return ErrorCode.invalid_request, "key type SHARE needs FindCoordinator v6 or later"
    if key_type == SHARE and not valid_share_key(key):
        return ErrorCode.invalid_request, "share coordinator key must be group:topicId:partition"
    if key_type == GROUP and not key:
        return ErrorCode.invalid_group_id, None
    if ctx.broker.authorizer is not None:
        if key_type == GROUP and not allowed(ctx, Operation.DESCRIBE, ResourceType.GROUP, key):
            return ErrorCode.group_authorization_failed, None
        if key_type == TRANSACTION and not allowed(ctx, Operation.DESCRIBE, ResourceType.TRANSACTIONAL_ID, key):
            return ErrorCode.transactional_id_authorization_failed, None
        if key_type == SHARE and not allowed(ctx, Operation.CLUSTER_ACTION, ResourceType.CLUSTER, CLUSTER_NAME):
            return ErrorCode.cluster_authorization_failed, None
    return ErrorCode.none, None


def share_key_parts(key: str) -> tuple[str, uuid.UUID, int]:
    """(group, topic id, partition) of a valid share-coordinator key (hyphenated or base64 topic id)."""
    rest, _, partition = key.rpartition(":")
    group, _, topic_id = rest.rpartition(":")
    tid = uuid.UUID(topic_id) if "-" in topic_id else _b64_uuid(topic_id)
    return group, tid, int(partition)


def coordinator_partition_of(key_type: int, key: str, num_partitions: int) -> int:
    """The internal partition holding a valid key: Kafka's hash of the group id, or of the
    share-partition key in its canonical form (so both topic id spellings meet)."""
    if key_type == SHARE:
        group, tid, partition = share_key_parts(key)
        return share_partition_for(SharePartitionKey.of(group, tid, partition), num_partitions)
    return coordinator_partition(key, num_partitions)


def _coordinator(b: Broker, topic: str, key_type: int, key: str) -> BrokerEndpoint | None:
    """The live leader of ``key``'s partition of ``topic``, or None."""
    node = b.cluster
    rec = node.store.snapshot.topics.get(topic)
    if rec is None:
        return None
    view = node.partition(topic, coordinator_partition_of(key_type, key, rec.num_partitions))
    if view is None or view.leader < 0:
        return None
    endpoint: BrokerEndpoint | None = next((e for e in node.brokers() if e.node_id == view.leader), None)
    return endpoint


@api(10, 0, 6)
async def handle_find_coordinator(ctx: RequestContext, request: FindCoordinatorRequest) -> FindCoordinatorResponse:
    b = ctx.broker
    key_type = request.key_type  # v0 has none: reads 0, GROUP
    keys = [request.key] if ctx.api_version < 4 else list(request.coordinator_keys)
    topic = {SHARE: SHARE_STATE_TOPIC, TRANSACTION: TRANSACTION_STATE_TOPIC}.get(key_type, OFFSETS_TOPIC)
    clustered = b.cluster.clustered and key_type in (GROUP, TRANSACTION, SHARE)
    if clustered and any(_coordinator_error(ctx, key_type, k)[0] is ErrorCode.none for k in keys):
        await ensure_internal_topic(b, topic)
    elif key_type == TRANSACTION and (txns := b.extensions.get("transactions")) is not None:
        txns.ensure_loaded()  # one broker: __transaction_state is created on first use, as in Kafka

    def coordinator_of(key: str) -> BrokerEndpoint | None:
        coord = _coordinator(b, topic, key_type, key) if clustered else b.cluster.coordinator()
        if coord is None:
            return None
        hp = client_endpoint(ctx, coord)  # its endpoint on the listener this request came in on
        return None if hp is None else dataclasses.replace(coord, host=hp[0], port=hp[1])

    if ctx.api_version < 4:
        code, msg = _coordinator_error(ctx, key_type, request.key)
        coord = coordinator_of(request.key) if code is ErrorCode.none else None
        node_id, host, port = (-1, "", -1) if coord is None else (coord.node_id, coord.host, coord.port)
        if code is ErrorCode.none and coord is None:
            code = ErrorCode.coordinator_not_available
        ok = code is ErrorCode.none
        return FindCoordinatorResponse(throttle_time=0, error_code=code, error_message=msg,
                                       node_id=node_id if ok else -1, host=host if ok else "",
                                       port=port if ok else -1)
    out = []
    for key in request.coordinator_keys:
        code, msg = _coordinator_error(ctx, key_type, key)
        coord = coordinator_of(key) if code is ErrorCode.none else None
        if code is ErrorCode.none and coord is None:
            code = ErrorCode.coordinator_not_available
        if coord is None or code is not ErrorCode.none:
            node_id, host, port = -1, "", -1
        else:
            node_id, host, port = coord.node_id, coord.host, coord.port
        out.append(Coordinator(key=key, node_id=node_id, host=host, port=port, error_code=code,
                               error_message=msg))
    return FindCoordinatorResponse(throttle_time=0, coordinators=tuple(out))
