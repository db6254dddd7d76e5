"""Coordinator writes with group commit (``CoordinatorRuntime.apply_durable``).

Through the share service on a real log store: an acknowledgement is not settled while
its write's fsync is held back, concurrent share-state writes share one fsync, and a
failed fsync fails the waiting write, marks the partition failed and halts.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from shoal.errors import ApiError
from shoal.log import partition_log
from shoal.server.share_service import SHARE_STATE_TOPIC, ShareService
from shoal.share.coordinator import SharePartitionKey
from shoal.share.partition import UpdateStatus
from shoal.share.state import AcknowledgeType, RecordState

from .test_share_service import FakeBroker, _topic_with_records

ONE_STATE_PARTITION = {"share.coordinator.state.topic.num.partitions": "1"}


class GatedFlusher:
    """A slow disk: every ``durable`` waits for ``gate``, then fails or uses the real flusher."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.gate = asyncio.Event()
        self.fail = False
        self.calls = 0

    async def durable(self, plog: Any, end_offset: int, *, inline: bool = False) -> None:
        self.calls += 1
        await self.gate.wait()
        if self.fail:
            raise OSError(5, "Input/output error")
        await self.real.durable(plog, end_offset, inline=inline)


def _acked(b: FakeBroker, svc: ShareService, topic: str) -> tuple[Any, Any]:
    tid = _topic_with_records(b, topic, 4)
    b.dynamic_configs.set_group("g", {"share.auto.offset.reset": "earliest"})
    sp = svc.get_partition("g", tid, 0)
    sp.acquire("m", [(0, 3)], b.clock.now_ms(), 10)
    update = sp.acknowledge("m", [(0, 1, [AcknowledgeType.ACCEPT])], b.clock.now_ms())
    return sp, update


def test_acknowledgement_settles_only_after_its_fsync(tmp_path: Path) -> None:
    async def body() -> None:
        b = FakeBroker(tmp_path, **ONE_STATE_PARTITION)
        svc = ShareService(b)
        svc.start()
        real = b.flusher
        b.flusher = gated = GatedFlusher(real)  # type: ignore[assignment]
        sp, update = _acked(b, svc, "t")
        waiter = asyncio.ensure_future(svc.wait_for(sp, update))
        await asyncio.sleep(0.05)
        assert gated.calls == 1 and not waiter.done()
        assert update.status is UpdateStatus.PENDING and sp.start_offset == 0
        plog = b.store.partition(SHARE_STATE_TOPIC, 0)
        assert plog.unflushed_messages == 1  # appended, not yet fsynced
        # Replayed at once: the next operation on the shard sees the write.
        key = SharePartitionKey.of("g", sp.topic_id, 0)
        assert svc.persister.read(key).state.start_offset == 2
        gated.gate.set()
        await waiter
        assert update.status is UpdateStatus.COMMITTED and sp.start_offset == 2
        assert plog.unflushed_messages == 0
        assert b.halted == []
        svc.stop()
        real.close()
        b.store.close()

    asyncio.run(body())


def test_share_state_writes_to_one_partition_share_an_fsync(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    syncs: list[int] = []
    real_sync = partition_log.FlushTicket.sync

    def counting_sync(ticket: Any) -> None:
        syncs.append(ticket.end_offset)
        real_sync(ticket)

    monkeypatch.setattr(partition_log.FlushTicket, "sync", counting_sync)

    async def body() -> None:
        b = FakeBroker(tmp_path, **ONE_STATE_PARTITION)
        svc = ShareService(b)
        svc.start()
        acked = [_acked(b, svc, f"t{i}") for i in range(8)]
        for sp, _u in acked:
            svc.schedule_persist(sp)
        await asyncio.gather(*(svc.wait_for(sp, u) for sp, u in acked))
        assert all(u.status is UpdateStatus.COMMITTED for _sp, u in acked)
        assert len(syncs) == 1  # eight writes, one fdatasync
        assert b.store.partition(SHARE_STATE_TOPIC, 0).unflushed_messages == 0
        svc.stop()
        b.close()

    asyncio.run(body())


def test_failed_fsync_fails_the_write_and_the_partition_and_halts(tmp_path: Path) -> None:
    async def body() -> None:
        b = FakeBroker(tmp_path, **ONE_STATE_PARTITION)
        svc = ShareService(b)
        svc.start()
        real = b.flusher
        b.flusher = gated = GatedFlusher(real)  # type: ignore[assignment]
        gated.fail = True
        sp, update = _acked(b, svc, "t")
        waiter = asyncio.ensure_future(svc.wait_for(sp, update))
        await asyncio.sleep(0.01)
        assert not waiter.done()
        gated.gate.set()
        await waiter
        # Never reported as a success: rolled back, the records stay with their member.
        assert update.status is UpdateStatus.ROLLED_BACK
        assert sp.record(0)[:3] == (RecordState.ACQUIRED, 1, "m")
        assert svc.runtime.failed(0) and len(b.halted) == 1
        # The partition refuses everything from now on, without writing.
        key = SharePartitionKey.of("g", uuid.UUID(int=1), 0)
        outcome = await svc.persister.write(key, 0, 0, 0, [])
        assert outcome.error_code == ErrorCode.coordinator_not_available
        with pytest.raises(ApiError) as e:
            svc.persister.runtime.run(0, lambda s: s.initialize(key, 0, 0))
        assert e.value.error_code == ErrorCode.coordinator_not_available
        svc.stop()
        real.close()
        b.store.close()

    asyncio.run(body())
