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

from ..protocol.codec import codec_for
from ..protocol.header import read_uvarint

__all__ = ["PeerConnection"]

CONNECT_TIMEOUT_S = 5.0
_HDR = struct.Struct(">hhi")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
MAX_FRAME = 1 << 30
READ_BUFFER = 4 << 20
"""The stream's buffer limit: a Fetch response of a few megabytes arrives in a few reads
(the default 64 KiB pauses the socket every 128 KiB)."""


class PeerConnection:
    def __init__(self, host: str, port: int, client_id: str) -> None:
        self.host, self.port = host, port
        self._client_id = client_id.encode()
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._cid = 0

    @property
    def connected(self) -> bool:
        return self._writer is not None

    async def connect(self) -> None:
        if self._writer is None:
            self._reader, self._writer = await asyncio.wait_for(
                asyncio.open_connection(self.host, self.port, limit=READ_BUFFER), CONNECT_TIMEOUT_S)

    async def call(self, api_key: int, version: int, request: Any) -> Any:
        """Send ``request`` (a kio entity of a flexible version); return the response entity.

        Raises OSError/ConnectionError/asyncio.TimeoutError when the connection fails or the
        peer closes it; the caller then closes this connection.
        """
        await self.connect()
        assert self._reader is not None and self._writer is not None
        codec = codec_for(api_key, version)
        assert codec is not None and codec.flexible, (api_key, version)
        body = io.BytesIO()
        entity_writer(type(request))(body, request)
        self._cid = (self._cid + 1) & 0x7FFFFFFF
        header = _HDR.pack(api_key, version, self._cid) + _I16.pack(len(self._client_id)) + self._client_id + b"\x00"
        payload = header + body.getvalue()
        self._writer.write(_I32.pack(len(payload)) + payload)
        await self._writer.drain()
        try:  # the size, then the whole frame in one piece (no reassembly copies)
            (size,) = _I32.unpack(await self._reader.readexactly(4))
            if not 4 <= size <= MAX_FRAME:
                raise ConnectionError(f"response frame of {size} bytes from {self.host}:{self.port}")
            frame = await self._reader.readexactly(size)
        except asyncio.IncompleteReadError as e:
            raise ConnectionError(f"broker {self.host}:{self.port} closed the connection") from e
        (cid,) = _I32.unpack_from(frame, 0)
        if cid != self._cid:
            raise ConnectionError(f"correlation id {cid}, expected {self._cid}")
        pos = 4
        count, pos = read_uvarint(frame, pos)
        for _ in range(count):
            _tag, pos = read_uvarint(frame, pos)
            size, pos = read_uvarint(frame, pos)
            pos += size
        value, _ = entity_reader(codec.response_type)(frame, pos)
        return value

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._reader = self._writer = None
