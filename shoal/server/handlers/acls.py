"""DescribeAcls (29), CreateAcls (30) and DeleteAcls (31): the authorizer's ACLs.

As Kafka's broker answers them: without an authorizer every answer is SECURITY_DISABLED;
DescribeAcls needs DESCRIBE on the CLUSTER, CreateAcls and DeleteAcls ALTER on it
(CLUSTER_AUTHORIZATION_FAILED). A binding Kafka refuses (a pattern type other than
LITERAL or PREFIXED, an operation or permission ANY or UNKNOWN, a principal without
``Type:``, the CLUSTER resource named other than ``kafka-cluster``) is INVALID_REQUEST for
that creation only; the others are stored together (shoal/security/authz.py), and a store
that cannot be written fails each of them. Creating a binding that exists changes nothing
and succeeds; DeleteAcls answers per filter the bindings it removed.
"""

from __future__ import annotations

import logging

from ...errors import ErrorCode
from ...protocol.messages import create_acls_response as create_resp
from ...protocol.messages import delete_acls_response as delete_resp
from ...protocol.messages.create_acls_request import CreateAclsRequest
from ...protocol.messages.delete_acls_request import DeleteAclsFilter, DeleteAclsRequest
from ...protocol.messages.describe_acls_request import DescribeAclsRequest
from ...protocol.messages.describe_acls_response import AclDescription, DescribeAclsResource, DescribeAclsResponse
from ...security.acls import (
    AclBinding,
    AclError,
    AclFilter,
    Operation,
    ResourceType,
    validate_binding,
    validate_filter,
)
from ...security.authz import allowed, install
from ..broker import Broker, on_start
from ..context import RequestContext
from ..dispatch import api

log = logging.getLogger("shoal.security")


@on_start
async def _install_authorizer(broker: Broker) -> None:
    install(broker)


def _refusal(ctx: RequestContext, operation: Operation) -> tuple[ErrorCode, str] | None:
    if ctx.broker.authorizer is None:
        return ErrorCode.security_disabled, "No Authorizer is configured."
    if not allowed(ctx, operation, ResourceType.CLUSTER, "kafka-cluster"):
        return ErrorCode.cluster_authorization_failed, "Cluster authorization failed."
    return None


def _filter(f: DescribeAclsRequest | DeleteAclsFilter) -> AclFilter:
    return AclFilter(f.resource_type_filter, f.resource_name_filter, f.pattern_type_filter, f.principal_filter,
                     f.host_filter, f.operation, f.permission_type)


@api(29, 1, 3)
def handle_describe_acls(ctx: RequestContext, request: DescribeAclsRequest) -> DescribeAclsResponse:
    refused = _refusal(ctx, Operation.DESCRIBE)
    if refused is not None:
        return DescribeAclsResponse(error_code=refused[0], error_message=refused[1])
    flt = _filter(request)
    try:
        validate_filter(flt)
    except AclError as e:
        return DescribeAclsResponse(error_code=ErrorCode.invalid_request, error_message=str(e))
    grouped: dict[tuple[int, str, int], list[AclBinding]] = {}
    for b in sorted(ctx.broker.authorizer.bindings):
        if flt.matches(b):
            grouped.setdefault((b.resource_type, b.resource_name, b.pattern_type), []).append(b)
    resources = tuple(
        DescribeAclsResource(resource_type=t, resource_name=n, pattern_type=p, acls=tuple(
            AclDescription(principal=b.principal, host=b.host, operation=b.operation, permission_type=b.permission)
            for b in bs))
        for (t, n, p), bs in grouped.items())
    return DescribeAclsResponse(resources=resources)


@api(30, 1, 3)
async def handle_create_acls(ctx: RequestContext, request: CreateAclsRequest) -> create_resp.CreateAclsResponse:
    refused = _refusal(ctx, Operation.ALTER)
    if refused is not None:
        return create_resp.CreateAclsResponse(results=tuple(
            create_resp.AclCreationResult(error_code=refused[0], error_message=refused[1]) for _ in request.creations))
    results: list[tuple[ErrorCode, str | None]] = []
    good: dict[int, AclBinding] = {}
    for i, c in enumerate(request.creations):
        b = AclBinding(c.resource_type, c.resource_name, c.resource_pattern_type, c.principal, c.host, c.operation,
                       c.permission_type)
        try:
            validate_binding(b)
        except AclError as e:
            results.append((ErrorCode.invalid_request, str(e)))
            continue
        results.append((ErrorCode.none, None))
        good[i] = b
    if good:
        try:
            await ctx.broker.authorizer.change(good.values(), ())
        except OSError as e:
            for i in good:
                results[i] = (ErrorCode.unknown_server_error, f"the ACLs could not be stored: {e}")
        else:
            for b in good.values():
                log.info("ACL added: %s", b.describe())
    return create_resp.CreateAclsResponse(results=tuple(
        create_resp.AclCreationResult(error_code=c, error_message=m) for c, m in results))


@api(31, 1, 3)
async def handle_delete_acls(ctx: RequestContext, request: DeleteAclsRequest) -> delete_resp.DeleteAclsResponse:
    refused = _refusal(ctx, Operation.ALTER)
    if refused is not None:
        return delete_resp.DeleteAclsResponse(filter_results=tuple(
            delete_resp.DeleteAclsFilterResult(error_code=refused[0], error_message=refused[1])
            for _ in request.filters))
    existing = sorted(ctx.broker.authorizer.bindings)
    per_filter: list[tuple[ErrorCode, str | None, list[AclBinding]]] = []
    doomed: set[AclBinding] = set()
    for f in request.filters:
        flt = _filter(f)
        try:
            validate_filter(flt)
        except AclError as e:
            per_filter.append((ErrorCode.invalid_request, str(e), []))
            continue
        matched = [b for b in existing if flt.matches(b)]
        doomed.update(matched)
        per_filter.append((ErrorCode.none, None, matched))
    if doomed:
        try:
            await ctx.broker.authorizer.change((), doomed)
        except OSError as e:
            per_filter = [(ErrorCode.unknown_server_error, f"the ACLs could not be deleted: {e}", [])
                          if m else (c, msg, m) for c, msg, m in per_filter]
        else:
            for b in sorted(doomed):
                log.info("ACL removed: %s", b.describe())
    return delete_resp.DeleteAclsResponse(filter_results=tuple(
        delete_resp.DeleteAclsFilterResult(error_code=c, error_message=msg, matching_acls=tuple(
            delete_resp.DeleteAclsMatchingAcl(
                resource_type=b.resource_type, resource_name=b.resource_name, pattern_type=b.pattern_type,
                principal=b.principal, host=b.host, operation=b.operation, permission_type=b.permission)
            for b in m))
        for c, msg, m in per_filter))
