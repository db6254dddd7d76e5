"""Reads as FileSlices (records read only when sent), and followers' fsyncs that drop pages."""

from __future__ import annotations

import ctypes
import mmap
import os

import pytest

from shoal.log.partition_log import PartitionLog
from shoal.log.policy import LogConfig
from shoal.log.segment import FileSlice
from shoal.protocol.batch import decode_records, validate_batches

from .helpers import batch

MIN = 16 * 1024


def open_log(path, **kw) -> PartitionLog:
    return PartitionLog.open(path / "t-0", LogConfig(**kw))


def filled(tmp_path, batches: int = 40, records: int = 10, value_size: int = 200, **kw) -> PartitionLog:
    log = open_log(tmp_path, **kw)
    for i in range(batches):
        log.append(batch(records, ts=1000 + i, value_size=value_size), 1000 + i)
    return log


def offsets_of(data: bytes) -> list[int]:
    return [r.offset for h in validate_batches(data) for r in decode_records(data, h)]


def test_a_read_that_reaches_the_segment_end_is_a_slice_of_the_same_bytes(tmp_path):
    log = filled(tmp_path)
    want = log.read(57, 1 << 30)
    got = log.read(57, 1 << 30, MIN)
    assert type(got) is FileSlice and len(got) == len(want)
    assert got.read() == want
    assert offsets_of(got.read())[0] <= 57 and offsets_of(got.read())[-1] == log.log_end_offset - 1


def test_a_bounded_read_is_a_slice_of_whole_batches_that_fit(tmp_path):
    log = filled(tmp_path, index_interval_bytes=1)  # every batch indexed
    whole = log.read(0, 1 << 30)
    one = len(log.read(0, 1))  # one batch's size
    for limit in (one * 10, one * 10 + one // 2, one * 25 - 1):
        got = log.read(0, limit, MIN)
        assert type(got) is FileSlice and len(got) <= limit
        assert len(got) == one * (limit // one)
        data = got.read()
        assert whole.startswith(data)
        assert offsets_of(data) == list(range(len(data) // one * 10))
    # the next read goes on where the slice ended
    nxt = log.read(100, one * 10, MIN)
    assert offsets_of(nxt.read())[0] == 100


def test_small_reads_and_reads_the_index_cannot_bound_stay_bytes(tmp_path):
    log = filled(tmp_path)
    assert type(log.read(0, 1, MIN)) is bytes  # one batch, below the minimum
    assert type(log.read(log.log_end_offset - 10, 1 << 30, MIN)) is bytes  # one batch left
    sparse = filled(tmp_path / "sparse", index_interval_bytes=1 << 30)  # only the first batch indexed
    got = sparse.read(0, 30_000, MIN)
    assert type(got) is bytes and offsets_of(got)[0] == 0 and len(got) <= 30_000
    assert log.read(0, 1 << 30) == log.read(0, 1 << 30, None)


def test_a_slice_goes_stale_when_its_segment_is_truncated_or_closed(tmp_path):
    log = filled(tmp_path)
    s = log.read(0, 1 << 30, MIN)
    assert s.usable()
    log.append(batch(5), 5000)  # appending keeps it
    assert s.usable() and offsets_of(s.read())[-1] == 399
    log.truncate_to(200)
    assert not s.usable()
    with pytest.raises(OSError):
        s.read()
    s2 = log.read(0, 1 << 30, MIN)
    assert s2.usable()
    log.roll()
    assert s2.usable()  # a sealed segment still holds its bytes
    log.close()
    assert not s2.usable()


def test_a_slice_of_a_deleted_segment_is_stale(tmp_path):
    log = filled(tmp_path, segment_bytes=20_000)
    assert len(log.segments) > 2
    s = log.read(0, 1 << 30, MIN)
    assert s.usable()
    log.delete_records(log.segments[2].base_offset)
    assert not s.usable()


def resident_pages(path) -> int:
    """How many pages of ``path`` are in the page cache: mincore(2) on a mapping of it."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    size = os.path.getsize(path)
    pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        assert addr not in (None, ctypes.c_void_p(-1).value), ctypes.get_errno()
        try:
            vec = (ctypes.c_ubyte * pages)()
            assert libc.mincore(addr, size, vec) == 0, ctypes.get_errno()
        finally:
            libc.munmap(addr, size)
    finally:
        os.close(fd)
    return sum(v & 1 for v in vec)


@pytest.mark.parametrize("drop", [False, True])
def test_a_followers_fsync_drops_the_synced_pages_from_the_page_cache(tmp_path, drop):
    log = filled(tmp_path, batches=100, records=10, value_size=1000)  # about 1 MB
    path = log.segments[-1].log_path
    pages = resident_pages(path)
    assert pages >= 200  # just written: cached
    ticket = log.begin_flush(drop_cache=drop)
    log.append(batch(10, value_size=1000), 2000)  # written after the ticket: kept either way
    ticket.sync()
    log.end_flush(ticket, 2000)
    after = resident_pages(path)
    if drop:
        assert after <= 4  # the page the later append straddles, at most
    else:
        assert after >= pages
    assert offsets_of(log.read(0, 1 << 30)) == list(range(1010))  # the bytes are all there
