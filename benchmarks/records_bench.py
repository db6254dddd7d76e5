"""Cost of produce-time record validation (shoal/protocol/records.py), per record.

Usage:
    python benchmarks/records_bench.py [--repeat N]

For producer-shaped batches (no key, 100 B or 1 KiB values, the record counts
librdkafka puts in a 1 MB batch, and a small batch of 100) in each codec, prints the
time per record of ``validate_produce_batch`` (which takes the run walk), and of the
CRC-32C check every append already paid, so the added cost can be read against
benchmarks/produce_consume.py's broker CPU per million records; for uncompressed
batches also each walk alone: the run walk, the vectorized (numpy) walk and the exact
walk (plain Python).
"""

from __future__ import annotations

import argparse
import time

from shoal.protocol.batch import Compression, build_batch, validate_batches
from shoal.protocol.records import _walk_fast, _walk_runs, validate_produce_batch, walk_records

CODECS = {"none": Compression.NONE, "lz4": Compression.LZ4, "zstd": Compression.ZSTD}


def per_record_ns(fn, n: int, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best / n * 1e9


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=5, help="runs per case (the best is printed)")
    args = ap.parse_args()
    ts = 1_700_000_000_000
    for size, n in ((100, 8000), (1024, 950), (100, 100), (1024, 100)):
        for name, codec in CODECS.items():
            batch = build_batch([(None, b"x" * size, (), ts + i // 200) for i in range(n)], compression=codec)
            full = per_record_ns(lambda: validate_produce_batch(batch), n, args.repeat)
            crc = per_record_ns(lambda: validate_batches(batch), n, args.repeat)
            line = (f"value={size:5}B records={n:5} codec={name:5} validate {full:7.0f} ns/record  "
                    f"(crc check alone {crc:5.0f} ns/record)")
            if codec == Compression.NONE:
                runs = per_record_ns(lambda: _walk_runs(batch, 61, len(batch), n, False), n, args.repeat)
                vec = per_record_ns(lambda: _walk_fast(batch, 61, len(batch), n, False), n, args.repeat)
                exact = per_record_ns(lambda: walk_records(batch, 61, len(batch), n), n, args.repeat)
                line += f"  walks: runs {runs:4.0f}  vectorized {vec:5.0f}  exact {exact:5.0f} ns/record"
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
