"""The broker process: builds every part, serves connections, shuts down in order.

Start order: the data directory's lock, log store (recovery), coordinators (replay of
the internal topics), listening socket, then one "ready" log line with the bound
address. Stop order (uvicorn's): stop listening; every connection stops reading and
closes once its accepted requests are answered; wait up to ``shutdown.timeout.ms``;
abort what is left; stop timers; flush and close the log; release the lock. Each step
runs whatever the previous one raised, so a stop always ends.

The broker is the only owner of I/O resources (files, sockets, timers, threads for
fsync). Pure cores (groups, share partitions, coordinators) are called from here and
from the handlers with ``now_ms`` and return what to do.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import resource
import time
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..cluster.metadata import LocalMetadata
from ..config import BrokerConfig
from ..errors import FsyncError
from ..log.partition_log import atomic_write
from ..log.store import LogStore
from ..security.serving import Listeners
from .data_dir import DataDirLock, StorageErrors
from .dispatch import routes
from .fetch_service import FetchService
from .fetch_session import FetchSessionCache
from .listener import bind_error
from .memory_pool import MemoryPool
from .state_files import DynamicConfigs, ProducerIdAllocator
from .worker_threads import WorkerThreads

log = logging.getLogger("shoal.broker")
_UNKNOWN_TOPICS_REMEMBERED = 10_000

HALT_EXIT_CODE = 70
"""Exit status after :meth:`Broker.halt_on_storage_error` (EX_SOFTWARE)."""

DATA_DIR_CHECK_S = 1.0
"""How often the broker checks that its data directory is still there."""


def raise_open_files_limit() -> tuple[int, int]:
    """Raise the soft RLIMIT_NOFILE to the hard limit; returns the (soft, hard) now in force.

    Kafka brokers are run with a large descriptor limit; doing it here means a default
    soft limit (often 1024) does not cap the broker when the hard limit allows more.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError) as exc:  # e.g. an unlimited hard limit above fs.nr_open
            log.warning("could not raise the open file limit from %d to %d: %s", soft, hard, exc)
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft, hard


class Clock:
    """Wall-clock milliseconds; tests of the shell may substitute their own."""

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000


_THREAD, _INLINE_IF_SMALL, _INLINE = 0, 1, 2
"""How a due flush runs (``Flusher._due``): the stronger asker wins."""

INLINE_FSYNC_BYTES = 64 << 10
"""A partition whose unflushed bytes are at most this is fsynced on the event loop (see
:class:`Flusher`)."""
INLINE_FSYNC_PARTITIONS = 2
"""At most this many partitions are fsynced on the event loop in one pass; when more are
due together, they all go to the fsync threads (``FSYNC_THREADS`` of them)."""
FSYNC_THREADS = 4
"""Worker threads for the fsyncs answers wait for. fdatasyncs of different files overlap
on the disk: six of about 170 KB each (a transaction's six partitions) took 1.5 ms with
two threads, 1.2 ms with three and 1.0-1.3 ms with six on the benchmark machine."""
INLINE_FSYNC_MAX_S = 0.001
"""Partitions are fsynced on the event loop only while fsyncs take at most this long (a
moving average of the last ones): a slower disk would hold the loop up for too long."""


class Flusher:
    """Group commit: concurrent waiters on one partition share a single fdatasync.

    ``await durable(plog, end_offset)`` returns once everything before ``end_offset`` has
    been fsynced. The fsyncs asked for during one pass of the event loop start together in
    the next one (``_run_due``), each covering everything appended to its partition by
    then, whichever connections appended it. For Produce (``inline_if_small``), a
    partition with little to write (at most ``INLINE_FSYNC_BYTES``, and no more than
    ``INLINE_FSYNC_PARTITIONS`` such partitions due at once) is synced right there on the
    event loop, as long as fsyncs take at most ``INLINE_FSYNC_MAX_S`` (a moving average):
    a small fdatasync costs about 50 us of CPU, and handing it to a thread and back costs
    about as much again (waking the thread, waking the loop when it is done, a second
    loop pass, the GIL changing hands), while it blocks the loop for the disk's latency
    (about 0.5 ms on the development machine when it is quiet), during which the next
    appends queue up for the next shared sync. Every other sync (larger ones, many
    partitions at once, any while the disk is slow, and the share-state and transaction
    writes, whose callers keep the loop free) runs in a worker thread (``worker_threads.py``)
    on a descriptor of its own (``PartitionLog.begin_flush``), so the event loop keeps
    reading, appending and answering other requests meanwhile; appends that arrive during
    one such fsync are covered by the next, shared by all their waiters. Raises OSError
    if the fsync fails.

    Each waiter has its own future, resolved by the flush itself as soon as its offset
    is durable, and a cancelled waiter never cancels the flush that others wait for. When
    a flush ends with waiters it did not cover, the next one starts at once.
    """

    def __init__(self, clock: Clock, inline_bytes: int = INLINE_FSYNC_BYTES) -> None:
        self._clock = clock
        self._inline_bytes = inline_bytes
        self._running: dict[int, asyncio.Task[None]] = {}
        self._waiters: dict[int, list[tuple[int, asyncio.Future[None]]]] = {}
        self._due: dict[int, tuple[Any, int]] = {}
        """Partitions whose flush starts in the next loop pass (``_run_due``): plog, how."""
        self._sync_s = 0.0
        """Moving average of the fsyncs' wall time (s)."""
        self._threads = WorkerThreads(FSYNC_THREADS, "shoal-fsync")
        self._background = WorkerThreads(1, "shoal-fsync-bg")

    async def durable(self, plog: Any, end_offset: int, *, inline: bool = False, background: bool = False) -> None:
        """Return once everything before ``end_offset`` is fsynced.

        ``inline`` runs the fdatasync on the event loop whatever its size (the internal
        topics' writes). It is still shared: the flush starts on the next loop iteration
        and covers everything appended until then. ``background``
        (followers' logs, which nobody answers after) runs it in a thread of its own, so
        that it never queues in front of the fsyncs a produce waits for, and then drops
        the synced pages from the page cache: nobody reads a follower's log, and pages
        freed at once are what the next writes reuse (growing the page cache into memory
        the kernel does not hold yet costs several times more CPU than the write itself,
        notably on virtual machines that return free memory to their host).
        """
        waiter = self.waiter(plog, end_offset, inline=inline, background=background)
        if waiter is not None:
            await waiter

    def waiter(self, plog: Any, end_offset: int, *, inline: bool = False, background: bool = False,
               inline_if_small: bool = False) -> asyncio.Future[None] | None:
        """As :meth:`durable`, but return the future the flush resolves (None when
        everything before ``end_offset`` is already durable). ``inline_if_small`` (Produce)
        lets the flush run on the event loop when it is small and fsyncs are quick (see
        the class)."""
        if plog.durable_offset >= end_offset:
            return None
        key = id(plog)  # unique while a flush or waiter holds plog
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        self._waiters.setdefault(key, []).append((end_offset, waiter))
        if key in self._running:
            return waiter  # the running flush starts the next one when it ends
        if background:
            self._running[key] = asyncio.ensure_future(self._flush(plog, key, True))
            return waiter
        mode = _INLINE if inline else _INLINE_IF_SMALL if inline_if_small else _THREAD
        due = self._due.get(key)
        if due is None:
            if not self._due:
                loop.call_soon(self._run_due)
            self._due[key] = (plog, mode)
        elif mode > due[1]:
            self._due[key] = (plog, mode)
        return waiter

    def _run_due(self) -> None:
        """Start the flushes asked for in the last loop pass: the small ones right here."""
        due, self._due = self._due, {}
        here: list[tuple[int, Any, int]] = []
        quick = self._sync_s <= INLINE_FSYNC_MAX_S
        for key, (plog, mode) in due.items():
            if key in self._running:
                continue
            if mode == _INLINE or (mode == _INLINE_IF_SMALL and quick and plog.unflushed_bytes <= self._inline_bytes):
                here.append((key, plog, mode))
            else:
                self._running[key] = asyncio.ensure_future(self._flush(plog, key))
        if len(here) > INLINE_FSYNC_PARTITIONS:
            for key, plog, mode in here:
                if mode != _INLINE:
                    self._running[key] = asyncio.ensure_future(self._flush(plog, key))
            here = [entry for entry in here if entry[2] == _INLINE]
        for key, plog, _mode in here:
            error: BaseException | None = None
            try:
                ticket = plog.begin_flush()
                self._took(_timed_sync(ticket))
                plog.end_flush(ticket, self._clock.now_ms())
            except Exception as e:  # OSError from the sync
                error = e
                if isinstance(e, FsyncError):
                    plog.fsync_failed(e)
            self._settle(plog, key, error)

    async def _flush(self, plog: Any, key: int, background: bool = False) -> None:
        """One flush in a worker thread (``background``: the follower's thread)."""
        error: BaseException | None = None
        try:
            ticket = plog.begin_flush(drop_cache=background)
            if background:
                await self._background.run(ticket.sync)
            else:
                self._took(await self._threads.run(functools.partial(_timed_sync, ticket)))
            plog.end_flush(ticket, self._clock.now_ms())
        except BaseException as e:  # OSError from the sync; CancelledError at shutdown
            error = e
            if isinstance(e, FsyncError):
                plog.fsync_failed(e)  # no more appends: see PartitionLog.fsync_failed
        finally:
            self._running.pop(key, None)
        self._settle(plog, key, error, background)
        if isinstance(error, asyncio.CancelledError):
            raise error

    def _settle(self, plog: Any, key: int, error: BaseException | None, background: bool = False) -> None:
        """Resolve the waiters a flush of ``plog`` covered (or failed); start the next flush
        for those appended while it ran."""
        durable = plog.durable_offset
        left: list[tuple[int, asyncio.Future[None]]] = []
        for end_offset, waiter in self._waiters.pop(key, ()):
            if waiter.done():
                continue
            if error is not None:
                if isinstance(error, asyncio.CancelledError):
                    waiter.cancel()
                else:
                    waiter.set_exception(error)
            elif end_offset <= durable:
                waiter.set_result(None)
            else:
                left.append((end_offset, waiter))
        if left:
            # Appended while this flush ran (in a worker thread): the next flush covers them.
            self._waiters[key] = left
            self._running[key] = asyncio.ensure_future(self._flush(plog, key, background))

    def _took(self, seconds: float) -> None:
        self._sync_s += (seconds - self._sync_s) * 0.2

    def waiting(self) -> int:
        """Callers waiting for an fsync now (the Produce purgatory's size, for the metrics)."""
        return sum(len(w) for w in self._waiters.values())

    def close(self) -> None:
        self._threads.close()
        self._background.close()


def _timed_sync(ticket: Any) -> float:
    """Run ``ticket.sync()``; return how long it took (s). In any thread."""
    start = time.perf_counter()
    ticket.sync()
    return time.perf_counter() - start


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class AppendWaiters:
    """The watchers of parked Fetch long polls (``fetch_service.DelayedFetch``), keyed by
    (topic, partition): ``notify`` completes the operations watched under a partition that
    changed (an append, a moved high watermark or last stable offset, a lost leadership).

    ``listeners`` are told of every change too (``notify(topic, partition)``, ``wake_all()``,
    and their ``parked()`` counts in): the share service's ShareFetch purgatory is one.
    """

    def __init__(self) -> None:
        self._waiters: dict[tuple[str, int], set[asyncio.Future[None]]] = {}
        self.listeners: list[Any] = []

    def notify(self, topic: str, partition: int) -> None:
        waiters = self._waiters.pop((topic, partition), None)
        if waiters:
            for fut in waiters:
                if not fut.done():
                    fut.set_result(None)
        for listener in self.listeners:
            listener.notify(topic, partition)

    def wake_all(self) -> None:
        """Wake every parked long poll (at shutdown: each then answers with what it has)."""
        waiters, self._waiters = self._waiters, {}
        for futs in waiters.values():
            for fut in futs:
                if not fut.done():
                    fut.set_result(None)
        for listener in self.listeners:
            listener.wake_all()

    def parked(self) -> int:
        """Long polls parked now, Fetch and the listeners' (the Fetch purgatory's size, for the metrics)."""
        return len({id(f) for futs in self._waiters.values() for f in futs}) + sum(
            listener.parked() for listener in self.listeners)

    async def wait(self, keys: Iterable[tuple[str, int]], timeout_s: float) -> None:
        """Return when any of ``keys`` is notified or after ``timeout_s``."""
        if timeout_s <= 0:
            return
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        keys = list(keys)
        for k in keys:
            self._waiters.setdefault(k, set()).add(fut)
        # One timer that resolves the future itself: asyncio.wait_for would add a second
        # future, callbacks and a timeout exception to every long poll.
        timer = loop.call_later(timeout_s, _resolve, fut)
        try:
            await fut
        finally:
            timer.cancel()
            for k in keys:
                s = self._waiters.get(k)
                if s is not None:
                    s.discard(fut)
                    if not s:
                        del self._waiters[k]


class Broker:
    def __init__(self, config: BrokerConfig, data_dir: Path, host: str = "127.0.0.1", port: int = 9092) -> None:
        self.config = config
        self.data_dir = Path(data_dir)
        self.host = host
        self.port = port
        self.node_id: int = config["node.id"]
        self.clock = Clock()
        self.routes = routes()
        self.flusher = Flusher(self.clock)
        self.append_waiters = AppendWaiters()
        self.fetch_service = FetchService(self)
        self.shutting_down = False
        self.connections: set[Any] = set()
        self._next_connection_id = 0
        self._server: Listeners | None = None
        self.security: Any = None
        """The listeners' TLS and SASL settings (shoal/security/session.py), set at start."""
        self.peer_security: Any = None
        """Cluster mode: TLS and SASL for connections to the other brokers (shoal/security/client.py)."""
        self.authorizer: Any = None
        """With ``authorizer.class.name``: the ACLs and the checks (shoal/security/authz.py)."""
        self.memory_pool = MemoryPool(self.config["queued.max.request.bytes"], _no_loop_yet)
        self._stopped = asyncio.Event()
        self._stopping = asyncio.Event()
        self._timers: list[asyncio.TimerHandle] = []
        self.store: LogStore | None = None
        self.cluster_id = ""
        self.advertised_host = host
        self.advertised_port = port
        self.extensions: dict[str, Any] = {}
        """Subsystems (coordinators, share partitions) attached by their modules."""
        self.cluster: Any = LocalMetadata(self)
        """The metadata interface (shoal/cluster/metadata.py): LocalMetadata, or a ClusterNode."""
        self.replicas: Any = None
        """Cluster mode only: the ReplicaManager (leadership, high watermarks, acks=all)."""
        self._leaving_cluster = False
        self._unknown_topics_logged: dict[tuple[str | None, str], None] = {}
        self.storage_errors = StorageErrors()
        self.exit_code = 0
        """0, or 1 once something could not be written at shutdown or the data directory was lost."""
        self._lock = DataDirLock(self.data_dir)
        self.metrics: Any = None
        """The counters of shoal/observe/metrics.py when ``metrics.port`` is set, else None."""
        self.observe: Any = None
        """The metrics endpoint (shoal/observe/http.py) when ``metrics.port`` is set."""
        self._ready = False

    # -- start / stop -----------------------------------------------------------------
    async def start(self) -> None:
        """Lock the data directory, bind the listening sockets, recover the log, load the
        coordinators, then accept connections.

        The sockets are bound before anything slow (etcd, log recovery, coordinator
        replay), so a port in use ends the start at once; connections that arrive
        meanwhile wait in the kernel's queue until the broker accepts them.

        Raises OSError: DataDirInUse when another broker holds the data directory, a
        port that cannot be bound (the message names the address), or whatever stopped
        the log from opening.
        """
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._lock.acquire()
        self._server = Listeners(self, self._new_connection)
        await self._server.start(self.host, self.port, accept=False)
        self.host, self.port = self._server.host, self._server.port
        self.advertised_host, self.advertised_port = self._server.advertised_host, self._server.advertised_port
        if self.config["metrics.port"] >= 0:
            from ..observe.http import ObserveServer
            from ..observe.metrics import Metrics

            self.metrics = Metrics()
            metrics_host = self.config["metrics.host"] or self.host
            self.observe = ObserveServer(self, self.metrics, metrics_host, self.config["metrics.port"])
            try:
                self.observe.bind()
            except OSError as e:
                self._server.close()
                raise OSError(bind_error(metrics_host, self.config["metrics.port"], e, " (metrics.port)")) from None
        try:
            await self._start_after_bind()
        except BaseException:
            self._server.close()
            if self.observe is not None:
                self.observe.close()
            raise

    async def _start_after_bind(self) -> None:
        assert self._server is not None
        node = None
        if self.config["metadata.store"] != "local":
            from ..cluster.node import ClusterNode

            node = ClusterNode(self)
            try:
                cid = await node.connect(self._stored_cluster_id() or self.config["cluster.id"]
                                         or _random_cluster_id())
            except ValueError as e:
                raise OSError(str(e)) from None
            stored = self._stored_cluster_id()
            if stored is not None and stored != cid:
                await node.store.close()
                raise OSError(f"{self.data_dir} belongs to cluster {stored}, etcd holds cluster {cid}")
        self.cluster_id = self._load_cluster_id() if node is None else self._load_cluster_id(cid)
        self.dynamic_configs = DynamicConfigs(self.data_dir / "dynamic-configs.json", self.config)
        self.producer_ids = ProducerIdAllocator(self.data_dir / "producer-ids.json")
        self.fetch_sessions = FetchSessionCache(self.config["max.incremental.fetch.session.cache.slots"])
        soft, hard = raise_open_files_limit()
        self.store = LogStore(self.data_dir, self.config, now_ms=self.clock.now_ms())
        log.info("open file limit %d (hard %d): at most %d segment descriptors stay open",
                 soft, hard, self.store.files.capacity)
        for hook in _START_HOOKS:
            await hook(self)
        loop = asyncio.get_running_loop()
        self.memory_pool = MemoryPool(self.config["queued.max.request.bytes"], loop.call_soon)
        self._schedule_housekeeping()
        if node is not None:
            self.cluster = node
            self.replicas = node.replicas
            await node.start()
        self._server.enable()
        if self.observe is not None:
            await self.observe.start()
            log.info("metrics, health checks and the queue view on http://%s:%d/", self.observe.host,
                     self.observe.port)
        self._ready = True
        log.info(
            "shoal broker ready on %s:%d (node %d, cluster %s, data %s)",
            self.host, self.port, self.node_id, self.cluster_id, self.data_dir,
        )

    def is_ready(self) -> bool:
        """True once the broker listens with its coordinators loaded, until it starts shutting down."""
        return self._ready and not self.shutting_down

    def _stored_cluster_id(self) -> str | None:
        path = self.data_dir / "meta.properties"
        if path.exists():
            for line in path.read_text().splitlines():
                if line.startswith("cluster.id="):
                    return line.split("=", 1)[1].strip()
        return None

    def _load_cluster_id(self, from_cluster: str | None = None) -> str:
        configured = self.config["cluster.id"]
        stored = self._stored_cluster_id()
        if stored is not None:
            return stored
        path = self.data_dir / "meta.properties"
        cid = from_cluster or configured or _random_cluster_id()
        atomic_write(path, f"version=1\ncluster.id={cid}\nnode.id={self.node_id}\n".encode())
        return cid

    def _new_connection(self) -> Any:
        from .connection import Connection

        self._next_connection_id += 1
        return Connection(self, self._next_connection_id)

    def connection_opened(self, conn: Any) -> None:
        self.connections.add(conn)
        if self.metrics is not None:
            self.metrics.connections_opened += 1
        log.debug("connection %s from %s opened", conn.connection_id, conn.peer)

    def connection_closed(self, conn: Any) -> None:
        self.connections.discard(conn)
        if self.metrics is not None:
            self.metrics.connections_closed += 1
        log.debug("connection %s from %s closed", conn.connection_id, conn.peer)
        for hook in _DISCONNECT_HOOKS:
            try:
                hook(self, conn)
            except Exception:
                log.exception("disconnect hook failed")

    async def serve_forever(self) -> None:
        await self._stopped.wait()

    async def wait_stopping(self) -> None:
        """Return once a shutdown has begun (by a signal, or because the data directory is gone)."""
        await self._stopping.wait()

    async def stop(self) -> None:
        """Shut down in order; always ends, whatever fails on the way.

        A step that fails (a full disk, a deleted data directory) is logged and the
        next one runs: the log is flushed and closed partition by partition, and what
        could not be written is named in the log and sets ``exit_code`` to 1.
        """
        if self.shutting_down:
            await self._stopped.wait()
            return
        self._stopping.set()
        if self.replicas is not None and not self._leaving_cluster:
            # controlled shutdown while still serving: followers catch up, leaderships move
            self._leaving_cluster = True
            log.info("leaving the cluster")
            try:
                await self.cluster.shutdown()
            except Exception:
                log.exception("leaving the cluster failed")
        if self.shutting_down:
            await self._stopped.wait()
            return
        self.shutting_down = True
        log.info("shutting down")
        try:
            await self._stop_serving()
            for hook in reversed(_STOP_HOOKS):
                try:
                    await hook(self)
                except Exception:
                    log.exception("stop hook failed")
                    self.exit_code = 1
            try:
                self.flusher.close()
            except Exception:
                log.exception("stopping the flusher failed")
            if self.store is not None and not self.store.close():
                self.exit_code = 1
            if self.exit_code:
                log.error("shut down; some state could not be written (see above)")
            else:
                log.info("shut down cleanly")
        except BaseException:
            log.exception("shutdown failed")
            self.exit_code = 1
            raise
        finally:
            self._lock.release()
            self._stopped.set()

    async def _stop_serving(self) -> None:
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            conn.begin_shutdown()
        self.append_waiters.wake_all()
        pending = [c.closed for c in self.connections]
        if pending:
            await asyncio.wait(pending, timeout=self.config["shutdown.timeout.ms"] / 1000)
            for conn in list(self.connections):
                if conn.transport is not None:
                    conn.transport.abort()
        for t in self._timers:
            t.cancel()
        if self.observe is not None:
            await self.observe.stop()

    def halt_on_storage_error(self, reason: str) -> None:
        """Stop the process at once, without a clean shutdown (Kafka halts when a log flush fails).

        For a failed fsync of coordinator state: memory is ahead of the disk and the file
        can no longer be trusted, so nothing more is answered or written; the next start
        recovers and replays what is on disk.
        """
        log.critical("halting: %s", reason)
        logging.shutdown()
        os._exit(HALT_EXIT_CODE)

    # -- topics (hooks let coordinators react) -----------------------------------------
    def create_topic(self, name: str, num_partitions: int, configs: dict[str, str], *,
                     validate_only: bool = False, topic_id: uuid.UUID | None = None) -> Any:
        """Create a topic; raises ApiError (TOPIC_ALREADY_EXISTS, INVALID_TOPIC_EXCEPTION, INVALID_CONFIG...)."""
        assert self.store is not None
        meta = self.store.create_topic(name, num_partitions, configs, topic_id=topic_id, validate_only=validate_only,
                                       now_ms=self.clock.now_ms())
        if not validate_only:
            log.info("created topic %s (%d partition(s), id %s%s)", name, num_partitions,
                     getattr(meta, "topic_id", topic_id),
                     "".join(f", {k}={v}" for k, v in sorted(configs.items())))
        return meta

    def note_unknown_topic(self, client_id: str | None, name: str, why: str) -> None:
        """Log at INFO, once per (client, topic), that a request named a topic that does not exist.

        The memory of what was logged is bounded (oldest forgotten first), so a client
        that asks for endless random names cannot grow it.
        """
        key = (client_id, name)
        if key in self._unknown_topics_logged:
            return
        if len(self._unknown_topics_logged) >= _UNKNOWN_TOPICS_REMEMBERED:
            del self._unknown_topics_logged[next(iter(self._unknown_topics_logged))]
        self._unknown_topics_logged[key] = None
        log.info("topic %r requested by client %r does not exist and was not created (%s)", name, client_id, why)

    def delete_topic(self, name: str) -> None:
        assert self.store is not None
        meta = self.store.get_topic(name)
        for hook in _TOPIC_DELETED_HOOKS:
            try:
                hook(self, meta)
            except Exception:
                log.exception("topic deletion hook failed")
        self.store.delete_topic(name)
        self.fetch_sessions.remove_topic(name)
        log.info("deleted topic %s", name)

    def leadership_changed(self, topic: str, index: int, leader: bool) -> None:
        """Called by the replica manager when this broker starts or stops leading a partition."""
        for hook in _LEADERSHIP_HOOKS:
            try:
                hook(self, topic, index, leader)
            except Exception:
                log.exception("leadership hook failed for %s-%d", topic, index)

    def create_partitions(self, name: str, total: int) -> None:
        assert self.store is not None
        self.store.create_partitions(name, total, now_ms=self.clock.now_ms())
        log.info("topic %s now has %d partitions", name, total)
        for hook in _PARTITIONS_ADDED_HOOKS:
            hook(self, name, total)

    # -- periodic work ----------------------------------------------------------------
    def _schedule_housekeeping(self) -> None:
        loop = asyncio.get_running_loop()
        interval_s = self.config["log.retention.check.interval.ms"] / 1000

        def run() -> None:
            if self.shutting_down:
                return
            try:
                assert self.store is not None
                for key, error in self.store.run_maintenance(self.clock.now_ms()).items():
                    what = ("maintenance",) + key
                    if error is None:
                        self.storage_errors.ok(what)
                    else:
                        self.storage_errors.failed(what, error, label=f"log maintenance of {key[0]}-{key[1]}")
            except Exception:
                log.exception("log housekeeping failed")
            self._timers.append(loop.call_later(interval_s, run))

        self._timers.append(loop.call_later(interval_s, run))

        def check_data_dir() -> None:
            if self.shutting_down:
                return
            problem = self._lock.check()
            if problem is not None:
                log.critical("data directory %s is gone (%s): nothing written now would survive; stopping",
                             self.data_dir, problem)
                self.exit_code = 1
                asyncio.ensure_future(self.stop())
                return
            self._timers.append(loop.call_later(DATA_DIR_CHECK_S, check_data_dir))

        self._timers.append(loop.call_later(DATA_DIR_CHECK_S, check_data_dir))
        flush_ms = self.config["log.flush.interval.ms"]
        if flush_ms > 0:
            def flush() -> None:
                # Through the flusher's tickets: its fsyncs run off the loop on duplicated
                # descriptors, so a segment rolled or closed meanwhile is never touched.
                if self.shutting_down:
                    return
                assert self.store is not None
                for _, plog in self.store.partitions():
                    if plog.unflushed_messages:
                        asyncio.ensure_future(self.flusher.durable(plog, plog.log_end_offset)).add_done_callback(
                            _log_flush_failure)
                self._timers.append(loop.call_later(flush_ms / 1000, flush))

            self._timers.append(loop.call_later(flush_ms / 1000, flush))


def _no_loop_yet(callback: Any) -> None:  # pragma: no cover - replaced in start()
    raise RuntimeError("the broker has not started")


def _log_flush_failure(fut: asyncio.Future[None]) -> None:
    if not fut.cancelled() and fut.exception() is not None:
        log.error("periodic flush failed: %s", fut.exception())


def _random_cluster_id() -> str:
    import base64

    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


_START_HOOKS: list[Any] = []
_STOP_HOOKS: list[Any] = []
_DISCONNECT_HOOKS: list[Any] = []


_TOPIC_DELETED_HOOKS: list[Any] = []
_PARTITIONS_ADDED_HOOKS: list[Any] = []
_LEADERSHIP_HOOKS: list[Any] = []


def on_leadership_change(fn: Any) -> Any:
    """Register ``fn(broker, topic, index, leader)``: cluster mode, this broker started
    (``leader`` True) or stopped (False) leading a partition. Called on the event loop."""
    _LEADERSHIP_HOOKS.append(fn)
    return fn


def on_topic_deleted(fn: Any) -> Any:
    """Register ``fn(broker, topic_meta)``, called before a topic's data is removed."""
    _TOPIC_DELETED_HOOKS.append(fn)
    return fn


def on_partitions_added(fn: Any) -> Any:
    """Register ``fn(broker, topic_name, new_total)``."""
    _PARTITIONS_ADDED_HOOKS.append(fn)
    return fn


def on_start(fn: Any) -> Any:
    """Register ``async fn(broker)`` to run at start, after the log store opened."""
    _START_HOOKS.append(fn)
    return fn


def on_stop(fn: Any) -> Any:
    """Register ``async fn(broker)`` to run at stop, before the log store closes (reverse order)."""
    _STOP_HOOKS.append(fn)
    return fn


def on_disconnect(fn: Any) -> Any:
    """Register ``fn(broker, connection)`` to run when a client connection closes."""
    _DISCONNECT_HOOKS.append(fn)
    return fn
