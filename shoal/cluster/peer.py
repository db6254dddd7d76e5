"""One asyncio connection from this broker to another (asyncio shell).

Used by the follower fetchers (``fetcher.py``) and the share-state persister
(``server/share_persister.py``). One request at a time: :meth:`PeerConnection.call`
sends a request (header v2; every inter-broker API used here is a flexible version)
and reads its response, checking the correlation id. It connects on first use; after
any error the caller closes it and the next call connects again.
"""

from __future__ import annotations

import asyncio
import io
import struct
from typing import Any

from kio.serial import entity_reader, entity_writer

from ..errors import ProtocolViolation
from ..protocol.bounds import UnknownTaggedFields, check_request
from ..protocol.codec import codec_for
from ..protocol.header import skip_tagged_fields

__all__ = ["PeerConnection"]

CONNECT_TIMEOUT_S = 5.0
_HDR = struct.Struct(">hhi")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
MAX_FRAME = 1 << 30


class _ResponseReader(asyncio.BufferedProtocol):
    """Receives response frames straight into one buffer per frame.

    The socket is read into the 4-byte size prefix, then into the first bytes of a buffer
    at least the frame's size, so a Fetch response of megabytes is copied once, by the
    kernel, and decoded from that buffer. The buffer is kept for the next frame (a new
    one, zero-filled, only when a larger frame comes, and a smaller one again after a
    frame of at most a quarter of it), so the frame handed to :meth:`exchange`'s caller
    is valid until the next exchange. One request is in flight at a time, so nothing
    beyond the current frame is ever read.
    """

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self._prefix = bytearray(4)
        self._buffer = bytearray()
        self._body: memoryview | None = None
        self._have = 0
        self._frame: asyncio.Future[memoryview] | None = None
        self._error: BaseException | None = None
        self._writable: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._body is None:
            return memoryview(self._prefix)[self._have:]
        return self._body[self._have:]

    def buffer_updated(self, nbytes: int) -> None:
        self._have += nbytes
        if self._body is None:
            if self._have < 4:
                return
            (size,) = _I32.unpack(self._prefix)
            if not 4 <= size <= MAX_FRAME:
                self._fail(ConnectionError(f"response frame of {size} bytes"))
                return
            capacity = len(self._buffer)
            if size > capacity or size * 4 < capacity:
                self._buffer = bytearray(size)
            self._body, self._have = memoryview(self._buffer)[:size], 0
            return
        if self._have == len(self._body):
            body, self._body, self._have = self._body, None, 0
            fut, self._frame = self._frame, None
            if fut is None or fut.done():
                self._fail(ConnectionError("a response frame nobody asked for"))
            else:
                fut.set_result(body.toreadonly())

    def eof_received(self) -> bool:
        self._fail(ConnectionError("the peer closed the connection"))
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(exc or ConnectionError("connection closed"))

    def pause_writing(self) -> None:
        if self._writable is None:
            self._writable = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)
        self._writable = None

    def _fail(self, error: BaseException) -> None:
        if self._error is None:
            self._error = error
        if self._frame is not None and not self._frame.done():
            self._frame.set_exception(error)
        # A call waiting to write is woken and then finds its frame failed; an exception on
        # this future would be reported as never retrieved when no call waits.
        self.resume_writing()
        self._frame = None
        if self.transport is not None:
            self.transport.close()

    async def exchange(self, data: bytes) -> memoryview:
        """Send one request frame and return the next response frame (read-only, valid
        until the next exchange)."""
        if self._error is not None:
            raise ConnectionError(str(self._error)) from self._error
        if self.transport is None or self._frame is not None:
            raise ConnectionError("the connection is busy with another call")
        fut = self._frame = asyncio.get_running_loop().create_future()
        try:
            self.transport.write(data)
            if self._writable is not None:
                await asyncio.shield(self._writable)
            return await fut
        except asyncio.CancelledError:
            # Its response would arrive for nobody: this connection is done.
            self._fail(ConnectionError("a call was cancelled"))
            raise


class PeerConnection:
    def __init__(self, host: str, port: int, client_id: str, security: Any = None) -> None:
        """``security``: a :class:`~shoal.security.client.PeerSecurity` when the other broker's
        inter-broker listener wants TLS or SASL (``broker.peer_security``)."""
        self.host, self.port = host, port
        self._client_id = client_id.encode()
        self._security = security
        self._reader: _ResponseReader | None = None
        self._cid = 0

    @property
    def connected(self) -> bool:
        return self._reader is not None

    async def connect(self) -> None:
        if self._reader is None:
            sec = self._security
            if sec is None or sec.ssl_context is None:
                _, self._reader = await asyncio.wait_for(
                    asyncio.get_running_loop().create_connection(_ResponseReader, self.host, self.port),
                    CONNECT_TIMEOUT_S)
            else:
                _, self._reader = await asyncio.wait_for(
                    asyncio.get_running_loop().create_connection(_ResponseReader, self.host, self.port,
                                                                 ssl=sec.ssl_context, server_hostname=self.host),
                    CONNECT_TIMEOUT_S)
            if sec is not None and sec.sasl is not None:
                from ..security.client import authenticate

                try:
                    await asyncio.wait_for(authenticate(self, self._reader.exchange, sec.sasl, self._client_id),
                                           CONNECT_TIMEOUT_S)
                except BaseException:
                    self.close()
                    raise

    async def call(self, api_key: int, version: int, request: Any) -> Any:
        """Send ``request`` (a kio entity of a flexible version); return the response entity.

        Raises OSError/ConnectionError/asyncio.TimeoutError when the connection fails or the
        peer closes it; the caller then closes this connection.
        """
        body = await self.call_raw(api_key, version, request)
        cls = codec_for(api_key, version).response_type  # type: ignore[union-attr]
        try:
            check_request(cls, body, 0)  # kio's reader must not see an array longer than the frame
        except UnknownTaggedFields as e:  # from a newer broker: skipped, as Kafka skips them
            body = e.frame
        except ProtocolViolation as e:
            raise ConnectionError(f"undecodable answer from {self.host}:{self.port}: {e}") from e
        value, _ = entity_reader(cls)(body, 0)
        return value

    async def call_raw(self, api_key: int, version: int, request: Any) -> memoryview:
        """As :meth:`call`, but return the response body undecoded: a read-only view of the
        connection's receive buffer, valid until the next call."""
        codec = codec_for(api_key, version)
        assert codec is not None and codec.flexible, (api_key, version)
        body = io.BytesIO()
        entity_writer(type(request))(body, request)
        return await self.call_body(api_key, version, body.getvalue())

    async def call_body(self, api_key: int, version: int, body: bytes) -> memoryview:
        """As :meth:`call_raw`, with the request body already encoded (a flexible version)."""
        await self.connect()
        assert self._reader is not None
        self._cid = (self._cid + 1) & 0x7FFFFFFF
        header = _HDR.pack(api_key, version, self._cid) + _I16.pack(len(self._client_id)) + self._client_id + b"\x00"
        payload = header + body
        frame = await self._reader.exchange(_I32.pack(len(payload)) + payload)
        (cid,) = _I32.unpack_from(frame, 0)
        if cid != self._cid:
            raise ConnectionError(f"correlation id {cid}, expected {self._cid}")
        try:
            return frame[skip_tagged_fields(frame, 4):]
        except ProtocolViolation as e:
            raise ConnectionError(f"bad response header: {e}") from e

    def close(self) -> None:
        if self._reader is not None and self._reader.transport is not None:
            self._reader.transport.close()
        self._reader = None
