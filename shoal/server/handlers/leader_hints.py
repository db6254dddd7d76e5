"""KIP-951 leader hints for Produce (v10+) and Fetch (v16+) in cluster mode.

A partition answered with NOT_LEADER_OR_FOLLOWER carries the current leader and its
epoch, and the response lists that leader's endpoint, so the client retries at the right
broker without a Metadata round trip first.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ...errors import ErrorCode
from ...protocol.entities import has_field, make, sub
from ...security.serving import endpoint_on_request_listener


def leader_hints(cluster: Any, cls: type, pcls: type, items: Iterable[tuple[str, int, dict[str, Any]]]) -> tuple[Any, ...]:
    """Set ``current_leader`` in each NOT_LEADER_OR_FOLLOWER result of ``items`` ((topic, partition, result)).

    Returns the endpoints of the leaders named, for the response's ``node_endpoints``;
    () when the response version has no such fields (Fetch v12-v15 has ``current_leader``
    but no ``node_endpoints``).
    """
    if not has_field(pcls, "current_leader"):
        return ()
    lcls = sub(cls, "LeaderIdAndEpoch")
    leaders: set[int] = set()
    for topic, index, r in items:
        if r.get("error_code") == ErrorCode.not_leader_or_follower:
            view = cluster.partition(topic, index)
            if view is not None and view.leader >= 0:
                r["current_leader"] = make(lcls, leader_id=view.leader, leader_epoch=view.leader_epoch)
                leaders.add(view.leader)
    if not leaders or not has_field(cls, "node_endpoints"):  # Fetch v12-v15: current_leader, no endpoints
        return ()
    ecls = sub(cls, "NodeEndpoint")
    out = []
    for b in cluster.brokers():
        hp = endpoint_on_request_listener(b) if b.node_id in leaders else None  # the client's listener
        if hp is not None:
            out.append(make(ecls, node_id=b.node_id, host=hp[0], port=hp[1], rack=b.rack))
    return tuple(out)
