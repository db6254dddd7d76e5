"""Produce-time validation of the records inside v2 batches, as Kafka's LogValidator does it.

Theory of operation
-------------------
:mod:`shoal.protocol.batch` checks what the batch header promises (framing, magic,
CRC-32C).  A CRC only proves the bytes arrived as the client wrote them; a client can
still write garbage records, a record count that the records do not fill, a codec id
that does not exist, or a control batch.  Kafka refuses all of these before anything is
written (``LogValidator.validateMessagesAndAssignOffsets``, ``DefaultRecord.readFrom``,
``DefaultRecordBatch.RecordIterator``); so does :func:`validate_produce_batch`:

* one batch per partition of a Produce request (v2 batches: Kafka's "Compressed outer
  record has more than one batch"); ``records_count >= 1`` and
  ``last_offset_delta == records_count - 1``; no control batch from a client; a batch
  with a producer id carries a sequence (``INVALID_RECORD``);
* the codec id is one of Kafka's five (``CORRUPT_MESSAGE`` otherwise); a compressed
  payload must decompress (``CORRUPT_MESSAGE``);
* every record is walked (:func:`walk_records`): its length varint, attributes,
  timestamp delta (varlong), offset delta (must be the record's index, as every client
  writes it and as Kafka expects of compressed batches), key and value lengths inside
  the record, header count (not negative, not above the bytes left), header keys (not
  null) and values; the record must end exactly where its length says, and after the
  declared count nothing may remain (``INVALID_RECORD`` with the record's index).

What comes back is a :class:`Validated`: the batch bytes to append (the same object
unless a rewrite is needed) and the index of the record at fault when there is one.
Rewrites happen only where Kafka rewrites: the max timestamp of a CreateTime batch is
set to its largest record timestamp (Kafka's ``setMaxTimestamp``), and a topic whose
``compression.type`` is not ``producer`` gets the batch recompressed with its codec
(the record bytes are kept as they are: offsets and timestamps are deltas, so only the
payload and the header's codec bits, length and CRC change).

Cost: decompression is done by the codec libraries (C, releasing the GIL) and bounded
(``MAX_DECOMPRESSED_BYTES``); the shell runs the compressed case in a worker thread.
Batches of 16 records or more are walked with numpy (:func:`_walk_fast`): the record
boundaries are found by stride when records come in runs of one size (else by a short
Python loop over the length varints), then every field of every record is decoded and
checked as arrays.  Any doubt sends the batch to the exact walk (:func:`walk_records`,
plain Python), which is the reference and names the record at fault.  Figures:
``benchmarks/records_bench.py``.  This module is pure: no files, clock or sockets.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import crc32c as _crc32c_mod

from shoal.errors import ApiError, ErrorCode
from shoal.protocol.batch import (
    COMPRESSION_MASK,
    CONTROL_BIT,
    HEADER_SIZE,
    LOG_OVERHEAD,
    TIMESTAMP_TYPE_BIT,
    BatchHeader,
    Compression,
    _compress,
    validate_batches,
)

__all__ = [
    "RecordsError",
    "Validated",
    "TOPIC_COMPRESSION",
    "codec_of_compression_type",
    "walk_records",
    "validate_produce_batch",
    "needs_worker",
]

_CRC = struct.Struct(">I")
_I64 = struct.Struct(">q")
_ATTR = struct.Struct(">h")
_I32 = struct.Struct(">i")
_crc32c = _crc32c_mod.crc32c

KNOWN_CODECS = frozenset({Compression.NONE, Compression.GZIP, Compression.SNAPPY, Compression.LZ4, Compression.ZSTD})

TOPIC_COMPRESSION = ("uncompressed", "zstd", "lz4", "snappy", "gzip", "producer")
"""Values of the topic config ``compression.type`` (Kafka's BrokerCompressionType)."""

_CODEC_BY_NAME = {"uncompressed": Compression.NONE, "gzip": Compression.GZIP, "snappy": Compression.SNAPPY,
                  "lz4": Compression.LZ4, "zstd": Compression.ZSTD}


def codec_of_compression_type(value: str) -> int | None:
    """The codec id a topic's ``compression.type`` asks for; None for ``producer`` (keep the batch's)."""
    return _CODEC_BY_NAME.get(value)


class RecordsError(ApiError):
    """A batch the broker refuses: answer the partition with ``error_code``.

    ``record_index`` is the index (within its batch) of the record at fault, or None
    when the fault is the batch's (Produce v8+ report it in ``record_errors``).
    """

    def __init__(self, error_code: ErrorCode, message: str, record_index: int | None = None) -> None:
        super().__init__(error_code, message)
        self.record_index = record_index


@dataclass(frozen=True, slots=True)
class Validated:
    batch: bytes | bytearray
    """The batch to append: the input object, or a rewritten copy."""
    rewritten: bool
    """Whether ``batch`` differs from the input (max timestamp fixed, or recompressed)."""


def _invalid(index: int, message: str) -> RecordsError:
    return RecordsError(ErrorCode.invalid_record, f"record {index}: {message}", index)


def _varint(data: bytes, pos: int, end: int, max_bytes: int, index: int) -> tuple[int, int]:
    """A zigzag varint (max_bytes 5) or varlong (10) at ``pos``; the slow path of the walk."""
    result = 0
    shift = 0
    for i in range(max_bytes):
        if pos >= end:
            raise _invalid(index, "truncated varint")
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return (result >> 1) ^ -(result & 1), pos
        shift += 7
    raise _invalid(index, "varint too long")


def walk_records(data: bytes, pos: int, end: int, count: int, *, require_keys: bool = False) -> int:
    """Walk ``count`` records in ``data[pos:end]``; return their largest timestamp delta.

    Raises RecordsError(invalid_record, record_index) at the first record that does not
    parse as Kafka's DefaultRecord, whose offset delta is not its index, that runs past
    ``end``, or when fewer than ``count`` records are present or bytes remain after them.
    ``data`` must end at ``end`` (or hold only record bytes after it).  With
    ``require_keys`` (a compacted topic) a record without a key is refused too.

    The varints are decoded inline, one- and two-byte ones without a call: this loop is
    the cost of validating a produce request (benchmarks/produce_consume.py).
    """
    max_ts = -(1 << 63)
    i = 0
    try:
        while i < count:
            if pos >= end:
                raise _invalid(i, f"the batch declares {count} records but holds {i}")
            # record length
            v = data[pos]
            if v < 0x80:
                pos += 1
            elif data[pos + 1] < 0x80:
                v = (v & 0x7F) | (data[pos + 1] << 7)
                pos += 2
            else:
                v, pos = _varint(data, pos, end, 5, i)
                v = (v << 1) if v >= 0 else ((-v << 1) - 1)  # back to the raw zigzag form
            length = (v >> 1) ^ -(v & 1)
            rec_end = pos + length
            if length < 6 or rec_end > end:
                # attributes and five one-byte varints at least
                if length < 6:
                    raise _invalid(i, f"record length {length} too small")
                raise _invalid(i, f"record length {length} runs past the batch")
            pos += 1  # attributes: unused in v2
            # timestamp delta (varlong)
            v = data[pos]
            if v < 0x80:
                pos += 1
                ts = (v >> 1) ^ -(v & 1)
            elif data[pos + 1] < 0x80:
                v = (v & 0x7F) | (data[pos + 1] << 7)
                pos += 2
                ts = (v >> 1) ^ -(v & 1)
            else:
                ts, pos = _varint(data, pos, rec_end, 10, i)
            if ts > max_ts:
                max_ts = ts
            # offset delta: must be the record's index
            v = data[pos]
            if v < 0x80:
                pos += 1
            elif data[pos + 1] < 0x80:
                v = (v & 0x7F) | (data[pos + 1] << 7)
                pos += 2
            else:
                v, pos = _varint(data, pos, rec_end, 5, i)
                v = (v << 1) if v >= 0 else ((-v << 1) - 1)
            if v != i << 1:
                raise _invalid(i, f"offset delta {(v >> 1) ^ -(v & 1)} is not the record's index")
            # key length, -1 for null
            v = data[pos]
            if v < 0x80:
                pos += 1
            elif data[pos + 1] < 0x80:
                v = (v & 0x7F) | (data[pos + 1] << 7)
                pos += 2
            else:
                v, pos = _varint(data, pos, rec_end, 5, i)
                v = (v << 1) if v >= 0 else ((-v << 1) - 1)
            if not v & 1:
                pos += v >> 1
            elif require_keys:
                raise _invalid(i, "a compacted topic cannot accept a record without a key")
            # value length, -1 for null
            v = data[pos]
            if v < 0x80:
                pos += 1
            elif data[pos + 1] < 0x80:
                v = (v & 0x7F) | (data[pos + 1] << 7)
                pos += 2
            else:
                v, pos = _varint(data, pos, rec_end, 5, i)
                v = (v << 1) if v >= 0 else ((-v << 1) - 1)
            if not v & 1:
                pos += v >> 1
            # headers
            v = data[pos]
            if v:
                n, pos = _varint(data, pos, rec_end, 5, i)
                if n < 0 or n > rec_end - pos:
                    raise _invalid(i, f"invalid header count {n}")
                for _ in range(n):
                    hk, pos = _varint(data, pos, rec_end, 5, i)
                    if hk < 0:
                        raise _invalid(i, "header key is null")
                    pos += hk
                    hv, pos = _varint(data, pos, rec_end, 5, i)
                    if hv > 0:
                        pos += hv
                    if pos > rec_end:
                        raise _invalid(i, "header runs past the record")
            else:
                pos += 1
            if pos != rec_end:
                raise _invalid(i, f"record length {length} does not match its fields")
            i += 1
    except IndexError:
        raise _invalid(i, "record runs past the end of the batch") from None
    if pos != end:
        raise RecordsError(ErrorCode.invalid_record,
                           f"{end - pos} bytes remain after the declared {count} records")
    return max_ts if count else 0


try:  # the vectorized walk; without numpy every batch takes the exact walk
    import numpy as _np
except ImportError:  # pragma: no cover
    _np = None

FAST_WALK_MIN_RECORDS = 192
"""Batches with fewer records take the exact walk: the vectorized walk costs about 100 us
per batch in numpy calls whatever its size, and the exact walk 0.8 us per record, so they
cross near 190 records (measured for 100 B and 1 KiB values)."""
_MAX_FAST_HEADERS = 16


def _chain(data: bytes, pos: int, end: int, count: int) -> list[int] | None:
    """Where each of the ``count`` records ends, following their length varints from ``pos``.

    Reads one- and two-byte lengths only and trusts them (the caller decodes them again,
    vectorized, and compares); None if the chain does not end exactly at ``end``.
    """
    ends = [0] * count
    try:
        for i in range(count):
            v = data[pos]
            if v < 0x80:
                pos += 1 + (v >> 1)
            else:
                pos += 2 + (((v & 0x7F) | (data[pos + 1] << 7)) >> 1)
            ends[i] = pos
    except IndexError:
        return None
    if pos != end:
        return None
    return ends


_MAX_STRIDES = 8


def _chain_strided(data: bytes, arr, pos: int, end: int, count: int, limit: int):  # type: ignore[no-untyped-def]
    """Where each record ends, when records come in runs of equal size (numpy); else None.

    Producers often write records of one size, changing only when a varint grows (the
    offset delta at 64 and 8192, the timestamp delta at 64 ms): the records from ``pos``
    are guessed to repeat the size of the first one, the guess is checked by decoding
    every guessed record's length, and a new run starts at the first record that differs.
    Each kept record's length was decoded and equals the run's size, so the result is
    exactly the chain :func:`_chain` follows.  None after ``_MAX_STRIDES`` runs (sizes
    vary: the caller follows the chain record by record) or if it does not end at ``end``.
    """
    np = _np
    out = np.empty(count, dtype=np.int64)
    i = 0
    p = pos
    for _ in range(_MAX_STRIDES):
        if i == count:
            break
        if p > limit:
            return None
        try:
            length, after = _varint(data, p, end, 4, 0)
        except RecordsError:
            return None
        if length < 6:  # a record's six one-byte fields at least, as the exact walk requires
            return None
        size = after - p + length
        starts = p + size * np.arange(count - i, dtype=np.int64)
        # a record takes 7 bytes at least, so a real one starts 6 bytes before the end or
        # earlier; guesses past the first differing record may land anywhere
        starts = starts[starts <= limit - 6]
        lengths, after = _vec_varint(arr, starts, limit, lenient=True)
        sizes = after - starts + lengths
        bad = np.flatnonzero((sizes != size) | (lengths < 6))
        run = int(bad[0]) if len(bad) else len(starts)
        out[i : i + run] = starts[:run] + size
        i += run
        p += size * run
    else:
        if i < count:
            return None
    if i != count or p != end:
        return None
    return out


def _vec_varint(arr, p, limit: int, *, lenient: bool = False):  # type: ignore[no-untyped-def]
    """Decode the zigzag varints (up to four bytes) at positions ``p`` (numpy).

    Returns (values, positions after them), or None if any is longer; with ``lenient``
    a longer one gets a value below any real one (-2**40) instead.
    """
    np = _np
    b = arr[p].astype(np.int64)  # past the end: IndexError, which _walk_fast turns into "not proven"
    cont = b >= 0x80
    if not cont.any():
        return (b >> 1) ^ -(b & 1), p + 1
    raw = b & 0x7F
    width = np.ones_like(p)
    for k in (1, 2, 3):
        b = arr[p + k].astype(np.int64)
        raw |= np.where(cont, (b & 0x7F) << (7 * k), 0)
        width += cont
        cont &= b >= 0x80
        if not cont.any():
            return (raw >> 1) ^ -(raw & 1), p + width
    if not lenient:
        return None
    values = (raw >> 1) ^ -(raw & 1)
    values[cont] = -(1 << 40)
    return values, p + width


def _walk_fast(data: bytes, pos: int, end: int, count: int, require_keys: bool) -> int | None:
    """The same checks as :func:`walk_records`, vectorized; the largest timestamp delta if valid.

    Returns None when the batch is not proven valid (any fault, or a varint longer than
    four bytes, or many headers): the caller then runs the exact walk, which raises with
    the record's index or returns.  Never raises for bad data.
    """
    try:
        return _walk_vectorized(data, pos, end, count, require_keys)
    except IndexError:  # a position past the data: not a valid batch
        return None


def _walk_vectorized(data: bytes, pos: int, end: int, count: int, require_keys: bool) -> int | None:
    np = _np
    arr = np.frombuffer(data, dtype=np.uint8)
    limit = len(data) - 1
    rec_end = _chain_strided(data, arr, pos, end, count, limit)
    if rec_end is None:
        ends = _chain(data, pos, end, count)
        if ends is None:
            return None
        rec_end = np.array(ends, dtype=np.int64)
    at = np.empty_like(rec_end)  # where each record's length varint is
    at[0] = pos
    at[1:] = rec_end[:-1]
    r = _vec_varint(arr, at, limit)
    if r is None:
        return None
    length, p = r
    if (length < 6).any() or not np.array_equal(p + length, rec_end):
        return None
    p = p + 1  # attributes
    r = _vec_varint(arr, p, limit)
    if r is None:
        return None
    ts, p = r
    r = _vec_varint(arr, p, limit)
    if r is None:
        return None
    od, p = r
    if not np.array_equal(od, np.arange(count, dtype=np.int64)):
        return None
    for key in (True, False):
        r = _vec_varint(arr, p, limit)
        if r is None:
            return None
        n, p = r
        if key and require_keys and (n < 0).any():
            return None
        p = p + np.maximum(n, 0)
    if (p >= rec_end).any():
        return None
    r = _vec_varint(arr, p, limit)
    if r is None:
        return None
    nh, p = r
    if (nh < 0).any():
        return None
    top = int(nh.max())
    if top:
        if top > _MAX_FAST_HEADERS:
            return None
        for k in range(top):
            m = nh > k
            q = p[m]
            r = _vec_varint(arr, q, limit)
            if r is None:
                return None
            hk, q = r
            if (hk < 0).any():
                return None
            r = _vec_varint(arr, q + hk, limit)
            if r is None:
                return None
            hv, q = r
            p[m] = q + np.maximum(hv, 0)
            if (p > rec_end).any():
                return None
    if not np.array_equal(p, rec_end):
        return None
    return int(ts.max())


MAX_DECOMPRESSED_BYTES = 256 * 1024 * 1024
"""Largest payload a compressed batch may expand to at produce time (a zstd or gzip batch of
zeros expands thousands of times); a larger one is refused with CORRUPT_MESSAGE instead of
being held in memory."""

_XERIAL_MAGIC = b"\x82SNAPPY\x00"


def _too_big(limit: int) -> RecordsError:
    return RecordsError(ErrorCode.corrupt_message, f"compressed batch expands past {limit} bytes")


def decompress_bounded(codec: int, data: bytes, limit: int = MAX_DECOMPRESSED_BYTES) -> bytes:
    """The uncompressed payload of a batch, never more than ``limit`` bytes.

    Raises RecordsError(corrupt_message) when the payload does not decompress, is
    truncated, or expands past ``limit``.
    """
    try:
        if codec == Compression.GZIP:
            import zlib
            d = zlib.decompressobj(47)  # gzip or zlib header
            out = d.decompress(data, limit + 1)
            if len(out) > limit or d.unconsumed_tail:
                raise _too_big(limit)
            if not d.eof:
                raise RecordsError(ErrorCode.corrupt_message, "truncated gzip payload")
            return out
        if codec == Compression.SNAPPY:
            import cramjam
            if data[:8] == _XERIAL_MAGIC:  # Java's xerial framing: 16-byte header, then [length][block]...
                parts = []
                total = 0
                pos = 16
                while pos < len(data):
                    (n,) = struct.unpack_from(">i", data, pos)
                    pos += 4
                    block = data[pos : pos + n]
                    total += cramjam.snappy.decompress_raw_len(block)
                    if total > limit:
                        raise _too_big(limit)
                    parts.append(bytes(cramjam.snappy.decompress_raw(block)))
                    pos += n
                return b"".join(parts)
            if cramjam.snappy.decompress_raw_len(data) > limit:
                raise _too_big(limit)
            return bytes(cramjam.snappy.decompress_raw(data))
        if codec == Compression.LZ4:
            import lz4.frame
            d = lz4.frame.LZ4FrameDecompressor()
            out = d.decompress(data, max_length=limit + 1)
            if len(out) > limit:
                raise _too_big(limit)
            if not d.eof:
                raise RecordsError(ErrorCode.corrupt_message, "truncated lz4 frame")
            return out
        if codec == Compression.ZSTD:
            import zstandard
            d = zstandard.ZstdDecompressor().decompressobj()
            parts = []
            total = 0
            # small input steps bound what one step can produce (a block expands to 128 KiB at most)
            for pos in range(0, len(data), 1024):
                chunk = d.decompress(data[pos : pos + 1024])
                total += len(chunk)
                if total > limit:
                    raise _too_big(limit)
                parts.append(chunk)
                if d.eof:
                    break
            if not d.eof:
                raise RecordsError(ErrorCode.corrupt_message, "truncated zstd frame")
            return b"".join(parts)
    except RecordsError:
        raise
    except Exception as exc:  # each library has its own error types
        raise RecordsError(ErrorCode.corrupt_message, f"cannot decompress batch: {exc}") from exc
    raise RecordsError(ErrorCode.corrupt_message, f"unknown compression codec {codec}")


def _check_header(h: BatchHeader) -> None:
    """Kafka's validateBatch for a client append (magic 2)."""
    if h.records_count <= 0:
        raise RecordsError(ErrorCode.invalid_record, f"invalid record count {h.records_count}")
    if h.last_offset_delta != h.records_count - 1:
        raise RecordsError(ErrorCode.invalid_record,
                           f"last offset delta {h.last_offset_delta} does not match the record count "
                           f"{h.records_count}")
    if h.attributes & CONTROL_BIT:
        raise RecordsError(ErrorCode.invalid_record, "clients may not write control batches")
    if h.producer_id >= 0 and h.base_sequence < 0:
        raise RecordsError(ErrorCode.invalid_record,
                           f"invalid sequence {h.base_sequence} with producer id {h.producer_id}")
    if h.attributes & COMPRESSION_MASK not in KNOWN_CODECS:
        raise RecordsError(ErrorCode.corrupt_message, f"unknown compression codec {h.attributes & COMPRESSION_MASK}")


def needs_worker(records: bytes) -> bool:
    """Whether validating this batch decompresses (the shell then runs it in a worker thread)."""
    return len(records) >= HEADER_SIZE and records[22] & COMPRESSION_MASK != Compression.NONE


def validate_produce_batch(records: bytes, *, target_codec: int | None = None,
                           log_append_time: bool = False, require_keys: bool = False) -> Validated:
    """Validate one partition's records of a Produce request; return what to append.

    ``target_codec`` is the topic's ``compression.type`` as a codec id (None: keep the
    producer's); ``log_append_time`` skips the max-timestamp rewrite (the log stamps the
    batch).  Raises RecordsError / CorruptBatchError (both ApiError) for any fault;
    nothing is rewritten in place.
    """
    headers = validate_batches(records)
    if len(headers) != 1:
        raise RecordsError(ErrorCode.invalid_record, "more than one record batch for a partition")
    h = headers[0]
    _check_header(h)
    codec = h.compression
    payload_start = h.position + HEADER_SIZE
    if codec == Compression.NONE:
        data = bytes(records) if not isinstance(records, bytes) else records
        start, end = payload_start, h.end
    else:
        data = decompress_bounded(codec, bytes(memoryview(records)[payload_start : h.end]))
        start, end = 0, len(data)
    max_delta = None
    if _np is not None and h.records_count >= FAST_WALK_MIN_RECORDS:
        max_delta = _walk_fast(data, start, end, h.records_count, require_keys)
    if max_delta is None:
        max_delta = walk_records(data, start, end, h.records_count, require_keys=require_keys)
    target = codec if target_codec is None else target_codec
    max_ts = h.base_timestamp + max_delta
    fix_ts = (not log_append_time and not h.attributes & TIMESTAMP_TYPE_BIT and max_ts != h.max_timestamp)
    if target == codec and not fix_ts:
        return Validated(records, False)
    if target == codec:
        out = bytearray(records)
    else:
        body = data[start:end]
        payload = body if target == Compression.NONE else _compress(target, bytes(body))
        out = bytearray(memoryview(records)[: payload_start])
        out += payload
        _I32.pack_into(out, 8, len(out) - LOG_OVERHEAD)
        _ATTR.pack_into(out, 21, ((h.attributes & ~COMPRESSION_MASK) | target) & 0xFFFF)
    if fix_ts:
        _I64.pack_into(out, 35, max_ts)
    _CRC.pack_into(out, 17, _crc32c(memoryview(out)[21:]))
    return Validated(out, True)

