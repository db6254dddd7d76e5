"""The share-state RPCs of KIP-932 on the wire, through the share coordinator runtime.

InitializeShareGroupState (83) v0, ReadShareGroupState (84) v0, WriteShareGroupState
(85) v1, DeleteShareGroupState (86) v0, ReadShareGroupStateSummary (87) v1. Each
partition of a request is routed to its ``__share_group_state`` partition
(``partition_for``) and answered by the shard's wire handler there; the records are
appended, fsynced and replayed before the response goes out.

These are the persister's RPCs in a multi-broker Kafka. Here the share-partition
leader calls the shards in-process; a write sent over the wire to a share-partition
this broker also leads in memory is not merged into that in-memory state.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ...share.coordinator import SharePartitionKey, partition_for
from ..dispatch import api
from ..share_service import share_service


def _route(ctx: Any, request: Any, method: str) -> Any:
    svc = share_service(ctx.broker)
    runtime = svc.runtime
    answers: list[tuple[Any, list[Any]]] = []
    response = None
    for topic in request.topics:
        parts = []
        for p in topic.partitions:
            one = dataclasses.replace(request, topics=(dataclasses.replace(topic, partitions=(p,)),))
            shard_index = partition_for(SharePartitionKey.of(request.group_id, topic.topic_id, p.partition),
                                        runtime.num_partitions)
            result = runtime.run(shard_index, lambda shard, one=one: getattr(shard, method)(one))
            response = result.response
            parts.append(response.results[0].partitions[0])
        answers.append((topic.topic_id, parts))
    if response is None:
        response = getattr(runtime.shards[0], method)(dataclasses.replace(request, topics=())).response
        return response
    result_cls = type(response.results[0])
    return dataclasses.replace(response, results=tuple(
        result_cls(topic_id=tid, partitions=tuple(parts)) for tid, parts in answers))


@api(83, 0, 0)
def handle_initialize_share_group_state(ctx: Any, request: Any) -> Any:
    return _route(ctx, request, "handle_initialize_share_group_state")


@api(84, 0, 0)
def handle_read_share_group_state(ctx: Any, request: Any) -> Any:
    return _route(ctx, request, "handle_read_share_group_state")


@api(85, 1, 1)
def handle_write_share_group_state(ctx: Any, request: Any) -> Any:
    return _route(ctx, request, "handle_write_share_group_state")


@api(86, 0, 0)
def handle_delete_share_group_state(ctx: Any, request: Any) -> Any:
    return _route(ctx, request, "handle_delete_share_group_state")


@api(87, 1, 1)
def handle_read_share_group_state_summary(ctx: Any, request: Any) -> Any:
    return _route(ctx, request, "handle_read_share_group_state_summary")
