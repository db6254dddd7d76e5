"""Log compaction (cleanup.policy=compact): keep the latest record of each key (file I/O).

Theory of operation
-------------------
One pass (:func:`compact`):

1. Map every key in the whole log (closed and active segments) to its latest offset.
2. For each closed segment eligible by ``min.compaction.lag.ms`` (:func:`plan_compaction`),
   decide record by record with :func:`keep_record` (pure, in policy.py): the latest
   record of a key stays; a latest tombstone stays until ``delete.retention.ms`` after
   its timestamp; keyless records and control batches stay.
3. A batch whose records all stay is copied byte for byte; a batch that loses some is
   rebuilt uncompressed with the kept records at their original offsets (same base offset,
   producer fields and last offset delta, so offsets never move); an emptied batch is
   dropped, except the last of a segment, kept with no records so that the segment still
   ends where the next one begins (recovery checks this).  Segments that would not change are not rewritten.
4. The new content goes to ``<base>.log.cleaned``, is fsynced, the old index files are
   removed, and the file is renamed over ``<base>.log`` (atomic); the directory is
   fsynced and the segment reopened, rebuilding its indexes.  A crash leaves either the old
   or the new segment; a stray ``.cleaned`` file is removed at the next open.

The active segment is never rewritten.  Reads in progress are not a concern: the event
loop runs one operation at a time.  This is not on any hot path.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from shoal.log.policy import keep_record, plan_compaction
from shoal.log.segment import Segment
from shoal.protocol.batch import build_batch, decode_records

__all__ = ["compact", "rewrite_records", "CompactionStats"]


@dataclass(frozen=True, slots=True)
class CompactionStats:
    segments_rewritten: int
    records_removed: int
    bytes_before: int
    bytes_after: int


def _latest_offsets(log) -> dict[bytes, int]:
    latest: dict[bytes, int] = {}
    for seg in log.segments:
        for h in seg.batch_headers():
            if h.is_control:
                continue
            for r in decode_records(seg.read_at(h.position, h.size)):
                if r.key is not None:
                    latest[r.key] = r.offset
    return latest


def compact(log, now_ms: int) -> CompactionStats:
    """Run one compaction pass over ``log`` (a PartitionLog); returns what it did."""
    cfg = log.config
    n = plan_compaction(log.summaries(), now_ms=now_ms, min_compaction_lag_ms=cfg.min_compaction_lag_ms)
    if n == 0:
        return CompactionStats(0, 0, 0, 0)
    latest = _latest_offsets(log)
    rewritten = removed = before = after = 0
    for i in range(n):
        seg: Segment = log.segments[i]
        out = bytearray()
        changed = False
        headers = list(seg.batch_headers())
        for j, h in enumerate(headers):
            raw = seg.read_at(h.position, h.size)
            if h.is_control:
                out += raw
                continue
            recs = decode_records(raw)
            kept = [r for r in recs if keep_record(key=r.key, offset=r.offset, is_tombstone=r.value is None,
                                                   timestamp=r.timestamp, latest=latest, now_ms=now_ms,
                                                   delete_retention_ms=cfg.delete_retention_ms)]
            if len(kept) == len(recs):
                out += raw
                continue
            changed = True
            removed += len(recs) - len(kept)
            if not kept and j < len(headers) - 1:
                continue  # the last batch stays, even empty, so the segment still ends at its next offset
            out += build_batch(
                [(r.key, r.value, r.headers, r.timestamp) for r in kept],
                base_offset=h.base_offset,
                offset_deltas=[r.offset - h.base_offset for r in kept],
                timestamp_type=h.timestamp_type,
                producer_id=h.producer_id, producer_epoch=h.producer_epoch, base_sequence=h.base_sequence,
                transactional=h.is_transactional, partition_leader_epoch=h.partition_leader_epoch,
                last_offset_delta=h.last_offset_delta,
            )
        if not changed:
            continue
        before += seg.size
        after += len(out)
        rewritten += 1
        log.segments[i] = _swap(seg, bytes(out), log.config.index_interval_bytes)
    return CompactionStats(rewritten, removed, before, after)


def rewrite_records(log, transform) -> int:  # type: ignore[no-untyped-def]
    """Rewrite the records of ``log`` (a PartitionLog) through ``transform``; returns the
    number of segments rewritten.

    ``transform(key, value)`` returns the new (key, value) of a record, or None to keep
    it as it is. The active segment is rolled first (if it holds anything), so that every
    record is in a closed segment; each changed segment is replaced as compaction replaces
    one (same offsets, timestamps and producer fields; batches rebuilt uncompressed), so a
    crash leaves each segment either old or new. Used once, to upgrade the record format
    of an internal topic at start.
    """
    if log.segments[-1].size > 0:
        log.roll()
    rewritten = 0
    for i in range(len(log.segments) - 1):
        seg: Segment = log.segments[i]
        out = bytearray()
        changed = False
        for h in list(seg.batch_headers()):
            raw = seg.read_at(h.position, h.size)
            if h.is_control:
                out += raw
                continue
            recs = decode_records(raw)
            new = [transform(r.key, r.value) for r in recs]
            if all(n is None for n in new):
                out += raw
                continue
            changed = True
            out += build_batch(
                [(n[0], n[1], r.headers, r.timestamp) if n is not None else (r.key, r.value, r.headers, r.timestamp)
                 for r, n in zip(recs, new)],
                base_offset=h.base_offset,
                offset_deltas=[r.offset - h.base_offset for r in recs],
                timestamp_type=h.timestamp_type,
                producer_id=h.producer_id, producer_epoch=h.producer_epoch, base_sequence=h.base_sequence,
                transactional=h.is_transactional, partition_leader_epoch=h.partition_leader_epoch,
                last_offset_delta=h.last_offset_delta,
            )
        if changed:
            log.segments[i] = _swap(seg, bytes(out), log.config.index_interval_bytes)
            rewritten += 1
    return rewritten


def _swap(seg: Segment, data: bytes, index_interval: int) -> Segment:
    directory, base = seg.dir, seg.base_offset
    cleaned = seg.log_path.with_name(seg.log_path.name + ".cleaned")
    fd = os.open(cleaned, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    log_path = seg.log_path
    seg.close()
    for p in (seg.index_path, seg.time_index_path):
        try:
            p.unlink()
        except FileNotFoundError:
            pass
    os.replace(cleaned, log_path)
    dfd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
    new, _ = Segment.open(directory, base, index_interval, recover=True)
    return new
