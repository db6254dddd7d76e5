"""SaslHandshake (17) and SaslAuthenticate (36): SASL authentication on SASL listeners.

The client names a mechanism (SaslHandshake) and then sends its tokens in
SaslAuthenticate requests (v1 handshake), or as bare size-prefixed frames after a v0
handshake (Kafka's original framing; ``ConnectionSecurity.raw_tokens``). On a
listener without SASL both answer ILLEGAL_SASL_STATE, as Kafka does; so does a second
handshake, or SaslAuthenticate before the handshake or after success.

An unknown or disabled mechanism answers UNSUPPORTED_SASL_MECHANISM with the enabled
ones, and the connection is closed. A failed authentication answers
SASL_AUTHENTICATION_FAILED after ``connection.failed.authentication.delay.ms`` and the
connection is closed once that answer is written. With ``connections.max.reauth.ms``
the answer's ``session_lifetime_ms`` tells the client when to authenticate again (KIP-368:
a v1 handshake and SaslAuthenticate on the same connection, same mechanism and principal);
a request after the session ended closes the connection.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from ...errors import ErrorCode
from ...protocol.messages.sasl_authenticate_request import SaslAuthenticateRequest
from ...protocol.messages.sasl_authenticate_response import SaslAuthenticateResponse
from ...protocol.messages.sasl_handshake_request import SaslHandshakeRequest
from ...protocol.messages.sasl_handshake_response import SaslHandshakeResponse
from ...security.credentials import scram_store
from ...security.sasl import AuthenticationFailed, PlainServer, ScramServer
from ..context import RequestContext
from ..dispatch import api

if TYPE_CHECKING:
    from ..connection import Connection

log = logging.getLogger("shoal.security")


def close_after_answer(conn: Connection) -> None:
    """Close ``conn`` once the answer of the request being handled is written: the current
    task's done callbacks run in order, and the connection's (which writes the answer)
    was added first."""
    task = asyncio.current_task()

    def close(_t: asyncio.Task[object]) -> None:
        if conn.transport is not None:
            conn.transport.pause_reading()
            conn.transport.close()

    if task is not None:
        task.add_done_callback(close)


def _mechanism_server(ctx: RequestContext, name: str) -> PlainServer | ScramServer:
    sec = ctx.connection.security
    if name == "PLAIN":
        return PlainServer(sec.broker_security.plain_users(sec.listener.name))
    return ScramServer(name, scram_store(ctx.broker))


@api(17, 0, 1)
async def handle_sasl_handshake(ctx: RequestContext, request: SaslHandshakeRequest) -> SaslHandshakeResponse:
    sec = ctx.connection.security
    if sec is None or not sec.listener.sasl:
        return SaslHandshakeResponse(error_code=ErrorCode.illegal_sasl_state)
    # re-authentication (KIP-368): a v1 handshake on an authenticated connection, when sessions expire
    reauth = sec.authenticated and sec.broker_security.reauth_ms > 0 and ctx.api_version >= 1
    if (sec.handshake_done and not sec.authenticated) or sec.reauthenticating or (sec.authenticated and not reauth):
        return SaslHandshakeResponse(error_code=ErrorCode.illegal_sasl_state)
    enabled = sec.broker_security.mechanisms.get(sec.listener.name, [])
    if request.mechanism not in enabled or (reauth and request.mechanism != sec.mechanism):
        log.info("connection %s from %s: SASL mechanism %r is not enabled on listener %s; closing",
                 ctx.connection.connection_id, ctx.connection.peer, request.mechanism, sec.listener.name)
        sec.failed = True
        close_after_answer(ctx.connection)
        return SaslHandshakeResponse(error_code=ErrorCode.unsupported_sasl_mechanism, mechanisms=tuple(enabled))
    sec.handshake_done = True
    sec.reauthenticating = reauth
    sec.mechanism = request.mechanism
    sec.server = _mechanism_server(ctx, request.mechanism)
    sec.raw_tokens = ctx.api_version == 0
    return SaslHandshakeResponse(mechanisms=tuple(enabled))


@api(36, 0, 2)
async def handle_sasl_authenticate(ctx: RequestContext, request: SaslAuthenticateRequest) -> SaslAuthenticateResponse:
    conn = ctx.connection
    sec = conn.security
    if sec is None or not sec.listener.sasl or sec.server is None or sec.raw_tokens or (
            sec.authenticated and not sec.reauthenticating):
        return SaslAuthenticateResponse(error_code=ErrorCode.illegal_sasl_state,
                                        error_message="SaslAuthenticate is not expected now")
    try:
        out = await sec.step(conn, request.auth_bytes)
    except AuthenticationFailed as e:
        close_after_answer(conn)
        return SaslAuthenticateResponse(error_code=ErrorCode.sasl_authentication_failed, error_message=str(e))
    lifetime = sec.broker_security.reauth_ms if sec.server.complete else 0
    return SaslAuthenticateResponse(auth_bytes=out, session_lifetime=lifetime)
