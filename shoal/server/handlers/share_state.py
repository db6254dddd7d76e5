"""The share-state RPCs of KIP-932 on the wire, through the share coordinator runtime.

InitializeShareGroupState (83) v0, ReadShareGroupState (84) v0, WriteShareGroupState
(85) v1, DeleteShareGroupState (86) v0, ReadShareGroupStateSummary (87) v1. Each
partition of a request is routed to its ``__share_group_state`` partition
(``partition_for``) and answered by the shard's wire handler there; the records are
appended, fsynced and replayed before the response goes out.

These are the persister's RPCs: in a cluster a share-partition leader sends them to the
broker leading the key's ``__share_group_state`` partition (``server/share_persister.py``);
a key of a partition this broker does not lead is answered NOT_COORDINATOR (still
loading: COORDINATOR_LOAD_IN_PROGRESS). The records of one request are appended per state
partition with one fsync, and in cluster mode answered once every in-sync replica has
them. On one broker the share-partition leader calls the shards in-process. A successful Initialize, Write or Delete over the
wire (or a Read naming a leader epoch, which may raise the stored one) replaces the
persisted state behind the back of a share-partition this broker may hold in memory, as
a new share-partition leader would: the in-memory share-partition is then dropped
(``ShareService.forget_partition``) without writing anything, and reloads from the
persisted state on next use, adopting its state and leader epochs. Records it had
acquired are available again after the reload, as after a restart.
"""

from __future__ import annotations

import dataclasses
import operator
import sys
import uuid
from collections.abc import Callable
from typing import Any

from ...errors import ApiError, ErrorCode
from ...protocol.entities import make, sub
from ...share.coordinator import SharePartitionKey, partition_for
from ..dispatch import api
from ..share_service import share_service


def _changes_state(p: Any) -> bool:
    return True


def _read_bumps_leader_epoch(p: Any) -> bool:
    return int(p.leader_epoch) != -1


async def _route(ctx: Any, request: Any, method: str,
                 changes_state: Callable[[Any], bool] | None = _changes_state) -> Any:
    svc = share_service(ctx.broker)
    runtime = svc.runtime
    def error(p: Any, e: ApiError) -> Any:
        return make(sub(ctx.response_type, "PartitionResult"), partition=p.partition, error_code=e.error_code,
                    error_message=e.message)

    answers: list[tuple[Any, list[Any]]] = []
    touched: dict[int, list[tuple[Any, Any, int]]] = {}
    """state partition -> (topic, partition request, index in its topic's answers) of its writes."""
    wrote: set[int] = set()
    response = None
    for topic in request.topics:
        parts: list[Any] = []
        for p in topic.partitions:
            one = dataclasses.replace(request, topics=(dataclasses.replace(topic, partitions=(p,)),))
            shard_index = partition_for(SharePartitionKey.of(request.group_id, topic.topic_id, p.partition),
                                        runtime.num_partitions)
            try:
                # Appended and replayed now; one fsync per state partition below covers them all.
                runtime.check_owner(shard_index)
                result = runtime.run_deferred(shard_index, operator.methodcaller(method, one))
            except ApiError as e:  # not the coordinator (cluster mode), or the state cannot be written
                parts.append(error(p, e))
                continue
            response = result.answer()
            parts.append(response.results[0].partitions[0])
            touched.setdefault(shard_index, []).append((topic, p, len(parts) - 1))
            if result.records:
                wrote.add(shard_index)
        answers.append((topic, parts))
    for shard_index, written in touched.items():
        try:
            runtime.flush_now(shard_index)
            if runtime.owned is not None:  # cluster mode: answered once every in-sync replica has it
                await runtime.wait_durable(shard_index, wrote=shard_index in wrote)
        except ApiError as e:
            for topic, p, i in written:
                parts = next(ps for t, ps in answers if t is topic)
                parts[i] = error(p, e)
            continue
        for topic, p, i in written:
            parts = next(ps for t, ps in answers if t is topic)
            if parts[i].error_code == ErrorCode.none and changes_state is not None and changes_state(p):
                tid = topic.topic_id if isinstance(topic.topic_id, uuid.UUID) else uuid.UUID(str(topic.topic_id))
                svc.forget_partition(request.group_id, tid, int(p.partition))
    if response is None:
        response = getattr(runtime.shards[0], method)(dataclasses.replace(request, topics=())).response
        if not answers:
            return response
    result_cls = type(response.results[0]) if response.results else _result_class(ctx.response_type)
    return dataclasses.replace(response, results=tuple(
        result_cls(topic_id=topic.topic_id, partitions=tuple(parts)) for topic, parts in answers))


def _result_class(cls: type) -> type:
    """The per-topic result entity of a share-state response (InitializeStateResult, ...)."""
    module = sys.modules[cls.__module__]
    for name in dir(module):
        c = getattr(module, name)
        if isinstance(c, type) and dataclasses.is_dataclass(c) and [f.name for f in dataclasses.fields(c)] == ["topic_id", "partitions"]:
            return c
    raise LookupError(f"no per-topic result entity next to {cls.__name__}")


@api(83, 0, 0)
async def handle_initialize_share_group_state(ctx: Any, request: Any) -> Any:
    return await _route(ctx, request, "handle_initialize_share_group_state")


@api(84, 0, 0)
async def handle_read_share_group_state(ctx: Any, request: Any) -> Any:
    return await _route(ctx, request, "handle_read_share_group_state", _read_bumps_leader_epoch)


@api(85, 1, 1)
async def handle_write_share_group_state(ctx: Any, request: Any) -> Any:
    return await _route(ctx, request, "handle_write_share_group_state")


@api(86, 0, 0)
async def handle_delete_share_group_state(ctx: Any, request: Any) -> Any:
    return await _route(ctx, request, "handle_delete_share_group_state")


@api(87, 1, 1)
async def handle_read_share_group_state_summary(ctx: Any, request: Any) -> Any:
    return await _route(ctx, request, "handle_read_share_group_state_summary", None)
