"""A consumer's Fetch in cluster mode reads only the whole batches below the high
watermark: as a file slice cut at the batch holding the high watermark (never read into
memory before it is sent), the same bytes as the batches cut from the read bytes."""

from __future__ import annotations

from pathlib import Path

from shoal.log.partition_log import PartitionLog
from shoal.log.policy import LogConfig
from shoal.log.segment import FileSlice
from shoal.server.fetch_service import _below, _slice_below

from ..log.helpers import batch


def test_a_slice_cut_at_the_high_watermark_holds_the_batches_below_it(tmp_path: Path) -> None:
    log = PartitionLog.open(tmp_path / "t-0", LogConfig())
    for i in range(40):
        log.append(batch(10, ts=1000 + i, value_size=1000), 1000 + i)  # offsets 10*i .. 10*i+9
    for start in (0, 35, 200):
        data = log.read(start, 1 << 30, 16 * 1024)
        assert type(data) is FileSlice
        whole = data.read()
        for end in (start + 1, 60, 200, 205, 399, 400, 10_000):
            if end <= start:
                continue
            cut = _slice_below(data, end)
            got = cut.read() if type(cut) is FileSlice else cut
            assert got == _below(whole, end), (start, end)
            if end >= 400:
                assert cut is data  # all of it is below
    # the batch holding the fetch offset reaches past the high watermark: nothing
    assert _slice_below(log.read(35, 1 << 30, 16 * 1024), 39) == b""
