"""``async`` handlers: run up to their first wait as the request is served.

A Connection on a real localhost socket (the harness of test_unencodable_responses.py)
with async handlers that answer at once, wait, fail, or are cancelled when the
connection closes. One that needs no wait is answered before the connection's
``data_received`` returns, with no task; one that waits goes on in a task from where it
stopped, and answers still leave in request order.
"""

from __future__ import annotations

import asyncio
import struct
from typing import Any

from kio.index import load_response_schema
from kio.schema.metadata.v1 import request as metadata1
from kio.serial import entity_reader

from shoal.protocol.entities import make
from shoal.server.dispatch import Route
from tests.support.wire import request_bytes

from . import test_unencodable_responses as harness

ran: list[str] = []


async def metadata_handler(ctx: Any, request: Any) -> Any:
    """Metadata v1, by what the request's first topic name says to do."""
    what = request.topics[0].name if request.topics else "now"
    ran.append(f"start {what}")
    if what.startswith("wait"):
        fut = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_later(float(what[4:] or 0.05), fut.set_result, None)
        try:
            await fut
            await asyncio.sleep(0)  # a bare yield too
        except asyncio.CancelledError:
            ran.append(f"cancelled {what}")
            raise
    elif what == "fail":
        raise RuntimeError("a bug in a handler")
    ran.append(f"end {what}")
    return make(ctx.response_type, brokers=(), topics=(), controller_id=len(ran))


def metadata(what: str, correlation_id: int) -> bytes:
    return request_bytes(metadata1.MetadataRequest(topics=(metadata1.MetadataRequestTopic(name=what),)),
                         correlation_id)


async def serve() -> tuple[Any, Any]:
    conn, client = await harness.serve(harness.join_answer)
    conn._routes = {3: Route(3, metadata_handler, 0, 12)}
    return conn, client


def answer(frame: bytes) -> tuple[int, Any]:
    value, _ = entity_reader(load_response_schema(3, 1))(frame, 4)
    return struct.unpack_from(">i", frame)[0], value


def test_an_async_handler_that_needs_no_wait_is_answered_at_once() -> None:
    async def body() -> None:
        ran.clear()
        conn, client = await serve()
        frame = metadata("now", 1)
        conn.data_received(struct.pack(">i", len(frame) - 4) + frame[4:])
        # answered within data_received: no task, no pass of the event loop
        assert ran == ["start now", "end now"]
        assert not conn._slots and conn.inflight == 0
        cid, r = answer(await harness.read_frame(client))
        assert cid == 1 and r.controller_id == 2
        client.close()

    asyncio.run(body())


def test_answers_leave_in_request_order_whichever_handler_waits() -> None:
    async def body() -> None:
        ran.clear()
        conn, client = await serve()
        loop = asyncio.get_running_loop()
        await loop.sock_sendall(client, metadata("wait0.1", 1) + metadata("now", 2) + metadata("wait0.01", 3)
                                + metadata("now", 4))
        got = await harness.read_frames(client, 4)
        assert [struct.unpack_from(">i", f)[0] for f in got] == [1, 2, 3, 4]
        assert ran.index("end wait0.01") < ran.index("end wait0.1")  # finished out of order, answered in order
        assert not conn._closing
        client.close()

    asyncio.run(body())


def test_a_waiting_handler_is_cancelled_when_its_connection_closes() -> None:
    async def body() -> None:
        ran.clear()
        conn, client = await serve()
        await asyncio.get_running_loop().sock_sendall(client, metadata("wait5", 1))
        for _ in range(100):
            if ran:
                break
            await asyncio.sleep(0.01)
        conn.transport.abort()  # as a reset by the client does
        await asyncio.wait_for(conn.closed, 5)
        for _ in range(100):
            if "cancelled wait5" in ran:
                break
            await asyncio.sleep(0.01)
        assert ran == ["start wait5", "cancelled wait5"]
        client.close()

    asyncio.run(body())


def test_metadata_v1_request_without_topics_still_parses() -> None:
    # the harness's own request shape: all topics (None) is answered at once as well
    async def body() -> None:
        ran.clear()
        _conn, client = await serve()
        await asyncio.get_running_loop().sock_sendall(client, request_bytes(metadata1.MetadataRequest(topics=None), 5))
        cid, _ = answer(await harness.read_frame(client))
        assert cid == 5 and ran == ["start now", "end now"]
        client.close()

    asyncio.run(body())


def test_a_handler_that_fails_before_its_first_wait_closes_only_its_connection() -> None:
    async def body() -> None:
        ran.clear()
        _conn, client = await serve()
        other, other_client = await serve()
        loop = asyncio.get_running_loop()
        await loop.sock_sendall(client, metadata("fail", 1))
        assert await harness.read_frame(client) is None  # closed, as when its task fails
        await loop.sock_sendall(other_client, metadata("now", 2))
        cid, _ = answer(await harness.read_frame(other_client))
        assert cid == 2 and not other._closing
        client.close()
        other_client.close()

    asyncio.run(body())


futures: list[asyncio.Future[Any]] = []


def future_handler(ctx: Any, request: Any) -> Any:
    """Metadata v1 answered through a future (as Produce answers once its fsync is done):
    "futureN" resolves it after N seconds, "now" answers at once."""
    what = request.topics[0].name if request.topics else "now"
    response = make(ctx.response_type, brokers=(), topics=(), controller_id=len(futures))
    if not what.startswith("future"):
        return response
    fut = asyncio.get_running_loop().create_future()
    futures.append(fut)
    asyncio.get_running_loop().call_later(float(what[6:]), lambda: fut.done() or fut.set_result(response))
    return fut


def test_an_answer_to_come_as_a_future_is_sent_when_it_resolves_in_request_order() -> None:
    async def body() -> None:
        futures.clear()
        conn, client = await harness.serve(harness.join_answer)
        conn._routes = {3: Route(3, future_handler, 0, 12)}
        loop = asyncio.get_running_loop()
        await loop.sock_sendall(client, metadata("future0.1", 1) + metadata("now", 2) + metadata("future0.01", 3))
        got = [answer(frame) for frame in await harness.read_frames(client, 3)]
        assert [cid for cid, _ in got] == [1, 2, 3]
        assert [r.controller_id for _, r in got] == [0, 1, 1]
        assert not conn._slots and not conn._closing
        # a connection that closes while an answer is to come cancels it
        await loop.sock_sendall(client, metadata("future5", 4))
        for _ in range(100):
            if len(futures) == 3:
                break
            await asyncio.sleep(0.01)
        conn.transport.abort()
        await asyncio.wait_for(conn.closed, 5)
        assert futures[-1].cancelled()
        client.close()

    asyncio.run(body())
