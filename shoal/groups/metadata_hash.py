"""The metadata hash of a group's subscribed topics (KIP-1101), as Apache Kafka computes it.

Theory of operation
-------------------
Since Kafka 4.1 a modern group does not keep its subscribed topics' metadata in a record
of its own (ConsumerGroupPartitionMetadata, ShareGroupPartitionMetadata): its group record
carries one int64, ``MetadataHash``, a hash of the metadata of the subscribed topics that
exist. A heartbeat recomputes the hash from the current topics; when it differs from the
stored one the group epoch is bumped and the target assignment recomputed.

The hash is Kafka's (``Utils.computeTopicHash`` / ``computeGroupHash`` of its group
coordinator), so the values shoal writes are the ones Kafka would write for the same
topics: XXH3-64 (seed 0, the default secret) over

* per topic: the byte 0 (a format version), the topic id's two halves as int64, the name
  (each UTF-16 code unit as 2 bytes, then the number of code units as int32), the
  partition count as int32, then for each partition its index as int32 followed by the
  racks of its replicas (shoal's topic metadata has no racks, so none are written);
* per group: the topic hashes as int64, in the order of the topic names; 0 when no
  subscribed topic exists.

Multi-byte values are little-endian, as in the hash4j streams Kafka uses.

XXH3 is restated here from its specification (it is a few lines per input length class)
so that no native extension is needed; the hashes are small (tens of bytes per topic, a
few bytes per partition: about 2 ms for a topic of 1,000 partitions), and each topic's is
computed once per (id, name, partition count).

Pure: no I/O, no clock.
"""

from __future__ import annotations

import functools
import struct
import uuid
from collections.abc import Iterable, Mapping

__all__ = ["group_hash", "metadata_hash", "topic_hash", "xxh3_64"]

_M64 = (1 << 64) - 1
_P32_1 = 0x9E3779B1
_P32_2 = 0x85EBCA77
_P32_3 = 0xC2B2AE3D
_P64_1 = 0x9E3779B185EBCA87
_P64_2 = 0xC2B2AE3D27D4EB4F
_P64_3 = 0x165667B19E3779F9
_P64_4 = 0x85EBCA77C2B2AE63
_P64_5 = 0x27D4EB2F165667C5
_PMX1 = 0x165667919E3779F9
_PMX2 = 0x9FB21C651E98DF25

_SECRET = bytes.fromhex(
    "b8fe6c3923a44bbe7c01812cf721ad1cded46de9839097db7240a4a4b7b3671f"
    "cb79e64eccc0e578825ad07dccff7221b8084674f743248ee03590e6813a264c"
    "3c2852bb91c300cb88d0658b1b532ea371644897a20df94e3819ef46a9deacd8"
    "a8fa763fe39c343ff9dcbbc7c70b4f1d8a51e04bcdb45931c89f7ec9d9787364"
    "eac5ac8334d3ebc3c581a0fffa1363eb170ddd51b7f0da49d316552629d4689e"
    "2b16be587d47a1fc8ff8b8d17ad031ce45cb3a8f95160428afd7fbcabb4b407e"
)
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")


def _r32(b: bytes, i: int) -> int:
    return _U32.unpack_from(b, i)[0]


def _r64(b: bytes, i: int) -> int:
    return _U64.unpack_from(b, i)[0]


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (64 - r))) & _M64


def _fold(a: int, b: int) -> int:
    p = a * b
    return (p ^ (p >> 64)) & _M64


def _avalanche(h: int) -> int:
    h ^= h >> 37
    h = (h * _PMX1) & _M64
    return h ^ (h >> 32)


def _xxh64_avalanche(h: int) -> int:
    h ^= h >> 33
    h = (h * _P64_2) & _M64
    h ^= h >> 29
    h = (h * _P64_3) & _M64
    return h ^ (h >> 32)


def _mix16(b: bytes, i: int, s: int) -> int:
    return _fold(_r64(b, i) ^ _r64(_SECRET, s), _r64(b, i + 8) ^ _r64(_SECRET, s + 8))


def _long(b: bytes) -> int:
    n = len(b)
    acc = [_P32_3, _P64_1, _P64_2, _P64_3, _P64_4, _P32_2, _P64_5, _P32_1]

    def stripe(off: int, s: int) -> None:
        for i in range(8):
            v = _r64(b, off + 8 * i)
            k = v ^ _r64(_SECRET, s + 8 * i)
            acc[i ^ 1] = (acc[i ^ 1] + v) & _M64
            acc[i] = (acc[i] + (k & 0xFFFFFFFF) * (k >> 32)) & _M64

    per_block = (len(_SECRET) - 64) // 8
    block = 64 * per_block
    blocks = (n - 1) // block
    for j in range(blocks):
        for s in range(per_block):
            stripe(j * block + 64 * s, 8 * s)
        for i in range(8):
            a = acc[i]
            a ^= a >> 47
            a ^= _r64(_SECRET, len(_SECRET) - 64 + 8 * i)
            acc[i] = (a * _P32_1) & _M64
    for s in range(((n - 1) - block * blocks) // 64):
        stripe(blocks * block + 64 * s, 8 * s)
    stripe(n - 64, len(_SECRET) - 64 - 7)
    h = (n * _P64_1) & _M64
    for i in range(4):
        h = (h + _fold(acc[2 * i] ^ _r64(_SECRET, 11 + 16 * i), acc[2 * i + 1] ^ _r64(_SECRET, 11 + 16 * i + 8))) & _M64
    return _avalanche(h)


def xxh3_64(b: bytes) -> int:
    """XXH3-64 of ``b`` with seed 0 and the default secret, as an unsigned int."""
    n = len(b)
    if n == 0:
        return _xxh64_avalanche(_r64(_SECRET, 56) ^ _r64(_SECRET, 64))
    if n <= 3:
        combined = (b[0] << 16) | (b[n >> 1] << 24) | b[n - 1] | (n << 8)
        return _xxh64_avalanche(combined ^ (_r32(_SECRET, 0) ^ _r32(_SECRET, 4)))
    if n <= 8:
        keyed = ((_r32(b, n - 4) + (_r32(b, 0) << 32)) & _M64) ^ (_r64(_SECRET, 8) ^ _r64(_SECRET, 16))
        h = keyed ^ _rotl(keyed, 49) ^ _rotl(keyed, 24)
        h = (h * _PMX2) & _M64
        h ^= (h >> 35) + n
        h = (h * _PMX2) & _M64
        return h ^ (h >> 28)
    if n <= 16:
        lo = _r64(b, 0) ^ (_r64(_SECRET, 24) ^ _r64(_SECRET, 32))
        hi = _r64(b, n - 8) ^ (_r64(_SECRET, 40) ^ _r64(_SECRET, 48))
        swapped = int.from_bytes(lo.to_bytes(8, "little"), "big")
        return _avalanche((n + swapped + hi + _fold(lo, hi)) & _M64)
    if n <= 128:
        acc = n * _P64_1
        if n > 32:
            if n > 64:
                if n > 96:
                    acc += _mix16(b, 48, 96) + _mix16(b, n - 64, 112)
                acc += _mix16(b, 32, 64) + _mix16(b, n - 48, 80)
            acc += _mix16(b, 16, 32) + _mix16(b, n - 32, 48)
        acc += _mix16(b, 0, 0) + _mix16(b, n - 16, 16)
        return _avalanche(acc & _M64)
    if n <= 240:
        acc = n * _P64_1
        for i in range(8):
            acc += _mix16(b, 16 * i, 16 * i)
        acc = _avalanche(acc & _M64)
        for i in range(8, n // 16):
            acc += _mix16(b, 16 * i, 16 * (i - 8) + 3)
        acc += _mix16(b, n - 16, 136 - 17)
        return _avalanche(acc & _M64)
    return _long(b)


def _signed(h: int) -> int:
    return h - (1 << 64) if h >= 1 << 63 else h


@functools.lru_cache(maxsize=4096)
def topic_hash(topic_id: uuid.UUID, name: str, partitions: int) -> int:
    """Kafka's hash of one topic's metadata (signed int64). Heartbeats hash their group's
    topics each time, so the hashes are kept (as Kafka's group coordinator keeps them):
    a topic that changes has a new id or partition count, hence a new entry."""
    units = name.encode("utf-16-le")
    out = bytearray(b"\x00")
    out += struct.pack("<qq", *struct.unpack(">qq", topic_id.bytes))
    out += units
    out += struct.pack("<ii", len(units) // 2, partitions)
    for p in range(partitions):
        out += struct.pack("<i", p)
    return _signed(xxh3_64(bytes(out)))


def group_hash(topic_hashes: Mapping[str, int]) -> int:
    """Kafka's hash of a group's topics from their hashes (name -> hash): 0 if none."""
    if not topic_hashes:
        return 0
    return _signed(xxh3_64(b"".join(struct.pack("<q", topic_hashes[n]) for n in sorted(topic_hashes))))


def metadata_hash(names: Iterable[str], topics: Mapping[str, tuple[uuid.UUID, int]]) -> int:
    """The MetadataHash of a group subscribing to ``names``: the subscribed topics that
    exist in ``topics`` (name -> (topic id, partition count)) count; the others do not."""
    return group_hash({n: topic_hash(topics[n][0], n, int(topics[n][1])) for n in set(names) if n in topics})
