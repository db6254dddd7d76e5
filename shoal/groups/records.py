"""Field layouts of the group coordinator's records on ``__consumer_offsets``.

Theory of operation
-------------------
``shoal.coordinator.records`` writes a record in Kafka's binary layout
(``shoal.coordinator.schemas``). This module fills the two record types owned by the
classic coordinator, Kafka's ``OffsetCommitKey/Value`` and ``GroupMetadataKey/Value``
(field names in snake_case):

* ``OFFSET_COMMIT`` (type 1), key ``{group, topic, partition}``, value version 3:
  ``offset``, ``leader_epoch`` (-1 if unknown), ``metadata``, ``commit_timestamp``;
  version 1, as Kafka writes it, when an OffsetCommit v2-v4 carried a retention time:
  ``expire_timestamp`` instead of ``leader_epoch`` (which then reads back as -1).
  A tombstone deletes the committed offset.
* ``GROUP_METADATA`` (type 2), key ``{group}``, value version 3: ``protocol_type``,
  ``generation``, ``protocol`` (selected protocol or None), ``leader`` (or None),
  ``current_state_timestamp`` and ``members``: for each member its ids, client id/host,
  timeouts, the subscription (its metadata for the selected protocol) and assignment.
  Kafka writes this record when a generation's assignment is stored (leader's
  SyncGroup), when a generation ends empty, and when a static member is replaced; a
  tombstone deletes the group.

The record types of consumer-protocol and share groups (3-15) belong to their modules.
Pure: encoding only, no state.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

from shoal.coordinator.records import CoordinatorRecord, RecordType, record, tombstone

__all__ = [
    "GROUP_METADATA_VALUE_VERSION",
    "OFFSET_COMMIT_EXPIRING_VALUE_VERSION",
    "OFFSET_COMMIT_VALUE_VERSION",
    "GroupValue",
    "MemberValue",
    "OffsetValue",
    "decode_group_metadata",
    "decode_offset_commit",
    "group_metadata_record",
    "group_metadata_tombstone",
    "offset_commit_record",
    "offset_commit_tombstone",
]

OFFSET_COMMIT_VALUE_VERSION = 3
OFFSET_COMMIT_EXPIRING_VALUE_VERSION = 1
"""The only OffsetCommitValue version with ``expireTimestamp``."""
GROUP_METADATA_VALUE_VERSION = 3


def _bytes(value: bytes | str | None) -> bytes:
    """A bytes field: bytes from a binary record, base64 text from a legacy JSON one."""
    if value is None:
        return b""
    if isinstance(value, str):
        return base64.b64decode(value.encode("ascii"))
    return bytes(value)


@dataclass(frozen=True, slots=True)
class OffsetValue:
    """One committed offset, as stored."""

    offset: int
    leader_epoch: int
    metadata: str
    commit_timestamp: int
    expire_timestamp: int = -1
    """Absolute expiry time from an explicit retention time (OffsetCommit v2-v4), else -1."""


@dataclass(frozen=True, slots=True)
class MemberValue:
    """One member of a classic group, as Kafka's GroupMetadataValue keeps it."""

    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout: int
    session_timeout: int
    subscription: bytes
    """The member's metadata for the group's selected protocol."""
    assignment: bytes


@dataclass(frozen=True, slots=True)
class GroupValue:
    protocol_type: str
    generation: int
    protocol: str | None
    leader: str | None
    current_state_timestamp: int
    members: tuple[MemberValue, ...]


def offset_commit_record(group_id: str, topic: str, partition: int, value: OffsetValue) -> CoordinatorRecord:
    return record(
        RecordType.OFFSET_COMMIT,
        {"group": group_id, "topic": topic, "partition": partition},
        {
            "offset": value.offset,
            "leader_epoch": value.leader_epoch,
            "metadata": value.metadata,
            "commit_timestamp": value.commit_timestamp,
            "expire_timestamp": value.expire_timestamp,
        },
        OFFSET_COMMIT_VALUE_VERSION if value.expire_timestamp == -1 else OFFSET_COMMIT_EXPIRING_VALUE_VERSION,
    )


def offset_commit_tombstone(group_id: str, topic: str, partition: int) -> CoordinatorRecord:
    return tombstone(RecordType.OFFSET_COMMIT, {"group": group_id, "topic": topic, "partition": partition})


def decode_offset_commit(rec: CoordinatorRecord) -> tuple[str, str, int, OffsetValue | None]:
    """(group, topic, partition, value or None for a tombstone) of an OFFSET_COMMIT record.

    Also reads Kafka's legacy type 0, whose key has the same fields.
    """
    k = rec.key
    if rec.value is None:
        return k["group"], k["topic"], int(k["partition"]), None
    v = rec.value
    return k["group"], k["topic"], int(k["partition"]), OffsetValue(
        offset=int(v["offset"]),
        leader_epoch=int(v.get("leader_epoch", -1)),
        metadata=v.get("metadata") or "",
        commit_timestamp=int(v.get("commit_timestamp", 0)),
        expire_timestamp=int(v.get("expire_timestamp", -1)),
    )


def group_metadata_record(group_id: str, value: GroupValue) -> CoordinatorRecord:
    return record(
        RecordType.GROUP_METADATA,
        {"group": group_id},
        {
            "protocol_type": value.protocol_type,
            "generation": value.generation,
            "protocol": value.protocol,
            "leader": value.leader,
            "current_state_timestamp": value.current_state_timestamp,
            "members": [
                {
                    "member_id": m.member_id,
                    "group_instance_id": m.group_instance_id,
                    "client_id": m.client_id,
                    "client_host": m.client_host,
                    "rebalance_timeout": m.rebalance_timeout,
                    "session_timeout": m.session_timeout,
                    "subscription": m.subscription,
                    "assignment": m.assignment,
                }
                for m in value.members
            ],
        },
        GROUP_METADATA_VALUE_VERSION,
    )


def group_metadata_tombstone(group_id: str) -> CoordinatorRecord:
    return tombstone(RecordType.GROUP_METADATA, {"group": group_id})


def decode_group_metadata(rec: CoordinatorRecord) -> tuple[str, GroupValue | None]:
    """(group id, value or None for a tombstone) of a GROUP_METADATA record."""
    group_id = rec.key["group"]
    if rec.value is None:
        return group_id, None
    v: dict[str, Any] = rec.value
    members = tuple(
        MemberValue(
            member_id=m["member_id"],
            group_instance_id=m.get("group_instance_id"),
            client_id=m.get("client_id", ""),
            client_host=m.get("client_host", ""),
            rebalance_timeout=int(m.get("rebalance_timeout", 0)),
            session_timeout=int(m.get("session_timeout", 0)),
            subscription=_bytes(m.get("subscription")),
            assignment=_bytes(m.get("assignment")),
        )
        for m in v.get("members", ())
    )
    return group_id, GroupValue(
        protocol_type=v.get("protocol_type") or "",
        generation=int(v.get("generation", 0)),
        protocol=v.get("protocol"),
        leader=v.get("leader"),
        current_state_timestamp=int(v.get("current_state_timestamp", -1)),
        members=members,
    )
