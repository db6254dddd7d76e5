"""Connection._flush sending FileSlices (read into the scratch buffer, written with writev)
over a real TCP socket, on uvloop and on asyncio's own loop: whole responses, in order,
also when the socket fills up, when slices take several scratch buffers or one slice is
larger than it; a slice that went stale before it was sent closes the connection."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path
from typing import Any

import pytest

from shoal.log.partition_log import PartitionLog
from shoal.log.policy import LogConfig
from shoal.log.segment import FileSlice
from shoal.server import connection
from shoal.server.connection import Connection, _Slot

from ..log.helpers import batch

LOOPS = ["asyncio"]
try:
    import uvloop

    LOOPS.append("uvloop")
except ImportError:  # pragma: no cover
    uvloop = None


class FakeBroker:
    config = {"socket.request.max.bytes": 100 << 20, "queued.max.requests": 500}
    memory_pool = None
    metrics = None
    routes: dict[int, Any] = {}
    shutting_down = False

    def connection_opened(self, conn: Connection) -> None:
        pass

    def connection_closed(self, conn: Connection) -> None:
        pass


def run(loop_kind: str, coro: Any) -> Any:
    loop = uvloop.new_event_loop() if loop_kind == "uvloop" else asyncio.new_event_loop()
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.close()


def filled_log(path: Path, mb: int = 4) -> PartitionLog:
    log = PartitionLog.open(path / "t-0", LogConfig())
    for i in range(mb * 10):
        log.append(batch(100, ts=1000 + i, value_size=1000), 1000 + i)
    return log


async def connected(small_buffers: bool) -> tuple[Connection, socket.socket]:
    """A Connection on the server end of a localhost TCP connection, and the client end."""
    loop = asyncio.get_running_loop()
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.socket()
    if small_buffers:
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8192)
    client.setblocking(False)
    await loop.sock_connect(client, listener.getsockname())
    server_side, _ = listener.accept()
    listener.close()
    if small_buffers:
        server_side.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8192)
    conn = Connection(FakeBroker(), 1)  # type: ignore[arg-type]
    await loop.connect_accepted_socket(lambda: conn, server_side)
    assert conn.sends_file_slices
    return conn, client


async def receive(client: socket.socket, n: int) -> bytes:
    loop = asyncio.get_running_loop()
    out = bytearray()
    while len(out) < n:
        chunk = await loop.sock_recv(client, min(1 << 16, n - len(out)))
        if not chunk:
            break
        out += chunk
    return bytes(out)


def respond(conn: Connection, *pieces: Any) -> None:
    slot = _Slot()
    slot.pieces = list(pieces)
    conn._slots.append(slot)
    conn._flush()


@pytest.mark.parametrize("loop_kind", LOOPS)
@pytest.mark.parametrize("small_buffers", [False, True])
@pytest.mark.parametrize("scratch", [connection.SCRATCH_BYTES, 512 << 10, 64 << 10])
def test_slices_arrive_whole_and_in_order(tmp_path: Path, loop_kind: str, small_buffers: bool, scratch: int,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The first slice (5 MB) is larger than any of the scratch buffers; with the default
    one the other slices share one buffer; with 512 KiB the small ones (two batches, about
    200 KB) take one buffer per two; with 64 KiB every slice is larger than it."""
    monkeypatch.setattr(connection, "SCRATCH_BYTES", scratch)
    log = filled_log(tmp_path, mb=5)

    async def body() -> None:
        conn, client = await connected(small_buffers)
        first = log.read(0, 1 << 30, 16 * 1024)
        small = [log.read(offset, 250 << 10, 16 * 1024) for offset in (100, 400, 700)]
        second = log.read(1000, 1 << 20, 16 * 1024)
        assert all(type(s) is FileSlice for s in [first, second, *small])
        assert len(first) > connection.SCRATCH_BYTES and all(150 << 10 < len(s) <= 250 << 10 for s in small)
        expected = (b"head-1" + first.read() + b"tail-1" + b"".join(b"<%d>" % i + s.read() for i, s in enumerate(small))
                    + b"head-2" + second.read())
        pieces: list[Any] = []
        for i, s in enumerate(small):
            pieces += [b"<%d>" % i, s]
        respond(conn, b"head-1", first, b"tail", b"-1", *pieces)
        got = b""
        if small_buffers:  # the socket took only part: the rest waits in the transport
            assert conn.transport.get_write_buffer_size() > 0
            client.setblocking(True)  # make room in the socket without letting the loop run
            got = client.recv(1 << 16)
            client.setblocking(False)
        respond(conn, b"head-2", second)  # after what is buffered, never before
        assert got + await receive(client, len(expected) - len(got)) == expected
        assert not conn._closing
        with pytest.raises(asyncio.TimeoutError):  # and nothing more
            await asyncio.wait_for(asyncio.get_running_loop().sock_recv(client, 1), 0.1)
        client.close()

    run(loop_kind, body())


@pytest.mark.parametrize("loop_kind", LOOPS)
def test_a_slice_truncated_before_it_is_sent_closes_the_connection(tmp_path: Path, loop_kind: str) -> None:
    log = filled_log(tmp_path, mb=1)

    async def body() -> None:
        conn, client = await connected(False)
        stale = log.read(0, 1 << 30, 16 * 1024)
        log.truncate_to(10)
        respond(conn, b"head", stale)
        assert conn._closing
        assert await receive(client, 1 << 20) == b""  # nothing of that response, then the end
        client.close()

    run(loop_kind, body())


@pytest.mark.parametrize("loop_kind", LOOPS)
def test_what_waits_in_the_transport_does_not_share_the_scratch_buffer(tmp_path: Path, loop_kind: str) -> None:
    """A response the socket took only part of waits in its transport while another
    connection sends through the same scratch buffer: it still arrives as it was read."""
    log = filled_log(tmp_path, mb=2)

    async def body() -> None:
        slow, slow_client = await connected(True)
        fast, fast_client = await connected(False)
        first = log.read(0, 1 << 20, 16 * 1024)
        other = log.read(1000, 1 << 20, 16 * 1024)
        assert type(first) is FileSlice and type(other) is FileSlice
        expected = b"slow" + first.read()
        respond(slow, b"slow", first)
        assert slow.transport.get_write_buffer_size() > 0  # most of it waits
        respond(fast, b"fast", other)  # overwrites the scratch buffer
        assert await receive(fast_client, 4 + len(other)) == b"fast" + other.read()
        assert await receive(slow_client, len(expected)) == expected
        slow_client.close()
        fast_client.close()

    run(loop_kind, body())


@pytest.mark.parametrize("loop_kind", LOOPS)
def test_an_unread_response_waits_as_an_unread_slice_and_mutes_the_connection(tmp_path: Path, loop_kind: str) -> None:
    """A 5 MB slice to a client that does not read: the transport holds about one pass
    (``PUMP_BYTES``) of it, the rest waits in ``_out`` as a slice; the connection serves no
    further request meanwhile. Read later, it arrives whole, with what followed it."""
    log = filled_log(tmp_path, mb=5)

    async def body() -> None:
        conn, client = await connected(True)
        big = log.read(0, 1 << 30, 16 * 1024)
        assert type(big) is FileSlice and len(big) > 4 * connection.PUMP_BYTES
        expected = b"head" + big.read() + b"next"
        respond(conn, b"head", big)
        assert conn.transport.get_write_buffer_size() <= connection.PUMP_BYTES + (64 << 10)
        assert any(type(p) is FileSlice for p in conn._out)
        assert conn._muted() and conn._reading_paused
        respond(conn, b"next")  # queued after it, not before
        assert await receive(client, len(expected)) == expected
        await asyncio.sleep(0.05)
        assert not conn._out and not conn._muted() and not conn._reading_paused
        client.close()

    run(loop_kind, body())
