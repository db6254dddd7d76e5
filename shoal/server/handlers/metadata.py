"""Metadata (key 3), v0-v12.

One broker (local metadata): it leads every partition of every topic. Cluster mode: every
live broker, and each partition's leader, leader epoch, replicas, ISR and offline replicas
from the cluster metadata (LEADER_NOT_AVAILABLE for a partition without a leader).

``auto.create.topics.enable`` (and the request allowing it): an unknown topic asked for by
name is created with ``num.partitions``; in cluster mode through etcd exactly as
CreateTopics does (``default.replication.factor`` replicas; INVALID_REPLICATION_FACTOR
for that topic when fewer brokers are registered, as Kafka answers), before the answer.

Theory of operation
-------------------
Clients refresh metadata often, and building and encoding a response with kio for
every topic of a large cluster (2,000 topics, 10,000 partitions) holds the event loop
for 140-250 ms (benchmarks/metadata_scale.py), serving no other connection. So
responses are spliced from cached bytes, kept per API version:

* each topic's encoded entry, valid while the store's ``topic_metadata_version`` of that
  topic is the one it was built at (the store bumps it on every change a response shows:
  creation, deletion, partitions added; in cluster mode every new cluster metadata
  snapshot, with brokers, leaders and ISRs, bumps it for all topics);
* the response's encoded frame around the topic array (brokers, cluster id, controller;
  the fields after the array), valid for one ``metadata_version``;
* the whole body of a request for every topic, valid for one ``metadata_version``.

A request for every topic thus costs a dict look-up and a write of shared bytes; after
a change, only the changed topic is encoded again. When more than ``_CHUNK_TOPICS``
entries must be encoded (the first request of an API version, or many new topics) the
handler encodes them ``_CHUNK_TOPICS`` at a time and yields to the event loop between
chunks, so other connections are served meanwhile.

Nothing in a response depends on the request besides the topics asked for (throttle
time is 0; authorized operations are not computed), so one body serves every client.
Event loop only.
"""

from __future__ import annotations

import asyncio
import struct
import typing
import uuid
from collections.abc import Awaitable, Sequence
from functools import cache
from typing import TYPE_CHECKING, NamedTuple

from ...cluster.metadata import PartitionView
from ...errors import ApiError, ErrorCode
from ...log.store import LogStore, TopicInfo
from ...protocol.codec import EncodedBody, encode_body
from ...protocol.entities import ZERO_UUID
from ...protocol.header import uvarint
from ...protocol.messages.metadata_request import MetadataRequest, MetadataRequestTopic
from ...protocol.messages.metadata_response import (
    MetadataResponse,
    MetadataResponseBroker,
    MetadataResponsePartition,
    MetadataResponseTopic,
)
from ...protocol.views import to_entity
from ...security.authz import (
    CLUSTER,
    CLUSTER_RESOURCE,
    CREATE,
    DESCRIBE,
    allowed,
    topic_allowed,
)
from ...security.serving import client_endpoint, listener_name, own_endpoint
from ..context import RequestContext
from ..dispatch import api

if TYPE_CHECKING:
    from ..broker import Broker

INTERNAL_TOPICS = frozenset({"__consumer_offsets", "__share_group_state", "__transaction_state"})

_I32 = struct.Struct(">i")


def log_store(broker: Broker) -> LogStore:
    """The broker's log store (set once the broker has started, before any request is served)."""
    store = broker.store
    assert store is not None
    return store


def broker_entity(ctx: RequestContext) -> MetadataResponseBroker:
    host, port = own_endpoint(ctx)
    return MetadataResponseBroker(node_id=ctx.broker.node_id, host=host, port=port, rack=None)


def topic_entity(ctx: RequestContext, meta: TopicInfo) -> MetadataResponseTopic:
    cluster = ctx.broker.cluster
    if cluster.clustered and meta.name not in INTERNAL_TOPICS:
        partitions = tuple(_partition_entity(i, cluster.partition(meta.name, i))
                           for i in range(meta.num_partitions))
    else:
        node = ctx.broker.node_id
        partitions = tuple(
            MetadataResponsePartition(error_code=ErrorCode.none, partition_index=i, leader_id=node, leader_epoch=0,
                                      replica_nodes=(node,), isr_nodes=(node,), offline_replicas=())
            for i in range(meta.num_partitions)
        )
    # topic_authorized_operations: left at Kafka's "not requested" sentinel (they are not computed)
    return MetadataResponseTopic(error_code=ErrorCode.none, name=meta.name, topic_id=meta.topic_id,
                                 is_internal=meta.name in INTERNAL_TOPICS, partitions=partitions)


def _partition_entity(index: int, view: PartitionView | None) -> MetadataResponsePartition:
    if view is None:
        return MetadataResponsePartition(error_code=ErrorCode.leader_not_available, partition_index=index,
                                         leader_id=-1, leader_epoch=-1, replica_nodes=(), isr_nodes=(),
                                         offline_replicas=())
    code = ErrorCode.none if view.leader >= 0 else ErrorCode.leader_not_available
    return MetadataResponsePartition(error_code=code, partition_index=index, leader_id=view.leader,
                                     leader_epoch=view.leader_epoch, replica_nodes=view.replicas,
                                     isr_nodes=view.isr, offline_replicas=view.offline)


def _error_entry(code: ErrorCode, name: str | None, topic_id: uuid.UUID = ZERO_UUID) -> MetadataResponseTopic:
    return MetadataResponseTopic(error_code=code, name=name, topic_id=topic_id)


def _brokers(ctx: RequestContext) -> tuple[MetadataResponseBroker, ...]:
    cluster = ctx.broker.cluster
    if not cluster.clustered:
        return (broker_entity(ctx),)
    out = []
    for b in cluster.brokers():
        hp = client_endpoint(ctx, b)
        if hp is not None:
            out.append(MetadataResponseBroker(node_id=b.node_id, host=hp[0], port=hp[1], rack=b.rack))
    return tuple(out)


def _not_created_reason(broker: Broker, name: str) -> str:
    if name in INTERNAL_TOPICS:
        return "internal topics are created by their coordinator"
    if not broker.config["auto.create.topics.enable"]:
        return "auto.create.topics.enable=false"
    return "the client's Metadata request does not allow auto-creation"


_CHUNK_TOPICS = 50
"""Topic entries encoded between two yields to the event loop (at 5 partitions a topic,
steps of at most 10-16 ms on the development machine: benchmarks/metadata_scale.py)."""


@cache
def _topic_class(response_type: type) -> type:
    """kio's class of a topic entry in ``response_type`` (the element type of its topic array)."""
    topics: type = typing.get_args(typing.get_type_hints(response_type)["topics"])[0]
    return topics


def _encode_topic(ctx: RequestContext, entry: MetadataResponseTopic) -> bytes:
    """One topic entry encoded for the request's version."""
    return encode_body(to_entity(entry, _topic_class(ctx.codec.response_type)))


class _Frame(NamedTuple):
    """A response with an empty topic array, cut around that array."""

    prefix: bytes
    suffix: bytes
    flexible: bool


class MetadataCache:
    """Encoded Metadata responses of one broker, per API version. Event loop only."""

    def __init__(self) -> None:
        self._topics: dict[tuple[int, str], tuple[int, bytes]] = {}
        self._frames: dict[tuple[int, str | None], tuple[int, _Frame]] = {}
        self._full: dict[tuple[int, str | None], tuple[int, EncodedBody]] = {}
        """Keyed by API version and listener: the brokers' endpoints are the listener's."""

    # -- pieces ---------------------------------------------------------------------
    def topic_bytes(self, ctx: RequestContext, meta: TopicInfo) -> bytes:
        """One topic's encoded entry, from the cache or encoded now."""
        version = log_store(ctx.broker).topic_metadata_version(meta.name)
        key = (ctx.api_version, meta.name)
        hit = self._topics.get(key)
        if hit is not None and hit[0] == version:
            return hit[1]
        data = _encode_topic(ctx, topic_entity(ctx, meta))
        self._topics[key] = (version, data)
        return data

    def is_cached(self, ctx: RequestContext, name: str) -> bool:
        hit = self._topics.get((ctx.api_version, name))
        return hit is not None and hit[0] == log_store(ctx.broker).topic_metadata_version(name)

    def frame(self, ctx: RequestContext) -> _Frame:
        version = log_store(ctx.broker).metadata_version
        key = (ctx.api_version, listener_name(ctx))
        hit = self._frames.get(key)
        if hit is not None and hit[0] == version:
            return hit[1]
        empty = encode_body(to_entity(_response(ctx, ()), ctx.codec.response_type))
        flexible = ctx.codec.flexible
        # after the topic array: cluster_authorized_operations (v8-v10), then the tagged fields (v9 on)
        suffix_len = (4 if 8 <= ctx.api_version <= 10 else 0) + (1 if flexible else 0)
        marker = b"\x01" if flexible else b"\x00\x00\x00\x00"  # an empty (compact) array
        cut = len(empty) - suffix_len
        if empty[cut - len(marker):cut] != marker:  # pragma: no cover - kio changed the layout
            raise AssertionError(f"unexpected Metadata v{ctx.api_version} layout around the topic array")
        result = _Frame(empty[:cut - len(marker)], empty[cut:], flexible)
        self._frames[key] = (version, result)
        return result

    def splice(self, ctx: RequestContext, entries: list[bytes]) -> EncodedBody:
        """A whole response body whose topic array holds ``entries``."""
        f = self.frame(ctx)
        n = len(entries)
        count = uvarint(n + 1) if f.flexible else _I32.pack(n)
        return EncodedBody(b"".join((f.prefix, count, *entries, f.suffix)))

    # -- requests ---------------------------------------------------------------------
    def full_body(self, ctx: RequestContext) -> EncodedBody | None:
        """The body listing every topic, if cached for the current version."""
        hit = self._full.get((ctx.api_version, listener_name(ctx)))
        if hit is not None and hit[0] == log_store(ctx.broker).metadata_version:
            return hit[1]
        return None

    def build_full_body(self, ctx: RequestContext) -> EncodedBody:
        store = log_store(ctx.broker)
        metas = store.topics()
        body = self.splice(ctx, [self.topic_bytes(ctx, m) for m in metas])
        self._full[(ctx.api_version, listener_name(ctx))] = (store.metadata_version, body)
        if len(self._topics) > 2 * len(metas) * max(1, len(self._full)):
            self._prune(store)
        return body

    def _prune(self, store: LogStore) -> None:
        """Drop the entries of topics that no longer exist."""
        self._topics = {k: v for k, v in self._topics.items() if store.get_topic(k[1]) is not None}

    async def encode_missing(self, ctx: RequestContext, metas: Sequence[TopicInfo]) -> None:
        """Encode the uncached entries of ``metas``, yielding to the loop between chunks."""
        store = log_store(ctx.broker)
        done = 0
        for meta in metas:
            if store.get_topic(meta.name) is not meta or self.is_cached(ctx, meta.name):
                continue
            self.topic_bytes(ctx, meta)
            done += 1
            if done % _CHUNK_TOPICS == 0:
                await asyncio.sleep(0)


def metadata_cache(broker: Broker) -> MetadataCache:
    cache: MetadataCache | None = broker.extensions.get("metadata")
    if cache is None:
        cache = broker.extensions["metadata"] = MetadataCache()
    return cache


def _response(ctx: RequestContext, topics: tuple[MetadataResponseTopic, ...]) -> MetadataResponse:
    # cluster_authorized_operations: left at Kafka's "not requested" sentinel (not computed)
    broker = ctx.broker
    return MetadataResponse(throttle_time=0, brokers=_brokers(ctx), cluster_id=broker.cluster_id,
                            controller_id=broker.cluster.controller_id(), topics=topics)


Answer = EncodedBody | MetadataResponse
"""A Metadata answer: spliced from cached bytes, or (a refused request) a response view."""


@api(3, 0, 12)
def handle_metadata(ctx: RequestContext, request: MetadataRequest) -> Answer | Awaitable[Answer]:
    broker = ctx.broker
    cache = metadata_cache(broker)
    requested = request.topics
    # v0 has no null topic list: there an empty one means every topic (from v1 on, none)
    if requested is None or (ctx.api_version == 0 and not requested):
        if broker.authorizer is not None:
            return _describable_body(ctx, cache)
        body = cache.full_body(ctx)
        if body is not None:
            return body
        metas = log_store(broker).topics()
        if _uncached(ctx, cache, metas) <= _CHUNK_TOPICS:
            return cache.build_full_body(ctx)
        return _full_later(ctx, cache, metas)
    if any(_invalid_topic(ctx.api_version, t) for t in requested):
        # As Kafka: v10-v11 name topics only by name; every topic of the answer is INVALID_REQUEST
        return MetadataResponse(throttle_time=0, brokers=(), cluster_id=None, controller_id=-1, topics=tuple(
            MetadataResponseTopic(error_code=ErrorCode.invalid_request, name=t.name or "",
                                  topic_id=t.topic_id or ZERO_UUID, is_internal=False, partitions=())
            for t in requested))
    if broker.cluster.clustered:
        missing = [n for n in _to_auto_create(broker, request, requested) if may_create(ctx, n)]
        if missing:
            return _create_then_answer(ctx, request, requested, missing)
    return _named_response(ctx, request, requested)


def may_create(ctx: RequestContext, name: str) -> bool:
    """With an authorizer: whether the request may see and create topic ``name`` (DESCRIBE on
    it, and CREATE on the CLUSTER or on it), as Kafka's auto-creation asks."""
    if ctx.broker.authorizer is None:
        return True
    return topic_allowed(ctx, DESCRIBE, name, log_denied=False) and (
        allowed(ctx, CREATE, CLUSTER, CLUSTER_RESOURCE, log_denied=False) or topic_allowed(ctx, CREATE, name))


def _describable_body(ctx: RequestContext, cache: MetadataCache) -> EncodedBody | Awaitable[EncodedBody]:
    """Every topic the request may DESCRIBE (an authorizer is on): the others are left out."""
    metas = [m for m in log_store(ctx.broker).topics() if topic_allowed(ctx, DESCRIBE, m.name, log_denied=False)]
    if _uncached(ctx, cache, metas) <= _CHUNK_TOPICS:
        return _named_body(ctx, cache, metas)
    return _named_later(ctx, cache, metas, metas)


def _invalid_topic(version: int, t: MetadataRequestTopic) -> bool:
    """A requested topic without a name, or named by id before v12 (before v10 topic_id reads None)."""
    if version < 12:
        return t.name is None or t.topic_id not in (None, ZERO_UUID)  # kio reads the zero uuid as None
    return t.name is None and t.topic_id in (None, ZERO_UUID)


def _named_response(ctx: RequestContext, request: MetadataRequest, requested: Sequence[MetadataRequestTopic],
                    failed: dict[str, ApiError] | None = None) -> EncodedBody | Awaitable[EncodedBody]:
    cache = metadata_cache(ctx.broker)
    items = _requested(ctx, request, requested, failed or {})
    metas = [x for x in items if not isinstance(x, bytes)]
    if _uncached(ctx, cache, metas) <= _CHUNK_TOPICS:
        return _named_body(ctx, cache, items)
    return _named_later(ctx, cache, items, metas)


def _uncached(ctx: RequestContext, cache: MetadataCache, metas: Sequence[TopicInfo]) -> int:
    n = 0
    for m in metas:
        if not cache.is_cached(ctx, m.name):
            n += 1
            if n > _CHUNK_TOPICS:
                break
    return n


async def _full_later(ctx: RequestContext, cache: MetadataCache, metas: Sequence[TopicInfo]) -> EncodedBody:
    await cache.encode_missing(ctx, metas)
    return cache.full_body(ctx) or cache.build_full_body(ctx)


def _named_body(ctx: RequestContext, cache: MetadataCache, items: Sequence[TopicInfo | bytes]) -> EncodedBody:
    store = log_store(ctx.broker)
    entries = []
    for x in items:
        if isinstance(x, bytes):
            entries.append(x)
        elif store.get_topic(x.name) is x:
            entries.append(cache.topic_bytes(ctx, x))
        else:  # deleted while the response was being encoded
            entries.append(_encode_topic(ctx, _error_entry(ErrorCode.unknown_topic_or_partition, x.name)))
    return cache.splice(ctx, entries)


async def _named_later(ctx: RequestContext, cache: MetadataCache, items: Sequence[TopicInfo | bytes],
                       metas: Sequence[TopicInfo]) -> EncodedBody:
    await cache.encode_missing(ctx, metas)
    return _named_body(ctx, cache, items)


def _auto_create(broker: Broker, request: MetadataRequest) -> bool:
    # allow_auto_topic_creation came with v4; before it, it reads True (Kafka's default)
    return bool(broker.config["auto.create.topics.enable"]) and request.allow_auto_topic_creation


def _to_auto_create(broker: Broker, request: MetadataRequest, requested: Sequence[MetadataRequestTopic]) -> list[str]:
    """Cluster mode: the requested topics (by name) to create before answering."""
    if not _auto_create(broker, request):
        return []
    store = log_store(broker)
    return [t.name for t in requested
            if t.name is not None and t.name not in INTERNAL_TOPICS and store.get_topic(t.name) is None]


async def _create_then_answer(ctx: RequestContext, request: MetadataRequest,
                              requested: Sequence[MetadataRequestTopic], names: list[str]) -> EncodedBody:
    """Cluster mode: create the unknown topics in etcd as CreateTopics would (``num.partitions``,
    ``default.replication.factor``), then answer; a topic that cannot be created gets the
    creation's error (INVALID_REPLICATION_FACTOR with fewer brokers than replicas, as Kafka)."""
    broker = ctx.broker
    failed: dict[str, ApiError] = {}
    for name in dict.fromkeys(names):
        try:
            await broker.cluster.create_topic(name, broker.config["num.partitions"], -1, {}, None,
                                              validate_only=False)
        except ApiError as e:
            if e.error_code != ErrorCode.topic_already_exists:  # another broker created it meanwhile
                failed[name] = e
    answer = _named_response(ctx, request, requested, failed)
    return answer if isinstance(answer, EncodedBody) else await answer


def _requested(ctx: RequestContext, request: MetadataRequest, requested: Sequence[MetadataRequestTopic],
               failed: dict[str, ApiError]) -> list[TopicInfo | bytes]:
    """Per requested topic: its TopicInfo, or the encoded entry of its error (auto-creating if enabled)."""
    broker = ctx.broker
    store = log_store(broker)
    out: list[TopicInfo | bytes] = []
    auto = _auto_create(broker, request)
    for t in requested:
        name = t.name
        topic_id = t.topic_id  # before v10: None
        if name is None:  # named by id (v12 on: a nameless topic without an id is refused above)
            found = store.topic_by_id(topic_id) if topic_id is not None else None
            if found is None:
                out.append(_encode_topic(ctx, _error_entry(ErrorCode.unknown_topic_id, None, topic_id or ZERO_UUID)))
            elif broker.authorizer is not None and not topic_allowed(ctx, DESCRIBE, found.name):
                out.append(_encode_topic(ctx, _error_entry(ErrorCode.topic_authorization_failed, None)))
            else:
                out.append(found)
            continue
        meta = store.get_topic(name)
        if broker.authorizer is not None and (
                not topic_allowed(ctx, DESCRIBE, name)
                or (meta is None and auto and name not in INTERNAL_TOPICS and not may_create(ctx, name))):
            out.append(_encode_topic(ctx, _error_entry(ErrorCode.topic_authorization_failed, name)))
            continue
        if meta is None and name in failed:
            out.append(_encode_topic(ctx, _error_entry(failed[name].error_code, name)))
            continue
        if meta is None and auto and name not in INTERNAL_TOPICS and not broker.cluster.clustered:
            try:
                meta = broker.create_topic(name, broker.config["num.partitions"], {})
            except ApiError as e:
                out.append(_encode_topic(ctx, _error_entry(e.error_code, name)))
                continue
        if meta is None:
            broker.note_unknown_topic(ctx.header.client_id, name, _not_created_reason(broker, name))
            out.append(_encode_topic(ctx, _error_entry(ErrorCode.unknown_topic_or_partition, name)))
        else:
            out.append(meta)
    return out
