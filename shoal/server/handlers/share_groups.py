"""Share-group membership (KIP-932): ShareGroupHeartbeat (76), ShareGroupDescribe (77).

ShareGroupDescribe with IncludeAuthorizedOperations fills each found group's
AuthorizedOperations as Kafka does without an authorizer (every GROUP operation).

A heartbeat's records are replayed at once and made durable (with the other writes of the
same event-loop pass, one fsync) before anything else; then the share-partitions newly in the
group's assignment are initialized through the share service, the member is given
those whose initialization succeeded (a member is only ever assigned initialized
partitions), and only then is the heartbeat answered (see ``group_service``). A group id of another kind answers
GROUP_ID_NOT_FOUND.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from ...errors import ErrorCode
from ...groups.share_group import ShareEffects, hb_req, hb_resp, heartbeat_assignment
from ...observe.logs import log_once
from ...protocol.messages.share_group_describe_request import ShareGroupDescribeRequest
from ...protocol.messages.share_group_describe_response import ShareGroupDescribeResponse
from ...protocol.messages.share_group_heartbeat_response import ShareGroupHeartbeatResponse
from ...security.authz import (
    GROUP,
    READ,
    authorized_operations,
    group_refusal,
    hide_undescribable,
    subscription_refusal,
)
from ..context import RequestContext
from ..dispatch import api
from ..group_service import client_host, group_service

log = logging.getLogger("shoal.groups")


def share_groups_limit_message(group_id: str, limit: int) -> str:
    """Why a new share group is refused, and what to do (GROUP_MAX_SIZE_REACHED's message)."""
    return (f"Share group {group_id} was not created: the broker already serves group.share.max.groups={limit} "
            f"share groups. Delete unused ones (shoal share-groups --list, then shoal share-groups --delete "
            f"--group GROUP) or raise group.share.max.groups (at most 100).")


def _error(code: ErrorCode, message: str) -> ShareGroupHeartbeatResponse:
    return ShareGroupHeartbeatResponse(error_code=code, error_message=message)


@api(76, 1, 1)
async def handle_share_group_heartbeat(
        ctx: RequestContext, request: hb_req.ShareGroupHeartbeatRequest,
) -> ShareGroupHeartbeatResponse | hb_resp.ShareGroupHeartbeatResponse:
    broker = ctx.broker
    svc = group_service(broker)
    if not broker.config["group.share.enable"]:
        return _error(ErrorCode.unsupported_version, "Share groups are not enabled.")
    group_id = request.group_id
    if (denied := group_refusal(ctx, READ, group_id, member_id=None, assignment=None)
            or subscription_refusal(ctx, request.subscribed_topic_names, member_id=None, assignment=None)):
        return denied
    p = svc.partition_for(group_id)
    existing = svc.shard(p).groups.get(group_id)
    if existing is not None and existing.group_type != "share":
        return _error(ErrorCode.group_id_not_found, f"Group {group_id} is not a share group.")
    share_groups = svc.share_groups(p)
    limit = broker.config["group.share.max.groups"]
    if existing is None and request.member_epoch == 0 and svc.share_group_count() >= limit:
        message = share_groups_limit_message(group_id, limit)
        log_once(log, ("group.share.max.groups", group_id), message)
        return _error(ErrorCode.group_max_size_reached, message)
    result = share_groups.handle_heartbeat(
        request, ctx.now_ms(), svc.topics_metadata(),
        client_id=ctx.header.client_id or "", client_host=client_host(ctx),
        session_timeout_ms=svc.group_config(group_id, "share.session.timeout.ms"),
        heartbeat_interval_ms=svc.group_config(group_id, "share.heartbeat.interval.ms"),
        max_size=broker.config["group.share.max.size"])
    # Replayed at once, answered once durable: the heartbeats of one event-loop pass share
    # one fsync (a group of a thousand members writes a record per member and epoch), and
    # one that wrote nothing still waits for what others appended before it was computed.
    await svc.apply_durable(p, result)
    await svc.wait_replicated(p, wrote=bool(result.records))
    response = result.answer()
    if response.error_code is ErrorCode.group_max_size_reached:
        log_once(log, ("group.share.max.size", group_id), response.error_message or "")
    if response.error_code is ErrorCode.none and request.member_epoch != -1:
        effects = result.after if isinstance(result.after, ShareEffects) else ShareEffects()
        fresh = dict(effects.initialize.get(group_id, {}))
        retry = svc.apply(p, share_groups.retry_initialize(group_id))
        if isinstance(retry.after, ShareEffects):
            for tid, ps in retry.after.initialize.get(group_id, {}).items():
                fresh[tid] = frozenset(fresh.get(tid, frozenset())) | frozenset(ps)
        await svc.initialize_share_partitions(p, group_id, fresh)
        # Only initialized partitions are assigned: add those whose state now exists.
        refreshed = svc.apply(p, share_groups.refresh_assignment(group_id, request.member_id))
        if refreshed.response is not None:
            response = dataclasses.replace(response, assignment=heartbeat_assignment(refreshed.response))
        await svc.wait_replicated(p)
    return response


GROUP_OPERATIONS = (3, 6, 8, 10, 11)
"""The operations on a GROUP resource (Kafka's AclOperation ids READ 3, DELETE 6, DESCRIBE 8,
DESCRIBE_CONFIGS 10, ALTER_CONFIGS 11), reported as the 32-bit field Kafka fills in: those
the principal may do (every one of them without an authorizer)."""


@api(77, 1, 1)
def handle_share_group_describe(ctx: RequestContext, request: ShareGroupDescribeRequest) -> Any:
    svc = group_service(ctx.broker)
    groups = hide_undescribable(ctx, (svc.describe(svc.share_groups, g) for g in request.group_ids))
    if request.include_authorized_operations:
        groups = tuple(dataclasses.replace(g, authorized_operations=authorized_operations(
                           ctx, GROUP, g.group_id, GROUP_OPERATIONS))
                       if g.error_code == ErrorCode.none else g for g in groups)
    return svc.answer_per_partition(
        (svc.runtime.partition_for_group(g) for g in request.group_ids),
        lambda errors: ShareGroupDescribeResponse(groups=tuple(svc.with_error(g, errors) for g in groups)))
