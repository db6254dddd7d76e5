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

Transactions (:class:`TxnState`): a partition also remembers, per producer id, the offset
of the first batch of its open transaction (Kafka's ``currentTxnFirstOffset``), and the
list of aborted transactions (Kafka's aborted-transaction index): producer id, first
offset, the offset of the abort marker, and the last stable offset when it was written.
A transactional batch opens (or continues) its producer's transaction; a control batch
(commit or abort marker) closes it. The *first unstable offset* is the smallest first
offset of an open transaction; the last stable offset is that, or the high watermark.
A marker also moves the producer's epoch (the coordinator may have bumped it when it
fenced the producer): its retained batches are then forgotten, so the new epoch starts
over at any sequence.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from shoal.errors import ApiError, ErrorCode

__all__ = ["BATCHES_TO_RETAIN", "AbortedTxn", "BatchMetadata", "ProducerEntry", "ProducerStateTable", "TxnState"]

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
    coordinator_epoch: int = -1
    """The transaction coordinator's epoch in the last marker written for this producer."""

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

    def check_marker(self, producer_id: int, epoch: int, coordinator_epoch: int = -1) -> None:
        """A commit or abort marker of ``producer_id`` at ``epoch`` may be written: not older than
        the producer's epoch, nor from an older coordinator than the last marker's (Kafka's
        checks). Raises ApiError(INVALID_PRODUCER_EPOCH | TRANSACTION_COORDINATOR_FENCED)."""
        entry = self.entries.get(producer_id)
        if entry is not None and epoch < entry.epoch:
            raise ApiError(ErrorCode.invalid_producer_epoch,
                           f"marker of producer {producer_id} at epoch {epoch} is older than {entry.epoch}")
        if entry is not None and coordinator_epoch < entry.coordinator_epoch:
            raise ApiError(ErrorCode.transaction_coordinator_fenced,
                           f"marker of producer {producer_id} from coordinator epoch {coordinator_epoch}, "
                           f"older than {entry.coordinator_epoch}")

    def mark(self, producer_id: int, epoch: int, timestamp: int, coordinator_epoch: int = -1) -> None:
        """A marker of ``producer_id`` was written at ``epoch`` (also at replay)."""
        entry = self.entries.get(producer_id)
        if entry is None:
            entry = self.entries[producer_id] = ProducerEntry(producer_id, epoch)
        elif epoch > entry.epoch:
            entry.epoch = epoch
            entry.batches.clear()
        entry.last_timestamp = max(entry.last_timestamp, timestamp)
        entry.coordinator_epoch = max(entry.coordinator_epoch, coordinator_epoch)

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


@dataclass(frozen=True, slots=True)
class AbortedTxn:
    """One aborted transaction of a partition (an entry of Kafka's ``.txnindex``)."""

    producer_id: int
    first_offset: int
    last_offset: int
    """The offset of the abort marker."""
    last_stable_offset: int


class TxnState:
    """Open and aborted transactions of one partition."""

    def __init__(self) -> None:
        self.ongoing: dict[int, int] = {}
        """Producer id -> offset of the first batch of its open transaction."""
        self.aborted: list[AbortedTxn] = []
        """In marker order (so by ``last_offset``)."""

    def on_batch(self, producer_id: int, base_offset: int) -> None:
        """A transactional data batch of ``producer_id`` was appended at ``base_offset``."""
        self.ongoing.setdefault(producer_id, base_offset)

    def first_unstable_offset(self) -> int | None:
        return min(self.ongoing.values()) if self.ongoing else None

    def on_marker(self, producer_id: int, commit: bool, offset: int) -> AbortedTxn | None:
        """A marker of ``producer_id`` was appended at ``offset``; returns the aborted entry it adds.

        A marker for a producer with no open transaction here (the coordinator writes one
        to every partition of the transaction) changes nothing."""
        first = self.ongoing.pop(producer_id, None)
        if first is None or commit:
            return None
        fu = self.first_unstable_offset()
        entry = AbortedTxn(producer_id, first, offset, offset + 1 if fu is None else fu)
        self.aborted.append(entry)
        return entry

    def aborted_between(self, start: int, end: int) -> list[AbortedTxn]:
        """The aborted transactions a reader of offsets [start, end) must know of (Kafka's
        ``collectAbortedTransactions``): those ending at or after ``start`` and starting before ``end``."""
        return [a for a in self.aborted if a.last_offset >= start and a.first_offset < end]

    def forget_below(self, log_start_offset: int) -> None:
        """Drop what retention deleted: aborted transactions whose marker is below the log start."""
        if self.aborted and self.aborted[0].last_offset < log_start_offset:
            self.aborted = [a for a in self.aborted if a.last_offset >= log_start_offset]
