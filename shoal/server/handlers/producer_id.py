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

from ...errors import ApiError, ErrorCode
from ...protocol.messages.init_producer_id_request import InitProducerIdRequest
from ...protocol.messages.init_producer_id_response import InitProducerIdResponse
from ...security.acls import CLUSTER_NAME, Operation, ResourceType
from ...security.authz import allowed, allowed_on_any
from ..context import RequestContext
from ..dispatch import api
from ..txn_service import transaction_service


def _refused(code: ErrorCode) -> InitProducerIdResponse:
    return InitProducerIdResponse(error_code=code, producer_id=-1, producer_epoch=-1)


@api(22, 0, 5)
async def handle_init_producer_id(ctx: RequestContext, request: InitProducerIdRequest) -> InitProducerIdResponse:
    # producer_id and producer_epoch came with v3 (KIP-360); before, they read as -1 (none given)
    given_pid, given_epoch = request.producer_id, request.producer_epoch
    txn_id = request.transactional_id
    if txn_id is not None:
        if not allowed(ctx, Operation.WRITE, ResourceType.TRANSACTIONAL_ID, txn_id):
            return _refused(ErrorCode.transactional_id_authorization_failed)
        svc = transaction_service(ctx.broker)
        if svc is None:
            return _refused(ErrorCode.transactional_id_authorization_failed)
        timeout_ms = int(request.transaction_timeout.total_seconds() * 1000)
        await svc.after_completion(txn_id)  # parked while its markers are written
        if svc.clustered:
            code, pid, epoch = await svc.init_producer_id_clustered(txn_id, timeout_ms, given_pid, given_epoch)
        else:
            code, pid, epoch = svc.init_producer_id(txn_id, timeout_ms, given_pid, given_epoch)
        if code == ErrorCode.producer_fenced and ctx.api_version < 4:
            code = ErrorCode.invalid_producer_epoch
        return InitProducerIdResponse(error_code=code, producer_id=pid, producer_epoch=epoch)
    if not (allowed(ctx, Operation.IDEMPOTENT_WRITE, ResourceType.CLUSTER, CLUSTER_NAME, log_denied=False)
            or allowed_on_any(ctx, Operation.WRITE, ResourceType.TOPIC)):
        # Kafka: an idempotent producer needs IDEMPOTENT_WRITE on the cluster or WRITE on some topic
        allowed(ctx, Operation.IDEMPOTENT_WRITE, ResourceType.CLUSTER, CLUSTER_NAME)  # logs the denial
        return _refused(ErrorCode.cluster_authorization_failed)
    if given_pid >= 0 and 0 <= given_epoch < 32766:
        # KIP-360: an idempotent producer may bump its own epoch after an error.
        return InitProducerIdResponse(error_code=ErrorCode.none, producer_id=given_pid,
                                      producer_epoch=given_epoch + 1)
    if ctx.broker.replicas is not None:
        return await _allocate_in_cluster(ctx)
    new_id = ctx.broker.producer_ids.allocate()
    return InitProducerIdResponse(error_code=ErrorCode.none, producer_id=new_id, producer_epoch=0)


async def _allocate_in_cluster(ctx: RequestContext) -> InitProducerIdResponse:
    try:
        new_id: int = await ctx.broker.cluster.allocate_producer_id()
    except ApiError as e:
        return _refused(e.error_code)
    return InitProducerIdResponse(error_code=ErrorCode.none, producer_id=new_id, producer_epoch=0)
