"""KIP-951 leader hints for Produce (v10+) and Fetch (v16+) in cluster mode.

A partition answered with NOT_LEADER_OR_FOLLOWER carries the current leader and its
epoch, and the response lists that leader's endpoint, so the client retries at the right
broker without a Metadata round trip first.

``current_leader`` and ``leader_endpoints`` give the facts as plain values, for a handler
that builds its answer from response views; ``leader_hints`` fills them into the result
fields of a handler that builds the version's entities itself.
"""

from __future__ import annotations

from collections.abc import Iterable, MutableMapping
from typing import NamedTuple

from ...cluster.metadata import ClusterMetadata
from ...errors import ErrorCode
from ...protocol.entities import has_field, make, sub
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


def leader_hints(cluster: ClusterMetadata, cls: type, pcls: type,
                 items: Iterable[tuple[str, int, MutableMapping[str, object]]]) -> tuple[object, ...]:
    """Set ``current_leader`` in each NOT_LEADER_OR_FOLLOWER result of ``items`` ((topic, partition, result)).

    ``cls``/``pcls``: the response's class and its partition result's class (the version's
    entities, or the response views). Returns the endpoints of the leaders named, for the
    response's ``node_endpoints``; () when the response version has no such fields (Fetch
    v12-v15 has ``current_leader`` but no ``node_endpoints``).
    """
    if not has_field(pcls, "current_leader"):
        return ()
    lcls = sub(cls, "LeaderIdAndEpoch")
    leaders: set[int] = set()
    for topic, index, r in items:
        if r.get("error_code") == ErrorCode.not_leader_or_follower:
            leader = current_leader(cluster, topic, index)
            if leader is not None:
                r["current_leader"] = make(lcls, leader_id=leader[0], leader_epoch=leader[1])
                leaders.add(leader[0])
    if not leaders or not has_field(cls, "node_endpoints"):  # Fetch v12-v15: current_leader, no endpoints
        return ()
    ecls = sub(cls, "NodeEndpoint")
    return tuple(make(ecls, node_id=e.node_id, host=e.host, port=e.port, rack=e.rack)
                 for e in leader_endpoints(cluster, leaders))
