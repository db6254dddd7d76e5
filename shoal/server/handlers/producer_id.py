"""InitProducerId (22), v0-v5: producer ids for idempotent and transactional producers.

One broker reserves ids in blocks in its data directory; in cluster mode the blocks come
from etcd, so no two brokers hand out the same id. With a transactional id the
transaction coordinator answers (``txn_service.py``: the id's producer id, a bumped
epoch, fencing of an earlier instance); PRODUCER_FENCED goes to versions before 4 as
INVALID_PRODUCER_EPOCH, as Kafka does. A request that arrives while the transactional id's
last transaction is completing waits for that (``TransactionService.after_completion``).
In cluster mode a transactional id is answered by
the broker leading its ``__transaction_state`` partition (NOT_COORDINATOR elsewhere).
"""

from __future__ import annotations

from typing import Any

from ...errors import ApiError, ErrorCode
from ...protocol.entities import make
from ...security.acls import CLUSTER_NAME, Operation, ResourceType
from ...security.authz import allowed, allowed_on_any
from ..dispatch import api
from ..txn_service import transaction_service


@api(22, 0, 5)
async def handle_init_producer_id(ctx: Any, request: Any) -> Any:
    cls = ctx.response_type
    if request.transactional_id is not None:
        if not allowed(ctx, Operation.WRITE, ResourceType.TRANSACTIONAL_ID, request.transactional_id):
            return make(cls, throttle_time=0, error_code=ErrorCode.transactional_id_authorization_failed,
                        producer_id=-1, producer_epoch=-1)
        svc = transaction_service(ctx.broker)
        if svc is None:
            return make(cls, throttle_time=0, error_code=ErrorCode.transactional_id_authorization_failed,
                        producer_id=-1, producer_epoch=-1)
        timeout_ms = int(request.transaction_timeout.total_seconds() * 1000)
        args = (request.transactional_id, timeout_ms, getattr(request, "producer_id", -1),
                getattr(request, "producer_epoch", -1))
        await svc.after_completion(request.transactional_id)  # parked while its markers are written
        if svc.clustered:
            code, pid, epoch = await svc.init_producer_id_clustered(*args)
        else:
            code, pid, epoch = svc.init_producer_id(*args)
        if code == ErrorCode.producer_fenced and ctx.api_version < 4:
            code = ErrorCode.invalid_producer_epoch
        return make(cls, throttle_time=0, error_code=code, producer_id=pid, producer_epoch=epoch)
    if not (allowed(ctx, Operation.IDEMPOTENT_WRITE, ResourceType.CLUSTER, CLUSTER_NAME, log_denied=False)
            or allowed_on_any(ctx, Operation.WRITE, ResourceType.TOPIC)):
        # Kafka: an idempotent producer needs IDEMPOTENT_WRITE on the cluster or WRITE on some topic
        allowed(ctx, Operation.IDEMPOTENT_WRITE, ResourceType.CLUSTER, CLUSTER_NAME)  # logs the denial
        return make(cls, throttle_time=0, error_code=ErrorCode.cluster_authorization_failed,
                    producer_id=-1, producer_epoch=-1)
    pid = getattr(request, "producer_id", -1)
    epoch = getattr(request, "producer_epoch", -1)
    if pid >= 0 and 0 <= epoch < 32766:
        # KIP-360: an idempotent producer may bump its own epoch after an error.
        return make(cls, throttle_time=0, error_code=ErrorCode.none, producer_id=pid, producer_epoch=epoch + 1)
    if ctx.broker.replicas is not None:
        return await _allocate_in_cluster(ctx, cls)
    new_id = ctx.broker.producer_ids.allocate()
    return make(cls, throttle_time=0, error_code=ErrorCode.none, producer_id=new_id, producer_epoch=0)


async def _allocate_in_cluster(ctx: Any, cls: type) -> Any:
    try:
        new_id = await ctx.broker.cluster.allocate_producer_id()
    except ApiError as e:
        return make(cls, throttle_time=0, error_code=e.error_code, producer_id=-1, producer_epoch=-1)
    return make(cls, throttle_time=0, error_code=ErrorCode.none, producer_id=new_id, producer_epoch=0)
