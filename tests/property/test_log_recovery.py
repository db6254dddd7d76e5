"""Recovery after a crash or damage: only the damaged bytes are lost, nothing is ever served wrong.

A log is written (fsync every append), its files are copied while it is still open (the
image a crash leaves), the copy is damaged at a random point (truncated, a byte flipped,
zeroed tail, garbage appended, a segment file removed) in the active segment or a closed
one, its recovery-point file is kept, removed or replaced by garbage, and it is reopened.

What must hold (Kafka's LogLoader, except that damage never costs more than the damaged
bytes): a write torn at the end of the active segment is cut there, with what follows it
in that segment; in a closed segment only the batches the damaged bytes touch are lost
and every later segment is kept; a flipped byte below the recovery point, which start-up
does not validate, is answered CORRUPT_MESSAGE by reads and never served; the log end
offset never goes back for damage in a closed segment, and appends go on past it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shoal.errors import ApiError, ErrorCode
from shoal.log.partition_log import RECOVERY_POINT_FILE, PartitionLog
from shoal.log.policy import LogConfig
from shoal.protocol.batch import build_batch, read_header

KINDS = ("truncate", "flip", "zero", "garbage", "missing")
CHECKPOINTS = ("keep", "delete", "garbage")


@st.composite
def scenarios(draw):
    specs = draw(st.lists(st.tuples(st.integers(1, 5), st.integers(0, 300)), min_size=1, max_size=30))
    segment_bytes = draw(st.sampled_from([1800, 1800, 2048, 4096, 1 << 20]))
    kind = draw(st.sampled_from(KINDS))
    checkpoint = draw(st.sampled_from(CHECKPOINTS))
    closed = draw(st.integers(0, 3)) > 0  # mostly a closed segment, when there is one
    where = draw(st.floats(0, 1, exclude_max=True))
    segment_pick = draw(st.floats(0, 1, exclude_max=True))
    garbage = draw(st.binary(min_size=1, max_size=100))
    return specs, segment_bytes, kind, checkpoint, closed, where, segment_pick, garbage


def segment_files(d: Path) -> list[Path]:
    return sorted(d.glob("*.log"))


def read_all(log: PartitionLog, written) -> tuple[list[bytes], list[int]]:
    """Every batch a reader gets from the log start on, and the offsets answered CORRUPT_MESSAGE
    (a reader then seeks past the batch that held the offset, as an application would)."""
    got, corrupt = [], []
    offset = log.log_start_offset
    while offset < log.log_end_offset:
        try:
            data = log.read(offset, 1)
        except ApiError as e:
            assert e.error_code == ErrorCode.corrupt_message
            corrupt.append(offset)
            offset = next(read_header(d).next_offset for _, _, d in written if read_header(d).last_offset >= offset)
            continue
        assert data, offset
        h = read_header(data)
        assert h.next_offset > offset
        got.append(bytes(data))
        offset = h.next_offset
    assert log.read(log.log_end_offset, 1 << 20) == b""
    return got, corrupt


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_recovery_loses_only_the_damaged_bytes(scenario):
    specs, segment_bytes, kind, checkpoint, closed, where, segment_pick, garbage = scenario
    cfg = LogConfig(segment_bytes=segment_bytes, index_interval_bytes=256)
    with tempfile.TemporaryDirectory() as tmp:
        live, crashed = Path(tmp) / "live-0", Path(tmp) / "crash-0"
        log = PartitionLog.open(live, cfg)
        for i, (n, size) in enumerate(specs):
            recs = [(b"k%d" % j, bytes([j % 256]) * size, [], 1000 + i) for j in range(n)]
            assert log.append(build_batch(recs), 0).durable
        # what each batch looks like on disk: (segment base, position, bytes)
        written = []
        for seg in log.segments:
            for h in seg.batch_headers():
                written.append((seg.base_offset, h.position, seg.read_at(h.position, h.size)))
        leo = log.log_end_offset
        shutil.copytree(live, crashed)  # the crash image: the log was never closed
        log.close()

        files = segment_files(crashed)
        rp_file = crashed / RECOVERY_POINT_FILE
        recovery_point = int(rp_file.read_text()) if rp_file.exists() else None
        if checkpoint == "delete":
            rp_file.unlink(missing_ok=True)
            recovery_point = None
        elif checkpoint == "garbage":
            rp_file.write_bytes(b"\xff" + garbage)
            recovery_point = None
        if kind == "missing" and len(files) == 1:
            kind = "truncate"
        target = files[int(segment_pick * (len(files) - 1))] if (closed or kind == "missing") and len(files) > 1 \
            else files[-1]
        active = target == files[-1]
        tbase = int(target.name[:20])
        original = target.read_bytes()
        size = len(original)
        p = int(where * size) if size else 0
        damaged_end = size  # the damaged bytes are [p, damaged_end)
        if kind == "truncate":
            os.truncate(target, p)
        elif kind == "missing":
            target.unlink()
            p = 0
        elif kind == "flip" and size:
            # bytes outside the CRC (base offset, leader epoch) cannot be checked: hit a covered byte
            start = max(pos for b, pos, _ in written if b == tbase and pos <= p)
            rel = p - start
            if rel < 8 or 12 <= rel < 16:
                p = start + 21
            with open(target, "r+b") as f:
                f.seek(p)
                byte = f.read(1)
                f.seek(p)
                f.write(bytes([byte[0] ^ 0x5A]))
            damaged_end = p + 1
        elif kind == "zero" and size:
            with open(target, "r+b") as f:
                f.seek(p)
                f.write(b"\x00" * (size - p))
        elif kind == "garbage":
            with open(target, "ab") as f:
                f.write(garbage)
            p = damaged_end = size

        if kind in ("flip", "zero"):  # where the file really changed (zeroing zeros changes nothing)
            now = target.read_bytes()
            p = next((i for i in range(size) if now[i] != original[i]), size)
            if kind == "zero":
                damaged_end = size
        validated = recovery_point is None or tbase >= recovery_point
        # a torn write: the active segment, at or past the recovery point, is cut at the damage
        cut_from = p if active and validated else None

        def lost(base: int, pos: int, data: bytes) -> bool:
            if base != tbase or p >= size:
                return False
            if cut_from is not None:
                return pos + len(data) > cut_from
            return pos < damaged_end and pos + len(data) > p

        expected = [d for b, pos, d in written if not lost(b, pos, d)]
        rec = PartitionLog.open(crashed, cfg)
        # every segment file the damage did not touch is still there, byte for byte
        for f in files:
            if f != target:
                assert f.read_bytes() == (live / f.name).read_bytes()
        got, corrupt = read_all(rec, written)
        if kind in ("flip", "zero") and not validated and corrupt:
            # below the recovery point changed bytes may only be found by the read: the batch
            # holding them is answered CORRUPT_MESSAGE, never served
            hit = [read_header(d) for b, pos, d in written if lost(b, pos, d)]
            assert all(any(h.base_offset <= o <= h.last_offset for h in hit) for o in corrupt)
        else:
            assert not corrupt
        assert got == expected
        if cut_from is None:
            expected_leo = leo  # damage in a closed segment never moves the log end back
        else:
            expected_leo = read_header(expected[-1]).next_offset if expected else tbase
        assert rec.log_end_offset == expected_leo
        if expected != [d for _, _, d in written] and not corrupt and not active:
            assert rec.missing_offsets or rec.log_start_offset > 0  # (a cut at a batch boundary of the
            # active segment looks like a shorter log: nothing tells it apart)
        # the log keeps working after recovery, and a restart changes nothing
        r = rec.append(build_batch([(b"x", b"y", [], 5)]), 0)
        assert r.base_offset == expected_leo
        rec.close()
        again = PartitionLog.open(crashed, cfg)
        assert again.log_end_offset == expected_leo + 1 and not again.recovered_truncation
        assert read_all(again, written)[0] == got + [again.read(expected_leo, 1 << 20)]
        again.close()
