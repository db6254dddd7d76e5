"""Metadata responses spliced from cached bytes equal kio's encoding of the same response."""

from __future__ import annotations

import asyncio
import uuid
from types import SimpleNamespace
from typing import Any

import pytest
from kio.index import load_request_schema

from shoal.cluster.metadata import BrokerEndpoint, LocalMetadata, PartitionView
from shoal.config import BrokerConfig
from shoal.errors import ErrorCode
from shoal.protocol.codec import EncodedBody, codec_for, encode_body
from shoal.protocol.entities import ZERO_UUID, make, sub
from shoal.protocol.header import RequestHeader
from shoal.protocol.messages.metadata_response import MetadataResponseTopic
from shoal.protocol.views import to_entity
from shoal.server.context import RequestContext
from shoal.server.handlers import metadata as md


class FakeStore:
    """Topics and the metadata version counters, as LogStore keeps them."""

    def __init__(self, topics: int, partitions: int) -> None:
        self._topics: dict[str, Any] = {}
        self.metadata_version = 0
        self._changed: dict[str, int] = {}
        for i in range(topics):
            self.add(f"topic-{i}", partitions)

    def add(self, name: str, partitions: int) -> None:
        self._topics[name] = SimpleNamespace(name=name, topic_id=uuid.uuid4(), num_partitions=partitions)
        self.bump_metadata_version(name)

    def bump_metadata_version(self, topic: str | None = None) -> None:
        self.metadata_version += 1
        if topic is not None:
            self._changed[topic] = self.metadata_version
        else:
            self._all = self.metadata_version

    def topic_metadata_version(self, name: str) -> int:
        return max(getattr(self, "_all", 0), self._changed.get(name, 0))

    def topics(self) -> list[Any]:
        return list(self._topics.values())

    def get_topic(self, name: str) -> Any:
        return self._topics.get(name)

    def topic_by_id(self, topic_id: uuid.UUID) -> Any:
        return next((t for t in self._topics.values() if t.topic_id == topic_id), None)


def fake_broker(store: FakeStore) -> Any:
    broker = SimpleNamespace(store=store, extensions={}, node_id=0, advertised_host="127.0.0.1",
                             advertised_port=9092, cluster_id="c1",
                             config=BrokerConfig({"auto.create.topics.enable": "false"}),
                             note_unknown_topic=lambda client_id, name, why: None, authorizer=None)
    broker.cluster = LocalMetadata(broker)
    return broker


def ctx_for(broker: Any, version: int) -> RequestContext:
    codec = codec_for(3, version)
    assert codec is not None
    return RequestContext(broker, None, RequestHeader(3, version, 7, "t"), codec)  # type: ignore[arg-type]


def answer(ctx: RequestContext, request: Any) -> EncodedBody:
    result = md.handle_metadata(ctx, request)
    if asyncio.iscoroutine(result):
        result = asyncio.run(result)
    assert isinstance(result, EncodedBody)
    return result


def request_for(version: int, names: list[str] | None) -> Any:
    cls = load_request_schema(3, version)
    fields: dict[str, Any] = {}
    if names is None:
        fields["topics"] = () if version == 0 else None
    else:
        tcls = sub(cls, "MetadataRequestTopic")
        fields["topics"] = tuple(make(tcls, name=n) for n in names)
    return make(cls, **fields)


def kio_encoding(ctx: RequestContext, topics: tuple[Any, ...]) -> bytes:
    """kio's encoding of the whole response with ``topics``, in the request's version."""
    return encode_body(to_entity(md._response(ctx, topics), ctx.response_type))


def expected(ctx: RequestContext, metas: list[Any], missing: list[str] = ()) -> bytes:  # type: ignore[assignment]
    topics = [md.topic_entity(ctx, m) for m in metas]
    topics += [MetadataResponseTopic(error_code=ErrorCode.unknown_topic_or_partition, name=n, topic_id=ZERO_UUID)
               for n in missing]
    return kio_encoding(ctx, tuple(topics))


@pytest.mark.parametrize("version", range(13))
def test_full_response_equals_kio_encoding_in_every_version(version: int) -> None:
    store = FakeStore(120, 3)  # more than one chunk: the first answer encodes asynchronously
    broker = fake_broker(store)
    ctx = ctx_for(broker, version)
    first = answer(ctx, request_for(version, None))
    assert first.body == expected(ctx, store.topics())
    again = md.handle_metadata(ctx, request_for(version, None))
    assert again is first  # cached: the same bytes, no work


@pytest.mark.parametrize("version", [1, 8, 9, 12])
def test_named_topics_and_unknown_ones(version: int) -> None:
    store = FakeStore(10, 2)
    ctx = ctx_for(fake_broker(store), version)
    got = answer(ctx, request_for(version, ["topic-3", "nope", "topic-1"]))
    # unknown topics are answered in request order, between the known ones
    entities = (md.topic_entity(ctx, store.get_topic("topic-3")),
                MetadataResponseTopic(error_code=ErrorCode.unknown_topic_or_partition, name="nope", topic_id=ZERO_UUID),
                md.topic_entity(ctx, store.get_topic("topic-1")))
    assert got.body == kio_encoding(ctx, entities)


def test_a_change_reencodes_only_what_changed() -> None:
    store = FakeStore(200, 5)
    broker = fake_broker(store)
    ctx = ctx_for(broker, 12)
    answer(ctx, request_for(12, None))
    cache = md.metadata_cache(broker)
    before = {m.name: cache.topic_bytes(ctx, m) for m in store.topics()}

    store.get_topic("topic-5").num_partitions = 7
    store.bump_metadata_version("topic-5")
    store.add("brand-new", 1)
    body = md.handle_metadata(ctx, request_for(12, None))
    assert isinstance(body, EncodedBody)  # two uncached topics: answered at once
    assert body.body == expected(ctx, store.topics())
    for m in store.topics():
        if m.name not in ("topic-5", "brand-new"):
            assert cache.topic_bytes(ctx, m) is before[m.name]


def test_deleted_topic_disappears() -> None:
    store = FakeStore(3, 1)
    broker = fake_broker(store)
    ctx = ctx_for(broker, 12)
    answer(ctx, request_for(12, None))
    del store._topics["topic-1"]
    store.bump_metadata_version("topic-1")
    assert answer(ctx, request_for(12, None)).body == expected(ctx, store.topics())


def test_large_first_build_yields_to_the_loop() -> None:
    store = FakeStore(md._CHUNK_TOPICS * 4, 1)
    ctx = ctx_for(fake_broker(store), 12)
    result = md.handle_metadata(ctx, request_for(12, None))
    assert asyncio.iscoroutine(result)
    ticks = 0

    async def run() -> EncodedBody:
        nonlocal ticks
        task = asyncio.ensure_future(result)
        while not task.done():
            ticks += 1
            await asyncio.sleep(0)
        return task.result()

    body = asyncio.run(run())
    assert ticks >= 4  # other callbacks ran between chunks
    assert body.body == expected(ctx, store.topics())


class MovingCluster:
    """Cluster metadata whose leaders change: what a ClusterNode snapshot gives."""

    clustered = True

    def __init__(self) -> None:
        self.leader = 1

    def brokers(self) -> list[BrokerEndpoint]:
        return [BrokerEndpoint(n, "127.0.0.1", 9090 + n) for n in (1, 2)]

    def controller_id(self) -> int:
        return 1

    def partition(self, topic: str, index: int) -> PartitionView:
        return PartitionView(self.leader, self.leader, (1, 2), (1, 2))


def test_cluster_leader_change_shows_once_the_version_is_bumped() -> None:
    store = FakeStore(5, 2)
    broker = fake_broker(store)
    broker.cluster = MovingCluster()
    ctx = ctx_for(broker, 12)
    first = answer(ctx, request_for(12, None))
    assert first.body == expected(ctx, store.topics())
    broker.cluster.leader = 2
    store.bump_metadata_version()  # what ClusterNode does on every new snapshot
    second = answer(ctx, request_for(12, None))
    assert second.body == expected(ctx, store.topics()) != first.body
    named = answer(ctx, request_for(12, ["topic-2"]))
    assert named.body == expected(ctx, [store.get_topic("topic-2")])
