"""PeerConnection against a scripted asyncio server: frames read into one buffer each."""

from __future__ import annotations

import asyncio
import io
import struct

import pytest
from kio.schema.errors import ErrorCode
from kio.serial import entity_writer

from shoal.cluster.peer import PeerConnection
from shoal.protocol.codec import codec_for
from shoal.protocol.entities import make, sub

FETCH, VERSION = 1, 12


def fetch_request():
    req = codec_for(FETCH, VERSION).request_type
    import datetime
    return make(req, replica_id=1, max_wait=datetime.timedelta(milliseconds=10), min_bytes=1, max_bytes=1 << 20,
                isolation_level=0, session_id=0, session_epoch=-1, topics=(), forgotten_topics_data=(), rack_id="")


def fetch_response_frame(cid: int, records: bytes) -> bytes:
    resp = codec_for(FETCH, VERSION).response_type
    tcls, pcls = sub(resp, "FetchableTopicResponse"), sub(resp, "PartitionData")
    import datetime
    part = make(pcls, partition_index=0, error_code=ErrorCode.none, high_watermark=7, last_stable_offset=7,
                log_start_offset=0, aborted_transactions=(), preferred_read_replica=-1, records=records)
    body = io.BytesIO()
    entity_writer(resp)(body, make(resp, throttle_time=datetime.timedelta(0), error_code=ErrorCode.none, session_id=0,
                                   responses=(make(tcls, topic="t", partitions=(part,)),)))
    payload = struct.pack(">i", cid) + b"\x00" + body.getvalue()  # header v1: no tagged fields
    return struct.pack(">i", len(payload)) + payload


async def serve(script):
    """A server that reads each request frame and answers with ``script(cid, writer)``."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                (size,) = struct.unpack(">i", await reader.readexactly(4))
                frame = await reader.readexactly(size)
                (cid,) = struct.unpack_from(">i", frame, 4)
                if await script(cid, writer) is False:
                    break
        except asyncio.IncompleteReadError:
            pass
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


def test_response_in_small_pieces_and_large_records() -> None:
    records = bytes(range(256)) * 12_000  # 3 MB: many reads into one buffer

    async def main() -> None:
        async def script(cid, writer):
            data = fetch_response_frame(cid, records)
            for i in range(0, len(data), 7777):
                writer.write(data[i:i + 7777])
                await writer.drain()
                if i < 50_000:
                    await asyncio.sleep(0)  # the prefix and the first bytes arrive in separate reads

        server, port = await serve(script)
        conn = PeerConnection("127.0.0.1", port, "test")
        for _ in range(3):  # one connection, several calls in turn
            resp = await conn.call(FETCH, VERSION, fetch_request())
            part = resp.responses[0].partitions[0]
            assert part.records == records and part.high_watermark == 7
        conn.close()
        server.close()
        await server.wait_closed()

    asyncio.run(main())


def test_frames_of_changing_sizes_through_the_reused_buffer() -> None:
    """Each response is decoded whole, whether its frame fits the buffer the last one left,
    needs a larger one, or is small enough for a smaller one."""
    sizes = [1 << 20, 2000, 1 << 20, 3 << 20, 100, 0, 500_000, 40]
    payloads = [bytes([i + 1]) * n for i, n in enumerate(sizes)]

    async def main() -> None:
        todo = list(payloads)

        async def script(cid, writer):
            writer.write(fetch_response_frame(cid, todo.pop(0)))
            await writer.drain()

        server, port = await serve(script)
        conn = PeerConnection("127.0.0.1", port, "test")
        for want in payloads:
            resp = await conn.call(FETCH, VERSION, fetch_request())
            assert resp.responses[0].partitions[0].records == want
        conn.close()
        server.close()
        await server.wait_closed()

    asyncio.run(main())


def assert_calls_fail(script, times: int = 1) -> None:
    """Each of ``times`` calls, on a new connection to a server answering with ``script``,
    raises ConnectionError."""

    async def main() -> None:
        server, port = await serve(script)
        for _ in range(times):
            conn = PeerConnection("127.0.0.1", port, "test")
            with pytest.raises(ConnectionError):
                await conn.call(FETCH, VERSION, fetch_request())
            conn.close()
        server.close()
        await server.wait_closed()

    asyncio.run(main())


@pytest.mark.parametrize("cut", [0, 2, 100])
def test_peer_closing_inside_a_frame_fails_the_call(cut: int) -> None:
    async def script(cid, writer):
        writer.write(fetch_response_frame(cid, b"x" * 1000)[:cut])
        await writer.drain()
        return False

    assert_calls_fail(script)


def test_impossible_frame_size_and_wrong_correlation_id_fail() -> None:
    answers = [lambda cid: struct.pack(">i", -5), lambda cid: fetch_response_frame(cid + 1, b"")]

    async def script(cid, writer):
        writer.write(answers.pop(0)(cid))
        await writer.drain()

    assert_calls_fail(script, times=2)


def test_a_cancelled_call_ends_the_connection_and_the_next_connects_again() -> None:
    async def main() -> None:
        calls = []

        async def script(cid, writer):
            calls.append(cid)
            if len(calls) == 1:
                await asyncio.sleep(0.3)  # answered after the caller gave up
            writer.write(fetch_response_frame(cid, b"late" if len(calls) == 1 else b"ok"))
            await writer.drain()

        server, port = await serve(script)
        conn = PeerConnection("127.0.0.1", port, "test")
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(conn.call(FETCH, VERSION, fetch_request()), 0.05)
        with pytest.raises(ConnectionError):  # the stray answer must never be taken for the next call's
            await conn.call(FETCH, VERSION, fetch_request())
        conn.close()
        resp = await conn.call(FETCH, VERSION, fetch_request())
        assert resp.responses[0].partitions[0].records == b"ok"
        conn.close()
        server.close()
        await server.wait_closed()

    asyncio.run(main())
