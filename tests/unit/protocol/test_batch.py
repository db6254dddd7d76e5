"""Record batch v2 header view: parsing, validation, rewriting, building, decoding."""

from __future__ import annotations

import struct

import pytest

from shoal.errors import ApiError, ErrorCode
from shoal.protocol.batch import (
    HEADER_SIZE,
    Compression,
    CorruptBatchError,
    TimestampType,
    build_batch,
    compute_crc,
    decode_columns,
    decode_records,
    read_header,
    scan_valid_prefix,
    validate_batches,
    with_base_offset,
)

RECS = [(b"k1", b"v1", [("h", b"x")], 1000), (None, b"v2", [], 1005), (b"k3", None, [], 1002)]


def kafka_python_batch(codec: int, n: int = 5, pid: int = -1, epoch: int = -1, seq: int = -1) -> bytes:
    dr = pytest.importorskip("kafka.record.default_records")
    codecs = pytest.importorskip("kafka.codec")
    if codec == Compression.SNAPPY and not codecs.has_snappy():
        pytest.skip("kafka-python has no snappy library here")
    b = dr.DefaultRecordBatchBuilder(magic=2, compression_type=codec, is_transactional=False, producer_id=pid,
                                     producer_epoch=epoch, base_sequence=seq, batch_size=1 << 20)
    for i in range(n):
        b.append(i, timestamp=2000 + i, key=b"key%d" % i, value=b"value-%d" % i * 20, headers=[("a", b"b")])
    return bytes(b.build())


def test_header_fields_of_built_batch():
    data = build_batch(RECS, base_offset=7, producer_id=42, producer_epoch=3, base_sequence=10)
    h = read_header(data)
    assert (h.base_offset, h.magic, h.records_count, h.last_offset_delta) == (7, 2, 3, 2)
    assert (h.base_timestamp, h.max_timestamp) == (1000, 1005)
    assert (h.producer_id, h.producer_epoch, h.base_sequence, h.last_sequence) == (42, 3, 10, 12)
    assert h.size == len(data) and h.end == len(data)
    assert h.compression == Compression.NONE and not h.is_transactional and not h.is_control
    assert compute_crc(data, h) == h.crc
    assert [(r.offset, r.timestamp, r.key, r.value) for r in decode_records(data)] == [
        (7, 1000, b"k1", b"v1"), (8, 1005, None, b"v2"), (9, 1002, b"k3", None)]
    assert decode_records(data)[0].headers == (("h", b"x"),)


@pytest.mark.parametrize("codec", [Compression.NONE, Compression.GZIP, Compression.SNAPPY, Compression.LZ4,
                                   Compression.ZSTD])
def test_kafka_python_batches_validate_and_decode(codec):
    data = kafka_python_batch(codec, n=5, pid=9, epoch=1, seq=0)
    (h,) = validate_batches(data)
    assert h.compression == codec and h.records_count == 5 and h.producer_id == 9
    recs = decode_records(data)
    assert [r.key for r in recs] == [b"key%d" % i for i in range(5)]
    assert recs[4].timestamp == 2004 and recs[2].headers == (("a", b"b"),)


@pytest.mark.parametrize("codec", [Compression.GZIP, Compression.SNAPPY, Compression.LZ4, Compression.ZSTD])
def test_build_compressed_roundtrip(codec):
    data = build_batch(RECS, compression=codec)
    assert read_header(data).compression == codec
    assert [r.value for r in decode_records(data)] == [b"v1", b"v2", None]


def test_iterates_several_batches():
    buf = build_batch(RECS) + build_batch(RECS[:1], base_offset=3) + kafka_python_batch(Compression.GZIP)
    hs = validate_batches(memoryview(buf))
    assert [h.records_count for h in hs] == [3, 1, 5]
    assert hs[1].position == hs[0].end and hs[-1].end == len(buf)


def test_crc_mismatch_is_corrupt_message():
    data = bytearray(build_batch(RECS))
    data[-1] ^= 0xFF
    with pytest.raises(CorruptBatchError) as ei:
        validate_batches(data)
    assert ei.value.error_code == ErrorCode.corrupt_message
    assert isinstance(ei.value, ApiError)
    validate_batches(data, check_crc=False)  # framing alone is fine


def test_base_offset_and_leader_epoch_are_outside_the_crc():
    data = bytearray(build_batch(RECS))
    struct.pack_into(">q", data, 0, 12345)
    struct.pack_into(">i", data, 12, 7)
    validate_batches(data)


@pytest.mark.parametrize("mutate", [
    lambda d: d[:HEADER_SIZE - 1],                          # short header
    lambda d: d[:-1],                                       # torn records
    lambda d: d[:16] + b"\x01" + d[17:],                    # magic 1
    lambda d: d[:8] + struct.pack(">i", 10) + d[12:],       # length below the header
    lambda d: d[:8] + struct.pack(">i", 10**6) + d[12:],    # length past the end
    lambda d: d[:57] + struct.pack(">i", -1) + d[61:],      # negative count
    lambda d: d[:57] + struct.pack(">i", 10**6) + d[61:],   # count the batch cannot hold
    lambda d: b"",                                          # nothing
    lambda d: d + b"\x00" * 5,                              # trailing garbage
])
def test_framing_faults(mutate):
    with pytest.raises(CorruptBatchError) as ei:
        validate_batches(mutate(build_batch(RECS)))
    assert ei.value.error_code == ErrorCode.corrupt_message


def test_scan_valid_prefix_stops_at_first_fault():
    a, b = build_batch(RECS), build_batch(RECS, base_offset=3)
    bad = bytearray(b)
    bad[70] ^= 1
    headers, end = scan_valid_prefix(a + b + bytes(bad) + a)
    assert len(headers) == 2 and end == len(a) + len(b)
    headers, end = scan_valid_prefix(a + b[:30])
    assert len(headers) == 1 and end == len(a)


def test_with_base_offset_and_log_append_time():
    data = build_batch(RECS)
    h = read_header(data)
    out = with_base_offset(data, h, 100)
    assert read_header(out).base_offset == 100 and bytes(out[8:]) == data[8:]
    out = with_base_offset(data, h, 100, log_append_time_ms=99999)
    (h2,) = validate_batches(out)
    assert h2.timestamp_type == TimestampType.LOG_APPEND_TIME and h2.max_timestamp == 99999
    assert all(r.timestamp == 99999 for r in decode_records(out))
    assert [r.offset for r in decode_records(out)] == [100, 101, 102]


def test_rewrite_compressed_batch_without_decompressing():
    data = kafka_python_batch(Compression.ZSTD)
    h = read_header(data)
    out = with_base_offset(data, h, 50, log_append_time_ms=5)
    validate_batches(out)
    assert bytes(out[HEADER_SIZE:]) == data[HEADER_SIZE:]
    assert [r.offset for r in decode_records(out)] == [50, 51, 52, 53, 54]


def test_control_and_transactional_attributes():
    h = read_header(build_batch(RECS[:1], transactional=True, control=True))
    assert h.is_transactional and h.is_control


def _columns(buf: bytes, **kw):  # type: ignore[no-untyped-def]
    offsets, timestamps, keys, values, headers = [], [], [], [], []  # type: ignore[var-annotated]
    n = decode_columns(buf, read_header(buf), offsets, timestamps, keys, values, headers, **kw)
    assert n == len(offsets) == len(timestamps) == len(keys) == len(values) == len(headers)
    return list(zip(offsets, timestamps, keys, values, headers, strict=True))


@pytest.mark.parametrize("codec", [Compression.NONE, Compression.GZIP, Compression.ZSTD])
@pytest.mark.parametrize("log_append", [False, True])
def test_decode_columns_matches_decode_records(codec: int, log_append: bool) -> None:
    # varints of one, two and more bytes: short and 200 B / 70 KiB values, keys and none,
    # timestamp deltas small, large and negative, offset deltas past 64 and 8192
    recs = [(None if i % 3 == 0 else b"k%d" % i, None if i % 7 == 0 else b"v" * (i * 37 % 300),
             [("h%d" % i, b"x")] if i % 5 == 0 else [], 1_700_000_000_000 + (i * 977 % 5000) - 2000)
            for i in range(120)]
    recs.append((b"big", b"B" * 70_000, [("a", None)], 1_700_000_000_000))
    deltas = [i * 90 for i in range(len(recs))]
    ts_type = TimestampType.LOG_APPEND_TIME if log_append else TimestampType.CREATE_TIME
    buf = build_batch(recs, base_offset=1000, offset_deltas=deltas, compression=codec, timestamp_type=ts_type)
    want = [(r.offset, r.timestamp, r.key, r.value, list(r.headers)) for r in decode_records(buf)]
    assert _columns(buf) == want
    lo, hi = 1000 + 90 * 10, 1000 + 90 * 100 + 5  # only the offsets in [lo, hi]
    assert _columns(buf, lo=lo, hi=hi) == [w for w in want if lo <= w[0] <= hi]
    # without a headers list the headers are skipped
    offsets, ts, keys, values = [], [], [], []  # type: ignore[var-annotated]
    assert decode_columns(buf, read_header(buf), offsets, ts, keys, values) == len(want)
    assert list(zip(offsets, ts, keys, values, strict=True)) == [w[:4] for w in want]


def test_decode_columns_refuses_a_truncated_record() -> None:
    buf = bytearray(build_batch(RECS))
    h = read_header(buf)
    buf[h.position + HEADER_SIZE] = 0x7E  # the first record claims 63 bytes
    with pytest.raises(CorruptBatchError):
        decode_columns(bytes(buf), h, [], [], [], [])
    buf = bytearray(build_batch([(b"k", b"v" * 200, [], 5)]))
    del buf[-150:]  # a record cut short inside its batch
    with pytest.raises(CorruptBatchError):
        decode_columns(bytes(buf), read_header(buf, whole=False), [], [], [], [])
