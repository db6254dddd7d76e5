"""The broker's security settings, and one connection's authentication state.

:class:`BrokerSecurity` is built once at start from the configuration: the listeners,
each TLS listener's SSLContext, each SASL listener's mechanisms and PLAIN users, and
what this broker presents when it connects to another one (``client_settings``). A
setting that cannot be used stops the start with one line naming it.

:class:`ConnectionSecurity` is one connection's state: its listener, its principal
(``User:ANONYMOUS``; ``User:<subject>`` of a verified client certificate on an SSL
listener; ``User:<name>`` once SASL succeeded) and, on a SASL listener, where the
exchange stands. Until SASL completes, only ApiVersions, SaslHandshake and
SaslAuthenticate are served: any other request closes the connection, as Kafka's
authenticator does. After a failed authentication nothing more is served and the
connection is closed once the failure has been answered.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import time
from collections.abc import Mapping
from typing import Any

from ..errors import ProtocolViolation
from .jaas import JaasError, login_credentials, parse_jaas, plain_users
from .listeners import ListenerSpec, listener_value
from .sasl import AuthenticationFailed
from .tls import TlsConfigError, client_context, peer_principal, server_context

log = logging.getLogger("shoal.security")

__all__ = ["PRE_AUTH_APIS", "BrokerSecurity", "ConnectionSecurity", "SecurityConfigError"]

SASL_HANDSHAKE, SASL_AUTHENTICATE, API_VERSIONS = 17, 36, 18
PRE_AUTH_APIS = frozenset({API_VERSIONS, SASL_HANDSHAKE, SASL_AUTHENTICATE})


class SecurityConfigError(ValueError):
    """A security setting the broker cannot start with."""


def _as_list(value: Any) -> list[str]:
    if isinstance(value, list):
        return value
    return [x.strip() for x in str(value or "").split(",") if x.strip()]


class BrokerSecurity:
    def __init__(self, config: Any, specs: list[ListenerSpec], inter_broker: ListenerSpec) -> None:
        self.config = config
        self.specs = specs
        self.inter_broker = inter_broker
        self.advertised: dict[str, tuple[str, int]] = {}
        """listener name -> (host, port) given to clients; set once the listeners are bound."""
        self.contexts: dict[str, Any] = {}
        self.mechanisms: dict[str, list[str]] = {}
        self._plain_users: dict[str, dict[str, str]] = {}
        try:
            for spec in specs:
                if spec.tls:
                    self.contexts[spec.name] = server_context(self.getter(spec.name))
                if spec.sasl:
                    self.mechanisms[spec.name] = _as_list(listener_value(config, spec.name, "sasl.enabled.mechanisms"))
                    if "PLAIN" in self.mechanisms[spec.name]:
                        self._plain_users[spec.name] = plain_users(self._jaas(spec.name, "PLAIN"))
        except (TlsConfigError, JaasError) as e:
            raise SecurityConfigError(f"listener {spec.name}: {e}") from None
        self.super_users = frozenset(p.strip() for p in str(config["super.users"]).split(";") if p.strip())
        self.broker_principals = self.inter_broker_principals()
        """Who may send the brokers' own APIs (shoal/security/access.py)."""
        self.failure_delay_s = config["connection.failed.authentication.delay.ms"] / 1000
        self.reauth_ms: int = config["connections.max.reauth.ms"]

    @property
    def secured(self) -> bool:
        """Whether any listener asks for TLS or SASL."""
        return any(s.secured for s in self.specs)

    def getter(self, listener: str) -> Any:
        return lambda key: listener_value(self.config, listener, key)

    def _jaas(self, listener: str, mechanism: str) -> list[Any]:
        text = listener_value(self.config, listener, f"{mechanism.lower()}.sasl.jaas.config")
        if not text:
            text = listener_value(self.config, listener, "sasl.jaas.config")
        return parse_jaas(text) if text else []

    def plain_users(self, listener: str) -> dict[str, str]:
        return self._plain_users.get(listener, {})

    def new_connection(self, spec: ListenerSpec) -> ConnectionSecurity:
        return ConnectionSecurity(self, spec)

    def client_settings(self) -> tuple[Any, tuple[str, str, str] | None]:
        """(SSLContext or None, (mechanism, username, password) or None) for connecting to the
        other brokers' inter-broker listener. Raises SecurityConfigError."""
        spec = self.inter_broker
        ctx = None
        try:
            if spec.tls:
                ctx = client_context(self.getter(spec.name))
            sasl = None
            if spec.sasl:
                mech = str(listener_value(self.config, spec.name, "sasl.mechanism.inter.broker.protocol"))
                creds = login_credentials(self._jaas(spec.name, mech))
                if creds is None:
                    raise SecurityConfigError(
                        f"inter-broker listener {spec.name} uses SASL/{mech}: its JAAS config "
                        f"(listener.name.{spec.name.lower()}.{mech.lower()}.sasl.jaas.config or sasl.jaas.config) "
                        "needs username and password")
                sasl = (mech, creds[0], creds[1])
        except (TlsConfigError, JaasError) as e:
            raise SecurityConfigError(f"inter-broker listener {spec.name}: {e}") from None
        return ctx, sasl

    def inter_broker_principals(self) -> frozenset[str]:
        """Principals other brokers authenticate as: the JAAS login user of the inter-broker
        listener's mechanism (SASL); on SSL, those named in ``super.users``."""
        spec = self.inter_broker
        out = set(self.super_users)
        if spec.sasl:
            mech = str(listener_value(self.config, spec.name, "sasl.mechanism.inter.broker.protocol"))
            try:
                creds = login_credentials(self._jaas(spec.name, mech))
            except JaasError:
                creds = None
            if creds is not None:
                out.add(f"User:{creds[0]}")
        return frozenset(out)


class ConnectionSecurity:
    __slots__ = (
        "authenticated",
        "broker_security",
        "expires_at",
        "failed",
        "handshake_done",
        "listener",
        "mechanism",
        "principal",
        "raw_tokens",
        "reauthenticating",
        "server",
    )

    def __init__(self, broker_security: BrokerSecurity, listener: ListenerSpec) -> None:
        self.broker_security = broker_security
        self.listener = listener
        self.principal = "User:ANONYMOUS"
        self.authenticated = not listener.sasl
        self.mechanism: str | None = None
        self.server: Any = None
        self.failed = False
        self.handshake_done = False
        self.raw_tokens = False
        """After a v0 SaslHandshake: the tokens come as bare frames, not in SaslAuthenticate."""
        self.expires_at = 0.0
        """With connections.max.reauth.ms: the monotonic time the SASL session ends (0: never)."""
        self.reauthenticating = False
        """Between a SaslHandshake on an authenticated connection and the end of its exchange."""

    def connection_made(self, conn: Any, transport: Any) -> None:
        if self.listener.tls:
            conn.sends_file_slices = False  # the bytes must go through TLS, not straight to the socket
            if self.listener.protocol == "SSL":
                try:
                    self.principal = peer_principal(transport.get_extra_info("ssl_object"))
                    log.debug("connection from %s on listener %s: principal %s", conn.peer, self.listener.name,
                              self.principal)
                except Exception as e:  # an unusual subject: keep serving, anonymously
                    log.warning("connection from %s: cannot read the client certificate's subject: %s",
                                conn.peer, e)

    def check(self, api_key: int) -> None:
        """Raise ProtocolViolation when a request with ``api_key`` may not be served now."""
        if self.failed:
            raise ProtocolViolation("a request after failed authentication")
        if not self.authenticated and api_key not in PRE_AUTH_APIS:
            raise ProtocolViolation(f"request of API {api_key} before SASL authentication completed")
        if self.expires_at and api_key not in PRE_AUTH_APIS and time.monotonic() > self.expires_at:
            raise ProtocolViolation(f"SASL session of {self.principal} expired without re-authentication "
                                    "(connections.max.reauth.ms)")


    async def step(self, conn: Any, token: bytes) -> bytes:
        """One SASL token: the token to answer with; AuthenticationFailed (after the failure
        delay) when the credentials are refused."""
        try:
            out = await self.server.step(token)
        except AuthenticationFailed as e:
            self.failed = True
            log.info("connection %s from %s: SASL/%s authentication failed on listener %s: %s", conn.connection_id,
                     conn.peer, self.mechanism, self.listener.name, e)
            await asyncio.sleep(self.broker_security.failure_delay_s)
            raise
        if self.server.complete:
            principal = f"User:{self.server.username}"
            if self.reauthenticating and principal != self.principal:
                self.failed = True
                raise AuthenticationFailed(f"Cannot change principals during re-authentication from "
                                           f"{self.principal} to {principal}")
            self.reauthenticating = False
            self.authenticated = True
            self.raw_tokens = False
            self.principal = principal
            lifetime_ms = self.broker_security.reauth_ms
            self.expires_at = time.monotonic() + lifetime_ms / 1000 if lifetime_ms > 0 else 0.0
            log.debug("connection %s from %s: authenticated as %s (SASL/%s, listener %s)", conn.connection_id,
                     conn.peer, self.principal, self.mechanism, self.listener.name)
        return out

    async def raw_token(self, conn: Any, body: bytes) -> bytes:
        """A bare token frame (after a v0 handshake): the answer's frame. Raises ProtocolViolation
        when authentication fails (Kafka closes such a connection without an answer)."""
        try:
            out = await self.step(conn, bytes(body))
        except AuthenticationFailed as e:
            raise ProtocolViolation(f"SASL authentication failed: {e}") from None
        return _I32.pack(len(out)) + out


_I32 = struct.Struct(">i")


def describe(specs: list[ListenerSpec], advertised: Mapping[str, tuple[str, int]]) -> str:
    return ", ".join(f"{s.name}://{advertised.get(s.name, (s.host, s.port))[0]}:"
                     f"{advertised.get(s.name, (s.host, s.port))[1]} ({s.protocol})" for s in specs)
