"""Where a cluster's partitions and groups live, and one connection per broker to reach them.

:class:`Brokers` starts from a bootstrap list (``host:port,host:port``), learns the
brokers and the leader of each partition from Metadata, and a group's coordinator from
FindCoordinator (key type GROUP), as Kafka clients do. It keeps one
:class:`~shoal.client.connection.Connection` per broker, reopened after a failure. A
leader or coordinator that moved shows up as an error code (NOT_LEADER_OR_FOLLOWER,
NOT_COORDINATOR, ...) or a broken connection: the caller then calls :meth:`Brokers.refresh`
or :meth:`Brokers.forget_coordinator` and asks again. On a single broker every role is
that broker and everything goes over one connection.

Synchronous, for one thread at a time (callers that share it hold :attr:`Brokers.lock`).
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterable
from typing import Any

from kio.schema.errors import ErrorCode

from ..protocol.entities import make, sub
from .connection import Connection, KafkaProtocolError

__all__ = ["COORDINATOR_MOVED", "LEADER_MOVED", "Brokers", "TopicInfo"]

METADATA = 3
FIND_COORDINATOR = 10

COORDINATOR_MOVED = frozenset({ErrorCode.not_coordinator, ErrorCode.coordinator_not_available,
                               ErrorCode.coordinator_load_in_progress})
"""Answers of a broker that is not (or not yet) the group's coordinator: find it again."""
LEADER_MOVED = frozenset({ErrorCode.not_leader_or_follower, ErrorCode.fenced_leader_epoch,
                          ErrorCode.leader_not_available, ErrorCode.unknown_topic_or_partition,
                          ErrorCode.unknown_topic_id})
"""Per-partition answers of a broker that does not lead the partition (any more): ask Metadata again."""


class TopicInfo:
    """A topic's id, partition count and the node id of each partition's leader (-1: none)."""

    __slots__ = ("leaders", "name", "partitions", "topic_id")

    def __init__(self, name: str, topic_id: uuid.UUID, leaders: list[int]) -> None:
        self.name = name
        self.topic_id = topic_id
        self.partitions = len(leaders)
        self.leaders = leaders

    def __repr__(self) -> str:
        return f"TopicInfo({self.name!r}, {self.topic_id}, leaders={self.leaders})"


def _addresses(bootstrap: str) -> list[tuple[str, int]]:
    out = []
    for item in bootstrap.split(","):
        item = item.strip().split("://")[-1]
        if not item:
            continue
        host, _, port = item.rpartition(":")
        out.append((host or "127.0.0.1", int(port or 9092)))
    return out


class Brokers:
    """Connections to the brokers of one cluster, by node id; see the module docstring."""

    def __init__(self, bootstrap: str, *, client_id: str = "shoal-client", timeout_s: float = 30.0) -> None:
        self.bootstrap = _addresses(bootstrap)
        if not self.bootstrap:
            raise ValueError(f"no broker address in {bootstrap!r}")
        self.client_id = client_id
        self.timeout_s = timeout_s
        self.lock = threading.RLock()
        self.nodes: dict[int, tuple[str, int]] = {}  # node id -> (host, port), from Metadata
        self.topics: dict[str, TopicInfo] = {}
        self._conns: dict[tuple[str, int], Connection] = {}
        self._coordinator: dict[str, int] = {}  # group -> node id

    # -- connections -----------------------------------------------------------------------
    def _open(self, address: tuple[str, int]) -> Connection:
        conn = self._conns.get(address)
        if conn is not None and conn.connected:
            return conn
        conn = Connection(address[0], address[1], client_id=self.client_id, timeout_s=self.timeout_s)
        conn.connect()
        self._conns[address] = conn
        return conn

    def any(self) -> Connection:
        """A connection to some broker that answers: one already open, else the known ones and
        the bootstrap list in turn. Raises the last OSError when none answers."""
        for conn in self._conns.values():
            if conn.connected:
                return conn
        last: BaseException | None = None
        for address in [*self.nodes.values(), *self.bootstrap]:
            try:
                return self._open(address)
            except (OSError, ConnectionError) as e:
                last = e
        raise ConnectionError(f"no broker answers ({last})")

    def to(self, node: int) -> Connection:
        """A connection to broker ``node`` (learnt from Metadata; refreshed once if unknown)."""
        if node not in self.nodes:
            self.refresh()
        address = self.nodes.get(node)
        if address is None:
            raise ConnectionError(f"broker {node} is not in the cluster's metadata")
        return self._open(address)

    def close(self) -> None:
        for conn in self._conns.values():
            conn.close()
        self._conns.clear()

    # -- metadata ------------------------------------------------------------------------
    def refresh(self, topics: Iterable[str] | None = None) -> dict[str, TopicInfo]:
        """Metadata for ``topics`` (None: the topics asked for last time, or none): the
        brokers, and each partition's leader. Unknown topics are left out."""
        names = list(topics) if topics is not None else list(self.topics)
        conn = self.any()
        try:
            resp = self._metadata(conn, names)
        except (OSError, ConnectionError):
            resp = self._metadata(self.any(), names)  # that broker just went: another one
        self.nodes = {int(b.node_id): (b.host, int(b.port)) for b in resp.brokers}
        out = {}
        for t in resp.topics:
            if t.error_code != ErrorCode.none or t.name is None:
                continue
            leaders = [-1] * len(t.partitions)
            for p in t.partitions:
                if 0 <= int(p.partition_index) < len(leaders):
                    leaders[int(p.partition_index)] = int(p.leader_id)
            out[t.name] = TopicInfo(t.name, t.topic_id, leaders)
        if names:
            self.topics = out
        return out

    @staticmethod
    def _metadata(conn: Connection, names: list[str]) -> Any:
        v = conn.version_for(METADATA, 10, 12)
        req_type = conn.request_type(METADATA, v)
        topic_cls = sub(req_type, "MetadataRequestTopic")
        wanted = tuple(make(topic_cls, name=t, topic_id=uuid.UUID(int=0)) for t in names)
        return conn.send(make(req_type, topics=wanted, allow_auto_topic_creation=False))

    def leader(self, topic_id: uuid.UUID, partition: int) -> int:
        """The leader of a partition as last learnt (-1: unknown)."""
        for info in self.topics.values():
            if info.topic_id == topic_id:
                return info.leaders[partition] if 0 <= partition < info.partitions else -1
        return -1

    # -- group coordinator -----------------------------------------------------------------
    def coordinator(self, group: str) -> Connection:
        """A connection to ``group``'s coordinator (FindCoordinator, remembered until
        :meth:`forget_coordinator`). Raises KafkaProtocolError with the code FindCoordinator answered."""
        node = self.coordinator_node(group)
        try:
            return self._open(self.nodes[node])
        except (OSError, ConnectionError):
            self._coordinator.pop(group, None)
            raise

    def coordinator_node(self, group: str) -> int:
        """The node id of ``group``'s coordinator (FindCoordinator, remembered)."""
        node = self._coordinator.get(group)
        if node is None:
            conn = self.any()
            v = conn.version_for(FIND_COORDINATOR, 0, 6)
            if v >= 4:
                c = conn.call(FIND_COORDINATOR, v, key_type=0, coordinator_keys=(group,)).coordinators[0]
            else:
                c = conn.call(FIND_COORDINATOR, v, key=group, key_type=0)
            if c.error_code != ErrorCode.none:
                raise KafkaProtocolError(c.error_code, f"FindCoordinator {group}")
            node = int(c.node_id)
            self.nodes[node] = (c.host, int(c.port))
            self._coordinator[group] = node
        return node

    def forget_coordinator(self, group: str) -> None:
        self._coordinator.pop(group, None)
