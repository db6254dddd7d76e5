"""The metadata interface the handlers use, and the local store (pure).

Two stores answer it:

* :class:`LocalMetadata` (the default, ``metadata.store=local``): this broker is the whole
  cluster. Topics and configs are the files in its data directory (the log store), it
  leads every partition at epoch 0 and is every coordinator. Nothing else runs, so a
  single broker behaves and performs as it always did.
* ``ClusterNode`` (``shoal/cluster/node.py``, ``metadata.store=etcd://...``): brokers,
  controller and partition leadership from etcd.

Both give :class:`BrokerEndpoint` and :class:`PartitionView` values; handlers never ask
which store answered except where cluster mode changes what a request does (replication:
``broker.replicas`` is None in local mode).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

__all__ = ["BrokerEndpoint", "ClusterMetadata", "LocalMetadata", "PartitionView"]


@dataclass(frozen=True, slots=True)
class BrokerEndpoint:
    node_id: int
    host: str
    port: int
    rack: str | None = None
    listeners: tuple[tuple[str, str, int], ...] = ()
    """(listener name, host, port) of every listener, for clients (shoal/security/serving.py);
    ``host``/``port`` are the inter-broker listener's."""


@dataclass(frozen=True, slots=True)
class PartitionView:
    leader: int
    leader_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    offline: tuple[int, ...] = ()


class ClusterMetadata(Protocol):
    clustered: bool

    def brokers(self) -> list[BrokerEndpoint]:
        """Every live broker."""

    def controller_id(self) -> int:
        """The active controller's node id (-1 when none)."""

    def partition(self, topic: str, index: int) -> PartitionView | None:
        """Leadership of one partition; None when unknown."""

    def coordinator(self) -> BrokerEndpoint | None:
        """The broker that serves group and share coordinator requests."""


class LocalMetadata:
    """One broker: it leads everything, at leader epoch 0."""

    clustered = False

    def __init__(self, broker: Any) -> None:
        self._broker = broker

    def _me(self) -> BrokerEndpoint:
        b = self._broker
        sec = getattr(b, "security", None)
        listeners = tuple((n, h, p) for n, (h, p) in sec.advertised.items()) if sec is not None else ()
        return BrokerEndpoint(b.node_id, b.advertised_host, b.advertised_port, None, listeners)

    def brokers(self) -> list[BrokerEndpoint]:
        return [self._me()]

    def controller_id(self) -> int:
        return self._broker.node_id

    def partition(self, topic: str, index: int) -> PartitionView | None:
        node = self._broker.node_id
        return PartitionView(node, 0, (node,), (node,))

    def coordinator(self) -> BrokerEndpoint | None:
        return self._me()
