"""Share-group offsets admin: DescribeShareGroupOffsets (90) v0-v1, AlterShareGroupOffsets
(91) v0, DeleteShareGroupOffsets (92) v0 (KIP-932 admin API).

The start offset of a share-partition is its persisted SPSO. Lag follows Kafka
(KIP-1226): high watermark - SPSO - records at or above the SPSO already in a terminal
state (acknowledged or archived), never below 0; -1 when the partition has no
initialized state. Alter and delete need an EMPTY share group (no members, no share
sessions): NON_EMPTY_GROUP otherwise. Alter starts a new state epoch at the given
offset (InitializeShareGroupState), dropping the in-flight state; delete removes the
share-partitions' state (DeleteShareGroupState).
"""

from __future__ import annotations

import uuid
from typing import Any

from ...errors import ErrorCode
from ...protocol.entities import make, sub
from ...share.coordinator import UNINITIALIZED_START_OFFSET, SharePartitionKey
from ..dispatch import api
from ..share_service import ShareService, share_service


def _group_error(ctx: Any, group_id: str) -> ErrorCode | None:
    groups = ctx.broker.extensions.get("groups")
    if groups is None:
        return None
    gtype = groups.group_type(group_id)
    if gtype is None:
        return None
    if str(getattr(gtype, "value", gtype)).lower() not in ("share", "2"):
        return ErrorCode.group_id_not_found
    return None


def _group_is_empty(ctx: Any, svc: ShareService, group_id: str) -> bool:
    if svc.group_has_sessions(group_id):
        return False
    groups = ctx.broker.extensions.get("groups")
    if groups is None:
        return True
    g = groups.share_groups(groups.partition_for(group_id)).group(group_id)
    return g is None or not g.members


def lag_of(ctx: Any, svc: ShareService, key: SharePartitionKey, topic_name: str) -> tuple[int, int, ErrorCode]:
    """(start_offset, lag, error) of one share-partition."""
    o = svc.persister.read_summary(key)
    if not o.ok or o.state is None:
        return UNINITIALIZED_START_OFFSET, -1, ErrorCode.none
    st = o.state
    if st.start_offset == UNINITIALIZED_START_OFFSET:
        return UNINITIALIZED_START_OFFSET, -1, ErrorCode.none
    hw = ctx.broker.store.partition(topic_name, key.partition).high_watermark
    done = sum(b.last_offset - b.first_offset + 1 for b in st.state_batches
               if b.delivery_state in (2, 4) and b.first_offset >= st.start_offset)
    return st.start_offset, max(0, hw - st.start_offset - done), ErrorCode.none


@api(90, 0, 1)
def handle_describe_share_group_offsets(ctx: Any, request: Any) -> Any:
    cls = ctx.response_type
    svc = share_service(ctx.broker)
    store = ctx.broker.store
    gcls = sub(cls, "DescribeShareGroupOffsetsResponseGroup")
    tcls = sub(cls, "DescribeShareGroupOffsetsResponseTopic")
    pcls = sub(cls, "DescribeShareGroupOffsetsResponsePartition")
    groups = []
    for g in request.groups:
        err = _group_error(ctx, g.group_id)
        if err is not None:
            groups.append(make(gcls, group_id=g.group_id, topics=(), error_code=err, error_message=None))
            continue
        wanted: dict[str, list[int]] = {}
        if g.topics is None:
            for key in svc.state_keys(g.group_id):
                meta = store.topic_by_id(uuid.UUID(key.topic_id))
                if meta is not None:
                    wanted.setdefault(meta.name, []).append(key.partition)
        else:
            for t in g.topics:
                wanted.setdefault(t.topic_name, []).extend(int(p) for p in t.partitions)
        topics = []
        for name, parts in wanted.items():
            meta = store.get_topic(name)
            plist = []
            for p in sorted(set(parts)):
                if meta is None or not 0 <= p < meta.num_partitions:
                    plist.append(make(pcls, partition_index=p, start_offset=-1, leader_epoch=-1, lag=-1,
                                      error_code=ErrorCode.unknown_topic_or_partition, error_message=None))
                    continue
                start, lag, code = lag_of(ctx, svc, SharePartitionKey.of(g.group_id, meta.topic_id, p), name)
                plist.append(make(pcls, partition_index=p, start_offset=start, leader_epoch=0, lag=lag,
                                  error_code=code, error_message=None))
            topics.append(make(tcls, topic_name=name, topic_id=meta.topic_id if meta is not None else None,
                               partitions=tuple(plist)))
        groups.append(make(gcls, group_id=g.group_id, topics=tuple(topics), error_code=ErrorCode.none,
                           error_message=None))
    return make(cls, throttle_time=0, groups=tuple(groups))


@api(91, 0, 0)
def handle_alter_share_group_offsets(ctx: Any, request: Any) -> Any:
    cls = ctx.response_type
    svc = share_service(ctx.broker)
    store = ctx.broker.store
    tcls = sub(cls, "AlterShareGroupOffsetsResponseTopic")
    pcls = sub(cls, "AlterShareGroupOffsetsResponsePartition")
    err = _group_error(ctx, request.group_id)
    if err is None and not _group_is_empty(ctx, svc, request.group_id):
        err = ErrorCode.non_empty_group
    if err is not None:
        return make(cls, throttle_time=0, error_code=err, error_message=None, responses=())
    topics = []
    for t in request.topics:
        meta = store.get_topic(t.topic_name)
        plist = []
        for p in t.partitions:
            idx = int(p.partition_index)
            if meta is None or not 0 <= idx < meta.num_partitions:
                code = ErrorCode.unknown_topic_or_partition
            else:
                plog = store.partition(meta.name, idx)
                offset = int(p.start_offset)
                if offset < plog.log_start_offset or offset > plog.high_watermark:
                    offset = max(plog.log_start_offset, min(offset, plog.high_watermark))
                code = svc.reset_start_offset(request.group_id, meta.topic_id, idx, offset).error_code
            plist.append(make(pcls, partition_index=idx, error_code=code, error_message=None))
        topics.append(make(tcls, topic_name=t.topic_name, topic_id=meta.topic_id if meta is not None else None,
                           partitions=tuple(plist)))
    return make(cls, throttle_time=0, error_code=ErrorCode.none, error_message=None, responses=tuple(topics))


@api(92, 0, 0)
def handle_delete_share_group_offsets(ctx: Any, request: Any) -> Any:
    cls = ctx.response_type
    svc = share_service(ctx.broker)
    store = ctx.broker.store
    tcls = sub(cls, "DeleteShareGroupOffsetsResponseTopic")
    err = _group_error(ctx, request.group_id)
    if err is None and not _group_is_empty(ctx, svc, request.group_id):
        err = ErrorCode.non_empty_group
    if err is not None:
        return make(cls, throttle_time=0, error_code=err, error_message=None, responses=())
    keys = svc.state_keys(request.group_id)
    topics = []
    for t in request.topics:
        meta = store.get_topic(t.topic_name)
        if meta is None:
            topics.append(make(tcls, topic_name=t.topic_name, topic_id=None,
                               error_code=ErrorCode.unknown_topic_or_partition, error_message=None))
            continue
        parts = [k.partition for k in keys if k.topic_id == str(meta.topic_id)]
        code = ErrorCode.none
        for p in parts:
            o = svc.delete_partition_state(request.group_id, meta.topic_id, p)
            if not o.ok:
                code = o.error_code
        topics.append(make(tcls, topic_name=t.topic_name, topic_id=meta.topic_id, error_code=code,
                           error_message=None))
    return make(cls, throttle_time=0, error_code=ErrorCode.none, error_message=None, responses=tuple(topics))
