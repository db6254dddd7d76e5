"""The client side of TLS and SASL, for this broker's connections to other brokers.

A cluster's brokers reach each other on ``inter.broker.listener.name``. When that
listener is SSL or SASL_SSL, ``PeerConnection`` wraps the connection in TLS with
:attr:`PeerSecurity.ssl_context` (``ssl.truststore.*`` to check the other broker,
``ssl.keystore.*`` to show our own certificate when it asks for one). When it is SASL,
the connection authenticates before its first request: SaslHandshake v1, then
SaslAuthenticate v2 exchanges with PLAIN or SCRAM-SHA-256/512 (``scramp``'s client), as
``sasl.mechanism.inter.broker.protocol`` says, with the ``username`` and ``password``
of the listener's JAAS config.
"""

from __future__ import annotations

import io
import struct
from dataclasses import dataclass
from typing import Any

from kio.schema.sasl_authenticate.v2.request import SaslAuthenticateRequest
from kio.schema.sasl_handshake.v1.request import SaslHandshakeRequest
from kio.schema.sasl_handshake.v1.response import SaslHandshakeResponse
from kio.serial import entity_reader, entity_writer

__all__ = ["PeerSecurity", "authenticate"]

_HDR = struct.Struct(">hhi")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")


@dataclass(frozen=True, slots=True)
class PeerSecurity:
    ssl_context: Any = None
    sasl: tuple[str, str, str] | None = None
    """(mechanism, username, password)."""


async def _handshake(exchange: Any, mechanism: str, client_id: bytes) -> None:
    body = io.BytesIO()
    entity_writer(SaslHandshakeRequest)(body, SaslHandshakeRequest(mechanism=mechanism))
    payload = _HDR.pack(17, 1, 0) + _I16.pack(len(client_id)) + client_id + body.getvalue()  # header v1
    frame = await exchange(_I32.pack(len(payload)) + payload)
    response, _ = entity_reader(SaslHandshakeResponse)(frame, 4)  # response header v0: the correlation id
    if response.error_code != 0:
        raise ConnectionError(f"SASL handshake refused: {response.error_code.name} (the other broker offers "
                              f"{', '.join(response.mechanisms) or 'nothing'})")


async def authenticate(peer: Any, exchange: Any, sasl: tuple[str, str, str], client_id: bytes) -> None:
    """Authenticate ``peer`` (a connected PeerConnection); ``exchange(frame) -> response frame``
    sends one raw frame. Raises ConnectionError when the other broker refuses."""
    mechanism, user, password = sasl
    await _handshake(exchange, mechanism, client_id)

    async def step(token: bytes) -> bytes:
        r = await peer.call(36, 2, SaslAuthenticateRequest(auth_bytes=token))
        if r.error_code != 0:
            raise ConnectionError(f"SASL/{mechanism} authentication as {user!r} refused: {r.error_message}")
        return bytes(r.auth_bytes)

    if mechanism == "PLAIN":
        await step(b"\x00" + user.encode() + b"\x00" + password.encode())
        return
    from scramp import ScramClient, ScramException

    client = ScramClient([mechanism], user, password)
    server_first = await step(client.get_client_first().encode())
    try:
        client.set_server_first(server_first.decode())
        server_final = await step(client.get_client_final().encode())
        client.set_server_final(server_final.decode())
    except ScramException as e:
        raise ConnectionError(f"SASL/{mechanism}: the other broker's answer does not verify: {e}") from None
