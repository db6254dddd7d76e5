"""The answer of a coordinator's write operation: records to append, then a response.

Theory of operation
-------------------
Coordinators (group coordinator, share coordinator) are pure state machines with two
kinds of methods, as Kafka's coordinator runtime prescribes:

* request handlers ``handle_*(..., now_ms) -> Result``: they read the current state and
  *do not change it*; they return the records that express the change and the
  response to send once those records are durable;
* ``replay(record)``: applies one durable record to the state. The same method runs
  live (after an append) and at start (replaying the internal topic).

The I/O shell (``shoal.server.runtime``) appends ``records`` to the internal topic
partition, waits until they are flushed, calls ``replay`` for each in order, and only
then sends ``response``. If the append fails nothing is replayed and the client gets an
error (the state is unchanged, so there is nothing to roll back).

``deadlines`` lets a handler ask the shell to call the shard's ``expire(now_ms)`` at a
given time (session timeouts, rebalance timeouts): the pure core reads no clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from .records import CoordinatorRecord

__all__ = ["Result"]

R = TypeVar("R")


@dataclass(slots=True)
class Result(Generic[R]):
    records: list[CoordinatorRecord] = field(default_factory=list)
    response: R | None = None
    deadlines: list[int] = field(default_factory=list)
    """Absolute times (ms) at which the shell should call ``expire``."""
    after: Any = None
    """Optional callback-free payload for the shell (e.g. members to notify)."""
    producer_id: int = -1
    """>= 0: the records belong to this producer's transaction (TxnOffsetCommit). They are
    appended as a transactional batch of ``producer_id`` / ``producer_epoch`` and replayed
    with ``replay_transactional(record, producer_id)``: pending until the transaction's
    commit marker (``replay_marker``)."""
    producer_epoch: int = -1

    def answer(self) -> R:
        """``response``, for the operations that always set one (a missing one is a bug)."""
        if self.response is None:
            raise ValueError("the operation's result carries no response")
        return self.response

    @classmethod
    def of(cls, response: R, records: list[CoordinatorRecord] | None = None) -> Result[R]:
        return cls(records=list(records or ()), response=response)
