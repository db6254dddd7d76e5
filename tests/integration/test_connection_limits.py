"""Connection limits, idle connections and request memory, against a real ``shoal serve``.

Small counts and short timeouts; benchmarks/connection_limits.py runs the full-size
scenario (1,000 idle connections, 500 peers sending most of a 100 MiB frame) and prints
the broker's RSS.
"""

from __future__ import annotations

import os
import resource
import socket
import struct
import time
from collections.abc import Callable, Iterator

import pytest
from kio.schema.api_versions.v3.request import ApiVersionsRequest
from kio.schema.metadata.v12.request import MetadataRequest, MetadataRequestTopic

from shoal.client.connection import Connection
from shoal.client.share import ShareMembership, ShareSession, topic_metadata
from tests.integration.test_share_consumer import set_group_configs
from tests.support.broker import BrokerProcess
from tests.support.clients import create_topic, producer, wait_until
from tests.support.wire import RawConnection, request_bytes

pytestmark = pytest.mark.integration

API_VERSIONS = ApiVersionsRequest(client_software_name="t", client_software_version="1")


def answers(c: RawConnection, cid: int = 1, timeout_s: float = 5.0) -> bool:
    """Whether ApiVersions is answered on ``c`` within ``timeout_s``."""
    c.sock.settimeout(timeout_s)
    try:
        c.send(request_bytes(API_VERSIONS, cid))
        got, resp = c.read_response(18, 3)
    except (OSError, AssertionError):
        return False
    return got == cid and resp.error_code == 0


@pytest.fixture
def raw(start_broker: Callable[..., BrokerProcess]) -> Iterator[Callable[[BrokerProcess], RawConnection]]:
    opened: list[RawConnection] = []

    def connect(b: BrokerProcess) -> RawConnection:
        c = RawConnection(b.bootstrap)
        opened.append(c)
        return c

    yield connect
    for c in opened:
        c.close()


def produce_some(bootstrap: str, topic: str, n: int = 20) -> None:
    p = producer(bootstrap, **{"message.timeout.ms": 20000})
    for i in range(n):
        p.produce(topic, b"v%d" % i)
    assert p.flush(25) == 0


# -- connections.max.idle.ms ------------------------------------------------------------


def test_idle_connection_is_closed_and_an_active_one_is_not(start_broker, raw) -> None:
    b = start_broker({"connections.max.idle.ms": "800"})
    idle, busy = raw(b), raw(b)
    assert answers(idle) and answers(busy)
    deadline = time.monotonic() + 2.5
    cid = 1
    while time.monotonic() < deadline:
        cid += 1
        assert answers(busy, cid), "a connection sending requests every 200 ms was closed"
        time.sleep(0.2)
    assert idle.is_closed_by_peer(timeout_s=2.0)
    assert "idle for" in b.stderr_tail(200)


def test_idle_close_of_a_share_consumer_releases_its_records(start_broker, topic_name) -> None:
    # Records stay locked for 60 s unless the member's share session is released: only the
    # disconnect path releases them within this test's time.
    b = start_broker({"connections.max.idle.ms": "1000", "group.share.record.lock.duration.ms": "60000"})
    create_topic(b.bootstrap, topic_name)
    set_group_configs(b.bootstrap, "g-idle", share_auto_offset_reset="earliest")
    produce_some(b.bootstrap, topic_name, 3)
    hb = Connection.to(b.bootstrap)
    fetch_conn = Connection.to(b.bootstrap)
    try:
        member = ShareMembership("g-idle", topics=(topic_name,))
        tid = topic_metadata(hb, [topic_name])[topic_name].topic_id
        wait_until("an assignment", lambda: member.heartbeat(hb) and member.assignment.get(tid), 15)
        session = ShareSession(fetch_conn, "g-idle", member.member_id)
        got: list[int] = []

        def fetched() -> bool:
            got.extend(r.delivery_count for r in session.fetch([(tid, 0)], max_wait_ms=200).records)
            return len(got) >= 3

        wait_until("three records acquired", fetched, 15)
        assert got == [1, 1, 1]
        # The fetch connection now stays idle; the member keeps heartbeating on its other one.
        deadline = time.monotonic() + 2.5
        while time.monotonic() < deadline:
            member.heartbeat(hb)
            time.sleep(0.3)
        with pytest.raises(OSError):
            session.fetch([(tid, 0)], max_wait_ms=0)
        again = Connection.to(b.bootstrap)
        try:
            session2 = ShareSession(again, "g-idle", member.member_id)
            counts: list[int] = []

            def refetched() -> bool:
                member.heartbeat(hb)
                counts.extend(r.delivery_count for r in session2.fetch([(tid, 0)], max_wait_ms=200).records)
                return len(counts) >= 3

            wait_until("the released records delivered again", refetched, 15)
            assert counts == [2, 2, 2]
        finally:
            again.close()
    finally:
        hb.close()
        fetch_conn.close()


# -- max.connections and max.connections.per.ip ----------------------------------------


def test_per_ip_limit_closes_the_extra_connection(start_broker, raw) -> None:
    b = start_broker({"max.connections.per.ip": "3"})
    first = [raw(b) for _ in range(3)]
    assert all(answers(c) for c in first)
    extra = raw(b)
    assert extra.is_closed_by_peer(timeout_s=5.0)
    first[0].close()
    # the slot frees once the broker has seen the close
    wait_until("a new connection is served", lambda: answers(raw(b), timeout_s=1.0), 10)
    assert "max.connections.per.ip" in b.stderr_tail(200)


def test_per_ip_override_for_this_address(start_broker, raw) -> None:
    b = start_broker({"max.connections.per.ip": "1", "max.connections.per.ip.overrides": "127.0.0.1:2"})
    a, c = raw(b), raw(b)
    assert answers(a) and answers(c)
    assert raw(b).is_closed_by_peer(timeout_s=5.0)


def test_max_connections_makes_new_ones_wait_for_a_free_slot(start_broker, raw) -> None:
    b = start_broker({"max.connections": "2"})
    a, c = raw(b), raw(b)
    assert answers(a) and answers(c)
    waiting = raw(b)  # accepted by the kernel's backlog, not yet by the broker
    waiting.send(request_bytes(API_VERSIONS, 7))
    waiting.sock.settimeout(1.0)
    with pytest.raises(socket.timeout):
        waiting.sock.recv(1)
    a.close()
    waiting.sock.settimeout(10.0)
    cid, resp = waiting.read_response(18, 3)
    assert cid == 7 and resp.error_code == 0


# -- queued.max.request.bytes -----------------------------------------------------------


def metadata_request_of_size(target: int, cid: int) -> bytes:
    """A valid Metadata request naming made-up topics, about ``target`` bytes long."""
    n = max(1, target // 200)
    topics = tuple(MetadataRequestTopic(topic_id=None, name="n" * 190 + "%08d" % i) for i in range(n))
    return request_bytes(MetadataRequest(topics=topics, allow_auto_topic_creation=False,
                                         include_topic_authorized_operations=False), cid)


def test_connection_waits_for_request_memory_and_small_requests_keep_flowing(start_broker, raw, topic_name) -> None:
    b = start_broker({"queued.max.request.bytes": str(1 << 20), "connections.max.idle.ms": "60000"})
    create_topic(b.bootstrap, topic_name)
    holder, waiter = raw(b), raw(b)
    big = metadata_request_of_size(700_000, 5)
    # holder announces a 700 kB frame and sends most of it: it holds 700 kB of the 1 MiB pool
    holder.send(big[: len(big) * 9 // 10])
    time.sleep(0.3)
    # waiter's 700 kB request does not fit beside it: the connection waits, unanswered
    waiter.send(metadata_request_of_size(700_000, 9))
    waiter.sock.settimeout(1.0)
    with pytest.raises(socket.timeout):
        waiter.sock.recv(1)
    # meanwhile small requests on other connections, and a producer, are served
    assert answers(raw(b))
    produce_some(b.bootstrap, topic_name)
    # the holder finishes its frame: it is answered, its memory returns, the waiter goes on
    holder.send(big[len(big) * 9 // 10 :])
    holder.sock.settimeout(10.0)
    assert holder.read_response(3, 12)[0] == 5
    waiter.sock.settimeout(10.0)
    assert waiter.read_response(3, 12)[0] == 9


def test_stalled_frame_and_muted_connection_are_closed_as_idle(start_broker, raw, topic_name) -> None:
    b = start_broker({"queued.max.request.bytes": str(1 << 20), "connections.max.idle.ms": "1000"})
    create_topic(b.bootstrap, topic_name)
    stalled, muted = raw(b), raw(b)
    big = metadata_request_of_size(700_000, 5)
    stalled.send(big[: len(big) // 2])
    time.sleep(0.2)
    muted.send(struct.pack(">i", 700_000) + b"\x00" * 1000)
    assert stalled.is_closed_by_peer(timeout_s=5.0)
    assert muted.is_closed_by_peer(timeout_s=5.0)
    # the pool is whole again: a 700 kB request is answered at once
    fresh = raw(b)
    fresh.send(metadata_request_of_size(700_000, 3))
    fresh.sock.settimeout(10.0)
    assert fresh.read_response(3, 12)[0] == 3
    produce_some(b.bootstrap, topic_name)


# -- running out of descriptors ---------------------------------------------------------


def test_out_of_descriptors_on_accept_is_logged_and_the_broker_keeps_serving(start_broker, raw) -> None:
    b = start_broker()
    first = raw(b)
    assert answers(first)
    original = resource.prlimit(b.pid, resource.RLIMIT_NOFILE)
    in_use = len(os.listdir(f"/proc/{b.pid}/fd"))
    resource.prlimit(b.pid, resource.RLIMIT_NOFILE, (in_use + 3, original[1]))
    try:
        extra = [raw(b) for _ in range(10)]  # the kernel queues them; the broker runs out at the 4th
        wait_until("accept failing is logged", lambda: "cannot accept a connection" in b.stderr_tail(200), 10)
        assert answers(first, 2), "an open connection stopped being served"
        b.assert_alive()
        for c in extra:
            c.close()
    finally:
        resource.prlimit(b.pid, resource.RLIMIT_NOFILE, original)
    # descriptors are free again: accepting resumes after its pause
    wait_until("a new connection is served", lambda: answers(raw(b), timeout_s=1.0), 15)


def test_request_memory_comes_back_after_every_request(start_broker, topic_name) -> None:
    # 300 separate 1 kB produce requests each way through a 64 KiB pool: a leak of any of
    # them (async acks=all, acks=0) would exhaust it and the last produce would hang.
    b = start_broker({"queued.max.request.bytes": str(64 * 1024)})
    create_topic(b.bootstrap, topic_name)
    for acks in ("all", "0"):
        p = producer(b.bootstrap, **{"acks": acks, "linger.ms": 0, "message.timeout.ms": 10000})
        for i in range(300):
            p.produce(topic_name, b"x" * 1000)
            assert p.flush(10) == 0, f"acks={acks}: produce {i} not sent"
    produce_some(b.bootstrap, topic_name)
    with RawConnection(b.bootstrap) as c:
        assert answers(c)


def rss_bytes(pid: int) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_idle_and_slow_loris_connections_beside_a_producer(start_broker, raw, topic_name) -> None:
    """The benchmark's scenario, small: 50 idle connections, 20 peers each sending 95% of a
    4 MiB frame through an 8 MiB pool, and a producer. Without the pool the broker would
    hold 20 x 3.8 MiB; with it, two frames' worth plus one read per muted connection."""
    frame_bytes = 4 << 20
    b = start_broker({"queued.max.request.bytes": str(8 << 20), "socket.request.max.bytes": str(frame_bytes),
                      "connections.max.idle.ms": "3000"})
    create_topic(b.bootstrap, topic_name)
    produce_some(b.bootstrap, topic_name)
    before = rss_bytes(b.pid)
    idle = [raw(b) for _ in range(50)]
    loris = [raw(b) for _ in range(20)]
    target = frame_bytes * 95 // 100
    sent = {id(c): 0 for c in loris}
    chunk = bytes(64 * 1024)
    for c in loris:
        c.sock.sendall(struct.pack(">i", frame_bytes))
        c.sock.setblocking(False)
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline:
        progress = False
        for c in loris:
            if sent[id(c)] >= target:
                continue
            try:
                n = c.sock.send(chunk[: target - sent[id(c)]])
            except BlockingIOError:
                continue
            sent[id(c)] += n
            progress = progress or n > 0
        if not progress:
            time.sleep(0.05)
    assert sum(1 for c in loris if sent[id(c)] >= target) >= 2  # the granted ones got their bytes in
    produce_some(b.bootstrap, topic_name)  # the producer still works
    grown = rss_bytes(b.pid) - before
    assert grown < (8 << 20) + 20 * (256 << 10) + (24 << 20), f"RSS grew by {grown / 2**20:.1f} MiB"
    # everyone who stopped sending is closed after connections.max.idle.ms
    for c in idle:
        assert c.is_closed_by_peer(timeout_s=8.0)
    for c in loris:
        c.sock.setblocking(True)
        assert c.is_closed_by_peer(timeout_s=8.0)
