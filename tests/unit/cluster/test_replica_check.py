"""The integration tests' replica checker finds what it is meant to find (tests/support/replica_check.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from shoal.cluster.leader_epochs import LeaderEpochCache
from shoal.protocol.batch import build_batch
from tests.support.replica_check import assert_replicas_identical, divergence, read_partition


def _batch(base: int, n: int, epoch: int, tag: bytes = b"v") -> bytes:
    return build_batch([(None, tag + str(base + i).encode(), [], 1_700_000_000_000 + i) for i in range(n)],
                       base_offset=base, partition_leader_epoch=epoch)


def _write(root: Path, node: int, segments: dict[int, list[bytes]], epochs: list[tuple[int, int]]) -> Path:
    d = root / f"b{node}" / "t-0"
    d.mkdir(parents=True)
    for base, batches in segments.items():
        (d / f"{base:020d}.log").write_bytes(b"".join(batches))
    (d / "leader-epoch-checkpoint").write_text(LeaderEpochCache(epochs).to_text())
    return root / f"b{node}"


def test_identical_replicas_pass_even_with_different_segment_boundaries_and_tails(tmp_path: Path) -> None:
    a = [_batch(0, 3, 1), _batch(3, 2, 1), _batch(5, 4, 2)]
    dirs = {
        1: _write(tmp_path, 1, {0: a}, [(1, 0), (2, 5)]),
        2: _write(tmp_path, 2, {0: a[:2], 5: a[2:]}, [(1, 0), (2, 5)]),
        # a tail above the high watermark that the others do not have is allowed
        3: _write(tmp_path, 3, {0: a + [_batch(9, 1, 3, b"x")]}, [(1, 0), (2, 5), (3, 9)]),
    }
    assert_replicas_identical(dirs, "t", 0, 9)


def test_a_differing_batch_below_the_high_watermark_is_reported_with_its_epochs(tmp_path: Path) -> None:
    dirs = {
        1: _write(tmp_path, 1, {0: [_batch(0, 3, 1), _batch(3, 2, 1)]}, [(1, 0)]),
        2: _write(tmp_path, 2, {0: [_batch(0, 3, 1), _batch(3, 2, 2, b"w")]}, [(1, 0), (2, 3)]),
    }
    with pytest.raises(AssertionError, match="differ in the batch at offset 3.*leader epoch 1 vs 2"):
        assert_replicas_identical(dirs, "t", 0, 5)
    # below the divergence they agree
    assert_replicas_identical(dirs, "t", 0, 3)


def test_a_replica_missing_records_below_the_high_watermark_fails(tmp_path: Path) -> None:
    dirs = {
        1: _write(tmp_path, 1, {0: [_batch(0, 3, 1), _batch(3, 2, 1)]}, [(1, 0)]),
        2: _write(tmp_path, 2, {0: [_batch(0, 3, 1)]}, [(1, 0)]),
    }
    with pytest.raises(AssertionError, match="replica 2: batches below the high watermark 5 end at 3"):
        assert_replicas_identical(dirs, "t", 0, 5)


def test_a_torn_tail_is_named(tmp_path: Path) -> None:
    good = _batch(0, 3, 1)
    dirs = {
        1: _write(tmp_path, 1, {0: [good, _batch(3, 2, 1)]}, [(1, 0)]),
        2: _write(tmp_path, 2, {0: [good, _batch(3, 2, 1)[:40]]}, [(1, 0)]),
    }
    files = read_partition(dirs[2] / "t-0")
    assert files.torn is not None and [b.base_offset for b in files.batches] == [0]
    assert "parsing stopped in" in (divergence({n: read_partition(d / "t-0") for n, d in dirs.items()}, 5) or "")


def test_a_checkpoint_that_contradicts_the_batches_fails(tmp_path: Path) -> None:
    a = [_batch(0, 3, 1), _batch(3, 2, 1)]
    dirs = {
        1: _write(tmp_path, 1, {0: a}, [(1, 0)]),
        2: _write(tmp_path, 2, {0: a}, [(1, 0), (2, 3)]),  # names epoch 2 for the batch at 3
    }
    with pytest.raises(AssertionError, match="broker 2: batch at offset 3 has leader epoch 1"):
        assert_replicas_identical(dirs, "t", 0, 5)
