"""Consumer groups of the KIP-848 protocol: ConsumerGroupHeartbeat (68), ConsumerGroupDescribe (69).

A group id belongs to one kind. A heartbeat for a classic group that is empty (e.g. one
that only holds offsets committed by admin tools) converts it, as Kafka does: the
classic group's tombstone goes with the heartbeat's records and its offsets stay. Any
other group of another kind answers GROUP_ID_NOT_FOUND, as it does to
ConsumerGroupDescribe, which is what librdkafka needs to fall back to DescribeGroups.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from kio.schema.consumer_group_heartbeat.v1 import request as hb_req_v1

from ...errors import ErrorCode
from ...groups.classic import ClassicGroup
from ...groups.manager import build_response
from ...groups.records import group_metadata_tombstone
from ...observe.logs import log_once
from ...protocol.entities import make
from ...security.authz import (
    READ,
    group_refusal,
    hide_undescribable,
    subscription_refusal,
)
from ..dispatch import api
from ..group_service import client_host, group_service

log = logging.getLogger("shoal.groups")


def as_version(entity: Any, cls: type) -> Any:
    """``entity`` rebuilt as ``cls`` (the same API at another version)."""
    if type(entity) is cls:
        return entity
    return build_response(cls, {f.name: _plain(getattr(entity, f.name)) for f in dataclasses.fields(entity)})


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    return value


@api(68, 0, 1)
def handle_consumer_group_heartbeat(ctx: Any, request: Any) -> Any:
    if (denied := group_refusal(ctx, READ, request.group_id, member_id=None, assignment=None)
            or subscription_refusal(ctx, request.subscribed_topic_names, member_id=None, assignment=None)):
        return denied
    svc = group_service(ctx.broker)
    if ctx.api_version == 0:  # the coordinator reads v1's fields; v0 has no regex
        request = hb_req_v1.ConsumerGroupHeartbeatRequest(
            **{f.name: getattr(request, f.name) for f in dataclasses.fields(request)}, subscribed_topic_regex=None)
    group_id = request.group_id
    p = svc.partition_for(group_id)
    existing = svc.shard(p).groups.get(group_id)
    convert = False
    if existing is not None and existing.group_type != "consumer":
        if isinstance(existing, ClassicGroup) and existing.is_empty() and request.member_epoch == 0:
            convert = True
        else:
            return make(ctx.response_type, throttle_time=0, error_code=ErrorCode.group_id_not_found,
                        error_message=f"Group {group_id} is not a consumer group.", member_id=None,
                        member_epoch=0, heartbeat_interval=0, assignment=None)
    result = svc.consumer_groups(p).handle_heartbeat(
        request, ctx.now_ms(), svc.topics_metadata(),
        client_id=ctx.header.client_id or "", client_host=client_host(ctx), api_version=ctx.api_version,
        session_timeout_ms=svc.group_config(group_id, "consumer.session.timeout.ms"),
        heartbeat_interval_ms=svc.group_config(group_id, "consumer.heartbeat.interval.ms"))
    if convert and result.records:
        result.records.insert(0, group_metadata_tombstone(group_id))
    svc.apply(p, result)
    response = result.answer()
    if response.error_code is ErrorCode.group_max_size_reached:
        log_once(log, ("group.consumer.max.size", group_id), response.error_message or "")
    return svc.answer(p, as_version(response, ctx.response_type), wrote=bool(result.records))


@api(69, 0, 1)
def handle_consumer_group_describe(ctx: Any, request: Any) -> Any:
    svc = group_service(ctx.broker)
    groups = hide_undescribable(ctx, (svc.describe(svc.consumer_groups, g) for g in request.group_ids))
    return svc.answer_per_partition(
        (svc.runtime.partition_for_group(g) for g in request.group_ids),
        lambda errors: build_response(ctx.response_type, {"throttle_time": 0, "groups": tuple(
            _plain(svc.with_error(g, errors)) for g in groups)}))
