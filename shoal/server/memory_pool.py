"""The memory pool for request bodies of all connections (``queued.max.request.bytes``).

Theory of operation
-------------------
As in Kafka, a connection takes a frame's whole size from the pool when it reads the
frame's size prefix, before buffering the body, and gives it back when the request has
been handled. A connection that cannot get the memory is *muted* (stops reading) and
waits in the pool's queue; when memory is released, waiters whose size now fits are
granted in arrival order, and a waiter that does not fit does not hold back smaller
ones behind it (so small requests keep flowing beside a large one that waits).

No deadlock: a connection holds memory only for a frame it is reading or a request it
is handling, and every grant is for a whole frame, so a holder never needs more to
finish. A peer that stops sending inside a frame keeps its share until the connection
is closed, which ``connections.max.idle.ms`` does (a muted connection is idle too).

The grant is strict: memory is granted only while the pool has that much left, so the
pool's bytes bound what request bodies occupy. Outside the pool, a muted connection
keeps what its last read brought beyond the size prefix (at most one read, 256 KiB
with asyncio's transports), so memory stays bounded by the pool plus one read per
connection. A frame larger than the whole pool (a
pool smaller than ``socket.request.max.bytes``) is granted only when the pool is
entirely free. ``capacity`` -1 means unbounded (Kafka's default): every grant succeeds.

Event loop only; never awaits. A waiter's ``granted`` callback runs later from the
loop (``schedule``), never inside ``release``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

__all__ = ["MemoryPool"]


class _Waiter:
    __slots__ = ("cancelled", "granted", "size")

    def __init__(self, size: int, granted: Callable[[], None]) -> None:
        self.size = size
        self.granted = granted
        self.cancelled = False


class MemoryPool:
    def __init__(self, capacity: int, schedule: Callable[[Callable[[], None]], Any]) -> None:
        self.capacity = capacity
        self.used = 0
        """Bytes granted and not yet released."""
        self._schedule = schedule
        self._waiters: deque[_Waiter] = deque()

    @property
    def available(self) -> int:
        return -1 if self.capacity < 0 else self.capacity - self.used

    @property
    def waiting(self) -> int:
        return sum(1 for w in self._waiters if not w.cancelled)

    def _fits(self, size: int) -> bool:
        if self.capacity < 0:
            return True
        if size > self.capacity:
            return self.used == 0
        return self.used + size <= self.capacity

    def try_reserve(self, size: int) -> bool:
        """Take ``size`` bytes now if they fit; True if taken."""
        if not self._fits(size):
            return False
        self.used += size
        return True

    def wait(self, size: int, granted: Callable[[], None]) -> _Waiter:
        """Queue for ``size`` bytes; ``granted()`` is scheduled once they are reserved for the caller.

        Returns a handle for ``cancel``.
        """
        w = _Waiter(size, granted)
        self._waiters.append(w)
        self._grant()
        return w

    def cancel(self, waiter: _Waiter) -> None:
        """Leave the queue (the connection closed). Idempotent; a granted waiter is not affected."""
        waiter.cancelled = True

    def release(self, size: int) -> None:
        """Give back ``size`` bytes; grants what now fits to the queued connections."""
        if size <= 0:
            return
        self.used -= size
        self.used = max(self.used, 0)  # below 0 only by a bookkeeping bug; keep serving
        if self._waiters:
            self._grant()

    def _grant(self) -> None:
        keep: deque[_Waiter] = deque()
        while self._waiters:
            w = self._waiters.popleft()
            if w.cancelled:
                continue
            if self._fits(w.size):
                self.used += w.size
                self._schedule(w.granted)
            else:
                keep.append(w)
        self._waiters = keep
