"""Compaction keeps the latest record per key, at its original offset, and ages out tombstones."""

from __future__ import annotations

from shoal.log.compaction import compact
from shoal.log.partition_log import PartitionLog
from shoal.log.policy import LogConfig, SegmentSummary, keep_record, plan_compaction
from shoal.protocol.batch import Compression, build_batch, decode_records, validate_batches

CFG = dict(segment_bytes=1024, cleanup_policy=("compact",), delete_retention_ms=1000)


def records(log: PartitionLog) -> list[tuple[int, bytes | None, bytes | None]]:
    out = []
    for seg in log.segments:
        data = log.read(seg.base_offset, 1 << 30) if seg.size else b""
        for h in validate_batches(data) if data else []:
            out += [(r.offset, r.key, r.value) for r in decode_records(data, h)]
    return sorted(set(out))


def test_keep_record_rules():
    latest = {b"a": 5}
    kw = dict(latest=latest, now_ms=10_000, delete_retention_ms=1000)
    assert keep_record(key=b"a", offset=5, is_tombstone=False, timestamp=0, **kw)
    assert not keep_record(key=b"a", offset=4, is_tombstone=False, timestamp=0, **kw)
    assert keep_record(key=None, offset=1, is_tombstone=False, timestamp=0, **kw)
    assert keep_record(key=b"a", offset=5, is_tombstone=True, timestamp=9500, **kw)
    assert not keep_record(key=b"a", offset=5, is_tombstone=True, timestamp=8000, **kw)


def test_plan_compaction_never_touches_active_and_respects_lag():
    segs = [SegmentSummary(0, 10, 100, 1000), SegmentSummary(10, 20, 100, 5000), SegmentSummary(20, 25, 50, 6000)]
    assert plan_compaction(segs, now_ms=10_000, min_compaction_lag_ms=0) == 2
    assert plan_compaction(segs, now_ms=6000, min_compaction_lag_ms=2000) == 1


def test_compaction_pass(tmp_path):
    log = PartitionLog.open(tmp_path / "c-0", LogConfig(**CFG))
    log.append(build_batch([(b"dead", b"alive", [], 1000), (b"dead", None, [], 1001)]), 0)  # offsets 0, 1
    expected = {}
    for i in range(60):
        key = b"k%d" % (i % 5)
        log.append(build_batch([(key, b"v%d" % i, [], 1000 + i)]), 0)
        expected[key] = (i + 2, b"v%d" % i)
    log.append(build_batch([(None, b"nokey", [], 2000), (b"k0", b"last", [], 2000)],
                           compression=Compression.GZIP), 0)
    expected[b"k0"] = (63, b"last")
    expected[b"dead"] = (1, None)
    leo = log.log_end_offset
    before = log.size_bytes
    stats = compact(log, now_ms=1500)  # the tombstone (ts 1001) is younger than 1000 ms: kept
    assert stats.segments_rewritten > 0 and stats.records_removed > 0 and log.size_bytes < before
    assert log.log_end_offset == leo
    got = records(log)
    assert {k: (o, v) for o, k, v in got if k is not None} == expected
    assert (62, None, b"nokey") in got
    # closed segments hold only the latest record of each key
    active = log.segments[-1].base_offset
    closed_keys = [k for o, k, _ in got if o < active and k is not None]
    assert len(closed_keys) == len(set(closed_keys))
    # reading at a removed offset returns the next batch that remains
    assert validate_batches(log.read(2, 1))[0].base_offset > 2
    compact(log, now_ms=10_000)  # now the tombstone is old enough to go
    assert b"dead" not in {k for _, k, _ in records(log)}
    after = records(log)
    log.close()
    reopened = PartitionLog.open(tmp_path / "c-0", LogConfig(**CFG))
    assert reopened.log_end_offset == leo and records(reopened) == after


def test_run_maintenance_compacts_internal_topic(tmp_path):
    log = PartitionLog.open(tmp_path / "__consumer_offsets-0", LogConfig(**CFG))
    for i in range(40):
        log.append(build_batch([(b"same", b"x" * 50, [], i)]), 0)
    log.run_maintenance(100)
    active = log.segments[-1].base_offset
    kept = [r[0] for r in records(log) if r[1] == b"same"]
    assert len(log.segments) > 1 and kept == list(range(active, 40))  # closed segments emptied


def test_leftover_cleaned_file_is_ignored_and_emptied_segments_keep_their_end(tmp_path):
    cfg = LogConfig(**CFG)
    log = PartitionLog.open(tmp_path / "c-0", cfg)
    for i in range(40):
        log.append(build_batch([(b"same", b"x" * 50, [], i)]), 0)
    compact(log, now_ms=100)
    ends = [(s.base_offset, s.next_offset) for s in log.segments]
    assert all(a[1] == b[0] for a, b in zip(ends, ends[1:]))  # contiguous even when emptied
    data = log.read(0, 1 << 30)
    log.close()
    (tmp_path / "c-0" / "00000000000000000000.log.cleaned").write_bytes(b"half-written")
    log = PartitionLog.open(tmp_path / "c-0", cfg)
    assert not log.recovered_truncation and log.log_end_offset == 40
    assert log.read(0, 1 << 30) == data
    assert not list((tmp_path / "c-0").glob("*.cleaned"))


def test_compaction_never_rewrites_corrupt_bytes(tmp_path):
    """A flipped byte below the recovery point (not validated at start) is found before a
    pass: segments from the damaged one on are not cleaned, so the damage is never given a
    valid CRC, and keys are not mapped from it."""
    import pytest

    from shoal.errors import ApiError, ErrorCode
    from shoal.protocol.batch import read_header

    cfg = LogConfig(**CFG)
    log = PartitionLog.open(tmp_path / "c-0", cfg)
    for i in range(80):
        log.append(build_batch([(b"k%d" % (i % 4), b"v%03d" % i + b"." * 60, [], 1000 + i)]), 0)
    assert len(log.segments) > 6
    victim = log.segments[3]
    hit = next(victim.batch_headers())
    log.close()
    with open(tmp_path / "c-0" / f"{victim.base_offset:020d}.log", "r+b") as f:
        f.seek(hit.position + hit.size - 3)
        f.write(b"\x00\x00\x00")
    log = PartitionLog.open(tmp_path / "c-0", cfg)
    untouched = {s.base_offset: (tmp_path / "c-0" / f"{s.base_offset:020d}.log").read_bytes()
                 for s in log.segments[3:-1]}
    stats = compact(log, now_ms=10_000)
    assert stats.segments_rewritten > 0  # the segments before the damage were cleaned
    for base, data in untouched.items():
        assert (tmp_path / "c-0" / f"{base:020d}.log").read_bytes() == data
    with pytest.raises(ApiError) as e:
        log.read(hit.base_offset, 1 << 20)
    assert e.value.error_code == ErrorCode.corrupt_message
    # the latest record of every key is still there
    last = {}
    offset = log.log_start_offset
    while offset < log.log_end_offset:
        try:
            data = log.read(offset, 1)
        except ApiError:
            offset += 1
            continue
        h = read_header(data)
        for r in decode_records(data, h):
            last[r.key] = r.value[:4]
        offset = h.next_offset
    assert last == {b"k%d" % k: b"v%03d" % (76 + k) for k in range(4)}
