"""Classic group membership: JoinGroup (11), SyncGroup (14), Heartbeat (12), LeaveGroup (13).

JoinGroup and SyncGroup may be parked by the shard until other members arrive; the
handler then awaits the completion that names its token (``GroupCoordinatorService``).
"""

from __future__ import annotations

import logging
from typing import Any

from ...security.authz import READ, group_refusal
from ..dispatch import api
from ..group_service import client_host, group_service

log = logging.getLogger("shoal.groups")


def _trace(api_name: str, request: Any, response: Any) -> Any:
    """Log a classic-group exchange at DEBUG (member, generation, outcome)."""
    if log.isEnabledFor(logging.DEBUG):
        members = getattr(request, "members", None)
        member = getattr(request, "member_id", None) or (
            ",".join(m.member_id for m in members) if members else None)
        log.debug("%s group=%s member=%s generation=%s -> %s generation=%s leader=%s", api_name,
                  request.group_id, member, getattr(request, "generation_id", None),
                  getattr(getattr(response, "error_code", None), "name", None),
                  getattr(response, "generation_id", None), getattr(response, "leader", None))
    return response


@api(11, 0, 9)
async def handle_join_group(ctx: Any, request: Any) -> Any:
    if (denied := group_refusal(ctx, READ, request.group_id, generation_id=-1)) is not None:
        return denied
    svc = group_service(ctx.broker)
    p = svc.partition_for(request.group_id)
    token = svc.new_token()
    result = svc.shard(p).handle_join_group(request, ctx.now_ms(), token=token,
                                            client_id=ctx.header.client_id or "", client_host=client_host(ctx))
    return _trace("JoinGroup", request, await svc.apply_and_wait(p, result, token))


@api(14, 0, 5)
async def handle_sync_group(ctx: Any, request: Any) -> Any:
    if (denied := group_refusal(ctx, READ, request.group_id)) is not None:
        return denied
    svc = group_service(ctx.broker)
    p = svc.partition_for(request.group_id)
    token = svc.new_token()
    result = svc.shard(p).handle_sync_group(request, ctx.now_ms(), token=token,
                                            client_id=ctx.header.client_id or "", client_host=client_host(ctx))
    return _trace("SyncGroup", request, await svc.apply_and_wait(p, result, token))


@api(12, 0, 4)
def handle_heartbeat(ctx: Any, request: Any) -> Any:
    if (denied := group_refusal(ctx, READ, request.group_id)) is not None:
        return denied
    svc = group_service(ctx.broker)
    p = svc.partition_for(request.group_id)
    result = svc.apply(p, svc.shard(p).handle_heartbeat(request, ctx.now_ms()))
    return svc.answer(p, _trace("Heartbeat", request, result.response), wrote=bool(result.records))


@api(13, 0, 5)
def handle_leave_group(ctx: Any, request: Any) -> Any:
    if (denied := group_refusal(ctx, READ, request.group_id)) is not None:
        return denied
    svc = group_service(ctx.broker)
    p = svc.partition_for(request.group_id)
    result = svc.apply(p, svc.shard(p).handle_leave_group(request, ctx.now_ms()))
    return svc.answer(p, _trace("LeaveGroup", request, result.response), wrote=bool(result.records))
