"""Idempotent-producer state of one partition: epochs and sequence numbers (pure).

Theory of operation
-------------------
For every producer id seen, the partition remembers its epoch and the sequence ranges,
with their offsets, of the last five batches it appended (Kafka's
``ProducerStateEntry.NUM_BATCHES_TO_RETAIN``).  Before an append, each batch that carries
a producer id (``producer_id >= 0``) is checked (Kafka's ``ProducerAppendInfo``):

* epoch older than the current one: ``INVALID_PRODUCER_EPOCH``;
* epoch newer: the batch must start at sequence 0, else ``OUT_OF_ORDER_SEQUENCE_NUMBER``
  (unless the producer is unknown);
* same epoch, same (first, last) sequence as a retained batch: a duplicate. The append
  writes nothing and answers with the original offsets (Kafka answers success);
* same epoch, otherwise: the first sequence must follow the last one (modulo 2**31),
  else ``OUT_OF_ORDER_SEQUENCE_NUMBER``;
* unknown producer id: any sequence is accepted (its history may have been deleted by
  retention).

:meth:`ProducerStateTable.check` plans without changing anything; :meth:`update` applies
an appended batch; :meth:`replay` rebuilds from batch headers at recovery (same as
update, no checks).  No snapshots: recovery replays the headers of the log.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from shoal.errors import ApiError, ErrorCode

__all__ = ["BatchMetadata", "ProducerEntry", "ProducerStateTable", "BATCHES_TO_RETAIN"]

BATCHES_TO_RETAIN = 5
_SEQ_MOD = 0x80000000


@dataclass(frozen=True, slots=True)
class BatchMetadata:
    first_seq: int
    last_seq: int
    first_offset: int
    last_offset: int
    timestamp: int


@dataclass(slots=True)
class ProducerEntry:
    producer_id: int
    epoch: int
    batches: deque = field(default_factory=lambda: deque(maxlen=BATCHES_TO_RETAIN))
    last_timestamp: int = -1

    @property
    def last_seq(self) -> int:
        return self.batches[-1].last_seq if self.batches else -1


class ProducerStateTable:
    """Producer id -> entry.  Event loop only, never awaits."""

    def __init__(self) -> None:
        self.entries: dict[int, ProducerEntry] = {}

    def check(self, producer_id: int, epoch: int, first_seq: int, last_seq: int,
              pending: dict[int, tuple[int, int]] | None = None) -> BatchMetadata | None:
        """Check one batch. Returns the original batch's metadata for a duplicate, else None.

        ``pending`` maps producer id -> (epoch, last_seq) for batches earlier in the same
        append (updated here), so several batches of one producer in one request chain.
        Raises ApiError(invalid_producer_epoch | out_of_order_sequence_number).
        """
        entry = self.entries.get(producer_id)
        if pending is not None and producer_id in pending:
            cur_epoch, cur_last = pending[producer_id]
            known = True
        elif entry is not None:
            cur_epoch, cur_last = entry.epoch, entry.last_seq
            known = True
        else:
            cur_epoch, cur_last, known = -1, -1, False
        if known and epoch < cur_epoch:
            raise ApiError(ErrorCode.invalid_producer_epoch,
                           f"producer {producer_id} epoch {epoch} is older than {cur_epoch}")
        if known and epoch > cur_epoch:
            if first_seq != 0 and cur_epoch >= 0:
                raise ApiError(ErrorCode.out_of_order_sequence_number,
                               f"producer {producer_id}: new epoch {epoch} must start at sequence 0")
        elif known:
            if entry is not None and (pending is None or producer_id not in pending) and entry.epoch == epoch:
                for b in entry.batches:
                    if b.first_seq == first_seq and b.last_seq == last_seq:
                        return b
            if cur_last >= 0 and first_seq != (cur_last + 1) % _SEQ_MOD:
                raise ApiError(ErrorCode.out_of_order_sequence_number,
                               f"producer {producer_id}: sequence {first_seq} after {cur_last}")
        if pending is not None:
            pending[producer_id] = (epoch, last_seq)
        return None

    def update(self, producer_id: int, epoch: int, first_seq: int, last_seq: int,
               first_offset: int, last_offset: int, timestamp: int) -> None:
        """Record an appended batch (also used by :meth:`replay`)."""
        entry = self.entries.get(producer_id)
        if entry is None or entry.epoch != epoch:
            entry = ProducerEntry(producer_id, epoch)
            self.entries[producer_id] = entry
        entry.batches.append(BatchMetadata(first_seq, last_seq, first_offset, last_offset, timestamp))
        entry.last_timestamp = max(entry.last_timestamp, timestamp)

    def replay(self, producer_id: int, epoch: int, first_seq: int, last_seq: int,
               first_offset: int, last_offset: int, timestamp: int) -> None:
        if producer_id < 0:
            return
        entry = self.entries.get(producer_id)
        if entry is not None and epoch < entry.epoch:
            return
        self.update(producer_id, epoch, first_seq, last_seq, first_offset, last_offset, timestamp)

    def expire(self, now_ms: int, expiration_ms: int) -> list[int]:
        """Forget producers idle for longer than ``expiration_ms``; returns their ids."""
        gone = [pid for pid, e in self.entries.items() if now_ms - e.last_timestamp > expiration_ms]
        for pid in gone:
            del self.entries[pid]
        return gone
