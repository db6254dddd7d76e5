"""Topic administration: CreateTopics (19), DeleteTopics (20), CreatePartitions (37), DeleteRecords (21)."""

from __future__ import annotations

import inspect
from typing import Any

from ...errors import ApiError, ErrorCode
from ...protocol.entities import ZERO_UUID, make, sub
from ...security.authz import (
    ALTER,
    CLUSTER,
    CLUSTER_RESOURCE,
    CREATE,
    DELETE,
    allowed,
    per_topic,
)
from ..dispatch import api
from .configs import CONFIG_SOURCE, topic_config_entries
from .metadata import INTERNAL_TOPICS

MAX_NEW_PARTITIONS_PER_REQUEST = 10_000
"""Kafka's controller refuses a user operation that would write more than 10,000 metadata
records (a record per partition) with POLICY_VIOLATION; so does this broker, instead of
creating millions of partitions one by one for a single request."""
_EXCESSIVE = "Unable to perform excessively large batch operation."


def _named_twice(topics: Any) -> list[str]:
    """Names that appear more than once in a CreateTopics request, in request order.

    As Kafka's controller does, none of their entries is created; the response has one
    INVALID_REQUEST result per such name, after the others."""
    seen: set[str] = set()
    twice: dict[str, None] = {}
    for t in topics:
        if t.name in seen:
            twice[t.name] = None
        seen.add(t.name)
    return list(twice)


def _duplicate_results(rcls: Any, names: list[str]) -> list[Any]:
    return [make(rcls, name=n, topic_id=ZERO_UUID, num_partitions=-1, replication_factor=-1, configs=(),
                 error_code=ErrorCode.invalid_request, error_message="Duplicate topic name.") for n in names]


def _new_partitions(t: Any, default: int) -> int:
    """How many partitions a CreateTopics entry asks for."""
    if t.assignments:
        return len(t.assignments)
    return default if t.num_partitions == -1 else max(t.num_partitions, 0)


@api(19, 2, 7)
def handle_create_topics(ctx: Any, request: Any) -> Any:
    if ctx.broker.authorizer is not None and allowed(ctx, CREATE, CLUSTER, CLUSTER_RESOURCE, log_denied=False):
        return _create_topics(ctx, request)
    rcls = sub(ctx.response_type, "CreatableTopicResult")
    return per_topic(ctx, request, _create_topics, CREATE, "topics", "topics", lambda t: make(
        rcls, name=t.name, topic_id=ZERO_UUID, num_partitions=-1, replication_factor=-1, configs=(),
        error_code=ErrorCode.topic_authorization_failed, error_message="Authorization failed."))


def _create_topics(ctx: Any, request: Any) -> Any:
    broker = ctx.broker
    cls = ctx.response_type
    rcls = sub(cls, "CreatableTopicResult")
    if sum(_new_partitions(t, broker.config["num.partitions"]) for t in request.topics) \
            > MAX_NEW_PARTITIONS_PER_REQUEST:
        return make(cls, throttle_time=0, topics=tuple(
            make(rcls, name=t.name, topic_id=ZERO_UUID, num_partitions=-1, replication_factor=-1, configs=(),
                 error_code=ErrorCode.policy_violation, error_message=_EXCESSIVE) for t in request.topics))
    if broker.cluster.clustered:
        return _create_topics_in_cluster(ctx, request)
    ccls = sub(cls, "CreatableTopicConfigs") if ctx.api_version >= 5 else None
    results = []
    twice = _named_twice(request.topics)
    for t in request.topics:
        if t.name in twice:
            continue
        r: dict[str, Any] = {"name": t.name, "topic_id": ZERO_UUID, "num_partitions": -1,
                             "replication_factor": -1, "configs": ()}
        try:
            if t.name in INTERNAL_TOPICS:
                raise ApiError(ErrorCode.invalid_request, f"{t.name} is an internal topic")
            partitions = t.num_partitions
            if partitions == -1 and not t.assignments:
                partitions = broker.config["num.partitions"]
            elif t.assignments:
                partitions = len(t.assignments)
            if partitions <= 0:
                raise ApiError(ErrorCode.invalid_partitions, "number of partitions must be larger than 0")
            if t.replication_factor not in (-1, 1) and not t.assignments:
                raise ApiError(ErrorCode.invalid_replication_factor,
                               f"replication factor {t.replication_factor} larger than available brokers: 1")
            configs = {c.name: c.value for c in t.configs}
            meta = broker.create_topic(t.name, partitions, configs, validate_only=request.validate_only)
            r.update(topic_id=meta.topic_id if not request.validate_only else ZERO_UUID,
                     num_partitions=partitions, replication_factor=1, error_code=ErrorCode.none)
            if ccls is not None:
                r["configs"] = tuple(
                    make(ccls, name=e.name, value=e.value, read_only=e.read_only,
                         config_source=CONFIG_SOURCE[e.source], is_sensitive=False)
                    for e in topic_config_entries(broker, configs)
                )
        except ApiError as e:
            r["error_code"] = e.error_code
            r["error_message"] = e.message
        results.append(make(rcls, **r))
    return make(cls, throttle_time=0, topics=(*results, *_duplicate_results(rcls, twice)))


async def _create_topics_in_cluster(ctx: Any, request: Any) -> Any:
    """Cluster mode: each topic is created in etcd (placement over the live brokers)."""
    cluster = ctx.broker.cluster
    cls = ctx.response_type
    rcls = sub(cls, "CreatableTopicResult")
    results = []
    twice = _named_twice(request.topics)
    for t in request.topics:
        if t.name in twice:
            continue
        r: dict[str, Any] = {"name": t.name, "topic_id": ZERO_UUID, "num_partitions": -1,
                             "replication_factor": -1, "configs": ()}
        try:
            if t.name in INTERNAL_TOPICS:
                raise ApiError(ErrorCode.invalid_request, f"{t.name} is an internal topic")
            assignments = None
            if t.assignments:
                ordered = sorted(t.assignments, key=lambda a: a.partition_index)
                if [a.partition_index for a in ordered] != list(range(len(ordered))):
                    raise ApiError(ErrorCode.invalid_replica_assignment, "partitions must be 0..n-1")
                assignments = [list(a.broker_ids) for a in ordered]
                if t.num_partitions != -1 or t.replication_factor != -1:
                    raise ApiError(ErrorCode.invalid_request,
                                   "give either assignments or partitions and replication factor")
            partitions = t.num_partitions
            if partitions == -1:
                partitions = len(assignments) if assignments else ctx.broker.config["num.partitions"]
            configs = {c.name: c.value for c in t.configs}
            topic_id, rf = await cluster.create_topic(t.name, partitions, t.replication_factor, configs, assignments,
                                                      validate_only=request.validate_only)
            r.update(topic_id=topic_id, num_partitions=partitions, replication_factor=rf, error_code=ErrorCode.none)
        except ApiError as e:
            r["error_code"] = e.error_code
            r["error_message"] = e.message
        results.append(make(rcls, **r))
    return make(cls, throttle_time=0, topics=(*results, *_duplicate_results(rcls, twice)))


@api(20, 1, 6)
def handle_delete_topics(ctx: Any, request: Any) -> Any:
    rcls = sub(ctx.response_type, "DeletableTopicResult")
    store = ctx.broker.store

    def name_of(t: Any) -> str | None:
        if isinstance(t, str):
            return t
        meta = store.get_topic(t.name) if t.name else store.topic_by_id(t.topic_id)
        return t.name or (meta.name if meta is not None else None)

    def refused(t: Any) -> Any:
        return make(rcls, name=t if isinstance(t, str) else t.name,
                    topic_id=getattr(t, "topic_id", None) or ZERO_UUID,
                    error_code=ErrorCode.topic_authorization_failed, error_message="Authorization failed.")

    return per_topic(ctx, request, _delete_topics_handler, DELETE, "topics" if ctx.api_version >= 6
                     else "topic_names", "responses", refused, name_of)


def _delete_topics_handler(ctx: Any, request: Any) -> Any:
    broker = ctx.broker
    delete = broker.cluster.delete_topic if broker.cluster.clustered else broker.delete_topic
    return _delete_topics(ctx, request, delete)


async def _delete_topics(ctx: Any, request: Any, delete: Any) -> Any:
    """DeleteTopics, each topic by ``delete(name)``: the local store's, or the cluster's (async)."""
    broker = ctx.broker
    store = broker.store
    cls = ctx.response_type
    rcls = sub(cls, "DeletableTopicResult")
    out = []
    if ctx.api_version >= 6:
        targets = [(t.name, t.topic_id) for t in request.topics]
    else:
        targets = [(name, None) for name in request.topic_names]
    for name, topic_id in targets:
        r: dict[str, Any] = {"name": name, "topic_id": topic_id or ZERO_UUID}
        try:
            meta = store.get_topic(name) if name else store.topic_by_id(topic_id)
            if meta is None:
                raise ApiError(ErrorCode.unknown_topic_id if name is None else ErrorCode.unknown_topic_or_partition)
            if meta.name in INTERNAL_TOPICS:
                raise ApiError(ErrorCode.invalid_request, f"{meta.name} is an internal topic")
            if not broker.config["delete.topic.enable"]:
                raise ApiError(ErrorCode.topic_deletion_disabled)
            done = delete(meta.name)
            if inspect.isawaitable(done):
                await done
            r.update(name=meta.name, topic_id=meta.topic_id, error_code=ErrorCode.none)
        except ApiError as e:
            r["error_code"] = e.error_code
            r["error_message"] = e.message
        out.append(make(rcls, **r))
    return make(cls, throttle_time=0, responses=tuple(out))


async def _create_partitions_in_cluster(ctx: Any, request: Any) -> Any:
    cls = ctx.response_type
    rcls = sub(cls, "CreatePartitionsTopicResult")
    out = []
    for t in request.topics:
        r: dict[str, Any] = {"name": t.name, "error_code": ErrorCode.none, "error_message": None}
        try:
            if t.name in INTERNAL_TOPICS:
                raise ApiError(ErrorCode.invalid_request, f"{t.name} is an internal topic")
            assignments = [list(a.broker_ids) for a in t.assignments] if t.assignments else None
            await ctx.broker.cluster.create_partitions(t.name, t.count, assignments,
                                                       validate_only=request.validate_only)
        except ApiError as e:
            r["error_code"] = e.error_code
            r["error_message"] = e.message
        out.append(make(rcls, **r))
    return make(cls, throttle_time=0, results=tuple(out))


@api(37, 0, 3)
def handle_create_partitions(ctx: Any, request: Any) -> Any:
    rcls = sub(ctx.response_type, "CreatePartitionsTopicResult")
    return per_topic(ctx, request, _create_partitions, ALTER, "topics", "results", lambda t: make(
        rcls, name=t.name, error_code=ErrorCode.topic_authorization_failed, error_message="Authorization failed."))


def _create_partitions(ctx: Any, request: Any) -> Any:
    broker = ctx.broker
    cls = ctx.response_type
    rcls = sub(cls, "CreatePartitionsTopicResult")
    store = broker.store
    if sum(max(t.count - (meta.num_partitions if (meta := store.get_topic(t.name)) is not None else 0), 0)
           for t in request.topics) > MAX_NEW_PARTITIONS_PER_REQUEST:
        return make(cls, throttle_time=0, results=tuple(
            make(rcls, name=t.name, error_code=ErrorCode.policy_violation, error_message=_EXCESSIVE)
            for t in request.topics))
    if broker.cluster.clustered:
        return _create_partitions_in_cluster(ctx, request)
    out = []
    for t in request.topics:
        r: dict[str, Any] = {"name": t.name, "error_code": ErrorCode.none, "error_message": None}
        try:
            meta = broker.store.get_topic(t.name)
            if meta is None:
                raise ApiError(ErrorCode.unknown_topic_or_partition)
            if t.name in INTERNAL_TOPICS:
                raise ApiError(ErrorCode.invalid_request, f"{t.name} is an internal topic")
            if t.count <= meta.num_partitions:
                raise ApiError(ErrorCode.invalid_partitions,
                               f"topic has {meta.num_partitions} partitions; a new count must be larger")
            if t.assignments:
                if len(t.assignments) != t.count - meta.num_partitions:
                    raise ApiError(ErrorCode.invalid_replica_assignment,
                                   f"{len(t.assignments)} assignments for {t.count - meta.num_partitions} "
                                   "new partitions")
                bad = [list(a.broker_ids) for a in t.assignments if list(a.broker_ids) != [broker.node_id]]
                if bad:
                    raise ApiError(ErrorCode.invalid_replica_assignment,
                                   f"the only broker is {broker.node_id}; cannot place replicas on {bad[0]}")
            if not request.validate_only:
                broker.create_partitions(t.name, t.count)
        except ApiError as e:
            r["error_code"] = e.error_code
            r["error_message"] = e.message
        out.append(make(rcls, **r))
    return make(cls, throttle_time=0, results=tuple(out))


@api(21, 0, 2)
def handle_delete_records(ctx: Any, request: Any) -> Any:
    tcls = sub(ctx.response_type, "DeleteRecordsTopicResult")
    pcls = sub(ctx.response_type, "DeleteRecordsPartitionResult")
    return per_topic(ctx, request, _delete_records, DELETE, "topics", "topics", lambda t: make(
        tcls, name=t.name, partitions=tuple(make(pcls, partition_index=p.partition_index, low_watermark=-1,
                                                 error_code=ErrorCode.topic_authorization_failed)
                                            for p in t.partitions)))


def _delete_records(ctx: Any, request: Any) -> Any:
    store = ctx.broker.store
    cls = ctx.response_type
    tcls = sub(cls, "DeleteRecordsTopicResult")
    pcls = sub(cls, "DeleteRecordsPartitionResult")
    topics = []
    for t in request.topics:
        meta = store.get_topic(t.name)
        parts = []
        for p in t.partitions:
            r: dict[str, Any] = {"partition_index": p.partition_index, "low_watermark": -1}
            try:
                if t.name in INTERNAL_TOPICS:  # Kafka's ReplicaManager.deleteRecords refuses them so
                    raise ApiError(ErrorCode.invalid_topic_exception,
                                   f"cannot delete records of internal topic {t.name}")
                if meta is None or not 0 <= p.partition_index < meta.num_partitions:
                    raise ApiError(ErrorCode.unknown_topic_or_partition)
                if ctx.broker.replicas is not None:  # cluster mode: the leader moves the log start;
                    ctx.broker.replicas.leader_replica(t.name, p.partition_index)  # followers follow it
                plog = store.partition(t.name, p.partition_index)
                offset = plog.high_watermark if p.offset == -1 else p.offset
                if not plog.log_start_offset <= offset <= plog.high_watermark:
                    raise ApiError(ErrorCode.offset_out_of_range)
                plog.delete_records(offset)
                r.update(low_watermark=plog.log_start_offset, error_code=ErrorCode.none)
            except ApiError as e:
                r["error_code"] = e.error_code
            parts.append(make(pcls, **r))
        topics.append(make(tcls, name=t.name, partitions=tuple(parts)))
    return make(cls, throttle_time=0, topics=tuple(topics))
