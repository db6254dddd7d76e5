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
Three walks make the same checks.  Batches of ``RUN_WALK_MIN_RECORDS`` records or more
first take the run walk (:func:`_walk_runs`): producers write records of one shape
(values of one size, the same key and header lengths, only the timestamp and offset
deltas change), so the first record of a run is parsed and every later one is checked
against it a byte column at a time (a bytes slice with a step per field byte, compared
or translated in C): a few us per run and a few ns per record.  Records of more shapes
than it tries, in batches of ``FAST_WALK_MIN_RECORDS`` or more, are walked with numpy
(:func:`_walk_fast`).  Anything else, and any record that is not plain or not valid,
takes the exact walk (:func:`walk_records`, plain Python), which is the reference and
names the record at fault.  Figures: ``benchmarks/records_bench.py``.  This module is
pure: no files, clock or sockets.
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
    "TOPIC_COMPRESSION",
    "RecordsError",
    "Validated",
    "codec_of_compression_type",
    "needs_worker",
    "validate_produce_batch",
    "walk_records",
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
    """The batch to append: the input (as bytes), or a rewritten copy (CRC-32C set)."""
    rewritten: bool
    """Whether ``batch`` differs from the input (max timestamp fixed, or recompressed)."""
    header: BatchHeader | None = None
    """The batch's header as read from ``batch`` (framing checked), when not rewritten: the
    log's append need not read it again."""


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


def walk_records(data: bytes, pos: int, end: int, count: int, *, require_keys: bool = False,
                 first: int = 0) -> int:
    """Walk ``count`` records in ``data[pos:end]``; return their largest timestamp delta.

    Raises RecordsError(invalid_record, record_index) at the first record that does not
    parse as Kafka's DefaultRecord, whose offset delta is not its index, that runs past
    ``end``, or when fewer than ``count`` records are present or bytes remain after them.
    ``data`` must end at ``end`` (or hold only record bytes after it).  With
    ``require_keys`` (a compacted topic) a record without a key is refused too.  With
    ``first``, ``pos`` is where record ``first`` starts and records ``first`` to
    ``count - 1`` are walked (the run walk finishes a batch this way).

    The varints are decoded inline, one- and two-byte ones without a call: this loop is
    the cost of validating a produce request (benchmarks/produce_consume.py).
    """
    max_ts = -(1 << 63)
    i = first
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
            if ts > max_ts:  # noqa: PLR1730 (per record: a comparison costs a fraction of a max() call)
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


# --- the run walk: records of one shape, checked a byte column at a time ----------------

RUN_WALK_MIN_RECORDS = 8
"""Batches with fewer records take the exact walk (the run walk's fixed cost is a few us)."""
_MAX_RUNS = 8
"""Runs of one shape tried per batch; records of more shapes take the other walks."""
_MAX_RUN_HEADERS = 8
_OD_WIDTH_END = (0, 64, 8192, 1 << 20)
"""Offset deltas of varint width w are the indexes from _OD_WIDTH_END[w - 1] to _OD_WIDTH_END[w]."""
_OD_TABLE_END = 1 << 18
"""The run walk reads records up to this index (its offset-delta tables end there)."""
_OD_COLUMNS: dict[int, tuple[bytes, ...]] = {}
_FLIP = bytes(b ^ 0x80 for b in range(256))
_LOW_MARK = bytes(1 if b < 0x80 else 0 for b in range(256))
_HIGH_MARK = bytes(0 if b < 0x80 else 1 for b in range(256))
_TABLES: dict[tuple[str, int], bytes] = {}


def _od_columns(width: int) -> tuple[bytes, ...]:
    """Byte j of the zigzag varint of 2*i for every index i, as ``width`` columns indexed by i.

    Only the entries of indexes whose varint has this width are meaningful (the run walk
    reads no others).  Built from repeats: byte j >= 1 of 2*i is (i >> (7j - 1)) & 0x7F,
    which holds for 2**(7j - 1) consecutive indexes.
    """
    cols = _OD_COLUMNS.get(width)
    if cols is None:
        hi = min(_OD_WIDTH_END[width], _OD_TABLE_END)
        out = []
        for j in range(width):
            flag = 0x80 if j < width - 1 else 0
            if j == 0:
                period = bytes(((i & 63) << 1) | flag for i in range(64))
            else:
                hold = 1 << (7 * j - 1)
                period = b"".join(bytes((v | flag,)) * hold for v in range(128))
            out.append((period * (hi // len(period) + 1))[:hi])
        cols = _OD_COLUMNS[width] = tuple(out)
    return cols


def _table(kind: str, m: int) -> bytes:
    """A translate table, cached: bytes marked (0x80 or 0x01) by a comparison with ``m``."""
    t = _TABLES.get((kind, m))
    if t is None:
        if kind == "zz>":  # 0x80 where the one-byte zigzag varint b decodes above m
            t = bytes(0x80 if b < 0x80 and ((b >> 1) ^ -(b & 1)) > m else 0 for b in range(256))
        elif kind == ">":  # 0x80 where b > m
            t = bytes(0x80 if b > m else 0 for b in range(256))
        elif kind == "==":  # 0x01 where b == m
            t = bytes(1 if b == m else 0 for b in range(256))
        else:  # "even>": 0x01 where b is even and its low seven bits exceed m
            t = bytes(1 if not b & 1 and (b & 0x7F) > m else 0 for b in range(256))
        _TABLES[(kind, m)] = t
    return t


def _first_diff(a: bytes, b: bytes) -> int:
    """The index of the first byte where ``a`` and ``b`` (equal lengths, not equal) differ."""
    x = int.from_bytes(a, "big") ^ int.from_bytes(b, "big")
    return len(a) - 1 - (x.bit_length() - 1) // 8


def _uvarint(data: bytes, pos: int) -> tuple[int, int]:
    """The raw (still zigzag) varint at ``pos`` if at most three bytes long, and where it ends; else -1."""
    b = data[pos]
    if b < 0x80:
        return b, pos + 1
    c = data[pos + 1]
    if c < 0x80:
        return (b & 0x7F) | (c << 7), pos + 2
    d = data[pos + 2]
    if d < 0x80:
        return (b & 0x7F) | ((c & 0x7F) << 7) | (d << 14), pos + 3
    return -1, pos


def _od_width(index: int) -> int:
    return 1 if index < 64 else 2 if index < 8192 else 3 if index < _OD_TABLE_END else 0


def _shape(data: bytes, p: int, end: int, index: int,
           require_keys: bool) -> tuple[int, list[int], int, int, int, int] | None:
    """The shape of record ``index`` at ``p`` if :func:`walk_records` accepts it and its
    varints are short (three bytes at most, the offset delta minimal, few headers); else None.

    The shape is (size, offsets of the bytes every record of its run must repeat, offset
    and width of the timestamp delta, offset and width of the offset delta), offsets
    counted from ``p``.  The bytes to repeat are the varints of the record length, key
    length, value length, header count and each header's key and value lengths.
    """
    try:
        raw, q = _uvarint(data, p)
        if raw < 0:
            return None
        length = (raw >> 1) ^ -(raw & 1)
        rec_end = q + length
        if length < 6 or rec_end > end:
            return None
        fixed = list(range(q - p))
        q += 1  # attributes
        ts_off = q - p
        raw, q2 = _uvarint(data, q)
        if raw < 0:
            return None
        ts_w = q2 - q
        od_off = q2 - p
        raw, q = _uvarint(data, q2)
        od_w = q - q2
        if raw != index << 1 or od_w != _od_width(index):
            return None
        for key in (True, False):
            raw, q2 = _uvarint(data, q)
            if raw < 0:
                return None
            fixed.extend(range(q - p, q2 - p))
            q = q2
            if not raw & 1:
                q += raw >> 1
            elif key and require_keys:
                return None
        raw, q2 = _uvarint(data, q)
        if raw < 0 or raw & 1 or raw >> 1 > _MAX_RUN_HEADERS:
            return None
        fixed.extend(range(q - p, q2 - p))
        q = q2
        for _ in range(raw >> 1):
            raw, q2 = _uvarint(data, q)
            if raw < 0 or raw & 1:  # a null header key
                return None
            fixed.extend(range(q - p, q2 - p))
            q = q2 + (raw >> 1)
            raw, q2 = _uvarint(data, q)
            if raw < 0:
                return None
            fixed.extend(range(q - p, q2 - p))
            q = q2
            if not raw & 1:
                q += raw >> 1
            if q > rec_end:
                return None
    except IndexError:
        return None
    if q != rec_end:
        return None
    return rec_end - p, fixed, ts_off, ts_w, od_off, od_w


def _run_max_ts(data: bytes, q: int, stride: int, n: int, width: int) -> int:
    """The largest timestamp delta of ``n`` records whose delta varints, ``width`` bytes
    each (already checked), start at ``q``, ``q + stride``, ...

    The last record's delta is the guess (producers write timestamps in order); the
    guess is proven with translated columns, else every delta is decoded.
    """
    last = q + (n - 1) * stride
    raw = 0
    for j in range(width):
        raw |= (data[last + j] & 0x7F) << (7 * j)
    guess = (raw >> 1) ^ -(raw & 1)
    stop = q + n * stride
    if width == 1:
        if data[q:stop:stride].translate(_table("zz>", guess)).isascii():
            return guess
    elif width == 2 and guess >= 0:
        # a delta above the guess: an even raw value above 2*guess, by its high byte or,
        # with the guess's high byte, by its low seven bits
        low, high = data[q:stop:stride], data[q + 1 : stop : stride]
        m_high, m_low = (2 * guess) >> 7, (2 * guess) & 0x7F
        if high.translate(_table(">", m_high)).isascii():
            above = low.translate(_table("even>", m_low))
            if 1 not in above or not (int.from_bytes(high.translate(_table("==", m_high)), "big")
                                      & int.from_bytes(above, "big")):
                return guess
    best = -(1 << 63)
    for r in range(q, stop, stride):
        raw = 0
        for j in range(width):
            raw |= (data[r + j] & 0x7F) << (7 * j)
        ts = (raw >> 1) ^ -(raw & 1)
        if ts > best:  # noqa: PLR1730 (per record: a comparison costs a fraction of a max() call)
            best = ts
    return best


def _walk_runs(data: bytes, pos: int, end: int, count: int, require_keys: bool) -> int | None:
    """The same checks as :func:`walk_records` for records that come in runs of one shape.

    Producers write records that differ only in their bytes and their timestamp and
    offset deltas (a topic's values of one size, no key or keys of one size, the same
    headers).  The first record of a run is parsed (:func:`_shape`); the run is then the
    records after it, one record size apart, that repeat its length bytes and have their
    timestamp delta of the same width and their offset delta equal to their index: each
    of these is checked on a column of bytes, one byte per record, with C-speed bytes
    operations (slice with a step, compare, translate), so a run costs a few us plus a
    few ns per record.  Such a record parses exactly as the first one does, with its own
    timestamp delta and index, so :func:`walk_records` would accept it.  The first
    record that differs starts the next run.

    Returns the largest timestamp delta; None when the records take more than
    ``_MAX_RUNS`` runs (the caller walks the batch another way).  A record that is not
    short and plain (:func:`_shape`), valid or not, and the rest after it, are walked
    by :func:`walk_records`, which raises RecordsError with the record's index.
    """
    max_ts = -(1 << 63)
    i = 0
    p = pos
    for _ in range(_MAX_RUNS):
        if i == count:
            break
        shape = _shape(data, p, end, i, require_keys)
        if shape is None:
            return max(max_ts, walk_records(data, p, end, count, require_keys=require_keys, first=i))
        size, fixed, ts_off, ts_w, od_off, od_w = shape
        k = min(count - i, (end - p) // size, min(_OD_WIDTH_END[od_w], _OD_TABLE_END) - i)
        for o in fixed:
            col = data[p + o : p + k * size : size]
            want = col[:1] * k
            if col != want:
                k = _first_diff(col, want)
        od = _od_columns(od_w)
        for j in range(od_w):
            col = data[p + od_off + j : p + k * size : size]
            want = od[j][i : i + k]
            if col != want:
                k = _first_diff(col, want)
        for j in range(ts_w - 1):
            col = data[p + ts_off + j : p + k * size : size]
            if not col.translate(_FLIP).isascii():
                k = col.translate(_LOW_MARK).find(1)
        col = data[p + ts_off + ts_w - 1 : p + k * size : size]
        if not col.isascii():
            k = col.translate(_HIGH_MARK).find(1)
        # k >= 1: the run's first record repeats its own shape
        ts = _run_max_ts(data, p + ts_off, size, k, ts_w)
        if ts > max_ts:  # noqa: PLR1730 (per record: a comparison costs a fraction of a max() call)
            max_ts = ts
        i += k
        p += k * size
    if i < count:
        return None
    if p != end:
        raise RecordsError(ErrorCode.invalid_record, f"{end - p} bytes remain after the declared {count} records")
    return max_ts


try:  # the vectorized walk; without numpy every batch takes the exact walk
    import numpy as _np
except ImportError:  # pragma: no cover
    _np = None  # type: ignore[assignment]

FAST_WALK_MIN_RECORDS = 192
"""Of the batches the run walk leaves (records of many shapes), those with fewer records
take the exact walk: the vectorized walk costs about 100 us per batch in numpy calls whatever its size, and the exact walk 0.8 us per record, so they
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
            z = zstandard.ZstdDecompressor().decompressobj()
            parts = []
            total = 0
            # small input steps bound what one step can produce (a block expands to 128 KiB at most)
            for pos in range(0, len(data), 1024):
                chunk = z.decompress(data[pos : pos + 1024])
                total += len(chunk)
                if total > limit:
                    raise _too_big(limit)
                parts.append(chunk)
                if z.eof:
                    break
            if not z.eof:
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
    nothing is rewritten in place.  The CRC-32C is checked here (and computed for a
    rewritten batch), on bytes that cannot change afterwards (a buffer of another type
    is copied to bytes first), so the log's append need not check it again.
    """
    if not isinstance(records, bytes):
        records = bytes(records)
    headers = validate_batches(records)
    if len(headers) != 1:
        raise RecordsError(ErrorCode.invalid_record, "more than one record batch for a partition")
    h = headers[0]
    _check_header(h)
    codec = h.compression
    payload_start = h.position + HEADER_SIZE
    if codec == Compression.NONE:
        data = records
        start, end = payload_start, h.end
    else:
        data = decompress_bounded(codec, bytes(memoryview(records)[payload_start : h.end]))
        start, end = 0, len(data)
    max_delta = None
    if h.records_count >= RUN_WALK_MIN_RECORDS:
        max_delta = _walk_runs(data, start, end, h.records_count, require_keys)
    if max_delta is None and _np is not None and h.records_count >= FAST_WALK_MIN_RECORDS:
        max_delta = _walk_fast(data, start, end, h.records_count, require_keys)
    if max_delta is None:
        max_delta = walk_records(data, start, end, h.records_count, require_keys=require_keys)
    target = codec if target_codec is None else target_codec
    max_ts = h.base_timestamp + max_delta
    fix_ts = (not log_append_time and not h.attributes & TIMESTAMP_TYPE_BIT and max_ts != h.max_timestamp)
    if target == codec and not fix_ts:
        return Validated(records, False, h)
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

