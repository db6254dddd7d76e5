"""A partition leader asks the transaction coordinator about a producer's batch unless the
partition has an open transaction of that producer id at that epoch (Kafka's
hasOngoingTransaction, KIP-890): with transaction version 2 every transaction has its own
epoch, so a batch of the next transaction is asked about even while the previous one's
marker has not reached the partition."""

from __future__ import annotations

from shoal.log.partition_log import PartitionLog
from shoal.log.policy import LogConfig
from shoal.protocol.batch import build_batch
from shoal.server.txn_service import has_ongoing_transaction


def txn_batch(pid: int, epoch: int, seq: int) -> bytes:
    return build_batch([(b"k", b"v", (), 1000)], producer_id=pid, producer_epoch=epoch, base_sequence=seq,
                       transactional=True)


def test_only_an_open_transaction_of_the_same_epoch_counts(tmp_path):
    log = PartitionLog.open(tmp_path / "t-0", LogConfig())
    assert not has_ongoing_transaction(log, 5, 0)
    log.append(txn_batch(5, 0, 0), 0)
    assert has_ongoing_transaction(log, 5, 0)
    assert not has_ongoing_transaction(log, 5, 1)  # the next transaction's epoch: its marker is still to come
    assert not has_ongoing_transaction(log, 6, 0)
    log.append_marker(5, 1, commit=True, coordinator_epoch=0, now_ms=1)  # version 2: the marker's epoch is bumped
    assert not has_ongoing_transaction(log, 5, 1)
    log.append(txn_batch(5, 1, 0), 0)
    assert has_ongoing_transaction(log, 5, 1)
    log.close()
