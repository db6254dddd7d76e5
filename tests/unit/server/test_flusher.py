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

    def begin_flush(self, drop_cache=False):  # type: ignore[no-untyped-def]
        CountingLog.syncs += 1
        return super().begin_flush(drop_cache)


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


def _failing_fdatasync(monkeypatch: pytest.MonkeyPatch) -> None:
    import errno
    import os

    def eio(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fdatasync", eio)


@pytest.mark.parametrize("inline", [True, False])
def test_a_failed_fsync_takes_the_log_offline_until_a_restart(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               inline: bool) -> None:
    from shoal.errors import ApiError, ErrorCode, FsyncError

    async def body() -> None:
        plog = PartitionLog.open(tmp_path / "t-0", LogConfig())
        flusher = Flusher(Clock())
        plog.append(_batch(2), 0, defer_flush=True)
        _failing_fdatasync(monkeypatch)
        with pytest.raises(FsyncError):
            await flusher.durable(plog, plog.log_end_offset, inline=inline)
        monkeypatch.undo()
        # The bytes may be missing from the disk: nothing more is appended after them.
        with pytest.raises(ApiError) as ei:
            plog.append(_batch(1), 0, defer_flush=True)
        assert ei.value.error_code == ErrorCode.kafka_storage_error
        assert "offline until a restart" in ei.value.message
        assert plog.read(0, 1 << 20)  # reads go on
        flusher.close()
        plog.close()
        plog = PartitionLog.open(tmp_path / "t-0", LogConfig())  # a restart recovers what the disk holds
        assert plog.offline is None
        plog.append(_batch(1), 0)
        plog.close()

    asyncio.run(body())


def test_an_fsync_that_cannot_open_the_file_loses_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import errno
    import os

    async def body() -> None:
        plog = PartitionLog.open(tmp_path / "t-0", LogConfig())
        flusher = Flusher(Clock())
        plog.append(_batch(2), 0, defer_flush=True)
        real = os.open

        def no_descriptors(path, *a, **kw):  # type: ignore[no-untyped-def]
            raise OSError(errno.EMFILE, "Too many open files")

        monkeypatch.setattr(os, "open", no_descriptors)
        with pytest.raises(OSError):
            await flusher.durable(plog, plog.log_end_offset, inline=True)
        monkeypatch.setattr(os, "open", real)
        assert plog.offline is None  # no fsync ran, so none failed: a later one covers the bytes
        await flusher.durable(plog, plog.log_end_offset, inline=True)
        plog.append(_batch(1), 0)
        flusher.close()
        plog.close()

    asyncio.run(body())


def test_records_written_again_after_a_truncation_are_synced_again(tmp_path: Path) -> None:
    """A follower's log cut back (a divergent tail) and refilled: the new records at the old
    offsets are not durable just because the old ones were."""
    async def body() -> None:
        CountingLog.syncs = 0
        plog = CountingLog.open(tmp_path / "t-0", LogConfig())
        flusher = Flusher(Clock())
        for _ in range(3):
            plog.append(_batch(2), 0, defer_flush=True)
        await flusher.durable(plog, 6)
        assert (CountingLog.syncs, plog.durable_offset) == (1, 6)
        assert plog.truncate_to(2) == 2
        assert plog.durable_offset == 2
        plog.append(_batch(2), 0, defer_flush=True)
        await flusher.durable(plog, 4)
        assert (CountingLog.syncs, plog.durable_offset) == (2, 4)
        flusher.close()
        plog.close()

    asyncio.run(body())


def test_a_flush_taken_before_a_truncation_does_not_cover_what_follows_it(tmp_path: Path) -> None:
    plog = PartitionLog.open(tmp_path / "t-0", LogConfig())
    for _ in range(3):
        plog.append(_batch(2), 0, defer_flush=True)
    ticket = plog.begin_flush()  # covers offsets below 6, as they were
    plog.truncate_to(2)
    plog.append(_batch(4), 0, defer_flush=True)  # offsets 2-5 again, not synced by that ticket
    ticket.sync()
    plog.end_flush(ticket, 0)
    assert plog.durable_offset == 0
    plog.close()


def test_a_new_log_object_is_not_durable_because_an_old_one_was(tmp_path: Path) -> None:
    """Durability is the log's own, not the flusher's memory of an object id (ids are reused)."""
    async def body() -> None:
        flusher = Flusher(Clock())
        plog = CountingLog.open(tmp_path / "t-0", LogConfig())
        plog.append(_batch(5), 0, defer_flush=True)
        await flusher.durable(plog, 5)
        plog.close()
        CountingLog.syncs = 0
        fresh = CountingLog.open(tmp_path / "u-0", LogConfig())
        fresh.append(_batch(5), 0, defer_flush=True)
        await flusher.durable(fresh, 5)
        assert CountingLog.syncs == 1
        flusher.close()
        fresh.close()

    asyncio.run(body())


def _sync_threads(monkeypatch: pytest.MonkeyPatch, delay_s: float = 0.0, *, instant: bool = False) -> list[str]:
    """Record the name of the thread each fdatasync runs in (after ``delay_s``, a slow disk;
    ``instant``: a disk that takes no time at all, whatever the machine's disk does now)."""
    import os
    import threading
    import time

    names: list[str] = []
    real = os.fdatasync

    def recording(fd: int) -> None:
        names.append(threading.current_thread().name)
        if delay_s:
            time.sleep(delay_s)
        if not instant:
            real(fd)

    monkeypatch.setattr(os, "fdatasync", recording)
    return names


def test_small_syncs_run_on_the_event_loop_once_per_pass(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two partitions appended to by several producers in one pass: one fdatasync each, on
    the loop's own thread (no hand-off to a worker thread and back)."""
    import threading

    async def body() -> None:
        names = _sync_threads(monkeypatch)
        logs = [PartitionLog.open(tmp_path / f"t-{i}", LogConfig()) for i in range(2)]
        flusher = Flusher(Clock())
        waiters = []
        for _ in range(3):
            for plog in logs:
                plog.append(_batch(2), 0, defer_flush=True)
                waiters.append(flusher.waiter(plog, plog.log_end_offset, inline_if_small=True))
        await asyncio.gather(*waiters)
        assert names == [threading.current_thread().name] * 2
        assert [plog.durable_offset for plog in logs] == [6, 6]
        assert [plog.unflushed_bytes for plog in logs] == [0, 0]
        # a caller that keeps the loop free (share state, transaction markers): a thread
        other = PartitionLog.open(tmp_path / "other-0", LogConfig())
        other.append(_batch(2), 0, defer_flush=True)
        await flusher.durable(other, other.log_end_offset)
        assert names[-1].startswith("shoal-fsync")
        flusher.close()
        for plog in (*logs, other):
            plog.close()

    asyncio.run(body())


def test_large_syncs_and_many_partitions_go_to_the_fsync_threads(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from shoal.server.broker import INLINE_FSYNC_PARTITIONS

    async def body() -> None:
        names = _sync_threads(monkeypatch)
        big = PartitionLog.open(tmp_path / "big-0", LogConfig())
        flusher = Flusher(Clock(), inline_bytes=100)
        big.append(_batch(20), 0, defer_flush=True)
        assert big.unflushed_bytes > 100
        await flusher.waiter(big, big.log_end_offset, inline_if_small=True)
        assert names and names[-1].startswith("shoal-fsync")
        flusher.close()
        names.clear()
        flusher = Flusher(Clock())
        logs = [PartitionLog.open(tmp_path / f"t-{i}", LogConfig()) for i in range(INLINE_FSYNC_PARTITIONS + 1)]
        waiters = []
        for plog in logs:
            plog.append(_batch(1), 0, defer_flush=True)
            waiters.append(flusher.waiter(plog, plog.log_end_offset, inline_if_small=True))
        await asyncio.gather(*waiters)
        assert len(names) == len(logs) and all(n.startswith("shoal-fsync") for n in names)
        flusher.close()
        for plog in (big, *logs):
            plog.close()

    asyncio.run(body())


def test_a_slow_disk_moves_the_syncs_off_the_event_loop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """While fsyncs take longer than INLINE_FSYNC_MAX_S they run in a worker thread, and
    back on the loop once they are quick again."""
    import threading

    from shoal.server.broker import INLINE_FSYNC_MAX_S

    async def body() -> None:
        loop_thread = threading.current_thread().name
        names = _sync_threads(monkeypatch, delay_s=INLINE_FSYNC_MAX_S * 20)
        plog = PartitionLog.open(tmp_path / "t-0", LogConfig())
        flusher = Flusher(Clock())
        for _ in range(3):
            plog.append(_batch(1), 0, defer_flush=True)
            await flusher.waiter(plog, plog.log_end_offset, inline_if_small=True)
        assert names[0] == loop_thread
        assert names[-1].startswith("shoal-fsync")
        monkeypatch.undo()
        names = _sync_threads(monkeypatch, instant=True)
        for _ in range(30):
            plog.append(_batch(1), 0, defer_flush=True)
            await flusher.waiter(plog, plog.log_end_offset, inline_if_small=True)
        assert names[-1] == loop_thread
        flusher.close()
        plog.close()

    asyncio.run(body())
