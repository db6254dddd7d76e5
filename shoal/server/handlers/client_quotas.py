"""DescribeClientQuotas (48) and AlterClientQuotas (49): client quotas as Kafka keeps them.

Entities, keys, precedence and the checks are Kafka's (``security/quotas.py``): an entry
with an unknown entity type or key, a duplicate component, an empty name, a value that is
not positive (or fractional for a byte rate) is INVALID_REQUEST, and leaves the other
entries alone. ``validate_only`` checks and changes nothing. The accepted entries are
stored together (``security/quota_store.py``: the data directory, or etcd in a cluster);
a store that cannot be written answers KAFKA_STORAGE_ERROR (UNKNOWN_SERVER_ERROR for
etcd) for each of them. A DescribeClientQuotas filter Kafka refuses is answered with its
top-level INVALID_REQUEST or UNSUPPORTED_VERSION.

On a broker with a secured listener, only the brokers and ``super.users`` may alter or
describe quotas (Kafka asks for ALTER_CONFIGS and DESCRIBE_CONFIGS on the CLUSTER);
anyone else gets CLUSTER_AUTHORIZATION_FAILED.
"""

from __future__ import annotations

from ...errors import ErrorCode
from ...protocol.messages import alter_client_quotas_response as alter_resp
from ...protocol.messages import describe_client_quotas_response as describe_resp
from ...protocol.messages.alter_client_quotas_request import AlterClientQuotasRequest, EntryData
from ...protocol.messages.describe_client_quotas_request import DescribeClientQuotasRequest
from ...security.access import is_broker
from ...security.quota_store import quota_service
from ...security.quotas import (
    Entity,
    QuotaRequestError,
    apply_alteration,
    describe,
    entity_of,
    validate_alteration,
)
from ..broker import Broker, on_start
from ..context import RequestContext
from ..dispatch import api


@on_start
async def _load_quotas(broker: Broker) -> None:
    quota_service(broker)  # read the stored quotas before the first connection


def _allowed(ctx: RequestContext) -> bool:
    sec = ctx.connection.security
    return sec is None or is_broker(sec)


@api(48, 0, 1)
def handle_describe_client_quotas(
        ctx: RequestContext, request: DescribeClientQuotasRequest) -> describe_resp.DescribeClientQuotasResponse:
    if not _allowed(ctx):
        return describe_resp.DescribeClientQuotasResponse(
            error_code=ErrorCode.cluster_authorization_failed,
            error_message="only brokers and super.users may describe client quotas")
    try:
        found = describe(quota_service(ctx.broker).quotas(),
                         [(c.entity_type, c.match_type, c.match) for c in request.components], request.strict)
    except QuotaRequestError as e:
        return describe_resp.DescribeClientQuotasResponse(error_code=ErrorCode[e.code], error_message=e.message)
    entries = tuple(
        describe_resp.EntryData(
            entity=tuple(describe_resp.EntityData(entity_type=t, entity_name=n) for t, n in entity),
            values=tuple(describe_resp.ValueData(key=k, value=v) for k, v in sorted(values.items())))
        for entity, values in found)
    return describe_resp.DescribeClientQuotasResponse(entries=entries)


@api(49, 0, 1)
async def handle_alter_client_quotas(
        ctx: RequestContext, request: AlterClientQuotasRequest) -> alter_resp.AlterClientQuotasResponse:
    service = quota_service(ctx.broker)
    allowed = _allowed(ctx)
    quotas = service.quotas()
    results: list[tuple[EntryData, ErrorCode, str | None]] = []
    changes: dict[Entity, dict[str, float]] = {}
    accepted: list[int] = []
    for entry in request.entries:
        if not allowed:
            results.append((entry, ErrorCode.cluster_authorization_failed,
                            "only brokers and super.users may alter client quotas"))
            continue
        try:
            entity = entity_of((e.entity_type, e.entity_name) for e in entry.entity)
            ops = validate_alteration((op.key, float(op.value), op.remove) for op in entry.ops)
        except QuotaRequestError as e:
            results.append((entry, ErrorCode[e.code], e.message))
            continue
        current = {entity: changes[entity]} if entity in changes else quotas
        changes[entity] = apply_alteration(current, entity, ops)
        accepted.append(len(results))
        results.append((entry, ErrorCode.none, None))
    if changes and not request.validate_only:
        try:
            await service.alter(changes)
        except OSError as e:
            code = ErrorCode.unknown_server_error if ctx.broker.cluster.clustered else ErrorCode.kafka_storage_error
            for i in accepted:
                results[i] = (results[i][0], code, f"the client quotas could not be written: {e}")
    return alter_resp.AlterClientQuotasResponse(entries=tuple(
        alter_resp.EntryData(error_code=code, error_message=message, entity=tuple(
            alter_resp.EntityData(entity_type=e.entity_type, entity_name=e.entity_name) for e in entry.entity))
        for entry, code, message in results))
