"""LogStore: topic metadata that survives restarts, admin operations, validation."""

from __future__ import annotations

import uuid

import pytest

from shoal.config import BrokerConfig
from shoal.errors import ApiError, ErrorCode
from shoal.log.store import LogStore, validate_topic_name

from .helpers import batch


@pytest.mark.parametrize("name", ["", ".", "..", "a" * 250, "bad/name", "sp ace", "é"])
def test_illegal_topic_names(name):
    with pytest.raises(ApiError) as ei:
        validate_topic_name(name)
    assert ei.value.error_code == ErrorCode.invalid_topic_exception


@pytest.mark.parametrize("name", ["a", "a.b_c-D9", "a" * 249, "__consumer_offsets"])
def test_legal_topic_names(name):
    validate_topic_name(name)


def test_topics_survive_restart(tmp_path):
    s = LogStore(tmp_path, BrokerConfig())
    tid = uuid.uuid4()
    t = s.create_topic("orders", 3, {"retention.ms": "1000"}, topic_id=tid)
    assert t.topic_id == tid and s.topic_by_id(tid) is t
    s.partition("orders", 2).append(batch(4), 0)
    s.create_topic("__consumer_offsets", 1, {"cleanup.policy": "compact"})
    s.close()
    s = LogStore(tmp_path, BrokerConfig())
    assert sorted(t.name for t in s.topics()) == ["__consumer_offsets", "orders"]
    t = s.get_topic("orders")
    assert t.topic_id == tid and t.num_partitions == 3 and t.configs == {"retention.ms": "1000"}
    assert s.partition("orders", 2).log_end_offset == 4
    assert s.partition("orders", 2).config.retention_ms == 1000
    assert s.partition("__consumer_offsets", 0).config.compact
    s.close()


def test_admin_errors(tmp_path):
    s = LogStore(tmp_path, BrokerConfig())
    s.create_topic("t", 1)
    cases = [
        (lambda: s.create_topic("t", 1), ErrorCode.topic_already_exists),
        (lambda: s.create_topic("u", 0), ErrorCode.invalid_partitions),
        (lambda: s.create_topic("u", 1, {"nope": "1"}), ErrorCode.invalid_config),
        (lambda: s.create_topic("u", 1, {"retention.ms": "x"}), ErrorCode.invalid_config),
        (lambda: s.create_topic("u", 1, {"log.retention.ms": "1"}), ErrorCode.invalid_config),
        (lambda: s.create_topic("u", 1, {"cleanup.policy": "zap"}), ErrorCode.invalid_config),
        (lambda: s.create_topic("u/x", 1), ErrorCode.invalid_topic_exception),
        (lambda: s.delete_topic("nope"), ErrorCode.unknown_topic_or_partition),
        (lambda: s.partition("t", 1), ErrorCode.unknown_topic_or_partition),
        (lambda: s.create_partitions("t", 1), ErrorCode.invalid_partitions),
        (lambda: s.alter_topic_configs("t", {"segment.bytes": "1"}), ErrorCode.invalid_config),
    ]
    for fn, code in cases:
        with pytest.raises(ApiError) as ei:
            fn()
        assert ei.value.error_code == code
    assert s.get_topic("u") is None


def test_delete_create_partitions_alter(tmp_path):
    s = LogStore(tmp_path, BrokerConfig())
    s.create_topic("t", 1)
    s.partition("t", 0).append(batch(2), 0)
    s.create_partitions("t", 3)
    assert s.partition("t", 2).log_end_offset == 0
    s.alter_topic_configs("t", {"segment.bytes": "4096", "retention.bytes": "10"})
    assert s.partition("t", 1).config.segment_bytes == 4096
    s.alter_topic_configs("t", delete=["segment.bytes"])
    assert s.get_topic("t").configs == {"retention.bytes": "10"}
    assert s.partition("t", 1).config.segment_bytes == BrokerConfig()["log.segment.bytes"]
    s.delete_topic("t")
    assert not any(p.name.startswith("t-") for p in tmp_path.iterdir())
    s.create_topic("t", 1)
    assert s.partition("t", 0).log_end_offset == 0
    s.close()
    s = LogStore(tmp_path, BrokerConfig())
    assert s.get_topic("t").num_partitions == 1
    s.close()
