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
import inspect
import struct
from typing import Any, NamedTuple

from ...errors import ApiError, ErrorCode
from ...protocol.codec import EncodedBody, encode_body
from ...protocol.entities import ZERO_UUID, has_field, make, sub
from ...protocol.header import uvarint
from ...security.authz import (
    CLUSTER,
    CLUSTER_RESOURCE,
    CREATE,
    DESCRIBE,
    allowed,
    topic_allowed,
)
from ...security.serving import client_endpoint, listener_name, own_endpoint
from ..dispatch import api

INTERNAL_TOPICS = frozenset({"__consumer_offsets", "__share_group_state", "__transaction_state"})

_NOT_COMPUTED = -2147483648  # authorized operations: Kafka's "not requested" sentinel
_I32 = struct.Struct(">i")


def broker_entity(ctx: Any, cls: type) -> Any:
    b = ctx.broker
    host, port = own_endpoint(ctx)
    return make(cls, node_id=b.node_id, host=host, port=port, rack=None)


def topic_entity(ctx: Any, cls: type, meta: Any) -> Any:
    pcls = sub(cls, "MetadataResponsePartition")
    cluster = ctx.broker.cluster
    if cluster.clustered and meta.name not in INTERNAL_TOPICS:
        partitions = tuple(_partition_entity(pcls, i, cluster.partition(meta.name, i))
                           for i in range(meta.num_partitions))
    else:
        node = ctx.broker.node_id
        partitions = tuple(
            make(pcls, error_code=ErrorCode.none, partition_index=i, leader_id=node, leader_epoch=0,
                 replica_nodes=(node,), isr_nodes=(node,), offline_replicas=())
            for i in range(meta.num_partitions)
        )
    return make(cls, error_code=ErrorCode.none, name=meta.name, topic_id=meta.topic_id,
                is_internal=meta.name in INTERNAL_TOPICS, partitions=partitions,
                topic_authorized_operations=_NOT_COMPUTED)


def _partition_entity(pcls: type, index: int, view: Any) -> Any:
    if view is None:
        return make(pcls, error_code=ErrorCode.leader_not_available, partition_index=index, leader_id=-1,
                    leader_epoch=-1, replica_nodes=(), isr_nodes=(), offline_replicas=())
    code = ErrorCode.none if view.leader >= 0 else ErrorCode.leader_not_available
    return make(pcls, error_code=code, partition_index=index, leader_id=view.leader, leader_epoch=view.leader_epoch,
                replica_nodes=view.replicas, isr_nodes=view.isr, offline_replicas=view.offline)


def _brokers(ctx: Any, cls: type) -> tuple[Any, ...]:
    cluster = ctx.broker.cluster
    if not cluster.clustered:
        return (broker_entity(ctx, cls),)
    out = []
    for b in cluster.brokers():
        hp = client_endpoint(ctx, b)
        if hp is not None:
            out.append(make(cls, node_id=b.node_id, host=hp[0], port=hp[1], rack=b.rack))
    return tuple(out)


def _not_created_reason(broker: Any, request: Any, name: str) -> str:
    if name in INTERNAL_TOPICS:
        return "internal topics are created by their coordinator"
    if not broker.config["auto.create.topics.enable"]:
        return "auto.create.topics.enable=false"
    return "the client's Metadata request does not allow auto-creation"


_CHUNK_TOPICS = 50
"""Topic entries encoded between two yields to the event loop (at 5 partitions a topic,
steps of at most 10-16 ms on the development machine: benchmarks/metadata_scale.py)."""


class _Frame(NamedTuple):
    """A response with an empty topic array, cut around that array."""

    prefix: bytes
    suffix: bytes
    flexible: bool


class MetadataCache:
    """Encoded Metadata responses of one broker. Event loop only."""

    def __init__(self) -> None:
        self._topics: dict[tuple[type, str], tuple[int, bytes]] = {}
        self._frames: dict[tuple[type, str | None], tuple[int, _Frame]] = {}
        self._full: dict[tuple[type, str | None], tuple[int, EncodedBody]] = {}
        """Keyed by response type and listener: the brokers' endpoints are the listener's."""

    # -- pieces ---------------------------------------------------------------------
    def topic_bytes(self, ctx: Any, tcls: type, meta: Any) -> bytes:
        """One topic's encoded entry, from the cache or encoded now."""
        version = ctx.broker.store.topic_metadata_version(meta.name)
        key = (tcls, meta.name)
        hit = self._topics.get(key)
        if hit is not None and hit[0] == version:
            return hit[1]
        data = encode_body(topic_entity(ctx, tcls, meta))
        self._topics[key] = (version, data)
        return data

    def is_cached(self, ctx: Any, tcls: type, name: str) -> bool:
        hit = self._topics.get((tcls, name))
        return hit is not None and hit[0] == ctx.broker.store.topic_metadata_version(name)

    def frame(self, ctx: Any) -> _Frame:
        cls = ctx.response_type
        version = ctx.broker.store.metadata_version
        hit = self._frames.get((cls, listener_name(ctx)))
        if hit is not None and hit[0] == version:
            return hit[1]
        empty = encode_body(_response(ctx, ()))
        flexible = bool(cls.__flexible__)
        suffix_len = (4 if has_field(cls, "cluster_authorized_operations") else 0) + (1 if flexible else 0)
        marker = b"\x01" if flexible else b"\x00\x00\x00\x00"  # an empty (compact) array
        cut = len(empty) - suffix_len
        if empty[cut - len(marker):cut] != marker:  # pragma: no cover - kio changed the layout
            raise AssertionError(f"unexpected {cls.__name__} layout around the topic array")
        result = _Frame(empty[:cut - len(marker)], empty[cut:], flexible)
        self._frames[(cls, listener_name(ctx))] = (version, result)
        return result

    def splice(self, ctx: Any, entries: list[bytes]) -> EncodedBody:
        """A whole response body whose topic array holds ``entries``."""
        f = self.frame(ctx)
        n = len(entries)
        count = uvarint(n + 1) if f.flexible else _I32.pack(n)
        return EncodedBody(b"".join((f.prefix, count, *entries, f.suffix)))

    # -- requests ---------------------------------------------------------------------
    def full_body(self, ctx: Any) -> EncodedBody | None:
        """The body listing every topic, if cached for the current version."""
        hit = self._full.get((ctx.response_type, listener_name(ctx)))
        if hit is not None and hit[0] == ctx.broker.store.metadata_version:
            return hit[1]
        return None

    def build_full_body(self, ctx: Any) -> EncodedBody:
        cls = ctx.response_type
        tcls = sub(cls, "MetadataResponseTopic")
        metas = ctx.broker.store.topics()
        body = self.splice(ctx, [self.topic_bytes(ctx, tcls, m) for m in metas])
        self._full[(cls, listener_name(ctx))] = (ctx.broker.store.metadata_version, body)
        if len(self._topics) > 2 * len(metas) * max(1, len(self._full)):
            self._prune(ctx)
        return body

    def _prune(self, ctx: Any) -> None:
        """Drop the entries of topics that no longer exist."""
        store = ctx.broker.store
        self._topics = {k: v for k, v in self._topics.items() if store.get_topic(k[1]) is not None}

    async def encode_missing(self, ctx: Any, tcls: type, metas: list[Any]) -> None:
        """Encode the uncached entries of ``metas``, yielding to the loop between chunks."""
        done = 0
        for meta in metas:
            if ctx.broker.store.get_topic(meta.name) is not meta or self.is_cached(ctx, tcls, meta.name):
                continue
            self.topic_bytes(ctx, tcls, meta)
            done += 1
            if done % _CHUNK_TOPICS == 0:
                await asyncio.sleep(0)


def metadata_cache(broker: Any) -> MetadataCache:
    cache = broker.extensions.get("metadata")
    if cache is None:
        cache = broker.extensions["metadata"] = MetadataCache()
    return cache


def _response(ctx: Any, topics: tuple[Any, ...]) -> Any:
    broker = ctx.broker
    cls = ctx.response_type
    fields: dict[str, Any] = dict(
        throttle_time=0,
        brokers=_brokers(ctx, sub(cls, "MetadataResponseBroker")),
        cluster_id=broker.cluster_id,
        controller_id=broker.cluster.controller_id(),
        topics=topics,
    )
    if has_field(cls, "cluster_authorized_operations"):
        fields["cluster_authorized_operations"] = _NOT_COMPUTED
    return make(cls, **fields)


@api(3, 0, 12)
def handle_metadata(ctx: Any, request: Any) -> Any:
    broker = ctx.broker
    cache = metadata_cache(broker)
    requested = request.topics
    if requested is None or (ctx.api_version == 0 and not requested):
        if broker.authorizer is not None:
            return _describable_body(ctx, cache)
        body = cache.full_body(ctx)
        if body is not None:
            return body
        tcls = sub(ctx.response_type, "MetadataResponseTopic")
        metas = broker.store.topics()
        if _uncached(ctx, cache, tcls, metas) <= _CHUNK_TOPICS:
            return cache.build_full_body(ctx)
        return _full_later(ctx, cache, tcls, metas)
    if any(_invalid_topic(ctx.api_version, t) for t in requested):
        # As Kafka: v10-v11 name topics only by name; every topic of the answer is INVALID_REQUEST
        tcls = sub(ctx.response_type, "MetadataResponseTopic")
        return make(ctx.response_type, throttle_time=0, brokers=(), cluster_id=None, controller_id=-1, topics=tuple(
            make(tcls, error_code=ErrorCode.invalid_request, name=getattr(t, "name", None) or "",
                 topic_id=getattr(t, "topic_id", None) or ZERO_UUID, is_internal=False, partitions=())
            for t in requested))
    if broker.cluster.clustered:
        missing = [n for n in _to_auto_create(broker, request) if may_create(ctx, n)]
        if missing:
            return _create_then_answer(ctx, request, missing)
    return _named_response(ctx, request)


def may_create(ctx: Any, name: str) -> bool:
    """With an authorizer: whether the request may see and create topic ``name`` (DESCRIBE on
    it, and CREATE on the CLUSTER or on it), as Kafka's auto-creation asks."""
    if ctx.broker.authorizer is None:
        return True
    return topic_allowed(ctx, DESCRIBE, name, log_denied=False) and (
        allowed(ctx, CREATE, CLUSTER, CLUSTER_RESOURCE, log_denied=False) or topic_allowed(ctx, CREATE, name))


def _describable_body(ctx: Any, cache: MetadataCache) -> Any:
    """Every topic the request may DESCRIBE (an authorizer is on): the others are left out."""
    tcls = sub(ctx.response_type, "MetadataResponseTopic")
    metas = [m for m in ctx.broker.store.topics() if topic_allowed(ctx, DESCRIBE, m.name, log_denied=False)]
    if _uncached(ctx, cache, tcls, metas) <= _CHUNK_TOPICS:
        return _named_body(ctx, cache, tcls, metas)
    return _named_later(ctx, cache, tcls, metas, metas)


def _invalid_topic(version: int, t: Any) -> bool:
    """A requested topic without a name, or named by id before v12."""
    name = getattr(t, "name", "")
    topic_id = getattr(t, "topic_id", None)  # kio reads the zero uuid as None
    if version < 12:
        return name is None or topic_id not in (None, ZERO_UUID)
    return name is None and topic_id in (None, ZERO_UUID)


def _named_response(ctx: Any, request: Any, failed: dict[str, ApiError] | None = None) -> Any:
    cache = metadata_cache(ctx.broker)
    items = _requested(ctx, request, failed or {})
    tcls = sub(ctx.response_type, "MetadataResponseTopic")
    metas = [x for x in items if not isinstance(x, bytes)]
    if _uncached(ctx, cache, tcls, metas) <= _CHUNK_TOPICS:
        return _named_body(ctx, cache, tcls, items)
    return _named_later(ctx, cache, tcls, items, metas)


def _uncached(ctx: Any, cache: MetadataCache, tcls: type, metas: list[Any]) -> int:
    n = 0
    for m in metas:
        if not cache.is_cached(ctx, tcls, m.name):
            n += 1
            if n > _CHUNK_TOPICS:
                break
    return n


async def _full_later(ctx: Any, cache: MetadataCache, tcls: type, metas: list[Any]) -> EncodedBody:
    await cache.encode_missing(ctx, tcls, metas)
    return cache.full_body(ctx) or cache.build_full_body(ctx)


def _named_body(ctx: Any, cache: MetadataCache, tcls: type, items: list[Any]) -> EncodedBody:
    store = ctx.broker.store
    entries = []
    for x in items:
        if isinstance(x, bytes):
            entries.append(x)
        elif store.get_topic(x.name) is x:
            entries.append(cache.topic_bytes(ctx, tcls, x))
        else:  # deleted while the response was being encoded
            entries.append(encode_body(make(tcls, error_code=ErrorCode.unknown_topic_or_partition, name=x.name,
                                            topic_id=ZERO_UUID)))
    return cache.splice(ctx, entries)


async def _named_later(ctx: Any, cache: MetadataCache, tcls: type, items: list[Any],
                       metas: list[Any]) -> EncodedBody:
    await cache.encode_missing(ctx, tcls, metas)
    return _named_body(ctx, cache, tcls, items)


def _auto_create(broker: Any, request: Any) -> bool:
    return bool(broker.config["auto.create.topics.enable"]) and getattr(request, "allow_auto_topic_creation", True)


def _to_auto_create(broker: Any, request: Any) -> list[str]:
    """Cluster mode: the requested topics (by name) to create before answering."""
    if not _auto_create(broker, request):
        return []
    out = []
    for t in request.topics:
        name = getattr(t, "name", t) if not isinstance(t, str) else t
        if name is not None and name not in INTERNAL_TOPICS and broker.store.get_topic(name) is None:
            out.append(name)
    return out


async def _create_then_answer(ctx: Any, request: Any, names: list[str]) -> Any:
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
    answer = _named_response(ctx, request, failed)
    return await answer if inspect.isawaitable(answer) else answer


def _requested(ctx: Any, request: Any, failed: dict[str, ApiError]) -> list[Any]:
    """Per requested topic: its TopicInfo, or the encoded entry of its error (auto-creating if enabled)."""
    broker = ctx.broker
    store = broker.store
    tcls = sub(ctx.response_type, "MetadataResponseTopic")
    out: list[Any] = []
    auto = _auto_create(broker, request)
    for t in request.topics:
        name = getattr(t, "name", t) if not isinstance(t, str) else t
        topic_id = getattr(t, "topic_id", None)
        meta = None
        if name is None and topic_id not in (None, ZERO_UUID):
            meta = store.topic_by_id(topic_id)
            if meta is None:
                out.append(encode_body(make(tcls, error_code=ErrorCode.unknown_topic_id, name=None,
                                            topic_id=topic_id)))
                continue
        else:
            meta = store.get_topic(name)
        if broker.authorizer is not None and (
                not topic_allowed(ctx, DESCRIBE, meta.name if meta is not None else name)
                or (meta is None and auto and name not in INTERNAL_TOPICS and not may_create(ctx, name))):
            out.append(encode_body(make(tcls, error_code=ErrorCode.topic_authorization_failed, name=name,
                                        topic_id=ZERO_UUID)))
            continue
        if meta is None and name in failed:
            out.append(encode_body(make(tcls, error_code=failed[name].error_code, name=name, topic_id=ZERO_UUID)))
            continue
        if meta is None and auto and name not in INTERNAL_TOPICS and not broker.cluster.clustered:
            try:
                meta = broker.create_topic(name, broker.config["num.partitions"], {})
            except ApiError as e:
                out.append(encode_body(make(tcls, error_code=e.error_code, name=name, topic_id=ZERO_UUID)))
                continue
        if meta is None:
            if name is not None:
                broker.note_unknown_topic(ctx.header.client_id, name, _not_created_reason(broker, request, name))
            out.append(encode_body(make(tcls, error_code=ErrorCode.unknown_topic_or_partition, name=name,
                                        topic_id=ZERO_UUID)))
        else:
            out.append(meta)
    return out
