"""Threads that run blocking calls (fsyncs) for the event loop (asyncio shell).

:meth:`WorkerThreads.run` hands a call to the threads and returns an asyncio future that
the loop resolves with the call's result or exception. The threads take calls from one
``SimpleQueue`` and give each outcome back with one ``call_soon_threadsafe``. That is all
``loop.run_in_executor`` does too, but through a ``concurrent.futures`` executor, whose
future, locks, callbacks and idle-thread semaphore cost about 40 µs of CPU more per call
on the benchmark machine: the flush policy pays that on every Produce request and every
follower fsync pass.

A call whose future was cancelled meanwhile still runs to its end (an fsync cannot be
taken back); its outcome is dropped. Threads start with the first call; :meth:`close`
lets them finish what is queued and joins them.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from typing import Any, Callable

__all__ = ["WorkerThreads"]


class WorkerThreads:
    def __init__(self, count: int, name: str) -> None:
        self._count = count
        self._name = name
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._closed = False

    def run(self, fn: Callable[[], Any]) -> asyncio.Future[Any]:
        """Run ``fn()`` in a worker thread; the future is resolved on the running loop."""
        if self._closed:
            raise RuntimeError(f"{self._name} threads are closed")
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        if not self._threads:
            for i in range(self._count):
                t = threading.Thread(target=self._work, name=f"{self._name}-{i}", daemon=True)
                t.start()
                self._threads.append(t)
        self._queue.put((loop, future, fn))
        return future

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            loop, future, fn = item
            result: Any = None
            error: BaseException | None = None
            try:
                result = fn()
            except BaseException as e:  # handed to the awaiting task
                error = e
            del fn, item
            try:
                loop.call_soon_threadsafe(_settle, future, result, error)
            except RuntimeError:  # the loop is closed: nobody waits any more
                pass

    def close(self) -> None:
        """Finish the queued calls and stop the threads."""
        self._closed = True
        for _ in self._threads:
            self._queue.put(None)
        for t in self._threads:
            t.join()
        self._threads.clear()


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.cancelled():
        return
    if error is None:
        future.set_result(result)
    else:
        future.set_exception(error)
