"""The broker's group-commit flusher, on a real partition log."""

from __future__ import annotations

import asyncio
import threading
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


class SignallingLog(PartitionLog):
    """A log whose fsyncs set ``synced`` (from the worker thread that runs them)."""

    synced: threading.Event

    def begin_flush(self, drop_cache=False):  # type: ignore[no-untyped-def]
        ticket = super().begin_flush(drop_cache)
        real, synced = ticket.sync, self.synced

        class Ticket:
            end_offset, messages, truncations, path = ticket.end_offset, ticket.messages, ticket.truncations, ticket.path

            def sync(self) -> None:
                real()
                synced.set()

        return Ticket()


def test_a_flush_asked_now_starts_before_the_loop_pass_ends(tmp_path: Path) -> None:
    """``now=True`` (Produce, transaction markers): the fsync is in a worker thread's hands at
    once, while the loop is still busy (a burst of large appends read in one pass); by
    default it is handed over at the end of the pass, shared by the pass's appends."""
    async def body() -> None:
        flusher = Flusher(Clock())
        for now in (True, False):
            plog = SignallingLog.open(tmp_path / f"t-{int(now)}", LogConfig())
            plog.synced = threading.Event()
            plog.append(_batch(2), 0, defer_flush=True)
            waiter = flusher.waiter(plog, plog.log_end_offset, now=now)
            assert waiter is not None
            # the loop is blocked here, as by the appends that follow in the same pass
            assert plog.synced.wait(2 if now else 0.2) is now
            await waiter
            assert plog.synced.is_set() and plog.durable_offset == 2
            # appended while a flush runs: covered by the next one, also started at once
            plog.synced.clear()
            plog.append(_batch(1), 0, defer_flush=True)
            first = flusher.waiter(plog, plog.log_end_offset, now=now)
            plog.append(_batch(1), 0, defer_flush=True)
            second = flusher.waiter(plog, plog.log_end_offset, now=now)
            assert first is not None and second is not None
            await asyncio.gather(first, second)
            assert plog.durable_offset == 4 and plog.unflushed_messages == 0
            plog.close()
        flusher.close()

    asyncio.run(body())


def test_a_produce_append_starts_its_fsync_before_the_loop_pass_ends(tmp_path: Path) -> None:
    """Produce (``handlers.produce._append``): the fsync the flush policy asks for is in a
    worker thread's hands when the append returns, so the partitions of a burst of
    requests read in one pass are synced while the later ones are appended."""
    from types import SimpleNamespace

    from shoal.server.handlers.produce import _append

    async def body() -> None:
        flusher = Flusher(Clock())
        broker = SimpleNamespace(replicas=None, flusher=flusher, metrics=None,
                                 storage_errors=SimpleNamespace(ok=lambda key: None, failed=lambda key, why: None),
                                 append_waiters=SimpleNamespace(notify=lambda topic, partition: None))
        logs = []
        flushes: list = []
        for p in range(3):
            plog = SignallingLog.open(tmp_path / f"t-{p}", LogConfig())
            plog.synced = threading.Event()
            logs.append(plog)
            _append(broker, plog, ("t", p), _batch(2), 0, {}, flushes, [], -1)
        # no await since the appends: the loop has not run a pass
        assert all(plog.synced.wait(2) for plog in logs)
        assert len(flushes) == 3
        await asyncio.gather(*(waiter for _r, waiter, _key, _plog in flushes))
        assert [plog.durable_offset for plog in logs] == [2, 2, 2]
        for plog in logs:
            plog.close()
        flusher.close()

    asyncio.run(body())
