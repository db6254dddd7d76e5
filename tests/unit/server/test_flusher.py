"""The broker's group-commit flusher, on a real partition log."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from shoal.log.partition_log import PartitionLog
from shoal.log.policy import LogConfig
from shoal.protocol.batch import build_batch
from shoal.server.broker import Clock, Flusher


def _batch(n: int) -> bytes:
    return build_batch([(b"k", b"v" * 10, [], 1000 + i) for i in range(n)])


class CountingLog(PartitionLog):
    syncs = 0

    def begin_flush(self):  # type: ignore[no-untyped-def]
        CountingLog.syncs += 1
        return super().begin_flush()


@pytest.mark.parametrize("inline", [True, False])
def test_appends_of_one_iteration_share_one_sync(tmp_path: Path, inline: bool) -> None:
    async def body() -> None:
        CountingLog.syncs = 0
        plog = CountingLog.open(tmp_path / "t-0", LogConfig())
        flusher = Flusher(Clock())
        waiters = []
        for _ in range(5):
            plog.append(_batch(2), 0, defer_flush=True)
            waiters.append(asyncio.ensure_future(flusher.durable(plog, plog.log_end_offset, inline=inline)))
        await asyncio.gather(*waiters)
        assert CountingLog.syncs == 1
        assert plog.unflushed_messages == 0
        plog.append(_batch(1), 0, defer_flush=True)
        await flusher.durable(plog, plog.log_end_offset, inline=inline)
        assert CountingLog.syncs == 2
        await flusher.durable(plog, plog.log_end_offset, inline=inline)  # already durable: no sync
        assert CountingLog.syncs == 2
        flusher.close()
        plog.close()

    asyncio.run(body())
