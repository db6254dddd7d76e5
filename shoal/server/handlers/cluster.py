"""DescribeCluster (60) and FindCoordinator (10).

One broker: it is the whole cluster and every coordinator. Cluster mode: DescribeCluster
lists every live broker; FindCoordinator for a group (and a transactional id) names the
current leader of the key's ``__consumer_offsets`` partition (Kafka's hash), creating the
replicated topic first if it does not exist yet (``offsets.topic.num.partitions``,
``offsets.topic.replication.factor`` capped at the registered brokers) and answering
COORDINATOR_NOT_AVAILABLE while the partition has no leader. The share coordinator key
still names the controller broker, which keeps ``__share_group_state`` local and
unreplicated (docs/CLUSTER.md).
"""

from __future__ import annotations

import uuid
from typing import Any

from ...coordinator.partitioning import coordinator_partition
from ...errors import ApiError, ErrorCode
from ...protocol.entities import make, sub
from ..dispatch import api

GROUP, TRANSACTION, SHARE = 0, 1, 2


@api(60, 0, 1)
def handle_describe_cluster(ctx: Any, request: Any) -> Any:
    b = ctx.broker
    cls = ctx.response_type
    bcls = sub(cls, "DescribeClusterBroker")
    brokers = tuple(make(bcls, broker_id=e.node_id, host=e.host, port=e.port, rack=e.rack, is_fenced=False)
                    for e in b.cluster.brokers())
    return make(cls, throttle_time=0, error_code=ErrorCode.none, error_message=None, endpoint_type=1,
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


def _coordinator_error(ctx: Any, key_type: int, key: str) -> tuple[ErrorCode, str | None]:
    if key_type not in (GROUP, TRANSACTION, SHARE):
        return ErrorCode.invalid_request, f"unknown coordinator key type {key_type}"
    if key_type == SHARE and not valid_share_key(key):
        return ErrorCode.invalid_request, "share coordinator key must be group:topicId:partition"
    if key_type == GROUP and not key:
        return ErrorCode.invalid_group_id, None
    return ErrorCode.none, None


OFFSETS_TOPIC = "__consumer_offsets"


async def _ensure_offsets_topic(b: Any) -> bool:
    """Cluster mode: create the replicated ``__consumer_offsets`` if missing; whether it exists."""
    node = b.cluster
    if OFFSETS_TOPIC in node.store.snapshot.topics:
        return True
    live = len(node.brokers())
    rf = max(1, min(b.config["offsets.topic.replication.factor"], live))
    try:
        await node.create_topic(OFFSETS_TOPIC, b.config["offsets.topic.num.partitions"], rf,
                                {"cleanup.policy": "compact",
                                 "segment.bytes": str(b.config["offsets.topic.segment.bytes"])},
                                None, validate_only=False)
    except ApiError as e:
        if e.error_code != ErrorCode.topic_already_exists:
            return False
    except Exception:
        return False
    return OFFSETS_TOPIC in node.store.snapshot.topics


def _group_coordinator(b: Any, key: str) -> Any:
    """The live leader of ``key``'s ``__consumer_offsets`` partition, or None."""
    node = b.cluster
    snap = node.store.snapshot
    rec = snap.topics.get(OFFSETS_TOPIC)
    if rec is None:
        return None
    view = node.partition(OFFSETS_TOPIC, coordinator_partition(key, rec.num_partitions))
    if view is None or view.leader < 0:
        return None
    return next((e for e in node.brokers() if e.node_id == view.leader), None)


@api(10, 0, 6)
async def handle_find_coordinator(ctx: Any, request: Any) -> Any:
    b = ctx.broker
    cls = ctx.response_type
    key_type = getattr(request, "key_type", GROUP)
    keys = [request.key] if ctx.api_version < 4 else list(request.coordinator_keys)
    by_group = b.cluster.clustered and key_type in (GROUP, TRANSACTION)
    if by_group and any(_coordinator_error(ctx, key_type, k)[0] is ErrorCode.none for k in keys):
        await _ensure_offsets_topic(b)

    def coordinator_of(key: str) -> Any:
        return _group_coordinator(b, key) if by_group else b.cluster.coordinator()

    if ctx.api_version < 4:
        coord = coordinator_of(request.key)
        node_id, host, port = (-1, "", -1) if coord is None else (coord.node_id, coord.host, coord.port)
        code, msg = _coordinator_error(ctx, key_type, request.key)
        if code is ErrorCode.none and coord is None:
            code = ErrorCode.coordinator_not_available
        ok = code is ErrorCode.none
        return make(cls, throttle_time=0, error_code=code, error_message=msg, node_id=node_id if ok else -1,
                    host=host if ok else "", port=port if ok else -1)
    ccls = sub(cls, "Coordinator")
    out = []
    for key in request.coordinator_keys:
        code, msg = _coordinator_error(ctx, key_type, key)
        coord = coordinator_of(key) if code is ErrorCode.none else None
        if code is ErrorCode.none and coord is None:
            code = ErrorCode.coordinator_not_available
        ok = code is ErrorCode.none
        out.append(make(ccls, key=key, node_id=coord.node_id if ok else -1, host=coord.host if ok else "",
                        port=coord.port if ok else -1, error_code=code, error_message=msg))
    return make(cls, throttle_time=0, coordinators=tuple(out))
