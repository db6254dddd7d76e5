"""Transaction markers: the control batches that commit or abort a transaction (pure).

A marker is a batch with the control and transactional bits, the producer's id and
epoch, no sequence (-1), and one record: key ``int16 version (0)`` + ``int16 type``
(0 abort, 1 commit), value ``int16 version (0)`` + ``int32 coordinator epoch``
(Kafka's ``EndTransactionMarker``). Readers skip control batches; a read_committed
reader uses the abort markers with the aborted-transaction list of a Fetch response.
"""

from __future__ import annotations

import struct

from .batch import build_batch, decode_records

__all__ = ["ABORT", "COMMIT", "build_marker", "marker_of", "marker_type"]

ABORT = 0
COMMIT = 1
_KEY = struct.Struct(">hh")
_VALUE = struct.Struct(">hi")


def build_marker(commit: bool, producer_id: int, producer_epoch: int, coordinator_epoch: int,
                 timestamp_ms: int) -> bytes:
    """One control batch (base offset 0) holding a commit or abort marker."""
    key = _KEY.pack(0, COMMIT if commit else ABORT)
    value = _VALUE.pack(0, coordinator_epoch)
    return build_batch([(key, value, (), timestamp_ms)], producer_id=producer_id, producer_epoch=producer_epoch,
                       transactional=True, control=True)


def marker_type(batch: bytes | bytearray | memoryview) -> int | None:
    """ABORT or COMMIT for the control batch at the start of ``batch``; None if its first
    record is not a marker Kafka defines (an unknown control type, which readers skip)."""
    found = marker_of(batch)
    return None if found is None else found[0]


def marker_of(batch: bytes | bytearray | memoryview) -> tuple[int, int] | None:
    """(ABORT or COMMIT, coordinator epoch) of the control batch at the start of ``batch``
    (epoch -1 if its value is missing); None if it is not a marker Kafka defines."""
    records = decode_records(batch)
    if not records or records[0].key is None or len(records[0].key) < _KEY.size:
        return None
    _version, kind = _KEY.unpack_from(records[0].key, 0)
    if kind not in (ABORT, COMMIT):
        return None
    value = records[0].value
    epoch = _VALUE.unpack_from(value, 0)[1] if value is not None and len(value) >= _VALUE.size else -1
    return kind, epoch
