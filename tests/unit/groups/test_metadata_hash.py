"""The subscribed topics' metadata hash (KIP-1101) is the one Apache Kafka computes.

The expected values were computed with the hash library Kafka's group coordinator uses
(hash4j's XXH3-64 streams, as in Kafka's ``Utils.computeTopicHash`` and
``computeGroupHash``), for the same bytes and the same topics.
"""

from __future__ import annotations

import uuid

import pytest

from shoal.groups.metadata_hash import group_hash, metadata_hash, topic_hash, xxh3_64

# hash4j: Hashing.xxh3_64().hashBytesToLong(first n bytes of (i * 31 + 7) & 0xff), as signed int64.
XXH3 = {
    0: 3244421341483603138, 1: 5502495245947142431, 2: -6349423698422726873, 3: 1582743943441612892,
    4: -2549016526957988167, 5: -5579736752565435579, 8: -2394039629164210130, 9: -3754995788605292611,
    16: 9099606716676871632, 17: 2345212530088924167, 32: 278953543771952198, 33: 1844846513307983686,
    64: -2508381663727503547, 65: -381843323958800864, 96: -3295001992457868926, 97: 6981672134384256435,
    128: -492175581222641016, 129: -506823097681485574, 200: 1368452603177808973, 240: -3690920546649497853,
    241: 809349449570470400, 500: -2169663460569493437, 1024: 2575082683865311686,
    1025: -4566685497618039422, 1088: -6815162950983329211, 2048: 1870957339171033971,
    2049: 5784106328234771061, 3000: 7977200675703330694,
}
DATA = bytes((i * 31 + 7) & 0xFF for i in range(3000))
FOO = uuid.UUID("01234567-89ab-cdef-fedc-ba9876543210")
ORDERS = uuid.UUID(int=2)


@pytest.mark.parametrize("n", sorted(XXH3))
def test_xxh3_64_of_every_length_class(n: int) -> None:
    got = xxh3_64(DATA[:n])
    assert got - (1 << 64) * (got >> 63) == XXH3[n]


def test_topic_and_group_hashes_are_kafkas() -> None:
    foo = topic_hash(FOO, "foo", 3)
    orders = topic_hash(ORDERS, "orders.v1", 100)
    assert (foo, orders) == (-6866685120132495045, 173894978986478910)
    assert group_hash({"orders.v1": orders, "foo": foo}) == -6632858638442675634
    topics = {"foo": (FOO, 3), "orders.v1": (ORDERS, 100), "other": (uuid.UUID(int=9), 1)}
    # Only subscribed topics that exist count; order and duplicates do not matter.
    assert metadata_hash(["orders.v1", "nope", "foo", "foo"], topics) == -6632858638442675634
    assert metadata_hash(["nope"], topics) == 0 == group_hash({})


def test_any_metadata_change_changes_the_hash() -> None:
    base = topic_hash(FOO, "foo", 3)
    assert len({base, topic_hash(FOO, "foo", 4), topic_hash(FOO, "fop", 3), topic_hash(ORDERS, "foo", 3)}) == 4
