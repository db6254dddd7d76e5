"""The transaction coordinator: one shard per partition of ``__transaction_state`` (pure).

Theory of operation
-------------------
A shard holds the metadata of every transactional id whose key hashes to its partition
(Kafka's rule, :func:`shoal.coordinator.partitioning.coordinator_partition`): the
producer id and epoch handed out to it, its ``transaction.timeout.ms``, the state of its
transaction, the partitions the transaction wrote to, and when it started. Each change
is one record, ``TransactionLogKey`` -> ``TransactionLogValue`` in Kafka's layout
(``shoal.coordinator.schemas``), so the state is the replay of the partition and Kafka's
``kafka-dump-log --transaction-log-decoder`` reads it.

As the other coordinators, request handlers read the state and return a
:class:`~shoal.coordinator.result.Result` (records, then the response); :meth:`replay`
applies a durable record. The states are Kafka's (transaction version 1; version 2,
KIP-890 part 2, at the end):

* ``Empty`` (InitProducerId gave the producer an epoch) -> ``Ongoing`` (AddPartitionsToTxn,
  AddOffsetsToTxn: the partitions are recorded before the producer writes to them);
* ``Ongoing`` -> ``PrepareCommit`` / ``PrepareAbort`` (EndTxn). The result's ``after``
  is a :class:`Completion`: the shell writes a commit or abort marker to every
  partition of the transaction, then applies :meth:`complete`, which records
  ``CompleteCommit`` / ``CompleteAbort`` (the partitions emptied). A shard replayed in a
  ``Prepare*`` state lists it in :meth:`pending_completions`: the markers are written
  (again; a second marker for a closed transaction changes nothing) and it completes;
* a new instance of the producer (InitProducerId) while a transaction is ``Ongoing``:
  the old instance is fenced (``PrepareEpochFence``: the epoch is bumped, and the
  transaction aborted with the bumped epoch, so the partitions refuse the old epoch),
  and the new instance is told CONCURRENT_TRANSACTIONS until the abort is complete; it
  then gets the epoch after that. From a completed state InitProducerId bumps the epoch
  (a new producer id when the epoch is exhausted);
* a transaction ``Ongoing`` for longer than its timeout is aborted the same way
  (:meth:`expired`, :meth:`fence_and_abort`); :meth:`next_deadline_ms` says when the
  shell should look next. The pure core reads no clock: every handler takes ``now_ms``;
* a transactional id with no open transaction whose last change is older than
  ``transactional.id.expiration.ms`` is forgotten (:meth:`expire_ids`: a tombstone).

Transaction version 2 (a producer that adds its partitions through its leaders, Produce
v12, and ends with EndTxn v5): every end bumps the epoch (the markers carry the new one,
so a late batch of the ended transaction is refused), the producer goes on with it, and
an exhausted epoch moves to a new producer id at the completion (``next_producer_id``,
``prev_producer_id``: the tagged fields of the record's version 1, written only then).

Errors are Kafka's: INVALID_TRANSACTION_TIMEOUT (timeout not in 1..``transaction.max.timeout.ms``),
INVALID_PRODUCER_ID_MAPPING (unknown transactional id or another producer id),
PRODUCER_FENCED (an older epoch), CONCURRENT_TRANSACTIONS (a transaction is completing),
INVALID_TXN_STATE (EndTxn that does not match the state).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from shoal.coordinator.records import TRANSACTION_STATE, CoordinatorRecord
from shoal.coordinator.result import Result
from shoal.errors import ErrorCode

__all__ = ["MAX_EPOCH", "Completion", "TransactionCoordinatorShard", "TxnMetadata", "TxnState"]

MAX_EPOCH = 32766
"""The last producer epoch handed out for a producer id (Short.MAX_VALUE - 1, as Kafka)."""


class TxnState(enum.IntEnum):
    """Kafka's TransactionState ids, as ``TransactionStatus`` stores them."""

    EMPTY = 0
    ONGOING = 1
    PREPARE_COMMIT = 2
    PREPARE_ABORT = 3
    COMPLETE_COMMIT = 4
    COMPLETE_ABORT = 5
    DEAD = 6
    PREPARE_EPOCH_FENCE = 7

    @property
    def kafka_name(self) -> str:
        return "".join(w.capitalize() for w in self.name.split("_"))


_COMPLETING = (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT, TxnState.PREPARE_EPOCH_FENCE)


@dataclass(slots=True)
class TxnMetadata:
    transactional_id: str
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    state: TxnState
    partitions: set[tuple[str, int]] = field(default_factory=set)
    start_ms: int = -1
    last_update_ms: int = -1
    client_tv: int = 0
    """The transaction version the producer uses for the current transaction (2: KIP-890 part 2)."""
    prev_producer_id: int = -1
    """Transaction version 2: the producer id before the last epoch overflow (a retried EndTxn of it)."""
    next_producer_id: int = -1
    """Transaction version 2, Prepare* on an exhausted epoch: the producer id the completion moves to."""


@dataclass(frozen=True, slots=True)
class Completion:
    """Markers to write (to every partition), then :meth:`TransactionCoordinatorShard.complete`."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    commit: bool
    partitions: tuple[tuple[str, int], ...]


def _value(m: TxnMetadata) -> dict[str, Any]:
    by_topic: dict[str, list[int]] = {}
    for topic, p in sorted(m.partitions):
        by_topic.setdefault(topic, []).append(p)
    return {
        "producer_id": m.producer_id,
        "producer_epoch": m.producer_epoch,
        "transaction_timeout_ms": m.timeout_ms,
        "transaction_status": int(m.state),
        "transaction_partitions": [{"topic": t, "partition_ids": ps} for t, ps in by_topic.items()],
        "transaction_last_update_timestamp_ms": m.last_update_ms,
        "transaction_start_timestamp_ms": m.start_ms,
        "previous_producer_id": m.prev_producer_id,
        "next_producer_id": m.next_producer_id,
        "client_transaction_version": m.client_tv,
    }


def record_of(m: TxnMetadata) -> CoordinatorRecord:
    """Value version 0 as Kafka writes without transaction version 2; version 1 (the
    tagged fields of KIP-890 part 2) once the producer uses it."""
    version = 1 if m.client_tv >= 2 or m.prev_producer_id >= 0 or m.next_producer_id >= 0 else 0
    return CoordinatorRecord(0, {"transactional_id": m.transactional_id}, _value(m), version, TRANSACTION_STATE)


class TransactionCoordinatorShard:
    """The transactional ids of one ``__transaction_state`` partition."""

    def __init__(self, max_timeout_ms: int) -> None:
        self.max_timeout_ms = max_timeout_ms
        self.txns: dict[str, TxnMetadata] = {}

    # ------------------------------------------------------------ replay
    def replay(self, record: CoordinatorRecord) -> None:
        txn_id = record.key.get("transactional_id", "")
        v = record.value
        if v is None:
            self.txns.pop(txn_id, None)
            return
        try:
            state = TxnState(int(v["transaction_status"]))
        except ValueError:
            state = TxnState.DEAD
        parts = {(t["topic"], int(p)) for t in (v.get("transaction_partitions") or ()) for p in t["partition_ids"]}
        self.txns[txn_id] = TxnMetadata(txn_id, int(v["producer_id"]), int(v["producer_epoch"]),
                                        int(v["transaction_timeout_ms"]), state, parts,
                                        int(v["transaction_start_timestamp_ms"]),
                                        int(v["transaction_last_update_timestamp_ms"]),
                                        int(v.get("client_transaction_version", 0) or 0),
                                        int(v.get("previous_producer_id", -1)),
                                        int(v.get("next_producer_id", -1)))

    def _with(self, m: TxnMetadata, now_ms: int, **changes: Any) -> TxnMetadata:
        new = TxnMetadata(m.transactional_id, m.producer_id, m.producer_epoch, m.timeout_ms, m.state,
                          set(m.partitions), m.start_ms, now_ms, m.client_tv, m.prev_producer_id,
                          m.next_producer_id)
        for k, val in changes.items():
            setattr(new, k, val)
        return new

    # ------------------------------------------------------------ InitProducerId
    def init_producer_id(self, txn_id: str, timeout_ms: int, producer_id: int, producer_epoch: int,
                         now_ms: int, allocate: Callable[[], int]) -> Result[tuple[ErrorCode, int, int]]:
        """Kafka's handleInitProducerId for a transactional id. ``producer_id``/``producer_epoch``
        (-1 when absent) are the caller's current ones (KIP-360). ``allocate()`` hands out
        a new producer id (called only when one is needed)."""
        fail = (lambda code: Result.of((code, -1, -1)))
        if not txn_id:
            return fail(ErrorCode.invalid_request)
        if not 0 < timeout_ms <= self.max_timeout_ms:
            return fail(ErrorCode.invalid_transaction_timeout)
        m = self.txns.get(txn_id)
        if m is None or m.state == TxnState.DEAD:
            new = TxnMetadata(txn_id, allocate(), 0, timeout_ms, TxnState.EMPTY, set(), -1, now_ms)
            return Result.of((ErrorCode.none, new.producer_id, 0), [record_of(new)])
        if producer_id >= 0 and (producer_id != m.producer_id or producer_epoch != m.producer_epoch):
            # KIP-360: the caller's id must be the current one (else another instance took over)
            return fail(ErrorCode.producer_fenced)
        if m.state in _COMPLETING:
            return fail(ErrorCode.concurrent_transactions)
        if m.state == TxnState.ONGOING:
            fenced = self.fence_and_abort(txn_id, now_ms)
            return Result(fenced.records, (ErrorCode.concurrent_transactions, -1, -1), fenced.deadlines, fenced.after,
                          fenced.producer_id, fenced.producer_epoch)
        if m.producer_epoch >= MAX_EPOCH:
            new = self._with(m, now_ms, producer_id=allocate(), producer_epoch=0, timeout_ms=timeout_ms,
                             state=TxnState.EMPTY, partitions=set(), start_ms=-1)
        else:
            new = self._with(m, now_ms, producer_epoch=m.producer_epoch + 1, timeout_ms=timeout_ms,
                             state=TxnState.EMPTY, partitions=set(), start_ms=-1)
        return Result.of((ErrorCode.none, new.producer_id, new.producer_epoch), [record_of(new)])

    # ------------------------------------------------------------ checks
    def _check(self, txn_id: str, producer_id: int, producer_epoch: int) -> tuple[ErrorCode, TxnMetadata | None]:
        if not txn_id:
            return ErrorCode.invalid_request, None
        m = self.txns.get(txn_id)
        if m is None or m.state == TxnState.DEAD or m.producer_id != producer_id:
            return ErrorCode.invalid_producer_id_mapping, None
        if producer_epoch != m.producer_epoch:
            return ErrorCode.producer_fenced, None
        return ErrorCode.none, m

    # ------------------------------------------------------------ AddPartitionsToTxn / AddOffsetsToTxn
    def add_partitions(self, txn_id: str, producer_id: int, producer_epoch: int,
                       partitions: Iterable[tuple[str, int]], now_ms: int, tv2: bool = False) -> Result[ErrorCode]:
        """AddPartitionsToTxn / AddOffsetsToTxn; ``tv2``: added for a producer of transaction
        version 2 by its partition leader or group coordinator (Produce v12, TxnOffsetCommit v5)."""
        code, m = self._check(txn_id, producer_id, producer_epoch)
        if m is None:
            return Result.of(code)
        if m.state in _COMPLETING:
            return Result.of(ErrorCode.concurrent_transactions)
        wanted = set(partitions)
        tv = 2 if tv2 else m.client_tv if m.state == TxnState.ONGOING else 0
        if m.state == TxnState.ONGOING and wanted <= m.partitions and tv == m.client_tv:
            return Result.of(ErrorCode.none)
        start = m.start_ms if m.state == TxnState.ONGOING else now_ms
        new = self._with(m, now_ms, state=TxnState.ONGOING, partitions=m.partitions | wanted, start_ms=start,
                         client_tv=tv)
        return Result.of(ErrorCode.none, [record_of(new)])

    def verify(self, txn_id: str, producer_id: int, producer_epoch: int, topic: str, partition: int) -> ErrorCode:
        """Whether a transactional batch of this producer may be appended to the partition:
        its transaction is open and the partition was added to it."""
        code, m = self._check(txn_id, producer_id, producer_epoch)
        if m is None:
            return ErrorCode.invalid_producer_epoch if code == ErrorCode.producer_fenced else code
        if m.state != TxnState.ONGOING or (topic, partition) not in m.partitions:
            return ErrorCode.invalid_txn_state
        return ErrorCode.none

    def verify_partitions(self, txn_id: str, producer_id: int, producer_epoch: int,
                          partitions: Iterable[tuple[str, int]]) -> dict[tuple[str, int], ErrorCode]:
        """KIP-890 part 1, a partition leader's question (AddPartitionsToTxn v4+ with
        VerifyOnly) before the first transactional batch of a producer: is each partition
        in the producer's transaction? Kafka's answers: INVALID_PRODUCER_ID_MAPPING (unknown
        id or another producer id), PRODUCER_FENCED (another epoch), CONCURRENT_TRANSACTIONS
        (the transaction is completing) for every partition; else NONE for a partition of
        the transaction and TRANSACTION_ABORTABLE for one it does not hold (a completed
        transaction holds none)."""
        wanted = list(partitions)
        if not txn_id:
            return dict.fromkeys(wanted, ErrorCode.invalid_request)
        code, m = self._check(txn_id, producer_id, producer_epoch)
        if m is None:
            return dict.fromkeys(wanted, code)
        if m.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT):
            return dict.fromkeys(wanted, ErrorCode.concurrent_transactions)
        return {k: ErrorCode.none if k in m.partitions else ErrorCode.transaction_abortable for k in wanted}

    # ------------------------------------------------------------ EndTxn
    def end_txn(self, txn_id: str, producer_id: int, producer_epoch: int, commit: bool,
                now_ms: int, tv2: bool = False, allocate: Callable[[], int] | None = None) -> Result[ErrorCode]:
        """EndTxn. ``tv2`` (EndTxn v5, KIP-890 part 2): every end bumps the epoch, see
        :meth:`_end_txn_v2`; ``allocate`` gives the new producer id when the epoch is exhausted."""
        if tv2:
            return self._end_txn_v2(txn_id, producer_id, producer_epoch, commit, now_ms, allocate)
        code, m = self._check(txn_id, producer_id, producer_epoch)
        if m is None:
            return Result.of(code)
        s = m.state
        if s == TxnState.ONGOING:
            return self._prepare(m, commit, now_ms, m.producer_epoch)
        done, preparing = ((TxnState.COMPLETE_COMMIT, TxnState.PREPARE_COMMIT) if commit
                           else (TxnState.COMPLETE_ABORT, TxnState.PREPARE_ABORT))
        if s == done:
            return Result.of(ErrorCode.none)  # a retry of the EndTxn that completed
        if s == preparing:
            return Result.of(ErrorCode.concurrent_transactions)
        return Result.of(ErrorCode.invalid_txn_state)

    def _end_txn_v2(self, txn_id: str, producer_id: int, producer_epoch: int, commit: bool, now_ms: int,
                    allocate: Callable[[], int] | None) -> Result[ErrorCode]:
        """Kafka's endTransaction for transaction version 2: the markers carry the epoch
        after the producer's (the coordinator's new epoch, answered by EndTxn v5), so any
        late batch of the ended transaction is refused; an exhausted epoch moves to a new
        producer id (epoch 0) at the completion. A retried EndTxn is told it completed
        (its epoch is the one before, or the last of the previous producer id). An abort
        with no partition added (nothing was sent) is allowed, and bumps the epoch too."""
        if not txn_id:
            return Result.of(ErrorCode.invalid_request)
        m = self.txns.get(txn_id)
        if m is None or m.state == TxnState.DEAD:
            return Result.of(ErrorCode.invalid_producer_id_mapping)
        retry_overflow = m.prev_producer_id == producer_id and producer_epoch == MAX_EPOCH and m.producer_epoch == 0
        retry_bump = m.producer_epoch == producer_epoch + 1
        if m.producer_id != producer_id and not retry_overflow:
            return Result.of(ErrorCode.invalid_producer_id_mapping)
        s = m.state
        if s in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT):
            valid = retry_bump
        elif s in (TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT):
            valid = retry_bump or retry_overflow or producer_epoch == m.producer_epoch
        else:
            valid = producer_epoch == m.producer_epoch
        if not valid:
            return Result.of(ErrorCode.producer_fenced)
        retry = retry_bump or retry_overflow
        if s == TxnState.ONGOING:
            return self._prepare_v2(m, commit, now_ms, allocate, False)
        if s in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT):
            same = (s == TxnState.PREPARE_COMMIT) == commit
            return Result.of(ErrorCode.concurrent_transactions if same else ErrorCode.invalid_txn_state)
        if s == TxnState.COMPLETE_COMMIT and commit or s == TxnState.COMPLETE_ABORT and not commit:
            return Result.of(ErrorCode.none if retry else ErrorCode.invalid_txn_state)
        if not commit and not retry:  # Empty, CompleteCommit, CompleteAbort: an abort of nothing
            return self._prepare_v2(m, False, now_ms, allocate, True)
        return Result.of(ErrorCode.invalid_txn_state)

    def _prepare_v2(self, m: TxnMetadata, commit: bool, now_ms: int, allocate: Callable[[], int] | None,
                    nothing_added: bool) -> Result[ErrorCode]:
        next_pid = -1
        if m.producer_epoch >= MAX_EPOCH:
            if allocate is None:
                return Result.of(ErrorCode.concurrent_transactions)  # the shell fetches a producer id first
            next_pid = allocate()
        new = self._with(m, now_ms, producer_epoch=m.producer_epoch + 1, client_tv=2, next_producer_id=next_pid,
                         state=TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT,
                         partitions=set() if nothing_added else set(m.partitions),
                         start_ms=now_ms if nothing_added else m.start_ms)
        result: Result[ErrorCode] = Result.of(ErrorCode.none, [record_of(new)])
        result.after = Completion(m.transactional_id, m.producer_id, new.producer_epoch, commit,
                                  tuple(sorted(new.partitions)))
        return result

    def _prepare(self, m: TxnMetadata, commit: bool, now_ms: int, epoch: int) -> Result[ErrorCode]:
        new = self._with(m, now_ms, producer_epoch=epoch,
                         state=TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT)
        result: Result[ErrorCode] = Result.of(ErrorCode.none, [record_of(new)])
        result.after = Completion(m.transactional_id, m.producer_id, epoch, commit, tuple(sorted(m.partitions)))
        return result

    def complete(self, c: Completion, now_ms: int) -> Result[ErrorCode]:
        """The markers of ``c`` are written: record CompleteCommit / CompleteAbort (transaction
        version 2 on an exhausted epoch: with the next producer id, epoch 0)."""
        m = self.txns.get(c.transactional_id)
        want = TxnState.PREPARE_COMMIT if c.commit else TxnState.PREPARE_ABORT
        if m is None or m.state != want or m.producer_id != c.producer_id or m.producer_epoch != c.producer_epoch:
            return Result.of(ErrorCode.invalid_txn_state)
        state = TxnState.COMPLETE_COMMIT if c.commit else TxnState.COMPLETE_ABORT
        if m.next_producer_id >= 0:
            new = self._with(m, now_ms, state=state, partitions=set(), producer_id=m.next_producer_id,
                             producer_epoch=0, prev_producer_id=m.producer_id, next_producer_id=-1)
        else:
            new = self._with(m, now_ms, state=state, partitions=set())
        return Result.of(ErrorCode.none, [record_of(new)])

    @staticmethod
    def producer_after_end(m: TxnMetadata) -> tuple[int, int]:
        """EndTxn v5's answer: the producer id and epoch the producer goes on with (those
        of the completion, also while its markers are still being written)."""
        if m.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT) and m.next_producer_id >= 0:
            return m.next_producer_id, 0
        return m.producer_id, m.producer_epoch

    def pending_completions(self) -> list[Completion]:
        """Transactions replayed in PrepareCommit / PrepareAbort: their markers are still to be written."""
        return [Completion(m.transactional_id, m.producer_id, m.producer_epoch, m.state == TxnState.PREPARE_COMMIT,
                           tuple(sorted(m.partitions)))
                for m in self.txns.values() if m.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT)]

    # ------------------------------------------------------------ fencing and timeouts
    def fence_and_abort(self, txn_id: str, now_ms: int) -> Result[ErrorCode]:
        """PrepareEpochFence: bump the epoch of ``txn_id``'s open transaction and abort it with
        the bumped epoch (the partitions then refuse the old one)."""
        m = self.txns.get(txn_id)
        if m is None or m.state != TxnState.ONGOING:
            return Result.of(ErrorCode.invalid_txn_state)
        if m.producer_epoch >= MAX_EPOCH:
            # no epoch left to fence with: abort with the current one (as Kafka does)
            return self._prepare(m, False, now_ms, m.producer_epoch)
        return self._prepare(m, False, now_ms, m.producer_epoch + 1)

    def expired(self, now_ms: int) -> list[str]:
        """Transactional ids whose transaction is open for longer than its timeout."""
        return [m.transactional_id for m in self.txns.values()
                if m.state == TxnState.ONGOING and m.start_ms + m.timeout_ms <= now_ms]

    def expire_ids(self, now_ms: int, expiration_ms: int) -> Result[list[str]]:
        """Forget transactional ids with no transaction open whose last change is at least
        ``expiration_ms`` old (``transactional.id.expiration.ms``): a tombstone each. The
        next InitProducerId of such an id gets a new producer id."""
        idle = (TxnState.EMPTY, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT, TxnState.DEAD)
        gone = sorted(m.transactional_id for m in self.txns.values()
                      if m.state in idle and now_ms - m.last_update_ms >= expiration_ms)
        return Result.of(gone, [CoordinatorRecord(0, {"transactional_id": t}, None, 0, TRANSACTION_STATE)
                                for t in gone])

    def next_deadline_ms(self) -> int | None:
        deadlines = [m.start_ms + m.timeout_ms for m in self.txns.values() if m.state == TxnState.ONGOING]
        return min(deadlines) if deadlines else None
