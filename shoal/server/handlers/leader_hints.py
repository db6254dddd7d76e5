"""KIP-951 leader hints for Produce (v10+) and Fetch (v16+) in cluster mode.

A partition answered with NOT_LEADER_OR_FOLLOWER carries the current leader and its
epoch, and the response lists that leader's endpoint, so the client retries at the right
broker without a Metadata round trip first.

``current_leader`` and ``leader_endpoints`` give the facts as plain values; each handler
puts them into its own response views.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from ...cluster.metadata import ClusterMetadata
from ...security.serving import endpoint_on_request_listener


class LeaderEndpoint(NamedTuple):
    """A partition leader's endpoint on the listener of the request being answered."""

    node_id: int
    host: str
    port: int
    rack: str | None


def current_leader(cluster: ClusterMetadata, topic: str, index: int) -> tuple[int, int] | None:
    """(leader id, leader epoch) of a partition with a live leader, else None."""
    view = cluster.partition(topic, index)
    if view is None or view.leader < 0:
        return None
    return view.leader, view.leader_epoch


def leader_endpoints(cluster: ClusterMetadata, leaders: Iterable[int]) -> tuple[LeaderEndpoint, ...]:
    """The endpoints of brokers ``leaders`` on the client's listener (those that have one there)."""
    wanted = set(leaders)
    out = []
    for b in cluster.brokers():
        hp = endpoint_on_request_listener(b) if b.node_id in wanted else None
        if hp is not None:
            out.append(LeaderEndpoint(b.node_id, hp[0], hp[1], b.rack))
    return tuple(out)
