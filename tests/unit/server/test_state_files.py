"""Broker state files on a full disk: a refused write changes nothing and is a protocol error."""

from __future__ import annotations

import pytest

from shoal.config import BrokerConfig
from shoal.errors import ApiError, ErrorCode
from shoal.server import state_files
from shoal.server.state_files import DynamicConfigs, ProducerIdAllocator


def _no_space(path, data):
    raise OSError(28, "No space left on device")


def test_producer_ids_cannot_be_reserved_on_a_full_disk(tmp_path, monkeypatch):
    ids = ProducerIdAllocator(tmp_path / "producer-ids.json")
    monkeypatch.setattr(state_files, "atomic_write", _no_space)
    with pytest.raises(ApiError) as ei:
        ids.allocate()
    assert ei.value.error_code == ErrorCode.coordinator_not_available
    monkeypatch.undo()
    assert ids.allocate() == 0
    assert ProducerIdAllocator(tmp_path / "producer-ids.json").allocate() == ProducerIdAllocator.BLOCK


def test_dynamic_configs_that_cannot_be_written_are_not_applied(tmp_path, monkeypatch):
    config = BrokerConfig()
    dyn = DynamicConfigs(tmp_path / "dynamic-configs.json", config)
    dyn.set_group("g", {"share.auto.offset.reset": "earliest"})
    monkeypatch.setattr(state_files, "atomic_write", _no_space)
    for change in (lambda: dyn.set_group("g", {}), lambda: dyn.delete_group("g"),
                   lambda: dyn.set_broker({"log.retention.ms": "1000"}, config)):
        with pytest.raises(ApiError) as ei:
            change()
        assert ei.value.error_code == ErrorCode.kafka_storage_error
    assert dyn.groups == {"g": {"share.auto.offset.reset": "earliest"}}
    assert dyn.broker == {} and config["log.retention.ms"] != 1000
