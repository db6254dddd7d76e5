"""Recovery after a crash: flushed batches before the damage survive, nothing after a torn batch shows.

A log is written (fsync every append), its files are copied while it is still open (the
image a crash leaves), the copy is damaged at a random point (truncated, a byte flipped,
zeroed tail, garbage appended), and reopened.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shoal.log.partition_log import RECOVERY_POINT_FILE, PartitionLog
from shoal.log.policy import LogConfig
from shoal.protocol.batch import build_batch, read_header

KINDS = ("truncate", "flip", "zero", "garbage")


@st.composite
def scenarios(draw):
    specs = draw(st.lists(st.tuples(st.integers(1, 5), st.integers(0, 300)), min_size=1, max_size=25))
    segment_bytes = draw(st.sampled_from([2048, 4096, 1 << 20]))
    kind = draw(st.sampled_from(KINDS))
    keep_checkpoint = draw(st.booleans())
    where = draw(st.floats(0, 1, exclude_max=True))
    segment_pick = draw(st.floats(0, 1, exclude_max=True))
    garbage = draw(st.binary(min_size=1, max_size=100))
    return specs, segment_bytes, kind, keep_checkpoint, where, segment_pick, garbage


def segment_files(d: Path) -> list[Path]:
    return sorted(d.glob("*.log"))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_recovery_keeps_flushed_prefix_and_cuts_the_rest(scenario):
    specs, segment_bytes, kind, keep_checkpoint, where, segment_pick, garbage = scenario
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
        shutil.copytree(live, crashed)  # the crash image: the log was never closed
        log.close()

        files = segment_files(crashed)
        if keep_checkpoint and (crashed / RECOVERY_POINT_FILE).exists():
            target = files[-1]  # only unflushed-at-roll data can tear: the active segment
        else:
            (crashed / RECOVERY_POINT_FILE).unlink(missing_ok=True)
            target = files[int(segment_pick * len(files))]
        tbase = int(target.name[:20])
        original = target.read_bytes()
        size = len(original)
        p = int(where * size) if size else 0
        if kind == "truncate":
            os.truncate(target, p)
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
        elif kind == "zero" and size:
            with open(target, "r+b") as f:
                f.seek(p)
                f.write(b"\x00" * (size - p))
        elif kind == "garbage":
            with open(target, "ab") as f:
                f.write(garbage)
            p = size

        if kind in ("flip", "zero"):  # where the file really changed (zeroing zeros changes nothing)
            now = target.read_bytes()
            p = next((i for i in range(size) if now[i] != original[i]), size)
        # expected survivors: every batch before the damaged point, in log order
        survivors = []
        for base, pos, data in written:
            if base < tbase or (base == tbase and pos + len(data) <= p):
                survivors.append(data)
            else:
                break
        if p >= size and kind != "truncate":  # nothing changed in the target, or bytes appended after it
            survivors = [d for b, _, d in written if b <= tbase] if kind == "garbage" else [d for _, _, d in written]

        rec = PartitionLog.open(crashed, cfg)
        expected_leo = read_header(survivors[-1]).next_offset if survivors else 0
        assert rec.log_end_offset == expected_leo
        offset = 0
        for data in survivors:
            h = read_header(data)
            got = rec.read(h.base_offset, 1)
            assert bytes(got) == data
            offset = h.next_offset
        assert rec.read(offset, 1 << 20) == b""
        # the log keeps working after recovery, and a restart changes nothing
        r = rec.append(build_batch([(b"x", b"y", [], 5)]), 0)
        assert r.base_offset == expected_leo
        rec.close()
        again = PartitionLog.open(crashed, cfg)
        assert again.log_end_offset == expected_leo + 1 and not again.recovered_truncation
        again.close()
