"""DescribeCluster (60) and FindCoordinator (10).

One broker: it is the whole cluster and every coordinator. Cluster mode: DescribeCluster
lists every live broker; FindCoordinator names the controller broker, which serves every
group and share coordinator from its own (not replicated) internal topics until the
coordinators move with their partitions' leadership (docs/CLUSTER.md).
"""

from __future__ import annotations

import uuid
from typing import Any

from ...errors import ErrorCode
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


@api(10, 0, 6)
def handle_find_coordinator(ctx: Any, request: Any) -> Any:
    b = ctx.broker
    cls = ctx.response_type
    key_type = getattr(request, "key_type", GROUP)
    coord = b.cluster.coordinator()
    if coord is None:
        node_id, host, port = -1, "", -1
    else:
        node_id, host, port = coord.node_id, coord.host, coord.port
    if ctx.api_version < 4:
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
        if code is ErrorCode.none and coord is None:
            code = ErrorCode.coordinator_not_available
        ok = code is ErrorCode.none
        out.append(make(ccls, key=key, node_id=node_id if ok else -1, host=host if ok else "",
                        port=port if ok else -1, error_code=code, error_message=msg))
    return make(cls, throttle_time=0, coordinators=tuple(out))
