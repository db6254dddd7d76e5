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


def _fail_on_open(monkeypatch, nth: int) -> None:
    """Make the ``nth`` PartitionLog.open from now on fail as at the descriptor limit."""
    import errno

    from shoal.log import store as store_mod

    real = store_mod.PartitionLog.open
    calls = {"n": 0}

    def open_(*args, **kw):
        calls["n"] += 1
        if calls["n"] == nth:
            raise OSError(errno.EMFILE, "Too many open files")
        return real(*args, **kw)

    monkeypatch.setattr(store_mod.PartitionLog, "open", open_)


def test_create_topic_that_fails_half_way_leaves_nothing(tmp_path, monkeypatch):
    s = LogStore(tmp_path, BrokerConfig())
    _fail_on_open(monkeypatch, 3)
    with pytest.raises(ApiError) as ei:
        s.create_topic("t", 5)
    assert ei.value.error_code == ErrorCode.kafka_storage_error
    assert "Too many open files" in ei.value.message
    assert s.get_topic("t") is None
    assert not list(tmp_path.glob("t-*"))
    monkeypatch.undo()
    s.create_topic("t", 5)  # nothing half-made stands in the way
    s.close()
    s = LogStore(tmp_path, BrokerConfig())
    assert s.get_topic("t").num_partitions == 5
    s.close()


def test_new_partitions_directories_are_made_durable_with_one_fsync_of_the_data_dir(tmp_path, monkeypatch):
    from shoal.log import partition_log as plog_mod
    from shoal.log.segment import OpenSegments

    synced = []
    real, real_method = plog_mod.fsync_dir, OpenSegments.fsync_dir

    def fsync_dir(path):
        synced.append(path)
        real(path)

    def fsync_dir_method(self, path):
        synced.append(path)
        real_method(self, path)

    monkeypatch.setattr(plog_mod, "fsync_dir", fsync_dir)  # atomic_write's (the metadata)
    monkeypatch.setattr(OpenSegments, "fsync_dir", fsync_dir_method)  # the logs'
    s = LogStore(tmp_path, BrokerConfig())
    synced.clear()
    s.create_topic("t", 8)
    # once for the eight new directories' entries, once for the topic metadata written after them
    assert synced.count(tmp_path) == 2
    assert synced.index(tmp_path) < len(synced) - 1
    assert sorted(p for p in synced if p != tmp_path) == sorted(tmp_path / f"t-{i}" for i in range(8))
    synced.clear()
    s.create_partitions("t", 12)
    assert synced.count(tmp_path) == 2
    s.close()


def test_create_partitions_that_fails_half_way_adds_none(tmp_path, monkeypatch):
    s = LogStore(tmp_path, BrokerConfig())
    s.create_topic("t", 2)
    _fail_on_open(monkeypatch, 2)
    with pytest.raises(ApiError) as ei:
        s.create_partitions("t", 4)
    assert ei.value.error_code == ErrorCode.kafka_storage_error
    assert s.get_topic("t").num_partitions == 2
    assert sorted(p.name for p in tmp_path.glob("t-*")) == ["t-0", "t-1"]
    s.close()


def test_metadata_that_cannot_be_written_creates_no_topic(tmp_path, monkeypatch):
    import errno

    from shoal.log import store as store_mod

    s = LogStore(tmp_path, BrokerConfig())

    def no_space(path, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(store_mod, "atomic_write", no_space)
    with pytest.raises(ApiError) as ei:
        s.create_topic("t", 2)
    assert ei.value.error_code == ErrorCode.kafka_storage_error
    assert s.get_topic("t") is None and not list(tmp_path.glob("t-*"))
    monkeypatch.undo()
    s.create_topic("t", 2)
    s.close()


def test_missing_partition_directory_of_a_listed_topic_is_recreated(tmp_path, caplog):
    import shutil

    s = LogStore(tmp_path, BrokerConfig())
    s.create_topic("t", 3)
    s.partition("t", 0).append(batch(2), 0)
    s.close()
    shutil.rmtree(tmp_path / "t-2")  # as an older version left a creation that failed half-way
    with caplog.at_level("WARNING"):
        s = LogStore(tmp_path, BrokerConfig())
    assert "partition t-2 has no directory" in caplog.text
    assert s.partition("t", 0).log_end_offset == 2
    assert s.partition("t", 2).log_end_offset == 0
    s.close()


def test_close_closes_every_partition_even_when_a_flush_fails(tmp_path, caplog):
    import os

    s = LogStore(tmp_path, BrokerConfig())
    s.create_topic("t", 2)
    logs = [s.partition("t", i) for i in range(2)]
    logs[0].append(batch(1), 0, defer_flush=True)
    fds = [seg.fd for log in logs for seg in log.segments]
    bad = logs[0].segments[-1]
    os.close(bad.fd)  # its fsync now fails
    bad._fd = os.open(os.devnull, os.O_RDONLY)
    with caplog.at_level("ERROR"):
        assert s.close() is False
    assert "partition t-0: could not flush at close" in caplog.text
    for fd in fds[1:]:
        with pytest.raises(OSError):
            os.fstat(fd)  # closed
