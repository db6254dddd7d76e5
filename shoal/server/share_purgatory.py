"""The ShareFetch purgatory: parked long polls of the share service (Kafka's DelayedShareFetch).

A ShareFetch that has not acquired MinBytes yet parks here as a :class:`DelayedShareFetch`
watched under two keys per partition of its session, as Kafka watches it:

* the share-partition, ``(group_id, topic_id, partition)``: checked by
  ``ShareService.wake`` when records of that share-partition may be acquirable again
  (an acknowledgement released them or moved the start offset, a member's release, a
  lock timeout, a rolled-back write, the end of a load, a drop);
* the data partition, ``(topic, partition)``: checked whenever ``broker.append_waiters``
  is notified for it (an append, a high watermark or last stable offset that moved, a
  lost leadership), since the purgatory listens there.

Checking a key completes every operation watched under it; an operation also completes
at its deadline (MaxWaitMs, one timer) or at shutdown (:meth:`SharePurgatory.wake_all`).
Completing only wakes the fetch: its next acquisition pass runs in the request's own task,
never in the caller that checked the key (an append or a commit round does no fetch's
work). Event loop only.
"""

from __future__ import annotations

import asyncio
from collections.abc import Hashable, Iterable

__all__ = ["DelayedShareFetch", "SharePurgatory"]


class DelayedShareFetch:
    """One parked ShareFetch: the keys it is watched under and the future that wakes it."""

    __slots__ = ("future", "keys")

    def __init__(self, keys: list[Hashable], future: asyncio.Future[None]) -> None:
        self.keys = keys
        self.future = future

    def complete(self) -> None:
        if not self.future.done():
            self.future.set_result(None)


def _complete(op: DelayedShareFetch) -> None:
    op.complete()


class SharePurgatory:
    def __init__(self) -> None:
        self._watchers: dict[Hashable, set[DelayedShareFetch]] = {}
        self._parked = 0

    async def park(self, keys: Iterable[Hashable], timeout_s: float) -> None:
        """Park until a key of ``keys`` is checked, or for ``timeout_s`` at most."""
        if timeout_s <= 0:
            return
        loop = asyncio.get_running_loop()
        op = DelayedShareFetch(list(keys), loop.create_future())
        for k in op.keys:
            self._watchers.setdefault(k, set()).add(op)
        self._parked += 1
        timer = loop.call_later(timeout_s, _complete, op)
        try:
            await op.future
        finally:
            timer.cancel()
            self._parked -= 1
            for k in op.keys:
                s = self._watchers.get(k)
                if s is not None:
                    s.discard(op)
                    if not s:
                        del self._watchers[k]

    def check_and_complete(self, key: Hashable) -> None:
        """Complete every operation watched under ``key``."""
        ops = self._watchers.pop(key, None)
        if ops:
            for op in ops:
                op.complete()

    # -- as a listener of broker.append_waiters ----------------------------------------------
    def notify(self, topic: str, partition: int) -> None:
        self.check_and_complete((topic, partition))

    def wake_all(self) -> None:
        watchers, self._watchers = self._watchers, {}
        for ops in watchers.values():
            for op in ops:
                op.complete()

    def parked(self) -> int:
        """ShareFetches parked now."""
        return self._parked
