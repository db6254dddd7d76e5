"""The coordinator runtime: pure shards over the partitions of an internal topic.

Theory of operation
-------------------
A coordinator (the group coordinator on ``__consumer_offsets``, the share coordinator
on ``__share_group_state``) is split into one *shard* per partition of its internal
topic. A shard is a pure state machine (``shoal.groups.manager``,
``shoal.share.coordinator``) with request handlers that return a
:class:`~shoal.coordinator.result.Result` and a ``replay(record)`` method.

``CoordinatorRuntime.apply(partition, result)`` makes a result durable, in this order:
encode its records into one uncompressed batch, append it to the partition's log,
fsync, then replay every record into the shard. Only after that does the caller send
the response. Everything happens on the event loop without awaiting, so no other
operation on the shard can interleave between computing a result and applying it:
one shard's operations are serial, as Kafka's runtime guarantees with its queue.
If the append fails, nothing is replayed and ``apply`` raises; the shard is unchanged.

At start, ``load`` creates the topic if needed (compacted unless ``topic_configs`` says
otherwise, Kafka's partition count key) and replays every record at or above the log
start offset of every partition into a fresh shard, batch by batch. With
``replay_offsets=True`` the shard's ``replay`` also gets each record's offset (the
share coordinator uses it to tell which records are superseded).
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from ..coordinator.records import CoordinatorRecord
from ..coordinator.result import Result
from ..errors import ApiError, ErrorCode
from ..protocol.batch import build_batch, decode_records

log = logging.getLogger("shoal.runtime")

S = TypeVar("S")

__all__ = ["CoordinatorRuntime", "java_string_hash"]


def java_string_hash(text: str) -> int:
    """Java's ``String.hashCode``, so group ids map to partitions as in Kafka."""
    h = 0
    for ch in text.encode("utf-16-be").decode("utf-16-be"):
        code = ord(ch)
        if code > 0xFFFF:  # a surrogate pair in Java
            code -= 0x10000
            for unit in (0xD800 + (code >> 10), 0xDC00 + (code & 0x3FF)):
                h = (31 * h + unit) & 0xFFFFFFFF
        else:
            h = (31 * h + code) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


class CoordinatorRuntime(Generic[S]):
    def __init__(self, broker: Any, topic: str, num_partitions_key: str, new_shard: Callable[[int], S], *,
                 topic_configs: dict[str, str] | None = None, replay_offsets: bool = False) -> None:
        self.broker = broker
        self.topic = topic
        self.topic_configs = dict(topic_configs) if topic_configs is not None else {"cleanup.policy": "compact"}
        self.replay_offsets = replay_offsets
        self._num_partitions_key = num_partitions_key
        self._new_shard = new_shard
        self.shards: list[S] = []

    @property
    def num_partitions(self) -> int:
        return len(self.shards)

    def partition_for_group(self, group_id: str) -> int:
        h = java_string_hash(group_id)
        return (h & 0x7FFFFFFF) % len(self.shards)

    def partition_for_key(self, key: str) -> int:
        """Stable partition of an arbitrary key (share-partition keys)."""
        return zlib.crc32(key.encode()) % len(self.shards)

    def load(self) -> None:
        store = self.broker.store
        meta = store.get_topic(self.topic)
        if meta is None:
            n = self.broker.config[self._num_partitions_key]
            meta = store.create_topic(self.topic, n, self.topic_configs, now_ms=self.broker.clock.now_ms())
        self.shards = [self._new_shard(i) for i in range(meta.num_partitions)]
        total = 0
        for i, shard in enumerate(self.shards):
            plog = store.partition(self.topic, i)
            for header, data in plog.read_batches(plog.log_start_offset):
                if header.is_control:
                    continue
                for rec in decode_records(data, header):
                    if rec.key is None or rec.offset < plog.log_start_offset:
                        continue
                    try:
                        record = CoordinatorRecord.from_bytes(rec.key, rec.value)
                    except ValueError:
                        log.error("%s-%d: skipping undecodable record at offset %d", self.topic, i, rec.offset)
                        continue
                    if self.replay_offsets:
                        shard.replay(record, rec.offset)  # type: ignore[attr-defined]
                    else:
                        shard.replay(record)  # type: ignore[attr-defined]
                    total += 1
            on_loaded = getattr(shard, "on_loaded", None)
            if on_loaded is not None:
                on_loaded(self.broker.clock.now_ms())
        log.info("%s: replayed %d records into %d shard(s)", self.topic, total, len(self.shards))

    def apply(self, partition: int, result: Result[Any]) -> Result[Any]:
        """Append ``result.records`` durably, then replay them into the shard.

        Returns ``result``. Raises ApiError(COORDINATOR_NOT_AVAILABLE) if the write fails
        (nothing replayed).
        """
        if not result.records:
            return result
        now_ms = self.broker.clock.now_ms()
        pairs = [r.to_bytes() for r in result.records]
        batch = build_batch([(k, v, (), now_ms) for k, v in pairs])
        plog = self.broker.store.partition(self.topic, partition)
        try:
            appended = plog.append(batch, now_ms)
            if not appended.durable:
                plog.flush(now_ms)
        except (ApiError, OSError) as e:
            log.error("%s-%d: cannot write coordinator records: %s", self.topic, partition, e)
            raise ApiError(ErrorCode.coordinator_not_available, "coordinator state could not be written") from e
        shard = self.shards[partition]
        for i, record in enumerate(result.records):
            if self.replay_offsets:
                shard.replay(record, appended.base_offset + i)  # type: ignore[attr-defined]
            else:
                shard.replay(record)  # type: ignore[attr-defined]
        return result

    def run(self, partition: int, operation: Callable[[S], Result[Any]]) -> Result[Any]:
        """Compute ``operation(shard)`` and apply its result; returns the result."""
        return self.apply(partition, operation(self.shards[partition]))
