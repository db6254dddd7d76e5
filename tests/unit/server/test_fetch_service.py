"""The fetch service's long poll: a Fetch short of MinBytes parks as a delayed operation
watched in ``append_waiters``, completed by a notification of one of its partitions, its
deadline or shutdown, and reads again in its own task."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from types import SimpleNamespace

from shoal.errors import ErrorCode
from shoal.log.partition_log import PartitionLog
from shoal.log.policy import LogConfig
from shoal.server.broker import AppendWaiters, Clock
from shoal.server.fetch_service import FetchParams, FetchService
from shoal.server.fetch_session import FetchSessionCache, SessionPartition

from ..log.helpers import batch


class _Store:
    def __init__(self, log: PartitionLog) -> None:
        self.log = log

    def get_topic(self, name: str) -> SimpleNamespace | None:
        return SimpleNamespace(name=name, num_partitions=1) if name == "t" else None

    def partition(self, name: str, index: int) -> PartitionLog:
        return self.log


def _service(tmp_path: Path) -> tuple[FetchService, SimpleNamespace, PartitionLog]:
    log = PartitionLog.open(tmp_path / "t-0", LogConfig())
    broker = SimpleNamespace(store=_Store(log), config={"fetch.max.bytes": 1 << 20}, replicas=None, clock=Clock(),
                             shutting_down=False, append_waiters=AppendWaiters(), fetch_sessions=FetchSessionCache(10),
                             metrics=None)
    return FetchService(broker), broker, log  # type: ignore[arg-type]


def _params(offset: int, max_wait_ms: int, **kw: object) -> FetchParams:
    return FetchParams(partitions={("t", 0): SessionPartition(offset, 1 << 20)}, epochs={}, forgotten=[],
                       max_wait_ms=max_wait_ms, min_bytes=1, max_bytes=1 << 20, **kw)  # type: ignore[arg-type]


def _append(log: PartitionLog, n: int) -> None:
    log.append(batch(n), 1000)  # one broker: the high watermark is the log end


async def _parked(broker: SimpleNamespace, n: int) -> None:
    for _ in range(200):
        if broker.append_waiters.parked() == n:
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"{broker.append_waiters.parked()} parked, not {n}")


def test_a_parked_fetch_completes_when_its_partition_is_notified(tmp_path: Path) -> None:
    svc, broker, log = _service(tmp_path)
    _append(log, 2)

    async def run() -> None:
        task = asyncio.create_task(svc.fetch(_params(2, 30_000)))
        await _parked(broker, 1)
        _append(log, 3)  # the append itself reads nothing for the parked fetch
        broker.append_waiters.notify("t", 1)  # another partition: still parked
        await asyncio.sleep(0.02)
        assert not task.done()
        t0 = time.monotonic()
        broker.append_waiters.notify("t", 0)
        result = await asyncio.wait_for(task, 10)
        assert time.monotonic() - t0 < 5
        ((key, r),) = result.partitions
        assert key == ("t", 0) and r.error_code == ErrorCode.none
        assert (r.high_watermark, r.log_start_offset) == (5, 0)
        assert len(r.records) > 0
        assert broker.append_waiters.parked() == 0

    asyncio.run(run())


def test_a_parked_fetch_answers_empty_at_its_deadline_or_at_shutdown(tmp_path: Path) -> None:
    svc, broker, log = _service(tmp_path)
    _append(log, 1)

    async def run() -> None:
        t0 = time.monotonic()
        result = await svc.fetch(_params(1, 100))
        assert time.monotonic() - t0 >= 0.09
        ((_, r),) = result.partitions
        assert (r.error_code, r.high_watermark, len(r.records)) == (ErrorCode.none, 1, 0)

        task = asyncio.create_task(svc.fetch(_params(1, 30_000)))
        await _parked(broker, 1)
        broker.shutting_down = True
        broker.append_waiters.wake_all()
        result = await asyncio.wait_for(task, 10)
        ((_, r),) = result.partitions
        assert (r.error_code, len(r.records)) == (ErrorCode.none, 0)

    asyncio.run(run())


def test_an_error_or_enough_bytes_answer_at_once(tmp_path: Path) -> None:
    svc, _, log = _service(tmp_path)
    _append(log, 1)

    async def run() -> None:
        result = await asyncio.wait_for(svc.fetch(_params(0, 30_000)), 10)
        assert len(result.partitions[0][1].records) > 0
        params = _params(0, 30_000)
        params.partitions[("nope", 0)] = SessionPartition(0, 100)
        params.partitions.pop(("t", 0))
        result = await asyncio.wait_for(svc.fetch(params), 10)
        assert result.partitions[0][1].error_code == ErrorCode.unknown_topic_or_partition
        # a consumer may not READ the topic: refused, at once
        result = await asyncio.wait_for(svc.fetch(_params(1, 30_000, readable=lambda name: False)), 10)
        assert result.partitions[0][1].error_code == ErrorCode.topic_authorization_failed

    asyncio.run(run())
