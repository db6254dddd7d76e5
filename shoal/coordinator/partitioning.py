"""Which partition of an internal topic holds a coordinator key, by Kafka's rule.

Kafka maps a group id (``__consumer_offsets``) and a share-partition key
``group:topicId:partition`` (``__share_group_state``) to a partition with
``Utils.abs(key.hashCode()) % partitions``: Java's string hash, with Integer.MIN_VALUE
mapped to 0. Unlike Python's ``hash``, it is the same in every process. Pure.

The hash walks the key a character at a time in Python (about 1 us per character), and a
transactional id's partition is asked several times per request (every transactional
Produce, AddPartitionsToTxn, EndTxn), so ``coordinator_partition`` remembers the last
few thousand keys.
"""

from __future__ import annotations

import functools

__all__ = ["coordinator_partition", "java_string_hash"]


def java_string_hash(text: str) -> int:
    """Java's ``String.hashCode`` (signed 32-bit, over UTF-16 code units)."""
    h = 0
    data = text.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


@functools.lru_cache(maxsize=4096)
def coordinator_partition(key: str, num_partitions: int) -> int:
    """The partition of ``key``. Raises ValueError if ``num_partitions < 1``."""
    if num_partitions < 1:
        raise ValueError("num_partitions must be at least 1")
    h = java_string_hash(key)
    return (0 if h == -(1 << 31) else abs(h)) % num_partitions
