"""ListOffsets (key 2), v1-v10: earliest, latest, max-timestamp, or the first offset at a time.

The latest offset is the high watermark, or for isolation level read_committed (v2+) the
last stable offset.
"""

from __future__ import annotations

from ...errors import ApiError, ErrorCode
from ...log.partition_log import PartitionLog
from ...protocol.messages.list_offsets_request import ListOffsetsRequest, ListOffsetsTopic
from ...protocol.messages.list_offsets_response import (
    ListOffsetsPartitionResponse,
    ListOffsetsResponse,
    ListOffsetsTopicResponse,
)
from ...security.authz import DESCRIBE, per_topic
from ..context import RequestContext
from ..dispatch import api

LATEST = -1
EARLIEST = -2
MAX_TIMESTAMP = -3
EARLIEST_LOCAL = -4
LATEST_TIERED = -5


def lookup(plog: PartitionLog, timestamp: int, committed: bool = False) -> tuple[int, int]:
    """(offset, timestamp) for a ListOffsets timestamp spec; (-1, -1) when there is none.
    ``committed`` (isolation level read_committed): the latest offset is the last stable offset."""
    if timestamp == LATEST:
        return (plog.last_stable_offset if committed else plog.high_watermark), -1
    if timestamp in (EARLIEST, EARLIEST_LOCAL):
        return plog.log_start_offset, -1
    if timestamp == LATEST_TIERED:
        return -1, -1
    if timestamp == MAX_TIMESTAMP:
        found = plog.max_timestamp()
        return found if found is not None else (-1, -1)
    found = plog.offset_for_timestamp(timestamp)
    return found if found is not None else (-1, -1)


def _failed(index: int, code: ErrorCode) -> ListOffsetsPartitionResponse:
    return ListOffsetsPartitionResponse(partition_index=index, error_code=code, timestamp=-1, offset=-1,
                                        leader_epoch=-1)


def _refused(t: ListOffsetsTopic) -> ListOffsetsTopicResponse:
    return ListOffsetsTopicResponse(name=t.name, partitions=tuple(
        _failed(p.partition_index, ErrorCode.topic_authorization_failed) for p in t.partitions))


@api(2, 1, 10)
def handle_list_offsets(ctx: RequestContext, request: ListOffsetsRequest) -> ListOffsetsResponse:
    response: ListOffsetsResponse = per_topic(ctx, request, _list_offsets, DESCRIBE, "topics", "topics", _refused)
    return response


def _list_offsets(ctx: RequestContext, request: ListOffsetsRequest) -> ListOffsetsResponse:
    store = ctx.broker.fetch_service.store()
    replicas = ctx.broker.replicas
    committed = request.isolation_level == 1  # 0 (read_uncommitted) before v2
    topics = []
    for t in request.topics:
        meta = store.get_topic(t.name)
        parts = []
        for p in t.partitions:
            if meta is None or not 0 <= p.partition_index < meta.num_partitions:
                parts.append(_failed(p.partition_index, ErrorCode.unknown_topic_or_partition))
                continue
            epoch = 0
            if replicas is not None:  # cluster mode: only the leader answers
                try:
                    epoch = replicas.leader_replica(t.name, p.partition_index).leader_epoch
                except ApiError as e:
                    parts.append(_failed(p.partition_index, e.error_code))
                    continue
            offset, ts = lookup(store.partition(t.name, p.partition_index), p.timestamp, committed)
            parts.append(ListOffsetsPartitionResponse(partition_index=p.partition_index, error_code=ErrorCode.none,
                                                      timestamp=ts, offset=offset,
                                                      leader_epoch=epoch if offset >= 0 else -1))
        topics.append(ListOffsetsTopicResponse(name=t.name, partitions=tuple(parts)))
    return ListOffsetsResponse(topics=tuple(topics))
