"""Small durable files of the broker: dynamic configs and the producer-id counter.

Each is a JSON document written atomically (temporary file, fsync, rename, fsync of
the directory), so a crash leaves either the old or the new version.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..config import BrokerConfig
from ..errors import ApiError, ErrorCode
from ..log.partition_log import atomic_write

__all__ = ["DynamicConfigs", "ProducerIdAllocator"]


class DynamicConfigs:
    """Broker- and group-level overrides set through AlterConfigs/IncrementalAlterConfigs."""

    def __init__(self, path: Path, config: BrokerConfig) -> None:
        self.path = path
        self.broker: dict[str, str] = {}
        self.groups: dict[str, dict[str, str]] = {}
        self._static = dict(config)
        if path.exists():
            doc = json.loads(path.read_text())
            self.broker = dict(doc.get("broker", {}))
            self.groups = {g: dict(c) for g, c in doc.get("groups", {}).items()}
        for k, v in self.broker.items():
            config.set(k, v)

    def static_values(self) -> dict[str, Any]:
        """The broker configuration as started (file and overrides), without dynamic changes."""
        return dict(self._static)

    def _save(self, broker: dict[str, str], groups: dict[str, dict[str, str]]) -> None:
        """Write ``broker`` and ``groups`` to the file; raises ApiError(kafka_storage_error) if it cannot.

        Callers change memory only after this returned, so a refused write changes nothing.
        """
        try:
            atomic_write(self.path, json.dumps({"broker": broker, "groups": groups}, indent=1).encode())
        except OSError as e:
            raise ApiError(ErrorCode.kafka_storage_error, f"cannot write {self.path.name}: {e}") from e

    def set_broker(self, values: dict[str, str], config: BrokerConfig) -> None:
        """Replace the dynamic broker configs. Raises ApiError(kafka_storage_error) (nothing changed)."""
        self._save(dict(values), self.groups)
        for k in self.broker:
            if k not in values:
                config.set(k, self._static[k])
        for k, v in values.items():
            config.set(k, v)
        self.broker = dict(values)

    def set_group(self, group_id: str, values: dict[str, str]) -> None:
        """Replace a group's config overrides. Raises ApiError(kafka_storage_error) (nothing changed)."""
        groups = dict(self.groups)
        if values:
            groups[group_id] = dict(values)
        else:
            groups.pop(group_id, None)
        self._save(self.broker, groups)
        self.groups = groups

    def group_value(self, group_id: str, name: str, config: BrokerConfig) -> Any:
        """The effective value of group config ``name`` (override, else broker default)."""
        from ..config import parse_value

        raw = self.groups.get(group_id, {}).get(name)
        if raw is not None:
            return parse_value(name, raw)
        return config.resolve(name)

    def adopt_groups(self, groups: dict[str, dict[str, str]]) -> None:
        """Cluster mode: the group overrides are the cluster's (from etcd), held in memory only."""
        self.groups = {g: dict(c) for g, c in groups.items()}

    def delete_group(self, group_id: str) -> None:
        """Drop a deleted group's overrides. Raises ApiError(kafka_storage_error) (nothing changed)."""
        if group_id in self.groups:
            self.set_group(group_id, {})


class ProducerIdAllocator:
    """Hands out producer ids; reserves them in blocks so a restart never reuses one."""

    BLOCK = 1000

    def __init__(self, path: Path) -> None:
        self.path = path
        start = 0
        if path.exists():
            start = int(json.loads(path.read_text())["next_block"])
        self._next = start
        self._limit = start

    def allocate(self) -> int:
        """The next producer id. Raises ApiError(coordinator_not_available) if no block can be reserved."""
        if self._next >= self._limit:
            limit = self._next + self.BLOCK
            try:
                atomic_write(self.path, json.dumps({"next_block": limit}).encode())
            except OSError as e:
                raise ApiError(ErrorCode.coordinator_not_available,
                               f"cannot reserve producer ids in {self.path.name}: {e}") from e
            self._limit = limit
        pid = self._next
        self._next += 1
        return pid
