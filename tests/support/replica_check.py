"""The replicas of a partition on disk: byte-identical up to the high watermark.

Read after a run, once the brokers have stopped: every broker's partition directory
(``<data dir>/<topic>-<partition>``) is parsed with shoal's own batch header reader, and
the record batches below the high watermark must be the same bytes on every replica
(offsets, partition leader epochs, producer ids and sequences, CRCs, records). Each
replica must hold every batch from the common first offset up to the high watermark,
with no batch straddling it (the high watermark is always at a batch boundary).

The leader-epoch checkpoint of each replica must also agree with its batches: for every
batch below the high watermark, the epoch the checkpoint names for the batch's base
offset is the epoch written in the batch (a follower that kept a stale entry would cut
its log at the wrong offset after the next leader change).

Usage::

    hws = high_watermarks(cluster.bootstrap, topic, partitions)   # while the cluster runs
    for b in cluster.brokers: b.stop()
    assert_replicas_identical({i: b.data_dir for i, b in ...}, topic, p, hws[p])
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from shoal.cluster.leader_epochs import LeaderEpochCache
from shoal.protocol.batch import CorruptBatchError, iter_batches

__all__ = ["DiskBatch", "PartitionFiles", "read_partition", "divergence", "epoch_mismatch",
           "assert_replicas_identical", "high_watermarks"]

_SEGMENT = re.compile(r"^(\d{20})\.log$")
EPOCH_FILE = "leader-epoch-checkpoint"


@dataclass(frozen=True)
class DiskBatch:
    base_offset: int
    next_offset: int
    leader_epoch: int
    data: bytes
    segment: str


@dataclass(frozen=True)
class PartitionFiles:
    batches: list[DiskBatch]
    epochs: list[tuple[int, int]]
    torn: str | None
    """Where parsing stopped before the end of a segment file (a torn or corrupt tail), or None."""


def read_partition(partition_dir: Path) -> PartitionFiles:
    """Every batch of a partition directory's segments in offset order, and its epoch checkpoint."""
    segments = sorted((int(m.group(1)), p) for p in partition_dir.iterdir() if (m := _SEGMENT.match(p.name)))
    batches: list[DiskBatch] = []
    torn = None
    for _, path in segments:
        data = path.read_bytes()
        end = 0
        try:
            for h in iter_batches(data):
                batches.append(DiskBatch(h.base_offset, h.next_offset, h.partition_leader_epoch,
                                         bytes(data[h.position:h.end]), path.name))
                end = h.end
        except CorruptBatchError as e:
            torn = f"{path.name} at byte {end} of {len(data)}: {e}"
            break
    try:
        text = (partition_dir / EPOCH_FILE).read_text()
    except FileNotFoundError:
        text = ""
    return PartitionFiles(batches, LeaderEpochCache.from_text(text).entries, torn)


def _below(files: PartitionFiles, start: int, hw: int) -> list[DiskBatch]:
    return [b for b in files.batches if b.base_offset >= start and b.base_offset < hw]


def divergence(replicas: Mapping[int, PartitionFiles], hw: int) -> str | None:
    """The first difference between the replicas below ``hw``, described; None if they agree."""
    if not replicas:
        return "no replica"
    start = max((f.batches[0].base_offset if f.batches else 0) for f in replicas.values())
    if start > hw:
        return f"a replica's first batch starts at {start}, above the high watermark {hw}"
    below = {node: _below(f, start, hw) for node, f in replicas.items()}
    for node, batches in sorted(below.items()):
        expect = start
        for b in batches:
            if b.base_offset != expect:
                return f"replica {node}: batch at {b.base_offset} where {expect} was expected ({b.segment})"
            expect = b.next_offset
        if expect != hw:
            torn = replicas[node].torn
            return (f"replica {node}: batches below the high watermark {hw} end at {expect}"
                    + (f" (parsing stopped in {torn})" if torn else ""))
    ref_node = min(below)
    ref = below[ref_node]
    for node, batches in sorted(below.items()):
        for a, b in zip(ref, batches):
            if a.data != b.data:
                what = []
                if (a.base_offset, a.next_offset) != (b.base_offset, b.next_offset):
                    what.append(f"offsets {a.base_offset}-{a.next_offset - 1} vs {b.base_offset}-{b.next_offset - 1}")
                if a.leader_epoch != b.leader_epoch:
                    what.append(f"leader epoch {a.leader_epoch} vs {b.leader_epoch}")
                if len(a.data) != len(b.data):
                    what.append(f"{len(a.data)} vs {len(b.data)} bytes")
                return (f"replicas {ref_node} and {node} differ in the batch at offset {a.base_offset}"
                        f" ({'; '.join(what) or 'same offsets, epoch and size, other bytes'};"
                        f" segments {a.segment} and {b.segment})")
    return None


def epoch_mismatch(files: PartitionFiles, hw: int) -> str | None:
    """The first batch below ``hw`` whose epoch the replica's leader-epoch checkpoint contradicts."""
    cache = LeaderEpochCache(files.epochs)
    for b in files.batches:
        if b.base_offset >= hw:
            break
        starts = [e for e, s in cache.entries if s <= b.base_offset]
        named = starts[-1] if starts else -1
        if named != b.leader_epoch:
            return (f"batch at offset {b.base_offset} has leader epoch {b.leader_epoch}, the checkpoint "
                    f"{cache.entries} names epoch {named} for it")
    return None


def assert_replicas_identical(data_dirs: Mapping[int, Path], topic: str, partition: int, hw: int) -> None:
    """Fail with the first divergence of the partition's replicas (broker id -> data dir) below ``hw``."""
    replicas = {node: read_partition(Path(d) / f"{topic}-{partition}") for node, d in data_dirs.items()}
    problem = divergence(replicas, hw)
    assert problem is None, f"{topic}-{partition} below the high watermark {hw}: {problem}"
    for node, files in sorted(replicas.items()):
        problem = epoch_mismatch(files, hw)
        assert problem is None, f"{topic}-{partition} on broker {node}: {problem}"


def high_watermarks(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    """Each partition's high watermark as its leader reports it (the end offset consumers see)."""
    from confluent_kafka import TopicPartition

    from tests.support.clients import consumer

    c = consumer(bootstrap)
    try:
        return {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(partitions)}
    finally:
        c.close()
