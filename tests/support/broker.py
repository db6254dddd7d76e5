"""A real ``shoal serve`` process for integration tests.

Usage::

    b = BrokerProcess(tmp_path / "data", overrides={"log.segment.bytes": "4096"})
    b.start()            # waits for "listening on HOST:PORT" on stdout
    b.bootstrap          # "127.0.0.1:PORT", for any Kafka client
    b.restart()          # SIGTERM, then start again on the same data dir and port
    b.kill()             # SIGKILL (a crash); b.start() brings it back
    b.stop()             # SIGTERM and wait; raises if the exit was not clean

``nofile_limit`` starts the process with that RLIMIT_NOFILE (soft and hard), as
``ulimit -n`` would.

The broker's stderr goes to ``<data dir>/../broker-<port>.stderr`` (one file per start,
appended); :meth:`BrokerProcess.stderr_tail` returns its last lines, and every failure
raised here includes them.
"""

from __future__ import annotations

import os
import resource
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = ["BrokerProcess", "BrokerError"]

START_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 20.0


class BrokerError(RuntimeError):
    pass


class BrokerProcess:
    def __init__(self, data_dir: Path, overrides: Mapping[str, str] | None = None,
                 log_level: str = "INFO", *, nofile_limit: int | None = None,
                 extra_args: Sequence[str] = ()) -> None:
        self.data_dir = Path(data_dir)
        self.extra_args = list(extra_args)
        """More ``shoal serve`` options (``--logger NAME=LEVEL``)."""
        self.nofile_limit = nofile_limit
        self.overrides = dict(overrides or {})
        self.log_level = log_level
        self.port: int | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.stderr_path = self.data_dir.parent / f"{self.data_dir.name}.stderr"
        self._stderr_file = None

    # -- lifecycle -------------------------------------------------------------------
    @property
    def bootstrap(self) -> str:
        if self.port is None:
            raise BrokerError("broker not started")
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def open_descriptors(self) -> int:
        """How many descriptors the running broker has open (from /proc/PID/fd)."""
        return len(os.listdir(f"/proc/{self.pid}/fd"))

    def is_alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, port: int | None = None) -> "BrokerProcess":
        """Start the broker; ``port`` None means a free one (or the previous one, if any)."""
        if self.is_alive():
            raise BrokerError("broker already running")
        want = port if port is not None else (self.port or 0)
        try:
            self._spawn(want)
        except BrokerError:
            if want == 0:
                raise
            self._spawn(0)  # the old port was taken meanwhile
        return self

    def _spawn(self, port: int) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "shoal", "serve", "--host", "127.0.0.1", "--port", str(port),
               "--data-dir", str(self.data_dir), "--log-level", self.log_level, *self.extra_args]
        for k, v in self.overrides.items():
            cmd += ["-o", f"{k}={v}"]
        self._stderr_file = open(self.stderr_path, "ab")
        self._stderr_file.write(f"==== {' '.join(cmd)}\n".encode())
        self._stderr_file.flush()
        limit = self.nofile_limit

        def lower_nofile() -> None:
            if limit is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self._stderr_file,
                                     stdin=subprocess.DEVNULL, preexec_fn=lower_nofile if limit else None)
        line = self._read_ready_line()
        if line is None:
            try:  # a broker that refused to start may still be exiting: let it report its status
                rc = self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                rc = None
            self._close_stderr()
            raise BrokerError(f"broker did not report readiness on port {port} (exit {rc})" + self._tail())
        self.port = int(line.rsplit(":", 1)[1])

    def _read_ready_line(self) -> str | None:
        assert self.proc is not None and self.proc.stdout is not None
        deadline = time.monotonic() + START_TIMEOUT_S
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        buf = b""
        try:
            while time.monotonic() < deadline:
                if not sel.select(timeout=max(0.0, deadline - time.monotonic())):
                    continue
                chunk = os.read(self.proc.stdout.fileno(), 4096)
                if not chunk:
                    return None  # stdout closed: the process exited
                buf += chunk
                for line in buf.decode(errors="replace").splitlines():
                    if line.startswith("listening on "):
                        return line.strip()
            return None
        finally:
            sel.close()

    def stop(self, *, check: bool = True) -> int:
        """SIGTERM and wait; returns the exit code. With ``check``, a non-zero exit raises."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                self._finish()
                raise BrokerError(f"broker did not stop within {STOP_TIMEOUT_S}s of SIGTERM" + self._tail())
        rc = self.proc.returncode
        self._finish()
        if check and rc != 0:
            raise BrokerError(f"broker exited with {rc}" + self._tail())
        return rc

    def kill(self) -> None:
        """SIGKILL: the broker gets no chance to flush or close anything."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._finish()
        self.proc = None

    def restart(self, *, crash: bool = False) -> "BrokerProcess":
        """Stop (SIGTERM, or SIGKILL with ``crash``) and start on the same data dir and port."""
        if crash:
            self.kill()
        else:
            self.stop()
        return self.start()

    def _finish(self) -> None:
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()
        self._close_stderr()

    def _close_stderr(self) -> None:
        if self._stderr_file is not None:
            self._stderr_file.close()
            self._stderr_file = None

    # -- diagnostics -----------------------------------------------------------------
    def stderr_tail(self, lines: int = 40) -> str:
        try:
            text = self.stderr_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def _tail(self) -> str:
        tail = self.stderr_tail()
        return f"\n--- broker stderr ({self.stderr_path}) ---\n{tail}" if tail else ""

    def assert_alive(self) -> None:
        if not self.is_alive():
            raise AssertionError(f"broker exited with {self.proc.returncode if self.proc else None}" + self._tail())

    def __enter__(self) -> "BrokerProcess":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop(check=False)
