"""PartitionLog: append, read, roll, restart, flush, timestamps, delete_records, retention."""

from __future__ import annotations

import os

import pytest

from shoal.errors import ApiError, ErrorCode
from shoal.log.partition_log import PartitionLog
from shoal.log.policy import LogConfig
from shoal.protocol.batch import TimestampType, decode_records, validate_batches

from .helpers import batch


def open_log(path, **kw) -> PartitionLog:
    return PartitionLog.open(path / "t-0", LogConfig(**kw))


def offsets_of(data) -> list[int]:
    return [r.offset for h in validate_batches(data) for r in decode_records(data, h)]


def test_append_assigns_offsets_and_read_returns_whole_batches(tmp_path):
    log = open_log(tmp_path)
    r1 = log.append(batch(3), 10)
    r2 = log.append(batch(2) + batch(4), 11)
    assert (r1.base_offset, r1.last_offset, r1.record_count, r1.durable) == (0, 2, 3, True)
    assert (r2.base_offset, r2.last_offset, r2.record_count) == (3, 8, 6)
    assert log.log_end_offset == log.high_watermark == 9
    assert offsets_of(log.read(0, 1 << 20)) == list(range(9))
    assert [h.base_offset for h in validate_batches(log.read(4, 1 << 20))] == [3, 5]
    assert log.read(9, 100) == b""
    with pytest.raises(ApiError) as ei:
        log.read(10, 100)
    assert ei.value.error_code == ErrorCode.offset_out_of_range


def test_read_at_least_one_batch_and_max_bytes(tmp_path):
    log = open_log(tmp_path)
    for _ in range(5):
        log.append(batch(2, value_size=500), 0)
    one = log.read(0, 10)
    assert len(validate_batches(one)) == 1
    two = log.read(0, 2 * len(one) + 5)
    assert len(validate_batches(two)) == 2
    # sequential reads continue where the last one ended
    assert validate_batches(log.read(4, 10))[0].base_offset == 4


def test_bad_request_writes_nothing(tmp_path):
    log = open_log(tmp_path)
    log.append(batch(1), 0)
    bad = bytearray(batch(2))
    bad[-1] ^= 1
    with pytest.raises(ApiError) as ei:
        log.append(batch(1) + bytes(bad), 0)
    assert ei.value.error_code == ErrorCode.corrupt_message
    assert log.log_end_offset == 1 and log.size_bytes == len(batch(1))


def test_crc_checked_appends_skip_only_the_crc(tmp_path):
    """Produce checks the CRC while validating records and says so: the append does not
    compute it again, but still reads the framing."""
    log = open_log(tmp_path)
    bad = bytearray(batch(2))
    bad[-1] ^= 1
    assert log.append(bytes(bad), 0, crc_checked=True).record_count == 2
    with pytest.raises(ApiError) as ei:
        log.append(bytes(bad), 0)
    assert ei.value.error_code == ErrorCode.corrupt_message
    with pytest.raises(ApiError) as ei:
        log.append(batch(2)[:-1], 0, crc_checked=True)
    assert ei.value.error_code == ErrorCode.corrupt_message
    assert log.log_end_offset == 2


def test_size_limits(tmp_path):
    log = open_log(tmp_path, max_message_bytes=1000, segment_bytes=3000)
    with pytest.raises(ApiError) as ei:
        log.append(batch(1, value_size=2000), 0)
    assert ei.value.error_code == ErrorCode.message_too_large
    with pytest.raises(ApiError) as ei:
        log.append(b"".join(batch(1, value_size=700) for _ in range(5)), 0)
    assert ei.value.error_code == ErrorCode.record_list_too_large
    assert log.log_end_offset == 0


def test_roll_by_size_and_time_and_restart(tmp_path):
    log = open_log(tmp_path, segment_bytes=2048, segment_ms=1000, index_interval_bytes=256)
    for i in range(20):
        log.append(batch(2, value_size=200, ts=i), now_ms=0)
    assert len(log.segments) > 3
    n = len(log.segments)
    log.append(batch(1, ts=5000), now_ms=5000)  # first timestamp 0 of the active segment is old
    assert len(log.segments) == n + 1
    names = sorted(os.listdir(tmp_path / "t-0"))
    assert "00000000000000000000.log" in names and "00000000000000000000.index" in names
    all_bytes = log.read(0, 1 << 30)
    per_seg = [log.read(s.base_offset, 1 << 30) for s in log.segments]
    leo = log.log_end_offset
    log.close()
    log = open_log(tmp_path, segment_bytes=2048, segment_ms=1000, index_interval_bytes=256)
    assert log.log_end_offset == leo and not log.recovered_truncation
    assert log.read(0, 1 << 30) == all_bytes
    assert [log.read(s.base_offset, 1 << 30) for s in log.segments] == per_seg
    for off in range(leo):
        h = validate_batches(log.read(off, 1))[0]
        assert h.base_offset <= off <= h.last_offset
    r = log.append(batch(1), 0)
    assert r.base_offset == leo


def test_a_new_log_creates_only_its_segment_file_and_indexes_on_roll(tmp_path):
    log = open_log(tmp_path, segment_bytes=2048, index_interval_bytes=256)
    assert sorted(os.listdir(tmp_path / "t-0")) == ["00000000000000000000.log"]
    log.close()
    log = open_log(tmp_path, segment_bytes=2048, index_interval_bytes=256)  # an empty log reopens as it was
    assert log.log_end_offset == 0 and sorted(os.listdir(tmp_path / "t-0")) == ["00000000000000000000.log"]
    while len(log.segments) == 1:
        log.append(batch(2, value_size=200), 0)
    names = sorted(os.listdir(tmp_path / "t-0"))
    # the sealed segment's indexes are on disk; the new active one has only its log file so far
    assert {"00000000000000000000.index", "00000000000000000000.timeindex"} <= set(names)
    active = log.segments[-1].log_path.name
    assert [n for n in names if n.startswith(active[:20])] == [active]
    leo, data = log.log_end_offset, log.read(0, 1 << 30)
    log.close()
    log = open_log(tmp_path, segment_bytes=2048, index_interval_bytes=256)
    assert log.log_end_offset == leo and log.read(0, 1 << 30) == data
    assert validate_batches(log.read(leo - 1, 1))[0].last_offset == leo - 1
    log.close()


def test_restart_without_index_files_rebuilds_them(tmp_path):
    log = open_log(tmp_path, segment_bytes=2048, index_interval_bytes=100)
    for i in range(20):
        log.append(batch(2, value_size=200), 0)
    data = log.read(0, 1 << 30)
    log.close()
    for p in (tmp_path / "t-0").glob("*.index"):
        p.write_bytes(b"\x00\x01\x02")
    for p in (tmp_path / "t-0").glob("*.timeindex"):
        p.unlink()
    log = open_log(tmp_path, segment_bytes=2048, index_interval_bytes=100)
    assert log.read(0, 1 << 30) == data and log.log_end_offset == 40
    assert validate_batches(log.read(33, 1))[0].base_offset == 32


def test_flush_policy(tmp_path):
    log = open_log(tmp_path, flush_messages=5, flush_ms=1000)
    assert not log.append(batch(2), 0).durable
    assert log.unflushed_messages == 2
    assert not log.needs_flush(500) and log.needs_flush(1000)
    assert log.append(batch(3), 10).durable
    assert log.unflushed_messages == 0
    log.append(batch(1), 20)
    log.flush(30)
    assert log.unflushed_messages == 0


def test_log_append_time(tmp_path):
    log = open_log(tmp_path, log_append_time=True)
    r = log.append(batch(3, ts=5), 777)
    assert r.log_append_time_ms == 777
    (h,) = validate_batches(log.read(0, 1 << 20))
    assert h.timestamp_type == TimestampType.LOG_APPEND_TIME and h.max_timestamp == 777
    r = log.append(batch(1, ts=5), 778, timestamp_type=TimestampType.CREATE_TIME)
    assert r.log_append_time_ms == -1


def test_offset_for_timestamp_and_max_timestamp(tmp_path):
    log = open_log(tmp_path, segment_bytes=2048, index_interval_bytes=128)
    for i in range(30):
        log.append(batch(2, value_size=150, ts=1000 + 10 * i), 0)  # record ts 1000+10i, 1001+10i
    assert log.offset_for_timestamp(0) == (0, 1000)
    assert log.offset_for_timestamp(1001) == (1, 1001)
    assert log.offset_for_timestamp(1002) == (2, 1010)
    assert log.offset_for_timestamp(1155) == (32, 1160)
    assert log.offset_for_timestamp(1292) is None
    assert log.max_timestamp() == (59, 1291)
    log.append(batch(1, ts=50), 0)
    assert log.max_timestamp() == (59, 1291)


def test_delete_records_and_checkpoint(tmp_path):
    log = open_log(tmp_path, segment_bytes=2048)
    for _ in range(20):
        log.append(batch(2, value_size=200), 0)
    nseg = len(log.segments)
    assert log.delete_records(15) == 15
    assert log.log_start_offset == 15 and len(log.segments) < nseg
    assert log.delete_records(3) == 15  # never lowered
    with pytest.raises(ApiError) as ei:
        log.read(14, 100)
    assert ei.value.error_code == ErrorCode.offset_out_of_range
    assert validate_batches(log.read(15, 1))[0].base_offset == 14
    with pytest.raises(ApiError):
        log.delete_records(41)
    log.close()
    log = open_log(tmp_path, segment_bytes=2048)
    assert log.log_start_offset == 15
    assert log.delete_records(-1) == 40 and log.read(40, 10) == b""
    assert log.offset_for_timestamp(0) is None


def test_retention_by_size_and_time(tmp_path):
    log = open_log(tmp_path, segment_bytes=2048, retention_bytes=5000, retention_ms=-1)
    for _ in range(30):
        log.append(batch(2, value_size=200, ts=100), 0)
    assert log.apply_retention(0) > 0
    assert log.size_bytes - log.segments[0].size < 5000
    assert log.log_start_offset == log.segments[0].base_offset
    log.update_config(LogConfig(segment_bytes=2048, retention_ms=1000))
    log.append(batch(1, ts=10_000), 10_000)
    log.apply_retention(10_000)
    assert len(log.segments) == 1  # only the active one stays
    assert log.log_start_offset == log.segments[0].base_offset
    assert log.read(log.log_start_offset, 1 << 20)


def test_deferred_flush_with_a_ticket(tmp_path):
    log = open_log(tmp_path, flush_messages=1)
    r = log.append(batch(3), 0, defer_flush=True)
    assert not r.durable and log.flush_due(0)
    fds = set(os.listdir("/proc/self/fd"))
    ticket = log.begin_flush()
    assert set(os.listdir("/proc/self/fd")) == fds  # a waiting ticket holds no descriptor
    assert ticket.end_offset == 3 and ticket.messages == 3
    log.append(batch(2), 1, defer_flush=True)  # arrives while the fsync runs
    log.roll()  # rolling meanwhile must not invalidate the ticket
    fds = set(os.listdir("/proc/self/fd"))
    ticket.sync()
    log.end_flush(ticket, 2)
    assert log.unflushed_messages == 2 and log.flush_due(2)
    assert set(os.listdir("/proc/self/fd")) == fds  # nor does one that synced


def _fail_writes_to(monkeypatch, fd_of, err=28):
    """os.write to the descriptor ``fd_of()`` returns fails with ``err`` (ENOSPC by default)."""
    real = os.write

    def write(fd, data):
        if fd == fd_of():
            raise OSError(err, os.strerror(err))
        return real(fd, data)

    monkeypatch.setattr(os, "write", write)


def test_a_refused_write_takes_the_whole_append_back(tmp_path, monkeypatch):
    # an append writes only the log file: the indexes grow in memory, their files are
    # written when the segment is sealed
    log = open_log(tmp_path, index_interval_bytes=1)  # an index entry per batch
    log.append(batch(3), 0)
    seg = log.segments[-1]
    before = (seg.size, seg.next_offset, list(seg.offset_index.keys))
    _fail_writes_to(monkeypatch, lambda: seg.fd)
    with pytest.raises(ApiError) as ei:
        log.append(batch(2, pid=7, epoch=0, seq=0), 0)
    assert ei.value.error_code == ErrorCode.kafka_storage_error
    assert "No space left on device" in ei.value.message
    assert (seg.size, seg.next_offset, list(seg.offset_index.keys)) == before
    assert os.fstat(seg.fd).st_size == before[0]
    monkeypatch.undo()
    # Space is back: the same idempotent batch is appended, not taken for a duplicate.
    r = log.append(batch(2, pid=7, epoch=0, seq=0), 0)
    assert (r.base_offset, r.duplicate) == (3, False)
    log.close()
    log = open_log(tmp_path)
    assert offsets_of(log.read(0, 1 << 20)) == [0, 1, 2, 3, 4]
    log.close()


def test_a_segment_that_cannot_be_created_leaves_the_old_one_active(tmp_path, monkeypatch):
    import errno

    from shoal.log import partition_log

    log = open_log(tmp_path, segment_bytes=400)
    log.append(batch(1), 0)
    real = partition_log.Segment

    def no_descriptors(*a, **kw):
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(partition_log, "Segment", no_descriptors)
    with pytest.raises(ApiError) as ei:
        log.append(batch(2), 0)  # needs a roll
    assert ei.value.error_code == ErrorCode.kafka_storage_error
    assert len(log.segments) == 1 and log.log_end_offset == 1
    monkeypatch.setattr(partition_log, "Segment", real)
    assert log.append(batch(2), 0).base_offset == 1
    assert len(log.segments) == 2
    log.close()


def test_close_on_a_full_disk_still_closes_and_the_log_reopens(tmp_path, monkeypatch):
    log = open_log(tmp_path)
    log.append(batch(2), 0)
    seg = log.segments[-1]
    real = os.open

    def no_space(path, *a, **kw):  # the recovery-point checkpoint cannot be created
        if str(path).endswith(".tmp"):
            raise OSError(28, "No space left on device")
        return real(path, *a, **kw)

    monkeypatch.setattr(os, "open", no_space)
    fd = seg.fd
    log.close()  # the data was fsynced; only the checkpoint is skipped
    monkeypatch.undo()
    with pytest.raises(OSError):
        os.fstat(fd)
    log = open_log(tmp_path)
    assert offsets_of(log.read(0, 1 << 20)) == [0, 1]
    log.close()


def _no_space(path, data):
    raise OSError(28, "No space left on device")


def test_delete_records_on_a_full_disk_changes_nothing(tmp_path, monkeypatch):
    from shoal.log import partition_log

    log = open_log(tmp_path)
    log.append(batch(5), 0)
    monkeypatch.setattr(partition_log, "atomic_write", _no_space)
    with pytest.raises(ApiError) as ei:
        log.delete_records(3)
    assert ei.value.error_code == ErrorCode.kafka_storage_error
    assert log.log_start_offset == 0
    monkeypatch.undo()
    assert log.delete_records(3) == 3
    log.close()


def test_retention_frees_space_even_when_its_checkpoint_cannot_be_written(tmp_path, monkeypatch):
    from shoal.log import partition_log

    log = open_log(tmp_path, segment_bytes=200, retention_bytes=1)
    for _ in range(4):
        log.append(batch(1), 0)
    assert len(log.segments) == 4
    monkeypatch.setattr(partition_log, "atomic_write", _no_space)
    assert log.apply_retention(0) > 0
    start = log.log_start_offset
    assert start == log.segments[0].base_offset > 0
    monkeypatch.undo()
    log.close()
    log = open_log(tmp_path)
    assert log.log_start_offset == start
    log.close()


def test_a_failed_fsync_on_flush_takes_the_log_offline(tmp_path, monkeypatch):
    from shoal.errors import FsyncError

    log = open_log(tmp_path)
    log.append(batch(2), 0, defer_flush=True)

    def eio(fd):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fdatasync", eio)
    with pytest.raises(FsyncError):
        log.flush(0)
    monkeypatch.undo()
    with pytest.raises(ApiError) as ei:
        log.append(batch(1), 0)
    assert ei.value.error_code == ErrorCode.kafka_storage_error
    assert log.log_end_offset == 2
    log.close()


def test_atomic_write_continues_a_short_write_and_never_renames_a_partial_file(tmp_path, monkeypatch):
    from shoal.log.partition_log import atomic_write

    target = tmp_path / "topics.json"
    atomic_write(target, b"old")
    real = os.write
    room = {"left": 5}

    def nearly_full(fd, data):  # as a file system with 5 bytes left answers
        if room["left"] <= 0:
            raise OSError(28, "No space left on device")
        n = min(len(data), room["left"])
        room["left"] -= n
        return real(fd, bytes(data[:n]))

    monkeypatch.setattr(os, "write", nearly_full)
    with pytest.raises(OSError, match="cannot write .*topics.json"):
        atomic_write(target, b"0123456789")
    monkeypatch.undo()
    assert target.read_bytes() == b"old"
    assert not (tmp_path / "topics.json.tmp").exists()

    def short(fd, data):  # at most 3 bytes a call, as a busy file system may answer
        return real(fd, bytes(data[:3]))

    monkeypatch.setattr(os, "write", short)
    atomic_write(target, b"0123456789")  # short writes that go on are fine
    monkeypatch.undo()
    assert target.read_bytes() == b"0123456789"
