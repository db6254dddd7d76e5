from __future__ import annotations

from collections.abc import Callable

from shoal.server.memory_pool import MemoryPool


class Scheduled:
    def __init__(self) -> None:
        self.calls: list[Callable[[], None]] = []

    def __call__(self, fn: Callable[[], None]) -> None:
        self.calls.append(fn)

    def run(self) -> None:
        calls, self.calls = self.calls, []
        for fn in calls:
            fn()


def test_reserve_within_capacity_and_refuse_beyond() -> None:
    pool = MemoryPool(100, Scheduled())
    assert pool.try_reserve(60)
    assert not pool.try_reserve(41)
    assert pool.try_reserve(40)
    assert pool.available == 0
    pool.release(60)
    assert pool.available == 60


def test_waiter_is_granted_on_release_from_the_loop_not_inside_release() -> None:
    sched = Scheduled()
    pool = MemoryPool(100, sched)
    assert pool.try_reserve(80)
    granted: list[str] = []
    pool.wait(50, lambda: granted.append("a"))
    assert sched.calls == [] and pool.waiting == 1
    pool.release(80)
    assert granted == []  # scheduled, not called
    assert pool.used == 50  # but already reserved for the waiter
    sched.run()
    assert granted == ["a"] and pool.waiting == 0


def test_small_waiter_passes_a_large_one_that_does_not_fit() -> None:
    sched = Scheduled()
    pool = MemoryPool(100, sched)
    assert pool.try_reserve(70)
    granted: list[str] = []
    pool.wait(90, lambda: granted.append("big"))
    pool.wait(40, lambda: granted.append("small"))
    pool.release(10)  # 40 free: the small one fits, the big one not yet
    sched.run()
    assert granted == ["small"]
    pool.release(60 + 40)
    sched.run()
    assert granted == ["small", "big"] and pool.used == 90


def test_cancelled_waiter_is_skipped() -> None:
    sched = Scheduled()
    pool = MemoryPool(10, sched)
    assert pool.try_reserve(10)
    granted: list[str] = []
    w = pool.wait(5, lambda: granted.append("gone"))
    pool.cancel(w)
    pool.release(10)
    sched.run()
    assert granted == [] and pool.used == 0


def test_frame_larger_than_the_pool_is_granted_only_when_the_pool_is_empty() -> None:
    sched = Scheduled()
    pool = MemoryPool(100, sched)
    assert pool.try_reserve(1)
    assert not pool.try_reserve(500)
    granted: list[str] = []
    pool.wait(500, lambda: granted.append("huge"))
    pool.release(1)
    sched.run()
    assert granted == ["huge"] and pool.used == 500
    assert not pool.try_reserve(1)


def test_unbounded_pool_always_grants() -> None:
    pool = MemoryPool(-1, Scheduled())
    assert pool.try_reserve(10**12) and pool.try_reserve(10**12)
    assert pool.available == -1
