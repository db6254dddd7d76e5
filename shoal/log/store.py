"""LogStore: the data directory, topic metadata, and the partition logs (file I/O).

Theory of operation
-------------------
Layout of the data directory::

    topics.json            every topic: name, topic_id, partition count, config overrides
    <topic>-<partition>/   one PartitionLog each (Kafka's naming)

``topics.json`` is the source of truth and is replaced atomically (temp file, fsync,
rename, fsync directory) on every change, so a crash leaves the old or the new set of
topics.  Deleting a topic first rewrites the metadata, then renames each partition
directory to ``*.deleted`` and removes it; leftovers of a crash in between are removed
at the next start.  Directories not named in the metadata are left alone.

Topic config overrides are kept as the strings given (as Kafka shows them) and are
checked with :func:`shoal.config.parse_value`; a partition's effective settings come from
:meth:`LogConfig.resolve` (override, else broker ``log.*`` key).

:func:`validate_topic_name` is pure.  Concurrency: event loop only, never awaits.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shoal.config import CONFIG_DEFS, BrokerConfig, ConfigError, check_topic_key, parse_value
from shoal.errors import ApiError, ErrorCode
from shoal.log.partition_log import LOG_START_FILE, PartitionLog, atomic_write
from shoal.log.policy import LogConfig
from shoal.log.segment import OpenSegments

__all__ = ["MAX_TOPIC_NAME_LENGTH", "LogStore", "TopicInfo", "validate_topic_configs", "validate_topic_name"]

_log = logging.getLogger("shoal.log")

MAX_TOPIC_NAME_LENGTH = 249
_LEGAL = re.compile(r"^[a-zA-Z0-9._-]+$")
METADATA_FILE = "topics.json"


def validate_topic_name(name: str) -> None:
    """Raise ApiError(invalid_topic_exception) unless ``name`` is a legal Kafka topic name."""
    if not name:
        raise ApiError(ErrorCode.invalid_topic_exception, "topic name is empty")
    if name in (".", ".."):
        raise ApiError(ErrorCode.invalid_topic_exception, f"topic name cannot be {name!r}")
    if len(name) > MAX_TOPIC_NAME_LENGTH:
        raise ApiError(ErrorCode.invalid_topic_exception,
                       f"topic name is longer than {MAX_TOPIC_NAME_LENGTH} characters")
    if not _LEGAL.match(name):
        raise ApiError(ErrorCode.invalid_topic_exception,
                       f"topic name {name!r} has characters other than ASCII alphanumerics, '.', '_' and '-'")


def validate_topic_configs(configs: dict[str, Any]) -> dict[str, Any]:
    """Parse topic config overrides; returns name -> typed value.

    Raises ApiError(invalid_config) for a key that is not a topic config or a bad value.
    """
    parsed = {}
    for k, v in configs.items():
        try:
            d = check_topic_key(k)
            parsed[k] = parse_value(k, v)
            syn = CONFIG_DEFS.get(d.broker_synonym or "")
            if syn is not None and syn.type is d.type:
                parse_value(syn.name, parsed[k])  # the broker key's range check applies too
        except ConfigError as exc:
            raise ApiError(ErrorCode.invalid_config, str(exc)) from None
    for policy in parsed.get("cleanup.policy", []):
        if policy not in ("delete", "compact"):
            raise ApiError(ErrorCode.invalid_config, f"invalid cleanup.policy {policy!r}")
    return parsed


@dataclass(slots=True)
class TopicInfo:
    name: str
    topic_id: uuid.UUID
    num_partitions: int
    configs: dict[str, str] = field(default_factory=dict)
    """Overrides as given (strings); the effective values come from LogStore.log_config."""

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "topic_id": str(self.topic_id), "num_partitions": self.num_partitions,
                "configs": self.configs}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> TopicInfo:
        return cls(d["name"], uuid.UUID(d["topic_id"]), int(d["num_partitions"]), dict(d.get("configs", {})))


class LogStore:
    """Topics and their partition logs under one data directory."""

    def __init__(self, data_dir: Path, config: BrokerConfig, *, now_ms: int = 0,
                 files: OpenSegments | None = None) -> None:
        self.data_dir = Path(data_dir)
        self.config = config
        self.files = files if files is not None else OpenSegments()
        """Every partition's segments share this LRU of open descriptors (sized from RLIMIT_NOFILE)."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._topics: dict[str, TopicInfo] = {}
        self._by_id: dict[uuid.UUID, TopicInfo] = {}
        self._logs: dict[tuple[str, int], PartitionLog] = {}
        self.metadata_version = 0
        """Bumped on every change Metadata responses show (topics created or deleted,
        partitions added; leaders, once there are several brokers), through
        ``bump_metadata_version``: caches of Metadata responses are keyed by it."""
        self._topic_changed: dict[str, int] = {}
        self._all_changed = 0
        for p in self.data_dir.iterdir():
            if p.name.endswith(".deleted") and p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
        meta = self.data_dir / METADATA_FILE
        if meta.exists():
            for d in json.loads(meta.read_text())["topics"]:
                t = TopicInfo.from_json(d)
                self._topics[t.name] = t
                self._by_id[t.topic_id] = t
        for t in self._topics.values():
            cfg = self.log_config(t.name)
            for i in range(t.num_partitions):
                d = self._partition_dir(t.name, i)
                if not d.is_dir():
                    # Older versions wrote the metadata before the partition directories, so a
                    # creation that failed half-way left a topic without some of them.
                    _log.warning("partition %s-%d has no directory %s (a topic creation or a partition "
                                 "increase that did not finish); creating it empty", t.name, i, d)
                try:
                    self._logs[(t.name, i)] = PartitionLog.open(d, cfg, now_ms=now_ms, files=self.files)
                except OSError as e:
                    self.close()
                    raise OSError(e.errno, f"cannot open partition {t.name}-{i} in {d}: {e.strerror or e}") from e

    # --- metadata --------------------------------------------------------------------------
    def _partition_dir(self, topic: str, index: int) -> Path:
        return self.data_dir / f"{topic}-{index}"

    def _save(self) -> None:
        data = json.dumps({"version": 1, "topics": [t.to_json() for t in self._topics.values()]},
                          indent=1, sort_keys=True).encode()
        atomic_write(self.data_dir / METADATA_FILE, data)

    def log_config(self, topic: str) -> LogConfig:
        t = self._require(topic)
        return LogConfig.resolve(self.config, validate_topic_configs(t.configs))

    def _require(self, name: str) -> TopicInfo:
        t = self._topics.get(name)
        if t is None:
            raise ApiError(ErrorCode.unknown_topic_or_partition, f"unknown topic {name!r}")
        return t

    def bump_metadata_version(self, topic: str | None = None) -> None:
        """Record a change Metadata shows: of ``topic`` only, or (None) of everything.

        Call it on any topic, partition, leader or broker change; cached Metadata views
        compare ``metadata_version`` and ``topic_metadata_version`` with what they saw.
        """
        self.metadata_version += 1
        if topic is None:
            self._all_changed = self.metadata_version
        else:
            self._topic_changed[topic] = self.metadata_version

    def topic_metadata_version(self, name: str) -> int:
        """The ``metadata_version`` of the last change that touched topic ``name``."""
        return max(self._all_changed, self._topic_changed.get(name, 0))

    def get_topic(self, name: str) -> TopicInfo | None:
        return self._topics.get(name)

    def topic_by_id(self, topic_id: uuid.UUID) -> TopicInfo | None:
        return self._by_id.get(topic_id)

    def topics(self) -> list[TopicInfo]:
        return list(self._topics.values())

    # --- admin -----------------------------------------------------------------------------
    def create_topic(self, name: str, num_partitions: int, configs: dict[str, str] | None = None,
                     topic_id: uuid.UUID | None = None, *, validate_only: bool = False,
                     now_ms: int = 0) -> TopicInfo:
        """Create a topic and its partition directories.

        Raises ApiError: invalid_topic_exception (name), topic_already_exists,
        invalid_partitions (count < 1), invalid_config (key or value).
        """
        validate_topic_name(name)
        if name in self._topics:
            raise ApiError(ErrorCode.topic_already_exists, f"topic {name!r} already exists")
        if num_partitions < 1:
            raise ApiError(ErrorCode.invalid_partitions, "the number of partitions must be at least 1")
        configs = {k: str(v) for k, v in (configs or {}).items()}
        parsed = validate_topic_configs(configs)
        cfg = LogConfig.resolve(self.config, parsed)
        if topic_id is None:
            topic_id = uuid.uuid4()
        t = TopicInfo(name, topic_id, num_partitions, configs)
        if validate_only:
            return t
        logs = self._open_new_partitions(name, range(num_partitions), cfg, now_ms)
        self._topics[name] = t
        self._by_id[topic_id] = t
        self.bump_metadata_version(name)
        try:
            self._save()
        except OSError as e:
            del self._topics[name]
            del self._by_id[topic_id]
            self._discard(logs)
            raise ApiError(ErrorCode.kafka_storage_error, f"cannot create topic {name!r}: {e}") from e
        self._logs.update(logs)
        return t

    def _open_new_partitions(self, name: str, indexes: range, cfg: LogConfig,
                             now_ms: int) -> dict[tuple[str, int], PartitionLog]:
        """Create empty partition logs; all of them, or none (ApiError(kafka_storage_error)).

        They become part of the topic only once the metadata naming them is written, so a
        failure here (no space, no descriptors) or a crash leaves no half-created topic:
        directories not in the metadata are ignored, and replaced by the next creation.
        """
        logs: dict[tuple[str, int], PartitionLog] = {}
        try:
            for i in indexes:
                d = self._partition_dir(name, i)
                if d.exists():  # a stale directory not in the metadata: start afresh
                    shutil.rmtree(d)
                logs[(name, i)] = PartitionLog.open(d, cfg, now_ms=now_ms, files=self.files, sync_parent=False)
            # the new directories' entries, all in the data directory, made durable at once
            self.files.fsync_dir(self.data_dir)
        except OSError as e:
            self._discard(logs)
            for i in indexes:
                shutil.rmtree(self._partition_dir(name, i), ignore_errors=True)
            raise ApiError(ErrorCode.kafka_storage_error,
                           f"cannot create the partitions of topic {name!r}: {e}") from e
        return logs

    def _discard(self, logs: dict[tuple[str, int], PartitionLog]) -> None:
        for (name, i), plog in logs.items():
            plog.delete()
            shutil.rmtree(self._partition_dir(name, i), ignore_errors=True)

    def delete_topic(self, name: str) -> None:
        """Remove a topic and its files.  Raises ApiError(unknown_topic_or_partition)."""
        t = self._require(name)
        del self._topics[name]
        self._by_id.pop(t.topic_id, None)
        self.bump_metadata_version(name)
        try:
            self._save()
        except OSError as e:
            self._topics[name] = t
            self._by_id[t.topic_id] = t
            raise ApiError(ErrorCode.kafka_storage_error, f"cannot delete topic {name!r}: {e}") from e
        for i in range(t.num_partitions):
            log = self._logs.pop((name, i), None)
            if log is not None:
                log.delete()
            d = self._partition_dir(name, i)
            if d.exists():
                gone = d.with_name(f"{d.name}.{t.topic_id.hex}.deleted")
                d.rename(gone)
                shutil.rmtree(gone, ignore_errors=True)

    def create_partitions(self, name: str, total: int, *, validate_only: bool = False, now_ms: int = 0) -> TopicInfo:
        """Grow a topic to ``total`` partitions.  Raises ApiError(invalid_partitions) unless it grows."""
        t = self._require(name)
        if total <= t.num_partitions:
            raise ApiError(ErrorCode.invalid_partitions,
                           f"topic {name!r} has {t.num_partitions} partitions; {total} would not add any")
        if validate_only:
            return t
        cfg = self.log_config(name)
        old = t.num_partitions
        logs = self._open_new_partitions(name, range(old, total), cfg, now_ms)
        t.num_partitions = total
        self.bump_metadata_version(name)
        try:
            self._save()
        except OSError as e:
            t.num_partitions = old
            self._discard(logs)
            raise ApiError(ErrorCode.kafka_storage_error, f"cannot add partitions to topic {name!r}: {e}") from e
        self._logs.update(logs)
        return t

    def alter_topic_configs(self, name: str, set: dict[str, str] | None = None,
                            delete: list[str] | None = None, *, validate_only: bool = False) -> TopicInfo:
        """Set and remove config overrides.  Raises ApiError(invalid_config | unknown_topic_or_partition)."""
        t = self._require(name)
        new = dict(t.configs)
        for k in delete or []:
            if k not in new:
                try:
                    check_topic_key(k)
                except ConfigError as e:
                    raise ApiError(ErrorCode.invalid_config, str(e)) from None
            new.pop(k, None)
        new.update({k: str(v) for k, v in (set or {}).items()})
        parsed = validate_topic_configs(new)
        if validate_only:
            return t
        old, t.configs = t.configs, new
        try:
            self._save()
        except OSError as e:
            t.configs = old
            raise ApiError(ErrorCode.kafka_storage_error, f"cannot change the configs of topic {name!r}: {e}") from e
        cfg = LogConfig.resolve(self.config, parsed)
        for i in range(t.num_partitions):
            self._logs[(name, i)].update_config(cfg)
        return t

    def empty_partition(self, topic: str, index: int, *, start_offset: int = 0, now_ms: int = 0) -> PartitionLog:
        """Replace a partition's log by an empty one starting at ``start_offset`` (cluster mode:
        this broker stopped being one of its replicas, or follows a leader whose log starts
        later than its own log ends). Raises ApiError(unknown_topic_or_partition | kafka_storage_error)."""
        t = self._require(topic)
        old = self.partition(topic, index)
        del self._logs[(topic, index)]
        old.delete()
        d = self._partition_dir(topic, index)
        try:
            if d.exists():
                gone = d.with_name(f"{d.name}.{t.topic_id.hex}.deleted")
                shutil.rmtree(gone, ignore_errors=True)
                d.rename(gone)
                shutil.rmtree(gone, ignore_errors=True)
            d.mkdir(parents=True)
            if start_offset > 0:
                atomic_write(d / LOG_START_FILE, str(start_offset).encode())
            new = PartitionLog.open(d, self.log_config(topic), now_ms=now_ms, files=self.files)
        except OSError as e:
            raise ApiError(ErrorCode.kafka_storage_error, f"cannot empty partition {topic}-{index}: {e}") from e
        self._logs[(topic, index)] = new
        return new

    # --- partitions --------------------------------------------------------------------------
    def partition(self, topic: str, index: int) -> PartitionLog:
        """The log of one partition.  Raises ApiError(unknown_topic_or_partition)."""
        log = self._logs.get((topic, index))
        if log is None:
            raise ApiError(ErrorCode.unknown_topic_or_partition, f"unknown partition {topic}-{index}")
        return log

    def partitions(self):
        """Yield ((topic, index), PartitionLog) for every partition."""
        return iter(list(self._logs.items()))

    def run_maintenance(self, now_ms: int) -> dict[tuple[str, int], OSError | None]:
        """Retention, compaction and time-based flushes of every partition (call periodically).

        Returns each partition's outcome: None, or the OSError that stopped its maintenance
        (a full disk); the other partitions' maintenance runs regardless.
        """
        outcomes: dict[tuple[str, int], OSError | None] = {}
        for key, log in list(self._logs.items()):
            try:
                log.run_maintenance(now_ms)
                outcomes[key] = None
            except OSError as e:
                outcomes[key] = e
        return outcomes

    def flush_all(self, now_ms: int | None = None) -> None:
        for log in self._logs.values():
            log.flush(now_ms)

    def close(self) -> bool:
        """Flush and close every partition; returns whether every one was flushed.

        A partition that cannot be flushed (full disk, deleted directory) is logged with
        the cause and closed anyway, so closing always ends.
        """
        ok = True
        for (topic, index), plog in self._logs.items():
            try:
                plog.close()
            except OSError as e:
                ok = False
                _log.error("partition %s-%d: could not flush at close: %s", topic, index, e)
        self._logs.clear()
        return ok
