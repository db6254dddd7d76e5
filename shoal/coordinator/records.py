"""Records of the internal topics ``__consumer_offsets`` and ``__share_group_state``.

Theory of operation
-------------------
A coordinator's state is the replay of its records. Each record is a (key, value) pair
of bytes appended to a compacted internal topic; the latest value of a key wins, and a
``None`` value is a tombstone that deletes the key after compaction.

Keys and values both start with a big-endian int16:

* key:   ``int16 record type`` + the key fields;
* value: ``int16 value version`` + the value fields.

The record type numbers are Kafka's, so the two topics read like Kafka's own:
``__consumer_offsets`` uses 0-1 (offset commit), 2 (classic group metadata), 3-8
(consumer groups, KIP-848) and 9-15 (share groups, KIP-932); ``__share_group_state``
uses 0 (ShareSnapshot) and 1 (ShareUpdate). Fields are encoded as compact JSON with
sorted keys: deterministic (so equal keys are equal bytes, which compaction needs),
self-describing, and versioned by the int16 prefix. Coordinator records are small and
written once per state change, so this is not on a hot path.

Pure: no I/O. Domain modules (``shoal.groups``, ``shoal.share``) define which fields
each record type carries; this module only frames them.
"""

from __future__ import annotations

import enum
import json
import struct
from dataclasses import dataclass
from typing import Any

__all__ = [
    "RecordType",
    "ShareStateRecordType",
    "CoordinatorRecord",
    "encode_key",
    "decode_key",
    "encode_value",
    "decode_value",
    "record",
    "tombstone",
]

_I16 = struct.Struct(">h")


class RecordType(enum.IntEnum):
    """Record types of ``__consumer_offsets`` (Kafka's numbering)."""

    OFFSET_COMMIT_LEGACY = 0
    OFFSET_COMMIT = 1
    GROUP_METADATA = 2
    CONSUMER_GROUP_METADATA = 3
    CONSUMER_GROUP_PARTITION_METADATA = 4
    CONSUMER_GROUP_MEMBER_METADATA = 5
    CONSUMER_GROUP_TARGET_ASSIGNMENT_METADATA = 6
    CONSUMER_GROUP_TARGET_ASSIGNMENT_MEMBER = 7
    CONSUMER_GROUP_CURRENT_MEMBER_ASSIGNMENT = 8
    SHARE_GROUP_PARTITION_METADATA = 9
    SHARE_GROUP_MEMBER_METADATA = 10
    SHARE_GROUP_METADATA = 11
    SHARE_GROUP_TARGET_ASSIGNMENT_METADATA = 12
    SHARE_GROUP_TARGET_ASSIGNMENT_MEMBER = 13
    SHARE_GROUP_CURRENT_MEMBER_ASSIGNMENT = 14
    SHARE_GROUP_STATE_PARTITION_METADATA = 15


class ShareStateRecordType(enum.IntEnum):
    """Record types of ``__share_group_state`` (Kafka's numbering)."""

    SHARE_SNAPSHOT = 0
    SHARE_UPDATE = 1


def _dump(fields: dict[str, Any]) -> bytes:
    return json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()


def encode_key(record_type: int, fields: dict[str, Any]) -> bytes:
    return _I16.pack(record_type) + _dump(fields)


def decode_key(data: bytes) -> tuple[int, dict[str, Any]]:
    """Returns (record type, key fields). Raises ValueError on malformed bytes."""
    if len(data) < 2:
        raise ValueError("record key shorter than its type")
    (record_type,) = _I16.unpack_from(data, 0)
    return record_type, json.loads(data[2:]) if len(data) > 2 else {}


def encode_value(version: int, fields: dict[str, Any]) -> bytes:
    return _I16.pack(version) + _dump(fields)


def decode_value(data: bytes | None) -> tuple[int, dict[str, Any]] | None:
    """Returns (version, value fields), or None for a tombstone."""
    if data is None:
        return None
    if len(data) < 2:
        raise ValueError("record value shorter than its version")
    (version,) = _I16.unpack_from(data, 0)
    return version, json.loads(data[2:]) if len(data) > 2 else {}


@dataclass(frozen=True, slots=True)
class CoordinatorRecord:
    """One record to append to (or replayed from) an internal topic partition.

    ``record_type``/``key`` and ``version``/``value`` are the decoded views; ``value``
    is None for a tombstone. ``to_bytes`` gives the (key, value) pair the log stores.
    """

    record_type: int
    key: dict[str, Any]
    value: dict[str, Any] | None
    version: int = 0

    def to_bytes(self) -> tuple[bytes, bytes | None]:
        k = encode_key(self.record_type, self.key)
        v = None if self.value is None else encode_value(self.version, self.value)
        return k, v

    @classmethod
    def from_bytes(cls, key: bytes, value: bytes | None) -> CoordinatorRecord:
        record_type, kf = decode_key(key)
        dv = decode_value(value)
        if dv is None:
            return cls(record_type, kf, None, 0)
        return cls(record_type, kf, dv[1], dv[0])


def record(record_type: int, key: dict[str, Any], value: dict[str, Any], version: int = 0) -> CoordinatorRecord:
    return CoordinatorRecord(int(record_type), key, value, version)


def tombstone(record_type: int, key: dict[str, Any]) -> CoordinatorRecord:
    return CoordinatorRecord(int(record_type), key, None, 0)
