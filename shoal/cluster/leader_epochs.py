"""A log's leader-epoch cache: which leader epoch wrote which offsets (pure).

Theory of operation
-------------------
Entries ``(epoch, start_offset)`` in growing order of both: epoch ``e`` wrote the offsets
from its start offset up to the next entry's start (the last one: up to the log end). A
leader adds ``(its epoch, its log end offset)`` when it takes over; a follower adds an
entry when a fetched batch carries another partition leader epoch than the latest (an
older one replaces the newer entries its log does not hold: :meth:`LeaderEpochCache.follow`). Truncating the log at
``offset`` drops the entries that start at or after it.

:meth:`LeaderEpochCache.end_offset_for` is OffsetsForLeaderEpoch's rule: for a requested
epoch, the largest epoch not above it, and the offset where it ended (the next epoch's
start; the log end offset for the latest). A follower of a new leader asks this for its
own latest epoch and truncates to ``min(leader's answer, its own end offset of the epoch
the leader named)``: everything after is a tail the new leader never had (KIP-101,
KIP-279).

The text form is Kafka's ``leader-epoch-checkpoint`` file: a version line (0), a count
line, then ``epoch start_offset`` per line.
"""

from __future__ import annotations

from bisect import bisect_right

__all__ = ["UNDEFINED", "LeaderEpochCache"]

UNDEFINED = (-1, -1)


class LeaderEpochCache:
    def __init__(self, entries: list[tuple[int, int]] | None = None) -> None:
        self.entries: list[tuple[int, int]] = list(entries or [])

    @property
    def latest_epoch(self) -> int:
        return self.entries[-1][0] if self.entries else -1

    def assign(self, epoch: int, start_offset: int) -> bool:
        """Record that ``epoch`` starts at ``start_offset``; returns whether the cache changed.

        An epoch not above the latest is ignored; entries starting at or after
        ``start_offset`` (which a newer epoch supersedes) are dropped first.
        """
        if epoch < 0 or epoch <= self.latest_epoch:
            return False
        while self.entries and self.entries[-1][1] >= start_offset:
            self.entries.pop()
        if self.entries and self.entries[-1][0] >= epoch:
            return False
        self.entries.append((epoch, start_offset))
        return True

    def follow(self, epoch: int, start_offset: int) -> bool:
        """A follower appended a batch of ``epoch`` at ``start_offset``; returns whether the cache changed.

        The batch is the truth: entries of newer epochs that the log does not hold (this
        broker led them without writing, then truncated back to where they started) are
        dropped, and the batch's epoch continues where it started or begins here.
        """
        if epoch < 0:
            return False
        changed = False
        while self.entries and (self.entries[-1][0] > epoch or self.entries[-1][1] > start_offset):
            self.entries.pop()
            changed = True
        if self.entries and self.entries[-1][0] == epoch:
            return changed
        if self.entries and self.entries[-1][1] == start_offset:
            self.entries.pop()
        self.entries.append((epoch, start_offset))
        return True

    def end_offset_for(self, epoch: int, log_end_offset: int) -> tuple[int, int]:
        """(largest epoch <= ``epoch``, where it ends); UNDEFINED when there is none."""
        if not self.entries or epoch < self.entries[0][0]:
            return UNDEFINED
        if epoch >= self.latest_epoch:
            return self.latest_epoch, log_end_offset
        epochs = [e for e, _ in self.entries]
        i = bisect_right(epochs, epoch) - 1
        return self.entries[i][0], self.entries[i + 1][1]

    def truncate_from_end(self, offset: int) -> None:
        """The log was cut at ``offset``: drop epochs starting at or after it."""
        while self.entries and self.entries[-1][1] >= offset:
            self.entries.pop()

    def to_text(self) -> str:
        return f"0\n{len(self.entries)}\n" + "".join(f"{e} {o}\n" for e, o in self.entries)

    @classmethod
    def from_text(cls, text: str) -> LeaderEpochCache:
        """Parse a checkpoint; a malformed one gives an empty cache (it is rebuilt from fetches)."""
        lines = text.split("\n")
        try:
            if lines[0].strip() != "0":
                return cls()
            n = int(lines[1])
            entries = []
            for line in lines[2:2 + n]:
                e, o = line.split()
                entries.append((int(e), int(o)))
            return cls(entries)
        except (IndexError, ValueError):
            return cls()


def divergence_offset(cache: LeaderEpochCache, leader_epoch: int, leader_end_offset: int,
                      log_end_offset: int) -> int:
    """Where a follower cuts its log after the leader answered OffsetsForLeaderEpoch.

    ``leader_epoch``/``leader_end_offset`` are the leader's answer for the follower's
    latest epoch; UNDEFINED (-1) means the leader knows no such epoch: the follower keeps
    nothing it cannot prove and cuts to its log start (the caller clamps).
    """
    if leader_epoch < 0:
        return 0
    if leader_epoch == cache.latest_epoch:
        return min(leader_end_offset, log_end_offset)
    _, own_end = cache.end_offset_for(leader_epoch, log_end_offset)
    if own_end < 0:
        return 0
    return min(leader_end_offset, own_end, log_end_offset)
