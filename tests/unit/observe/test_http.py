"""The observation endpoint's readiness answer, on a fake broker (a real socket on 127.0.0.1)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from shoal.observe.http import ObserveServer
from shoal.observe.metrics import Metrics


class _Broker:
    def __init__(self) -> None:
        self.ready = False
        self.extensions: dict[str, Any] = {}
        self.connections: set[Any] = set()
        self.store = None
        self.node_id = 0
        self.advertised_host, self.advertised_port = "127.0.0.1", 9092
        self.cluster = type("LocalMetadata", (), {"clustered": False})()
        self.clock = type("Clock", (), {"now_ms": staticmethod(lambda: 1000)})()

    def is_ready(self) -> bool:
        return self.ready


async def _get(port: int, path: str) -> tuple[int, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
    data = await reader.read()
    writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


def test_readyz_follows_the_broker_and_healthz_does_not() -> None:
    async def body() -> None:
        broker = _Broker()
        server = ObserveServer(broker, Metrics(), "127.0.0.1", 0)
        await server.start()
        try:
            assert await _get(server.port, "/readyz") == (503, b"not ready\n")  # starting, or shutting down
            assert await _get(server.port, "/healthz") == (200, b"ok\n")
            broker.ready = True
            assert await _get(server.port, "/readyz") == (200, b"ready\n")
            status, doc = await _get(server.port, "/api/share-groups")
            assert status == 200 and json.loads(doc) == {
                "share_groups": [], "now_ms": 1000,
                "brokers": [{"node_id": 0, "address": "127.0.0.1:9092", "self": True,
                             "metrics_url": f"http://127.0.0.1:{server.port}/"}]}
        finally:
            await server.stop()

    asyncio.run(body())
