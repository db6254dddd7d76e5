"""Idempotent producers: duplicates, sequence gaps, epochs; state rebuilt at restart."""

from __future__ import annotations

import pytest

from shoal.errors import ApiError, ErrorCode
from shoal.log.partition_log import PartitionLog
from shoal.log.policy import LogConfig
from shoal.log.producer_state import ProducerStateTable

from .helpers import batch


def code_of(fn) -> ErrorCode:
    with pytest.raises(ApiError) as ei:
        fn()
    return ei.value.error_code


def test_table_rules():
    t = ProducerStateTable()
    assert t.check(1, 0, 5, 9) is None  # unknown producer: any sequence
    t.update(1, 0, 5, 9, 100, 104, 0)
    assert t.check(1, 0, 5, 9).first_offset == 100
    assert code_of(lambda: t.check(1, 0, 11, 12)) == ErrorCode.out_of_order_sequence_number
    assert t.check(1, 0, 10, 10) is None
    assert code_of(lambda: t.check(1, 1, 3, 3)) == ErrorCode.out_of_order_sequence_number
    assert t.check(1, 1, 0, 0) is None
    t.update(1, 2, 0, 0, 200, 200, 0)
    assert code_of(lambda: t.check(1, 1, 1, 1)) == ErrorCode.invalid_producer_epoch
    assert t.expire(10, 5) == [1] and not t.entries


def test_only_last_five_batches_are_remembered():
    t = ProducerStateTable()
    for i in range(7):
        t.update(3, 0, i, i, i, i, 0)
    assert t.check(3, 0, 2, 2) is not None
    assert code_of(lambda: t.check(3, 0, 1, 1)) == ErrorCode.out_of_order_sequence_number


def test_partition_log_idempotence_and_restart(tmp_path):
    cfg = LogConfig()
    log = PartitionLog.open(tmp_path / "p-0", cfg)
    r1 = log.append(batch(3, pid=7, epoch=0, seq=0), 0)
    r2 = log.append(batch(2, pid=7, epoch=0, seq=3), 0)
    dup = log.append(batch(3, pid=7, epoch=0, seq=0), 0)
    assert dup.duplicate and (dup.base_offset, dup.last_offset) == (r1.base_offset, r1.last_offset)
    assert log.log_end_offset == 5
    assert code_of(lambda: log.append(batch(1, pid=7, epoch=0, seq=9), 0)) == ErrorCode.out_of_order_sequence_number
    # several batches of one producer in one request chain; a gap fails the whole request
    log.append(batch(1, pid=7, epoch=0, seq=5) + batch(1, pid=7, epoch=0, seq=6), 0)
    assert code_of(lambda: log.append(batch(1, pid=7, epoch=0, seq=7) + batch(1, pid=7, epoch=0, seq=9), 0)) \
        == ErrorCode.out_of_order_sequence_number
    assert log.log_end_offset == 7
    log.append(batch(1, pid=7, epoch=1, seq=0), 0)
    assert code_of(lambda: log.append(batch(1, pid=7, epoch=0, seq=7), 0)) == ErrorCode.invalid_producer_epoch
    log.append(batch(1), 0)  # non-idempotent batches are not checked
    log.close()
    log = PartitionLog.open(tmp_path / "p-0", cfg)
    dup = log.append(batch(1, pid=7, epoch=1, seq=0), 0)
    assert dup.duplicate and dup.base_offset == 7
    assert log.append(batch(1, pid=7, epoch=1, seq=1), 0).base_offset == 9
    assert r2.base_offset == 3
