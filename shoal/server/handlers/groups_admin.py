"""Group administration across every kind: DescribeGroups (15), ListGroups (16), DeleteGroups (42).

These span all ``__consumer_offsets`` partitions: ids are routed to their shard and the
answers put back in request order; ListGroups concatenates every shard's groups.
DeleteGroups of a share group deletes its share-partition state first (two stages, see
``group_service``); any successful deletion also drops the group's dynamic configs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable
from typing import Any

from ...errors import ApiError, ErrorCode
from ...protocol.messages.delete_groups_request import DeleteGroupsRequest
from ...protocol.messages.delete_groups_response import DeletableGroupResult, DeleteGroupsResponse
from ...protocol.messages.describe_groups_request import DescribeGroupsRequest
from ...protocol.messages.describe_groups_response import DescribeGroupsResponse
from ...protocol.messages.list_groups_request import ListGroupsRequest
from ...protocol.messages.list_groups_response import ListGroupsResponse
from ...security.authz import CLUSTER, CLUSTER_RESOURCE, DELETE, DESCRIBE, GROUP, allowed, hide_undescribable
from ..context import RequestContext
from ..dispatch import api
from ..group_service import group_service


def _entity(request: DescribeGroupsRequest | ListGroupsRequest | DeleteGroupsRequest) -> Any:
    """The request as what it is, kio's entity of the version received: the group shards answer
    at that version (their described and listed groups pass into the answer as they are)."""
    return request


@api(15, 0, 6)
def handle_describe_groups(
        ctx: RequestContext, request: DescribeGroupsRequest,
) -> DescribeGroupsResponse | Awaitable[DescribeGroupsResponse]:
    svc = group_service(ctx.broker)
    now = ctx.now_ms()
    by_partition: dict[int, list[str]] = {}
    errors: dict[str, ApiError] = {}
    for group_id in request.groups:
        p = svc.runtime.partition_for_group(group_id)
        try:
            svc.runtime.check_owner(p)  # cluster mode: another broker may coordinate this group
        except ApiError as e:
            errors[group_id] = e
        by_partition.setdefault(p, []).append(group_id)
    answers: dict[str, Any] = {}
    for p, ids in by_partition.items():
        one = dataclasses.replace(_entity(request), groups=tuple(ids))
        for g in svc.shard(p).handle_describe_groups(one, now).answer().groups:
            error = errors.get(g.group_id)
            answers[g.group_id] = g if error is None else dataclasses.replace(g, error_code=error.error_code)
    if not answers:
        return DescribeGroupsResponse()
    shown = dict(zip(answers, hide_undescribable(ctx, answers.values()), strict=True))

    def build(failed: dict[int, ApiError]) -> DescribeGroupsResponse:
        return DescribeGroupsResponse(groups=tuple(svc.with_error(shown[g], failed) for g in request.groups))

    answer: DescribeGroupsResponse | Awaitable[DescribeGroupsResponse] = svc.answer_per_partition(by_partition, build)
    return answer


@api(16, 0, 5)
def handle_list_groups(
        ctx: RequestContext, request: ListGroupsRequest) -> ListGroupsResponse | Awaitable[ListGroupsResponse]:
    svc = group_service(ctx.broker)
    now = ctx.now_ms()
    groups: list[Any] = []
    owned = svc.owned_partitions()
    for p in owned:
        groups.extend(svc.shard(p).handle_list_groups(_entity(request), now).answer().groups)
    if ctx.broker.authorizer is not None and not allowed(ctx, DESCRIBE, CLUSTER, CLUSTER_RESOURCE, log_denied=False):
        groups = [g for g in groups if allowed(ctx, DESCRIBE, GROUP, g.group_id, log_denied=False)]
    listed = ListGroupsResponse(groups=tuple(sorted(groups, key=lambda g: g.group_id)))

    def build(failed: dict[int, ApiError]) -> ListGroupsResponse:
        if failed:  # a partition's groups are not known to be replicated: the client asks again
            return ListGroupsResponse(error_code=next(iter(failed.values())).error_code)
        return listed

    answer: ListGroupsResponse | Awaitable[ListGroupsResponse] = svc.answer_per_partition(owned, build)
    return answer


@api(42, 0, 2)
async def handle_delete_groups(ctx: RequestContext, request: DeleteGroupsRequest) -> DeleteGroupsResponse:
    svc = group_service(ctx.broker)
    results = []
    for group_id in request.groups_names:
        if not allowed(ctx, DELETE, GROUP, group_id):
            results.append(DeletableGroupResult(group_id=group_id, error_code=ErrorCode.group_authorization_failed))
            continue
        try:
            p = svc.partition_for(group_id)
        except ApiError as e:  # cluster mode: another broker coordinates this group
            results.append(DeletableGroupResult(group_id=group_id, error_code=e.error_code))
            continue
        code: ErrorCode
        try:
            if svc.group_type(group_id) == "share":
                code = await svc.delete_share_group(p, group_id)
            else:
                one = dataclasses.replace(_entity(request), groups_names=(group_id,))
                result = svc.apply(p, svc.shard(p).handle_delete_groups(one, ctx.now_ms()))
                code = result.answer().results[0].error_code
                await svc.wait_replicated(p, wrote=bool(result.records))
        except ApiError as e:  # the deletion could not be written or replicated: this group's result says so
            code = e.error_code
        if code is ErrorCode.none:
            try:
                if not ctx.broker.cluster.clustered:
                    ctx.broker.dynamic_configs.delete_group(group_id)
                elif group_id in ctx.broker.dynamic_configs.groups:  # the cluster's, in etcd
                    await ctx.broker.cluster.alter_group_configs(group_id, lambda _current: {}, validate_only=False)
            except ApiError as e:
                code = e.error_code
        results.append(DeletableGroupResult(group_id=group_id, error_code=code))
    return DeleteGroupsResponse(results=tuple(results))
