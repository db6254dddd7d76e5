"""The fetch service: a Fetch as one operation (Kafka's ReplicaManager.fetchMessages).

The Fetch handler only translates: it turns the request into a plain :class:`FetchParams`
(session id and epoch, isolation level, replica id and epoch, MaxWaitMs, MinBytes,
MaxBytes, the partitions with their fetch offsets, byte limits and current leader epochs,
the forgotten partitions), makes one call, :meth:`FetchService.fetch`, and turns the
:class:`FetchResult` into the answer. Consumers' and followers' fetches (cluster
replication) take the same path.

``fetch`` resolves the incremental fetch session (``fetch_session.py``), reads every
partition of the session (or of the request) once, and when fewer than MinBytes are ready
(and no partition has an error) the request becomes a :class:`DelayedFetch` (Kafka's
DelayedFetch): it is watched under each of its partitions in ``broker.append_waiters``,
which completes it when an append, a moved high watermark or last stable offset, or a lost
leadership notifies one of them, at its deadline (MaxWaitMs, one timer) or at shutdown
(``wake_all``). Completing only wakes the operation: its next read runs in the request's
own task, never in the caller that notified (an append does no fetch's work); a fetch
still short of MinBytes before its deadline parks again. Then the session decides which
partitions an incremental answer lists.

A partition's data is the log's bytes from the batch holding the fetch offset, up to the
partition's byte limit and what is left of the request's MaxBytes; the first partition
with data always gets at least one whole batch, so an oversized batch cannot stall a
consumer (Kafka's rule since Fetch v3). On one broker, consumers read below the high
watermark (read_committed: below the last stable offset, with the aborted transactions
of the range). In cluster mode only the partition's leader answers, a consumer's fetch
as on one broker; a follower's (replica id >= 0) reports the follower's log end offset,
which moves the high watermark and the ISR, and reads up to the log end
(``cluster/replication.py``). Event loop only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ..errors import ApiError, ErrorCode
from ..log.partition_log import PartitionLog
from ..log.segment import FileSlice
from ..protocol.batch import read_header
from ..protocol.codec import LARGE_VALUE
from .fetch_session import FetchSession, FetchSessionError, PartitionKey, SessionPartition

if TYPE_CHECKING:
    from ..cluster.replica_manager import ReplicaManager
    from ..log.store import LogStore
    from .broker import Broker

__all__ = ["DelayedFetch", "FetchParams", "FetchResult", "FetchService", "PartitionRead"]


class FetchParams:
    """A Fetch request as plain inputs (the handler's translation of any version).

    ``partitions``: (topic name, partition) -> fetch offset and byte limit, in the
    request's order; ``epochs``: the current leader epochs the request names (>= 0 only);
    ``use_session``: the version has fetch sessions (v7+); ``file_slices``: the
    connection can send records as file slices; ``readable``: with an authorizer, whether
    a consumer may READ a topic (None: every topic)."""

    __slots__ = ("committed", "epochs", "file_slices", "forgotten", "max_bytes", "max_wait_ms", "min_bytes",
                 "partitions", "readable", "replica_epoch", "replica_id", "session_epoch", "session_id",
                 "use_session")

    def __init__(self, *, partitions: dict[PartitionKey, SessionPartition], epochs: dict[PartitionKey, int],
                 forgotten: list[PartitionKey], max_wait_ms: int, min_bytes: int, max_bytes: int,
                 committed: bool = False, replica_id: int = -1, replica_epoch: int = -1,
                 use_session: bool = False, session_id: int = 0, session_epoch: int = -1,
                 file_slices: bool = False, readable: Callable[[str], bool] | None = None) -> None:
        self.partitions = partitions
        self.epochs = epochs
        self.forgotten = forgotten
        self.max_wait_ms = max_wait_ms
        self.min_bytes = min_bytes
        self.max_bytes = max_bytes
        self.committed = committed
        self.replica_id = replica_id
        self.replica_epoch = replica_epoch
        self.use_session = use_session
        self.session_id = session_id
        self.session_epoch = session_epoch
        self.file_slices = file_slices
        self.readable = readable


class PartitionRead:
    """One partition's answer. ``records``: bytes, or a FileSlice read when the answer is
    sent; ``aborted``: (producer id, first offset) of the aborted transactions of the
    range for read_committed, else None."""

    __slots__ = ("aborted", "error_code", "high_watermark", "last_stable_offset", "log_start_offset", "records")

    def __init__(self, error_code: int, high_watermark: int = -1, last_stable_offset: int = -1,
                 log_start_offset: int = -1, records: bytes | FileSlice = b"",
                 aborted: list[tuple[int, int]] | None = None) -> None:
        self.error_code = error_code
        self.high_watermark = high_watermark
        self.last_stable_offset = last_stable_offset
        self.log_start_offset = log_start_offset
        self.records = records
        self.aborted = aborted


class FetchResult:
    """What the handler answers: a request-wide error (a fetch session's) or the partitions
    to list, in order, each under its (topic name, partition)."""

    __slots__ = ("error_code", "partitions", "session_id")

    def __init__(self, error_code: int, session_id: int, partitions: list[tuple[PartitionKey, PartitionRead]]) -> None:
        self.error_code = error_code
        self.session_id = session_id
        self.partitions = partitions


def _refused() -> PartitionRead:
    return PartitionRead(ErrorCode.topic_authorization_failed)


class DelayedFetch:
    """One Fetch's partitions and the state of its reads: completable when MinBytes are
    ready, a partition has an error, its deadline passed or the broker shuts down."""

    __slots__ = ("broker", "committed", "deadline_ms", "epochs", "keys", "max_bytes", "min_bytes", "min_slice",
                 "partitions", "refused", "remaining_ms", "replica_epoch", "replica_id", "replicas", "results", "store")

    def __init__(self, broker: Broker, store: LogStore, params: FetchParams,
                 partitions: dict[PartitionKey, SessionPartition], refused: frozenset[PartitionKey],
                 now_ms: int) -> None:
        self.broker = broker
        self.store = store
        self.partitions = partitions
        self.keys = list(partitions)
        self.refused = refused
        self.deadline_ms = now_ms + params.max_wait_ms
        self.remaining_ms = params.max_wait_ms
        self.min_bytes = max(params.min_bytes, 1)
        self.max_bytes = min(params.max_bytes, broker.config["fetch.max.bytes"])
        self.min_slice = LARGE_VALUE if params.file_slices else None
        self.committed = params.committed
        self.epochs = params.epochs
        self.replica_id = params.replica_id
        self.replica_epoch = params.replica_epoch
        self.replicas: ReplicaManager | None = broker.replicas  # cluster mode's, else None
        self.results: dict[PartitionKey, PartitionRead] = {}

    def try_complete(self) -> bool:
        """Read every partition again; whether the fetch is done (its results are then
        final). If not, ``remaining_ms`` is the time left before its deadline."""
        store = self.store
        replicas = self.replicas
        now_ms = self.broker.clock.now_ms() if replicas is not None else 0
        results: dict[PartitionKey, PartitionRead] = {}
        budget = self.max_bytes
        total = 0
        any_error = False
        refused = self.refused
        for key, sp in self.partitions.items():
            if key in refused:
                r = _refused()
            elif replicas is not None:
                r = _read_replicated(store, key, sp, budget, replicas, self.replica_id, self.epochs, now_ms,
                                     self.replica_epoch, self.min_slice, self.committed)
            else:
                r = _read(store, key, sp, budget, self.min_slice, self.committed)
            n = len(r.records)
            total += n
            budget -= n
            if r.error_code:
                any_error = True
            results[key] = r
        self.results = results
        if total >= self.min_bytes or any_error:
            return True
        self.remaining_ms = self.deadline_ms - self.broker.clock.now_ms()
        return self.remaining_ms <= 0 or self.broker.shutting_down


class FetchService:
    """Owned by the broker (``broker.fetch_service``); state lives in the broker's fetch
    session cache and the logs."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker

    def store(self) -> LogStore:
        store = self.broker.store
        assert store is not None, "the broker is not started"
        return store

    async def fetch(self, params: FetchParams) -> FetchResult:
        """A whole Fetch: the session, the reads, the long poll, what the answer lists."""
        broker = self.broker
        session: FetchSession | None = None
        incremental = False
        if params.use_session:
            try:
                session, incremental = broker.fetch_sessions.resolve(
                    params.session_id, params.session_epoch, params.partitions, params.forgotten,
                    broker.clock.now_ms())
            except FetchSessionError as e:
                return FetchResult(e.error_code, 0, [])
        partitions = session.partitions if session is not None else params.partitions
        op = DelayedFetch(broker, self.store(), params, partitions, self._unreadable(params, partitions),
                          broker.clock.now_ms())
        while not op.try_complete():
            await broker.append_waiters.wait(op.keys, op.remaining_ms / 1000)
        results = op.results
        metrics = broker.metrics
        if metrics is not None:
            for key, r in results.items():
                if r.records:
                    metrics.fetched(key[0], len(r.records))
        if session is None:
            return FetchResult(ErrorCode.none, 0, list(results.items()))
        answered: list[tuple[PartitionKey, PartitionRead]] = []
        for key, r in results.items():
            if incremental:
                if not session.must_send(key, r.high_watermark, r.log_start_offset, bool(r.records),
                                         r.error_code != 0):
                    continue
            else:
                session.must_send(key, r.high_watermark, r.log_start_offset, True, False)
            answered.append((key, r))
        return FetchResult(ErrorCode.none, session.session_id, answered)

    @staticmethod
    def _unreadable(params: FetchParams, partitions: dict[PartitionKey, SessionPartition]) -> frozenset[PartitionKey]:
        """The partitions of a consumer's fetch whose topic it may not READ (answered
        TOPIC_AUTHORIZATION_FAILED). A follower's fetch needed CLUSTER_ACTION."""
        readable = params.readable
        if readable is None or params.replica_id >= 0:
            return frozenset()
        bad = {name for name in {k[0] for k in partitions} if not readable(name)}
        return frozenset(k for k in partitions if k[0] in bad) if bad else frozenset()


def _read(store: LogStore, key: PartitionKey, sp: SessionPartition, budget: int, min_slice: int | None,
          committed: bool) -> PartitionRead:
    """One broker: one partition's answer; its records may be a FileSlice when ``min_slice``
    is given. ``committed`` (read_committed): only batches below the last stable offset,
    with the aborted transactions of the range."""
    name, index = key
    meta = store.get_topic(name)
    if meta is None or not 0 <= index < meta.num_partitions:
        return PartitionRead(ErrorCode.unknown_topic_or_partition)
    plog = store.partition(name, index)
    hw = plog.high_watermark
    lso = plog.last_stable_offset
    out = PartitionRead(ErrorCode.none, hw, lso, plog.log_start_offset)
    if committed:
        out.aborted = _aborted(plog, sp.fetch_offset, lso)
        if lso < hw and lso <= sp.fetch_offset <= hw:
            return out  # nothing stable to read yet
    if sp.fetch_offset == hw or budget <= 0:
        return out
    try:
        data = plog.read(sp.fetch_offset, min(sp.max_bytes, budget), min_slice)
        if committed and lso < hw:
            data = _slice_below(data, lso) if isinstance(data, FileSlice) else _below(data, lso)
        out.records = data
    except ApiError as e:
        out.error_code = e.error_code
    return out


def _aborted(plog: PartitionLog, start: int, end: int) -> list[tuple[int, int]]:
    """(producer id, first offset) of the aborted transactions in [start, end)."""
    return [(a.producer_id, a.first_offset) for a in plog.aborted_transactions(start, end)]


def _read_replicated(store: LogStore, key: PartitionKey, sp: SessionPartition, budget: int, replicas: ReplicaManager,
                     replica_id: int, epochs: dict[PartitionKey, int], now_ms: int, replica_epoch: int,
                     min_slice: int | None, committed: bool) -> PartitionRead:
    """Cluster mode: the leader's answer to a consumer (below the HW; with ``committed``,
    read_committed, below the last stable offset and with the aborted transactions of the
    range, as on one broker) or a follower (to the LEO)."""
    meta = store.get_topic(key[0])
    if meta is None or not 0 <= key[1] < meta.num_partitions:
        return PartitionRead(ErrorCode.unknown_topic_or_partition)
    try:
        replica = replicas.leader_replica(*key)
    except ApiError as e:
        return PartitionRead(e.error_code)
    want = epochs.get(key, -1)
    if want >= 0 and want != replica.leader_epoch:
        return PartitionRead(ErrorCode.fenced_leader_epoch if want < replica.leader_epoch
                             else ErrorCode.unknown_leader_epoch)
    plog = replica.plog
    if replica_id >= 0:
        code = replicas.on_follower_fetch(replica, replica_id, sp.fetch_offset, now_ms,
                                          replica_epoch=replica_epoch, names_leader_epoch=want >= 0)
        if code == ErrorCode.offset_out_of_range:  # the log start tells a follower where to restart
            hw = plog.high_watermark
            return PartitionRead(code, hw, hw, plog.log_start_offset)
        if code != ErrorCode.none:
            return PartitionRead(code)
        end = plog.log_end_offset
    else:
        end = plog.high_watermark
    out = PartitionRead(ErrorCode.none, plog.high_watermark, plog.last_stable_offset, plog.log_start_offset)
    if committed and replica_id < 0:
        lso = plog.last_stable_offset
        out.aborted = _aborted(plog, sp.fetch_offset, lso)
        end = min(end, lso)
    if sp.fetch_offset == end or budget <= 0 or (sp.fetch_offset > end and replica_id < 0
                                                 and sp.fetch_offset <= plog.log_end_offset):
        return out
    whole = end == plog.log_end_offset  # else only the batches below the HW
    try:
        data = plog.read(sp.fetch_offset, min(sp.max_bytes, budget), min_slice)
        if not whole:
            data = _slice_below(data, end) if isinstance(data, FileSlice) else _below(data, end)
    except ApiError as e:
        out.error_code = e.error_code
        return out
    out.records = data
    return out


def _slice_below(data: FileSlice, end: int) -> FileSlice | bytes:
    """The whole batches of slice ``data`` that end below offset ``end`` (the high
    watermark), still a slice: the answer is not read into memory before it is sent."""
    seg = data.segment
    if end >= seg.next_offset:
        return data
    try:
        pos = seg.find_position(end)  # the batch holding ``end``: it and the rest are above
    except OSError as e:
        raise ApiError(ErrorCode.kafka_storage_error, f"reading {seg.log_path.name} failed: {e}") from e
    if pos is None or pos >= data.position + data.length:
        return data
    return data.part(0, pos - data.position) if pos > data.position else b""


def _below(data: bytes, end: int) -> bytes:
    """The whole batches of ``data`` that end below offset ``end`` (the high watermark)."""
    pos = 0
    n = len(data)
    while pos + 61 <= n:
        h = read_header(data, pos, whole=False)
        if h.next_offset > end:
            break
        pos = h.end
    return data[:pos]
