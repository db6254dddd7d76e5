"""Kafka record batches (magic v2) as bytes: a header view, validation, offset rewriting.

Theory of operation
-------------------
A produce request carries, per partition, a run of record batches; a fetch answer
returns the same bytes.  The broker's hot paths (append, read) never look inside a
batch's records: they read the 61-byte batch header, check framing and the CRC-32C,
and rewrite the base offset (and, for LogAppendTime topics, the max timestamp, the
timestamp-type bit and therefore the CRC).  Everything here works on ``bytes``,
``bytearray`` or ``memoryview`` without copying, except :func:`with_base_offset`, which
returns the rewritten copy.

Batch header layout (big endian; Kafka's DefaultRecordBatch)::

    0  base_offset            int64   not covered by the CRC
    8  batch_length           int32   bytes after this field (total = 12 + batch_length)
    12 partition_leader_epoch int32   not covered by the CRC
    16 magic                  int8    must be 2
    17 crc                    uint32  CRC-32C of bytes [21, end)
    21 attributes             int16   bits 0-2 codec, 3 timestamp type, 4 transactional, 5 control
    23 last_offset_delta      int32
    27 base_timestamp         int64
    35 max_timestamp          int64
    43 producer_id            int64
    51 producer_epoch         int16
    53 base_sequence          int32
    57 records_count          int32
    61 records...

Invariants the validation enforces (all faults raise :class:`CorruptBatchError` carrying
``ErrorCode.corrupt_message``, or ``invalid_record`` for a count the bytes cannot hold): a whole number of batches, each at least 61 bytes long,
magic 2, CRC matching, ``records_count >= 0`` and ``last_offset_delta`` consistent with the
count for uncompressed and compressed batches alike (Kafka's rule: delta = count - 1
unless the batch is empty, which only compaction produces).

Below the hot path, for compaction, internal topics and tests only: :func:`build_batch`
(records to a batch, optionally compressed) and :func:`decode_records` (a batch back to
records, decompressing gzip, snappy, lz4 and zstd).  Compression libraries are imported
lazily so the header view stays free of them.

This module is pure: no files, no clock, no sockets.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import crc32c as _crc32c_mod

from shoal.errors import ApiError, ErrorCode

__all__ = [
    "HEADER_SIZE",
    "LOG_OVERHEAD",
    "MAGIC",
    "NO_PRODUCER_ID",
    "NO_TIMESTAMP",
    "BatchHeader",
    "Compression",
    "CorruptBatchError",
    "Record",
    "TimestampType",
    "build_batch",
    "compute_crc",
    "decode_columns",
    "decode_records",
    "iter_batches",
    "read_header",
    "scan_valid_prefix",
    "set_base_offset",
    "set_log_append_time",
    "validate_batches",
    "with_base_offset",
]

HEADER_SIZE = 61
LOG_OVERHEAD = 12  # base_offset + batch_length: the bytes not counted by batch_length
MAGIC = 2
NO_PRODUCER_ID = -1
NO_TIMESTAMP = -1
_CRC_START = 21

_HEADER = struct.Struct(">qiibIhiqqqhii")
_BASE_OFFSET = struct.Struct(">q")
_CRC = struct.Struct(">I")
_ATTR = struct.Struct(">h")
_I64 = struct.Struct(">q")
_I32 = struct.Struct(">i")

_crc32c = _crc32c_mod.crc32c

COMPRESSION_MASK = 0x07
TIMESTAMP_TYPE_BIT = 0x08
TRANSACTIONAL_BIT = 0x10
CONTROL_BIT = 0x20
DELETE_HORIZON_BIT = 0x40


class Compression:
    """Codec ids of attribute bits 0-2 (Kafka's CompressionType)."""

    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4


class TimestampType:
    """Attribute bit 3 (Kafka's TimestampType)."""

    CREATE_TIME = 0
    LOG_APPEND_TIME = 1


class CorruptBatchError(ApiError):
    """A batch fails framing, magic or CRC checks; answer with ``error_code``.

    ``position`` is the byte offset, within the buffer given, of the batch at fault.
    """

    def __init__(self, message: str, position: int = 0,
                 error_code: ErrorCode = ErrorCode.corrupt_message) -> None:
        super().__init__(error_code, message)
        self.position = position


@dataclass(frozen=True, slots=True)
class BatchHeader:
    """The header of one batch found at ``position`` in some buffer (no record bytes)."""

    position: int
    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int

    @property
    def size(self) -> int:
        """Bytes the whole batch occupies (header and records)."""
        return LOG_OVERHEAD + self.batch_length

    @property
    def end(self) -> int:
        return self.position + LOG_OVERHEAD + self.batch_length

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1

    @property
    def compression(self) -> int:
        return self.attributes & COMPRESSION_MASK

    @property
    def timestamp_type(self) -> int:
        return 1 if self.attributes & TIMESTAMP_TYPE_BIT else 0

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_BIT)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_BIT)

    @property
    def last_sequence(self) -> int:
        """Sequence of the last record (wraps at 2**31 as Kafka does); -1 without a producer."""
        if self.base_sequence < 0:
            return -1
        return (self.base_sequence + self.last_offset_delta) % 0x80000000


def read_header(buf, position: int = 0, *, whole: bool = True) -> BatchHeader:
    """Parse the header at ``position``; framing only (no CRC check).

    Raises CorruptBatchError when fewer than 61 bytes remain, the length field is too small,
    the batch extends past the buffer (unless ``whole`` is False: ``buf`` may hold only the
    header), magic is not 2, or the counts are inconsistent.
    """
    if len(buf) - position < HEADER_SIZE:
        raise CorruptBatchError("truncated batch header", position)
    f = _HEADER.unpack_from(buf, position)
    h = BatchHeader(position, *f)
    if h.magic != MAGIC:
        raise CorruptBatchError(f"unsupported magic {h.magic}", position)
    if h.batch_length < HEADER_SIZE - LOG_OVERHEAD:
        raise CorruptBatchError(f"batch length {h.batch_length} below the header size", position)
    if whole and position + LOG_OVERHEAD + h.batch_length > len(buf):
        raise CorruptBatchError("batch extends past the end of the data", position)
    if h.records_count < 0 or h.last_offset_delta < 0:
        raise CorruptBatchError("negative record count or offset delta", position)
    if h.records_count > 0 and h.last_offset_delta < h.records_count - 1:
        raise CorruptBatchError("last offset delta smaller than the record count", position)
    # every record takes at least 7 bytes (length, attributes, 3 varints, 2 lengths)
    if h.compression == Compression.NONE and h.records_count * 7 > h.batch_length - (HEADER_SIZE - LOG_OVERHEAD):
        raise CorruptBatchError("record count exceeds what the batch can hold", position,
                                error_code=ErrorCode.invalid_record)
    return h


def compute_crc(buf, header: BatchHeader) -> int:
    """CRC-32C of a batch's bytes from attributes to its end, as Kafka computes it."""
    mv = buf if isinstance(buf, memoryview) else memoryview(buf)
    return _crc32c(mv[header.position + _CRC_START : header.end])


def iter_batches(buf, position: int = 0, end: int | None = None) -> Iterator[BatchHeader]:
    """Yield the header of each batch in ``buf[position:end]``, framing checked, CRC not.

    Raises CorruptBatchError at the first malformed or incomplete batch.
    """
    stop = len(buf) if end is None else end
    view = buf if end is None else memoryview(buf)[:end]
    while position < stop:
        h = read_header(view, position)
        yield h
        position = h.end


def validate_batches(buf, *, check_crc: bool = True) -> list[BatchHeader]:
    """Validate that ``buf`` is a whole number of well-formed v2 batches; return their headers.

    Raises CorruptBatchError (``corrupt_message``) for an empty buffer, a torn or malformed
    batch, wrong magic, or a CRC mismatch.
    """
    if len(buf) == 0:
        raise CorruptBatchError("no record batch")
    mv = buf if isinstance(buf, memoryview) else memoryview(buf)
    headers = []
    position = 0
    n = len(mv)
    while position < n:
        h = read_header(mv, position)
        if check_crc and _crc32c(mv[position + _CRC_START : h.end]) != h.crc:
            raise CorruptBatchError("CRC-32C mismatch", position)
        headers.append(h)
        position = h.end
    return headers


def scan_valid_prefix(buf, position: int = 0, *, check_crc: bool = True) -> tuple[list[BatchHeader], int]:
    """Walk batches from ``position`` until one is incomplete or invalid (recovery).

    Returns (headers of the valid batches, end position of the last valid one).  Never raises
    for bad data: the first fault ends the valid prefix.
    """
    mv = buf if isinstance(buf, memoryview) else memoryview(buf)
    headers = []
    n = len(mv)
    while position < n:
        try:
            h = read_header(mv, position)
        except CorruptBatchError:
            break
        if check_crc and _crc32c(mv[position + _CRC_START : h.end]) != h.crc:
            break
        headers.append(h)
        position = h.end
    return headers, position


def set_base_offset(buf: bytearray | memoryview, position: int, base_offset: int) -> None:
    """Overwrite the base offset of the batch at ``position`` in place (outside the CRC)."""
    _BASE_OFFSET.pack_into(buf, position, base_offset)


def set_partition_leader_epoch(buf: bytearray | memoryview, position: int, epoch: int) -> None:
    """Write a batch's partition leader epoch (bytes 12-15; outside the CRC)."""
    _I32.pack_into(buf, position + 12, epoch)


def set_log_append_time(buf: bytearray | memoryview, header: BatchHeader, timestamp_ms: int) -> None:
    """Make the batch at ``header.position`` a LogAppendTime batch stamped ``timestamp_ms``.

    Sets the timestamp-type bit and max_timestamp and recomputes the CRC, in place.  Records
    keep their deltas; readers take every record's timestamp from max_timestamp (Kafka's rule).
    """
    p = header.position
    _ATTR.pack_into(buf, p + 21, (header.attributes | TIMESTAMP_TYPE_BIT) & 0xFFFF)
    _I64.pack_into(buf, p + 35, timestamp_ms)
    mv = buf if isinstance(buf, memoryview) else memoryview(buf)
    _CRC.pack_into(buf, p + 17, _crc32c(mv[p + _CRC_START : header.end]))


def with_base_offset(buf, header: BatchHeader, base_offset: int, *,
                     log_append_time_ms: int | None = None) -> bytearray:
    """A copy of one batch with a new base offset (and optionally LogAppendTime stamping)."""
    mv = buf if isinstance(buf, memoryview) else memoryview(buf)
    out = bytearray(mv[header.position : header.end])
    set_base_offset(out, 0, base_offset)
    if log_append_time_ms is not None:
        set_log_append_time(out, read_header(out, 0), log_append_time_ms)
    return out


# --- records: building and decoding (not on the hot path) ------------------------------

@dataclass(frozen=True, slots=True)
class Record:
    """One record of a batch, with absolute offset and timestamp."""

    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...] = field(default_factory=tuple)
    attributes: int = 0


def _zigzag(n: int) -> int:
    return (n << 1) ^ (n >> 63)


def _write_varint(out: bytearray, n: int) -> None:
    v = _zigzag(n) & 0xFFFFFFFFFFFFFFFF
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)


def _read_varint(buf, pos: int) -> tuple[int, int]:
    shift = 0
    result = 0
    while True:
        if pos >= len(buf):
            raise CorruptBatchError("truncated varint in record")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            break
        shift += 7
        if shift > 63:
            raise CorruptBatchError("varint too long in record")
    return (result >> 1) ^ -(result & 1), pos


def _write_bytes(out: bytearray, data: bytes | None) -> None:
    if data is None:
        _write_varint(out, -1)
    else:
        _write_varint(out, len(data))
        out += data


def _compress(codec: int, data: bytes) -> bytes:
    if codec == Compression.GZIP:
        import gzip
        return gzip.compress(data)
    if codec == Compression.SNAPPY:
        import cramjam
        return bytes(cramjam.snappy.compress_raw(data))
    if codec == Compression.LZ4:
        import lz4.frame
        return lz4.frame.compress(data)
    if codec == Compression.ZSTD:
        import zstandard
        return zstandard.ZstdCompressor().compress(data)
    raise CorruptBatchError(f"unknown compression codec {codec}",
                            error_code=ErrorCode.unsupported_compression_type)


_XERIAL_MAGIC = b"\x82SNAPPY\x00"


def _decompress(codec: int, data: bytes) -> bytes:
    try:
        if codec == Compression.GZIP:
            import zlib
            return zlib.decompress(data, 47)  # 32 + 15: gzip or zlib header
        if codec == Compression.SNAPPY:
            import cramjam
            if data[:8] == _XERIAL_MAGIC:  # Java's xerial framing: 16-byte header, then [len][block]...
                blocks = bytearray()
                pos = 16
                while pos < len(data):
                    (n,) = struct.unpack_from(">i", data, pos)
                    pos += 4
                    blocks += bytes(cramjam.snappy.decompress_raw(data[pos : pos + n]))
                    pos += n
                return bytes(blocks)
            return bytes(cramjam.snappy.decompress_raw(data))
        if codec == Compression.LZ4:
            import lz4.frame
            return lz4.frame.decompress(data)
        if codec == Compression.ZSTD:
            import zstandard
            obj = zstandard.ZstdDecompressor().decompressobj()
            out = obj.decompress(data)
            if not obj.eof:
                raise CorruptBatchError("truncated zstd frame")
            return out
    except CorruptBatchError:
        raise
    except Exception as exc:  # each library has its own error types
        raise CorruptBatchError(f"cannot decompress batch: {exc}") from exc
    raise CorruptBatchError(f"unknown compression codec {codec}",
                            error_code=ErrorCode.unsupported_compression_type)


def build_batch(
    records: Iterable[tuple[bytes | None, bytes | None, Sequence[tuple[str, bytes | None]], int]],
    *,
    base_offset: int = 0,
    offset_deltas: Sequence[int] | None = None,
    compression: int = Compression.NONE,
    timestamp_type: int = TimestampType.CREATE_TIME,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    transactional: bool = False,
    control: bool = False,
    partition_leader_epoch: int = -1,
    last_offset_delta: int | None = None,
) -> bytes:
    """Build one v2 batch from (key, value, headers, timestamp_ms) records.

    ``offset_deltas`` gives each record's offset delta (default 0, 1, 2, ...); compaction
    uses it to keep original offsets.  ``last_offset_delta`` overrides the header field
    (an emptied batch keeps its offset range).  Returns the batch bytes, CRC set.
    """
    recs = list(records)
    if offset_deltas is None:
        offset_deltas = range(len(recs))
    if recs:
        base_ts = min(r[3] for r in recs)
        max_ts = max(r[3] for r in recs)
    else:
        base_ts = max_ts = NO_TIMESTAMP
    body = bytearray()
    for (key, value, headers, ts), delta in zip(recs, offset_deltas):
        rec = bytearray(b"\x00")  # attributes
        _write_varint(rec, ts - base_ts)
        _write_varint(rec, delta)
        _write_bytes(rec, key)
        _write_bytes(rec, value)
        _write_varint(rec, len(headers))
        for hk, hv in headers:
            _write_bytes(rec, hk.encode())
            _write_bytes(rec, hv)
        _write_varint(body, len(rec))
        body += rec
    payload = bytes(body) if compression == Compression.NONE else _compress(compression, bytes(body))
    attributes = (compression & COMPRESSION_MASK)
    if timestamp_type == TimestampType.LOG_APPEND_TIME:
        attributes |= TIMESTAMP_TYPE_BIT
    if transactional:
        attributes |= TRANSACTIONAL_BIT
    if control:
        attributes |= CONTROL_BIT
    if last_offset_delta is None:
        last_offset_delta = (offset_deltas[-1] if recs else 0)  # type: ignore[index]
    out = bytearray(_HEADER.size)
    _HEADER.pack_into(out, 0, base_offset, HEADER_SIZE - LOG_OVERHEAD + len(payload), partition_leader_epoch,
                      MAGIC, 0, attributes, last_offset_delta, base_ts, max_ts, producer_id, producer_epoch,
                      base_sequence, len(recs))
    out += payload
    _CRC.pack_into(out, 17, _crc32c(memoryview(out)[_CRC_START:]))
    return bytes(out)


def decode_columns(buf, header: BatchHeader, offsets: list, timestamps: list, keys: list, values: list,
                   headers: list | None = None, *, lo: int = 0, hi: int = (1 << 63) - 1) -> int:
    """Append the records of the batch at ``header`` whose offset is in [lo, hi] to column lists.

    The columnar twin of :func:`decode_records` for readers that hand records on in bulk
    (the Spark share source): no object per record, varints of one or two bytes read inline, and
    headers skipped unless ``headers`` is given (one list of (key, value) per record). A
    negative timestamp is appended as None. Returns how many records were appended.
    Raises CorruptBatchError for malformed record data.
    """
    mv = buf if isinstance(buf, memoryview) else memoryview(buf)
    payload = mv[header.position + HEADER_SIZE : header.end]
    data = bytes(payload) if header.compression == Compression.NONE else _decompress(header.compression,
                                                                                     bytes(payload))
    try:
        return _decode_columns(data, header, offsets, timestamps, keys, values, headers, lo, hi)
    except IndexError:
        raise CorruptBatchError("record extends past its batch") from None


def _decode_columns(data: bytes, header: BatchHeader, offsets: list, timestamps: list, keys: list, values: list,
                    headers: list | None, lo: int, hi: int) -> int:
    size = len(data)
    rv = _read_varint
    base_offset = header.base_offset
    base_ts = header.base_timestamp
    log_append_ts = header.max_timestamp if header.timestamp_type == TimestampType.LOG_APPEND_TIME else None
    n = 0
    pos = 0
    for _ in range(header.records_count):
        if pos >= size:
            raise CorruptBatchError("record extends past its batch")
        b = data[pos]
        if b < 0x80:
            length, pos = (b >> 1) ^ -(b & 1), pos + 1
        elif data[pos + 1] < 0x80:
            z = (b & 0x7F) | (data[pos + 1] << 7)
            length, pos = (z >> 1) ^ -(z & 1), pos + 2
        else:
            length, pos = rv(data, pos)
        end = pos + length
        if length < 0 or end > size:
            raise CorruptBatchError("record extends past its batch")
        pos += 1  # attributes (unused in format v2)
        b = data[pos]
        if b < 0x80:
            ts_delta, pos = (b >> 1) ^ -(b & 1), pos + 1
        elif data[pos + 1] < 0x80:
            z = (b & 0x7F) | (data[pos + 1] << 7)
            ts_delta, pos = (z >> 1) ^ -(z & 1), pos + 2
        else:
            ts_delta, pos = rv(data, pos)
        b = data[pos]
        if b < 0x80:
            off_delta, pos = (b >> 1) ^ -(b & 1), pos + 1
        elif data[pos + 1] < 0x80:
            z = (b & 0x7F) | (data[pos + 1] << 7)
            off_delta, pos = (z >> 1) ^ -(z & 1), pos + 2
        else:
            off_delta, pos = rv(data, pos)
        offset = base_offset + off_delta
        if offset < lo or offset > hi:
            pos = end
            continue
        b = data[pos]
        if b < 0x80:
            klen, pos = (b >> 1) ^ -(b & 1), pos + 1
        elif data[pos + 1] < 0x80:
            z = (b & 0x7F) | (data[pos + 1] << 7)
            klen, pos = (z >> 1) ^ -(z & 1), pos + 2
        else:
            klen, pos = rv(data, pos)
        if klen >= 0:
            keys.append(data[pos : pos + klen])
            pos += klen
        else:
            keys.append(None)
        b = data[pos]
        if b < 0x80:
            vlen, pos = (b >> 1) ^ -(b & 1), pos + 1
        elif data[pos + 1] < 0x80:
            z = (b & 0x7F) | (data[pos + 1] << 7)
            vlen, pos = (z >> 1) ^ -(z & 1), pos + 2
        else:
            vlen, pos = rv(data, pos)
        if vlen >= 0:
            values.append(data[pos : pos + vlen])
            pos += vlen
        else:
            values.append(None)
        if headers is not None:
            nh, pos = rv(data, pos)
            hdrs = []
            for _h in range(nh):
                hklen, pos = rv(data, pos)
                hk = data[pos : pos + hklen].decode("utf-8", "replace")
                pos += hklen
                hvlen, pos = rv(data, pos)
                hv = None
                if hvlen >= 0:
                    hv = data[pos : pos + hvlen]
                    pos += hvlen
                hdrs.append((hk, hv))
            headers.append(hdrs)
        if pos > end:
            raise CorruptBatchError("record length does not match its contents")
        pos = end
        ts = log_append_ts if log_append_ts is not None else base_ts + ts_delta
        offsets.append(offset)
        timestamps.append(ts if ts >= 0 else None)
        n += 1
    return n


def decode_records(buf, header: BatchHeader | None = None) -> list[Record]:
    """Decode every record of the batch at ``header`` (default: the first batch in ``buf``).

    Decompresses as needed.  For LogAppendTime batches every record's timestamp is the
    batch's max_timestamp.  Raises CorruptBatchError for malformed record data.
    """
    mv = buf if isinstance(buf, memoryview) else memoryview(buf)
    if header is None:
        header = read_header(mv, 0)
    payload = mv[header.position + HEADER_SIZE : header.end]
    data = bytes(payload) if header.compression == Compression.NONE else _decompress(header.compression,
                                                                                     bytes(payload))
    out: list[Record] = []
    pos = 0
    log_append = header.timestamp_type == TimestampType.LOG_APPEND_TIME
    for _ in range(header.records_count):
        length, pos = _read_varint(data, pos)
        end = pos + length
        if length < 0 or end > len(data):
            raise CorruptBatchError("record extends past its batch")
        attrs = data[pos]
        pos += 1
        ts_delta, pos = _read_varint(data, pos)
        off_delta, pos = _read_varint(data, pos)
        klen, pos = _read_varint(data, pos)
        key = None
        if klen >= 0:
            key = data[pos : pos + klen]
            pos += klen
        vlen, pos = _read_varint(data, pos)
        value = None
        if vlen >= 0:
            value = data[pos : pos + vlen]
            pos += vlen
        nh, pos = _read_varint(data, pos)
        hdrs = []
        for _h in range(nh):
            hklen, pos = _read_varint(data, pos)
            hk = data[pos : pos + hklen].decode("utf-8", "replace")
            pos += hklen
            hvlen, pos = _read_varint(data, pos)
            hv = None
            if hvlen >= 0:
                hv = data[pos : pos + hvlen]
                pos += hvlen
            hdrs.append((hk, hv))
        if pos != end:
            raise CorruptBatchError("record length does not match its contents")
        ts = header.max_timestamp if log_append else header.base_timestamp + ts_delta
        out.append(Record(header.base_offset + off_delta, ts, key, value, tuple(hdrs), attrs))
    return out
