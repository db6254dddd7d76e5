"""WorkerThreads: calls run off the event loop and their outcomes come back to it."""

from __future__ import annotations

import asyncio
import threading

import pytest

from shoal.server.worker_threads import WorkerThreads


def test_results_and_exceptions_come_back_to_the_awaiting_task() -> None:
    threads = WorkerThreads(2, "test")
    loop_thread: list[int] = []

    def work(n: int) -> int:
        assert threading.get_ident() != loop_thread[0]
        return n * n

    def fail() -> None:
        raise OSError(5, "disk gone")

    async def body() -> None:
        loop_thread.append(threading.get_ident())
        assert await asyncio.gather(*(threads.run(lambda n=n: work(n)) for n in range(20))) == [
            n * n for n in range(20)]
        with pytest.raises(OSError, match="disk gone"):
            await threads.run(fail)

    asyncio.run(body())
    threads.close()


def test_a_cancelled_call_still_runs_and_close_waits_for_queued_calls() -> None:
    threads = WorkerThreads(1, "test")
    gate = threading.Event()
    ran: list[str] = []

    def slow() -> None:
        gate.wait(5)
        ran.append("slow")

    async def body() -> None:
        first = threads.run(slow)
        second = threads.run(lambda: ran.append("queued"))
        first.cancel()
        await asyncio.sleep(0.01)
        gate.set()
        await second
        assert first.cancelled()

    asyncio.run(body())
    threads.close()
    assert ran == ["slow", "queued"]
    with pytest.raises(RuntimeError):
        asyncio.run(_run_after_close(threads))


async def _run_after_close(threads: WorkerThreads) -> None:
    await threads.run(lambda: None)


def test_calls_of_one_loop_pass_go_to_the_threads_together() -> None:
    threads = WorkerThreads(2, "test")

    async def body() -> None:
        for _ in range(5):
            names = await asyncio.gather(*(threads.run(lambda: threading.current_thread().name) for _ in range(3)))
            assert len(set(names)) == 1, names  # one hand-over, one thread
            await asyncio.sleep(0)

    asyncio.run(body())
    threads.close()


def test_calls_of_one_loop_pass_are_spread_over_the_threads_two_or_more_each() -> None:
    """Six calls and four threads: three items of two calls, run by three threads at once
    (each call of an item's first waits at a barrier of three)."""
    threads = WorkerThreads(4, "test")
    barrier = threading.Barrier(3, timeout=5)

    def call(i: int) -> str:
        if i % 2 == 0:
            barrier.wait()  # the first call of each item: three items, three threads at once
        return threading.current_thread().name

    async def body() -> None:
        names = await asyncio.gather(*(threads.run(lambda i=i: call(i)) for i in range(6)))
        assert len(set(names)) == 3, names
        assert names[0] == names[1] and names[2] == names[3] and names[4] == names[5], names

    asyncio.run(body())
    threads.close()
