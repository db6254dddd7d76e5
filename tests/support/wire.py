"""Raw Kafka requests over a plain socket, for tests of what real clients never send.

``RawConnection(bootstrap)`` writes framed requests built from kio entities (request
header v1, or v2 for flexible versions, written here by hand) and reads framed
responses back, decoding them with kio. It speaks only to the broker under test.
"""

from __future__ import annotations

import io
import socket
import struct
from typing import Any

from kio.index import load_response_schema
from kio.serial import entity_reader, entity_writer

__all__ = ["RawConnection", "frame", "request_bytes"]

_API_VERSIONS = 18


def frame(body: bytes) -> bytes:
    return struct.pack(">i", len(body)) + body


def request_bytes(entity: Any, correlation_id: int, client_id: str | None = "shoal-tests",
                  *, api_version: int | None = None, api_key: int | None = None) -> bytes:
    """A framed request: header (v1, or v2 when the entity's version is flexible) and body.

    ``api_version``/``api_key`` override the header fields only (to send a version the body
    does not match, or an unknown API).
    """
    cls = type(entity)
    key = cls.__api_key__ if api_key is None else api_key
    version = cls.__version__ if api_version is None else api_version
    header = struct.pack(">hhi", key, version, correlation_id)
    if client_id is None:
        header += struct.pack(">h", -1)
    else:
        raw = client_id.encode()
        header += struct.pack(">h", len(raw)) + raw
    if cls.__flexible__:
        header += b"\x00"  # no tagged fields
    buf = io.BytesIO()
    entity_writer(cls)(buf, entity)
    return frame(header + buf.getvalue())


class RawConnection:
    def __init__(self, bootstrap: str, timeout_s: float = 10.0) -> None:
        host, _, port = bootstrap.rpartition(":")
        self.sock = socket.create_connection((host, int(port)), timeout=timeout_s)
        self._buf = b""

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RawConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _recv_exact(self, n: int) -> bytes | None:
        while len(self._buf) < n:
            chunk = self.sock.recv(65536)
            if not chunk:
                return None
            self._buf += chunk
        out, self._buf = self._buf[:n], self._buf[n:]
        return out

    def read_frame(self) -> bytes | None:
        """The next response frame's body, or None if the broker closed the connection."""
        size = self._recv_exact(4)
        if size is None:
            return None
        (n,) = struct.unpack(">i", size)
        return self._recv_exact(n)

    def read_response(self, api_key: int, api_version: int) -> tuple[int, Any]:
        """(correlation id, decoded response entity) of the next response."""
        body = self.read_frame()
        assert body is not None, "connection closed by the broker instead of a response"
        (correlation_id,) = struct.unpack_from(">i", body, 0)
        cls = load_response_schema(api_key, api_version)
        pos = 4
        if cls.__flexible__ and api_key != _API_VERSIONS:
            assert body[pos] == 0, "response header v1 with tagged fields"
            pos += 1
        value, used = entity_reader(cls)(body, pos)
        assert pos + used == len(body), f"{len(body) - pos - used} bytes left after the response"
        return correlation_id, value

    def read_canonical(self, api_key: int, api_version: int, correlation_id: int) -> Any:
        """The next answer, decoded, after checking its correlation id, that its body is read
        to the end, and that its bytes are exactly kio's encoding of the values read."""
        body = self.read_frame()
        assert body is not None, "the broker closed the connection instead of answering"
        assert struct.unpack_from(">i", body)[0] == correlation_id
        cls = load_response_schema(api_key, api_version)
        pos = 4 + (1 if cls.__flexible__ and api_key != _API_VERSIONS else 0)
        value, used = entity_reader(cls)(body, pos)
        assert pos + used == len(body)
        out = io.BytesIO()
        entity_writer(cls)(out, value)
        assert out.getvalue() == body[pos:], "the answer's bytes differ from kio's encoding of its values"
        return value

    def request(self, entity: Any, correlation_id: int = 1) -> Any:
        self.send(request_bytes(entity, correlation_id))
        cid, response = self.read_response(type(entity).__api_key__, type(entity).__version__)
        assert cid == correlation_id
        return response

    def is_closed_by_peer(self, timeout_s: float = 5.0) -> bool:
        """Whether the broker closes the connection (EOF or reset) within ``timeout_s``."""
        self.sock.settimeout(timeout_s)
        try:
            while True:
                chunk = self.sock.recv(65536)
                if not chunk:
                    return True
        except (ConnectionResetError, BrokenPipeError):
            return True
        except TimeoutError:
            return False


def raw_batch(payload: bytes, records_count: int, *, attributes: int = 0, last_offset_delta: int | None = None,
              base_timestamp: int = 1_700_000_000_000, max_timestamp: int | None = None,
              producer_id: int = -1, producer_epoch: int = -1, base_sequence: int = -1) -> bytes:
    """A v2 batch header with a correct CRC-32C around ``payload``, whatever the payload holds.

    For tests of what a broker must refuse although the CRC matches (garbage records,
    a count the records do not fill, unknown codecs, control batches).
    """
    import crc32c

    if last_offset_delta is None:
        last_offset_delta = max(records_count - 1, 0)
    if max_timestamp is None:
        max_timestamp = base_timestamp
    out = bytearray(struct.pack(">qiibIhiqqqhii", 0, 49 + len(payload), -1, 2, 0, attributes, last_offset_delta,
                                base_timestamp, max_timestamp, producer_id, producer_epoch, base_sequence,
                                records_count))
    out += payload
    struct.pack_into(">I", out, 17, crc32c.crc32c(bytes(out[21:])))
    return bytes(out)
