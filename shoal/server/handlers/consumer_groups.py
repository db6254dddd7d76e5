"""Consumer groups of the KIP-848 protocol: ConsumerGroupHeartbeat (68), ConsumerGroupDescribe (69).

A group id belongs to one kind. A heartbeat for a classic group that is empty (e.g. one
that only holds offsets committed by admin tools) converts it, as Kafka does: the
classic group's tombstone goes with the heartbeat's records and its offsets stay. Any
other group of another kind answers GROUP_ID_NOT_FOUND, as it does to
ConsumerGroupDescribe, which is what librdkafka needs to fall back to DescribeGroups.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable

from kio.schema.consumer_group_heartbeat.v1 import request as hb_req
from kio.schema.consumer_group_heartbeat.v1 import response as hb_resp
from kio.schema.types import GroupId, TopicName
from kio.static.primitive import i32, i32Timedelta

from ...errors import ErrorCode
from ...groups.classic import ClassicGroup
from ...groups.records import group_metadata_tombstone
from ...observe.logs import log_once
from ...protocol.messages.consumer_group_describe_request import ConsumerGroupDescribeRequest
from ...protocol.messages.consumer_group_describe_response import ConsumerGroupDescribeResponse
from ...protocol.messages.consumer_group_heartbeat_request import ConsumerGroupHeartbeatRequest
from ...protocol.messages.consumer_group_heartbeat_response import ConsumerGroupHeartbeatResponse
from ...security.authz import (
    READ,
    group_refusal,
    hide_undescribable,
    subscription_refusal,
)
from ..context import RequestContext
from ..dispatch import api
from ..group_service import client_host, group_service

log = logging.getLogger("shoal.groups")

HeartbeatAnswer = ConsumerGroupHeartbeatResponse | hb_resp.ConsumerGroupHeartbeatResponse
"""A refusal built here, or the coordinator's answer: kio's v1 entity (a v0 answer is
converted when it is encoded)."""


def _as_v1(request: ConsumerGroupHeartbeatRequest) -> hb_req.ConsumerGroupHeartbeatRequest:
    """The request as the coordinator reads it: kio's v1 entity (v0 has no SubscribedTopicRegex)."""
    if isinstance(request, hb_req.ConsumerGroupHeartbeatRequest):
        return request
    names = request.subscribed_topic_names
    owned = request.topic_partitions
    return hb_req.ConsumerGroupHeartbeatRequest(
        group_id=GroupId(request.group_id), member_id=request.member_id, member_epoch=i32(request.member_epoch),
        instance_id=request.instance_id, rack_id=request.rack_id,
        rebalance_timeout=i32Timedelta.parse(request.rebalance_timeout),
        subscribed_topic_names=None if names is None else tuple(TopicName(n) for n in names),
        subscribed_topic_regex=None, server_assignor=request.server_assignor,
        topic_partitions=None if owned is None else tuple(
            hb_req.TopicPartitions(topic_id=tp.topic_id, partitions=tuple(i32(p) for p in tp.partitions))
            for tp in owned))


@api(68, 0, 1)
def handle_consumer_group_heartbeat(
        ctx: RequestContext, request: ConsumerGroupHeartbeatRequest) -> HeartbeatAnswer | Awaitable[HeartbeatAnswer]:
    if (denied := group_refusal(ctx, READ, request.group_id, member_id=None, assignment=None)
            or subscription_refusal(ctx, request.subscribed_topic_names, member_id=None, assignment=None)):
        refused: HeartbeatAnswer = denied
        return refused
    svc = group_service(ctx.broker)
    group_id = request.group_id
    p = svc.partition_for(group_id)
    existing = svc.shard(p).groups.get(group_id)
    convert = False
    if existing is not None and existing.group_type != "consumer":
        if isinstance(existing, ClassicGroup) and existing.is_empty() and request.member_epoch == 0:
            convert = True
        else:
            return ConsumerGroupHeartbeatResponse(error_code=ErrorCode.group_id_not_found,
                                                  error_message=f"Group {group_id} is not a consumer group.")
    result = svc.consumer_groups(p).handle_heartbeat(
        _as_v1(request), ctx.now_ms(), svc.topics_metadata(),
        client_id=ctx.header.client_id or "", client_host=client_host(ctx), api_version=ctx.api_version,
        session_timeout_ms=svc.group_config(group_id, "consumer.session.timeout.ms"),
        heartbeat_interval_ms=svc.group_config(group_id, "consumer.heartbeat.interval.ms"))
    if convert and result.records:
        result.records.insert(0, group_metadata_tombstone(group_id))
    svc.apply(p, result)
    response = result.answer()
    if response.error_code is ErrorCode.group_max_size_reached:
        log_once(log, ("group.consumer.max.size", group_id), response.error_message or "")
    answer: hb_resp.ConsumerGroupHeartbeatResponse | Awaitable[hb_resp.ConsumerGroupHeartbeatResponse] = svc.answer(
        p, response, wrote=bool(result.records))
    return answer


@api(69, 0, 1)
def handle_consumer_group_describe(
        ctx: RequestContext, request: ConsumerGroupDescribeRequest,
) -> ConsumerGroupDescribeResponse | Awaitable[ConsumerGroupDescribeResponse]:
    """The coordinator describes each group as kio's v1 entity; a v0 answer is converted when encoded."""
    svc = group_service(ctx.broker)
    groups = hide_undescribable(ctx, (svc.describe(svc.consumer_groups, g) for g in request.group_ids))
    answer: ConsumerGroupDescribeResponse | Awaitable[ConsumerGroupDescribeResponse] = svc.answer_per_partition(
        (svc.runtime.partition_for_group(g) for g in request.group_ids),
        lambda errors: ConsumerGroupDescribeResponse(groups=tuple(svc.with_error(g, errors) for g in groups)))
    return answer
