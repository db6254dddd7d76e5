"""Committed offsets: OffsetCommit (8), OffsetFetch (9), OffsetDelete (47).

OffsetFetch v8+ (KIP-709) carries many groups, which may live on different
``__consumer_offsets`` partitions: the request is split per shard and the answers are
put back in request order.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from kio.schema.offset_delete.v0.request import OffsetDeleteRequest

from ...errors import ApiError, ErrorCode
from ...protocol.messages.offset_commit_request import OffsetCommitRequest
from ...protocol.messages.offset_commit_response import (
    OffsetCommitResponse,
    OffsetCommitResponsePartition,
    OffsetCommitResponseTopic,
)
from ...protocol.messages.offset_delete_response import (
    OffsetDeleteResponse,
    OffsetDeleteResponsePartition,
    OffsetDeleteResponseTopic,
)
from ...protocol.messages.offset_fetch_request import OffsetFetchRequest, OffsetFetchRequestGroup
from ...protocol.messages.offset_fetch_response import OffsetFetchResponse
from ...security.authz import (
    DELETE,
    DESCRIBE,
    GROUP,
    READ,
    TOPIC,
    allowed,
    group_refusal,
    topic_allowed,
)
from ..context import RequestContext
from ..dispatch import api
from ..group_service import group_service

Key = tuple[str, int]
GroupAnswer = Any
"""An answer the group coordinator built: the kio response entity (or one of its groups) of
the request's version (``groups/manager.py``), sent as it is or with parts replaced."""


@api(8, 2, 9)
async def handle_offset_commit(ctx: RequestContext,
                               request: OffsetCommitRequest) -> OffsetCommitResponse | GroupAnswer:
    """Answered once the commit is durable; commits from many consumers share an fsync.

    OffsetCommitResponse has no top-level error code: when the commit cannot be written
    (COORDINATOR_NOT_AVAILABLE: a full disk, a failed partition) every partition of the
    request carries the error, as Kafka answers.
    """
    if ctx.broker.authorizer is not None and not allowed(ctx, READ, GROUP, request.group_id):
        return _offset_commit_error(request, ErrorCode.group_authorization_failed)
    svc = group_service(ctx.broker)
    unknown = _unknown_partitions(ctx, request)
    if not unknown:
        known = request
    else:
        # the group coordinator takes the request's own entity (the kio class of its version;
        # the view Protocol does not say it is a dataclass), without the unknown partitions
        known = dataclasses.replace(request, topics=tuple(  # type: ignore[type-var]
            dataclasses.replace(t, partitions=kept) for t in request.topics  # type: ignore[type-var]
            if (kept := tuple(x for x in t.partitions if (t.name, x.partition_index) not in unknown))))
        if not known.topics:
            return _with_unknown(request, (), unknown)
    try:
        p = svc.partition_for(request.group_id)
        result = await svc.apply_durable(p, svc.shard(p).handle_offset_commit(known, ctx.now_ms()))
    except ApiError as e:
        return _offset_commit_error(request, e.error_code)
    if not unknown:
        return result.response
    return _with_unknown(request, result.answer().topics, unknown)


def _unknown_partitions(ctx: RequestContext, request: OffsetCommitRequest) -> dict[Key, ErrorCode]:
    """The partitions of an OffsetCommit that no topic has: Kafka answers them
    UNKNOWN_TOPIC_OR_PARTITION and commits the others; those of topics the request may
    not READ, TOPIC_AUTHORIZATION_FAILED."""
    out: dict[Key, ErrorCode] = {}
    store = ctx.broker.store
    assert store is not None
    for t in request.topics:
        if not topic_allowed(ctx, READ, t.name):
            out.update(((t.name, x.partition_index), ErrorCode.topic_authorization_failed) for x in t.partitions)
            continue
        meta = store.get_topic(t.name)
        for x in t.partitions:
            if meta is None or not 0 <= x.partition_index < meta.num_partitions:
                out[(t.name, x.partition_index)] = ErrorCode.unknown_topic_or_partition
    return out


def _with_unknown(request: OffsetCommitRequest, answered_topics: GroupAnswer,
                  unknown: dict[Key, ErrorCode]) -> OffsetCommitResponse:
    """The coordinator's answer for the known partitions (its entities pass through as
    they are), with the unknown ones added, in request order."""
    answered = {(t.name, x.partition_index): x for t in answered_topics for x in t.partitions}
    return OffsetCommitResponse(topics=tuple(
        OffsetCommitResponseTopic(name=t.name, partitions=tuple(
            OffsetCommitResponsePartition(partition_index=x.partition_index,
                                          error_code=unknown[(t.name, x.partition_index)])
            if (t.name, x.partition_index) in unknown else answered[(t.name, x.partition_index)]
            for x in t.partitions))
        for t in request.topics))


def _offset_commit_error(request: OffsetCommitRequest, code: ErrorCode) -> OffsetCommitResponse:
    return OffsetCommitResponse(topics=tuple(
        OffsetCommitResponseTopic(name=t.name, partitions=tuple(
            OffsetCommitResponsePartition(partition_index=p.partition_index, error_code=code) for p in t.partitions))
        for t in request.topics))


@api(9, 1, 9)
async def handle_offset_fetch(ctx: RequestContext, request: OffsetFetchRequest) -> OffsetFetchResponse | GroupAnswer:
    """Answered once every offset it reports is durable (a commit's fsync may be running)."""
    svc = group_service(ctx.broker)
    now = ctx.now_ms()
    if ctx.api_version < 8:
        if (denied := group_refusal(ctx, DESCRIBE, request.group_id)) is not None:
            return denied
        p = svc.partition_for(request.group_id)
        response = svc.shard(p).handle_offset_fetch(request, now).response
        await svc.runtime.wait_durable(p)
        return _describable_topics(ctx, response, request.topics is None)
    by_partition: dict[int, list[OffsetFetchRequestGroup]] = {}
    errors: dict[str, ApiError] = {}
    for g in request.groups:
        p = svc.runtime.partition_for_group(g.group_id)
        try:
            svc.runtime.check_owner(p)  # cluster mode: another broker may coordinate this group
        except ApiError as e:
            errors[g.group_id] = e
        by_partition.setdefault(p, []).append(g)
    answers: dict[str, GroupAnswer] = {}
    response = None
    for p, groups in by_partition.items():
        # the group coordinator takes the request's own entity (the kio class of its version)
        part = dataclasses.replace(request, groups=tuple(groups))  # type: ignore[type-var]
        response = svc.shard(p).handle_offset_fetch(part, now).answer()
        for g in response.groups:
            error = errors.get(g.group_id)
            answers[g.group_id] = g if error is None else dataclasses.replace(g, topics=(),
                                                                              error_code=error.error_code)
    if response is None:
        response = svc.shard(0).handle_offset_fetch(request, now).answer()
    for p, groups in by_partition.items():
        if all(g.group_id not in errors for g in groups):
            try:
                await svc.runtime.wait_durable(p)
            except ApiError as e:
                for g in groups:
                    answers[g.group_id] = dataclasses.replace(answers[g.group_id], topics=(),
                                                              error_code=e.error_code)
    if ctx.broker.authorizer is not None:
        for g in request.groups:
            a = answers[g.group_id]
            answers[g.group_id] = _describable_topics(ctx, a, g.topics is None) \
                if allowed(ctx, DESCRIBE, GROUP, g.group_id) else \
                dataclasses.replace(a, error_code=ErrorCode.group_authorization_failed, topics=())
    return dataclasses.replace(response, groups=tuple(answers[g.group_id] for g in request.groups))


def _describable_topics(ctx: RequestContext, answer: GroupAnswer, all_topics: bool) -> GroupAnswer:
    """An OffsetFetch answer (or one group's) without the topics the request may not DESCRIBE
    when it asked for all, with TOPIC_AUTHORIZATION_FAILED for them when it named them."""
    if ctx.broker.authorizer is None:
        return answer
    topics = []
    for t in answer.topics:
        if allowed(ctx, DESCRIBE, TOPIC, t.name, log_denied=not all_topics):
            topics.append(t)
        elif not all_topics:
            topics.append(dataclasses.replace(t, partitions=tuple(
                dataclasses.replace(x, committed_offset=-1, committed_leader_epoch=-1, metadata="",
                                    error_code=ErrorCode.topic_authorization_failed) for x in t.partitions)))
    return dataclasses.replace(answer, topics=tuple(topics))


@api(47, 0, 0)
def handle_offset_delete(ctx: RequestContext, request: OffsetDeleteRequest) -> GroupAnswer:
    if (denied := group_refusal(ctx, DELETE, request.group_id)) is not None:
        return denied
    svc = group_service(ctx.broker)
    p = svc.partition_for(request.group_id)
    denied_topics = [t for t in request.topics if not topic_allowed(ctx, READ, t.name)]
    if denied_topics:
        request = dataclasses.replace(request, topics=tuple(t for t in request.topics if t not in denied_topics))
    result = svc.apply(p, svc.shard(p).handle_offset_delete(request, ctx.now_ms()))
    if denied_topics:
        response = result.answer()
        # the coordinator's topics (entities of v0, the only version) pass through as they are
        result.response = OffsetDeleteResponse(error_code=response.error_code, topics=(*response.topics, *(
            OffsetDeleteResponseTopic(name=t.name, partitions=tuple(
                OffsetDeleteResponsePartition(partition_index=x.partition_index,
                                              error_code=ErrorCode.topic_authorization_failed)
                for x in t.partitions)) for t in denied_topics)))
    return svc.answer(p, result.response, wrote=bool(result.records))
