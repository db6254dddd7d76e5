"""Share-group offsets admin: DescribeShareGroupOffsets (90) v0-v1, AlterShareGroupOffsets
(91) v0, DeleteShareGroupOffsets (92) v0 (KIP-932 admin API).

The start offset of a share-partition is its persisted SPSO. Lag follows Kafka
(KIP-1226): high watermark - SPSO - records at or above the SPSO already in a terminal
state (acknowledged or archived), never below 0; -1 when the partition has no
initialized state. In cluster mode the high watermark is the leader's (ListOffsets to
it when another broker leads the partition). A group id that is no share group is GROUP_ID_NOT_FOUND, except for
AlterShareGroupOffsets, which creates an unknown group, empty, with the offsets given
(KIP-932: ``--reset-offsets`` before the first consumer). Alter and delete need an empty
group, one without members (NON_EMPTY_GROUP otherwise); share sessions still open by
members that left the group do not count: they are closed and their records released.
Alter starts a new state epoch at the given offset (InitializeShareGroupState), dropping
the in-flight state; an offset outside [log start offset, high watermark] is refused
with OFFSET_OUT_OF_RANGE for that partition. Delete removes the share-partitions' state
(DeleteShareGroupState).
"""

from __future__ import annotations

import asyncio
import logging
import uuid

from kio.schema.list_offsets.v7.request import ListOffsetsPartition, ListOffsetsRequest, ListOffsetsTopic
from kio.schema.types import BrokerId, TopicName
from kio.static.primitive import i8, i32, i64

from ...cluster.peer import PeerConnection
from ...errors import ErrorCode
from ...groups.share_group import GROUP_TYPE as SHARE_GROUP_TYPE
from ...protocol.messages import alter_share_group_offsets_response as alter_resp
from ...protocol.messages import delete_share_group_offsets_response as delete_resp
from ...protocol.messages import describe_share_group_offsets_response as describe_resp
from ...protocol.messages.alter_share_group_offsets_request import AlterShareGroupOffsetsRequest
from ...protocol.messages.delete_share_group_offsets_request import DeleteShareGroupOffsetsRequest
from ...protocol.messages.describe_share_group_offsets_request import DescribeShareGroupOffsetsRequest
from ...security.authz import DELETE, DESCRIBE, GROUP, READ, allowed, topic_allowed
from ...share.coordinator import UNINITIALIZED_START_OFFSET, SharePartitionKey
from ..context import RequestContext
from ..dispatch import api
from ..group_service import GroupCoordinatorService
from ..share_service import ShareService, share_service
from .share_groups import share_groups_limit_message

log = logging.getLogger("shoal.share")

LIST_OFFSETS, LIST_OFFSETS_VERSION = 2, 7


def _groups(ctx: RequestContext) -> GroupCoordinatorService | None:
    """The group coordinator (None when the broker runs without one, as some tests do)."""
    groups: GroupCoordinatorService | None = ctx.broker.extensions.get("groups")
    return groups


def _group_error(ctx: RequestContext, group_id: str, *, create: bool = False) -> ErrorCode | None:
    """GROUP_ID_NOT_FOUND for a group of another kind, or (unless ``create``) none at all."""
    groups = _groups(ctx)
    if groups is None:
        return None
    gtype = groups.group_type(group_id)
    if gtype is None:
        return None if create else ErrorCode.group_id_not_found
    if gtype != SHARE_GROUP_TYPE:
        return ErrorCode.group_id_not_found
    return None


def _group_is_empty(ctx: RequestContext, svc: ShareService, group_id: str) -> bool:
    """Whether the group has no members; if so, sessions its former members left open are
    closed (their records released): they no longer belong to the group."""
    groups = _groups(ctx)
    if groups is not None:
        g = groups.share_groups(groups.partition_for(group_id)).group(group_id)
        if g is not None and g.members:
            return False
    elif svc.group_has_sessions(group_id):
        return False
    svc.close_group_sessions(group_id)
    return True


async def high_watermarks(ctx: RequestContext, wanted: set[tuple[str, int]]) -> dict[tuple[str, int], int]:
    """The high watermark of each partition, from its leader.

    One broker: the local logs. Cluster mode: this broker's log where it leads the
    partition, else one ListOffsets (latest) per leader broker, as Kafka's group coordinator
    asks the leaders; a leader that cannot be asked leaves the local replica's value.
    """
    b = ctx.broker
    store = b.store
    assert store is not None  # requests are served once the logs are open
    local = {(t, p): store.partition(t, p).high_watermark for t, p in wanted}
    if b.replicas is None:
        return local
    by_leader: dict[int, list[tuple[str, int]]] = {}
    for t, p in wanted:
        view = b.cluster.partition(t, p)
        if view is not None and view.leader >= 0 and view.leader != b.node_id:
            by_leader.setdefault(view.leader, []).append((t, p))
    out = dict(local)
    for leader, parts in by_leader.items():
        endpoint = next((e for e in b.cluster.brokers() if e.node_id == leader), None)
        if endpoint is None:
            continue
        conn = PeerConnection(endpoint.host, endpoint.port, f"shoal-group-coordinator-{b.node_id}",
                              b.peer_security)
        try:
            topics: dict[str, list[ListOffsetsPartition]] = {}
            for t, p in parts:
                topics.setdefault(t, []).append(ListOffsetsPartition(
                    partition_index=i32(p), current_leader_epoch=i32(-1), timestamp=i64(-1)))
            request = ListOffsetsRequest(replica_id=BrokerId(-1), isolation_level=i8(0), topics=tuple(
                ListOffsetsTopic(name=TopicName(t), partitions=tuple(ps)) for t, ps in topics.items()))
            response = await asyncio.wait_for(conn.call(LIST_OFFSETS, LIST_OFFSETS_VERSION, request), 10)
            for t in response.topics:
                for p in t.partitions:
                    if p.error_code == ErrorCode.none and (t.name, int(p.partition_index)) in out:
                        out[(t.name, int(p.partition_index))] = int(p.offset)
        except Exception as e:  # the leader is unreachable: the local replica's high watermark
            log.info("ListOffsets to broker %d for share-group lag failed: %s", leader, e)
        finally:
            conn.close()
    return out


async def lag_of(ctx: RequestContext, svc: ShareService, key: SharePartitionKey, topic_name: str,
                 hw: int | None = None) -> tuple[int, int, ErrorCode]:
    """(start_offset, lag, error) of one share-partition (``hw``: its high watermark, if known)."""
    o = await svc.persister.read_state_summary(key)
    if not o.ok or o.state is None:
        return UNINITIALIZED_START_OFFSET, -1, ErrorCode.none
    st = o.state
    if st.start_offset == UNINITIALIZED_START_OFFSET:
        return UNINITIALIZED_START_OFFSET, -1, ErrorCode.none
    if hw is None:
        store = ctx.broker.store
        assert store is not None  # requests are served once the logs are open
        hw = store.partition(topic_name, key.partition).high_watermark
    if o.delivery_complete_count >= 0:  # read over the network: the coordinator counted
        done = o.delivery_complete_count
    else:
        done = sum(b.last_offset - b.first_offset + 1 for b in st.state_batches
                   if b.delivery_state in (2, 4) and b.first_offset >= st.start_offset)
    return st.start_offset, max(0, hw - st.start_offset - done), ErrorCode.none


@api(90, 0, 1)
async def handle_describe_share_group_offsets(
        ctx: RequestContext, request: DescribeShareGroupOffsetsRequest,
) -> describe_resp.DescribeShareGroupOffsetsResponse:
    svc = share_service(ctx.broker)
    store = ctx.broker.store
    assert store is not None  # requests are served once the logs are open
    gcls = describe_resp.DescribeShareGroupOffsetsResponseGroup
    tcls = describe_resp.DescribeShareGroupOffsetsResponseTopic
    pcls = describe_resp.DescribeShareGroupOffsetsResponsePartition
    groups = []
    for g in request.groups:
        err = _group_error(ctx, g.group_id) if allowed(ctx, DESCRIBE, GROUP, g.group_id) \
            else ErrorCode.group_authorization_failed
        if err is not None:
            groups.append(gcls(group_id=g.group_id, error_code=err))
            continue
        wanted: dict[str, list[int]] = {}
        if g.topics is None:
            for key in svc.state_keys(g.group_id):
                meta = store.topic_by_id(uuid.UUID(key.topic_id))
                if meta is not None and topic_allowed(ctx, DESCRIBE, meta.name, log_denied=False):
                    wanted.setdefault(meta.name, []).append(key.partition)
        else:
            for t in g.topics:
                wanted.setdefault(t.topic_name, []).extend(t.partitions)
        topics = []
        hws = await high_watermarks(ctx, {(name, p) for name, parts in wanted.items()
                                          if (meta := store.get_topic(name)) is not None
                                          for p in set(parts) if 0 <= p < meta.num_partitions})
        for name, parts in wanted.items():
            meta = store.get_topic(name)
            plist = []
            for p in sorted(set(parts)):
                if g.topics is not None and not topic_allowed(ctx, DESCRIBE, name):
                    plist.append(pcls(partition_index=p, start_offset=-1, leader_epoch=-1, lag=-1,
                                      error_code=ErrorCode.topic_authorization_failed))
                    continue
                if meta is None or not 0 <= p < meta.num_partitions:
                    plist.append(pcls(partition_index=p, start_offset=-1, leader_epoch=-1, lag=-1,
                                      error_code=ErrorCode.unknown_topic_or_partition))
                    continue
                start, lag, code = await lag_of(ctx, svc, SharePartitionKey.of(g.group_id, meta.topic_id, p), name,
                                                hws.get((name, p)))
                plist.append(pcls(partition_index=p, start_offset=start, leader_epoch=0, lag=lag, error_code=code))
            topics.append(tcls(topic_name=name, topic_id=meta.topic_id if meta is not None else None,
                               partitions=tuple(plist)))
        groups.append(gcls(group_id=g.group_id, topics=tuple(topics)))
    return describe_resp.DescribeShareGroupOffsetsResponse(groups=tuple(groups))


@api(91, 0, 0)
async def handle_alter_share_group_offsets(
        ctx: RequestContext, request: AlterShareGroupOffsetsRequest,
) -> alter_resp.AlterShareGroupOffsetsResponse:
    svc = share_service(ctx.broker)
    store = ctx.broker.store
    assert store is not None  # requests are served once the logs are open
    err = _group_error(ctx, request.group_id, create=True) if allowed(ctx, READ, GROUP, request.group_id) \
        else ErrorCode.group_authorization_failed
    message = None
    if err is None and not _group_is_empty(ctx, svc, request.group_id):
        err = ErrorCode.non_empty_group
    groups = _groups(ctx)
    if err is None and groups is not None and groups.group_type(request.group_id) is None:
        limit = ctx.broker.config["group.share.max.groups"]
        if groups.share_group_count() >= limit:
            err = ErrorCode.group_max_size_reached
            message = share_groups_limit_message(request.group_id, limit)
    if err is not None:
        return alter_resp.AlterShareGroupOffsetsResponse(error_code=err, error_message=message)
    topics = []
    altered: dict[uuid.UUID, list[int]] = {}
    names: dict[uuid.UUID, str] = {}
    for t in request.topics:
        meta = store.get_topic(t.topic_name)
        plist = []
        for p in t.partitions:
            idx = p.partition_index
            message = None
            if not topic_allowed(ctx, READ, t.topic_name):
                code = ErrorCode.topic_authorization_failed
            elif meta is None or not 0 <= idx < meta.num_partitions:
                code = ErrorCode.unknown_topic_or_partition
            else:
                plog = store.partition(meta.name, idx)
                offset = p.start_offset
                if not plog.log_start_offset <= offset <= plog.high_watermark:
                    code = ErrorCode.offset_out_of_range
                    message = (f"offset {offset} is outside {meta.name}-{idx}'s range "
                               f"[{plog.log_start_offset}, {plog.high_watermark}]")
                else:
                    code = (await svc.reset_start_offset(request.group_id, meta.topic_id, idx, offset)).error_code
                    if code == ErrorCode.none:
                        altered.setdefault(meta.topic_id, []).append(idx)
                        names[meta.topic_id] = meta.name
            plist.append(alter_resp.AlterShareGroupOffsetsResponsePartition(partition_index=idx, error_code=code,
                                                                            error_message=message))
        topics.append(alter_resp.AlterShareGroupOffsetsResponseTopic(
            topic_name=t.topic_name, topic_id=meta.topic_id if meta is not None else None, partitions=tuple(plist)))
    response = alter_resp.AlterShareGroupOffsetsResponse(responses=tuple(topics))
    if groups is not None:
        gp = groups.partition_for(request.group_id)
        result = groups.apply(gp, groups.share_groups(gp).handle_alter_offsets(request.group_id, altered, names))
        if result.response is not None and result.response != ErrorCode.none:
            response = alter_resp.AlterShareGroupOffsetsResponse(error_code=result.response)
        await groups.wait_replicated(gp, wrote=bool(result.records))
    return response


@api(92, 0, 0)
async def handle_delete_share_group_offsets(
        ctx: RequestContext, request: DeleteShareGroupOffsetsRequest,
) -> delete_resp.DeleteShareGroupOffsetsResponse:
    svc = share_service(ctx.broker)
    store = ctx.broker.store
    assert store is not None  # requests are served once the logs are open
    tcls = delete_resp.DeleteShareGroupOffsetsResponseTopic
    err = _group_error(ctx, request.group_id) if allowed(ctx, DELETE, GROUP, request.group_id) \
        else ErrorCode.group_authorization_failed
    if err is None and not _group_is_empty(ctx, svc, request.group_id):
        err = ErrorCode.non_empty_group
    if err is not None:
        return delete_resp.DeleteShareGroupOffsetsResponse(error_code=err)
    keys = svc.state_keys(request.group_id)
    topics = []
    deleted: dict[uuid.UUID, list[int]] = {}
    for t in request.topics:
        meta = store.get_topic(t.topic_name)
        if not topic_allowed(ctx, READ, t.topic_name):
            topics.append(tcls(topic_name=t.topic_name, error_code=ErrorCode.topic_authorization_failed))
            continue
        if meta is None:
            topics.append(tcls(topic_name=t.topic_name, error_code=ErrorCode.unknown_topic_or_partition))
            continue
        parts = [k.partition for k in keys if k.topic_id == str(meta.topic_id)]
        code = ErrorCode.none
        for p in parts:
            o = await svc.delete_partition_state(request.group_id, meta.topic_id, p)
            if not o.ok:
                code = o.error_code
            else:
                deleted.setdefault(meta.topic_id, []).append(p)
        topics.append(tcls(topic_name=t.topic_name, topic_id=meta.topic_id, error_code=code))
    groups = _groups(ctx)
    response = delete_resp.DeleteShareGroupOffsetsResponse(responses=tuple(topics))
    if groups is not None and deleted:
        gp = groups.partition_for(request.group_id)
        result = groups.apply(gp, groups.share_groups(gp).handle_delete_offsets(request.group_id, deleted))
        await groups.wait_replicated(gp, wrote=bool(result.records))
    return response
