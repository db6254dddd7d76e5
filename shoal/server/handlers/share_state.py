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
import functools
import uuid
from collections.abc import Callable, Sequence
from typing import ClassVar, Protocol, TypeVar

from kio.schema.delete_share_group_state.v0 import request as delete_req
from kio.schema.delete_share_group_state.v0 import response as delete_resp
from kio.schema.initialize_share_group_state.v0 import request as init_req
from kio.schema.initialize_share_group_state.v0 import response as init_resp
from kio.schema.read_share_group_state.v0 import request as read_req
from kio.schema.read_share_group_state.v0 import response as read_resp
from kio.schema.read_share_group_state_summary.v1 import request as summary_req
from kio.schema.read_share_group_state_summary.v1 import response as summary_resp
from kio.schema.write_share_group_state.v1 import request as write_req
from kio.schema.write_share_group_state.v1 import response as write_resp

from ...coordinator.result import Result
from ...errors import ApiError, ErrorCode
from ...share.coordinator import ShareCoordinatorShard, SharePartitionKey, partition_for
from ..context import RequestContext
from ..dispatch import api
from ..share_service import share_service


class _Partition(Protocol):
    """A partition of a share-state request."""

    @property
    def partition(self) -> int: ...


class _Topic(Protocol):
    """A topic of a share-state request (kio's entities are dataclasses)."""

    __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[object]]]

    @property
    def topic_id(self) -> uuid.UUID | None: ...

    @property
    def partitions(self) -> Sequence[_Partition]: ...


class _Request(Protocol):
    """A share-state request: InitializeShareGroupState, ReadShareGroupState, ... (kio's class
    of the one version served)."""

    __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[object]]]

    @property
    def group_id(self) -> str: ...

    @property
    def topics(self) -> Sequence[_Topic]: ...


class _PartitionResult(Protocol):
    @property
    def error_code(self) -> ErrorCode: ...


class _TopicResult(Protocol):
    @property
    def partitions(self) -> Sequence[_PartitionResult]: ...


class _Response(Protocol):
    @property
    def results(self) -> Sequence[_TopicResult]: ...


Q = TypeVar("Q", bound=_Request)
S = TypeVar("S", bound=_Response)
R = TypeVar("R")


def _changes_state(p: _Partition) -> bool:
    return True


def _read_bumps_leader_epoch(p: _Partition) -> bool:
    return isinstance(p, read_req.PartitionData) and p.leader_epoch != -1


def _on_shard(run: Callable[[ShareCoordinatorShard, Q], Result[S]], request: Q,
              shard: ShareCoordinatorShard) -> Result[S]:
    return run(shard, request)


async def _route(ctx: RequestContext, request: Q, run: Callable[[ShareCoordinatorShard, Q], Result[S]],
                 response_cls: Callable[..., R], result_cls: Callable[..., object],
                 partition_cls: Callable[..., _PartitionResult],
                 changes_state: Callable[[_Partition], bool] | None = _changes_state) -> R:
    """``request`` answered per partition by its state partition's shard (``run``), as a
    ``response_cls`` whose ``results`` are ``result_cls`` per topic (``partition_cls`` per partition)."""
    svc = share_service(ctx.broker)
    runtime = svc.runtime

    def error(p: _Partition, e: ApiError) -> _PartitionResult:
        return partition_cls(partition=p.partition, error_code=e.error_code, error_message=e.message)

    answers: list[tuple[_Topic, list[_PartitionResult]]] = []
    touched: dict[int, list[tuple[_Topic, _Partition, int]]] = {}
    """state partition -> (topic, partition request, index in its topic's answers) of its writes."""
    wrote: set[int] = set()
    for topic in request.topics:
        parts: list[_PartitionResult] = []
        for p in topic.partitions:
            one = dataclasses.replace(request, topics=(dataclasses.replace(topic, partitions=(p,)),))
            shard_index = partition_for(SharePartitionKey.of(request.group_id, topic.topic_id, p.partition),
                                        runtime.num_partitions)
            try:
                # Appended and replayed now; one fsync per state partition below covers them all.
                runtime.check_owner(shard_index)
                result = runtime.run_deferred(shard_index, functools.partial(_on_shard, run, one))
            except ApiError as e:  # not the coordinator (cluster mode), or the state cannot be written
                parts.append(error(p, e))
                continue
            parts.append(result.answer().results[0].partitions[0])
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
            if (parts[i].error_code == ErrorCode.none and topic.topic_id is not None
                    and changes_state is not None and changes_state(p)):
                svc.forget_partition(request.group_id, topic.topic_id, p.partition)
    return response_cls(results=tuple(
        result_cls(topic_id=topic.topic_id, partitions=tuple(parts)) for topic, parts in answers))


@api(83, 0, 0)
async def handle_initialize_share_group_state(
        ctx: RequestContext, request: init_req.InitializeShareGroupStateRequest,
) -> init_resp.InitializeShareGroupStateResponse:
    return await _route(
        ctx, request, ShareCoordinatorShard.handle_initialize_share_group_state,
        init_resp.InitializeShareGroupStateResponse, init_resp.InitializeStateResult,
        init_resp.PartitionResult)


@api(84, 0, 0)
async def handle_read_share_group_state(
        ctx: RequestContext, request: read_req.ReadShareGroupStateRequest,
) -> read_resp.ReadShareGroupStateResponse:
    return await _route(
        ctx, request, ShareCoordinatorShard.handle_read_share_group_state,
        read_resp.ReadShareGroupStateResponse, read_resp.ReadStateResult,
        read_resp.PartitionResult, _read_bumps_leader_epoch)


@api(85, 1, 1)
async def handle_write_share_group_state(
        ctx: RequestContext, request: write_req.WriteShareGroupStateRequest,
) -> write_resp.WriteShareGroupStateResponse:
    return await _route(
        ctx, request, ShareCoordinatorShard.handle_write_share_group_state,
        write_resp.WriteShareGroupStateResponse, write_resp.WriteStateResult,
        write_resp.PartitionResult)


@api(86, 0, 0)
async def handle_delete_share_group_state(
        ctx: RequestContext, request: delete_req.DeleteShareGroupStateRequest,
) -> delete_resp.DeleteShareGroupStateResponse:
    return await _route(
        ctx, request, ShareCoordinatorShard.handle_delete_share_group_state,
        delete_resp.DeleteShareGroupStateResponse, delete_resp.DeleteStateResult,
        delete_resp.PartitionResult)


@api(87, 1, 1)
async def handle_read_share_group_state_summary(
        ctx: RequestContext, request: summary_req.ReadShareGroupStateSummaryRequest,
) -> summary_resp.ReadShareGroupStateSummaryResponse:
    return await _route(
        ctx, request, ShareCoordinatorShard.handle_read_share_group_state_summary,
        summary_resp.ReadShareGroupStateSummaryResponse, summary_resp.ReadStateSummaryResult,
        summary_resp.PartitionResult, None)
