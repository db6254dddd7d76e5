"""What the log should do, decided without touching files (pure).

Theory of operation
-------------------
The segment and partition code asks this module four questions and acts on the answers:

* :class:`LogConfig`: a partition's effective settings, resolved from the broker's
  ``log.*`` keys and the topic's overrides (``BrokerConfig.resolve``);
* :func:`should_roll`: does the next append start a new segment (``segment.bytes``,
  ``segment.ms`` measured from the first timestamp of the active segment)?
* :func:`plan_retention`: how many of the oldest segments may go (``retention.ms`` against
  a segment's largest timestamp, ``retention.bytes`` against the partition size, and
  segments entirely below the log start offset); the active segment never goes;
* :func:`plan_compaction` / :func:`keep_record`: which closed segments a compaction pass
  rewrites and which records survive (the latest record of each key; tombstones only
  until ``delete.retention.ms`` after their timestamp; records without a key are kept).

Times are ``now_ms`` arguments; nothing here reads a clock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shoal.config import BrokerConfig

__all__ = ["LogConfig", "SegmentSummary", "keep_record", "plan_compaction", "plan_retention", "should_roll"]


@dataclass(frozen=True, slots=True)
class LogConfig:
    segment_bytes: int = 1 << 30
    segment_ms: int = 7 * 86_400_000
    retention_ms: int = 7 * 86_400_000
    retention_bytes: int = -1
    cleanup_policy: tuple[str, ...] = ("delete",)
    max_message_bytes: int = 1048588
    flush_messages: int = 1
    flush_ms: int = -1
    index_interval_bytes: int = 4096
    min_compaction_lag_ms: int = 0
    delete_retention_ms: int = 86_400_000
    log_append_time: bool = False
    compression_type: str = "producer"
    min_cleanable_dirty_ratio: float = 0.5

    @classmethod
    def resolve(cls, broker: BrokerConfig, overrides: Mapping[str, Any] | None = None) -> LogConfig:
        """Effective settings from parsed topic overrides, falling back to broker keys."""
        r = broker.resolve
        o = overrides or {}
        return cls(
            segment_bytes=r("segment.bytes", o),
            segment_ms=r("segment.ms", o),
            retention_ms=r("retention.ms", o),
            retention_bytes=r("retention.bytes", o),
            cleanup_policy=tuple(r("cleanup.policy", o)),
            max_message_bytes=r("max.message.bytes", o),
            flush_messages=r("flush.messages", o),
            flush_ms=r("flush.ms", o),
            index_interval_bytes=r("index.interval.bytes", o),
            min_compaction_lag_ms=r("min.compaction.lag.ms", o),
            delete_retention_ms=r("delete.retention.ms", o),
            log_append_time=r("message.timestamp.type", o) == "LogAppendTime",
            compression_type=r("compression.type", o),
            min_cleanable_dirty_ratio=r("min.cleanable.dirty.ratio", o),
        )

    @property
    def compact(self) -> bool:
        return "compact" in self.cleanup_policy

    @property
    def delete(self) -> bool:
        return "delete" in self.cleanup_policy


@dataclass(frozen=True, slots=True)
class SegmentSummary:
    base_offset: int
    next_offset: int
    size_bytes: int
    max_timestamp: int  # -1 if the segment holds no timestamped batch


def should_roll(*, segment_size: int, incoming_bytes: int, segment_bytes: int,
                first_timestamp: int, now_ms: int, segment_ms: int) -> bool:
    """Roll when the active segment is non-empty and either full or too old."""
    if segment_size == 0:
        return False
    if segment_size + incoming_bytes > segment_bytes:
        return True
    return first_timestamp >= 0 and now_ms - first_timestamp > segment_ms


def plan_retention(segments: Sequence[SegmentSummary], *, now_ms: int, retention_ms: int,
                   retention_bytes: int, log_start_offset: int) -> int:
    """Number of oldest segments to delete (never the last, active, one)."""
    n = 0
    total = sum(s.size_bytes for s in segments)
    while n < len(segments) - 1:
        s = segments[n]
        below_start = segments[n + 1].base_offset <= log_start_offset
        expired = retention_ms >= 0 and s.max_timestamp >= 0 and now_ms - s.max_timestamp > retention_ms
        too_big = retention_bytes >= 0 and total - s.size_bytes >= retention_bytes
        if not (below_start or expired or too_big):
            break
        total -= s.size_bytes
        n += 1
    return n


def plan_compaction(segments: Sequence[SegmentSummary], *, now_ms: int, min_compaction_lag_ms: int) -> int:
    """Number of oldest closed segments eligible for compaction (a prefix; never the active one).

    A segment qualifies when its newest record is at least ``min.compaction.lag.ms`` old.
    """
    n = 0
    while n < len(segments) - 1:
        s = segments[n]
        if min_compaction_lag_ms > 0 and (s.max_timestamp < 0 or now_ms - s.max_timestamp < min_compaction_lag_ms):
            break
        n += 1
    return n


def keep_record(*, key: bytes | None, offset: int, is_tombstone: bool, timestamp: int,
                latest: Mapping[bytes, int], now_ms: int, delete_retention_ms: int) -> bool:
    """Whether compaction keeps one record.

    Keyless records stay (Kafka refuses them on compacted topics; shoal keeps any it has).
    A record stays if it is the latest of its key; a latest tombstone stays until
    ``delete.retention.ms`` has passed since its timestamp.
    """
    if key is None:
        return True
    if latest.get(key, -1) != offset:
        return False
    if is_tombstone:
        return now_ms - timestamp <= delete_retention_ms
    return True
