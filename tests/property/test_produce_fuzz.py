"""Fuzz: mutated produce batches are stored only if they are valid, and every valid one is stored.

Valid produce requests (random records, keys, headers and codecs) are mutated (a byte
of the records or of the compressed payload set, the record count or offset delta
changed, the payload cut or extended, codec and control bits set, bytes inserted), with
the CRC recomputed so that the record validation, not the CRC, must catch the fault.
Each goes through what the Produce handler does (``validate_produce_batch``, then the
log's append). A reference parser written here from Kafka's DefaultRecord rules decides
validity; the broker must store exactly the valid ones, and what it stored must read
back with the decoder. Bounded: a few hundred examples, a few seconds.
"""

from __future__ import annotations

import gzip
import struct
import tempfile
from pathlib import Path

import crc32c
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from shoal.errors import ApiError
from shoal.log.partition_log import PartitionLog
from shoal.log.policy import LogConfig
from shoal.protocol.batch import Compression, build_batch, decode_records, read_header
from shoal.protocol import records
from shoal.protocol.records import validate_produce_batch

CODECS = (Compression.NONE, Compression.GZIP, Compression.SNAPPY, Compression.LZ4, Compression.ZSTD)


def compress(codec: int, data: bytes) -> bytes:
    if codec == Compression.GZIP:
        return gzip.compress(data)
    if codec == Compression.SNAPPY:
        import cramjam
        return bytes(cramjam.snappy.compress_raw(data))
    if codec == Compression.LZ4:
        import lz4.frame
        return lz4.frame.compress(data)
    import zstandard
    return zstandard.ZstdCompressor().compress(data)


def decompress(codec: int, data: bytes) -> bytes | None:
    try:
        if codec == Compression.GZIP:
            return gzip.decompress(data)
        if codec == Compression.SNAPPY:
            import cramjam
            return bytes(cramjam.snappy.decompress_raw(data))
        if codec == Compression.LZ4:
            import lz4.frame
            return lz4.frame.decompress(data)
        import zstandard
        return zstandard.ZstdDecompressor().decompressobj().decompress(data)
    except Exception:
        return None


# --- the reference: Kafka's rules, written as plainly as possible ----------------------

class Bad(Exception):
    pass


def varint(data: bytes, pos: int, max_bytes: int) -> tuple[int, int]:
    value = 0
    for i in range(max_bytes):
        if pos >= len(data):
            raise Bad("truncated varint")
        b = data[pos]
        pos += 1
        value |= (b & 0x7F) << (7 * i)
        if b < 0x80:
            return (value >> 1) ^ -(value & 1), pos
    raise Bad("varint too long")


def reference_valid(batch: bytes) -> bool:
    try:
        if len(batch) < 61:
            return False
        (_, length, _, magic, crc, attrs, lod, _, _, pid, _, seq, count) = struct.unpack_from(
            ">qiibIhiqqqhii", batch, 0)
        if magic != 2 or length + 12 != len(batch) or length < 49:
            return False
        if crc32c.crc32c(batch[21:]) != crc:
            return False
        codec = attrs & 7
        if count <= 0 or lod != count - 1 or attrs & 0x20 or codec not in CODECS or (pid >= 0 and seq < 0):
            return False
        data = batch[61:]
        if codec != Compression.NONE:
            data = decompress(codec, data)
            if data is None:
                return False
        pos = 0
        for i in range(count):
            size, pos = varint(data, pos, 5)
            end = pos + size
            if size < 0 or end > len(data):
                return False
            rec = data[:end]  # fields must not read past the record
            pos += 1
            _, pos = varint(rec, pos, 10)
            od, pos = varint(rec, pos, 5)
            if od != i:
                return False
            for _field in ("key", "value"):
                n, pos = varint(rec, pos, 5)
                if n >= 0:
                    pos += n
                    if pos > end:
                        return False
            nh, pos = varint(rec, pos, 5)
            if nh < 0:
                return False
            for _h in range(nh):
                hk, pos = varint(rec, pos, 5)
                if hk < 0:
                    return False
                pos += hk
                hv, pos = varint(rec, pos, 5)
                if hv >= 0:
                    pos += hv
                if pos > end:
                    return False
            if pos != end:
                return False
        return pos == len(data)
    except Bad:
        return False


# --- requests and mutations --------------------------------------------------------------

records_st = st.lists(
    st.tuples(st.one_of(st.none(), st.binary(max_size=12)), st.one_of(st.none(), st.binary(max_size=40)),
              st.lists(st.tuples(st.sampled_from(["a", "trace", "k"]), st.one_of(st.none(), st.binary(max_size=6))),
                       max_size=2),
              st.integers(0, 20_000)),
    min_size=1, max_size=40)


def rebuild(header: bytes, payload: bytes) -> bytes:
    out = bytearray(header[:61]) + payload
    struct.pack_into(">i", out, 8, len(out) - 12)
    struct.pack_into(">I", out, 17, crc32c.crc32c(bytes(out[21:])))
    return bytes(out)


@st.composite
def mutated_requests(draw):
    recs = [(k, v, h, 1_700_000_000_000 + ts) for k, v, h, ts in draw(records_st)]
    codec = draw(st.sampled_from(CODECS))
    batch = build_batch(recs, compression=codec)
    kind = draw(st.sampled_from(["none", "record-byte", "payload-byte", "count", "offset-delta", "cut",
                                 "extend", "codec", "control", "insert"]))
    raw = build_batch(recs)[61:]  # uncompressed records
    if kind == "record-byte":
        i = draw(st.integers(0, len(raw) - 1))
        mutated = bytearray(raw)
        mutated[i] = draw(st.integers(0, 255))
        payload = bytes(mutated) if codec == Compression.NONE else compress(codec, bytes(mutated))
        return rebuild(batch, payload)
    if kind == "payload-byte":
        payload = bytearray(batch[61:])
        i = draw(st.integers(0, len(payload) - 1))
        payload[i] = draw(st.integers(0, 255))
        return rebuild(batch, bytes(payload))
    if kind in ("count", "offset-delta"):
        out = bytearray(batch)
        n = draw(st.integers(-2, len(recs) + 3))
        if kind == "count":
            struct.pack_into(">i", out, 57, n)
            if draw(st.booleans()):
                struct.pack_into(">i", out, 23, n - 1)
        else:
            struct.pack_into(">i", out, 23, n)
        return rebuild(bytes(out), bytes(out[61:]))
    if kind == "cut":
        cut = draw(st.integers(1, len(raw)))
        body = raw[:-cut]
        return rebuild(batch, body if codec == Compression.NONE else compress(codec, body))
    if kind == "extend":
        extra = draw(st.binary(min_size=1, max_size=20))
        body = raw + extra
        return rebuild(batch, body if codec == Compression.NONE else compress(codec, body))
    if kind == "insert":
        i = draw(st.integers(0, len(raw)))
        body = raw[:i] + draw(st.binary(min_size=1, max_size=4)) + raw[i:]
        return rebuild(batch, body if codec == Compression.NONE else compress(codec, body))
    if kind in ("codec", "control"):
        out = bytearray(batch)
        attrs = struct.unpack_from(">h", out, 21)[0]
        attrs = (attrs & ~7) | draw(st.integers(5, 7)) if kind == "codec" else attrs | 0x20
        struct.pack_into(">h", out, 21, attrs)
        return rebuild(bytes(out), bytes(out[61:]))
    return batch


WALKS = {"exact": (1 << 30, 1 << 30), "runs": (1, 1 << 30), "vectorized": (1 << 30, 1), "default": None}


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_requests(), st.sampled_from(sorted(WALKS)))
def test_only_valid_batches_are_stored_and_every_valid_one_is(batch: bytes, walk: str) -> None:
    # Batches this small take the exact walk at the broker's thresholds; the examples are
    # spread over the walks (lowering one threshold and raising the other) so that each
    # is judged by the same reference.
    thresholds = records.RUN_WALK_MIN_RECORDS, records.FAST_WALK_MIN_RECORDS
    if WALKS[walk] is not None:
        records.RUN_WALK_MIN_RECORDS, records.FAST_WALK_MIN_RECORDS = WALKS[walk]
    event(f"walk={walk}")
    with tempfile.TemporaryDirectory() as tmp:
        log = PartitionLog.open(Path(tmp) / "t-0", LogConfig())
        try:
            expected = reference_valid(batch)
            event(f"valid={expected}")
            try:
                log.append(validate_produce_batch(batch).batch, 1_700_000_000_000, defer_flush=True)
                stored = True
            except ApiError:
                stored = False
            assert stored == expected, f"stored={stored} but the reference says valid={expected}"
            if stored:
                count = read_header(batch).records_count
                assert log.log_end_offset == count
                assert [r.offset for r in decode_records(log.read(0, 1 << 20))] == list(range(count))
            else:
                assert log.log_end_offset == 0
        finally:
            log.close()
            records.RUN_WALK_MIN_RECORDS, records.FAST_WALK_MIN_RECORDS = thresholds
