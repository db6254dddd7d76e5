"""Pure parts of the log: sparse index search and encoding, roll and retention planning."""

from __future__ import annotations

from shoal.config import BrokerConfig
from shoal.log.index import OFFSET_ENTRY, TIME_ENTRY, SparseIndex, decode_offset_index, decode_time_index
from shoal.log.policy import LogConfig, SegmentSummary, plan_retention, should_roll


def test_floor_lookup():
    idx = SparseIndex()
    for k, v in [(0, 0), (10, 4096), (25, 8192)]:
        assert idx.append(k, v)
    assert not idx.append(25, 9000) and not idx.append(30, 100)  # keys grow, values never shrink
    assert idx.floor(-1) is None
    assert idx.floor(0) == (0, 0) and idx.floor(9) == (0, 0) and idx.floor(10) == (10, 4096)
    assert idx.floor(1000) == (25, 8192)
    idx.truncate_values_from(4096)
    assert idx.keys == [0]


def test_decode_rejects_torn_or_unsorted_files():
    good = OFFSET_ENTRY.pack(0, 0) + OFFSET_ENTRY.pack(5, 100)
    assert decode_offset_index(good, 200).keys == [0, 5]
    assert decode_offset_index(good[:-1], 200) is None
    assert decode_offset_index(good, 100) is None  # points past the log
    assert decode_offset_index(OFFSET_ENTRY.pack(5, 0) + OFFSET_ENTRY.pack(5, 10), 200) is None
    t = TIME_ENTRY.pack(100, 0) + TIME_ENTRY.pack(90, 3)
    assert decode_time_index(t) is None
    assert decode_time_index(TIME_ENTRY.pack(100, 0)).floor(150) == (100, 0)


def test_should_roll():
    kw = dict(segment_bytes=1000, first_timestamp=0, segment_ms=100)
    assert not should_roll(segment_size=0, incoming_bytes=5000, now_ms=10**9, **kw)
    assert should_roll(segment_size=600, incoming_bytes=500, now_ms=0, **kw)
    assert not should_roll(segment_size=500, incoming_bytes=500, now_ms=100, **kw)
    assert should_roll(segment_size=10, incoming_bytes=10, now_ms=101, **kw)


def test_plan_retention():
    segs = [SegmentSummary(0, 10, 100, 1000), SegmentSummary(10, 20, 100, 2000), SegmentSummary(20, 30, 100, 3000)]
    kw = dict(retention_ms=-1, retention_bytes=-1, log_start_offset=0)
    assert plan_retention(segs, now_ms=10**9, **kw) == 0
    assert plan_retention(segs, now_ms=2500, **{**kw, "retention_ms": 1000}) == 1
    assert plan_retention(segs, now_ms=10**9, **{**kw, "retention_ms": 0}) == 2  # never the active one
    assert plan_retention(segs, now_ms=0, **{**kw, "retention_bytes": 100}) == 2
    assert plan_retention(segs, now_ms=0, **{**kw, "retention_bytes": 200}) == 1
    assert plan_retention(segs, now_ms=0, **{**kw, "log_start_offset": 15}) == 1


def test_log_config_resolution():
    broker = BrokerConfig({"log.segment.bytes": "4096", "log.message.timestamp.type": "LogAppendTime"})
    cfg = LogConfig.resolve(broker, {"retention.ms": 5, "cleanup.policy": ["compact", "delete"]})
    assert cfg.segment_bytes == 4096 and cfg.retention_ms == 5 and cfg.log_append_time
    assert cfg.compact and cfg.delete and cfg.flush_messages == 1
    assert LogConfig.resolve(BrokerConfig()).cleanup_policy == ("delete",)
