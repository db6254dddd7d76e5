"""``shoal serve``: run the broker in the foreground until SIGTERM or SIGINT."""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import signal
import sys
import threading
from collections.abc import Mapping
from pathlib import Path

from ..config import SENSITIVE_KEYS, BrokerConfig, ConfigError, load_properties
from .main import command


def _configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default=None, help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=port_number, default=None,
                   help="port to listen on, 0-65535 (default 9092; 0 picks a free port)")
    p.add_argument("--data-dir", default=None, help="data directory (default ./shoal-data, or log.dirs)")
    p.add_argument("--config", metavar="FILE", help="a Kafka-style properties file")
    p.add_argument("-o", "--override", metavar="KEY=VALUE", action="append", default=[],
                   help="set a broker configuration by its Kafka name; repeatable")
    p.add_argument("--log-level", default="INFO", type=str.upper, choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                   help="DEBUG (adds connections), INFO (default), WARNING or ERROR; the format is log.format")
    p.add_argument("--logger", metavar="NAME=LEVEL", action="append", default=[],
                   help="the level of one logger, e.g. shoal.authorizer=DEBUG (every authorization decision); "
                        "repeatable")


def port_number(text: str) -> int:
    """A TCP port given on the command line: 0-65535 (argparse shows the error and exits 2)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid port {text!r}: expected a number from 0 to 65535") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"invalid port {value}: a port is a number from 0 to 65535")
    return value


_MALLOC_ENV = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_",
               "GLIBC_TUNABLES")
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
MALLOC_MMAP_THRESHOLD = 32 << 20
MALLOC_TRIM_THRESHOLD = 64 << 20


def tune_malloc(environ: Mapping[str, str] = os.environ) -> bool:
    """Keep glibc's malloc from giving request-sized buffers back to the kernel after each request.

    A Produce of 1 MB passes through a few buffers of its size (the frame, the records,
    the copy the log rewrites). glibc serves such blocks from fresh mmaps until its
    adaptive threshold has risen past them, and trims its heap whenever more than twice
    that threshold is free at its top; either way the next request's buffers fault their
    pages in again (0.5-0.7 page faults per 1 KiB record, about twice the broker CPU per
    record, docs/PERFORMANCE.md). Fixing the thresholds where the adaptive ones can end
    up at most (32 MiB, and trimming past 64 MiB free) keeps those pages. Only with glibc,
    and only when the environment sets none of its malloc tunables (which then win).
    Returns whether the thresholds were set.
    """
    if any(name in environ for name in _MALLOC_ENV):
        return False
    try:
        if not os.confstr("CS_GNU_LIBC_VERSION"):
            return False
    except (ValueError, OSError):
        return False
    import ctypes

    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, MALLOC_MMAP_THRESHOLD)) and bool(
        mallopt(_M_TRIM_THRESHOLD, MALLOC_TRIM_THRESHOLD))


def _masked(item: str) -> str:
    """``key=value``, the value hidden for a password, key or JAAS key (Kafka's PASSWORD type)."""
    key, sep, _ = item.partition("=")
    name = key.strip()
    if sep and (name in SENSITIVE_KEYS or name.endswith(tuple(SENSITIVE_KEYS))):
        return f"{key}=[hidden]"
    return item


def freeze_startup_heap() -> int:
    """Move every object alive once the broker has started (modules, kio's schemas, the
    configuration, the loaded coordinators) out of the garbage collector's reach; returns
    how many are frozen.

    A full collection walks every tracked object, and a started broker holds about 90,000
    of them: 60-120 ms with the event loop stopped, once a burst of requests (a backlog
    under load) has allocated enough to trigger one. Frozen, they are not walked again
    (after a collection first, so that no startup garbage is frozen with them); a full
    collection then costs 10-30 ms (docs/PERFORMANCE.md).
    """
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


@command("serve", "run the broker in the foreground")(_configure)
def run(args: argparse.Namespace) -> int:
    tune_malloc()
    try:
        settings: dict[str, str] = {}
        if args.config:
            settings.update(load_properties(Path(args.config).read_text()))
        for item in args.override:
            key, sep, value = item.partition("=")
            if not sep:
                raise ConfigError(f"-o expects key=value, got {item!r}")
            settings[key.strip()] = value.strip()
        config = BrokerConfig(settings)
    except (OSError, ConfigError) as e:
        print(f"shoal serve: {e}", file=sys.stderr)
        return 2
    from ..observe.logs import configure

    configure(args.log_level, config["log.format"])
    for item in args.logger:
        name, _, level = item.partition("=")
        if level.strip().upper() not in ("DEBUG", "INFO", "WARNING", "ERROR") or not name.strip():
            print(f"shoal serve: --logger expects NAME=DEBUG|INFO|WARNING|ERROR, got {item!r}", file=sys.stderr)
            return 2
        logging.getLogger(name.strip()).setLevel(level.strip().upper())

    host, port = "127.0.0.1", 9092
    listener = config["listeners"].split(",")[0].split("://")[-1]
    if listener:
        h, _, p = listener.rpartition(":")
        host, port = h or host, int(p) if p else port
    if args.host is not None:
        host = args.host
    if args.port is not None:
        port = args.port
    data_dir = Path(args.data_dir or config["log.dirs"].split(",")[0])
    logging.getLogger("shoal").info(
        "starting: listener %s:%d, data dir %s, config file %s%s; limits: socket.request.max.bytes=%d, "
        "queued.max.requests=%d, message.max.bytes=%d, group.share.partition.max.record.locks=%d, "
        "metrics.port=%d", host, port, data_dir.resolve(), args.config or "(none)",
        "".join(f", -o {_masked(item)}" for item in args.override), config["socket.request.max.bytes"],
        config["queued.max.requests"], config["message.max.bytes"], config["group.share.partition.max.record.locks"],
        config["metrics.port"])

    try:
        import uvloop  # type: ignore[import-not-found]

        runner = uvloop.run
    except ImportError:  # pragma: no cover - platforms without uvloop
        runner = asyncio.run
    return runner(_serve(config, data_dir, host, port))


async def _serve(config: BrokerConfig, data_dir: Path, host: str, port: int) -> int:
    """Run the broker until a signal or a lost data directory stops it; returns the exit status.

    The first SIGTERM or SIGINT starts a clean shutdown, and a watchdog thread ends the
    process if the shutdown has not finished twice ``shutdown.timeout.ms`` (cluster
    mode's controlled shutdown and the connection drain may each take that long) plus
    :data:`SHUTDOWN_GRACE_S` later (a disk that blocks the event loop). A second signal
    exits at once, with status 128 + the signal number.
    """
    from ..errors import ApiError
    from ..server.broker import Broker

    broker = Broker(config, data_dir, host, port)
    try:
        await broker.start()
    except (OSError, ApiError) as e:  # ApiError: an internal topic could not be created (a full disk)
        logging.getLogger("shoal").error("cannot start: %s", e)
        return 1
    freeze_startup_heap()
    loop = asyncio.get_running_loop()
    limit_s = 2 * config["shutdown.timeout.ms"] / 1000 + SHUTDOWN_GRACE_S

    signals: list[int] = []

    def on_signal(signum: int) -> None:
        signals.append(signum)
        if len(signals) > 1:
            _exit_now(f"second {signal.Signals(signum).name} during shutdown: exiting at once", 128 + signum)
        _start_watchdog(limit_s)
        asyncio.ensure_future(broker.stop())

    async def watch_shutdown() -> None:  # a shutdown without a signal: the data directory is gone
        await broker.wait_stopping()
        _start_watchdog(limit_s)

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)
    watcher = asyncio.ensure_future(watch_shutdown())
    # Only now say so: a SIGTERM right after this line must reach the handler above.
    print(f"listening on {broker.host}:{broker.port}", flush=True)
    await broker.serve_forever()
    watcher.cancel()
    return broker.exit_code


SHUTDOWN_GRACE_S = 5.0
"""How long past twice ``shutdown.timeout.ms`` a shutdown may take before the process ends anyway."""


def _exit_now(reason: str, status: int) -> None:
    logging.getLogger("shoal").error("%s", reason)
    logging.shutdown()
    os._exit(status)


_watchdog_started = False


def _start_watchdog(limit_s: float) -> None:
    global _watchdog_started
    if _watchdog_started:
        return
    _watchdog_started = True
    timer = threading.Timer(limit_s, _exit_now, (f"shutdown did not finish within {limit_s:.0f}s: exiting", 1))
    timer.daemon = True
    timer.start()
