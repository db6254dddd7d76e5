"""Micro-benchmark of the pure share-partition state machine: acquire + accept throughput.

Run: python benchmarks/share_partition_bench.py [--records N] [--batch-size B] [--per-offset]

Each round acquires the next log batch for one member, accepts it, takes the write and
commits it: the whole path a share consumer drives, minus I/O.  With --per-offset the
acknowledgement carries one type per offset (as a client acknowledging record by record
does), which forces the batch to split.
"""

from __future__ import annotations

import argparse
import time

from shoal.share.partition import SharePartition
from shoal.share.state import AcknowledgeType


def run(records: int, batch_size: int, per_offset: bool) -> float:
    sp = SharePartition("bench", "topic", 0, 0, max_in_flight_records=max(2000, batch_size))
    accept = int(AcknowledgeType.ACCEPT)
    offset = 0
    started = time.perf_counter()
    now = 0
    while offset < records:
        last = offset + batch_size - 1
        got = sp.acquire("m", [(offset, last)], now, batch_size)
        first, end = got[0].first_offset, got[-1].last_offset
        types = [accept] * (end - first + 1) if per_offset else [accept]
        sp.acknowledge("m", [(first, end, types)], now)
        sp.commit(sp.take_write())
        offset = last + 1
        now += 1
    elapsed = time.perf_counter() - started
    assert sp.start_offset == offset
    return offset / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=2_000_000)
    parser.add_argument("--batch-size", type=int, default=500)
    parser.add_argument("--per-offset", action="store_true")
    args = parser.parse_args()
    rate = run(args.records, args.batch_size, args.per_offset)
    mode = "per-offset acks" if args.per_offset else "one ack per batch"
    print(f"acquire+accept: {rate:,.0f} records/s ({args.records:,} records, batches of {args.batch_size}, {mode})")


if __name__ == "__main__":
    main()
