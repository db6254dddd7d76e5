"""Segment descriptors: the LRU of open segments, EMFILE, rolls that fail, merging compaction."""

from __future__ import annotations

import os
import resource
import shutil
from contextlib import contextmanager

import pytest

from shoal.errors import ApiError, ErrorCode
from shoal.log.compaction import compact, plan_groups
from shoal.log.partition_log import PartitionLog
from shoal.log.policy import LogConfig
from shoal.log.segment import MIN_OPEN_SEGMENTS, OpenSegments
from shoal.protocol.batch import build_batch, decode_records, validate_batches

from .helpers import batch


def open_fds(under) -> set[str]:
    """The files below ``under`` this process holds descriptors of (other descriptors of the
    test process, such as a Spark session's sockets in the same worker, come and go)."""
    out = set()
    for n in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{n}")
        except OSError:  # closed meanwhile
            continue
        if target.startswith(f"{under}/"):
            out.add(target)
    return out


def values(log: PartitionLog, offset: int = 0) -> list[tuple[int, bytes | None, bytes | None]]:
    out = []
    while offset < log.log_end_offset:
        data = log.read(offset, 1 << 20)
        for h in validate_batches(data):
            out += [(r.offset, r.key, r.value) for r in decode_records(data, h)]
            offset = h.next_offset
    return out


@contextmanager
def no_free_descriptors(spare: int = 0):
    """Lower the soft RLIMIT_NOFILE so that only ``spare`` more descriptors can be opened."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    probe = os.open(os.devnull, os.O_RDONLY)  # the lowest free descriptor number
    os.close(probe)
    resource.setrlimit(resource.RLIMIT_NOFILE, (probe + spare, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_lru_keeps_at_most_capacity_descriptors_and_reopens_on_demand(tmp_path):
    files = OpenSegments(capacity=MIN_OPEN_SEGMENTS)
    cfg = LogConfig(segment_bytes=1024, index_interval_bytes=256)
    logs = [PartitionLog.open(tmp_path / f"t-{i}", cfg, files=files) for i in range(12)]
    for round_ in range(6):
        for i, log in enumerate(logs):
            log.append(batch(2, key=b"%d" % i, value_size=300, ts=round_), round_)
    assert sum(len(log.segments) for log in logs) > 3 * MIN_OPEN_SEGMENTS
    assert len(files) == MIN_OPEN_SEGMENTS and files.evictions > 0
    assert len(open_fds(tmp_path)) <= MIN_OPEN_SEGMENTS  # index files hold no descriptor
    # every segment is readable after its descriptor was closed, and reading reopens it
    for i, log in enumerate(logs):
        got = values(log)
        assert [o for o, _, _ in got] == list(range(12))
        assert {k for _, k, _ in got} == {b"%d" % i}
    assert len(files) == MIN_OPEN_SEGMENTS
    # the most recently used segment stays open; the least recently used was closed
    first = logs[0].segments[0]
    assert logs[-1].segments[-1].is_open and not first.is_open
    logs[0].read(0, 1)
    assert first.is_open
    for log in logs:
        log.close()
    assert len(files) == 0 and open_fds(tmp_path) == set()
    # a restart reads the index files that sealing wrote, and serves everything
    again = [PartitionLog.open(tmp_path / f"t-{i}", cfg, files=files) for i in range(12)]
    assert all(len(values(log)) == 12 for log in again)
    assert len(files) <= MIN_OPEN_SEGMENTS
    for log in again:
        log.close()


def test_open_failing_with_emfile_closes_descriptors_and_goes_on(tmp_path):
    files = OpenSegments(capacity=1000)
    cfg = LogConfig(segment_bytes=1024)
    log = PartitionLog.open(tmp_path / "t-0", cfg, files=files)
    for i in range(40):
        log.append(batch(1, value_size=700, ts=i), i)
    for seg in log.segments:
        seg.close()
    for seg in log.segments[:30]:  # 30 descriptors open
        assert seg.fd >= 0
    assert len(files) == 30
    with no_free_descriptors(spare=0):
        assert [o for o, _, _ in values(log)] == list(range(40))  # reopens segments past EMFILE
    assert files.capacity < 30 and len(files) <= files.capacity
    log.close()


def test_new_partitions_created_with_no_descriptor_free_close_segment_descriptors(tmp_path):
    from shoal.config import BrokerConfig
    from shoal.log.store import LogStore

    files = OpenSegments(capacity=1000)
    store = LogStore(tmp_path, BrokerConfig(), files=files)
    store.create_topic("old", 30)
    assert len(files) == 30
    # every new partition opens its directory (to fsync it) and its segment: each of
    # those opens may be the one that finds no descriptor free
    with no_free_descriptors(spare=0):
        store.create_topic("new", 10)
    assert files.capacity < 30 and len(files) <= files.capacity
    store.close()
    store = LogStore(tmp_path, BrokerConfig(), files=files)
    assert store.get_topic("new").num_partitions == 10 and store.partition("new", 9).log_end_offset == 0
    store.close()


def test_a_roll_that_fails_fails_the_append_and_the_next_append_rolls(tmp_path):
    files = OpenSegments(capacity=64)
    cfg = LogConfig(segment_bytes=1024)
    log = PartitionLog.open(tmp_path / "t-0", cfg, files=files)
    log.append(batch(1, value_size=700), 0)
    for seg in log.segments:
        seg.close()
    assert log.segments[-1].fd >= 0  # only the active segment is open: nothing to evict
    with no_free_descriptors(spare=0):
        with pytest.raises(ApiError) as ei:
            log.append(batch(1, value_size=700), 1)
    assert ei.value.error_code == ErrorCode.kafka_storage_error
    assert log.log_end_offset == 1 and len(log.segments) == 1
    r = log.append(batch(1, value_size=700), 2)
    assert r.base_offset == 1 and len(log.segments) == 2
    log.close()
    again = PartitionLog.open(tmp_path / "t-0", cfg, files=files)
    assert [o for o, _, _ in values(again)] == [0, 1] and not again.recovered_truncation
    again.close()


def test_plan_groups_respects_segment_bytes_and_offset_span():
    segs = [(0, 10, 400), (10, 20, 400), (20, 30, 400), (30, 40, 2000), (40, 50, 10)]
    assert plan_groups(segs, max_bytes=1000) == [2, 1, 1, 1]
    assert plan_groups(segs, max_bytes=1200) == [3, 1, 1]
    assert plan_groups(segs, max_bytes=5000) == [5]
    assert plan_groups([(0, 2**31, 1), (2**31, 2**31 + 5, 1)], max_bytes=100) == [1, 1]
    assert plan_groups([], max_bytes=100) == []


def _compacted_log(tmp_path, files=None):
    cfg = LogConfig(segment_bytes=2048, cleanup_policy=("compact",), delete_retention_ms=0)
    log = PartitionLog.open(tmp_path / "c-0", cfg, files=files)
    latest = {}
    for i in range(400):
        key = b"k%d" % (i % 7)
        log.append(build_batch([(key, b"v%d" % i, [], 1000 + i)]), 0)
        latest[key] = (i, b"v%d" % i)
    return log, latest


def test_compaction_merges_small_segments_until_stable(tmp_path):
    log, latest = _compacted_log(tmp_path)
    many = len(log.segments)
    assert many > 10
    merged = 0
    for _ in range(10):
        stats = compact(log, now_ms=5000)
        merged += stats.segments_merged
        if stats.segments_rewritten == 0:
            break
    assert stats.segments_rewritten == 0  # stable
    assert merged > 0 and len(log.segments) <= 3
    assert all(s.size <= 2048 for s in log.segments)
    got = {k: (o, v) for o, k, v in values(log)}
    assert got == latest
    # segments stay contiguous and the directory holds exactly the listed segments
    assert all(a.next_offset == b.base_offset for a, b in zip(log.segments, log.segments[1:]))
    names = sorted(p.name for p in (tmp_path / "c-0").iterdir() if p.suffix == ".log")
    assert names == [f"{s.base_offset:020d}.log" for s in log.segments]
    # a pass with nothing new does nothing
    assert compact(log, now_ms=6000).segments_rewritten == 0
    leo = log.log_end_offset
    log.close()
    again = PartitionLog.open(tmp_path / "c-0", log.config)
    assert again.log_end_offset == leo and {k: (o, v) for o, k, v in values(again)} == latest
    again.close()


def test_a_crash_after_merging_before_deleting_the_merged_segments_loses_nothing(tmp_path):
    log, latest = _compacted_log(tmp_path)
    d = tmp_path / "c-0"
    saved = tmp_path / "saved"
    saved.mkdir()
    for p in d.iterdir():
        if p.suffix == ".log":
            shutil.copy(p, saved / p.name)
    bases = [s.base_offset for s in log.segments]
    compact(log, now_ms=5000)
    assert len(log.segments) < len(bases)
    log.close()
    # put back the segments the merge deleted, as if the process died before deleting them
    for p in saved.iterdir():
        if not (d / p.name).exists():
            shutil.copy(p, d / p.name)
    again = PartitionLog.open(d, log.config)
    assert not again.recovered_truncation
    assert {k: (o, v) for o, k, v in values(again)} == latest
    assert len(sorted(d.glob("*.log"))) == len(again.segments) < len(bases)
    again.close()


def test_a_pass_runs_only_once_the_dirty_part_reaches_min_cleanable_dirty_ratio(tmp_path):
    cfg = LogConfig(segment_bytes=2048, cleanup_policy=("compact",), min_cleanable_dirty_ratio=0.5)
    log = PartitionLog.open(tmp_path / "c-0", cfg)
    n = 0

    def write_until_closed(nbytes: int) -> None:
        nonlocal n
        start = sum(s.size for s in log.segments[:-1])
        while sum(s.size for s in log.segments[:-1]) - start < nbytes:
            log.append(build_batch([(b"key-%03d" % (n % 300), b"value-%d" % n, [], 1000 + n)]), 0)
            n += 1

    write_until_closed(40_000)
    first = compact(log, now_ms=5000)
    assert first.segments_rewritten > 0 and first.segments_merged > 0  # one pass cleans and merges
    assert compact(log, now_ms=5000).records_removed == 0  # nothing new: not due
    clean = sum(s.size for s in log.segments[:-1])
    assert clean > 4 * 2048
    write_until_closed(clean // 3)  # the dirty part stays below half of the closed bytes
    assert compact(log, now_ms=5000).segments_rewritten == 0
    write_until_closed(clean)
    assert compact(log, now_ms=5000).records_removed > 0
    log.close()


def test_indexes_of_unused_segments_leave_memory_and_are_read_back_on_demand(tmp_path):
    files = OpenSegments(capacity=MIN_OPEN_SEGMENTS)
    cfg = LogConfig(segment_bytes=2048, index_interval_bytes=200)
    log = PartitionLog.open(tmp_path / "t-0", cfg, files=files)
    for i in range(200):
        log.append(batch(1, value_size=300, ts=i), i)
    expected = values(log)
    closed = log.segments[:-1]
    assert len(closed) > 2 * MIN_OPEN_SEGMENTS
    # segments whose descriptor the LRU closed hold no index in memory either
    gone = [s for s in closed if not s.is_open]
    assert gone and not any(s.indexes_in_memory for s in gone)
    assert log.segments[-1].indexes_in_memory
    log.close()
    # after a restart the closed segments' indexes are read only when a segment is used
    log = PartitionLog.open(tmp_path / "t-0", cfg, files=files)
    assert not any(s.indexes_in_memory for s in log.segments[:-1])
    seg = log.segments[3]
    mid = bytearray(seg.index_path.read_bytes())
    mid[8:16] = b"\xff" * 8  # tear an entry between the first and the last
    seg.index_path.write_bytes(bytes(mid))
    assert values(log) == expected  # the torn index is rebuilt from the log when needed
    assert [o for o, _, _ in values(log, 150)] == list(range(150, 200))
    assert log.offset_for_timestamp(120) == (120, 120)
    log.close()
