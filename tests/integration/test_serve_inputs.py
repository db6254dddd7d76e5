"""``shoal serve`` refuses ports outside 0-65535 and names the address it cannot bind,
before loading anything."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]


def _serve(tmp_path: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "shoal", "serve", "--data-dir", str(tmp_path / "data"), *args],
                          capture_output=True, text=True, timeout=timeout, cwd=tmp_path)


@pytest.mark.parametrize("port", ["70000", "-5", "65536", "ninety"])
def test_a_port_outside_0_to_65535_is_refused(tmp_path, port):
    r = _serve(tmp_path, "--port", port)
    assert r.returncode == 2, r.stderr
    assert "0 to 65535" in r.stderr and "listening on" not in r.stdout
    assert not (tmp_path / "data").exists()  # refused before anything was created


@pytest.mark.parametrize("key,value", [("listeners", "PLAINTEXT://127.0.0.1:70000"),
                                       ("advertised.listeners", "PLAINTEXT://127.0.0.1:99999"),
                                       ("metrics.port", "65536")])
def test_a_configured_port_outside_0_to_65535_is_refused(tmp_path, key, value):
    r = _serve(tmp_path, "-o", f"{key}={value}")
    assert r.returncode == 2, r.stderr
    assert key in r.stderr and "65535" in r.stderr


@pytest.fixture
def busy_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    yield s.getsockname()[1]
    s.close()


def test_a_port_in_use_is_named_before_the_coordinators_load(tmp_path, busy_port):
    r = _serve(tmp_path, "--port", str(busy_port))
    assert r.returncode == 1
    assert f"cannot listen on 127.0.0.1:{busy_port}: address already in use" in r.stderr
    # Nothing slow ran first: no log recovery, no coordinator replay.
    assert "replayed" not in r.stderr and "coordinator loaded" not in r.stderr, r.stderr


def test_a_metrics_port_in_use_is_named_before_the_coordinators_load(tmp_path, busy_port):
    started = time.monotonic()
    r = _serve(tmp_path, "--port", "0", "-o", f"metrics.port={busy_port}")
    assert r.returncode == 1, r.stderr
    assert f"cannot listen on 127.0.0.1:{busy_port} (metrics.port): address already in use" in r.stderr
    assert "replayed" not in r.stderr and "coordinator loaded" not in r.stderr, r.stderr
    assert time.monotonic() - started < 60
