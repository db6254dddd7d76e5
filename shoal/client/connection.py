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

With a :class:`~shoal.client.security.ClientSecurity` (``security=``), the socket is wrapped
in TLS before the first byte (SSL, SASL_SSL), and after ApiVersions the connection
authenticates (SASL_PLAINTEXT, SASL_SSL): SaslHandshake v1 names the mechanism, then
SaslAuthenticate carries PLAIN's one token or SCRAM's two rounds (``scramp``'s client,
which also checks the broker's final signature). A refusal is an :class:`AuthenticationError`
carrying the broker's message, and the connection is closed.

A response frame announcing more than ``max_frame_bytes`` (256 MiB by default: above any
response this client asks for, and below the ~335 MB a TLS record header or the 1.2 GB an
HTTP reply reads as) or cut short by the broker closing is a :class:`ProtocolViolation`
with one line saying so (and, for what looks like TLS, that the listener wants
security.protocol=SSL), raised at once: nothing is allocated from the announced size.

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
from typing import Any, Self

from kio.schema.errors import ErrorCode
from kio.serial import entity_reader, entity_writer

from ..errors import ProtocolViolation
from ..protocol.codec import codec_for
from ..protocol.entities import make
from ..protocol.framing import FrameDecoder
from ..protocol.header import read_uvarint
from .security import ClientSecurity

__all__ = [
    "API_VERSIONS",
    "MAX_FRAME_BYTES",
    "AuthenticationError",
    "Connection",
    "KafkaProtocolError",
    "parse_bootstrap",
]

API_VERSIONS = 18
SASL_HANDSHAKE = 17
SASL_AUTHENTICATE = 36
_HDR = struct.Struct(">hhi")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
MAX_FRAME_BYTES = 256 * 1024 * 1024
_TLS_RECORD_TYPES = (0x14, 0x15, 0x16, 0x17)


class KafkaProtocolError(Exception):
    """A request answered with an error code (``code`` is kio's ErrorCode)."""

    def __init__(self, code: ErrorCode | int, message: str = "") -> None:
        self.code = ErrorCode(int(code))
        super().__init__(f"{self.code.name}: {message}" if message else self.code.name)


class AuthenticationError(KafkaProtocolError):
    """The broker refused this client's SASL login (or its mechanism); the text names the
    error as Kafka spells it (``SASL_AUTHENTICATION_FAILED: <the broker's message>``)."""

    def __init__(self, code: ErrorCode | int, message: str) -> None:
        super().__init__(code, message)
        self.args = (f"{self.code.name.upper()}: {message}",)


def parse_bootstrap(bootstrap: str) -> tuple[str, int]:
    """First ``host:port`` of a Kafka bootstrap list (``PLAINTEXT://`` prefixes allowed)."""
    first = bootstrap.split(",")[0].strip()
    first = first.split("://")[-1]
    host, _, port = first.rpartition(":")
    return host or "127.0.0.1", int(port or 9092)


class Connection:
    """A blocking connection to one broker. Thread-safe through :attr:`lock`."""

    def __init__(self, host: str, port: int, *, client_id: str = "shoal-client", timeout_s: float = 30.0,
                 security: ClientSecurity | None = None, max_frame_bytes: int = MAX_FRAME_BYTES) -> None:
        self.host = host
        self.port = port
        self.security = security or ClientSecurity()
        self.max_frame_bytes = max_frame_bytes
        self.client_id = client_id
        self.timeout_s = timeout_s
        self.lock = threading.RLock()
        self._client_id_bytes = client_id.encode()
        self._correlation_id = 0
        self._sock: socket.socket | None = None
        self._decoder = FrameDecoder(max_frame_bytes)
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
            ctx = self.security.ssl_context
            if ctx is not None:
                try:
                    sock = ctx.wrap_socket(sock, server_hostname=self.host)
                except BaseException:
                    sock.close()
                    raise
            self._sock = sock
            self._decoder = FrameDecoder(self.max_frame_bytes)
            try:
                try:
                    self._negotiate()
                except ConnectionError as e:
                    if ctx is None:  # a TLS listener drops a plaintext ApiVersions, alert or not
                        raise ConnectionError(f"{e} before answering ApiVersions: is it an SSL or SASL_SSL "
                                              "listener? (set security.protocol)") from None
                    # TLS 1.3: a listener that wants a client certificate ends the connection only
                    # after the client's side of the handshake has completed
                    raise ConnectionError(f"{e} right after the TLS handshake: does the listener require a client "
                                          "certificate (ssl.keystore.location) it did not get or does not "
                                          "trust?") from None
                if self.security.sasl is not None:
                    self._authenticate(*self.security.sasl)
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

    def __enter__(self) -> Self:
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

    def _authenticate(self, mechanism: str, user: str, password: str) -> None:
        """SaslHandshake v1 and SaslAuthenticate; raises AuthenticationError when refused."""
        if SASL_HANDSHAKE not in self.broker_versions:
            raise AuthenticationError(ErrorCode.unsupported_sasl_mechanism,
                                      f"{self.host}:{self.port} does not serve SASL (is it a SASL listener?)")
        try:
            hs = self.call(SASL_HANDSHAKE, self.version_for(SASL_HANDSHAKE, 1, 1), mechanism=mechanism)
        except ConnectionError:
            raise AuthenticationError(ErrorCode.illegal_sasl_state,
                                      f"{self.host}:{self.port} closed the connection at the SASL handshake") from None
        if hs.error_code != ErrorCode.none:
            raise AuthenticationError(hs.error_code, f"the broker does not enable SASL mechanism {mechanism} "
                                      f"(it offers {', '.join(hs.mechanisms) or 'none'})")
        version = self.version_for(SASL_AUTHENTICATE, 0, 2)

        def step(token: bytes) -> bytes:
            try:
                r = self.call(SASL_AUTHENTICATE, version, auth_bytes=token)
            except ConnectionError:
                raise AuthenticationError(ErrorCode.sasl_authentication_failed,
                                          f"{self.host}:{self.port} closed the connection during SASL/{mechanism} "
                                          f"authentication as {user!r}") from None
            if r.error_code != ErrorCode.none:
                raise AuthenticationError(r.error_code, r.error_message or f"SASL/{mechanism} login as {user!r} "
                                          "refused")
            return bytes(r.auth_bytes)

        if mechanism == "PLAIN":
            step(b"\x00" + user.encode() + b"\x00" + password.encode())
            return
        from scramp import ScramClient, ScramException

        client = ScramClient([mechanism], user, password)
        server_first = step(client.get_client_first().encode())
        try:
            client.set_server_first(server_first.decode())
            server_final = step(client.get_client_final().encode())
            client.set_server_final(server_final.decode())
        except (ScramException, UnicodeDecodeError) as e:
            raise AuthenticationError(ErrorCode.sasl_authentication_failed,
                                      f"SASL/{mechanism}: the broker's answer does not verify: {e}") from None

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

    def send(self, request: Any, *, response_type: type | None = None) -> Any:
        """Send a kio request entity; return the response entity of the same version
        (read as ``response_type`` when given: a lenient copy, see :mod:`.lenient`).

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
        reader_type = codec.response_type if response_type is None else response_type
        try:
            value, _ = entity_reader(reader_type)(frame, pos)
        except Exception as e:
            raise ProtocolViolation(f"cannot decode {codec.response_type.__name__} v{version}: {e}") from e
        return value

    def _read_frame(self) -> bytes:
        assert self._sock is not None
        first = b""
        while True:
            try:
                frame = self._decoder.next_frame()
            except ProtocolViolation as e:
                raise self._bad_frame(first, e) from None
            if frame is not None:
                return frame
            chunk = self._sock.recv(1 << 20)
            if not first:
                first = chunk[:1]
            if not chunk:
                self._decoder.feed(b"")
                try:
                    self._decoder.next_frame()
                except ProtocolViolation as e:  # the broker closed inside a response
                    raise self._bad_frame(first, e) from None
                raise ConnectionError(f"{self.host}:{self.port} closed the connection")
            self._decoder.feed(chunk)

    def _bad_frame(self, first: bytes, e: ProtocolViolation) -> ProtocolViolation:
        text = str(e).replace(" (socket.request.max.bytes)", "")
        hint = ""
        if first and first[0] in _TLS_RECORD_TYPES and self.security.ssl_context is None:
            hint = " (it looks like TLS: is it an SSL or SASL_SSL listener? set security.protocol)"
        return ProtocolViolation(f"bad response from {self.host}:{self.port}: {text}{hint}")
