"""shoal/client's Connection against a fake peer: response frames that are too large or cut
short are one clear ProtocolViolation at once; client security properties are read as
Kafka's clients read them."""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Iterator

import pytest

from shoal.client.connection import Connection
from shoal.client.security import ClientSecurity, SecurityConfigError
from shoal.errors import ProtocolViolation


@pytest.fixture
def peer() -> Iterator[tuple[int, list[bytes]]]:
    """A listener that reads one request and answers with the next bytes of ``replies``, then closes."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    replies: list[bytes] = []

    def serve() -> None:
        try:
            conn, _ = srv.accept()
        except OSError:
            return
        with conn:
            conn.settimeout(10)
            try:
                conn.recv(65536)
                conn.sendall(replies[0])
                time.sleep(0.2)
            except OSError:
                pass

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield srv.getsockname()[1], replies
    srv.close()
    t.join(5)


def _connect_error(port: int) -> BaseException:
    conn = Connection("127.0.0.1", port, timeout_s=8)
    started = time.monotonic()
    with pytest.raises(BaseException) as info:
        conn.connect()
    assert time.monotonic() - started < 5, "the client waited instead of failing at once"
    assert not conn.connected
    return info.value


def test_a_tls_alert_as_the_answer_is_an_oversized_frame_with_a_hint(peer: tuple[int, list[bytes]]) -> None:
    port, replies = peer
    replies.append(b"\x15\x03\x03\x00\x02\x02\x46")  # what a TLS listener sends a plaintext client
    e = _connect_error(port)
    assert isinstance(e, ProtocolViolation), repr(e)
    assert f"127.0.0.1:{port}" in str(e) and "352518912 bytes" in str(e) and "security.protocol" in str(e)


def test_a_frame_beyond_the_maximum_is_refused_before_its_body(peer: tuple[int, list[bytes]]) -> None:
    port, replies = peer
    replies.append(struct.pack(">i", 300 << 20) + b"\x00" * 16)
    e = _connect_error(port)
    assert isinstance(e, ProtocolViolation) and "314572800 bytes" in str(e), repr(e)
    assert "security.protocol" not in str(e)


def test_a_frame_cut_short_by_the_peer_is_a_protocol_violation(peer: tuple[int, list[bytes]]) -> None:
    port, replies = peer
    replies.append(struct.pack(">i", 100) + b"\x00\x00\x00\x01" + b"\x00" * 10)
    e = _connect_error(port)
    assert isinstance(e, ProtocolViolation) and "86 bytes before the end" in str(e), repr(e)


def test_security_properties() -> None:
    assert ClientSecurity.from_properties({}).protocol == "PLAINTEXT"
    s = ClientSecurity.from_properties({"security.protocol": "sasl_plaintext", "sasl.mechanism": "SCRAM-SHA-512",
                                        "sasl.jaas.config": 'org.apache.kafka.common.security.scram.ScramLoginModule '
                                                            'required username="u" password="p w";'})
    assert (s.protocol, s.ssl_context, s.sasl) == ("SASL_PLAINTEXT", None, ("SCRAM-SHA-512", "u", "p w"))
    s = ClientSecurity.from_properties({"security.protocol": "SSL", "ssl.endpoint.identification.algorithm": ""})
    assert s.ssl_context is not None and not s.ssl_context.check_hostname
    assert ClientSecurity.from_properties({"security.protocol": "SSL"}).ssl_context.check_hostname
    for conf, words in [
        ({"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN"}, "needs a login"),
        ({"security.protocol": "SASL_PLAINTEXT", "sasl.username": "u", "sasl.password": "p"}, "GSSAPI"),
        ({"security.protocol": "TLS"}, "is not one of"),
        ({"security.protocol": "SSL", "ssl.truststore.location": "/nonexistent/ca.pem"}, "ssl.truststore.location"),
        ({"security.protocol": "SSL", "ssl.keystore.type": "JKS", "ssl.keystore.location": __file__}, "JKS"),
        ({"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN", "sasl.jaas.config": "x"}, "sasl.jaas"),
    ]:
        with pytest.raises(SecurityConfigError, match=words):
            ClientSecurity.from_properties(conf)
