"""Cluster mode: the coordinators' internal topics are replicated topics in etcd.

``__consumer_offsets`` (group coordinator), ``__share_group_state`` (share
coordinator) and ``__transaction_state`` (transaction coordinator) are created on first
need, by whichever broker needs them first: the first FindCoordinator for a group, a
share-partition key or a transactional id, or the first use of the share-state persister. Their partition count, replication factor (capped at the brokers registered
at that moment, as Kafka caps it) and configs come from the broker keys below; a
concurrent creation by another broker is fine (the topic then exists).

Single broker: nothing here runs; each coordinator runtime creates its topic locally.
"""

from __future__ import annotations

import logging
from typing import Any

from ..errors import ApiError, ErrorCode

__all__ = ["OFFSETS_TOPIC", "SHARE_STATE_TOPIC", "TRANSACTION_STATE_TOPIC", "ensure_internal_topic",
           "internal_topic_spec"]

log = logging.getLogger("shoal.cluster")

OFFSETS_TOPIC = "__consumer_offsets"
SHARE_STATE_TOPIC = "__share_group_state"
TRANSACTION_STATE_TOPIC = "__transaction_state"


def internal_topic_spec(config: Any, topic: str, live_brokers: int) -> tuple[int, int, dict[str, str]]:
    """(partitions, replication factor, topic configs) of an internal topic created now."""
    if topic == OFFSETS_TOPIC:
        rf = max(1, min(int(config["offsets.topic.replication.factor"]), live_brokers))
        return (int(config["offsets.topic.num.partitions"]), rf,
                {"cleanup.policy": "compact", "segment.bytes": str(config["offsets.topic.segment.bytes"])})
    if topic == SHARE_STATE_TOPIC:
        rf = max(1, min(int(config["share.coordinator.state.topic.replication.factor"]), live_brokers))
        min_isr = max(1, min(int(config["share.coordinator.state.topic.min.isr"]), rf))
        # Updates of one share-partition share a record key: never compacted, pruned by
        # the share service below each key's last snapshot instead.
        return (int(config["share.coordinator.state.topic.num.partitions"]), rf,
                {"cleanup.policy": "delete", "retention.ms": "-1", "min.insync.replicas": str(min_isr),
                 "segment.bytes": str(config["share.coordinator.state.topic.segment.bytes"])})
    if topic == TRANSACTION_STATE_TOPIC:
        rf = max(1, min(int(config["transaction.state.log.replication.factor"]), live_brokers))
        min_isr = max(1, min(int(config["transaction.state.log.min.isr"]), rf))
        return (int(config["transaction.state.log.num.partitions"]), rf,
                {"cleanup.policy": "compact", "min.insync.replicas": str(min_isr),
                 "segment.bytes": str(config["transaction.state.log.segment.bytes"])})
    raise ValueError(f"{topic} is not an internal topic")


async def ensure_internal_topic(broker: Any, topic: str) -> bool:
    """Create ``topic`` in the cluster metadata if it is missing; whether it exists now."""
    node = broker.cluster
    if topic in node.store.snapshot.topics:
        return True
    partitions, rf, configs = internal_topic_spec(broker.config, topic, len(node.brokers()))
    try:
        await node.create_topic(topic, partitions, rf, configs, None, validate_only=False)
        log.info("created %s: %d partition(s), replication factor %d", topic, partitions, rf)
    except ApiError as e:
        if e.error_code != ErrorCode.topic_already_exists:
            log.warning("cannot create %s: %s", topic, e)
            return False
    except Exception as e:
        log.warning("cannot create %s: %s", topic, e)
        return False
    return topic in node.store.snapshot.topics
