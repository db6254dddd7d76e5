"""A follower's background fsync passes: paced, and covering every round fetched."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from shoal.cluster import fetcher as fetcher_module
from shoal.cluster.fetcher import Fetcher, FetchState
from shoal.protocol.fetch_response import write_fetch_response

GAP = 0.05


class FakeManager:
    """The replica manager as the fetcher sees it: appends count up, passes are recorded."""

    node_id = 2
    config = {"replica.fetch.backoff.ms": 10, "replica.fetch.max.bytes": 1 << 20,
              "replica.fetch.wait.max.ms": 10, "fetch.max.bytes": 1 << 20}

    def __init__(self) -> None:
        self.leo: dict[tuple[str, int], int] = {}
        self.appended_at: dict[tuple[str, int], float] = {}
        self.passes: list[tuple[float, float, set[tuple[str, int]]]] = []

    def append_follower(self, key: tuple[str, int], records: Any, hw: int, log_start: int) -> int:
        if records:
            self.leo[key] = self.leo.get(key, 0) + 1
            self.appended_at[key] = asyncio.get_running_loop().time()
        return self.leo.get(key, 0)

    async def flush_followers(self, keys: list[tuple[str, int]]) -> None:
        loop = asyncio.get_running_loop()
        start = loop.time()
        await asyncio.sleep(0.01)  # the fsyncs
        self.passes.append((start, loop.time(), set(keys)))


def _response(partition: int) -> memoryview:
    pieces = write_fetch_response(12, 0, 0, [("t", [(partition, 0, 1, 1, 0, b"x" * 10)])])
    return memoryview(b"".join(bytes(p) for p in pieces))  # type: ignore[arg-type]


def test_passes_are_paced_and_cover_every_round(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fetcher_module, "FLUSH_GAP_S", GAP)

    async def body() -> None:
        manager = FakeManager()
        f = Fetcher(manager, 1, "localhost", 1)  # type: ignore[arg-type]
        keys = [("t", 0), ("t", 1)]
        for key in keys:
            f.partitions[key] = FetchState(leader_epoch=0, fetch_offset=0, needs_truncation=False)
        rounds = 0

        async def answer(api_key: int, version: int, request: bytes) -> memoryview:
            return _response(rounds % 2)

        f._conn.call_body = answer  # type: ignore[method-assign]
        for rounds in range(30):  # a fetch round every 5 ms, alternating partitions
            await f._fetch(dict(f.partitions))
            await asyncio.sleep(0.005)
        while f._flushing is not None:
            await asyncio.sleep(0.01)

        passes = manager.passes
        assert 2 <= len(passes) < 30  # many rounds per pass
        for (_, end, _), (start, _, _) in zip(passes, passes[1:]):
            assert start >= end + GAP - 0.001
        for key in keys:  # the last round of each partition is in a pass that started after it
            assert any(key in flushed and start >= manager.appended_at[key] for start, _, flushed in passes)
        assert f._dirty == set()

    asyncio.run(body())


def test_a_closed_fetcher_starts_no_more_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fetcher_module, "FLUSH_GAP_S", GAP)

    async def body() -> None:
        manager = FakeManager()
        f = Fetcher(manager, 1, "localhost", 1)  # type: ignore[arg-type]
        f.partitions[("t", 0)] = FetchState(leader_epoch=0, fetch_offset=0, needs_truncation=False)

        async def answer(api_key: int, version: int, request: bytes) -> memoryview:
            return _response(0)

        f._conn.call_body = answer  # type: ignore[method-assign]
        await f._fetch(dict(f.partitions))
        while not manager.passes:
            await asyncio.sleep(0.005)
        await f._fetch(dict(f.partitions))  # dirty again, during the gap
        await f.close()
        await asyncio.sleep(GAP * 3)
        assert len(manager.passes) == 1
        assert f._flushing is None

    asyncio.run(body())
