"""The dead-letter writer of share groups (KIP-1191): the I/O half of :mod:`shoal.share.dlq`.

Theory of operation
-------------------
The share service calls :meth:`DeadLetterWriter.write` in a commit round, after it took
a share-partition's :class:`~shoal.share.partition.StateWrite` and before it appends it to
``__share_group_state``. For every record of ``write.dead_letters`` that the source log
still holds (control batches and gaps have none) and that is not on the dead-letter topic
yet, it appends one record to partition ``source partition % partitions`` of the group's
dead-letter topic: the ``__dlq.errors.*`` headers and, with
``errors.deadletterqueue.copy.record.enable``, the source record's key and value (a copy
larger than the topic's ``max.message.bytes`` is written with the headers alone). The
dead-letter partition is fsynced before the method returns, so the dead-letter records
are durable before the ARCHIVED state is: a crash in between leaves records that are on
the dead-letter topic but not archived.

Exactly once. The writer keeps a :class:`~shoal.share.dlq.DeadLetterIndex` of the source
offsets already on each dead-letter partition. The first time it writes to a partition in
this process, it reads that partition whole and indexes the headers of its records; from
then on it adds what it writes. An offset in the index is never written again: not when a
state write that carried it failed and is retried, not when the broker was killed after
the dead-letter append and before the state write, so the record is delivered again (it
is AVAILABLE or ACQUIRED in the persisted state) and archived a second time.

When the write is impossible (the group's topic name starts with ``__`` or lacks
``errors.deadletterqueue.topic.name.prefix``; the topic does not exist and
``errors.deadletterqueue.auto.create.topics.enable`` is false; the topic does not set
``errors.deadletterqueue.group.enable=true``; in cluster mode, this broker does not lead
the dead-letter partition; the topic refuses the records, e.g. ``max.message.bytes``
below a record's headers) the records are archived without dead-letter records, as
Kafka does, and the broker logs a WARNING once per group and reason. A failing append or
fsync raises :class:`~shoal.errors.ApiError`: the share service then fails the state
write (the acknowledgements are rolled back and retried), so nothing is archived that
should have reached the dead-letter topic and did not.

Event loop only; the reads and the fsync run on it (dead-letter traffic is the
exception path of a share group).
"""

from __future__ import annotations

import logging
from typing import Any

from ..errors import ApiError, ErrorCode
from ..protocol.batch import Compression, TimestampType, build_batch, decode_records
from ..share.dlq import (
    DeadLetter,
    DeadLetterIndex,
    dead_letter_headers,
    dead_letter_partition,
    source_of,
    topic_name_problem,
)

log = logging.getLogger("shoal.share.dlq")

__all__ = ["DeadLetterWriter"]

_RECORD_OVERHEAD = 64
"""Bytes a record adds to a batch besides its key, value and headers (a generous bound)."""
_BATCH_OVERHEAD = 61


class DeadLetterWriter:
    def __init__(self, broker: Any) -> None:
        self.broker = broker
        self.index = DeadLetterIndex()
        self._warned: set[tuple[str, str]] = set()
        self.records_written = 0

    # -- configuration -------------------------------------------------------------------
    def _group_value(self, group_id: str, name: str) -> Any:
        return self.broker.dynamic_configs.group_value(group_id, name, self.broker.config)

    def _warn(self, group_id: str, reason: str) -> None:
        if (group_id, reason) not in self._warned:
            self._warned.add((group_id, reason))
            log.warning("share group %s: records archived without dead-letter records: %s", group_id, reason)

    def _topic(self, group_id: str) -> Any:
        """The group's dead-letter topic (created if allowed), or None (nothing to write)."""
        name = str(self._group_value(group_id, "errors.deadletterqueue.topic.name") or "").strip()
        if not name:
            return None
        problem = topic_name_problem(name, str(self.broker.config["errors.deadletterqueue.topic.name.prefix"]))
        if problem is not None:
            self._warn(group_id, problem)
            return None
        store = self.broker.store
        meta = store.get_topic(name)
        if meta is None:
            if not self.broker.config["errors.deadletterqueue.auto.create.topics.enable"]:
                self._warn(group_id, f"dead-letter topic {name!r} does not exist and "
                                     "errors.deadletterqueue.auto.create.topics.enable is false")
                return None
            try:
                meta = self.broker.create_topic(name, int(self.broker.config["num.partitions"]),
                                                {"errors.deadletterqueue.group.enable": "true"})
            except ApiError as e:
                self._warn(group_id, f"creating dead-letter topic {name!r} failed: {e}")
                return None
        if str(meta.configs.get("errors.deadletterqueue.group.enable", "false")).strip().lower() != "true":
            self._warn(group_id, f"topic {name!r} does not set errors.deadletterqueue.group.enable=true")
            return None
        return meta

    # -- the write -------------------------------------------------------------------------
    def write(self, group_id: str, source_topic: str, source_partition: int, spso: int,
              dead_letters: tuple[DeadLetter, ...]) -> int:
        """Write the dead-letter records of one state write, durably; returns how many were written.

        Raises ApiError (KAFKA_STORAGE_ERROR) when the append or the fsync fails.
        """
        self.index.prune(group_id, source_topic, source_partition, spso)
        if not dead_letters:
            return 0
        meta = self._topic(group_id)
        if meta is None:
            return 0
        dlq_index = dead_letter_partition(source_partition, meta.num_partitions)
        key = (meta.name, dlq_index)
        replica = None
        if self.broker.replicas is not None:
            try:
                replica = self.broker.replicas.leader_replica(*key)
            except ApiError:
                self._warn(group_id, f"this broker does not lead dead-letter partition {meta.name}-{dlq_index}")
                return 0
        plog = self.broker.store.partition(*key)
        loaded = (meta.topic_id, dlq_index)
        if not self.index.is_loaded(loaded):
            self._load(plog)
            self.index.mark_loaded(loaded)
        copy = bool(self._group_value(group_id, "errors.deadletterqueue.copy.record.enable"))
        now_ms = int(self.broker.clock.now_ms())
        records: list[tuple[int, tuple[bytes | None, bytes | None, list[tuple[str, bytes]], int]]] = []
        for dl in dead_letters:
            for offset, key_bytes, value in self._source_records(source_topic, source_partition, dl):
                if self.index.contains(group_id, source_topic, source_partition, offset):
                    continue
                headers = dead_letter_headers(source_topic, source_partition, offset, group_id,
                                              dl.delivery_count, dl.cause)
                if not copy:
                    key_bytes = value = None
                records.append((offset, (key_bytes, value, headers, now_ms)))
        max_bytes = plog.config.max_message_bytes
        for chunk in _chunks(records, max_bytes):
            batch = build_batch([r for _o, r in chunk], compression=Compression.NONE,
                                timestamp_type=TimestampType.CREATE_TIME)
            if len(batch) > max_bytes and len(chunk) == 1:  # one copy too big: its headers alone
                _k, _v, h, ts = chunk[0][1]
                batch = build_batch([(None, None, h, ts)])
            try:
                self._append(plog, key, replica, bytearray(batch), now_ms)
            except ApiError as e:
                if e.error_code == ErrorCode.kafka_storage_error:
                    raise
                # The topic refuses these records (max.message.bytes below the headers alone, ...):
                # retrying cannot help, so they are archived without dead-letter records, as in Kafka.
                self._warn(group_id, f"{meta.name}-{dlq_index} refused dead-letter records: {e}")
                records = [r for r in records if r not in chunk]
                continue
            # In the log (readable) now: a retry after a later failure must not append them again.
            for offset, _r in chunk:
                self.index.add(group_id, source_topic, source_partition, offset)
        if records:
            self.records_written += len(records)
            self.broker.append_waiters.notify(*key)
        if plog.unflushed_messages > 0:  # also what an earlier, failed attempt appended
            try:
                plog.flush(now_ms)
            except OSError as e:
                self.broker.storage_errors.failed(key, f"fsync failed: {e}")
                raise ApiError(ErrorCode.kafka_storage_error,
                               f"fsync of {meta.name}-{dlq_index} failed: {e}") from e
        return len(records)

    def _append(self, plog: Any, key: tuple[str, int], replica: Any, batch: bytearray, now_ms: int) -> None:
        try:
            if replica is not None:
                plog.append(batch, now_ms, defer_flush=True, leader_epoch=replica.leader_epoch,
                            timestamp_type=TimestampType.CREATE_TIME)
                self.broker.replicas.maybe_advance_hw(replica)
            else:
                plog.append(batch, now_ms, defer_flush=True, timestamp_type=TimestampType.CREATE_TIME)
        except OSError as e:
            self.broker.storage_errors.failed(key, f"append failed: {e}")
            raise ApiError(ErrorCode.kafka_storage_error, f"dead-letter append failed: {e}") from e
        except ApiError as e:
            if e.error_code == ErrorCode.kafka_storage_error:
                self.broker.storage_errors.failed(key, e.message)
            raise

    def _source_records(self, topic: str, partition: int, dl: DeadLetter):  # type: ignore[no-untyped-def]
        """(offset, key, value) of the data records at offsets ``dl.first_offset..dl.last_offset``."""
        store = self.broker.store
        if store.get_topic(topic) is None:
            return
        plog = store.partition(topic, partition)
        for header, data in plog.read_batches(max(dl.first_offset, plog.log_start_offset)):
            if header.base_offset > dl.last_offset:
                return
            if header.is_control:
                continue
            for rec in decode_records(data, header):
                if dl.first_offset <= rec.offset <= dl.last_offset:
                    yield rec.offset, rec.key, rec.value

    def _load(self, plog: Any) -> None:
        """Index the source offsets named by the records already on a dead-letter partition."""
        n = 0
        for header, data in plog.read_batches(plog.log_start_offset):
            if header.is_control:
                continue
            for rec in decode_records(data, header):
                src = source_of(rec.headers)
                if src is not None:
                    self.index.add(*src)
                    n += 1
        if n:
            log.info("indexed %d dead-letter record(s) of %s", n, plog.dir.name)


def _chunks(records: list[Any], max_bytes: int) -> list[list[Any]]:
    """Split records into runs whose batches stay under ``max_bytes`` (an estimate)."""
    out: list[list[Any]] = []
    size = _BATCH_OVERHEAD
    for r in records:
        k, v, h, _ts = r[1]
        n = _RECORD_OVERHEAD + len(k or b"") + len(v or b"") + sum(len(a) + len(b) + 4 for a, b in h)
        if out and size + n <= max_bytes:
            out[-1].append(r)
            size += n
        else:
            out.append([r])
            size = _BATCH_OVERHEAD + n
    return out
