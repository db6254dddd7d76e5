"""A share group of several hundred members on one broker: every member joins and holds a
partition, and none is fenced while it heartbeats.

The members are raw ShareGroupHeartbeat clients on their own connections, driven by one
asyncio loop (``tests/support/share_members.py``), heartbeating at the interval the broker
answers. The group's heartbeat interval is 1 s here (5 s by default) so that a short run
sees many rounds of heartbeats, and its session timeout 8 s, so that heartbeats queued for
longer than that by a broker that cannot keep up show as members removed.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable

from kio.schema.errors import ErrorCode
from kio.schema.share_group_describe.v1.request import ShareGroupDescribeRequest

from tests.support.broker import BrokerProcess
from tests.support.clients import create_topic
from tests.support.share_members import run_members, summary
from tests.support.wire import RawConnection

MEMBERS = 400


def test_hundreds_of_members_join_and_none_is_fenced(start_broker: Callable[..., BrokerProcess],
                                                      topic_name: str) -> None:
    b = start_broker({"group.share.max.size": "1000",
                      "group.share.heartbeat.interval.ms": "1000", "group.share.min.heartbeat.interval.ms": "1000",
                      "group.share.session.timeout.ms": "8000", "group.share.min.session.timeout.ms": "8000"})
    create_topic(b.bootstrap, topic_name, partitions=8)
    group = f"scale-{uuid.uuid4().hex[:8]}"
    described: list[object] = []

    def describe() -> None:  # while every member still heartbeats
        with RawConnection(b.bootstrap) as conn:
            r = conn.request(ShareGroupDescribeRequest(group_ids=(group,), include_authorized_operations=False))
        described.append(r.groups[0])

    report = asyncio.run(run_members(b.bootstrap, group, topic_name, MEMBERS, steady_s=4, join_timeout_s=15,
                                     before_leave=describe))
    s = summary(report)
    assert (s["joined"], s["assigned"]) == (MEMBERS, MEMBERS), s
    assert (s["fenced"], s["connect_failures"], s["lost_connections"], s["errors"]) == (0, 0, 0, {}), s
    assert report.steady_latencies, s
    g = described[0]
    assert g.error_code == ErrorCode.none  # type: ignore[attr-defined]
    members = g.members  # type: ignore[attr-defined]
    # Nobody was removed for a session timeout: the group holds exactly the members that
    # joined, each with a partition of the topic's eight.
    assert {m.member_id for m in members} == set(report.member_ids)
    assert all(len(m.assignment.topic_partitions) == 1 and len(m.assignment.topic_partitions[0].partitions) == 1
               for m in members)
    holders: dict[int, int] = {}
    for m in members:
        p = m.assignment.topic_partitions[0].partitions[0]
        holders[p] = holders.get(p, 0) + 1
    assert sorted(holders) == list(range(8)) and max(holders.values()) - min(holders.values()) <= 1, holders
