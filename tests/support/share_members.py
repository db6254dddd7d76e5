"""Many share-group members on raw connections, driven by one asyncio loop.

``run_members(bootstrap, group, topic, n, ...)`` opens one connection per member, joins
each member to ``group`` with ShareGroupHeartbeat v1 (member epoch 0, subscribed to
``topic``), then heartbeats every member at the interval the broker answers, as a
client does, until the run ends; then every member leaves (epoch -1). A member answered
UNKNOWN_MEMBER_ID or FENCED_MEMBER_EPOCH is counted as fenced and joins again at once
with a new epoch 0, as Kafka's clients do.

The latency of a heartbeat is client side: from writing the request to reading the
whole answer (it includes this loop's own delays, which are small beside the
broker's when the broker is the bottleneck). Used by ``benchmarks/share_members.py`` and
by the integration test of a large share group.
"""

from __future__ import annotations

import asyncio
import collections
import struct
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kio.schema.errors import ErrorCode
from kio.schema.share_group_heartbeat.v1.request import ShareGroupHeartbeatRequest
from kio.schema.share_group_heartbeat.v1.response import ShareGroupHeartbeatResponse
from kio.serial import entity_reader
from kio.static.primitive import i32

from tests.support.wire import request_bytes

__all__ = ["MembersReport", "percentile", "run_members"]

_read_response = entity_reader(ShareGroupHeartbeatResponse)
_FENCED = (ErrorCode.unknown_member_id, ErrorCode.fenced_member_epoch)


@dataclass
class MembersReport:
    members: int
    joined: int = 0
    """Members whose first heartbeat was answered without error."""
    assigned: int = 0
    """Members holding a non-empty assignment at the end."""
    all_joined_s: float | None = None
    """Seconds from the start until every member joined (None: not all did)."""
    all_assigned_s: float | None = None
    """Seconds from the start until every member held a partition (None: not all did)."""
    join_latencies: list[float] = field(default_factory=list)
    """Seconds per heartbeat answered before every member held a partition."""
    steady_latencies: list[float] = field(default_factory=list)
    """Seconds per heartbeat answered afterwards."""
    fenced: int = 0
    """UNKNOWN_MEMBER_ID / FENCED_MEMBER_EPOCH answers to members that had joined."""
    errors: collections.Counter[str] = field(default_factory=collections.Counter)
    """Other error answers, by error name."""
    connect_failures: int = 0
    """Connection attempts that failed or timed out (each retried after 1 s)."""
    lost_connections: int = 0
    """Connections the broker closed, or that broke, while a member used them."""
    member_ids: list[str] = field(default_factory=list)


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(len(s) * q))]


async def _read(reader: asyncio.StreamReader) -> tuple[int, ShareGroupHeartbeatResponse]:
    (size,) = struct.unpack(">i", await reader.readexactly(4))
    body = await reader.readexactly(size)
    (cid,) = struct.unpack_from(">i", body, 0)
    value, _ = _read_response(body, 5)  # correlation id, then response header v1's empty tagged fields
    return cid, value


async def run_members(bootstrap: str, group: str, topic: str, n: int, *, steady_s: float = 10.0,
                      join_timeout_s: float = 120.0, connect_timeout_s: float = 10.0,
                      request_timeout_s: float = 60.0, ramp_s: float = 0.0,
                      before_leave: Callable[[], None] | None = None) -> MembersReport:
    """``n`` members of ``group``: join (spread over ``ramp_s`` seconds), heartbeat until every
    member holds a partition (or ``join_timeout_s`` passed), then ``steady_s`` seconds more;
    ``before_leave`` is called just before the members stop and leave."""
    host, _, port = bootstrap.rpartition(":")
    report = MembersReport(members=n)
    start = time.perf_counter()
    joined: set[int] = set()
    assigned: set[int] = set()
    all_assigned = asyncio.Event()
    stop = asyncio.Event()
    writers: list[asyncio.StreamWriter] = []

    async def sleep_or_stop(seconds: float) -> None:
        try:
            await asyncio.wait_for(stop.wait(), seconds)
        except TimeoutError:
            pass

    async def member(i: int) -> None:
        await sleep_or_stop(ramp_s * i / max(n, 1))
        member_id = str(uuid.uuid4())
        report.member_ids.append(member_id)
        epoch = 0
        cid = 0
        conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        while not stop.is_set():
            if conn is None:
                try:
                    conn = await asyncio.wait_for(asyncio.open_connection(host, int(port)), connect_timeout_s)
                except (TimeoutError, OSError):
                    report.connect_failures += 1
                    await sleep_or_stop(1.0)
                    continue
                writers.append(conn[1])
            reader, writer = conn
            cid += 1
            request = ShareGroupHeartbeatRequest(
                group_id=group, member_id=member_id, member_epoch=i32(epoch),
                subscribed_topic_names=(topic,) if epoch == 0 else None)
            sent = time.perf_counter()
            try:
                writer.write(request_bytes(request, cid, client_id=f"member-{i}"))
                got_cid, r = await asyncio.wait_for(_read(reader), request_timeout_s)
            except (TimeoutError, OSError, asyncio.IncompleteReadError):
                report.lost_connections += 1
                writer.close()
                conn = None
                continue
            latency = time.perf_counter() - sent
            assert got_cid == cid, (got_cid, cid)
            (report.steady_latencies if all_assigned.is_set() else report.join_latencies).append(latency)
            interval = max(r.heartbeat_interval.total_seconds(), 0.1)
            if r.error_code in _FENCED:
                if i in joined:
                    report.fenced += 1
                epoch = 0
                assigned.discard(i)
                continue
            if r.error_code is not ErrorCode.none:
                report.errors[r.error_code.name] += 1
                await sleep_or_stop(1.0)
                continue
            if epoch == 0 and i not in joined:
                joined.add(i)
                if len(joined) == n:
                    report.all_joined_s = time.perf_counter() - start
            epoch = int(r.member_epoch)
            if r.assignment is not None:
                if any(tp.partitions for tp in r.assignment.topic_partitions):
                    assigned.add(i)
                else:
                    assigned.discard(i)
                if len(assigned) == n and not all_assigned.is_set():
                    report.all_assigned_s = time.perf_counter() - start
                    all_assigned.set()
            await sleep_or_stop(interval)
        if conn is not None and epoch > 0:  # leave, as a closing client does
            reader, writer = conn
            try:
                writer.write(request_bytes(ShareGroupHeartbeatRequest(
                    group_id=group, member_id=member_id, member_epoch=i32(-1)), cid + 1))
                await asyncio.wait_for(_read(reader), 10)
            except (TimeoutError, OSError, asyncio.IncompleteReadError):
                pass

    tasks = [asyncio.ensure_future(member(i)) for i in range(n)]
    try:
        try:
            await asyncio.wait_for(all_assigned.wait(), join_timeout_s)
        except TimeoutError:
            pass
        await asyncio.sleep(steady_s)
        report.joined = len(joined)
        report.assigned = len(assigned)
        if before_leave is not None:
            before_leave()
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 60)
    finally:
        stop.set()
        for t in tasks:
            t.cancel()
        for w in writers:
            w.close()
    for t in tasks:
        if t.done() and not t.cancelled() and t.exception() is not None:
            raise t.exception()  # type: ignore[misc]
    return report


def summary(report: MembersReport) -> dict[str, Any]:
    """The report's figures in one flat dict (milliseconds for latencies)."""
    every = report.join_latencies + report.steady_latencies
    return {
        "joined": report.joined, "assigned": report.assigned, "all_joined_s": report.all_joined_s,
        "all_assigned_s": report.all_assigned_s,
        "p50_ms": percentile(every, 0.5) * 1e3, "p99_ms": percentile(every, 0.99) * 1e3,
        "steady_p50_ms": percentile(report.steady_latencies, 0.5) * 1e3,
        "steady_p99_ms": percentile(report.steady_latencies, 0.99) * 1e3,
        "heartbeats": len(every), "fenced": report.fenced, "connect_failures": report.connect_failures,
        "lost_connections": report.lost_connections, "errors": dict(report.errors),
    }
