"""The observation endpoint: Prometheus metrics, health checks, the queue view and its JSON API.

A small HTTP/1.1 server on the broker's own event loop (``asyncio.start_server``), on
``metrics.port`` (off when -1). Each connection serves GET or HEAD requests one at a
time; every answer is computed on the event loop from the live objects, so nothing is
read while a handler changes it and no other thread touches broker state.

=====================  =============================================================
path                   answer
=====================  =============================================================
``/metrics``           Prometheus text format (``metrics.py``)
``/healthz``           200 ``ok`` while the event loop answers
``/readyz``            200 ``ready`` once the broker listens and its coordinators are
                       loaded, 503 before that and while shutting down
``/`` or ``/queues``   the queue view (``web/index.html``)
``/api/share-groups``  JSON: share groups, members, share-partitions (``views.py``)
``/api/consumer-groups``  JSON: groups with committed offsets and their lag
=====================  =============================================================

Requests are small: a request line and headers of at most 16 KiB, no body. Anything
else gets 400, 404 or 405 and the connection is closed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
from importlib import resources
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import CollectorRegistry

from .metrics import BrokerCollector, Metrics
from .views import consumer_group_views, share_group_views

__all__ = ["ObserveServer"]

log = logging.getLogger("shoal.observe")

_MAX_HEAD = 16 * 1024
_IDLE_TIMEOUT_S = 60.0
_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
            503: "Service Unavailable"}


def _page() -> bytes:
    return resources.files(__package__).joinpath("web/index.html").read_bytes()


class ObserveServer:
    """The HTTP endpoint of one broker. ``await start()``, then ``await stop()``."""

    def __init__(self, broker: Any, metrics: Metrics, host: str, port: int) -> None:
        self.broker = broker
        self.metrics = metrics
        self.host = host
        self.port = port
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(BrokerCollector(broker, metrics))
        self._server: asyncio.base_events.Server | None = None
        self._sock: socket.socket | None = None
        self._page = _page()
        self._clients: set[asyncio.Task[Any]] = set()

    def bind(self) -> None:
        """Bind the listening socket (before the broker loads its state, so a port in use
        shows at once); :meth:`start` serves on it. Raises OSError."""
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        self._sock = socket.create_server((self.host, self.port), family=family, reuse_port=False)
        self.host, self.port = self._sock.getsockname()[:2]

    @property
    def url(self) -> str:
        """``http://host:port/`` of this endpoint (the broker's advertised host when bound to every address)."""
        host = self.host if self.host not in ("", "0.0.0.0", "::") else self.broker.advertised_host
        return f"http://[{host}]:{self.port}/" if ":" in host else f"http://{host}:{self.port}/"

    def close(self) -> None:
        """Close a socket bound by :meth:`bind` and never served."""
        if self._sock is not None and self._server is None:
            self._sock.close()
        self._sock = None

    def _brokers(self) -> list[dict[str, Any]]:
        """Every broker of the cluster with its queue view's URL when it has one (this one alone
        without a cluster): a share-partition is shown by the broker that leads it."""
        b = self.broker
        store = getattr(b.cluster, "store", None) if b.cluster.clustered else None
        if store is None:
            return [{"node_id": b.node_id, "address": f"{b.advertised_host}:{b.advertised_port}",
                     "metrics_url": self.url, "self": True}]
        return [{"node_id": info.node_id, "address": f"{info.host}:{info.port}", "metrics_url": info.metrics_url,
                 "self": info.node_id == b.node_id}
                for info in sorted(store.snapshot.brokers.values(), key=lambda i: i.node_id)]

    async def start(self) -> None:
        if self._sock is None:
            self.bind()
        self._server = await asyncio.start_server(self._client, sock=self._sock)
        self.host, self.port = self._server.sockets[0].getsockname()[:2]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for t in list(self._clients):
            t.cancel()
        if self._clients:
            await asyncio.wait(list(self._clients), timeout=1.0)

    # -- one client -------------------------------------------------------------------
    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._clients.add(task)
        try:
            while True:
                try:
                    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), _IDLE_TIMEOUT_S)
                except (TimeoutError, asyncio.IncompleteReadError, ConnectionError):
                    return
                except asyncio.LimitOverrunError:
                    await self._send(writer, 400, b"request head too large\n", "text/plain", False)
                    return
                if len(head) > _MAX_HEAD:
                    await self._send(writer, 400, b"request head too large\n", "text/plain", False)
                    return
                lines = head.decode("latin-1").split("\r\n")
                parts = lines[0].split(" ")
                if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
                    await self._send(writer, 400, b"bad request line\n", "text/plain", False)
                    return
                method, target, version = parts
                headers = {}
                for line in lines[1:]:
                    name, sep, value = line.partition(":")
                    if sep:
                        headers[name.strip().lower()] = value.strip()
                if headers.get("content-length", "0") not in ("", "0") or "transfer-encoding" in headers:
                    await self._send(writer, 400, b"requests carry no body here\n", "text/plain", False)
                    return
                keep = version == "HTTP/1.1" and headers.get("connection", "").lower() != "close"
                if method not in ("GET", "HEAD"):
                    await self._send(writer, 405, b"only GET and HEAD\n", "text/plain", False)
                    return
                status, body, ctype = self._answer(target.split("?", 1)[0])
                await self._send(writer, status, b"" if method == "HEAD" else body, ctype, keep,
                                 length=len(body))
                if not keep:
                    return
        except asyncio.CancelledError:
            pass
        except Exception:
            log.exception("observe endpoint: request failed")
        finally:
            if task is not None:
                self._clients.discard(task)
            writer.close()

    async def _send(self, writer: asyncio.StreamWriter, status: int, body: bytes, ctype: str, keep: bool,
                    length: int | None = None) -> None:
        head = (f"HTTP/1.1 {status} {_REASONS.get(status, 'OK')}\r\n"
                f"Content-Type: {ctype}\r\nContent-Length: {len(body) if length is None else length}\r\n"
                f"Cache-Control: no-store\r\nConnection: {'keep-alive' if keep else 'close'}\r\n\r\n")
        writer.write(head.encode("latin-1") + body)
        await writer.drain()

    def _answer(self, path: str) -> tuple[int, bytes, str]:
        """(status, body, content type) for a GET of ``path``; computed now, on the event loop."""
        if path == "/metrics":
            return 200, generate_latest(self.registry), CONTENT_TYPE_LATEST
        if path == "/healthz":
            return 200, b"ok\n", "text/plain; charset=utf-8"
        if path == "/readyz":
            if self.broker.is_ready():
                return 200, b"ready\n", "text/plain; charset=utf-8"
            return 503, b"not ready\n", "text/plain; charset=utf-8"
        if path in ("/", "/queues", "/index.html"):
            return 200, self._page, "text/html; charset=utf-8"
        if path == "/api/share-groups":
            return 200, _json({"share_groups": share_group_views(self.broker), "brokers": self._brokers(),
                               "now_ms": self.broker.clock.now_ms()}), "application/json"
        if path == "/api/consumer-groups":
            return 200, _json({"consumer_groups": consumer_group_views(self.broker)}), "application/json"
        return 404, b"not found\n", "text/plain; charset=utf-8"


def _json(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()
