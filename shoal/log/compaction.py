"""Log compaction (cleanup.policy=compact): keep the latest record of each key (file I/O).

Theory of operation
-------------------
One pass (:func:`compact`):

1. Map every key in the whole log (closed and active segments) to its latest offset.
2. For each closed segment eligible by ``min.compaction.lag.ms`` (:func:`plan_compaction`),
   decide record by record with :func:`keep_record` (pure, in policy.py): the latest
   record of a key stays; a latest tombstone stays until ``delete.retention.ms`` after
   its timestamp; keyless records and control batches stay. Transactions: the records of
   an aborted transaction are removed and never count as a key's latest record, and those
   of a transaction still open stay but do not count either (it may yet abort), so an
   aborted or undecided write never takes the place of a committed one.
3. A batch whose records all stay is copied byte for byte; a batch that loses some is
   rebuilt uncompressed with the kept records at their original offsets (same base offset,
   producer fields and last offset delta, so offsets never move); an emptied batch is
   dropped, except the last of a segment, kept with no records so that the segment still
   ends where the next one begins (recovery checks this).
4. Each changed segment is rewritten on its own: the new content goes to
   ``<base>.log.cleaned``, is fsynced, the old index files are removed, and the file is
   renamed over ``<base>.log`` (atomic); the directory is fsynced and the segment
   reopened (indexes rebuilt and fsynced).
5. Then consecutive segments are merged, as Kafka's cleaner groups them, while a group
   stays within ``segment.bytes`` and its offsets fit the index's 32-bit relative offsets
   (:func:`plan_groups`, pure).  A group becomes one segment with the first one's base
   offset (batches copied byte for byte; the empty batches that only kept a segment's end
   are dropped, except the group's last), written and swapped in as above, and the
   group's other segments are deleted.  So a compacted topic's segment count stays
   bounded instead of growing with every roll.  A crash leaves either the old first
   segment, or the new one followed by segments wholly inside its offset range, which
   the next open deletes; a stray ``.cleaned`` file is removed at the next open.

A pass runs only when it is due, as Kafka's cleaner decides: the closed segments written
since the last pass (the dirty part) are at least ``min.cleanable.dirty.ratio`` of all
closed segments, or a kept tombstone has reached ``delete.retention.ms``, or the topic's
settings changed.  Each pass reads the whole log, so this keeps the work per byte written
bounded on a busy topic.

Segments with corrupt bytes (which nothing checked since the broker started, being below
the recovery point) are found by a CRC check before a pass: the pass cleans only the
segments before the first of them and maps keys without them, so damaged bytes are never
decoded into records nor given a valid CRC by a rewrite.

The active segment is never rewritten.  Reads in progress are not a concern: the event
loop runs one operation at a time.  This is not on any hot path.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from shoal.log.policy import keep_record, plan_compaction
from shoal.log.segment import Segment
from shoal.protocol.batch import build_batch, decode_records

__all__ = ["CompactionStats", "compact", "plan_groups", "rewrite_records"]

_MAX_RELATIVE_OFFSET = 2**31 - 1


@dataclass(frozen=True, slots=True)
class CompactionStats:
    segments_rewritten: int
    """Segments written anew (one per group that changed)."""
    records_removed: int
    bytes_before: int
    bytes_after: int
    segments_merged: int = 0
    """Segments that disappeared into the segment before them."""


def plan_groups(segments: Sequence[tuple[int, int, int]], *, max_bytes: int) -> list[int]:
    """Group consecutive segments, given as (base_offset, next_offset, size_bytes); pure.

    Returns each group's length, in order.  A group holds at most ``max_bytes`` (a single
    segment always fits) and spans fewer than 2**31 offsets from its first base.
    """
    groups: list[int] = []
    size = 0
    base = 0
    for seg_base, seg_next, seg_size in segments:
        if groups and size + seg_size <= max_bytes and seg_next - 1 - base <= _MAX_RELATIVE_OFFSET:
            groups[-1] += 1
            size += seg_size
        else:
            groups.append(1)
            size = seg_size
            base = seg_base
    return groups


def _txn_fate(log):
    """``fate(header)``: "aborted" for a batch of an aborted transaction, "open" for one of a
    transaction still open, None otherwise (not transactional, or committed)."""
    txns = getattr(log, "txns", None)
    aborted: dict[int, list[tuple[int, int]]] = {}
    ongoing: dict[int, int] = {}
    if txns is not None:
        for a in txns.aborted:
            aborted.setdefault(a.producer_id, []).append((a.first_offset, a.last_offset))
        ongoing = dict(txns.ongoing)

    def fate(h) -> str | None:
        if not h.is_transactional or h.is_control or h.producer_id < 0:
            return None
        first = ongoing.get(h.producer_id)
        if first is not None and h.base_offset >= first:
            return "open"
        for lo, hi in aborted.get(h.producer_id, ()):
            if lo <= h.base_offset < hi:
                return "aborted"
        return None

    return fate


def _latest_offsets(log, damaged: set[int], fate=None) -> dict[bytes, int]:
    latest: dict[bytes, int] = {}
    for j, seg in enumerate(log.segments):
        if j in damaged:  # (a key whose latest record is there keeps an older one: nothing good is lost)
            continue
        for h in seg.batch_headers():
            if h.is_control or (fate is not None and fate(h) is not None):
                continue
            for r in decode_records(seg.read_at(h.position, h.size)):
                if r.key is not None:
                    latest[r.key] = r.offset
    return latest


def _clean(seg: Segment, latest: dict[bytes, int], now_ms: int, delete_retention_ms: int, fate=None):
    """The segment's content after cleaning: (bytes, changed, records removed, next tombstone expiry)."""
    out = bytearray()
    changed = False
    removed = 0
    expiry: int | None = None
    headers = list(seg.batch_headers())
    for j, h in enumerate(headers):
        raw = seg.read_at(h.position, h.size)
        kind = fate(h) if fate is not None else None
        if h.is_control or kind == "open":
            out += raw
            continue
        recs = decode_records(raw)
        if not recs and j < len(headers) - 1:
            changed = True  # an empty batch kept as a segment's last, now inside a merged segment
            continue
        kept = []
        for r in recs:
            tomb = r.value is None
            if kind == "aborted":
                continue
            if keep_record(key=r.key, offset=r.offset, is_tombstone=tomb, timestamp=r.timestamp, latest=latest,
                           now_ms=now_ms, delete_retention_ms=delete_retention_ms):
                kept.append(r)
                if tomb and r.key is not None:
                    due = r.timestamp + delete_retention_ms + 1
                    expiry = due if expiry is None else min(expiry, due)
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
    return bytes(out), changed, removed, expiry


def compact(log, now_ms: int) -> CompactionStats:
    """Run one compaction pass over ``log`` (a PartitionLog) if it is due; returns what it did.

    Raises OSError if a file operation fails; the log then still holds every record
    (see the crash rules above).
    """
    cfg = log.config
    n = plan_compaction(log.summaries(), now_ms=now_ms, min_compaction_lag_ms=cfg.min_compaction_lag_ms)
    if n == 0:
        return CompactionStats(0, 0, 0, 0)
    segs = log.segments[:n]
    cleaned_end, expiry, last_cfg = log.compaction_state or (-1, None, cfg)
    total = sum(s.size for s in segs)
    dirty = sum(s.size for s in segs if s.base_offset >= cleaned_end)
    due = ((dirty > 0 and dirty >= cfg.min_cleanable_dirty_ratio * total)
           or (expiry is not None and now_ms >= expiry) or last_cfg != cfg)
    if not due:
        return CompactionStats(0, 0, 0, 0)
    # Corrupt bytes (below the recovery point nothing checked them yet) are never decoded nor
    # rewritten, which would give them a valid CRC: the pass stops before the first damaged
    # segment, and keys are mapped without the damaged ones.
    damaged = {j for j, s in enumerate(log.segments) if not s.check_all()}
    if damaged:
        n = min(n, min(damaged))
        segs = log.segments[:n]
        if n == 0:
            return CompactionStats(0, 0, 0, 0)
    fate = _txn_fate(log)
    latest = _latest_offsets(log, damaged, fate)
    end = segs[-1].next_offset
    kept: list[Segment] = []
    rewritten = merged = removed = before = after = 0
    expiries: list[int] = []
    i = 0
    try:
        # 1. clean each segment on its own
        for seg in segs:
            data, changed, gone, due_ms = _clean(seg, latest, now_ms, cfg.delete_retention_ms, fate)
            if due_ms is not None:
                expiries.append(due_ms)
            if changed:
                size = seg.size
                seg = _swap([seg], [data], cfg.index_interval_bytes)
                rewritten += 1
                removed += gone
                before += size
                after += seg.size
            kept.append(seg)
            i += 1
        # 2. merge consecutive small segments (bytes copied, no records decoded)
        groups = plan_groups([(s.base_offset, s.next_offset, s.size) for s in kept], max_bytes=cfg.segment_bytes)
        merged_list: list[Segment] = []
        k = 0
        for g in groups:
            group = kept[k : k + g]
            if g > 1:
                new = _swap(group, _concatenated(group), cfg.index_interval_bytes)
                kept[k : k + g] = [new] * g  # so an error below still lists each segment once
                group = [new]
                merged += g - 1
            merged_list += group
            k += g
        kept = merged_list
    finally:
        log.replace_segments(n, _unique(kept) + segs[i:])  # segments not reached (an error) stay
    log.compaction_state = (end, min(expiries) if expiries else None, cfg)
    if getattr(log, "txns", None) is not None and log.txns.aborted and (rewritten or merged):
        log.write_txn_indexes()  # a merged segment holds the aborted transactions of those it took in
    return CompactionStats(rewritten, removed, before, after, merged)


def _unique(segs: list[Segment]) -> list[Segment]:
    out: list[Segment] = []
    for s in segs:
        if not out or out[-1] is not s:
            out.append(s)
    return out


def _concatenated(group: list[Segment]):
    """The batches of ``group``, one chunk per segment, without the empty batches that kept
    each segment's end (only the group's last one is needed)."""
    for n, seg in enumerate(group):
        last_seg = n == len(group) - 1
        out = bytearray()
        headers = list(seg.batch_headers())
        for j, h in enumerate(headers):
            if h.records_count == 0 and not h.is_control and not (last_seg and j == len(headers) - 1):
                continue
            out += seg.read_at(h.position, h.size)
        yield bytes(out)


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
            log.segments[i] = _swap([seg], [bytes(out)], log.config.index_interval_bytes)
            rewritten += 1
    log.compaction_state = None
    return rewritten


def _swap(segs: list[Segment], chunks, index_interval: int) -> Segment:
    """Replace ``segs`` (consecutive) by one segment holding ``chunks`` (bytes, consumed here).

    Returns the new segment.  Raises OSError.
    """
    first = segs[0]
    directory, base, files = first.dir, first.base_offset, first._files
    log_path = first.log_path
    cleaned = log_path.with_name(log_path.name + ".cleaned")
    fd = os.open(cleaned, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for data in chunks:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    first.close()
    for p in (first.index_path, first.time_index_path):
        try:
            p.unlink()
        except FileNotFoundError:
            pass
    os.replace(cleaned, log_path)
    files.fsync_dir(directory)
    new, _ = Segment.open(directory, base, index_interval, recover=True, files=files)
    new.write_indexes(fsync=True)
    for seg in segs[1:]:  # now wholly inside the new segment
        seg.delete()
    return new
