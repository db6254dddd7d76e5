"""Opening a damaged log: only the damaged bytes are lost, later segments are never deleted,
the damage is logged, and reads never serve corrupt bytes."""

from __future__ import annotations

import logging
import os

import pytest

from shoal.errors import ApiError, ErrorCode
from shoal.log.partition_log import LOG_START_FILE, RECOVERY_POINT_FILE, PartitionLog
from shoal.log.policy import LogConfig
from shoal.protocol.batch import read_header

from .helpers import batch

CFG = {"segment_bytes": 4096, "index_interval_bytes": 512}


def open_log(path, **kw) -> PartitionLog:
    return PartitionLog.open(path / "t-0", LogConfig(**{**CFG, **kw}))


def written_log(tmp_path, n: int = 60, *, close: bool = True, pid: int = -1) -> tuple[list[tuple[int, int, bytes]], int]:
    """A log of ``n`` batches of 3 records over several segments; returns each batch as
    (segment base, position, bytes) and the log end offset."""
    log = open_log(tmp_path)
    for i in range(n):
        log.append(batch(3, value_size=150, pid=pid, epoch=0 if pid >= 0 else -1, seq=3 * i if pid >= 0 else -1), 0)
    assert len(log.segments) >= 5
    out = [(s.base_offset, h.position, s.read_at(h.position, h.size)) for s in log.segments for h in s.batch_headers()]
    leo = log.log_end_offset
    if close:
        log.close()
    return out, leo


def read_everything(log: PartitionLog) -> list[bytes]:
    got, offset = [], log.log_start_offset
    while True:
        data = log.read(offset, 1)
        if not data:
            return got
        got.append(bytes(data))
        offset = read_header(data).next_offset


def seg_file(tmp_path, base: int) -> str:
    return str(tmp_path / "t-0" / f"{base:020d}.log")


def bases(written) -> list[int]:
    return sorted({b for b, _, _ in written})


def test_a_missing_middle_segment_keeps_every_later_segment(tmp_path, caplog):
    written, leo = written_log(tmp_path)
    gone = bases(written)[2]
    os.unlink(seg_file(tmp_path, gone))
    with caplog.at_level(logging.WARNING, "shoal.log"):
        log = open_log(tmp_path)
    expected = [d for b, _, d in written if b != gone]
    assert read_everything(log) == expected
    assert log.log_end_offset == leo
    nxt = bases(written)[3]
    assert log.missing_offsets == [(gone, nxt)]
    assert f"offsets {gone}-{nxt - 1} ({nxt - gone}) are missing" in caplog.text
    # a read inside the gap gets the first batch after it, as for compacted offsets
    assert read_header(log.read(gone + 1, 1)).base_offset == nxt
    assert log.append(batch(1), 0).base_offset == leo


def test_a_closed_segment_cut_short_loses_only_its_cut_batches(tmp_path, caplog):
    written, leo = written_log(tmp_path)
    victim, after = bases(written)[1], bases(written)[2]
    path = seg_file(tmp_path, victim)
    size = os.path.getsize(path)
    os.truncate(path, size - 1000)
    with caplog.at_level(logging.WARNING, "shoal.log"):
        log = open_log(tmp_path)
    expected = [d for b, p, d in written if not (b == victim and p + len(d) > size - 1000)]
    assert read_everything(log) == expected
    assert log.log_end_offset == leo
    kept = [d for b, p, d in written if b == victim and p + len(d) <= size - 1000]
    first_lost = read_header(kept[-1]).next_offset
    assert log.missing_offsets == [(first_lost, after)]
    record = next(r for r in caplog.records if "is damaged" in r.getMessage())
    assert record.levelno == logging.ERROR
    msg = record.getMessage()
    assert f"segment {victim} is damaged" in msg and f"offsets {first_lost}-{after - 1} ({after - first_lost})" in msg
    cut = (size - 1000) - sum(len(d) for d in kept)
    assert f"its last {cut} bytes" in msg
    assert log.append(batch(1), 0).base_offset == leo


def test_garbage_recovery_point_and_a_flip_in_segment_two_lose_one_batch(tmp_path, caplog):
    written, leo = written_log(tmp_path, close=False)  # a crash: the recovery point is the active base
    (tmp_path / "t-0" / RECOVERY_POINT_FILE).write_bytes(b"\x00\xffnot an offset\x13")
    victim = bases(written)[1]
    in_victim = [(p, d) for b, p, d in written if b == victim]
    hit_pos, hit = in_victim[len(in_victim) // 2]
    with open(seg_file(tmp_path, victim), "r+b") as f:
        f.seek(hit_pos + 80)
        f.write(b"\xde\xad\xbe\xef")
    with caplog.at_level(logging.WARNING, "shoal.log"):
        log = open_log(tmp_path)
    assert read_everything(log) == [d for _, _, d in written if d is not hit]
    assert log.log_end_offset == leo
    h = read_header(hit)
    assert log.missing_offsets == [(h.base_offset, h.next_offset)]
    assert "recovery-point file holds" in caplog.text and "validating every segment" in caplog.text
    msg = next(r.getMessage() for r in caplog.records if "is damaged" in r.getMessage())
    assert f"segment {victim} is damaged at byte {hit_pos}" in msg and "CRC-32C mismatch" in msg
    assert f"{len(hit)} bytes holding offsets {h.base_offset}-{h.last_offset} (3)" in msg
    # the batches after the damage were moved to a segment of their own
    assert h.next_offset in [s.base_offset for s in log.segments]
    log.append(batch(1), 0)
    log.close()
    caplog.clear()
    again = open_log(tmp_path)
    assert again.log_end_offset == leo + 1 and not again.recovered_truncation
    assert read_everything(again)[:-1] == [d for _, _, d in written if d is not hit]


def test_a_damaged_length_field_is_skipped_by_a_byte_scan(tmp_path):
    written, leo = written_log(tmp_path)
    (tmp_path / "t-0" / RECOVERY_POINT_FILE).unlink()
    victim = bases(written)[2]
    hit_pos, hit = [(p, d) for b, p, d in written if b == victim][1]
    with open(seg_file(tmp_path, victim), "r+b") as f:
        f.seek(hit_pos + 8)
        f.write(b"\x7f\x00\x00\x00")  # a batch length far beyond the file
    log = open_log(tmp_path)
    assert read_everything(log) == [d for _, _, d in written if d is not hit]
    assert log.log_end_offset == leo


def test_a_torn_write_at_the_end_of_the_active_segment_is_cut_as_kafka_cuts_it(tmp_path, caplog):
    written, _ = written_log(tmp_path, close=False)
    last = bases(written)[-1]
    path = seg_file(tmp_path, last)
    os.truncate(path, os.path.getsize(path) - 10)
    with caplog.at_level(logging.WARNING, "shoal.log"):
        log = open_log(tmp_path)
    assert read_everything(log) == [d for _, _, d in written[:-1]]
    torn = read_header(written[-1][2])
    assert log.log_end_offset == torn.base_offset
    assert log.missing_offsets == [(torn.base_offset, -1)]
    assert any(r.levelno == logging.WARNING and "a write the crash tore" in r.getMessage() for r in caplog.records)
    assert log.append(batch(1), 0).base_offset == torn.base_offset


def test_a_flip_below_the_recovery_point_is_answered_corrupt_message_and_logged_once(tmp_path, caplog):
    written, _ = written_log(tmp_path)  # closed cleanly: start-up validates the active segment only
    victim = bases(written)[1]
    hit_pos, hit = [(p, d) for b, p, d in written if b == victim][2]
    with open(seg_file(tmp_path, victim), "r+b") as f:
        f.seek(hit_pos + 100)
        f.write(b"\x01\x02\x03\x04")
    log = open_log(tmp_path)
    assert not log.recovered_truncation
    h = read_header(hit)
    with caplog.at_level(logging.ERROR, "shoal.log"):
        for _ in range(3):
            for off in (h.base_offset, h.last_offset):
                with pytest.raises(ApiError) as e:
                    log.read(off, 1 << 20)
                assert e.value.error_code == ErrorCode.corrupt_message
    logged = [r for r in caplog.records if "corrupt bytes in segment" in r.getMessage()]
    assert len(logged) == 1 and logged[0].levelno == logging.ERROR
    assert f"offsets {h.base_offset}-{h.last_offset} (3)" in logged[0].getMessage()
    # a read from before stops short of the damage; one after it is served
    before = log.read(written[0][0], 1 << 30)
    assert hit not in bytes(before)
    assert bytes(log.read(h.next_offset, 1)) == next(d for _, _, d in written if read_header(d).base_offset == h.next_offset)
    # everything but the damaged batch is served, with reads that step over it
    got, offset = [], 0
    while offset < log.log_end_offset:
        try:
            data = log.read(offset, 1)
        except ApiError:
            offset += 1
            continue
        got.append(bytes(data))
        offset = read_header(data).next_offset
    assert got == [d for _, _, d in written if d is not hit]


def test_a_damaged_length_below_the_recovery_point_hides_only_its_batch(tmp_path):
    written, _ = written_log(tmp_path)
    victim = bases(written)[1]
    batches = [(p, d) for b, p, d in written if b == victim]
    hit_pos, hit = batches[1]
    with open(seg_file(tmp_path, victim), "r+b") as f:
        f.seek(hit_pos + 8)  # a plausible length that leads a look-up into the middle of a later batch
        f.write((len(hit) + len(batches[2][1]) // 2 - 12).to_bytes(4, "big"))
    log = open_log(tmp_path)
    h = read_header(hit)
    for _, d in batches[2:]:
        assert bytes(log.read(read_header(d).base_offset, 1)) == d
    with pytest.raises(ApiError):
        log.read(h.base_offset, 1)


def test_garbage_or_impossible_log_start_checkpoints_never_delete(tmp_path, caplog):
    written, leo = written_log(tmp_path)
    ckpt = tmp_path / "t-0" / LOG_START_FILE
    ckpt.write_text(str(leo + 1000))
    with caplog.at_level(logging.WARNING, "shoal.log"):
        log = open_log(tmp_path)
    assert log.log_start_offset == 0 and read_everything(log) == [d for _, _, d in written]
    assert "beyond the log end offset" in caplog.text
    log.apply_retention(0)
    assert read_everything(log) == [d for _, _, d in written]
    log.close()
    ckpt.write_bytes(b"\xff\xfe")
    caplog.clear()
    with caplog.at_level(logging.WARNING, "shoal.log"):
        log = open_log(tmp_path)
    assert log.log_start_offset == 0 and read_everything(log) == [d for _, _, d in written]
    assert "log-start-offset file holds" in caplog.text


def test_producer_state_and_offsets_after_a_gap(tmp_path):
    written, leo = written_log(tmp_path, pid=7)
    os.unlink(seg_file(tmp_path, bases(written)[1]))
    log = open_log(tmp_path)
    last = read_header(written[-1][2])
    # the producer continues after its last surviving sequence; a retry of it is a duplicate
    dup = log.append(batch(3, pid=7, epoch=0, seq=last.base_sequence), 0)
    assert dup.duplicate and dup.base_offset == last.base_offset
    r = log.append(batch(3, pid=7, epoch=0, seq=last.base_sequence + 3), 0)
    assert r.base_offset == leo and log.log_end_offset == leo + 3 == log.high_watermark


def test_an_overlapping_segment_is_set_aside_not_deleted(tmp_path, caplog):
    written, leo = written_log(tmp_path)
    # the same batches cut into segments elsewhere: one of those starts inside a segment of
    # this log and ends inside the next one
    other = PartitionLog.open(tmp_path / "o-0", LogConfig(segment_bytes=2900, index_interval_bytes=512))
    for _, _, d in written:
        other.append(d, 0)
    ours = bases(written)
    stray = next(s for s in other.segments[:-1]
                 if s.base_offset not in ours and any(s.base_offset < b < s.next_offset for b in ours))
    other.close()
    name = f"{stray.base_offset:020d}.log"
    os.link(tmp_path / "o-0" / name, tmp_path / "t-0" / name)
    with caplog.at_level(logging.ERROR, "shoal.log"):
        log = open_log(tmp_path)
    assert os.path.exists(tmp_path / "t-0" / (name + ".overlapping"))
    assert "overlaps segment" in caplog.text
    assert read_everything(log) == [d for _, _, d in written]
    assert log.log_end_offset == leo and [s.base_offset for s in log.segments] == ours


def test_leader_epochs_past_a_log_end_cut_at_start_are_dropped(tmp_path):
    """A follower's last batch, the first of a new leader epoch, was torn: the epoch's entry
    must not outlive it, or the broker as leader would tell followers an older epoch ended
    past its own log end."""
    from shoal.cluster.replica_manager import EPOCH_FILE, Replica

    written, _ = written_log(tmp_path, close=False)
    last = bases(written)[-1]
    path = seg_file(tmp_path, last)
    torn = read_header(written[-1][2])
    (tmp_path / "t-0" / EPOCH_FILE).write_text(f"0\n3\n3 0\n4 {torn.base_offset}\n5 {torn.next_offset}\n")
    os.truncate(path, os.path.getsize(path) - 5)
    log = open_log(tmp_path)
    assert log.log_end_offset == torn.base_offset
    replica = Replica("t", 0, log)
    # an epoch that starts at the log end may have written nothing yet; one past it cannot hold
    assert replica.epochs.entries == [(3, 0), (4, torn.base_offset)]


def test_a_damaged_leader_epoch_checkpoint_is_rebuilt_from_the_batches(tmp_path, caplog):
    from shoal.cluster.replica_manager import EPOCH_FILE, Replica

    log = open_log(tmp_path)
    for epoch in (2, 2, 5, 5, 7):
        log.append(batch(2), 0, leader_epoch=epoch)
    log.close()
    (tmp_path / "t-0" / EPOCH_FILE).write_bytes(b"\x00garbage")
    log = open_log(tmp_path)
    with caplog.at_level(logging.WARNING, "shoal.cluster"):
        replica = Replica("t", 0, log)
    assert replica.epochs.entries == [(2, 0), (5, 4), (7, 8)]
    assert "does not hold leader epochs" in caplog.text


def test_damage_in_the_active_segment_below_the_recovery_point_loses_only_its_batch(tmp_path, caplog):
    """A recovery point at the log end (what a close writes when the one on disk was below
    the active segment) says the active segment's bytes were all fsynced: a flipped byte in
    them is damage, not a torn write."""
    written, leo = written_log(tmp_path)
    (tmp_path / "t-0" / RECOVERY_POINT_FILE).write_text(str(leo))
    last = bases(written)[-1]
    in_last = [(p, d) for b, p, d in written if b == last]
    assert len(in_last) >= 3
    hit_pos, hit = in_last[1]
    with open(seg_file(tmp_path, last), "r+b") as f:
        f.seek(hit_pos + 90)
        f.write(b"\xff\xff")
    with caplog.at_level(logging.WARNING, "shoal.log"):
        log = open_log(tmp_path)
    assert read_everything(log) == [d for _, _, d in written if d is not hit]
    assert log.log_end_offset == leo
    h = read_header(hit)
    assert log.missing_offsets == [(h.base_offset, h.next_offset)]
    assert f"segment {last} is damaged at byte {hit_pos}" in caplog.text
    assert log.append(batch(1), 0).base_offset == leo


def test_a_damaged_last_header_below_the_recovery_point_does_not_swallow_the_next_segments(tmp_path):
    """The start-up check trusts the last batch header of a segment below the recovery point;
    one whose offset delta was damaged makes the segment look as if it held the next ones,
    which must not then be taken for compaction leftovers and deleted."""
    written, leo = written_log(tmp_path)  # closed cleanly
    victim = bases(written)[1]
    hit_pos, hit = [(p, d) for b, p, d in written if b == victim][-1]
    with open(seg_file(tmp_path, victim), "r+b") as f:
        f.seek(hit_pos + 23)  # last_offset_delta
        f.write((10_000).to_bytes(4, "big"))
    log = open_log(tmp_path)
    assert read_everything(log) == [d for _, _, d in written if d is not hit]
    assert log.log_end_offset == leo
    assert all(os.path.exists(seg_file(tmp_path, b)) for b in bases(written))
