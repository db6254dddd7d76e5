"""ListOffsets (key 2), v1-v10: earliest, latest, max-timestamp, or the first offset at a time.

The latest offset is the high watermark, or for isolation level read_committed (v2+) the
last stable offset.
"""

from __future__ import annotations

from typing import Any

from ...errors import ApiError, ErrorCode
from ...protocol.entities import make, sub
from ...security.authz import DESCRIBE, per_topic
from ..dispatch import api

LATEST = -1
EARLIEST = -2
MAX_TIMESTAMP = -3
EARLIEST_LOCAL = -4
LATEST_TIERED = -5


def lookup(plog: Any, timestamp: int, committed: bool = False) -> tuple[int, int]:
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


@api(2, 1, 10)
def handle_list_offsets(ctx: Any, request: Any) -> Any:
    tcls = sub(ctx.response_type, "ListOffsetsTopicResponse")
    pcls = sub(ctx.response_type, "ListOffsetsPartitionResponse")
    return per_topic(ctx, request, _list_offsets, DESCRIBE, "topics", "topics", lambda t: make(
        tcls, name=t.name, partitions=tuple(make(pcls, partition_index=p.partition_index, timestamp=-1, offset=-1,
                                                 leader_epoch=-1, error_code=ErrorCode.topic_authorization_failed)
                                            for p in t.partitions)))


def _list_offsets(ctx: Any, request: Any) -> Any:
    store = ctx.broker.store
    replicas = ctx.broker.replicas
    cls = ctx.response_type
    tcls = sub(cls, "ListOffsetsTopicResponse")
    pcls = sub(cls, "ListOffsetsPartitionResponse")
    topics = []
    for t in request.topics:
        meta = store.get_topic(t.name)
        parts = []
        for p in t.partitions:
            if meta is None or not 0 <= p.partition_index < meta.num_partitions:
                parts.append(make(pcls, partition_index=p.partition_index,
                                  error_code=ErrorCode.unknown_topic_or_partition, timestamp=-1, offset=-1,
                                  leader_epoch=-1))
                continue
            epoch = 0
            if replicas is not None:  # cluster mode: only the leader answers
                try:
                    epoch = replicas.leader_replica(t.name, p.partition_index).leader_epoch
                except ApiError as e:
                    parts.append(make(pcls, partition_index=p.partition_index, error_code=e.error_code,
                                      timestamp=-1, offset=-1, leader_epoch=-1))
                    continue
            offset, ts = lookup(store.partition(t.name, p.partition_index), p.timestamp,
                                getattr(request, "isolation_level", 0) == 1)
            parts.append(make(pcls, partition_index=p.partition_index, error_code=ErrorCode.none,
                              timestamp=ts, offset=offset, leader_epoch=epoch if offset >= 0 else -1))
        topics.append(make(tcls, name=t.name, partitions=tuple(parts)))
    return make(cls, throttle_time=0, topics=tuple(topics))
