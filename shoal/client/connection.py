"""A small synchronous Kafka connection: size-prefixed frames, correlation ids, ApiVersions.

Theory of operation
-------------------
One :class:`Connection` is one TCP socket to one broker, used by one thread at a time
(callers that share it hold :attr:`Connection.lock`). :meth:`Connection.call` sends one
request and reads its response before returning: no pipelining, so the correlation id of
every response must equal the one just sent, and a mismatch is a :class:`ProtocolViolation`.

Request header v2 (flexible request versions) or v1: api_key, api_version,
correlation_id, client_id, then, for v2, an empty tagged-field section. The response header
is the correlation id, plus a tagged-field section for flexible versions except
ApiVersions (which always answers with header v0, see :mod:`shoal.protocol.header`).

On connect the client sends ApiVersions (v3, falling back to v0 if the broker answers
UNSUPPORTED_VERSION) and keeps the broker's ranges; :meth:`Connection.version_for` picks the
highest version both the broker and kio have. Bodies are built with
:func:`shoal.protocol.entities.make` and read with kio through
:func:`shoal.protocol.codec.codec_for`, the same code the broker uses.

This package never imports shoal.server, shoal.log, shoal.groups or shoal.share.
"""

from __future__ import annotations

import io
import socket
import struct
import threading
from typing import Any

from kio.schema.errors import ErrorCode
from kio.serial import entity_reader, entity_writer

from ..errors import ProtocolViolation
from ..protocol.codec import codec_for
from ..protocol.entities import make
from ..protocol.framing import FrameDecoder
from ..protocol.header import read_uvarint

__all__ = ["Connection", "KafkaProtocolError", "parse_bootstrap", "API_VERSIONS"]

API_VERSIONS = 18
_HDR = struct.Struct(">hhi")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
MAX_FRAME_BYTES = 512 * 1024 * 1024


class KafkaProtocolError(Exception):
    """A request answered with an error code (``code`` is kio's ErrorCode)."""

    def __init__(self, code: ErrorCode | int, message: str = "") -> None:
        self.code = ErrorCode(int(code))
        super().__init__(f"{self.code.name}: {message}" if message else self.code.name)


def parse_bootstrap(bootstrap: str) -> tuple[str, int]:
    """First ``host:port`` of a Kafka bootstrap list (``PLAINTEXT://`` prefixes allowed)."""
    first = bootstrap.split(",")[0].strip()
    first = first.split("://")[-1]
    host, _, port = first.rpartition(":")
    return host or "127.0.0.1", int(port or 9092)


class Connection:
    """A blocking connection to one broker. Thread-safe through :attr:`lock`."""

    def __init__(self, host: str, port: int, *, client_id: str = "shoal-client", timeout_s: float = 30.0) -> None:
        self.host = host
        self.port = port
        self.client_id = client_id
        self.timeout_s = timeout_s
        self.lock = threading.RLock()
        self._client_id_bytes = client_id.encode()
        self._correlation_id = 0
        self._sock: socket.socket | None = None
        self._decoder = FrameDecoder(MAX_FRAME_BYTES)
        self.broker_versions: dict[int, tuple[int, int]] = {}

    @classmethod
    def to(cls, bootstrap: str, **kw: Any) -> Connection:
        host, port = parse_bootstrap(bootstrap)
        conn = cls(host, port, **kw)
        conn.connect()
        return conn

    # -- lifecycle -------------------------------------------------------------------
    def connect(self) -> None:
        with self.lock:
            if self._sock is not None:
                return
            sock = socket.create_connection((self.host, self.port), timeout=self.timeout_s)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._sock = sock
            self._decoder = FrameDecoder(MAX_FRAME_BYTES)
            try:
                self._negotiate()
            except BaseException:
                self.close()
                raise

    @property
    def connected(self) -> bool:
        return self._sock is not None

    def close(self) -> None:
        with self.lock:
            if self._sock is not None:
                try:
                    self._sock.close()
                finally:
                    self._sock = None

    def __enter__(self) -> Connection:
        self.connect()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- versions --------------------------------------------------------------------
    def _negotiate(self) -> None:
        for version in (3, 0):
            resp = self.call(API_VERSIONS, version, client_software_name="shoal", client_software_version="0.1")
            if resp.error_code == ErrorCode.unsupported_version:
                continue
            if resp.error_code != ErrorCode.none:
                raise KafkaProtocolError(resp.error_code, "ApiVersions")
            self.broker_versions = {int(k.api_key): (int(k.min_version), int(k.max_version)) for k in resp.api_keys}
            return
        raise KafkaProtocolError(ErrorCode.unsupported_version, "ApiVersions")

    def version_for(self, api_key: int, lo: int = 0, hi: int = 1 << 15) -> int:
        """Highest version of ``api_key`` in [lo, hi] that the broker serves and kio knows.

        Raises KafkaProtocolError(UNSUPPORTED_VERSION) when there is none.
        """
        rng = self.broker_versions.get(api_key)
        if rng is not None:
            for v in range(min(hi, rng[1]), max(lo, rng[0]) - 1, -1):
                if codec_for(api_key, v) is not None:
                    return v
        raise KafkaProtocolError(ErrorCode.unsupported_version, f"broker does not serve API {api_key} in {lo}..{hi}")

    def request_type(self, api_key: int, version: int) -> type:
        codec = codec_for(api_key, version)
        if codec is None:
            raise KafkaProtocolError(ErrorCode.unsupported_version, f"kio has no API {api_key} v{version}")
        return codec.request_type

    # -- calls -----------------------------------------------------------------------
    def call(self, api_key: int, version: int, /, **fields: Any) -> Any:
        """Build the request of ``api_key`` v``version`` from ``fields`` (see ``make``) and send it."""
        return self.send(make(self.request_type(api_key, version), **fields))

    def send(self, request: Any) -> Any:
        """Send a kio request entity; return the response entity of the same version.

        Raises OSError/ConnectionError if the connection breaks (the connection is then closed),
        ProtocolViolation if the response cannot be read.
        """
        api_key = int(request.__api_key__)
        version = int(request.__version__)
        codec = codec_for(api_key, version)
        if codec is None:
            raise KafkaProtocolError(ErrorCode.unsupported_version, f"kio has no API {api_key} v{version}")
        body = io.BytesIO()
        entity_writer(type(request))(body, request)
        with self.lock:
            if self._sock is None:
                raise ConnectionError(f"not connected to {self.host}:{self.port}")
            self._correlation_id = (self._correlation_id + 1) & 0x7FFFFFFF
            cid = self._correlation_id
            header = _HDR.pack(api_key, version, cid) + _I16.pack(len(self._client_id_bytes)) + self._client_id_bytes
            if codec.flexible:
                header += b"\x00"
            payload = header + body.getvalue()
            try:
                self._sock.sendall(_I32.pack(len(payload)) + payload)
                frame = self._read_frame()
            except BaseException:
                self.close()
                raise
        (got,) = _I32.unpack_from(frame, 0)
        if got != cid:
            self.close()
            raise ProtocolViolation(f"correlation id {got} in response, expected {cid}")
        pos = 4
        if codec.flexible and api_key != API_VERSIONS:
            count, pos = read_uvarint(frame, pos)
            for _ in range(count):
                _tag, pos = read_uvarint(frame, pos)
                size, pos = read_uvarint(frame, pos)
                pos += size
        try:
            value, _ = entity_reader(codec.response_type)(frame, pos)
        except Exception as e:
            raise ProtocolViolation(f"cannot decode {codec.response_type.__name__} v{version}: {e}") from e
        return value

    def _read_frame(self) -> bytes:
        assert self._sock is not None
        while True:
            frame = self._decoder.next_frame()
            if frame is not None:
                return frame
            chunk = self._sock.recv(1 << 20)
            if not chunk:
                raise ConnectionError(f"{self.host}:{self.port} closed the connection")
            self._decoder.feed(chunk)
