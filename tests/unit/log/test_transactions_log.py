"""Transactions in the log: open transactions, markers, the last stable offset, the
aborted-transaction list, all rebuilt when the log is opened again."""

from __future__ import annotations

import pytest

from shoal.errors import ApiError, ErrorCode
from shoal.log.partition_log import PartitionLog
from shoal.log.policy import LogConfig
from shoal.log.producer_state import AbortedTxn
from shoal.protocol.batch import build_batch, decode_records, read_header
from shoal.protocol.markers import ABORT, COMMIT, marker_type

from .helpers import batch


def txn_batch(n: int, pid: int, epoch: int, seq: int) -> bytes:
    return build_batch([(b"k", b"v%d" % i, (), 1000 + i) for i in range(n)], producer_id=pid,
                       producer_epoch=epoch, base_sequence=seq, transactional=True)


def state(log: PartitionLog) -> tuple:
    return log.last_stable_offset, dict(log.txns.ongoing), list(log.txns.aborted)


def test_open_transactions_hold_the_last_stable_offset_and_aborts_are_listed(tmp_path):
    log = PartitionLog.open(tmp_path / "t-0", LogConfig())
    log.append(batch(2), 0)                          # 0-1 plain
    log.append(txn_batch(2, pid=5, epoch=0, seq=0), 0)  # 2-3 producer 5
    log.append(txn_batch(1, pid=6, epoch=0, seq=0), 0)  # 4 producer 6
    log.append(txn_batch(1, pid=5, epoch=0, seq=2), 0)  # 5 producer 5 again
    assert state(log) == (2, {5: 2, 6: 4}, [])
    assert log.high_watermark == 6
    log.append_marker(5, 0, commit=False, coordinator_epoch=0, now_ms=1)  # 6 abort of 5
    assert state(log) == (4, {6: 4}, [AbortedTxn(5, 2, 6, 4)])
    log.append_marker(6, 0, commit=True, coordinator_epoch=0, now_ms=1)   # 7 commit of 6
    assert state(log) == (8, {}, [AbortedTxn(5, 2, 6, 4)])
    assert log.aborted_transactions(0, 8) == [AbortedTxn(5, 2, 6, 4)]
    assert log.aborted_transactions(7, 8) == []
    assert log.aborted_transactions(0, 2) == []
    kinds = [marker_type(data) for h, data in log.read_batches(0) if h.is_control]
    assert kinds == [ABORT, COMMIT]
    # an open transaction, then a restart: everything is rebuilt from the log
    log.append(txn_batch(1, pid=6, epoch=0, seq=1), 0)  # 8
    before = state(log)
    log.close()
    again = PartitionLog.open(tmp_path / "t-0", LogConfig())
    assert state(again) == before == (8, {6: 8}, [AbortedTxn(5, 2, 6, 4)])
    again.append_marker(6, 0, commit=True, coordinator_epoch=0, now_ms=2)
    assert again.last_stable_offset == again.log_end_offset == 10


def test_a_marker_with_a_newer_epoch_fences_the_older_one(tmp_path):
    log = PartitionLog.open(tmp_path / "t-0", LogConfig())
    log.append(txn_batch(1, pid=5, epoch=0, seq=0), 0)
    log.append_marker(5, 1, commit=False, coordinator_epoch=0, now_ms=1)  # the coordinator bumped the epoch
    with pytest.raises(ApiError) as e:
        log.append(txn_batch(1, pid=5, epoch=0, seq=1), 0)
    assert e.value.error_code == ErrorCode.invalid_producer_epoch
    with pytest.raises(ApiError) as e:
        log.append_marker(5, 0, commit=True, coordinator_epoch=0, now_ms=1)
    assert e.value.error_code == ErrorCode.invalid_producer_epoch
    # the new epoch starts over at sequence 0
    log.append(txn_batch(1, pid=5, epoch=1, seq=0), 0)
    assert log.txns.ongoing == {5: 2}


def test_follower_rebuilds_transactions_from_replicated_batches(tmp_path):
    leader = PartitionLog.open(tmp_path / "l-0", LogConfig())
    leader.append(txn_batch(2, pid=5, epoch=0, seq=0), 0)
    leader.append_marker(5, 0, commit=False, coordinator_epoch=0, now_ms=1)
    leader.append(txn_batch(1, pid=5, epoch=0, seq=2), 0)
    follower = PartitionLog.open(tmp_path / "f-0", LogConfig())
    data = b"".join(bytes(d) for _h, d in leader.read_batches(0))
    follower.append_as_follower(data, 0)
    assert state(follower) == state(leader) == (3, {5: 3}, [AbortedTxn(5, 0, 2, 3)])


def test_retention_forgets_aborted_transactions_below_the_log_start(tmp_path):
    log = PartitionLog.open(tmp_path / "t-0", LogConfig())
    log.append(txn_batch(1, pid=5, epoch=0, seq=0), 0)
    log.append_marker(5, 0, commit=False, coordinator_epoch=0, now_ms=1)
    log.append(batch(1), 0)
    log.delete_records(2)
    assert log.txns.aborted == []
    log.close()
    assert PartitionLog.open(tmp_path / "t-0", LogConfig()).txns.aborted == []


def test_marker_batch_layout():
    from shoal.protocol.markers import build_marker
    data = build_marker(True, 9, 3, 7, 1234)
    h = read_header(data)
    assert h.is_control and h.is_transactional and h.producer_id == 9 and h.producer_epoch == 3
    assert h.base_sequence == -1 and h.records_count == 1
    assert marker_type(data) == COMMIT


def test_compaction_drops_aborted_records_and_never_lets_them_replace_committed_ones(tmp_path):
    from shoal.log.compaction import compact

    cfg = LogConfig(segment_bytes=1024, cleanup_policy=("compact",), delete_retention_ms=1000)
    log = PartitionLog.open(tmp_path / "c-0", cfg)

    def txn(key: bytes, value: bytes, pid: int, seq: int) -> bytes:
        return build_batch([(key, value, (), 1000)], producer_id=pid, producer_epoch=0, base_sequence=seq,
                           transactional=True)

    log.append(build_batch([(b"k", b"committed", (), 1000)]), 0)       # 0
    log.append(txn(b"k", b"aborted", 5, 0), 0)                         # 1
    log.append_marker(5, 0, commit=False, coordinator_epoch=0, now_ms=1000)  # 2
    log.append(txn(b"j", b"open", 6, 0), 0)                            # 3: never decided here
    for i in range(40):                                                # roll segments past them
        log.append(build_batch([(b"f%d" % (i % 3), b"x" * 40, (), 1000 + i)]), 0)
    assert len(log.segments) > 2
    compact(log, now_ms=5000)
    values = {}
    for _h, data in log.read_batches(0):
        for r in decode_records(data):
            if r.key in (b"k", b"j"):
                values.setdefault(r.key, []).append(r.value)
    assert values == {b"k": [b"committed"], b"j": [b"open"]}
    kinds = [marker_type(d) for h, d in log.read_batches(0) if h.is_control]
    assert kinds == [ABORT]  # markers stay
    assert log.txns.ongoing == {6: 3}


def _txnindex(path) -> list[tuple]:
    import struct
    data = path.read_bytes()
    return [struct.unpack_from(">hqqqq", data, i) for i in range(0, len(data), 34)]


def test_segments_get_kafkas_txnindex_files(tmp_path):
    cfg = LogConfig(segment_bytes=600)
    log = PartitionLog.open(tmp_path / "t-0", cfg)
    log.append(txn_batch(2, pid=5, epoch=0, seq=0), 0)                      # 0-1
    log.append_marker(5, 0, commit=False, coordinator_epoch=0, now_ms=1)    # 2
    log.append(txn_batch(1, pid=6, epoch=0, seq=0), 0)                      # 3
    log.append_marker(6, 0, commit=True, coordinator_epoch=0, now_ms=1)     # 4
    first = log.segments[0]
    for i in range(20):                                                     # roll
        log.append(batch(1), 0)
    assert len(log.segments) > 1
    assert _txnindex(first.txn_index_path) == [(0, 5, 0, 2, 3)]  # sealed with its segment
    assert not log.segments[1].txn_index_path.exists()
    # an abort in the active segment is written at close, and checked again at open
    log.append(txn_batch(1, pid=7, epoch=0, seq=0), 0)
    marker = log.append_marker(7, 0, commit=False, coordinator_epoch=0, now_ms=1).base_offset
    active = log.segments[-1]
    log.close()
    assert _txnindex(active.txn_index_path) == [(0, 7, marker - 1, marker, marker + 1)]
    active.txn_index_path.unlink()
    again = PartitionLog.open(tmp_path / "t-0", cfg)
    assert _txnindex(again.segments[-1].txn_index_path) == [(0, 7, marker - 1, marker, marker + 1)]
    # retention deletes a segment's index with it
    again.delete_records(again.segments[1].base_offset)
    assert not first.txn_index_path.exists()


def test_markers_from_an_older_coordinator_are_fenced_and_the_epoch_survives_a_restart(tmp_path):
    log = PartitionLog.open(tmp_path / "t-0", LogConfig())
    log.append(txn_batch(1, pid=5, epoch=0, seq=0), 0)
    log.append_marker(5, 0, commit=True, coordinator_epoch=3, now_ms=1)
    log.append(txn_batch(1, pid=5, epoch=0, seq=1), 0)
    with pytest.raises(ApiError) as e:
        log.append_marker(5, 0, commit=False, coordinator_epoch=2, now_ms=1)
    assert e.value.error_code == ErrorCode.transaction_coordinator_fenced
    assert log.producers.entries[5].coordinator_epoch == 3
    log.close()
    again = PartitionLog.open(tmp_path / "t-0", LogConfig())
    assert again.producers.entries[5].coordinator_epoch == 3 and again.txns.ongoing == {5: 2}
