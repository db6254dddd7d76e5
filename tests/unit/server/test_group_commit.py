"""Share-state writes with group commit (``ShareService`` commit rounds).

Through the share service on a real log store: an acknowledgement is still pending
while its write's fsync runs, and settles after it; writes of several share-partitions
to one ``__share_group_state`` partition share one fsync; a failed fsync fails the
waiting write, marks the partition failed and halts.
"""

from __future__ import annotations

import asyncio
import threading
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

from .test_share_service import FakeBroker, _topic_with_records, started

ONE_STATE_PARTITION = {"share.coordinator.state.topic.num.partitions": "1"}


def _acked(b: FakeBroker, svc: ShareService, topic: str) -> tuple[Any, Any]:
    tid = _topic_with_records(b, topic, 4, svc)
    b.dynamic_configs.set_group("g", {"share.auto.offset.reset": "earliest"})
    sp = svc.get_partition("g", tid, 0)
    sp.acquire("m", [(0, 3)], b.clock.now_ms(), 10)
    update = sp.acknowledge("m", [(0, 1, [AcknowledgeType.ACCEPT])], b.clock.now_ms())
    return sp, update


def test_acknowledgement_settles_only_after_its_fsync(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Any] = []
    real_sync = partition_log.FlushTicket.sync

    async def body() -> None:
        b, svc = started(tmp_path, **ONE_STATE_PARTITION)
        sp, update = _acked(b, svc, "t")
        plog = b.store.partition(SHARE_STATE_TOPIC, 0)
        key = SharePartitionKey.of("g", sp.topic_id, 0)

        def watching_sync(ticket: Any) -> None:
            # At the fsync: appended and replayed (the shard already sees the write),
            # but the acknowledgement is not settled yet.
            seen.append((update.status, sp.start_offset, plog.unflushed_messages,
                         svc.persister.read(key).state.start_offset))
            real_sync(ticket)

        monkeypatch.setattr(partition_log.FlushTicket, "sync", watching_sync)
        waiter = asyncio.ensure_future(svc.wait_for(sp, update))
        assert not waiter.done() and update.status is UpdateStatus.PENDING
        await waiter
        assert seen == [(UpdateStatus.PENDING, 0, 1, 2)]
        assert update.status is UpdateStatus.COMMITTED and sp.start_offset == 2
        assert plog.unflushed_messages == 0
        assert b.halted == []
        svc.stop()
        b.close()

    asyncio.run(body())


def test_the_event_loop_serves_while_a_state_fsync_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The commit round's fsync runs off the event loop: run on it, it stopped every
    other connection's fetches and acknowledgements for as long as the disk took."""
    served = threading.Event()
    seen: list[bool] = []
    real_sync = partition_log.FlushTicket.sync

    def slow_sync(ticket: Any) -> None:
        seen.append(served.wait(3))  # the loop sets it while this fsync runs, if it can
        real_sync(ticket)

    async def body() -> None:
        b, svc = started(tmp_path, **ONE_STATE_PARTITION)
        sp, update = _acked(b, svc, "t")
        monkeypatch.setattr(partition_log.FlushTicket, "sync", slow_sync)
        asyncio.get_running_loop().call_later(0.05, served.set)
        await svc.wait_for(sp, update)
        assert seen == [True]
        assert update.status is UpdateStatus.COMMITTED and sp.start_offset == 2
        assert b.store.partition(SHARE_STATE_TOPIC, 0).unflushed_messages == 0
        svc.stop()
        b.close()

    asyncio.run(body())


def test_share_state_writes_to_one_partition_share_an_fsync(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    syncs: list[int] = []
    real_sync = partition_log.FlushTicket.sync

    def counting_sync(ticket: Any) -> None:
        syncs.append(ticket.end_offset)
        real_sync(ticket)

    monkeypatch.setattr(partition_log.FlushTicket, "sync", counting_sync)

    async def body() -> None:
        b, svc = started(tmp_path, **ONE_STATE_PARTITION)
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


def test_failed_fsync_fails_the_write_and_the_partition_and_halts(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    def failing_sync(ticket: Any) -> None:
        raise OSError(5, "Input/output error")

    async def body() -> None:
        b, svc = started(tmp_path, **ONE_STATE_PARTITION)
        sp, update = _acked(b, svc, "t")
        monkeypatch.setattr(partition_log.FlushTicket, "sync", failing_sync)
        await svc.wait_for(sp, update)
        # Never reported as a success: rolled back, the records stay with their member.
        assert update.status is UpdateStatus.ROLLED_BACK
        assert sp.record(0)[:3] == (RecordState.ACQUIRED, 1, "m")
        assert svc.runtime.failed(0) and len(b.halted) == 1
        # The partition refuses everything from now on, without writing.
        key = SharePartitionKey.of("g", sp.topic_id, 0)
        outcome = await svc.persister.write(key, 0, 0, 0, [])
        assert outcome.error_code == ErrorCode.coordinator_not_available
        with pytest.raises(ApiError) as e:
            svc.persister.runtime.run(0, lambda s: s.initialize(key, 0, 0))
        assert e.value.error_code == ErrorCode.coordinator_not_available
        svc.stop()
        monkeypatch.undo()
        b.close()

    asyncio.run(body())
