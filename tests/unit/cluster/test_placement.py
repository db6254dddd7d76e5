"""Replica placement for new topics."""

from collections import Counter

import pytest

from shoal.cluster.placement import assign_replicas
from shoal.errors import ApiError, ErrorCode


def test_every_partition_gets_distinct_replicas_and_leaders_spread_evenly():
    brokers = {1: None, 2: None, 3: None}
    out = assign_replicas(brokers, 6, 3)
    assert all(len(set(r)) == 3 for r in out)
    assert Counter(r[0] for r in out) == {1: 2, 2: 2, 3: 2}


def test_rf_two_spreads_followers():
    out = assign_replicas({1: None, 2: None, 3: None, 4: None}, 8, 2)
    assert all(len(set(r)) == 2 for r in out)
    assert Counter(r[0] for r in out) == {1: 2, 2: 2, 3: 2, 4: 2}
    assert len({tuple(r) for r in out}) > 4  # not always the same pairs


def test_rack_aware_places_replicas_on_distinct_racks():
    brokers = {1: "a", 2: "a", 3: "b", 4: "b", 5: "c", 6: "c"}
    for r in assign_replicas(brokers, 12, 3):
        assert len({brokers[b] for b in r}) == 3, r
        assert len(set(r)) == 3
    for r in assign_replicas(brokers, 12, 4):
        assert len(set(r)) == 4 and len({brokers[b] for b in r}) == 3


def test_more_replicas_than_brokers_is_refused():
    with pytest.raises(ApiError) as e:
        assign_replicas({1: None, 2: None}, 1, 3)
    assert e.value.error_code == ErrorCode.invalid_replication_factor


def test_new_partitions_continue_the_rotation():
    brokers = {1: None, 2: None, 3: None}
    whole = assign_replicas(brokers, 6, 1)
    assert assign_replicas(brokers, 3, 1, first_partition=3) == whole[3:]
