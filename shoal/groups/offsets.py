"""Committed offsets of every group kind: OffsetCommit, OffsetFetch, OffsetDelete, expiry.

Theory of operation
-------------------
Offsets are pure durable state: ``offsets[group][topic][partition] -> OffsetValue``,
changed only by :meth:`OffsetStore.replay` of OFFSET_COMMIT records (a tombstone
removes one). Handlers validate and return records plus a version-free response dict;
``shoal.groups.manager`` builds the kio entity and routes by group.

Offsets do not care which kind of group they belong to. The group object (classic,
consumer-protocol or share, or None when the group does not exist) answers:

* ``validate_offset_commit(member_id, group_instance_id, generation_or_epoch, api_version,
  partitions=[(topic, partition), ...])``
  -> ErrorCode: a classic group checks member and generation, a consumer-protocol group
  its member epoch (STALE_MEMBER_EPOCH, UNKNOWN_MEMBER_ID ...);
* ``validate_offset_fetch(member_id, member_epoch)`` -> ErrorCode (v9+ carries both);
* ``validate_offset_delete()`` -> ErrorCode; ``is_subscribed_to_topic(topic)`` -> bool;
* ``offset_expiration_base(commit_timestamp_ms)`` -> the time retention counts from,
  or None when the group's offsets cannot expire now (KIP-211);
* ``should_expire()`` and ``tombstone_records()``: whether an offset-less group is
  deleted by the retention check, and the records deleting it.

A commit with generation -1 to a group that does not exist is accepted (admin tools and
``assign()`` consumers); replaying it creates a "simple" classic group (the manager does
that). Pure: no clock, no I/O; event loop only.

Transactional offsets (TxnOffsetCommit): the same OFFSET_COMMIT records, appended in a
transactional batch of the producer, are replayed into ``pending[producer_id]`` and are
not visible to OffsetFetch; the transaction's commit marker moves them into
``offsets`` (:meth:`OffsetStore.complete_transaction`), an abort marker drops them.
While any are pending for a partition, an OffsetFetch with ``require_stable`` answers
UNSTABLE_OFFSET_COMMIT for it (KIP-447).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from kio.schema.errors import ErrorCode

from shoal.coordinator.records import CoordinatorRecord

from .records import OffsetValue, decode_offset_commit, offset_commit_record, offset_commit_tombstone

__all__ = ["OFFSET_METADATA_MAX_BYTES", "CommitPartition", "OffsetStore"]

OFFSET_METADATA_MAX_BYTES = 4096
"""Kafka's offset.metadata.max.bytes default."""


@dataclass(frozen=True, slots=True)
class CommitPartition:
    partition: int
    offset: int
    leader_epoch: int = -1
    metadata: str | None = None


def _topics_response(topics: Iterable[tuple[str, Iterable[int]]], code_of) -> list[dict[str, Any]]:
    return [
        {"name": name, "partitions": [{"partition_index": p, "error_code": code_of(name, p)} for p in parts]}
        for name, parts in topics
    ]


class OffsetStore:
    """All committed offsets of one ``__consumer_offsets`` partition."""

    def __init__(self, metadata_max_bytes: int = OFFSET_METADATA_MAX_BYTES) -> None:
        self.offsets: dict[str, dict[str, dict[int, OffsetValue]]] = {}
        self.metadata_max_bytes = metadata_max_bytes
        self.pending: dict[int, dict[tuple[str, str, int], CoordinatorRecord]] = {}
        """Producer id -> (group, topic, partition) -> its transactional OFFSET_COMMIT record."""

    def pending_for(self, group_id: str, topic: str, partition: int) -> bool:
        return any((group_id, topic, partition) in by_key for by_key in self.pending.values())

    def replay_pending(self, rec: CoordinatorRecord, producer_id: int) -> str:
        """A transactional OFFSET_COMMIT record of ``producer_id``: pending until its marker."""
        group_id, topic, partition, _value = decode_offset_commit(rec)
        self.pending.setdefault(producer_id, {})[(group_id, topic, partition)] = rec
        return group_id

    def complete_transaction(self, producer_id: int, commit: bool) -> list[str]:
        """The marker of ``producer_id``'s transaction: apply (commit) or drop its pending
        offsets; returns the group ids whose offsets were applied."""
        by_key = self.pending.pop(producer_id, None)
        if not by_key or not commit:
            return []
        return [self.replay(rec) for rec in by_key.values()]

    # ------------------------------------------------------------------ reads
    def get(self, group_id: str, topic: str, partition: int) -> OffsetValue | None:
        return self.offsets.get(group_id, {}).get(topic, {}).get(partition)

    def has_offsets(self, group_id: str) -> bool:
        return bool(self.offsets.get(group_id))

    def group_ids(self) -> list[str]:
        return list(self.offsets)

    # ------------------------------------------------------------ OffsetCommit
    def commit(
        self,
        group_id: str,
        group: Any | None,
        *,
        member_id: str,
        group_instance_id: str | None,
        generation_id: int,
        api_version: int,
        topics: list[tuple[str, list[CommitPartition]]],
        retention_ms: int,
        now_ms: int,
    ) -> tuple[list[CoordinatorRecord], dict[str, Any]]:
        """Validate a commit; (records, response fields). Nothing is changed until replay."""
        if not group_id:
            err = ErrorCode.invalid_group_id
        elif group is None:
            if generation_id < 0:
                err = ErrorCode.none
            else:
                # v9+ says what is wrong; older clients expect ILLEGAL_GENERATION.
                err = ErrorCode.group_id_not_found if api_version >= 9 else ErrorCode.illegal_generation
        else:
            err = group.validate_offset_commit(member_id, group_instance_id, generation_id, api_version,
                                               partitions=[(name, p.partition) for name, parts in topics for p in parts])
        shape = [(name, [p.partition for p in parts]) for name, parts in topics]
        if err is not ErrorCode.none:
            return [], {"topics": _topics_response(shape, lambda t, p: err)}
        records: list[CoordinatorRecord] = []
        codes: dict[tuple[str, int], ErrorCode] = {}
        expire = now_ms + retention_ms if retention_ms is not None and retention_ms >= 0 else -1
        for name, parts in topics:
            for p in parts:
                meta = p.metadata or ""
                if len(meta.encode()) > self.metadata_max_bytes:
                    codes[(name, p.partition)] = ErrorCode.offset_metadata_too_large
                    continue
                codes[(name, p.partition)] = ErrorCode.none
                value = OffsetValue(p.offset, p.leader_epoch, meta, now_ms, expire)
                records.append(offset_commit_record(group_id, name, p.partition, value))
        return records, {"topics": _topics_response(shape, lambda t, p: codes[(t, p)])}

    # ------------------------------------------------------------- OffsetFetch
    def fetch(
        self,
        group_id: str,
        group: Any | None,
        *,
        member_id: str | None = None,
        member_epoch: int = -1,
        topics: list[tuple[str, list[int]]] | None,
        require_stable: bool = False,
    ) -> dict[str, Any]:
        """One group's answer: {group_id, error_code, topics}; -1 for partitions without offsets.

        ``topics`` None means every committed partition of the group. With
        ``require_stable``, a partition with pending transactional offsets answers
        UNSTABLE_OFFSET_COMMIT (offset -1) instead.
        """
        if group is not None:
            err = group.validate_offset_fetch(member_id, member_epoch)
            if err is not ErrorCode.none:
                return {"group_id": group_id, "error_code": err, "topics": []}
        stored = self.offsets.get(group_id, {})
        if topics is None:
            topics = [(t, sorted(parts)) for t, parts in sorted(stored.items())]
        out = []
        for name, parts in topics:
            rows = []
            for p in parts:
                v = stored.get(name, {}).get(p)
                if require_stable and self.pending and self.pending_for(group_id, name, p):
                    rows.append({"partition_index": p, "committed_offset": -1, "committed_leader_epoch": -1,
                                 "metadata": "", "error_code": ErrorCode.unstable_offset_commit})
                    continue
                rows.append(
                    {
                        "partition_index": p,
                        "committed_offset": v.offset if v else -1,
                        "committed_leader_epoch": v.leader_epoch if v else -1,
                        "metadata": v.metadata if v else "",
                        "error_code": ErrorCode.none,
                    }
                )
            out.append({"name": name, "partitions": rows})
        return {"group_id": group_id, "error_code": ErrorCode.none, "topics": out}

    # ------------------------------------------------------------ OffsetDelete
    def delete(
        self, group_id: str, group: Any | None, topics: list[tuple[str, list[int]]]
    ) -> tuple[list[CoordinatorRecord], dict[str, Any]]:
        if group is None:
            return [], {"error_code": ErrorCode.group_id_not_found, "topics": []}
        err = group.validate_offset_delete()
        if err is not ErrorCode.none:
            return [], {"error_code": err, "topics": []}
        records = []
        codes: dict[tuple[str, int], ErrorCode] = {}
        for name, parts in topics:
            subscribed = group.is_subscribed_to_topic(name)
            for p in parts:
                if subscribed:
                    codes[(name, p)] = ErrorCode.group_subscribed_to_topic
                    continue
                codes[(name, p)] = ErrorCode.none
                if self.get(group_id, name, p) is not None:
                    records.append(offset_commit_tombstone(group_id, name, p))
        return records, {"error_code": ErrorCode.none, "topics": _topics_response(topics, lambda t, p: codes[(t, p)])}

    # ------------------------------------------------------------ bulk deletes
    def tombstones_for_group(self, group_id: str) -> list[CoordinatorRecord]:
        return [
            offset_commit_tombstone(group_id, t, p)
            for t, parts in sorted(self.offsets.get(group_id, {}).items())
            for p in sorted(parts)
        ]

    def tombstones_for_topics(self, topics: Iterable[str]) -> list[CoordinatorRecord]:
        wanted = set(topics)
        return [
            offset_commit_tombstone(g, t, p)
            for g, by_topic in sorted(self.offsets.items())
            for t, parts in sorted(by_topic.items())
            if t in wanted
            for p in sorted(parts)
        ]

    def expired(self, group_id: str, group: Any | None, now_ms: int, retention_ms: int) -> tuple[list[CoordinatorRecord], bool]:
        """Tombstones of the group's expired offsets, and whether no offset is left."""
        records = []
        left = 0
        for topic, parts in sorted(self.offsets.get(group_id, {}).items()):
            subscribed = group is not None and group.is_subscribed_to_topic(topic)
            for p, v in sorted(parts.items()):
                base = v.commit_timestamp if group is None else group.offset_expiration_base(v.commit_timestamp)
                if subscribed or base is None:
                    left += 1
                    continue
                if (now_ms >= v.expire_timestamp) if v.expire_timestamp >= 0 else (now_ms - base >= retention_ms):
                    records.append(offset_commit_tombstone(group_id, topic, p))
                else:
                    left += 1
        return records, left == 0

    # ------------------------------------------------------------------ replay
    def replay(self, rec: CoordinatorRecord) -> str:
        """Apply an OFFSET_COMMIT record (or tombstone); returns its group id."""
        group_id, topic, partition, value = decode_offset_commit(rec)
        if value is None:
            by_topic = self.offsets.get(group_id)
            if by_topic is not None and topic in by_topic:
                by_topic[topic].pop(partition, None)
                if not by_topic[topic]:
                    del by_topic[topic]
                if not by_topic:
                    del self.offsets[group_id]
        else:
            self.offsets.setdefault(group_id, {}).setdefault(topic, {})[partition] = value
        return group_id
