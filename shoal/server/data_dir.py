"""The data directory's owner: one broker per directory, and storage failures reported once.

Theory of operation
-------------------
:class:`DataDirLock` takes an exclusive ``flock`` on ``<data dir>/.lock`` before the
broker reads or writes anything there, and writes its pid into the file. A second
process on the same directory cannot take the lock and stops at once with
:class:`DataDirInUse`, naming the holder's pid; the kernel drops the lock when the
holder exits, however it exits, so a stale lock file never blocks a restart.

:meth:`DataDirLock.check` tells whether the directory the broker locked is still the
one at its path: after ``rm -rf`` of the data directory the open files still accept
writes, but they are unlinked and every acknowledged record would vanish with the
process. The broker checks every second and stops when the directory is gone.

:class:`StorageErrors` keeps which partitions (or other writers) are failing to write,
so a full disk logs one error per partition with its cause, not one per request, and
one line when that partition writes again.

Concurrency: event loop only.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
from collections.abc import Callable, Hashable
from pathlib import Path

__all__ = ["LOCK_FILE", "DataDirInUse", "DataDirLock", "StorageErrors"]

LOCK_FILE = ".lock"

log = logging.getLogger("shoal.storage")


class DataDirInUse(OSError):
    """Another process holds the data directory's lock."""


class DataDirLock:
    """An exclusive lock on a data directory for the life of the process."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = Path(data_dir)
        self.path = self.data_dir / LOCK_FILE
        self._fd = -1

    def acquire(self) -> None:
        """Take the lock and record our pid. Raises DataDirInUse, or OSError if the file cannot be made."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            holder = _read_pid(fd)
            os.close(fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                who = f"pid {holder}" if holder else "another process"
                raise DataDirInUse(f"data directory {self.data_dir} is in use by another broker ({who}); "
                                   f"only one broker may use a data directory") from None
            raise
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError:
            pass  # the lock is what counts; the pid is only for the message (a full disk)
        self._fd = fd

    def check(self) -> str | None:
        """None while the locked file is still ``<data dir>/.lock``; else what happened to it."""
        if self._fd < 0:
            return None
        try:
            st = os.fstat(self._fd)
            if st.st_nlink == 0:
                return "it was deleted"
            cur = os.stat(self.path)
        except FileNotFoundError:
            return "it was deleted"
        except OSError as e:
            return f"it cannot be read ({e})"
        if (cur.st_dev, cur.st_ino) != (st.st_dev, st.st_ino):
            return "it was replaced"
        return None

    def release(self) -> None:
        if self._fd >= 0:
            try:
                os.close(self._fd)  # closing drops the flock; the file stays for the next holder
            finally:
                self._fd = -1


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode(errors="replace").strip()
        return int(text) if text else None
    except (OSError, ValueError):
        return None


class StorageErrors:
    """Which writers are failing; each failure is logged once, and the recovery once.

    A writer is a partition, as ``(topic, partition)``, or a name such as ``"topics.json"``.
    """

    def __init__(self) -> None:
        self._failing: dict[Hashable, tuple[str, str]] = {}
        self.listeners: list[Callable[[Hashable, str], None]] = []
        """Called with (writer, cause) at every failure (cluster mode: a failed partition
        write takes the log directory offline)."""

    def failed(self, what: Hashable, cause: object, label: str | None = None) -> None:
        """Report a failed write of ``what``; logs only the first of a run of failures.

        ``label`` names the writer in the log (default: ``partition <topic>-<n>`` for a
        ``(topic, n)`` key, else ``str(what)``).
        """
        if what not in self._failing:
            name = label or _label(what)
            self._failing[what] = (str(cause), name)
            log.error("%s: write failed: %s (not logged again until it writes again)", name, cause)
        for listener in self.listeners:
            listener(what, str(cause))

    def ok(self, what: Hashable) -> None:
        """Report a successful write of ``what``; logs if it was failing."""
        if self._failing:
            was = self._failing.pop(what, None)
            if was is not None:
                log.warning("%s: writes succeed again", was[1])

    def failing(self) -> dict[Hashable, str]:
        """Writers whose last write failed, with the cause."""
        return {k: cause for k, (cause, _) in self._failing.items()}


def _label(what: Hashable) -> str:
    if isinstance(what, tuple) and len(what) == 2:
        return f"partition {what[0]}-{what[1]}"
    return str(what)
