"""Share-group broker settings: KIP-932's ranges, and the rules between them."""

from __future__ import annotations

import pytest

from shoal.config import BrokerConfig, ConfigError


@pytest.mark.parametrize(("key", "value", "says"), [
    ("group.share.delivery.count.limit", 11, "between 2 and 10"),
    ("group.share.delivery.count.limit", 1, "between 2 and 10"),
    ("group.share.max.delivery.count.limit", 11, "between 2 and 10"),
    ("group.share.record.lock.duration.ms", 999, "between 1000 and 3600000"),
    ("group.share.max.record.lock.duration.ms", 3_600_001, "between 30000 and 3600000"),
    ("group.share.partition.max.record.locks", 10_001, "between 100 and 10000"),
    ("group.share.partition.max.record.locks", 99, "between 100 and 10000"),
])
def test_values_outside_the_kip_ranges_are_refused_with_the_range(key: str, value: int, says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        BrokerConfig({key: value})


def test_the_ends_of_the_ranges_are_accepted() -> None:
    BrokerConfig({"group.share.partition.max.record.locks": 10_000,
                  "group.share.max.partition.max.record.locks": 10_000, "group.share.max.delivery.count.limit": 10,
                  "group.share.delivery.count.limit": 10, "group.share.max.record.lock.duration.ms": 3_600_000})


@pytest.mark.parametrize(("overrides", "says"), [
    ({"group.share.record.lock.duration.ms": 10_000}, "between 15000 and 60000"),
    ({"group.share.delivery.count.limit": 3, "group.share.min.delivery.count.limit": 4}, "between 4 and 10"),
    ({"group.share.partition.max.record.locks": 5000}, "between 100 and 4000"),
    ({"group.share.min.session.timeout.ms": 50_000, "group.share.max.session.timeout.ms": 40_000},
     "must not be greater than"),
    ({"group.share.min.heartbeat.interval.ms": 1000, "group.share.min.session.timeout.ms": 1000,
      "group.share.heartbeat.interval.ms": 2000, "group.share.session.timeout.ms": 2000}, "must be less than"),
])
def test_defaults_outside_their_min_and_max_or_heartbeat_not_below_session_are_refused(
        overrides: dict[str, int], says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        BrokerConfig(overrides)
