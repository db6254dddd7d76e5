"""The log operations a follower uses: appending the leader's batches as they are, truncating."""

from __future__ import annotations

import pytest

from shoal.errors import ApiError, ErrorCode
from shoal.log.partition_log import PartitionLog
from shoal.log.policy import LogConfig
from shoal.protocol.batch import read_header

from .helpers import batch


def open_log(path, name: str = "t-0", **kw) -> PartitionLog:
    return PartitionLog.open(path / name, LogConfig(**kw))


def test_leader_epoch_is_stamped_and_a_follower_copies_batches_byte_for_byte(tmp_path):
    leader = open_log(tmp_path, "leader")
    leader.append(batch(3), 0, leader_epoch=7)
    leader.append(batch(2), 0, leader_epoch=8)
    data = leader.read(0, 1 << 20)
    follower = open_log(tmp_path, "follower")
    epochs = follower.append_as_follower(data, 0)
    assert epochs == [(7, 0), (8, 3)]
    assert follower.log_end_offset == 5
    assert follower.read(0, 1 << 20) == data
    assert read_header(data, 0).partition_leader_epoch == 7


def test_a_fetched_run_never_goes_below_the_log_end_but_may_follow_a_gap(tmp_path):
    """A leader whose recovery cut damaged bytes serves the batches after the gap: the
    follower takes them (as Kafka's follower does), but never offsets it already has."""
    leader = open_log(tmp_path, "leader")
    leader.append(batch(3), 0)
    leader.append(batch(1), 0)
    first, second = leader.read(0, 1), leader.read(3, 1 << 20)
    follower = open_log(tmp_path, "follower")
    assert follower.append_as_follower(second, 0) == [(-1, 3)]
    assert follower.log_end_offset == 4 and follower.read(0, 1 << 20) == second
    with pytest.raises(ApiError) as e:
        follower.append_as_follower(first, 0)
    assert e.value.error_code == ErrorCode.offset_out_of_range
    assert follower.log_end_offset == 4


def test_truncate_cuts_whole_batches_across_segments_and_rebuilds_producer_state(tmp_path):
    log = open_log(tmp_path, segment_bytes=1024)
    for i in range(12):  # several segments; an idempotent producer's sequence runs on
        log.append(batch(2, pid=5, epoch=0, seq=2 * i), 0)
    assert len(log.segments) > 2
    assert log.truncate_to(9) == 8  # offset 9 is inside the batch 8-9: the whole batch goes
    assert log.log_end_offset == 8
    assert log.segments[-1].next_offset == 8
    # the producer's next sequence is the one after what is left
    with pytest.raises(ApiError):
        log.append(batch(2, pid=5, epoch=0, seq=20), 0)
    assert log.append(batch(2, pid=5, epoch=0, seq=8), 0).base_offset == 8
    reopened = PartitionLog.open(tmp_path / "t-0", LogConfig(segment_bytes=1024))
    assert reopened.log_end_offset == 10


def test_truncate_keeps_the_high_watermark_at_or_below_the_log_end(tmp_path):
    log = open_log(tmp_path)
    log.append(batch(5), 0)
    log.append(batch(5), 0)
    log.replicated_high_watermark = 10
    log.truncate_to(5)
    assert log.high_watermark == 5
    assert log.truncate_to(7) == 5  # never past the log end
