from __future__ import annotations

import pytest

from shoal.coordinator.partitioning import coordinator_partition, java_string_hash


def test_negative_hashes_use_their_absolute_value_as_kafka_does() -> None:
    assert java_string_hash("b") == 98
    h = java_string_hash("group-7")
    key = next(k for k in (f"consumer-group-{i}" for i in range(1000)) if java_string_hash(k) < 0)
    assert coordinator_partition(key, 50) == abs(java_string_hash(key)) % 50
    assert coordinator_partition("group-7", 7) == abs(h) % 7


def test_min_value_maps_to_partition_zero() -> None:
    assert java_string_hash("polygenelubricants") == -(1 << 31)
    assert coordinator_partition("polygenelubricants", 7) == 0


def test_surrogate_pairs_hash_as_two_utf16_units() -> None:
    # U+1F600 is the pair D83D DE00 in Java's UTF-16 strings.
    assert java_string_hash("\U0001F600") == 31 * 0xD83D + 0xDE00


def test_partition_count_must_be_positive() -> None:
    with pytest.raises(ValueError):
        coordinator_partition("g", 0)
