"""A response that cannot be encoded never leaves its request unanswered on an open connection.

A Connection on a real localhost socket, with handlers that answer with a member id too
long for JoinGroup v5's int16-length string: synchronously and from an async task (the
path of a parked JoinGroup, whose failure used to hang the connection). The request is
answered INVALID_REQUEST and the connection goes on serving; a response without a
top-level error code (Metadata) closes the connection instead.
"""

from __future__ import annotations

import asyncio
import datetime
import socket
import struct
from typing import Any

import pytest
from kio.index import load_response_schema
from kio.schema.errors import ErrorCode
from kio.schema.join_group.v5 import request as join5
from kio.schema.metadata.v1 import request as metadata1
from kio.serial import entity_reader

from shoal.protocol.entities import make, sub
from shoal.server.connection import Connection
from shoal.server.dispatch import Route
from shoal.server.memory_pool import MemoryPool
from tests.support.wire import request_bytes

TOO_LONG = "m" * 40_000


def join_answer(ctx: Any, request: Any) -> Any:
    return make(ctx.response_type, error_code=ErrorCode.none, member_id=TOO_LONG, leader="", members=())


async def join_answer_later(ctx: Any, request: Any) -> Any:
    await asyncio.sleep(0.01)
    return join_answer(ctx, request)


def metadata_answer(ctx: Any, request: Any) -> Any:
    tcls = sub(ctx.response_type, "MetadataResponseTopic")
    return make(ctx.response_type, brokers=(), topics=(make(tcls, name=TOO_LONG, partitions=()),))


class FakeBroker:
    config = {"socket.request.max.bytes": 100 << 20, "queued.max.requests": 500}
    metrics = None
    shutting_down = False
    authorizer = None

    def __init__(self, join_handler: Any) -> None:
        self.memory_pool = MemoryPool(-1, asyncio.get_running_loop().call_soon)
        self.routes = {11: Route(11, join_handler, 0, 9), 3: Route(3, metadata_answer, 0, 12)}

    def connection_opened(self, conn: Connection) -> None:
        pass

    def connection_closed(self, conn: Connection) -> None:
        pass


async def serve(join_handler: Any) -> tuple[Connection, socket.socket]:
    loop = asyncio.get_running_loop()
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.socket()
    client.setblocking(False)
    await loop.sock_connect(client, listener.getsockname())
    server_side, _ = listener.accept()
    listener.close()
    conn = Connection(FakeBroker(join_handler), 1)  # type: ignore[arg-type]
    await loop.connect_accepted_socket(lambda: conn, server_side)
    return conn, client


async def read_frame(client: socket.socket) -> bytes | None:
    loop = asyncio.get_running_loop()
    buf = b""
    while True:
        if len(buf) >= 4 and len(buf) >= 4 + struct.unpack_from(">i", buf)[0]:
            return buf[4:]
        chunk = await asyncio.wait_for(loop.sock_recv(client, 1 << 16), 5)
        if not chunk:
            return None
        buf += chunk


async def read_frames(client: socket.socket, n: int) -> list[bytes]:
    """The next ``n`` response frames (without their size), also when several come in one read."""
    loop = asyncio.get_running_loop()
    frames: list[bytes] = []
    buf = b""
    while len(frames) < n:
        chunk = await asyncio.wait_for(loop.sock_recv(client, 1 << 16), 5)
        assert chunk, "the connection was closed"
        buf += chunk
        while len(buf) >= 4 and len(buf) >= 4 + struct.unpack_from(">i", buf)[0]:
            size = struct.unpack_from(">i", buf)[0]
            frames.append(buf[4:4 + size])
            buf = buf[4 + size:]
    return frames


def join_request() -> bytes:
    return request_bytes(join5.JoinGroupRequest(
        group_id="g", session_timeout=datetime.timedelta(seconds=6), rebalance_timeout=datetime.timedelta(seconds=6),
        member_id="", group_instance_id=None,
        protocol_type="consumer", protocols=()), 7)


@pytest.mark.parametrize("handler", [join_answer, join_answer_later], ids=["sync", "async"])
def test_an_unencodable_answer_is_invalid_request_and_the_connection_serves_on(handler: Any) -> None:
    async def body() -> None:
        conn, client = await serve(handler)
        loop = asyncio.get_running_loop()
        for correlation_id in (7, 7):  # twice: the connection still serves after the first
            await loop.sock_sendall(client, join_request())
            frame = await read_frame(client)
            assert frame is not None, "the connection was closed"
            assert struct.unpack_from(">i", frame)[0] == correlation_id
            answer, _ = entity_reader(load_response_schema(11, 5))(frame, 4)
            assert answer.error_code == ErrorCode.invalid_request
        assert not conn._closing
        client.close()

    asyncio.run(body())


def test_an_unencodable_answer_without_an_error_code_closes_the_connection() -> None:
    async def body() -> None:
        _, client = await serve(join_answer)
        await asyncio.get_running_loop().sock_sendall(
            client, request_bytes(metadata1.MetadataRequest(topics=None), 9))
        assert await read_frame(client) is None
        client.close()

    asyncio.run(body())


def test_a_failed_task_of_a_closing_connection_leaves_no_unread_exception() -> None:
    import gc

    from shoal.server.connection import _Slot

    async def body() -> None:
        loop = asyncio.get_running_loop()
        reported: list[dict[str, Any]] = []
        loop.set_exception_handler(lambda _loop, context: reported.append(context))
        conn, client = await serve(join_answer)

        async def fails() -> None:
            raise RuntimeError("a handler failed while its connection was closing")

        task = loop.create_task(fails())
        await asyncio.wait([task])
        conn._closing = True
        conn._async_done(_Slot(), None, task)  # type: ignore[arg-type]
        del task
        gc.collect()
        await asyncio.sleep(0)
        assert [c.get("message") for c in reported] == []
        client.close()

    asyncio.run(body())
