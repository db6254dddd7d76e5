"""Record bytes against the layouts Kafka's message specs document, byte by byte.

Each expected byte string is written out by hand from the spec (field order, widths,
length prefixes, flexible versions' varints and tagged fields), not produced by shoal:
a layout mistake in the serializer cannot make its own golden value.
"""

from __future__ import annotations

import json
import struct
import uuid

import pytest

from shoal.coordinator.records import (
    CONSUMER_OFFSETS,
    SHARE_GROUP_STATE,
    CoordinatorRecord,
    decode_key,
    decode_value,
    encode_key,
    encode_value,
    is_legacy_json,
)

TOPIC_ID = str(uuid.UUID(int=1))
UUID_BYTES = "00" * 15 + "01"


def hx(*parts: str) -> bytes:
    return bytes.fromhex("".join(p.replace(" ", "") for p in parts))


def s16(text: str) -> str:
    """A non-flexible string: int16 length + UTF-8."""
    return struct.pack(">h", len(text.encode())).hex() + text.encode().hex()


def cs(text: str) -> str:
    """A compact (flexible) string: unsigned varint length + 1, then UTF-8 (short strings only)."""
    return bytes([len(text.encode()) + 1]).hex() + text.encode().hex()


CASES = [
    # OffsetCommitKey (type 1): group, topic, partition.
    pytest.param(CONSUMER_OFFSETS, 1, {"group": "g1", "topic": "t", "partition": 3}, None, None,
                 hx("0001", s16("g1"), s16("t"), "00000003"), id="OffsetCommitKey"),
    # OffsetCommitValue v3: offset, leaderEpoch, metadata, commitTimestamp.
    pytest.param(CONSUMER_OFFSETS, 1, None, 3,
                 {"offset": 100, "leader_epoch": 5, "metadata": "m", "commit_timestamp": 1000,
                  "expire_timestamp": -1},
                 hx("0003", "0000000000000064", "00000005", s16("m"), "00000000000003e8"), id="OffsetCommitValue-v3"),
    # OffsetCommitValue v1: offset, metadata, commitTimestamp, expireTimestamp (no leaderEpoch).
    pytest.param(CONSUMER_OFFSETS, 1, None, 1,
                 {"offset": 7, "leader_epoch": -1, "metadata": "", "commit_timestamp": 1, "expire_timestamp": 2},
                 hx("0001", "0000000000000007", "0000", "0000000000000001", "0000000000000002"),
                 id="OffsetCommitValue-v1"),
    # GroupMetadataKey (type 2): group.
    pytest.param(CONSUMER_OFFSETS, 2, {"group": "g"}, None, None, hx("0002", s16("g")), id="GroupMetadataKey"),
    # GroupMetadataValue v3: protocolType, generation, protocol?, leader?, currentStateTimestamp,
    # members: memberId, groupInstanceId?, clientId, clientHost, rebalanceTimeout, sessionTimeout,
    # subscription (int32-length bytes), assignment.
    pytest.param(CONSUMER_OFFSETS, 2, None, 3,
                 {"protocol_type": "consumer", "generation": 1, "protocol": "range", "leader": "m1",
                  "current_state_timestamp": 5,
                  "members": [{"member_id": "m1", "group_instance_id": None, "client_id": "c", "client_host": "h",
                               "rebalance_timeout": 10, "session_timeout": 20, "subscription": b"\x00",
                               "assignment": b""}]},
                 hx("0003", s16("consumer"), "00000001", s16("range"), s16("m1"), "0000000000000005",
                    "00000001", s16("m1"), "ffff", s16("c"), s16("h"), "0000000a", "00000014",
                    "00000001 00", "00000000"), id="GroupMetadataValue-v3"),
    # ConsumerGroupMemberMetadataKey (type 5): groupId, memberId.
    pytest.param(CONSUMER_OFFSETS, 5, {"group_id": "g", "member_id": "m"}, None, None,
                 hx("0005", s16("g"), s16("m")), id="ConsumerGroupMemberMetadataKey"),
    # ConsumerGroupMemberMetadataValue v0 (flexible): InstanceId? RackId? ClientId ClientHost
    # SubscribedTopicNames SubscribedTopicRegex? RebalanceTimeoutMs ServerAssignor?, then tagged
    # field 0 ClassicMemberMetadata (nullable struct: marker, SessionTimeoutMs, SupportedProtocols).
    pytest.param(CONSUMER_OFFSETS, 5, None, 0,
                 {"instance_id": None, "rack_id": "r", "client_id": "c", "client_host": "/h",
                  "subscribed_topic_names": ["t"], "subscribed_topic_regex": None, "rebalance_timeout_ms": 300000,
                  "server_assignor": "uniform",
                  "classic_member_metadata": {"session_timeout_ms": 45000,
                                              "supported_protocols": [{"name": "range", "metadata": b"\x01"}]}},
                 hx("0000", "00", cs("r"), cs("c"), cs("/h"), "02", cs("t"), "00", "000493e0", cs("uniform"),
                    "01", "00", "10", "01", "0000afc8", "02", cs("range"), "02 01", "00", "00"),
                 id="ConsumerGroupMemberMetadataValue-v0"),
    # ShareGroupStatePartitionMetadataValue v0: InitializingTopics, InitializedTopics
    # (TopicId, TopicName, Partitions), DeletingTopics (TopicId, TopicName, and shoal's
    # tagged field 0: Partitions).
    pytest.param(CONSUMER_OFFSETS, 15, None, 0,
                 {"initializing_topics": [],
                  "initialized_topics": [{"topic_id": TOPIC_ID, "topic_name": "t", "partitions": [0]}],
                  "deleting_topics": [{"topic_id": TOPIC_ID, "topic_name": "t", "partitions": [1, 2]}]},
                 hx("0000", "01", "02", UUID_BYTES, cs("t"), "02 00000000", "00",
                    "02", UUID_BYTES, cs("t"), "01 00 09 03 00000001 00000002", "00"),
                 id="ShareGroupStatePartitionMetadataValue-v0"),
    # ShareSnapshotKey (type 0): GroupId, TopicId, Partition.
    pytest.param(SHARE_GROUP_STATE, 0, {"group_id": "G1", "topic_id": TOPIC_ID, "partition": 0}, None, None,
                 hx("0000", s16("G1"), UUID_BYTES, "00000000"), id="ShareSnapshotKey"),
    # ShareUpdateKey (type 1).
    pytest.param(SHARE_GROUP_STATE, 1, {"group_id": "G1", "topic_id": TOPIC_ID, "partition": 2}, None, None,
                 hx("0001", s16("G1"), UUID_BYTES, "00000002"), id="ShareUpdateKey"),
    # ShareSnapshotValue v0 (Kafka's trunk): SnapshotEpoch, StateEpoch, LeaderEpoch, StartOffset,
    # CreateTimestamp, WriteTimestamp, StateBatches (FirstOffset, LastOffset, DeliveryState int8,
    # DeliveryCount int16), then tagged field 0 DeliveryCompleteCount (int32, default -1).
    pytest.param(SHARE_GROUP_STATE, 0, None, 0,
                 {"snapshot_epoch": 1, "state_epoch": 2, "leader_epoch": 3, "start_offset": 110,
                  "delivery_complete_count": 5, "create_timestamp": 1700000000000,
                  "write_timestamp": 1700000001000,
                  "state_batches": [{"first_offset": 111, "last_offset": 112, "delivery_state": 0,
                                     "delivery_count": 1}]},
                 hx("0000", "00000001", "00000002", "00000003", "000000000000006e",
                    "0000018bcfe56800", "0000018bcfe56be8",
                    "02", "000000000000006f", "0000000000000070", "00", "0001", "00",
                    "01", "00", "04", "00000005"),
                 id="ShareSnapshotValue-v0"),
    # ShareUpdateValue v0: SnapshotEpoch, LeaderEpoch, StartOffset (-1: unchanged), StateBatches;
    # DeliveryCompleteCount at its default (-1) is not written.
    pytest.param(SHARE_GROUP_STATE, 1, None, 0,
                 {"snapshot_epoch": 65535, "leader_epoch": -1, "start_offset": -1, "delivery_complete_count": -1,
                  "state_batches": [{"first_offset": 119, "last_offset": 119, "delivery_state": 2,
                                     "delivery_count": 1}]},
                 hx("0000", "0000ffff", "ffffffff", "ffffffffffffffff",
                    "02", "0000000000000077", "0000000000000077", "02", "0001", "00", "00"),
                 id="ShareUpdateValue-v0"),
    # ShareGroupMetadataKey (type 11) and ShareGroupMetadataValue v0: Epoch, MetadataHash.
    pytest.param(CONSUMER_OFFSETS, 11, {"group_id": "sg"}, None, None, hx("000b", s16("sg")),
                 id="ShareGroupMetadataKey"),
    pytest.param(CONSUMER_OFFSETS, 11, None, 0, {"epoch": 4, "metadata_hash": 0},
                 hx("0000", "00000004", "0000000000000000", "00"), id="ShareGroupMetadataValue-v0"),
    # ConsumerGroupCurrentMemberAssignmentValue v0: MemberEpoch, PreviousMemberEpoch, State (Kafka's
    # MemberState: UNREVOKED_PARTITIONS = 1), AssignedPartitions, PartitionsPendingRevocation, then
    # shoal's tagged field 100 StateNumbering = 1 (Kafka's ids).
    pytest.param(CONSUMER_OFFSETS, 8, None, 0,
                 {"member_epoch": 3, "previous_member_epoch": 2, "state": 1,
                  "assigned_partitions": [{"topic_id": TOPIC_ID, "partitions": [0], "assignment_epochs": None}],
                  "partitions_pending_revocation": [{"topic_id": TOPIC_ID, "partitions": [1],
                                                     "assignment_epochs": None}],
                  "state_numbering": 1},
                 hx("0000", "00000003", "00000002", "01",
                    "02", UUID_BYTES, "02 00000000", "00", "02", UUID_BYTES, "02 00000001", "00",
                    "01", "64", "01", "01"),
                 id="ConsumerGroupCurrentMemberAssignmentValue-v0"),
    # The same with KIP-1251's AssignmentEpochs (tagged field 0 of each TopicPartitions: a
    # compact nullable int32 array, here of one element: size 5).
    pytest.param(CONSUMER_OFFSETS, 8, None, 0,
                 {"member_epoch": 3, "previous_member_epoch": 2, "state": 1,
                  "assigned_partitions": [{"topic_id": TOPIC_ID, "partitions": [0], "assignment_epochs": [3]}],
                  "partitions_pending_revocation": [{"topic_id": TOPIC_ID, "partitions": [1],
                                                     "assignment_epochs": [2]}],
                  "state_numbering": 1},
                 hx("0000", "00000003", "00000002", "01",
                    "02", UUID_BYTES, "02 00000000", "01 00 05 02 00000003",
                    "02", UUID_BYTES, "02 00000001", "01 00 05 02 00000002",
                    "01", "64", "01", "01"),
                 id="ConsumerGroupCurrentMemberAssignmentValue-v0-assignment-epochs"),
    # ShareGroupCurrentMemberAssignmentValue v0: MemberEpoch, PreviousMemberEpoch, State (STABLE = 0),
    # AssignedPartitions, then StateNumbering = 1 as tagged field 100.
    pytest.param(CONSUMER_OFFSETS, 14, None, 0,
                 {"member_epoch": 1, "previous_member_epoch": 0, "state": 0,
                  "assigned_partitions": [{"topic_id": TOPIC_ID, "partitions": [2]}], "state_numbering": 1},
                 hx("0000", "00000001", "00000000", "00", "02", UUID_BYTES, "02 00000002", "00",
                    "01", "64", "01", "01"),
                 id="ShareGroupCurrentMemberAssignmentValue-v0"),
    # ConsumerGroupMetadataValue v0: Epoch; tagged MetadataHash (0) and CreationTimeMs (1).
    pytest.param(CONSUMER_OFFSETS, 3, None, 0, {"epoch": 7, "metadata_hash": 0, "creation_time_ms": 1},
                 hx("0000", "00000007", "01", "01", "08", "0000000000000001"), id="ConsumerGroupMetadataValue-v0"),
]


@pytest.mark.parametrize("topic, record_type, key, version, value, expected", CASES)
def test_layout(topic: str, record_type: int, key: dict | None, version: int | None, value: dict | None,
                expected: bytes) -> None:
    if key is not None:
        assert encode_key(record_type, key, topic) == expected
        assert decode_key(expected, topic) == (record_type, key)
    else:
        assert version is not None and value is not None
        assert encode_value(record_type, version, value, topic) == expected
        assert decode_value(record_type, expected, topic) == (version, value)


def test_unknown_tagged_fields_are_skipped_as_kafka_readers_do() -> None:
    # ShareGroupMetadataValue v0 (Epoch, MetadataHash) with a tagged field 7 of 3 bytes that shoal does not know.
    data = hx("0000", "00000009", "0000000000000002", "01", "07", "03", "aabbcc")
    assert decode_value(11, data) == (0, {"epoch": 9, "metadata_hash": 2})


def test_a_value_with_bytes_left_over_or_a_bad_version_is_refused() -> None:
    with pytest.raises(ValueError):
        decode_value(11, hx("0000", "00000009", "0000000000000000", "00", "00"))
    with pytest.raises(ValueError):
        decode_value(11, hx("0001", "00000009", "0000000000000000", "00"))
    with pytest.raises(ValueError):
        decode_key(hx("0063", s16("g")))  # no record type 99


def test_legacy_json_records_are_recognised_and_read() -> None:
    key = b"\x00\x01" + json.dumps({"group": "g", "partition": 0, "topic": "t"}, sort_keys=True,
                                   separators=(",", ":")).encode()
    value = b"\x00\x03" + json.dumps({"offset": 5, "metadata": ""}, separators=(",", ":")).encode()
    assert is_legacy_json(key) and is_legacy_json(value)
    rec = CoordinatorRecord.from_bytes(key, value)
    assert (rec.record_type, rec.key, rec.version, rec.value) == (1, {"group": "g", "partition": 0, "topic": "t"}, 3,
                                                                  {"offset": 5, "metadata": ""})
    binary_key, binary_value = rec.to_bytes()
    assert not is_legacy_json(binary_key) and not is_legacy_json(binary_value)
