"""Classic group membership: JoinGroup (11), SyncGroup (14), Heartbeat (12), LeaveGroup (13).

JoinGroup and SyncGroup may be parked by the shard until other members arrive; the
handler then awaits the completion that names its token (``GroupCoordinatorService``).
"""

from __future__ import annotations

from typing import Any

from ..dispatch import api
from ..group_service import client_host, group_service


@api(11, 0, 9)
async def handle_join_group(ctx: Any, request: Any) -> Any:
    svc = group_service(ctx.broker)
    p = svc.partition_for(request.group_id)
    token = svc.new_token()
    result = svc.shard(p).handle_join_group(request, ctx.now_ms(), token=token,
                                            client_id=ctx.header.client_id or "", client_host=client_host(ctx))
    return await svc.apply_and_wait(p, result, token)


@api(14, 0, 5)
async def handle_sync_group(ctx: Any, request: Any) -> Any:
    svc = group_service(ctx.broker)
    p = svc.partition_for(request.group_id)
    token = svc.new_token()
    result = svc.shard(p).handle_sync_group(request, ctx.now_ms(), token=token,
                                            client_id=ctx.header.client_id or "", client_host=client_host(ctx))
    return await svc.apply_and_wait(p, result, token)


@api(12, 0, 4)
def handle_heartbeat(ctx: Any, request: Any) -> Any:
    svc = group_service(ctx.broker)
    p = svc.partition_for(request.group_id)
    return svc.apply(p, svc.shard(p).handle_heartbeat(request, ctx.now_ms())).response


@api(13, 0, 5)
def handle_leave_group(ctx: Any, request: Any) -> Any:
    svc = group_service(ctx.broker)
    p = svc.partition_for(request.group_id)
    return svc.apply(p, svc.shard(p).handle_leave_group(request, ctx.now_ms())).response
