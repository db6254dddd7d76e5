"""Threads that run blocking calls (fsyncs) for the event loop (asyncio shell).

:meth:`WorkerThreads.run` hands a call to the threads and returns an asyncio future that
the loop resolves with the call's result or exception. Calls made in one pass of the
event loop go to the threads together, at the end of that pass: one ``SimpleQueue`` item
per thread at most, each of two calls or more (so one item for up to three calls), whose
outcomes come back with one ``call_soon_threadsafe``. Waking a sleeping thread is the expensive part of a
hand-over on the benchmark machine (tens of µs with the other core busy), and a Produce
request for six partitions asks for six fsyncs at once. ``loop.run_in_executor`` would
wake a thread per call, through a ``concurrent.futures`` executor whose future, locks,
callbacks and idle-thread semaphore cost about 40 µs of CPU more per call.

A call whose future was cancelled meanwhile still runs to its end (an fsync cannot be
taken back); its outcome is dropped. Threads start with the first call; :meth:`close`
lets them finish what is queued and joins them.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["WorkerThreads"]


class WorkerThreads:
    def __init__(self, count: int, name: str) -> None:
        self._count = count
        self._name = name
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._pending: list[tuple[asyncio.Future[Any], Callable[[], Any]]] = []
        self._closed = False

    def run(self, fn: Callable[[], Any]) -> asyncio.Future[Any]:
        """Run ``fn()`` in a worker thread; the future is resolved on the running loop."""
        if self._closed:
            raise RuntimeError(f"{self._name} threads are closed")
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._pending.append((future, fn))
        if len(self._pending) == 1:
            loop.call_soon(self._hand_over, loop)
        return future

    def _hand_over(self, loop: asyncio.AbstractEventLoop) -> None:
        calls, self._pending = self._pending, []
        if self._closed:
            for future, _ in calls:
                future.cancel()
            return
        if not self._threads:
            for i in range(self._count):
                t = threading.Thread(target=self._work, name=f"{self._name}-{i}", daemon=True)
                t.start()
                self._threads.append(t)
        parts = max(1, min(self._count, len(calls) // 2))  # one per thread, two calls or more each
        for k in range(parts):
            self._queue.put((loop, calls[k * len(calls) // parts:(k + 1) * len(calls) // parts]))

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            loop, calls = item
            outcomes: list[tuple[asyncio.Future[Any], Any, BaseException | None]] = []
            for future, fn in calls:
                try:
                    outcomes.append((future, fn(), None))
                except BaseException as e:  # handed to the awaiting task
                    outcomes.append((future, None, e))
            del item, calls
            try:
                loop.call_soon_threadsafe(_settle, outcomes)
            except RuntimeError:  # the loop is closed: nobody waits any more
                pass

    def close(self) -> None:
        """Finish the queued calls and stop the threads (calls not yet handed over are
        cancelled)."""
        self._closed = True
        for _ in self._threads:
            self._queue.put(None)
        for t in self._threads:
            t.join()
        self._threads.clear()


def _settle(outcomes: list[tuple[asyncio.Future[Any], Any, BaseException | None]]) -> None:
    for future, result, error in outcomes:
        if future.cancelled():
            continue
        if error is None:
            future.set_result(result)
        else:
            future.set_exception(error)
