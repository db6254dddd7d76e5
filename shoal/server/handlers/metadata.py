"""Metadata (key 3), v0-v12: this broker leads every partition of every topic."""

from __future__ import annotations

from typing import Any

from ...errors import ApiError, ErrorCode
from ...protocol.entities import ZERO_UUID, has_field, make, sub
from ..dispatch import api

INTERNAL_TOPICS = frozenset({"__consumer_offsets", "__share_group_state"})


def broker_entity(ctx: Any, cls: type) -> Any:
    b = ctx.broker
    return make(cls, node_id=b.node_id, host=b.advertised_host, port=b.advertised_port, rack=None)


def topic_entity(ctx: Any, cls: type, meta: Any) -> Any:
    pcls = sub(cls, "MetadataResponsePartition")
    node = ctx.broker.node_id
    partitions = tuple(
        make(pcls, error_code=ErrorCode.none, partition_index=i, leader_id=node, leader_epoch=0,
             replica_nodes=(node,), isr_nodes=(node,), offline_replicas=())
        for i in range(meta.num_partitions)
    )
    return make(cls, error_code=ErrorCode.none, name=meta.name, topic_id=meta.topic_id,
                is_internal=meta.name in INTERNAL_TOPICS, partitions=partitions,
                topic_authorized_operations=-2147483648)


@api(3, 0, 12)
def handle_metadata(ctx: Any, request: Any) -> Any:
    broker = ctx.broker
    store = broker.store
    cls = ctx.response_type
    tcls = sub(cls, "MetadataResponseTopic")
    topics: list[Any] = []
    requested = request.topics
    if requested is None or (ctx.api_version == 0 and not requested):
        topics = [topic_entity(ctx, tcls, m) for m in store.topics()]
    else:
        auto = broker.config["auto.create.topics.enable"] and getattr(request, "allow_auto_topic_creation", True)
        for t in requested:
            name = getattr(t, "name", t) if not isinstance(t, str) else t
            topic_id = getattr(t, "topic_id", None)
            meta = None
            if name is None and topic_id not in (None, ZERO_UUID):
                meta = store.topic_by_id(topic_id)
                if meta is None:
                    topics.append(make(tcls, error_code=ErrorCode.unknown_topic_id, name=None, topic_id=topic_id))
                    continue
            else:
                meta = store.get_topic(name)
            if meta is None and auto and name not in INTERNAL_TOPICS:
                try:
                    meta = broker.create_topic(name, broker.config["num.partitions"], {})
                except ApiError as e:
                    topics.append(make(tcls, error_code=e.error_code, name=name, topic_id=ZERO_UUID))
                    continue
            if meta is None:
                topics.append(make(tcls, error_code=ErrorCode.unknown_topic_or_partition, name=name,
                                   topic_id=ZERO_UUID))
            else:
                topics.append(topic_entity(ctx, tcls, meta))
    fields: dict[str, Any] = dict(
        throttle_time=0,
        brokers=(broker_entity(ctx, sub(cls, "MetadataResponseBroker")),),
        cluster_id=broker.cluster_id,
        controller_id=broker.node_id,
        topics=tuple(topics),
    )
    if has_field(cls, "cluster_authorized_operations"):
        fields["cluster_authorized_operations"] = -2147483648
    return make(cls, **fields)
