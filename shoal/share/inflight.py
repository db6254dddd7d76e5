"""In-flight state of a share-partition: one state per batch, split per offset on demand.

Theory of operation
-------------------
An :class:`InFlightBatch` covers a contiguous, inclusive offset range.  While all its
offsets share one state it holds a single :class:`InFlightState` (``batch_state``); the
first operation that touches only part of it, or would leave its offsets in different
states, splits it into a per-offset map (``offset_state``) and drops the batch-level
state.  Batches are never merged back; they disappear when the SPSO passes them.

An :class:`InFlightState` is the state, delivery count, owning member and lock
deadline of the offsets it stands for, plus an optional *pending transition*: an
acknowledgement that has been decided but not yet written durably.  While pending, the
record keeps its current (ACQUIRED) state and owner, is neither acquirable nor
acknowledgeable, and its lock does not expire by itself; the write's commit moves it
to ``pending_state``, and a rollback clears the pending mark (and, if the lock deadline
passed meanwhile, releases the record as a lock timeout would).

Invariants:

* exactly one of ``batch_state`` and ``offset_state`` is set;
* ``offset_state`` has one entry for every offset of ``[first_offset, last_offset]``;
* ``member_id`` and ``deadline_ms`` are set exactly when the state is ACQUIRED;
* a batch with a pending batch-level state is never split.

This module holds data and small helpers only; the rules live in
:mod:`shoal.share.partition`.  Not thread-safe: event loop only, never awaits.
"""

from __future__ import annotations

from collections.abc import Iterator

from shoal.share.state import RecordState

__all__ = ["InFlightBatch", "InFlightState"]


class InFlightState:
    """State of one record, or of every record of an unsplit batch."""

    __slots__ = ("deadline_ms", "delivery_count", "member_id", "pending_state", "pending_write", "state")

    def __init__(
        self,
        state: RecordState,
        delivery_count: int = 0,
        member_id: str | None = None,
        deadline_ms: int | None = None,
    ) -> None:
        self.state = state
        """Current, durable-or-in-memory state (never the pending target)."""
        self.delivery_count = delivery_count
        """Times the record was acquired; only grows."""
        self.member_id = member_id
        """Owner while ACQUIRED, else None."""
        self.deadline_ms = deadline_ms
        """Acquisition lock deadline while ACQUIRED, else None."""
        self.pending_state: RecordState | None = None
        """Target of an acknowledgement awaiting its durable write, else None."""
        self.pending_write: object | None = None
        """The write (if taken) that carries the pending transition; None before it is taken."""

    def copy(self) -> InFlightState:
        assert self.pending_state is None, "a pending state is never copied"
        return InFlightState(self.state, self.delivery_count, self.member_id, self.deadline_ms)

    @property
    def is_pending(self) -> bool:
        return self.pending_state is not None

    def durable_view(self) -> tuple[RecordState, int]:
        """(state, delivery_count) as it would be persisted now, pending targets ignored."""
        state = RecordState.AVAILABLE if self.state is RecordState.ACQUIRED else self.state
        return state, self.delivery_count

    def __repr__(self) -> str:  # pragma: no cover - debugging aid
        return (
            f"InFlightState({self.state.name}, count={self.delivery_count}, member={self.member_id!r}, "
            f"deadline={self.deadline_ms}, pending={self.pending_state})"
        )


class InFlightBatch:
    """Contiguous offsets ``[first_offset, last_offset]`` with one state or a per-offset map."""

    __slots__ = ("batch_state", "first_offset", "last_offset", "offset_state")

    def __init__(self, first_offset: int, last_offset: int, state: InFlightState) -> None:
        assert first_offset <= last_offset
        self.first_offset = first_offset
        """First offset still tracked; moves up when the SPSO passes part of a split batch."""
        self.last_offset = last_offset
        self.batch_state: InFlightState | None = state
        """The state of every offset while they all share it; None once split."""
        self.offset_state: dict[int, InFlightState] | None = None
        """Per-offset states; exists only once offsets of this batch diverged."""

    def split(self) -> dict[int, InFlightState]:
        """Make (if needed) and return the per-offset map."""
        if self.offset_state is None:
            shared = self.batch_state
            assert shared is not None and not shared.is_pending, "a pending batch is never split"
            self.offset_state = {o: shared.copy() for o in range(self.first_offset, self.last_offset + 1)}
            self.batch_state = None
        return self.offset_state

    def states(self, lo: int, hi: int) -> Iterator[tuple[int, int, InFlightState]]:
        """Yield (first, last, state) covering ``[lo, hi]`` clipped to this batch, in order.

        An unsplit batch yields one triple; a split batch yields one per offset.
        """
        lo = max(lo, self.first_offset)
        hi = min(hi, self.last_offset)
        if lo > hi:
            return
        if self.batch_state is not None:
            yield lo, hi, self.batch_state
        else:
            assert self.offset_state is not None
            for offset in range(lo, hi + 1):
                yield offset, offset, self.offset_state[offset]

    def trim_below(self, offset: int) -> None:
        """Forget offsets below ``offset`` (the new SPSO); the batch must still reach it."""
        assert offset <= self.last_offset
        if offset <= self.first_offset:
            return
        if self.offset_state is not None:
            for o in range(self.first_offset, offset):
                del self.offset_state[o]
        self.first_offset = offset

    def __repr__(self) -> str:  # pragma: no cover - debugging aid
        inner = self.batch_state if self.batch_state is not None else f"{len(self.offset_state or {})} offsets"
        return f"InFlightBatch({self.first_offset}-{self.last_offset}, {inner})"
