"""The broker's listeners: one listening socket per entry of ``listeners``, and which
endpoints a client is told about.

:class:`Listeners` binds every listener (TLS on SSL and SASL_SSL ones), gives each
accepted connection its :class:`~shoal.security.session.ConnectionSecurity` (none on
the single PLAINTEXT listener of a broker without security settings, which then
serves exactly as before), and works out the advertised endpoints.

:func:`client_endpoint` answers "which host and port does this client use to reach
broker N": the endpoint of the listener the client's request came in on (Kafka's rule),
so a client connected over SASL_SSL is never sent to a PLAINTEXT port; None when that
broker has no such listener (it is then left out, as Kafka leaves it out).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

from ..server.listener import Listener, bind_error
from .client import PeerSecurity
from .listeners import ListenerError, ListenerSpec, advertised_endpoints, inter_broker_listener, listener_specs
from .session import BrokerSecurity, SecurityConfigError

log = logging.getLogger("shoal.security")

__all__ = [
    "REQUEST_LISTENER",
    "Listeners",
    "client_endpoint",
    "endpoint_on_request_listener",
    "listener_name",
    "own_endpoint",
]

REQUEST_LISTENER: ContextVar[str | None] = ContextVar("shoal_request_listener", default=None)
"""The listener of the request being handled, for code that gets no RequestContext (the
KIP-951 leader hints of Produce and Fetch); set by the connection before each handler."""


class Listeners:
    def __init__(self, broker: Any, new_connection: Callable[[], Any]) -> None:
        self._broker = broker
        self._new_connection = new_connection
        self._listeners: list[Listener] = []
        self.specs: list[ListenerSpec] = []
        self.host = ""
        self.port = 0
        self.advertised_host = ""
        self.advertised_port = 0

    async def start(self, host: str | None, port: int | None, *, accept: bool = True) -> None:
        """Bind every listener. Raises OSError (a bad setting, an address in use)."""
        b = self._broker
        try:
            specs = listener_specs(b.config, host, port)
            security = BrokerSecurity(b.config, specs, inter_broker_listener(b.config, specs))
        except (ListenerError, SecurityConfigError) as e:
            raise OSError(str(e)) from None
        b.security = security
        plain_only = len(specs) == 1 and not specs[0].secured
        bound: dict[str, tuple[str, int]] = {}
        try:
            for i, spec in enumerate(specs):
                listener = Listener(b, self._factory(security, spec, plain_only),
                                    ssl_context=security.contexts.get(spec.name), sweep_idle=i == 0)
                self._listeners.append(listener)
                try:
                    await listener.start(spec.host, spec.port, accept=accept)
                except OSError as e:
                    raise OSError(bind_error(spec.host or "", spec.port, e)) from None
                h, p = listener.sockets[0].getsockname()[:2]
                bound[spec.name] = (h, p)
                specs[i] = ListenerSpec(spec.name, spec.protocol, spec.host, p)
        except BaseException:
            self.close()
            raise
        security.specs = specs
        security.inter_broker = next(s for s in specs if s.name == security.inter_broker.name)
        try:
            security.advertised = advertised_endpoints(b.config, specs, bound)
        except ListenerError as e:
            self.close()
            raise OSError(str(e)) from None
        b.peer_security = None
        if b.config["metadata.store"] != "local" and security.inter_broker.secured:
            try:
                ctx, sasl = security.client_settings()
            except SecurityConfigError as e:
                self.close()
                raise OSError(str(e)) from None
            b.peer_security = PeerSecurity(ctx, sasl)
        self.specs = specs
        self.host, self.port = bound[specs[0].name]
        self.advertised_host, self.advertised_port = security.advertised[specs[0].name]
        if not plain_only:
            log.info("listeners: %s; inter-broker listener %s", ", ".join(
                f"{s.name}://{bound[s.name][0]}:{bound[s.name][1]} ({s.protocol}, advertised "
                f"{security.advertised[s.name][0]}:{security.advertised[s.name][1]})" for s in specs),
                security.inter_broker.name)

    def _factory(self, security: BrokerSecurity, spec: ListenerSpec, plain_only: bool) -> Callable[[], Any]:
        def make() -> Any:
            conn = self._new_connection()
            if not plain_only:
                conn.security = security.new_connection(spec)
            return conn

        return make

    def enable(self) -> None:
        for listener in self._listeners:
            listener.enable()

    def close(self) -> None:
        for listener in self._listeners:
            listener.close()

    @property
    def sockets(self) -> list[Any]:
        return [s for listener in self._listeners for s in listener.sockets]

    @property
    def open_connections(self) -> int:
        return sum(listener.open_connections for listener in self._listeners)

    @property
    def rejected(self) -> int:
        return sum(listener.rejected for listener in self._listeners)


def listener_name(ctx: Any) -> str | None:
    """The name of the listener the request of ``ctx`` came in on (None: the broker's only,
    default listener)."""
    sec = getattr(ctx.connection, "security", None)
    return sec.listener.name if sec is not None else None


def client_endpoint(ctx: Any, endpoint: Any) -> tuple[str, int] | None:
    """(host, port) of broker ``endpoint`` on the listener ``ctx``'s request came in on."""
    return _endpoint_on(listener_name(ctx), endpoint)


def _endpoint_on(name: str | None, endpoint: Any) -> tuple[str, int] | None:
    """(host, port) of ``endpoint`` on listener ``name`` (None: the broker's only listener);
    None when that broker has no such listener."""
    listeners = getattr(endpoint, "listeners", ())
    if name is None or not listeners:
        return endpoint.host, endpoint.port
    for n, h, p in listeners:
        if n == name:
            return h, p
    return None


def own_endpoint(ctx: Any) -> tuple[str, int]:
    """(host, port) of this broker on the listener ``ctx``'s request came in on."""
    b = ctx.broker
    name = listener_name(ctx)
    if name is None:
        return b.advertised_host, b.advertised_port
    return b.security.advertised[name]


def endpoint_on_request_listener(endpoint: Any) -> tuple[str, int] | None:
    """As :func:`client_endpoint`, for the listener of the request being handled."""
    return _endpoint_on(REQUEST_LISTENER.get(), endpoint)
