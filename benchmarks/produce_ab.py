"""Produce throughput of two source trees of shoal, measured in pairs under the same load.

Usage:
    python benchmarks/produce_ab.py TREE_A TREE_B [--rounds N]

Starts one broker from each tree (``PYTHONPATH=TREE python -m shoal serve``, from a
directory outside both trees, since ``-m`` puts the working directory first on the
module path), then for each round and each of produce_consume.py's four cases (100 B and
1 KiB values, 1 and 6 partitions) produces the same records to A and to B back to back,
in alternating order, with produce_consume.py's producer, and deletes the topic. On a
machine shared with other work the load changes from one second to the next; two runs a
second apart see about the same load, so the ratio of each pair says more than medians
of separate runs. Printed per round: MB/s of A and B per case; at the end, per case, the
median MB/s and broker CPU seconds per million records of each tree and the median (and
range) of the per-pair ratios B/A. A worktree of an older commit
(``git worktree add DIR COMMIT``) makes TREE_A.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from confluent_kafka.admin import AdminClient

sys.path.insert(0, str(Path(__file__).resolve().parent))
from produce_consume import cpu_seconds, create_topic, free_port, produce, wait_port  # noqa: E402

CASES = [(100, 1, 1_000_000), (100, 6, 1_000_000), (1024, 1, 300_000), (1024, 6, 300_000)]


def start(tree: str, data_dir: str, cwd: str) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "shoal", "serve", "--port", str(port), "--data-dir", data_dir, "--log-level", "WARNING"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=dict(os.environ, PYTHONPATH=tree), cwd=cwd,
    )
    wait_port(port)
    return proc, f"127.0.0.1:{port}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("tree_a")
    ap.add_argument("tree_b")
    ap.add_argument("--rounds", type=int, default=10)
    args = ap.parse_args()
    trees = [os.path.abspath(args.tree_a), os.path.abspath(args.tree_b)]
    runs: dict[tuple[int, int, int], list[tuple[float, float]]] = {(i, s, p): [] for i in (0, 1)
                                                                    for s, p, _ in CASES}
    with tempfile.TemporaryDirectory(prefix="shoal-ab-") as tmp:
        brokers = []
        try:
            for i, tree in enumerate(trees):
                data = os.path.join(tmp, f"data-{i}")
                os.makedirs(data)
                brokers.append(start(tree, data, tmp))
            for r in range(args.rounds):
                line = [f"round {r + 1} load {os.getloadavg()[0]:.1f}"]
                for size, partitions, count in CASES:
                    for i in ((0, 1) if r % 2 == 0 else (1, 0)):
                        proc, bootstrap = brokers[i]
                        topic = f"ab-{r}-{size}-{partitions}"
                        create_topic(bootstrap, topic, partitions)
                        c0 = cpu_seconds(proc.pid)
                        elapsed = produce(bootstrap, topic, partitions, size, count)
                        c1 = cpu_seconds(proc.pid)
                        runs[(i, size, partitions)].append((size * count / 1e6 / elapsed,
                                                            (c1 - c0) / count * 1e6))
                        admin = AdminClient({"bootstrap.servers": bootstrap})
                        admin.delete_topics([topic])[topic].result(30)
                    a, b = runs[(0, size, partitions)][-1][0], runs[(1, size, partitions)][-1][0]
                    line.append(f"{size}B/{partitions}: {a:.0f} {b:.0f}")
                print("  ".join(line), flush=True)
        finally:
            for proc, _ in brokers:
                proc.terminate()
                proc.wait(30)
    print(f"\nA = {trees[0]}\nB = {trees[1]}")
    for size, partitions, _ in CASES:
        a, b = runs[(0, size, partitions)], runs[(1, size, partitions)]
        ratios = [y[0] / x[0] for x, y in zip(a, b)]
        print(f"value={size:5}B partitions={partitions}  A {statistics.median(x[0] for x in a):7.1f} MB/s "
              f"({statistics.median(x[1] for x in a):.2f} cpu-s/M)  B {statistics.median(x[0] for x in b):7.1f} MB/s "
              f"({statistics.median(x[1] for x in b):.2f} cpu-s/M)  B/A per pair: median {statistics.median(ratios):.2f} "
              f"({min(ratios):.2f}-{max(ratios):.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
