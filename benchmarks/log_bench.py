"""Append and read throughput of PartitionLog with ~1 MB batches of 1 KiB records.

Run: python benchmarks/log_bench.py [--mb 256] [--dir /tmp] [--no-fsync]
Prints MB/s for append (fsync per append, shoal's default flush policy, and without
fsync) and for sequential reads of whole batches (max_bytes 1 MiB, as a consumer fetch).
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

from shoal.log.partition_log import PartitionLog
from shoal.log.policy import LogConfig
from shoal.protocol.batch import build_batch

RECORD = 1024
PER_BATCH = 1000


def run(directory: Path, total_mb: int, flush_messages: int) -> tuple[float, float, float]:
    batch = build_batch([(None, os.urandom(RECORD), [], 1_700_000_000_000 + i) for i in range(PER_BATCH)])
    n = max(1, total_mb * 1024 * 1024 // len(batch))
    cfg = LogConfig(flush_messages=flush_messages, segment_bytes=256 * 1024 * 1024,
                    max_message_bytes=2 * 1024 * 1024)
    log = PartitionLog.open(directory, cfg)
    t0 = time.perf_counter()
    for _ in range(n):
        log.append(batch, 0)
    log.flush()
    t_append = time.perf_counter() - t0
    total = n * len(batch)
    t0 = time.perf_counter()
    offset = 0
    got = 0
    leo = log.log_end_offset
    while offset < leo:
        data = log.read(offset, 1024 * 1024)
        got += len(data)
        # a consumer would take the next offset from the last batch header; the log's own
        # cache makes this O(1), here we step by records per batch
        offset += PER_BATCH * max(1, len(data) // len(batch))
    t_read = time.perf_counter() - t0
    assert got == total, (got, total)
    log.close()
    return total / t_append / 1e6, total / t_read / 1e6, total / 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=256)
    ap.add_argument("--dir", default=None)
    args = ap.parse_args()
    for flush, label in ((1, "fsync every append"), (1 << 30, "no fsync (OS page cache)")):
        d = Path(tempfile.mkdtemp(dir=args.dir)) / "bench-0"
        try:
            a, r, mb = run(d, args.mb, flush)
            print(f"{label:28s} append {a:8.1f} MB/s   read {r:8.1f} MB/s   ({mb:.0f} MB, 1 KiB records, "
                  f"{PER_BATCH} per batch)")
        finally:
            shutil.rmtree(d.parent, ignore_errors=True)


if __name__ == "__main__":
    main()
