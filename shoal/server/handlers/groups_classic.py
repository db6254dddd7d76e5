"""Classic group membership: JoinGroup (11), SyncGroup (14), Heartbeat (12), LeaveGroup (13).

JoinGroup and SyncGroup may be parked by the shard until other members arrive; the
handler then awaits the completion that names its token (``GroupCoordinatorService``).

The shard answers each of them with kio's response entity of the version received (the
classic protocol's fields differ between versions in ways the shard decides, e.g. a
JoinGroup protocol name that is not nullable before v7), which is sent as it is; the
handlers are typed with the response views, whose fields those entities have.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable

from ...errors import ErrorCode
from ...protocol.messages.heartbeat_request import HeartbeatRequest
from ...protocol.messages.heartbeat_response import HeartbeatResponse
from ...protocol.messages.join_group_request import JoinGroupRequest
from ...protocol.messages.join_group_response import JoinGroupResponse
from ...protocol.messages.leave_group_request import LeaveGroupRequest
from ...protocol.messages.leave_group_response import LeaveGroupResponse
from ...protocol.messages.sync_group_request import SyncGroupRequest
from ...protocol.messages.sync_group_response import SyncGroupResponse
from ...security.authz import READ, group_refusal
from ..context import RequestContext
from ..dispatch import api
from ..group_service import client_host, group_service

log = logging.getLogger("shoal.groups")


def _trace(api_name: str, group_id: str, member: str | None, generation: int | None, code: ErrorCode,
           answer_generation: int | None = None, leader: str | None = None) -> None:
    """Log a classic-group exchange at DEBUG (member, generation, outcome); callers check
    ``log.isEnabledFor(logging.DEBUG)`` first, so that a heartbeat pays nothing for it."""
    log.debug("%s group=%s member=%s generation=%s -> %s generation=%s leader=%s", api_name, group_id, member,
              generation, code.name, answer_generation, leader)


@api(11, 0, 9)
async def handle_join_group(ctx: RequestContext, request: JoinGroupRequest) -> JoinGroupResponse:
    if (denied := group_refusal(ctx, READ, request.group_id, generation_id=-1)) is not None:
        refused: JoinGroupResponse = denied
        return refused
    svc = group_service(ctx.broker)
    p = svc.partition_for(request.group_id)
    token = svc.new_token()
    result = svc.shard(p).handle_join_group(request, ctx.now_ms(), token=token,
                                            client_id=ctx.header.client_id or "", client_host=client_host(ctx))
    response: JoinGroupResponse = await svc.apply_and_wait(p, result, token)
    if log.isEnabledFor(logging.DEBUG):
        _trace("JoinGroup", request.group_id, request.member_id or None, None, response.error_code,
               response.generation_id, response.leader)
    return response


@api(14, 0, 5)
async def handle_sync_group(ctx: RequestContext, request: SyncGroupRequest) -> SyncGroupResponse:
    if (denied := group_refusal(ctx, READ, request.group_id)) is not None:
        refused: SyncGroupResponse = denied
        return refused
    svc = group_service(ctx.broker)
    p = svc.partition_for(request.group_id)
    token = svc.new_token()
    result = svc.shard(p).handle_sync_group(request, ctx.now_ms(), token=token,
                                            client_id=ctx.header.client_id or "", client_host=client_host(ctx))
    response: SyncGroupResponse = await svc.apply_and_wait(p, result, token)
    if log.isEnabledFor(logging.DEBUG):
        _trace("SyncGroup", request.group_id, request.member_id or None, request.generation_id, response.error_code)
    return response


@api(12, 0, 4)
def handle_heartbeat(
        ctx: RequestContext, request: HeartbeatRequest) -> HeartbeatResponse | Awaitable[HeartbeatResponse]:
    if (denied := group_refusal(ctx, READ, request.group_id)) is not None:
        refused: HeartbeatResponse = denied
        return refused
    svc = group_service(ctx.broker)
    p = svc.partition_for(request.group_id)
    result = svc.apply(p, svc.shard(p).handle_heartbeat(request, ctx.now_ms()))
    response: HeartbeatResponse = result.answer()
    if log.isEnabledFor(logging.DEBUG):
        _trace("Heartbeat", request.group_id, request.member_id or None, request.generation_id, response.error_code)
    answer: HeartbeatResponse | Awaitable[HeartbeatResponse] = svc.answer(p, response, wrote=bool(result.records))
    return answer


@api(13, 0, 5)
def handle_leave_group(
        ctx: RequestContext, request: LeaveGroupRequest) -> LeaveGroupResponse | Awaitable[LeaveGroupResponse]:
    if (denied := group_refusal(ctx, READ, request.group_id)) is not None:
        refused: LeaveGroupResponse = denied
        return refused
    svc = group_service(ctx.broker)
    p = svc.partition_for(request.group_id)
    result = svc.apply(p, svc.shard(p).handle_leave_group(request, ctx.now_ms()))
    response: LeaveGroupResponse = result.answer()
    if log.isEnabledFor(logging.DEBUG):
        # v0-v2 name one member; v3 and later a list of them (MemberId reads "" there)
        member = request.member_id or ",".join(m.member_id for m in request.members) or None
        _trace("LeaveGroup", request.group_id, member, None, response.error_code)
    answer: LeaveGroupResponse | Awaitable[LeaveGroupResponse] = svc.answer(p, response, wrote=bool(result.records))
    return answer
