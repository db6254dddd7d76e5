"""Scripted raw request sequences for Apache Kafka's broker and for shoal, side by side.

A scenario is a function of a :class:`Side` (one broker) returning a list of
``(step name, response)`` pairs; :func:`normalize` turns a kio response into plain data
without the fields that legitimately differ between two brokers (ids, timestamps,
throttle times, addresses, record bytes, error messages), so that the two lists can be
compared field by field.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import uuid
from collections.abc import Callable
from typing import Any

from shoal.client.connection import Connection
from shoal.protocol.entities import make, sub

__all__ = ["IGNORED", "Side", "normalize"]

# Fields whose values differ between two correct brokers (member ids: each side gets its own).
IGNORED = frozenset({
    "throttle_time", "error_message", "topic_id", "node_id", "host", "port", "leader_id", "leader_epoch",
    "node_endpoints", "records", "current_leader", "rack", "cluster_id", "controller_id", "coordinator_key",
    "member_id", "acquisition_lock_timeout", "create_timestamp", "write_timestamp", "log_start_offset",
    "last_stable_offset",
})


def normalize(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: normalize(getattr(value, f.name)) for f in dataclasses.fields(value)
                if f.name not in IGNORED}
    if isinstance(value, (tuple, list)):
        items = [normalize(v) for v in value]
        if items and all(isinstance(v, dict) and "partition_index" in v for v in items):
            items.sort(key=lambda v: v["partition_index"])  # the order of partitions carries no meaning
        return items
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, uuid.UUID):
        return "<uuid>"
    if isinstance(value, datetime.timedelta):
        return int(value.total_seconds() * 1000)
    if isinstance(value, datetime.datetime):
        return "<time>"
    return value


class Side:
    """One broker: connections to it and the ids of its topics."""

    def __init__(self, name: str, bootstrap: str) -> None:
        self.name = name
        self.bootstrap = bootstrap
        self._conns: list[Connection] = []

    def connect(self) -> Connection:
        c = Connection.to(self.bootstrap)
        self._conns.append(c)
        return c

    def close(self) -> None:
        for c in self._conns:
            c.close()
        self._conns.clear()

    def topic_id(self, conn: Connection, topic: str) -> uuid.UUID:
        req = conn.request_type(3, 12)
        md = conn.send(make(req, topics=(make(sub(req, "MetadataRequestTopic"), name=topic),),
                            allow_auto_topic_creation=False))
        [t] = md.topics
        return t.topic_id


Scenario = Callable[[Side], list[tuple[str, Any]]]
