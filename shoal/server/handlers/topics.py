"""Topic administration: CreateTopics (19), DeleteTopics (20), CreatePartitions (37), DeleteRecords (21)."""

from __future__ import annotations

import inspect
import uuid
from collections.abc import Awaitable, Callable, Sequence

from ...errors import ApiError, ErrorCode
from ...protocol.entities import ZERO_UUID
from ...protocol.messages.create_partitions_request import CreatePartitionsRequest, CreatePartitionsTopic
from ...protocol.messages.create_partitions_response import CreatePartitionsResponse, CreatePartitionsTopicResult
from ...protocol.messages.create_topics_request import CreatableTopic, CreateTopicsRequest
from ...protocol.messages.create_topics_response import (
    CreatableTopicConfigs,
    CreatableTopicResult,
    CreateTopicsResponse,
)
from ...protocol.messages.delete_records_request import DeleteRecordsRequest, DeleteRecordsTopic
from ...protocol.messages.delete_records_response import (
    DeleteRecordsPartitionResult,
    DeleteRecordsResponse,
    DeleteRecordsTopicResult,
)
from ...protocol.messages.delete_topics_request import DeleteTopicsRequest, DeleteTopicState
from ...protocol.messages.delete_topics_response import DeletableTopicResult, DeleteTopicsResponse
from ...security.authz import (
    ALTER,
    CLUSTER,
    CLUSTER_RESOURCE,
    CREATE,
    DELETE,
    allowed,
    per_topic,
)
from ..context import RequestContext
from ..dispatch import api
from .configs import CONFIG_SOURCE, topic_config_entries
from .metadata import INTERNAL_TOPICS, log_store

MAX_NEW_PARTITIONS_PER_REQUEST = 10_000
"""Kafka's controller refuses a user operation that would write more than 10,000 metadata
records (a record per partition) with POLICY_VIOLATION; so does this broker, instead of
creating millions of partitions one by one for a single request."""
_EXCESSIVE = "Unable to perform excessively large batch operation."


def _named_twice(topics: Sequence[CreatableTopic]) -> list[str]:
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


def _failed_topic(name: str, code: ErrorCode, message: str | None) -> CreatableTopicResult:
    """A CreateTopics result for a topic not created (-1 partitions and replicas, no configs)."""
    return CreatableTopicResult(name=name, topic_id=ZERO_UUID, num_partitions=-1, replication_factor=-1,
                                configs=(), error_code=code, error_message=message)


def _duplicate_results(names: list[str]) -> list[CreatableTopicResult]:
    return [_failed_topic(n, ErrorCode.invalid_request, "Duplicate topic name.") for n in names]


def _new_partitions(t: CreatableTopic, default: int) -> int:
    """How many partitions a CreateTopics entry asks for."""
    if t.assignments:
        return len(t.assignments)
    return default if t.num_partitions == -1 else max(t.num_partitions, 0)


def _configs_of(t: CreatableTopic) -> dict[str, str]:
    """A CreateTopics entry's config overrides; INVALID_CONFIG for a null value (as Kafka)."""
    configs = {}
    for c in t.configs:
        if c.value is None:
            raise ApiError(ErrorCode.invalid_config, f"null value for {c.name}")
        configs[c.name] = c.value
    return configs


CreateTopicsAnswer = CreateTopicsResponse | Awaitable[CreateTopicsResponse]


@api(19, 2, 7)
def handle_create_topics(ctx: RequestContext, request: CreateTopicsRequest) -> CreateTopicsAnswer:
    if ctx.broker.authorizer is not None and allowed(ctx, CREATE, CLUSTER, CLUSTER_RESOURCE, log_denied=False):
        return _create_topics(ctx, request)
    answer: CreateTopicsAnswer = per_topic(
        ctx, request, _create_topics, CREATE, "topics", "topics",
        lambda t: _failed_topic(t.name, ErrorCode.topic_authorization_failed, "Authorization failed."))
    return answer


def _create_topics(ctx: RequestContext, request: CreateTopicsRequest) -> CreateTopicsAnswer:
    broker = ctx.broker
    if sum(_new_partitions(t, broker.config["num.partitions"]) for t in request.topics) \
            > MAX_NEW_PARTITIONS_PER_REQUEST:
        return CreateTopicsResponse(throttle_time=0, topics=tuple(
            _failed_topic(t.name, ErrorCode.policy_violation, _EXCESSIVE) for t in request.topics))
    if broker.cluster.clustered:
        return _create_topics_in_cluster(ctx, request)
    results = []
    twice = _named_twice(request.topics)
    for t in request.topics:
        if t.name in twice:
            continue
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
            configs = _configs_of(t)
            meta = broker.create_topic(t.name, partitions, configs,
                                       validate_only=request.validate_only)
            # the topic's configs (v5 on; the conversion leaves them out before)
            results.append(CreatableTopicResult(
                name=t.name, topic_id=meta.topic_id if not request.validate_only else ZERO_UUID,
                num_partitions=partitions, replication_factor=1, error_code=ErrorCode.none, configs=tuple(
                    CreatableTopicConfigs(name=e.name, value=e.value, read_only=e.read_only,
                                          config_source=CONFIG_SOURCE[e.source], is_sensitive=False)
                    for e in topic_config_entries(broker, configs)
                ) if ctx.api_version >= 5 else ()))
        except ApiError as e:
            results.append(_failed_topic(t.name, e.error_code, e.message))
    return CreateTopicsResponse(throttle_time=0, topics=(*results, *_duplicate_results(twice)))


async def _create_topics_in_cluster(ctx: RequestContext, request: CreateTopicsRequest) -> CreateTopicsResponse:
    """Cluster mode: each topic is created in etcd (placement over the live brokers)."""
    cluster = ctx.broker.cluster
    results = []
    twice = _named_twice(request.topics)
    for t in request.topics:
        if t.name in twice:
            continue
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
            configs = _configs_of(t)
            topic_id: uuid.UUID
            rf: int
            topic_id, rf = await cluster.create_topic(t.name, partitions, t.replication_factor, configs, assignments,
                                                      validate_only=request.validate_only)
            results.append(CreatableTopicResult(name=t.name, topic_id=topic_id, num_partitions=partitions,
                                                replication_factor=rf, configs=(), error_code=ErrorCode.none))
        except ApiError as e:
            results.append(_failed_topic(t.name, e.error_code, e.message))
    return CreateTopicsResponse(throttle_time=0, topics=(*results, *_duplicate_results(twice)))


DeleteTopicsAnswer = DeleteTopicsResponse | Awaitable[DeleteTopicsResponse]


@api(20, 1, 6)
def handle_delete_topics(ctx: RequestContext, request: DeleteTopicsRequest) -> DeleteTopicsAnswer:
    store = log_store(ctx.broker)

    def name_of(t: str | DeleteTopicState) -> str | None:
        if isinstance(t, str):
            return t
        meta = store.get_topic(t.name) if t.name else store.topic_by_id(t.topic_id) if t.topic_id else None
        return t.name or (meta.name if meta is not None else None)

    def refused(t: str | DeleteTopicState) -> DeletableTopicResult:
        if isinstance(t, str):  # v1-v5 name topics by name only
            return DeletableTopicResult(name=t, topic_id=ZERO_UUID, error_code=ErrorCode.topic_authorization_failed,
                                        error_message="Authorization failed.")
        return DeletableTopicResult(name=t.name, topic_id=t.topic_id or ZERO_UUID,
                                    error_code=ErrorCode.topic_authorization_failed,
                                    error_message="Authorization failed.")

    answer: DeleteTopicsAnswer = per_topic(
        ctx, request, _delete_topics_handler, DELETE, "topics" if ctx.api_version >= 6 else "topic_names",
        "responses", refused, name_of)
    return answer


def _delete_topics_handler(ctx: RequestContext, request: DeleteTopicsRequest) -> Awaitable[DeleteTopicsResponse]:
    broker = ctx.broker
    delete: Callable[[str], Awaitable[None] | None] = (
        broker.cluster.delete_topic if broker.cluster.clustered else broker.delete_topic)
    return _delete_topics(ctx, request, delete)


async def _delete_topics(ctx: RequestContext, request: DeleteTopicsRequest,
                         delete: Callable[[str], Awaitable[None] | None]) -> DeleteTopicsResponse:
    """DeleteTopics, each topic by ``delete(name)``: the local store's, or the cluster's (async)."""
    broker = ctx.broker
    store = log_store(broker)
    out = []
    targets: list[tuple[str | None, uuid.UUID | None]]
    if ctx.api_version >= 6:
        targets = [(t.name, t.topic_id) for t in request.topics]
    else:  # v1-v5: topic_names
        targets = [(name, None) for name in request.topic_names]
    for name, topic_id in targets:
        try:
            meta = store.get_topic(name) if name else store.topic_by_id(topic_id) if topic_id else None
            if meta is None:
                raise ApiError(ErrorCode.unknown_topic_id if name is None else ErrorCode.unknown_topic_or_partition)
            if meta.name in INTERNAL_TOPICS:
                raise ApiError(ErrorCode.invalid_request, f"{meta.name} is an internal topic")
            if not broker.config["delete.topic.enable"]:
                raise ApiError(ErrorCode.topic_deletion_disabled)
            done = delete(meta.name)
            if inspect.isawaitable(done):
                await done
            out.append(DeletableTopicResult(name=meta.name, topic_id=meta.topic_id, error_code=ErrorCode.none))
        except ApiError as e:
            out.append(DeletableTopicResult(name=name, topic_id=topic_id or ZERO_UUID, error_code=e.error_code,
                                            error_message=e.message))
    return DeleteTopicsResponse(throttle_time=0, responses=tuple(out))


async def _create_partitions_in_cluster(ctx: RequestContext,
                                        request: CreatePartitionsRequest) -> CreatePartitionsResponse:
    out = []
    for t in request.topics:
        try:
            if t.name in INTERNAL_TOPICS:
                raise ApiError(ErrorCode.invalid_request, f"{t.name} is an internal topic")
            assignments = [list(a.broker_ids) for a in t.assignments] if t.assignments else None
            await ctx.broker.cluster.create_partitions(t.name, t.count, assignments,
                                                       validate_only=request.validate_only)
            out.append(CreatePartitionsTopicResult(name=t.name, error_code=ErrorCode.none, error_message=None))
        except ApiError as e:
            out.append(CreatePartitionsTopicResult(name=t.name, error_code=e.error_code, error_message=e.message))
    return CreatePartitionsResponse(throttle_time=0, results=tuple(out))


CreatePartitionsAnswer = CreatePartitionsResponse | Awaitable[CreatePartitionsResponse]


@api(37, 0, 3)
def handle_create_partitions(ctx: RequestContext, request: CreatePartitionsRequest) -> CreatePartitionsAnswer:
    def refused(t: CreatePartitionsTopic) -> CreatePartitionsTopicResult:
        return CreatePartitionsTopicResult(name=t.name, error_code=ErrorCode.topic_authorization_failed,
                                           error_message="Authorization failed.")

    answer: CreatePartitionsAnswer = per_topic(ctx, request, _create_partitions, ALTER, "topics", "results", refused)
    return answer


def _create_partitions(ctx: RequestContext, request: CreatePartitionsRequest) -> CreatePartitionsAnswer:
    broker = ctx.broker
    store = log_store(broker)
    if sum(max(t.count - (meta.num_partitions if (meta := store.get_topic(t.name)) is not None else 0), 0)
           for t in request.topics) > MAX_NEW_PARTITIONS_PER_REQUEST:
        return CreatePartitionsResponse(throttle_time=0, results=tuple(
            CreatePartitionsTopicResult(name=t.name, error_code=ErrorCode.policy_violation, error_message=_EXCESSIVE)
            for t in request.topics))
    if broker.cluster.clustered:
        return _create_partitions_in_cluster(ctx, request)
    out = []
    for t in request.topics:
        try:
            meta = store.get_topic(t.name)
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
            out.append(CreatePartitionsTopicResult(name=t.name, error_code=ErrorCode.none, error_message=None))
        except ApiError as e:
            out.append(CreatePartitionsTopicResult(name=t.name, error_code=e.error_code, error_message=e.message))
    return CreatePartitionsResponse(throttle_time=0, results=tuple(out))


@api(21, 0, 2)
def handle_delete_records(ctx: RequestContext, request: DeleteRecordsRequest) -> DeleteRecordsResponse:
    def refused(t: DeleteRecordsTopic) -> DeleteRecordsTopicResult:
        return DeleteRecordsTopicResult(name=t.name, partitions=tuple(
            DeleteRecordsPartitionResult(partition_index=p.partition_index, low_watermark=-1,
                                         error_code=ErrorCode.topic_authorization_failed)
            for p in t.partitions))

    answer: DeleteRecordsResponse = per_topic(ctx, request, _delete_records, DELETE, "topics", "topics", refused)
    return answer


def _delete_records(ctx: RequestContext, request: DeleteRecordsRequest) -> DeleteRecordsResponse:
    broker = ctx.broker
    store = log_store(broker)
    topics = []
    for t in request.topics:
        meta = store.get_topic(t.name)
        parts = []
        for p in t.partitions:
            try:
                if t.name in INTERNAL_TOPICS:  # Kafka's ReplicaManager.deleteRecords refuses them so
                    raise ApiError(ErrorCode.invalid_topic_exception,
                                   f"cannot delete records of internal topic {t.name}")
                if meta is None or not 0 <= p.partition_index < meta.num_partitions:
                    raise ApiError(ErrorCode.unknown_topic_or_partition)
                if broker.replicas is not None:  # cluster mode: the leader moves the log start;
                    broker.replicas.leader_replica(t.name, p.partition_index)  # followers follow it
                plog = store.partition(t.name, p.partition_index)
                offset = plog.high_watermark if p.offset == -1 else p.offset
                if not plog.log_start_offset <= offset <= plog.high_watermark:
                    raise ApiError(ErrorCode.offset_out_of_range)
                plog.delete_records(offset)
                parts.append(DeleteRecordsPartitionResult(partition_index=p.partition_index,
                                                          low_watermark=plog.log_start_offset,
                                                          error_code=ErrorCode.none))
            except ApiError as e:
                parts.append(DeleteRecordsPartitionResult(partition_index=p.partition_index, low_watermark=-1,
                                                          error_code=e.error_code))
        topics.append(DeleteRecordsTopicResult(name=t.name, partitions=tuple(parts)))
    return DeleteRecordsResponse(throttle_time=0, topics=tuple(topics))
