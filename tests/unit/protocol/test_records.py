"""Produce-time record validation: what is refused, with which code and record index; rewrites."""

from __future__ import annotations

import struct

import crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shoal.errors import ApiError, ErrorCode
from shoal.protocol import records as R
from shoal.protocol.batch import Compression, build_batch, decode_records, read_header, validate_batches
from shoal.protocol.records import RecordsError, validate_produce_batch, walk_records
from tests.support.wire import raw_batch

TS = 1_700_000_000_000


def batch(n: int = 3, compression: int = Compression.NONE, **kw) -> bytes:
    return build_batch([(b"k%d" % i, b"v" * (i % 7), (("h", b"x"),) if i % 2 else (), TS + i) for i in range(n)],
                       compression=compression, **kw)


def payload(n: int) -> bytes:
    return batch(n)[61:]


def refused(data: bytes, **kw) -> RecordsError | ApiError:
    with pytest.raises(ApiError) as exc:
        validate_produce_batch(data, **kw)
    return exc.value


@pytest.mark.parametrize("codec", [Compression.NONE, Compression.GZIP, Compression.SNAPPY, Compression.LZ4,
                                   Compression.ZSTD])
@pytest.mark.parametrize("n", [1, 5, 40])
def test_valid_batches_pass_untouched(codec, n):
    data = batch(n, codec)
    v = validate_produce_batch(data)
    assert v.batch is data and not v.rewritten


def test_count_larger_than_records_names_the_first_missing_record():
    big = build_batch(
        [(b"key-%d" % i, b"value" * 5, (), TS) for i in range(3)])
    e = refused(raw_batch(big[61:], 5))
    assert e.error_code == ErrorCode.invalid_record and e.record_index == 3
    # a count the bytes cannot possibly hold: refused from the header alone
    assert refused(raw_batch(payload(3), 50)).error_code == ErrorCode.invalid_record


def test_bytes_after_the_declared_records_are_refused():
    e = refused(raw_batch(payload(3), 2))
    assert e.error_code == ErrorCode.invalid_record


@pytest.mark.parametrize("attrs", [5, 6, 7])
def test_unknown_codecs_are_corrupt(attrs):
    assert refused(raw_batch(payload(2), 2, attributes=attrs)).error_code == ErrorCode.corrupt_message


@pytest.mark.parametrize("attrs,junk", [(1, b"\x1f\x8b\x08\x00garbage!"), (2, b"\xff\xff\xff\xff\x0fxx"),
                                        (3, b"\x04\x22\x4d\x18junk"), (4, b"\x28\xb5\x2f\xfdjunk")])
def test_corrupt_compressed_payloads_are_corrupt(attrs, junk):
    assert refused(raw_batch(junk, 2, attributes=attrs)).error_code == ErrorCode.corrupt_message


def test_control_batches_and_bad_headers_are_invalid():
    assert refused(raw_batch(payload(1), 1, attributes=0x20)).error_code == ErrorCode.invalid_record
    assert refused(raw_batch(payload(3), 3, last_offset_delta=4)).error_code == ErrorCode.invalid_record
    assert refused(raw_batch(b"", 0)).error_code == ErrorCode.invalid_record
    assert refused(raw_batch(payload(1), 1, producer_id=5, base_sequence=-1)).error_code == ErrorCode.invalid_record
    assert refused(batch(2) + batch(2)).error_code == ErrorCode.invalid_record  # two batches for one partition


def test_crc_mismatch_stays_corrupt():
    data = bytearray(batch(3))
    data[-1] ^= 1
    assert refused(bytes(data)).error_code == ErrorCode.corrupt_message


def test_offset_delta_must_be_the_index():
    data = build_batch([(None, b"a", (), TS), (None, b"b", (), TS)], offset_deltas=[0, 5], last_offset_delta=1)
    e = refused(data)
    assert e.error_code == ErrorCode.invalid_record and e.record_index == 1


def test_null_header_key_and_negative_header_count_are_invalid():
    rec = bytes([0, 0, 2, 1, 2]) + b"v" + bytes([2]) + bytes([1]) + bytes([1])  # 1 header, key length -1
    body = bytes([len(rec) << 1]) + rec
    e = refused(raw_batch(body, 1))
    assert e.error_code == ErrorCode.invalid_record and e.record_index == 0
    rec = bytes([0, 0, 0, 1, 1, 3])  # header count -2
    assert refused(raw_batch(bytes([len(rec) << 1]) + rec, 1)).record_index == 0


def test_compacted_topics_need_keys():
    data = build_batch([(b"k", b"v", (), TS), (None, b"v", (), TS)])
    assert refused(data, require_keys=True).record_index == 1
    validate_produce_batch(data)


def test_max_timestamp_is_set_from_the_records_as_kafka_does():
    data = bytearray(batch(4))
    struct.pack_into(">q", data, 35, TS + 100)
    struct.pack_into(">I", data, 17, crc32c.crc32c(bytes(data[21:])))
    v = validate_produce_batch(bytes(data))
    assert v.rewritten
    (h,) = validate_batches(v.batch)
    assert h.max_timestamp == TS + 3
    assert validate_produce_batch(bytes(data), log_append_time=True).rewritten is False


@pytest.mark.parametrize("source", [Compression.NONE, Compression.GZIP, Compression.LZ4])
@pytest.mark.parametrize("target", [Compression.NONE, Compression.ZSTD, Compression.SNAPPY])
def test_topic_compression_type_recompresses(source, target):
    data = batch(6, source, producer_id=7, producer_epoch=1, base_sequence=3)
    v = validate_produce_batch(data, target_codec=target)
    assert v.rewritten == (source != target)
    (h,) = validate_batches(v.batch)
    old = read_header(data)
    assert h.compression == target
    assert (h.producer_id, h.producer_epoch, h.base_sequence, h.records_count, h.max_timestamp) == (
        old.producer_id, old.producer_epoch, old.base_sequence, old.records_count, old.max_timestamp)
    assert decode_records(v.batch) == decode_records(data)


def test_codec_names():
    assert R.codec_of_compression_type("producer") is None
    assert R.codec_of_compression_type("uncompressed") == Compression.NONE
    assert R.codec_of_compression_type("zstd") == Compression.ZSTD


# --- the vectorized walk agrees with the exact one ---------------------------------------

record = st.tuples(st.one_of(st.none(), st.binary(max_size=300)), st.one_of(st.none(), st.binary(max_size=9000)),
                   st.lists(st.tuples(st.text(max_size=3), st.one_of(st.none(), st.binary(max_size=5))),
                            max_size=3),
                   st.integers(-20_000, 20_000))


@settings(max_examples=60, deadline=None)
@given(st.lists(record, min_size=16, max_size=40), st.data())
def test_fast_walk_agrees_with_the_exact_walk(recs, data):
    raw = build_batch([(k, v, h, TS + t) for k, v, h, t in recs])
    body = bytearray(raw[61:])
    if data.draw(st.booleans()):
        body[data.draw(st.integers(0, len(body) - 1))] = data.draw(st.integers(0, 255))
    body = bytes(body)
    try:
        exact = walk_records(body, 0, len(body), len(recs))
    except RecordsError:
        exact = None
    fast = R._walk_fast(body, 0, len(body), len(recs), False)
    assert fast is None or fast == exact


@pytest.mark.parametrize("n,size,headers", [(16, 10, 0), (10_000, 100, 0), (300, 1024, 2)])
def test_fast_walk_proves_typical_batches(n, size, headers):
    """Producer-shaped batches take the vectorized path (else produce pays the exact walk's cost)."""
    raw = build_batch([(None, b"x" * size, (("trace", b"abc"),) * headers, TS + i // 50) for i in range(n)])
    assert R._walk_fast(raw, 61, len(raw), n, False) == (n - 1) // 50


@pytest.mark.parametrize("codec", [Compression.GZIP, Compression.SNAPPY, Compression.LZ4, Compression.ZSTD])
def test_decompression_is_bounded(codec):
    """A small batch that expands past the limit is refused, not held in memory."""
    from shoal.protocol.batch import _compress

    body = payload(40)
    packed = _compress(codec, body)
    assert R.decompress_bounded(codec, packed, limit=len(body)) == body
    e = refused_bounded(codec, packed, len(body) - 1)
    assert e.error_code == ErrorCode.corrupt_message and "expands past" in e.message
    zeros = _compress(codec, bytes(8 << 20))
    assert refused_bounded(codec, zeros, 1 << 20).error_code == ErrorCode.corrupt_message


def refused_bounded(codec: int, data: bytes, limit: int) -> RecordsError:
    with pytest.raises(RecordsError) as exc:
        R.decompress_bounded(codec, data, limit=limit)
    return exc.value


@pytest.mark.parametrize("codec", [Compression.GZIP, Compression.LZ4, Compression.ZSTD])
def test_truncated_compressed_payloads_are_corrupt(codec):
    from shoal.protocol.batch import _compress

    packed = _compress(codec, payload(40))
    assert refused_bounded(codec, packed[: len(packed) // 2], 1 << 20).error_code == ErrorCode.corrupt_message


def strict_chain(body: bytes, n: int) -> list[int] | None:
    """Record ends by their (signed) length varints, as the exact walk reads them."""
    ends, pos = [], 0
    for _ in range(n):
        try:
            length, pos = R._varint(body, pos, len(body), 5, 0)
        except RecordsError:
            return None
        if length < 6:  # a record's six one-byte fields at least, as the walks require
            return None
        pos += length
        ends.append(pos)
    return ends if pos == len(body) else None


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 40), st.sampled_from([0, 5, 100, 300])), min_size=1, max_size=6),
       st.data())
def test_strided_chain_is_the_record_by_record_chain(runs, data):
    """Runs of equal-size records are found by stride; the result is exactly the plain chain."""
    import numpy as np

    recs = [(None, b"v" * size, (), TS) for count, size in runs for _ in range(count)]
    body = bytearray(build_batch(recs)[61:])
    if data.draw(st.booleans()):
        body[data.draw(st.integers(0, len(body) - 1))] = data.draw(st.integers(0, 255))
    body = bytes(body)
    n = len(recs)
    plain = strict_chain(body, n)
    strided = R._chain_strided(body, np.frombuffer(body, dtype=np.uint8), 0, len(body), n, len(body) - 1)
    if strided is not None:
        assert plain is not None and strided.tolist() == plain
    elif plain is not None:
        # only more runs of equal sizes than it tries may send it back to the plain chain
        sizes = [b - a for a, b in zip([0] + plain[:-1], plain)]
        runs_seen = 1 + sum(1 for a, b in zip(sizes, sizes[1:]) if a != b)
        assert runs_seen > R._MAX_STRIDES


def test_strided_chain_refuses_lengths_the_exact_walk_refuses():
    """Every one-byte change to four small records: the stride guess never keeps a record
    shorter than six bytes (a length varint of 0x00, or 0x8a 0x00 that still adds up to the
    run's size), so it agrees with the record-by-record chain."""
    import numpy as np

    recs = [(None, b"", (), TS) for _ in range(4)]
    orig = build_batch(recs)[61:]
    for i in range(len(orig)):
        for v in range(256):
            body = bytearray(orig)
            body[i] = v
            body = bytes(body)
            strided = R._chain_strided(body, np.frombuffer(body, dtype=np.uint8), 0, len(body), 4, len(body) - 1)
            if strided is not None:
                assert strided.tolist() == strict_chain(body, 4), (i, v)


# --- the run walk agrees with the exact one ---------------------------------------------

def outcome(walk):
    """What a walk says: ("ok", largest delta) or ("refused", record index, message)."""
    try:
        return ("ok", walk())
    except RecordsError as e:
        return ("refused", e.record_index, e.message)


def agree(body: bytes, n: int, require_keys: bool = False) -> bool:
    """The run walk gives the exact walk's answer (or None: it leaves the batch to the others).
    Returns whether it answered."""
    exact = outcome(lambda: walk_records(body, 0, len(body), n, require_keys=require_keys))
    runs = outcome(lambda: R._walk_runs(body, 0, len(body), n, require_keys))
    if runs == ("ok", None):
        return False
    assert runs == exact
    return True


shaped_run = st.tuples(st.integers(1, 90), st.one_of(st.none(), st.binary(min_size=0, max_size=3)),
                       st.integers(0, 200), st.sampled_from([(), (("h", b"x"),), (("trace", b""), ("k", b"12"))]),
                       st.sampled_from(["inc", "flat", "wide", "neg", "shuffled", "shuffled-wide"]))


@settings(max_examples=80, deadline=None)
@given(st.lists(shaped_run, min_size=1, max_size=5), st.data())
def test_run_walk_agrees_with_the_exact_walk(runs, data):
    """Runs of records of one shape (key, value size, headers), with timestamps in order,
    flat, spread over two- and three-byte deltas, falling or shuffled (more runs, as
    the deltas' widths vary); sometimes a byte changed or
    the count off by one. The run walk answers as the exact walk does, with the same
    record index and message when it refuses."""
    rnd = data.draw(st.randoms(use_true_random=False))
    recs = []
    for count, key, size, headers, ts in runs:
        for j in range(count):
            delta = {"inc": j, "flat": 5, "wide": 150 * j, "neg": -3 * j - 1, "shuffled": rnd.randrange(0, 60),
                     "shuffled-wide": rnd.randrange(0, 8000) if j % 9 else rnd.randrange(0, 60)}[ts]
            recs.append((key, b"v" * size, headers, TS + delta))
    body = bytearray(build_batch(recs)[61:])
    if data.draw(st.booleans()):
        body[data.draw(st.integers(0, len(body) - 1))] = data.draw(st.integers(0, 255))
    n = len(recs) + data.draw(st.sampled_from([0, 0, 0, -1, 1]))
    answered = agree(bytes(body), max(n, 1), require_keys=data.draw(st.booleans()))
    if len(runs) <= 2 and n == len(recs) and all(not r[4].startswith("shuffled") for r in runs) and bytes(body) == build_batch(recs)[61:]:
        assert answered  # few shapes: no need of another walk


def test_run_walk_agrees_after_every_one_byte_change():
    """Every value of every byte of a small batch: two shapes (key, header, one- and
    two-byte timestamp deltas out of order), with and without compacted-topic keys."""
    recs = ([(b"kk", b"vvv", (("h", b"x"),), TS + 70 * i) for i in range(3)]
            + [(b"kk", b"vvvv", (("h", b"x"),), TS + 3) for _ in range(2)] + [(None, b"", (), TS)])
    orig = build_batch(recs)[61:]
    answered = 0
    for i in range(len(orig)):
        for v in range(256):
            body = bytearray(orig)
            body[i] = v
            answered += agree(bytes(body), len(recs), require_keys=i % 2 == 1)
    assert answered == len(orig) * 256  # six records never take more runs than it tries


@pytest.mark.parametrize("n,size,key,headers,spread", [
    (8, 10, None, 0, 1), (10_000, 100, None, 0, 50), (950, 1024, None, 0, 1), (300, 1024, b"key", 2, 1),
    (2000, 100, None, 0, 0.01), (20_000, 20, b"k", 1, 7)])
def test_run_walk_proves_typical_batches(n, size, key, headers, spread):
    """Producer-shaped batches (also with three-byte offset deltas past 8192 records and
    two-byte timestamp deltas) take the run walk, whose cost is a few us per run."""
    raw = build_batch([(key, b"x" * size, (("trace", b"abc"),) * headers, TS + int(i // spread)) for i in range(n)])
    assert R._walk_runs(raw, 61, len(raw), n, False) == int((n - 1) // spread)


def records_with_deltas(deltas: list[int], value: bytes = b"v") -> bytes:
    """Record bytes (no key, no headers) with these timestamp deltas, negative ones too."""
    from shoal.protocol.batch import _write_varint

    body = bytearray()
    for i, d in enumerate(deltas):
        rec = bytearray(b"\x00")
        _write_varint(rec, d)
        _write_varint(rec, i)
        rec += b"\x01"  # null key
        _write_varint(rec, len(value))
        rec += value + b"\x00"
        _write_varint(body, len(rec))
        body += rec
    return bytes(body)


@pytest.mark.parametrize("deltas", [[5, 60, 2, 7], [-1, -5, -64, -2], [100, 8000, 130, 7999], [300, -300, 200, 100],
                                    [9000, 70000, 8200, 9001], [-90, -8000, -200, -100], [63, -64, 0, 62],
                                    [130, 129, 140, 135], [130, 140, 129, 141]])
def test_run_walk_finds_the_largest_timestamp_in_any_order(deltas):
    """The last record's delta is only a guess: deltas out of order, negative, of one,
    two or three bytes (each list of one width)."""
    body = records_with_deltas(deltas * 4)
    assert walk_records(body, 0, len(body), 16) == max(deltas)
    assert R._walk_runs(body, 0, len(body), 16, False) == max(deltas)


def test_a_corrupted_record_deep_in_a_large_batch_is_named():
    """The run walk checks every record: a bad offset delta, length, header count or a
    cut at record 250 of 300 is refused with index 250, whatever codec."""
    recs = [(None, b"x" * 1024, (), TS + i // 10) for i in range(300)]
    body = build_batch(recs)[61:]
    size = len(body) // 300 + 1  # records 64 and later: 3 + 1 + 1 + 2 + 1 + 2 + 1024 + 1
    at = 64 * (size - 1) + (250 - 64) * size
    assert R._varint(body, at + 2 + 1 + 1, len(body), 5, 0) == (250, at + 2 + 1 + 1 + 2)
    for offset, value in ((4, 0x02), (0, 0x10), (size - 1, 0x02)):
        bad = bytearray(body)
        bad[at + offset] = value
        for codec in (Compression.NONE, Compression.ZSTD):
            from shoal.protocol.batch import _compress
            payload = bytes(bad) if codec == Compression.NONE else _compress(codec, bytes(bad))
            e = refused(raw_batch(payload, 300, attributes=codec))
            assert e.error_code == ErrorCode.invalid_record and e.record_index == 250, (offset, e.message)
    e = refused(raw_batch(body[: at + 100], 300))
    assert e.record_index == 250
