"""The transaction coordinator's pure shard: states, fencing, timeouts, records and replay."""

from __future__ import annotations

import itertools

from shoal.coordinator.records import TRANSACTION_STATE, CoordinatorRecord
from shoal.errors import ErrorCode
from shoal.transactions.coordinator import (
    MAX_EPOCH,
    Completion,
    TransactionCoordinatorShard,
    TxnState,
)


class Harness:
    """A shard whose results are applied through the bytes, as the runtime applies them."""

    def __init__(self) -> None:
        self.shard = TransactionCoordinatorShard(max_timeout_ms=60_000)
        self.ids = itertools.count(100)
        self.log: list[tuple[bytes, bytes | None]] = []

    def apply(self, result):
        for rec in result.records:
            k, v = rec.to_bytes()
            self.log.append((k, v))
            self.shard.replay(CoordinatorRecord.from_bytes(k, v, TRANSACTION_STATE))
        return result

    def init(self, txn_id="t", timeout=10_000, now=0, pid=-1, epoch=-1):
        return self.apply(self.shard.init_producer_id(txn_id, timeout, pid, epoch, now, lambda: next(self.ids)))

    def replayed(self) -> TransactionCoordinatorShard:
        fresh = TransactionCoordinatorShard(max_timeout_ms=60_000)
        for k, v in self.log:
            fresh.replay(CoordinatorRecord.from_bytes(k, v, TRANSACTION_STATE))
        return fresh


def test_init_add_commit_and_the_records_replay_to_the_same_state():
    h = Harness()
    assert h.init(timeout=0).response == (ErrorCode.invalid_transaction_timeout, -1, -1)
    assert h.init(timeout=60_001).response[0] == ErrorCode.invalid_transaction_timeout
    assert h.init().response == (ErrorCode.none, 100, 0)
    assert h.init().response == (ErrorCode.none, 100, 1)  # a new instance: epoch bumped
    s = h.shard
    assert h.apply(s.add_partitions("t", 100, 0, [("a", 0)], 5)).response == ErrorCode.producer_fenced
    assert h.apply(s.add_partitions("t", 99, 1, [("a", 0)], 5)).response == ErrorCode.invalid_producer_id_mapping
    assert h.apply(s.add_partitions("t", 100, 1, [("a", 0), ("b", 2)], 5)).response == ErrorCode.none
    assert s.txns["t"].state == TxnState.ONGOING and s.txns["t"].start_ms == 5
    assert not h.apply(s.add_partitions("t", 100, 1, [("a", 0)], 6)).records  # already in
    assert s.verify("t", 100, 1, "a", 0) == ErrorCode.none
    assert s.verify("t", 100, 1, "a", 1) == ErrorCode.invalid_txn_state
    assert s.verify("t", 100, 0, "a", 0) == ErrorCode.invalid_producer_epoch
    end = h.apply(s.end_txn("t", 100, 1, True, 7))
    assert end.response == ErrorCode.none
    assert end.after == Completion("t", 100, 1, True, (("a", 0), ("b", 2)))
    assert s.txns["t"].state == TxnState.PREPARE_COMMIT
    assert h.replayed().pending_completions() == [end.after]  # a restart finishes it
    assert h.apply(s.end_txn("t", 100, 1, True, 8)).response == ErrorCode.concurrent_transactions
    assert h.apply(s.add_partitions("t", 100, 1, [("a", 0)], 8)).response == ErrorCode.concurrent_transactions
    assert h.init(now=8).response[0] == ErrorCode.concurrent_transactions
    assert h.apply(s.complete(end.after, 9)).response == ErrorCode.none
    assert s.txns["t"].state == TxnState.COMPLETE_COMMIT and not s.txns["t"].partitions
    assert h.apply(s.end_txn("t", 100, 1, True, 10)).response == ErrorCode.none  # a retry
    assert h.apply(s.end_txn("t", 100, 1, False, 10)).response == ErrorCode.invalid_txn_state
    assert h.replayed().txns == s.txns


def test_a_new_instance_fences_and_aborts_the_open_transaction():
    h = Harness()
    h.init()
    s = h.shard
    h.apply(s.add_partitions("t", 100, 0, [("a", 0)], 1))
    fenced = h.init(now=2)
    assert fenced.response == (ErrorCode.concurrent_transactions, -1, -1)
    assert fenced.after == Completion("t", 100, 1, False, (("a", 0),))  # aborted with the bumped epoch
    assert s.txns["t"].state == TxnState.PREPARE_ABORT
    h.apply(s.complete(fenced.after, 3))
    assert h.init(now=4).response == (ErrorCode.none, 100, 2)
    assert h.apply(s.end_txn("t", 100, 0, True, 5)).response == ErrorCode.producer_fenced
    # KIP-360: an init naming an id or epoch that is no longer current is fenced
    assert h.init(now=6, pid=100, epoch=1).response[0] == ErrorCode.producer_fenced
    assert h.init(now=6, pid=100, epoch=2).response == (ErrorCode.none, 100, 3)


def test_timeouts_abort_with_a_bumped_epoch():
    h = Harness()
    h.init(timeout=1000)
    s = h.shard
    h.apply(s.add_partitions("t", 100, 0, [("a", 0)], 50))
    assert s.next_deadline_ms() == 1050
    assert s.expired(1049) == [] and s.expired(1050) == ["t"]
    r = h.apply(s.fence_and_abort("t", 1050))
    assert r.after == Completion("t", 100, 1, False, (("a", 0),))
    h.apply(s.complete(r.after, 1051))
    assert s.txns["t"].state == TxnState.COMPLETE_ABORT and s.next_deadline_ms() is None
    assert h.apply(s.end_txn("t", 100, 0, True, 1100)).response == ErrorCode.producer_fenced


def test_an_exhausted_epoch_gets_a_new_producer_id():
    h = Harness()
    h.init()
    h.shard.txns["t"].producer_epoch = MAX_EPOCH
    assert h.init().response == (ErrorCode.none, 101, 0)


def test_records_are_kafkas_transaction_log_layout():
    h = Harness()
    h.init(txn_id="tx")
    h.apply(h.shard.add_partitions("tx", 100, 0, [("topic", 3), ("topic", 1)], 42))
    key, value = h.log[-1]
    assert key == b"\x00\x00" + b"\x00\x02tx"  # version 0, then the string
    # version 0: pid, epoch, timeout, status, partitions (topic, [1, 3]), last update, start
    expect = (b"\x00\x00" + (100).to_bytes(8, "big") + b"\x00\x00" + (10_000).to_bytes(4, "big") + b"\x01"
              + (1).to_bytes(4, "big") + b"\x00\x05topic" + (2).to_bytes(4, "big") + (1).to_bytes(4, "big")
              + (3).to_bytes(4, "big") + (42).to_bytes(8, "big") + (42).to_bytes(8, "big"))
    assert value == expect


def test_idle_transactional_ids_expire_but_open_transactions_do_not():
    h = Harness()
    h.init("idle", now=0)
    h.init("busy", now=0)
    h.apply(h.shard.add_partitions("busy", 101, 0, [("a", 0)], 10))
    r = h.apply(h.shard.expire_ids(999, 1000))
    assert r.response == [] and not r.records
    r = h.apply(h.shard.expire_ids(1000, 1000))
    assert r.response == ["idle"] and set(h.shard.txns) == {"busy"}
    assert set(h.replayed().txns) == {"busy"}  # the tombstone replays
    assert h.init("idle", now=1001).response == (ErrorCode.none, 102, 0)  # a new producer id


def test_verify_partitions_answers_a_partition_leader_as_kafka_does():
    """KIP-890 part 1: AddPartitionsToTxn with VerifyOnly, asked by a partition leader before
    a producer's first transactional batch there; nothing is recorded."""
    h = Harness()
    s = h.shard
    a0, a1 = ("a", 0), ("a", 1)
    assert s.verify_partitions("t", 100, 0, [a0]) == {a0: ErrorCode.invalid_producer_id_mapping}  # unknown id
    assert s.verify_partitions("", 100, 0, [a0]) == {a0: ErrorCode.invalid_request}
    h.init()
    # Empty: no transaction holds any partition yet
    assert s.verify_partitions("t", 100, 0, [a0]) == {a0: ErrorCode.transaction_abortable}
    h.apply(s.add_partitions("t", 100, 0, [a0], 1))
    before = dict(s.txns)
    assert s.verify_partitions("t", 100, 0, [a0, a1]) == {a0: ErrorCode.none, a1: ErrorCode.transaction_abortable}
    assert s.txns == before
    assert s.verify_partitions("t", 99, 0, [a0]) == {a0: ErrorCode.invalid_producer_id_mapping}
    assert s.verify_partitions("t", 100, 1, [a0]) == {a0: ErrorCode.producer_fenced}
    end = h.apply(s.end_txn("t", 100, 0, False, 2))
    assert s.verify_partitions("t", 100, 0, [a0]) == {a0: ErrorCode.concurrent_transactions}
    h.apply(s.complete(end.after, 3))
    # the abort marker closed the transaction: a late batch of it is refused
    assert s.verify_partitions("t", 100, 0, [a0]) == {a0: ErrorCode.transaction_abortable}


def test_transaction_version_2_bumps_the_epoch_at_every_end():
    """EndTxn v5 (KIP-890 part 2): the markers and the next transaction use the epoch after
    the producer's; a retried EndTxn is told it completed; an abort of nothing bumps too."""
    h = Harness()
    h.init()
    s = h.shard
    shard_cls = TransactionCoordinatorShard
    assert h.apply(s.add_partitions("t", 100, 0, [("a", 0)], 1, tv2=True)).response == ErrorCode.none
    end = h.apply(s.end_txn("t", 100, 0, True, 2, tv2=True))
    assert end.response == ErrorCode.none
    assert end.after == Completion("t", 100, 1, True, (("a", 0),))  # markers with the bumped epoch
    assert shard_cls.producer_after_end(s.txns["t"]) == (100, 1)
    assert h.apply(s.end_txn("t", 100, 0, True, 3, tv2=True)).response == ErrorCode.concurrent_transactions
    h.apply(s.complete(end.after, 3))
    assert (s.txns["t"].state, s.txns["t"].producer_epoch) == (TxnState.COMPLETE_COMMIT, 1)
    assert h.apply(s.end_txn("t", 100, 0, True, 4, tv2=True)).response == ErrorCode.none  # a retry
    assert h.apply(s.end_txn("t", 100, 0, False, 4, tv2=True)).response == ErrorCode.invalid_txn_state
    assert h.apply(s.end_txn("t", 100, 1, True, 4, tv2=True)).response == ErrorCode.invalid_txn_state  # nothing open
    assert h.apply(s.end_txn("t", 100, 3, True, 4, tv2=True)).response == ErrorCode.producer_fenced
    # the old epoch cannot write into the next transaction
    assert h.apply(s.add_partitions("t", 100, 0, [("a", 0)], 5, tv2=True)).response == ErrorCode.producer_fenced
    assert s.verify_partitions("t", 100, 0, [("a", 0)]) == {("a", 0): ErrorCode.producer_fenced}
    # an abort with no partition added: allowed, bumps the epoch, no marker to write
    empty = h.apply(s.end_txn("t", 100, 1, False, 6, tv2=True))
    assert empty.response == ErrorCode.none and empty.after == Completion("t", 100, 2, False, ())
    h.apply(s.complete(empty.after, 7))
    assert shard_cls.producer_after_end(s.txns["t"]) == (100, 2)
    assert h.replayed().txns == s.txns  # the tagged fields of the record's version 1 replay


def test_transaction_version_2_moves_to_a_new_producer_id_when_the_epoch_is_exhausted():
    h = Harness()
    h.init()
    s = h.shard
    s.txns["t"].producer_epoch = MAX_EPOCH
    h.apply(s.add_partitions("t", 100, MAX_EPOCH, [("a", 0)], 1, tv2=True))
    assert h.apply(s.end_txn("t", 100, MAX_EPOCH, False, 2, tv2=True)).response == ErrorCode.concurrent_transactions
    end = h.apply(s.end_txn("t", 100, MAX_EPOCH, False, 2, tv2=True, allocate=lambda: 555))
    assert end.after == Completion("t", 100, MAX_EPOCH + 1, False, (("a", 0),))
    assert TransactionCoordinatorShard.producer_after_end(s.txns["t"]) == (555, 0)
    h.apply(s.complete(end.after, 3))
    m = s.txns["t"]
    assert (m.producer_id, m.producer_epoch, m.prev_producer_id, m.next_producer_id) == (555, 0, 100, -1)
    # the retry of the EndTxn that overflowed is told it completed
    assert h.apply(s.end_txn("t", 100, MAX_EPOCH, False, 4, tv2=True)).response == ErrorCode.none
    assert h.replayed().txns == s.txns


def test_a_timed_out_transaction_of_version_2_lets_its_producer_abort_and_go_on():
    h = Harness()
    h.init()
    s = h.shard
    h.apply(s.add_partitions("t", 100, 0, [("a", 0)], 0, tv2=True))
    fenced = h.apply(s.fence_and_abort("t", 20_000))
    assert fenced.after.producer_epoch == 1
    h.apply(s.complete(fenced.after, 20_001))
    # the producer (epoch 0) learns of it and aborts: told it is done, with epoch 1
    assert h.apply(s.end_txn("t", 100, 0, False, 20_002, tv2=True)).response == ErrorCode.none
    assert TransactionCoordinatorShard.producer_after_end(s.txns["t"]) == (100, 1)
