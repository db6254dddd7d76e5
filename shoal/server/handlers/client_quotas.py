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

from typing import Any

from ...errors import ErrorCode
from ...protocol.entities import make, sub
from ...security.access import is_broker
from ...security.quota_store import quota_service
from ...security.quotas import (
    QuotaRequestError,
    apply_alteration,
    describe,
    entity_of,
    validate_alteration,
)
from ..broker import on_start
from ..dispatch import api


@on_start
async def _load_quotas(broker: Any) -> None:
    quota_service(broker)  # read the stored quotas before the first connection


def _allowed(ctx: Any) -> bool:
    sec = getattr(ctx.connection, "security", None)
    return sec is None or is_broker(sec)


@api(48, 0, 1)
def handle_describe_client_quotas(ctx: Any, request: Any) -> Any:
    cls = ctx.response_type
    if not _allowed(ctx):
        return make(cls, throttle_time=0, error_code=ErrorCode.cluster_authorization_failed,
                    error_message="only brokers and super.users may describe client quotas", entries=None)
    ecls, vcls, entry_cls = sub(cls, "EntityData"), sub(cls, "ValueData"), sub(cls, "EntryData")
    try:
        found = describe(quota_service(ctx.broker).quotas(),
                         [(c.entity_type, int(c.match_type), c.match) for c in request.components], request.strict)
    except QuotaRequestError as e:
        return make(cls, throttle_time=0, error_code=ErrorCode[e.code], error_message=e.message, entries=None)
    entries = tuple(
        make(entry_cls, entity=tuple(make(ecls, entity_type=t, entity_name=n) for t, n in entity),
             values=tuple(make(vcls, key=k, value=v) for k, v in sorted(values.items())))
        for entity, values in found)
    return make(cls, throttle_time=0, error_code=ErrorCode.none, error_message=None, entries=entries)


@api(49, 0, 1)
async def handle_alter_client_quotas(ctx: Any, request: Any) -> Any:
    cls = ctx.response_type
    ecls, entry_cls = sub(cls, "EntityData"), sub(cls, "EntryData")
    service = quota_service(ctx.broker)
    allowed = _allowed(ctx)
    quotas = service.quotas()
    results: list[tuple[Any, ErrorCode, str | None]] = []
    changes: dict[Any, dict[str, float]] = {}
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
            code = ErrorCode.unknown_server_error if getattr(ctx.broker.cluster, "clustered", False) \
                else ErrorCode.kafka_storage_error
            for i in accepted:
                results[i] = (results[i][0], code, f"the client quotas could not be written: {e}")
    return make(cls, throttle_time=0, entries=tuple(
        make(entry_cls, error_code=code, error_message=message,
             entity=tuple(make(ecls, entity_type=e.entity_type, entity_name=e.entity_name) for e in entry.entity))
        for entry, code, message in results))
