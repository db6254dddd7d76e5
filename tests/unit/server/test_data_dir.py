"""The data directory's lock, the check that it is still there, and storage errors logged once."""

from __future__ import annotations

import logging
import os
import shutil

import pytest

from shoal.server.data_dir import LOCK_FILE, DataDirInUse, DataDirLock, StorageErrors


def test_a_second_lock_on_the_same_directory_fails_naming_the_holder(tmp_path):
    first = DataDirLock(tmp_path)
    first.acquire()
    assert (tmp_path / LOCK_FILE).read_text().strip() == str(os.getpid())
    with pytest.raises(DataDirInUse, match=rf"in use by another broker \(pid {os.getpid()}\)"):
        DataDirLock(tmp_path).acquire()  # flock conflicts between open files, even in one process
    first.release()
    again = DataDirLock(tmp_path)
    again.acquire()  # the lock file stays, the lock does not
    again.release()


def test_check_notices_a_deleted_or_replaced_directory(tmp_path):
    d = tmp_path / "data"
    d.mkdir()
    lock = DataDirLock(d)
    lock.acquire()
    assert lock.check() is None
    shutil.rmtree(d)
    assert lock.check() == "it was deleted"
    d.mkdir()
    (d / LOCK_FILE).write_text("")
    assert lock.check() in ("it was deleted", "it was replaced")
    lock.release()


def test_storage_errors_are_logged_once_until_the_writer_recovers(caplog):
    errors = StorageErrors()
    with caplog.at_level(logging.WARNING, logger="shoal.storage"):
        for _ in range(5):
            errors.failed(("t", 0), "No space left on device")
        errors.failed(("t", 1), "No space left on device")
        errors.ok(("t", 2))
        assert set(errors.failing()) == {("t", 0), ("t", 1)}
        errors.ok(("t", 0))
        errors.failed(("t", 0), "No space left on device")
    lines = [r.getMessage() for r in caplog.records]
    assert sum("partition t-0: write failed: No space left on device" in m for m in lines) == 2
    assert sum("partition t-1: write failed" in m for m in lines) == 1
    assert sum("partition t-0: writes succeed again" in m for m in lines) == 1
    assert len(lines) == 4
