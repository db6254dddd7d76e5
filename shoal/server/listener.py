"""The listening socket: connection limits, and closing idle connections.

Theory of operation
-------------------
The broker accepts connections itself (a reader callback on the non-blocking listening
socket) rather than through ``loop.create_server``, so that it can stop accepting:

* ``max.connections``: at that many open connections the broker stops accepting; new
  connections wait in the kernel's backlog until one closes (Kafka's acceptor also
  waits for a free slot rather than refusing).
* ``max.connections.per.ip`` and ``max.connections.per.ip.overrides``: a connection from
  an address that already has its maximum is accepted and closed at once, and logged
  (Kafka's ``TooManyConnectionsException``).
* ``accept`` failing for want of descriptors or memory (EMFILE, ENFILE, ENOBUFS,
  ENOMEM) is logged and accepting pauses for a second; everything open keeps being
  served.

``connections.max.idle.ms``: a sweep, a few times per timeout, closes connections with
no bytes received or sent for that long and no request in progress. A connection muted
while it waits for request memory (``queued.max.request.bytes``) receives nothing, so
it is idle too. Closing goes through the normal disconnect path, so a share consumer's
idle connection releases its share session as any disconnect does.

Event loop only.
"""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import logging
import socket
from collections.abc import Callable
from typing import Any

log = logging.getLogger("shoal.connection")

__all__ = ["Listener", "bind_error", "parse_ip_overrides"]

_OUT_OF_RESOURCES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
_ACCEPT_PAUSE_S = 1.0
_ACCEPTS_PER_WAKEUP = 64


def parse_ip_overrides(value: str) -> dict[str, int]:
    """``max.connections.per.ip.overrides``: ``host-or-ip:count`` pairs, comma separated.

    Host names are resolved to addresses here. Raises ValueError for a malformed entry.
    """
    out: dict[str, int] = {}
    for entry in value.split(","):
        entry = entry.strip()
        if not entry:
            continue
        host, sep, count = entry.rpartition(":")
        host = host.strip().strip("[]")
        if not sep or not host:
            raise ValueError(f"{entry!r} is not host:count")
        n = int(count)
        if n < 0:
            raise ValueError(f"{entry!r}: the count must not be negative")
        try:
            addr = str(ipaddress.ip_address(host))
        except ValueError:
            try:
                addr = socket.gethostbyname(host)
            except OSError as e:
                raise ValueError(f"{entry!r}: cannot resolve {host!r}: {e}") from None
        out[addr] = n
    return out


class Listener:
    def __init__(self, broker: Any, factory: Callable[[], Any], *, ssl_context: Any = None,
                 sweep_idle: bool = True) -> None:
        """``ssl_context``: TLS on every accepted connection (an SSL or SASL_SSL listener).
        ``sweep_idle``: this listener closes the broker's idle connections (one of a broker's
        listeners does, for all of them)."""
        cfg = broker.config
        self._ssl = ssl_context
        self._sweep_idle = sweep_idle
        self._broker = broker
        self._factory = factory
        self._max_connections: int = cfg["max.connections"]
        self._max_per_ip: int = cfg["max.connections.per.ip"]
        self._per_ip_overrides = parse_ip_overrides(cfg["max.connections.per.ip.overrides"])
        self._idle_ms: int = cfg["connections.max.idle.ms"]
        self._socks: list[socket.socket] = []
        self._loop = asyncio.get_running_loop()
        self._accepting = False
        self._enabled = False
        self._paused_until = 0.0
        self._open = 0
        self._per_ip: dict[str, int] = {}
        self._sweeper: asyncio.TimerHandle | None = None
        self.rejected = 0
        """Connections closed at once because their address had its maximum."""

    # -- listening ----------------------------------------------------------------------
    async def start(self, host: str, port: int, backlog: int = 1024, *, accept: bool = True) -> None:
        """Listen on every address ``host`` resolves to (all interfaces when empty), as
        ``loop.create_server`` does. Raises OSError when an address cannot be bound.

        ``accept=False`` binds and listens without accepting yet (the kernel queues
        connections) until :meth:`enable`: a cluster broker knows its port at once but
        serves clients only once it is registered and sees itself in the metadata."""
        infos = await self._loop.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        seen: set[tuple[int, Any]] = set()
        socks: list[socket.socket] = []
        try:
            for family, kind, proto, _, addr in infos:
                if (family, addr) in seen:
                    continue
                seen.add((family, addr))
                sock = socket.socket(family, kind, proto)
                socks.append(sock)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if family == socket.AF_INET6 and hasattr(socket, "IPPROTO_IPV6"):
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                sock.bind(addr)
                sock.listen(backlog)
                sock.setblocking(False)
        except BaseException:
            for sock in socks:
                sock.close()
            raise
        self._socks = socks
        self._enabled = accept
        self._resume_accepting()
        if self._idle_ms > 0 and self._sweep_idle:
            self._schedule_sweep()

    def enable(self) -> None:
        """Start accepting connections (after ``start(..., accept=False)``)."""
        self._enabled = True
        self._resume_accepting()

    @property
    def sockets(self) -> list[socket.socket]:
        return list(self._socks)

    @property
    def open_connections(self) -> int:
        return self._open

    def close(self) -> None:
        """Stop listening (at shutdown); open connections are not touched."""
        self._pause_accepting()
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        for sock in self._socks:
            sock.close()
        self._socks = []

    def _resume_accepting(self) -> None:
        if self._accepting or not self._enabled or not self._socks or self._broker.shutting_down:
            return
        if self._open >= self._max_connections or self._loop.time() < self._paused_until:
            return
        self._accepting = True
        for sock in self._socks:
            self._loop.add_reader(sock.fileno(), self._accept, sock)

    def _end_accept_pause(self) -> None:
        self._paused_until = 0.0
        self._resume_accepting()

    def _pause_accepting(self) -> None:
        if self._accepting:
            for sock in self._socks:
                self._loop.remove_reader(sock.fileno())
        self._accepting = False

    def _accept(self, sock: socket.socket) -> None:
        for _ in range(_ACCEPTS_PER_WAKEUP):
            if not self._accepting or self._open >= self._max_connections:
                self._pause_accepting()
                return
            try:
                conn, addr = sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                if e.errno in _OUT_OF_RESOURCES:
                    log.error("cannot accept a connection (%s) with %d open; retrying in %.0f s",
                              e.strerror or e, self._open, _ACCEPT_PAUSE_S)
                    self._pause_accepting()
                    self._paused_until = self._loop.time() + _ACCEPT_PAUSE_S
                    self._loop.call_later(_ACCEPT_PAUSE_S, self._end_accept_pause)
                    return
                if e.errno in (errno.ECONNABORTED, errno.EPROTO, errno.EPERM):
                    continue  # the peer went away before we took it
                log.exception("accept failed")
                return
            ip = addr[0] if isinstance(addr, tuple) else str(addr)
            limit = self._per_ip_overrides.get(ip, self._max_per_ip)
            if self._per_ip.get(ip, 0) >= limit:
                self.rejected += 1
                log.info("rejected a connection from %s: it already has the maximum of %d connections "
                         "(max.connections.per.ip)", ip, limit)
                conn.close()
                continue
            self._open += 1
            self._per_ip[ip] = self._per_ip.get(ip, 0) + 1
            task = asyncio.ensure_future(self._connect(conn, ip))
            task.add_done_callback(_log_connect_failure)

    async def _connect(self, sock: socket.socket, ip: str) -> None:
        try:
            if self._ssl is None:
                _, protocol = await self._loop.connect_accepted_socket(self._factory, sock)
            else:  # the transport's protocol is TLS's; the connection is what the factory made
                made: list[Any] = []

                def make_protocol() -> Any:
                    made.append(self._factory())
                    return made[0]
                await self._loop.connect_accepted_socket(make_protocol, sock, ssl=self._ssl)
                protocol = made[0]
        except (TimeoutError, OSError) as e:  # a TLS handshake that failed, a peer gone
            sock.close()
            self._released(ip)
            if self._ssl is None:
                raise
            log.info("TLS handshake with %s failed: %s", ip, e)
            return
        except BaseException:
            sock.close()
            self._released(ip)
            raise
        protocol.closed.add_done_callback(lambda _f: self._released(ip))

    def _released(self, ip: str) -> None:
        self._open -= 1
        n = self._per_ip.get(ip, 0) - 1
        if n > 0:
            self._per_ip[ip] = n
        else:
            self._per_ip.pop(ip, None)
        if not self._accepting:
            self._resume_accepting()

    # -- idle connections ---------------------------------------------------------------
    def _schedule_sweep(self) -> None:
        interval_s = min(max(self._idle_ms / 4000, 0.01), 1.0)
        self._sweeper = self._loop.call_later(interval_s, self._sweep)

    def _sweep(self) -> None:
        self._sweeper = None
        if self._broker.shutting_down:
            return
        now = self._loop.time()
        idle_s = self._idle_ms / 1000
        for conn in list(self._broker.connections):
            if now - conn.last_active_s > idle_s and conn.inflight == 0:
                conn.close_idle(now - conn.last_active_s)
        self._schedule_sweep()


def _log_connect_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("setting up an accepted connection failed", exc_info=task.exception())


def bind_error(host: str, port: int, e: OSError, what: str = "") -> str:
    """``cannot listen on 127.0.0.1:9092: address already in use`` (``what`` names the setting)."""
    reason = (e.strerror or str(e) or type(e).__name__)
    reason = reason[:1].lower() + reason[1:]
    address = f"[{host}]:{port}" if ":" in host else f"{host or '0.0.0.0'}:{port}"
    return f"cannot listen on {address}{what}: {reason}"
