"""Metadata (key 3), v0-v12.

One broker (local metadata): it leads every partition of every topic. Cluster mode: every
live broker, and each partition's leader, leader epoch, replicas, ISR and offline replicas
from the cluster metadata (LEADER_NOT_AVAILABLE for a partition without a leader).
"""

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
                topic_authorized_operations=-2147483648)


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
    return tuple(make(cls, node_id=b.node_id, host=b.host, port=b.port, rack=b.rack) for b in cluster.brokers())


def _not_created_reason(broker: Any, request: Any, name: str) -> str:
    if name in INTERNAL_TOPICS:
        return "internal topics are created by their coordinator"
    if not broker.config["auto.create.topics.enable"]:
        return "auto.create.topics.enable=false"
    if broker.cluster.clustered:
        return "a cluster does not create topics automatically yet"
    return "the client's Metadata request does not allow auto-creation"


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
            if meta is None and auto and name not in INTERNAL_TOPICS and not broker.cluster.clustered:
                try:
                    meta = broker.create_topic(name, broker.config["num.partitions"], {})
                except ApiError as e:
                    topics.append(make(tcls, error_code=e.error_code, name=name, topic_id=ZERO_UUID))
                    continue
            if meta is None:
                if name is not None:
                    broker.note_unknown_topic(ctx.header.client_id, name, _not_created_reason(broker, request, name))
                topics.append(make(tcls, error_code=ErrorCode.unknown_topic_or_partition, name=name,
                                   topic_id=ZERO_UUID))
            else:
                topics.append(topic_entity(ctx, tcls, meta))
    fields: dict[str, Any] = dict(
        throttle_time=0,
        brokers=_brokers(ctx, sub(cls, "MetadataResponseBroker")),
        cluster_id=broker.cluster_id,
        controller_id=broker.cluster.controller_id(),
        topics=tuple(topics),
    )
    if has_field(cls, "cluster_authorized_operations"):
        fields["cluster_authorized_operations"] = -2147483648
    return make(cls, **fields)
