"""Kafka's binary layouts of the internal topics' records, as data.

Theory of operation
-------------------
Apache Kafka describes each record of ``__consumer_offsets``, ``__share_group_state`` and
``__transaction_state``
with a pair of JSON message specs (``group-coordinator/src/main/resources/common/message``
and ``share-coordinator/src/main/resources/common/message`` in its repository): a key spec
and a value spec. This module restates them as :class:`Schema` objects, one per spec,
with the same fields, types, versions, nullability and tags, so that
:mod:`shoal.coordinator.records` writes and reads the bytes Kafka's generated classes
write and read. The specs are those of Kafka's trunk: the share-group and share-state
values changed incompatibly while KIP-932 was in preview (ShareSnapshotValue and
ShareUpdateValue with an int32 SnapshotEpoch, timestamps and a tagged
DeliveryCompleteCount; ShareGroupMetadataValue with MetadataHash;
ShareGroupStatePartitionMetadataValue with InitializingTopics), and shoal writes the
current forms. Kafka 4.1 removed ShareGroupPartitionMetadata (type 9; the subscribed
topics' metadata became ShareGroupMetadataValue's MetadataHash): shoal no longer writes
it, and keeps its last published layout only to read the records earlier shoal versions
wrote (and to tombstone them). Field names are Kafka's, turned to snake_case (``RebalanceTimeoutMs``
becomes ``rebalance_timeout_ms``), and are the keys of the dicts the domain modules
build and replay.

The encoding is Kafka's message encoding: big-endian integers; ``string`` as an int16
length (-1: null) and UTF-8 bytes, ``bytes`` and arrays with an int32 length (-1: null);
in *flexible* versions strings, bytes and arrays carry an unsigned varint of length + 1
(0: null) and every struct ends with its tagged fields (a varint count, then tag, size
and value of each, in tag order). A nullable struct is preceded by an int8 (-1 null,
1 present). ``uuid`` is 16 bytes. A tagged field is written only when it differs from
its default.

Two additions of shoal's own, written as tagged fields so that Kafka's decoders skip them:

* ``ShareGroupStatePartitionMetadataValue.DeletingTopics[].Partitions`` (tag 0), the
  partitions whose state is being deleted (Kafka deletes whole topics and keeps no list);
* ``StateNumbering`` (tag 100) in ConsumerGroupCurrentMemberAssignmentValue (type 8) and
  ShareGroupCurrentMemberAssignmentValue (type 14): 1 when ``State`` holds Kafka's
  MemberState ids (STABLE 0, UNREVOKED_PARTITIONS 1, UNRELEASED_PARTITIONS 2, UNKNOWN -1),
  which is what shoal writes; absent (0) in the records of earlier shoal versions, whose
  ``State`` numbered UNREVOKED_PARTITIONS 0, UNRELEASED_PARTITIONS 1, STABLE 2. Readers
  tell the two apart by it (``shoal.groups.consumer.member_state``), so a data directory
  (or a replica) written before keeps its meaning, and Kafka's decoders read ``State`` as
  shoal meant. The tag is far above the ones Kafka's specs use.

Pure data; no I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

__all__ = [
    "CONSUMER_OFFSETS",
    "RECORD_SCHEMAS",
    "SHARE_GROUP_STATE",
    "TRANSACTION_STATE",
    "Field",
    "Schema",
    "snake",
]

CONSUMER_OFFSETS = "__consumer_offsets"
SHARE_GROUP_STATE = "__share_group_state"
TRANSACTION_STATE = "__transaction_state"

_MAX_VERSION = 0x7FFF

PRIMITIVES = frozenset({"bool", "int8", "int16", "uint16", "int32", "int64", "uuid", "string", "bytes"})


def snake(name: str) -> str:
    """Kafka's field name in snake_case: ``GroupId`` -> ``group_id``, ``protocolType`` -> ``protocol_type``."""
    return re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", name).lower()


def _versions(spec: str | None) -> tuple[int, int] | None:
    """``"0+"`` -> (0, max); ``"1"`` -> (1, 1); ``"0-4"`` -> (0, 4); None or ``"none"`` -> None."""
    if spec is None or spec == "none":
        return None
    if spec.endswith("+"):
        return int(spec[:-1]), _MAX_VERSION
    if "-" in spec:
        lo, hi = spec.split("-")
        return int(lo), int(hi)
    return int(spec), int(spec)


@dataclass(frozen=True, slots=True)
class Field:
    """One field of a message or struct.

    ``type`` is a primitive name (``int32``, ``string``, ...), or ``"struct"`` with
    ``fields``; ``array`` makes it a list of that type.
    """

    name: str
    type: str
    versions: tuple[int, int]
    array: bool = False
    fields: tuple[Field, ...] = ()
    nullable: tuple[int, int] | None = None
    tag: int | None = None
    tagged: tuple[int, int] | None = None
    default: Any = None

    def present(self, version: int) -> bool:
        return self.versions[0] <= version <= self.versions[1]

    def is_nullable(self, version: int) -> bool:
        return self.nullable is not None and self.nullable[0] <= version <= self.nullable[1]

    def is_tagged(self, version: int) -> bool:
        return self.tagged is not None and self.tagged[0] <= version <= self.tagged[1]

    def default_value(self) -> Any:
        """The value a reader gets when the field is absent (Kafka's defaults)."""
        if self.default is not None:
            return self.default
        if self.nullable is not None and (self.type in ("string", "bytes", "struct") or self.array):
            return None
        if self.array:
            return []
        if self.type == "struct":
            return {f.name: f.default_value() for f in self.fields}
        if self.type == "string":
            return ""
        if self.type == "bytes":
            return b""
        if self.type == "bool":
            return False
        if self.type == "uuid":
            return "00000000-0000-0000-0000-000000000000"
        return 0


def f(name: str, type_: str, versions: str = "0+", *, fields: tuple[Field, ...] = (), nullable: str | None = None,
      tag: int | None = None, tagged: str | None = None, default: Any = None) -> Field:
    """A field as Kafka's JSON spec states it (``"[]int32"``, ``"[]Struct"`` for arrays)."""
    array = type_.startswith("[]")
    base = type_[2:] if array else type_
    if base not in PRIMITIVES:
        base = "struct"
    return Field(snake(name), base, _versions(versions) or (0, _MAX_VERSION), array, tuple(fields),
                 _versions(nullable), tag, _versions(tagged), default)


@dataclass(frozen=True, slots=True)
class Schema:
    """One Kafka message spec: a record key or value."""

    name: str
    versions: tuple[int, int]
    flexible: tuple[int, int] | None
    fields: tuple[Field, ...]
    write_version: int
    """The version shoal writes (Kafka's choice for a broker of today)."""

    def is_flexible(self, version: int) -> bool:
        return self.flexible is not None and self.flexible[0] <= version <= self.flexible[1]


def schema(name: str, versions: str, flexible: str, fields: list[Field], write_version: int | None = None) -> Schema:
    v = _versions(versions)
    assert v is not None
    return Schema(name, v, _versions(flexible), tuple(fields), v[1] if write_version is None else write_version)


def _key(name: str, version: int, *fields: Field) -> Schema:
    """A record key: never flexible; its version is the record type."""
    return schema(name, str(version), "none", list(fields))


_GROUP_ID = f("GroupId", "string")
_MEMBER_ID = f("MemberId", "string")

# Shared struct bodies.
_TOPIC_PARTITIONS = (f("TopicId", "uuid"), f("Partitions", "[]int32"))
_TOPIC_PARTITIONS_WITH_EPOCHS = (
    *_TOPIC_PARTITIONS,
    # KIP-1251 (Kafka 4.3): the epoch at which each partition was assigned to the member.
    f("AssignmentEpochs", "[]int32", nullable="0+", tag=0, tagged="0+", default=None),
)
_TOPIC_METADATA = (
    f("TopicId", "uuid"),
    f("TopicName", "string"),
    f("NumPartitions", "int32"),
    f("PartitionMetadata", "[]PartitionMetadata", fields=(f("Partition", "int32"), f("Racks", "[]string"))),
)
_STATE_NUMBERING = f("StateNumbering", "int8", tag=100, tagged="0+", default=0)
"""Which ids the member records' ``State`` holds: 1 Kafka's MemberState, 0 (absent) shoal's earlier ones."""
_STATE_BATCH = (
    f("FirstOffset", "int64"),
    f("LastOffset", "int64"),
    f("DeliveryState", "int8"),
    f("DeliveryCount", "int16"),
)
_TOPIC_PARTITIONS_INFO = (f("TopicId", "uuid"), f("TopicName", "string"), f("Partitions", "[]int32"))
_SHARE_KEY = (f("GroupId", "string", "0+"), f("TopicId", "uuid", "0+"), f("Partition", "int32", "0+"))

_OFFSET_COMMIT_KEY_FIELDS = (f("group", "string", "0-1"), f("topic", "string", "0-1"), f("partition", "int32", "0-1"))
_OFFSET_COMMIT_VALUE = schema("OffsetCommitValue", "0-4", "4+", [
    f("offset", "int64", "0+"),
    f("leaderEpoch", "int32", "3+", default=-1),
    f("metadata", "string", "0+"),
    f("commitTimestamp", "int64", "0+"),
    f("expireTimestamp", "int64", "1", default=-1),
], write_version=3)

RECORD_SCHEMAS: dict[str, dict[int, tuple[Schema, Schema]]] = {
    CONSUMER_OFFSETS: {
        0: (_key("OffsetCommitKey", 0, *_OFFSET_COMMIT_KEY_FIELDS), _OFFSET_COMMIT_VALUE),
        1: (_key("OffsetCommitKey", 1, *_OFFSET_COMMIT_KEY_FIELDS), _OFFSET_COMMIT_VALUE),
        2: (_key("GroupMetadataKey", 2, f("group", "string", "2")), schema("GroupMetadataValue", "0-4", "4+", [
            f("protocolType", "string", "0+"),
            f("generation", "int32", "0+"),
            f("protocol", "string", "0+", nullable="0+"),
            f("leader", "string", "0+", nullable="0+"),
            f("currentStateTimestamp", "int64", "2+", default=-1),
            f("members", "[]MemberMetadata", "0+", fields=(
                f("memberId", "string", "0+"),
                f("groupInstanceId", "string", "3+", nullable="3+"),
                f("clientId", "string", "0+"),
                f("clientHost", "string", "0+"),
                f("rebalanceTimeout", "int32", "1+", default=-1),
                f("sessionTimeout", "int32", "0+"),
                f("subscription", "bytes", "0+"),
                f("assignment", "bytes", "0+"),
            )),
        ], write_version=3)),
        3: (_key("ConsumerGroupMetadataKey", 3, _GROUP_ID),
            schema("ConsumerGroupMetadataValue", "0", "0+", [
                f("Epoch", "int32"),
                f("MetadataHash", "int64", tag=0, tagged="0+", default=0),
                f("CreationTimeMs", "int64", tag=1, tagged="0+", default=-1),
            ])),
        4: (_key("ConsumerGroupPartitionMetadataKey", 4, _GROUP_ID),
            schema("ConsumerGroupPartitionMetadataValue", "0", "0+", [
                f("Topics", "[]TopicMetadata", fields=_TOPIC_METADATA)])),
        5: (_key("ConsumerGroupMemberMetadataKey", 5, _GROUP_ID, _MEMBER_ID),
            schema("ConsumerGroupMemberMetadataValue", "0", "0+", [
                f("InstanceId", "string", nullable="0+"),
                f("RackId", "string", nullable="0+"),
                f("ClientId", "string"),
                f("ClientHost", "string"),
                f("SubscribedTopicNames", "[]string"),
                f("SubscribedTopicRegex", "string", nullable="0+"),
                f("RebalanceTimeoutMs", "int32", default=-1),
                f("ServerAssignor", "string", nullable="0+"),
                f("ClassicMemberMetadata", "ClassicMemberMetadata", nullable="0+", tag=0, tagged="0+", fields=(
                    f("SessionTimeoutMs", "int32"),
                    f("SupportedProtocols", "[]ClassicProtocol", fields=(
                        f("Name", "string"), f("Metadata", "bytes"))),
                )),
            ])),
        6: (_key("ConsumerGroupTargetAssignmentMetadataKey", 6, _GROUP_ID),
            schema("ConsumerGroupTargetAssignmentMetadataValue", "0", "0+", [f("AssignmentEpoch", "int32")])),
        7: (_key("ConsumerGroupTargetAssignmentMemberKey", 7, _GROUP_ID, _MEMBER_ID),
            schema("ConsumerGroupTargetAssignmentMemberValue", "0", "0+", [
                f("TopicPartitions", "[]TopicPartition", fields=_TOPIC_PARTITIONS)])),
        8: (_key("ConsumerGroupCurrentMemberAssignmentKey", 8, _GROUP_ID, _MEMBER_ID),
            schema("ConsumerGroupCurrentMemberAssignmentValue", "0", "0+", [
                f("MemberEpoch", "int32"),
                f("PreviousMemberEpoch", "int32"),
                f("State", "int8"),
                f("AssignedPartitions", "[]TopicPartitions", fields=_TOPIC_PARTITIONS_WITH_EPOCHS),
                f("PartitionsPendingRevocation", "[]TopicPartitions", fields=_TOPIC_PARTITIONS_WITH_EPOCHS),
                _STATE_NUMBERING,  # shoal's addition, see above
            ])),
        9: (_key("ShareGroupPartitionMetadataKey", 9, _GROUP_ID),
            schema("ShareGroupPartitionMetadataValue", "0", "0+", [
                f("Topics", "[]TopicMetadata", fields=_TOPIC_METADATA)])),
        10: (_key("ShareGroupMemberMetadataKey", 10, _GROUP_ID, _MEMBER_ID),
             schema("ShareGroupMemberMetadataValue", "0", "0+", [
                 f("RackId", "string", nullable="0+"),
                 f("ClientId", "string"),
                 f("ClientHost", "string"),
                 f("SubscribedTopicNames", "[]string"),
             ])),
        11: (_key("ShareGroupMetadataKey", 11, _GROUP_ID),
             schema("ShareGroupMetadataValue", "0", "0+", [f("Epoch", "int32"), f("MetadataHash", "int64")])),
        12: (_key("ShareGroupTargetAssignmentMetadataKey", 12, _GROUP_ID),
             schema("ShareGroupTargetAssignmentMetadataValue", "0", "0+", [f("AssignmentEpoch", "int32")])),
        13: (_key("ShareGroupTargetAssignmentMemberKey", 13, _GROUP_ID, _MEMBER_ID),
             schema("ShareGroupTargetAssignmentMemberValue", "0", "0+", [
                 f("TopicPartitions", "[]TopicPartition", fields=_TOPIC_PARTITIONS)])),
        14: (_key("ShareGroupCurrentMemberAssignmentKey", 14, _GROUP_ID, _MEMBER_ID),
             schema("ShareGroupCurrentMemberAssignmentValue", "0", "0+", [
                 f("MemberEpoch", "int32"),
                 f("PreviousMemberEpoch", "int32"),
                 f("State", "int8"),
                 f("AssignedPartitions", "[]TopicPartitions", fields=_TOPIC_PARTITIONS),
                 _STATE_NUMBERING,  # shoal's addition, see above
             ])),
        15: (_key("ShareGroupStatePartitionMetadataKey", 15, _GROUP_ID),
             schema("ShareGroupStatePartitionMetadataValue", "0", "0+", [
                 f("InitializingTopics", "[]TopicPartitionsInfo", fields=_TOPIC_PARTITIONS_INFO),
                 f("InitializedTopics", "[]TopicPartitionsInfo", fields=_TOPIC_PARTITIONS_INFO),
                 f("DeletingTopics", "[]TopicInfo", fields=(
                     f("TopicId", "uuid"),
                     f("TopicName", "string"),
                     f("Partitions", "[]int32", tag=0, tagged="0+"),  # shoal's addition, see above
                 )),
             ])),
    },
    SHARE_GROUP_STATE: {
        0: (_key("ShareSnapshotKey", 0, *_SHARE_KEY), schema("ShareSnapshotValue", "0", "0+", [
            f("SnapshotEpoch", "int32"),
            f("StateEpoch", "int32"),
            f("LeaderEpoch", "int32"),
            f("StartOffset", "int64"),
            f("DeliveryCompleteCount", "int32", tag=0, tagged="0+", default=-1),
            f("CreateTimestamp", "int64"),
            f("WriteTimestamp", "int64"),
            f("StateBatches", "[]StateBatch", fields=_STATE_BATCH),
        ])),
        1: (_key("ShareUpdateKey", 1, *_SHARE_KEY), schema("ShareUpdateValue", "0", "0+", [
            f("SnapshotEpoch", "int32"),
            f("LeaderEpoch", "int32"),
            f("StartOffset", "int64"),
            f("DeliveryCompleteCount", "int32", tag=0, tagged="0+", default=-1),
            f("StateBatches", "[]StateBatch", fields=_STATE_BATCH),
        ])),
    },
    TRANSACTION_STATE: {
        # TransactionLogKey (version 0) and TransactionLogValue (transaction-coordinator
        # module): version 0 is what a broker without transaction version 2 writes.
        0: (_key("TransactionLogKey", 0, f("TransactionalId", "string", "0")),
            schema("TransactionLogValue", "0-1", "1+", [
                f("ProducerId", "int64"),
                f("PreviousProducerId", "int64", "1+", tag=0, tagged="1+", default=-1),
                f("NextProducerId", "int64", "1+", tag=1, tagged="1+", default=-1),
                f("ProducerEpoch", "int16"),
                f("TransactionTimeoutMs", "int32"),
                f("TransactionStatus", "int8"),
                f("TransactionPartitions", "[]PartitionsSchema", nullable="0+", fields=(
                    f("Topic", "string"), f("PartitionIds", "[]int32"))),
                f("TransactionLastUpdateTimestampMs", "int64"),
                f("TransactionStartTimestampMs", "int64"),
                f("ClientTransactionVersion", "int16", "1+", tag=2, tagged="1+", default=0),
            ], write_version=0)),
    },
}
