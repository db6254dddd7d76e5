"""Small builders shared by the log tests."""

from __future__ import annotations

from shoal.protocol.batch import build_batch


def batch(n: int = 1, *, ts: int = 1000, key: bytes | None = b"k", value_size: int = 100, pid: int = -1,
          epoch: int = -1, seq: int = -1, keys: list[bytes | None] | None = None,
          values: list[bytes | None] | None = None) -> bytes:
    recs = []
    for i in range(n):
        k = keys[i] if keys is not None else key
        v = values[i] if values is not None else bytes([65 + i % 26]) * value_size
        recs.append((k, v, [], ts + i))
    return build_batch(recs, producer_id=pid, producer_epoch=epoch, base_sequence=seq)
