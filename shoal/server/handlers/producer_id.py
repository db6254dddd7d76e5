"""InitProducerId (22), v0-v5: producer ids for idempotent producers (no transactions yet)."""

from __future__ import annotations

from typing import Any

from ...errors import ErrorCode
from ...protocol.entities import make
from ..dispatch import api


@api(22, 0, 5)
def handle_init_producer_id(ctx: Any, request: Any) -> Any:
    cls = ctx.response_type
    if request.transactional_id is not None:
        return make(cls, throttle_time=0, error_code=ErrorCode.transactional_id_authorization_failed,
                    producer_id=-1, producer_epoch=-1)
    pid = getattr(request, "producer_id", -1)
    epoch = getattr(request, "producer_epoch", -1)
    if pid >= 0 and 0 <= epoch < 32766:
        # KIP-360: an idempotent producer may bump its own epoch after an error.
        return make(cls, throttle_time=0, error_code=ErrorCode.none, producer_id=pid, producer_epoch=epoch + 1)
    new_id = ctx.broker.producer_ids.allocate()
    return make(cls, throttle_time=0, error_code=ErrorCode.none, producer_id=new_id, producer_epoch=0)
