"""Fetch (key 1), v4-v17: whole record batches read as bytes, long poll, fetch sessions.

A partition's data is the log's bytes from the batch holding ``fetch_offset``, up to
``partition_max_bytes`` and what is left of the request's ``max_bytes`` (itself capped
by the broker's ``fetch.max.bytes``); the first
partition with data always gets at least one whole batch, so an oversized batch
cannot stall a consumer (Kafka's rule since Fetch v3). When fewer than ``min_bytes``
are ready, the request parks until an append touches one of its partitions or
``max_wait`` passes. From v7 the request may use an incremental fetch session
(``fetch_session.py``); from v13 topics are named by id.

In cluster mode only the partition's leader answers (NOT_LEADER_OR_FOLLOWER elsewhere;
FENCED_LEADER_EPOCH / UNKNOWN_LEADER_EPOCH when the request's current leader epoch is
older / newer than the leader's). Consumers read only below the high watermark (with
read_committed below the last stable offset, with the aborted transactions, as on one
broker). A Fetch
with a replica id is a follower's: it reports the follower's log end offset (which moves
the high watermark and the ISR) and reads up to the log end; one from a broker that is not
a follower of the partition, at an offset outside [log start, log end] or with a broker
epoch that is not the follower's registration is refused and moves nothing
(``cluster/replication.py``).
"""

from __future__ import annotations

from typing import Any

from ...errors import ApiError, ErrorCode
from ...log.segment import FileSlice
from ...protocol.batch import read_header
from ...protocol.codec import LARGE_VALUE, EncodedPieces
from ...protocol.entities import ZERO_UUID, has_field, make, sub
from ...protocol.fetch_response import write_fetch_response
from ...security.access import replica_id
from ...security.authz import READ, topic_allowed
from ..dispatch import api
from ..fetch_session import FetchSessionError, SessionPartition
from .leader_hints import leader_hints


def _requested(ctx: Any, request: Any, epochs: dict[tuple[str, int], int]) -> tuple[dict[tuple[str, int], SessionPartition], dict[tuple[str, int], Any],
                                                 list[tuple[str, int]]]:
    """The request's partitions keyed by (topic name, partition), errors for unknown ids, forgotten keys."""
    store = ctx.broker.store
    use_ids = ctx.api_version >= 13
    wanted: dict[tuple[str, int], SessionPartition] = {}
    unknown: dict[tuple[str, int], Any] = {}
    for t in request.topics:
        if use_ids:
            topic_id = t.topic_id or ZERO_UUID  # kio reads the zero uuid as None
            meta = store.topic_by_id(topic_id)
            name = meta.name if meta is not None else f"<unknown {topic_id}>"
            if meta is None:
                for p in t.partitions:
                    unknown[(name, p.partition)] = topic_id
                continue
        else:
            name = t.topic
        for p in t.partitions:
            wanted[(name, p.partition)] = SessionPartition(p.fetch_offset, p.partition_max_bytes)
            epoch = getattr(p, "current_leader_epoch", -1)
            if epoch >= 0:
                epochs[(name, p.partition)] = epoch
    forgotten: list[tuple[str, int]] = []
    for f in getattr(request, "forgotten_topics_data", None) or ():
        if use_ids:
            meta = store.topic_by_id(f.topic_id)
            if meta is None:
                continue
            name = meta.name
        else:
            name = f.topic
        forgotten.extend((name, p) for p in f.partitions)
    return wanted, unknown, forgotten


_REFUSED: dict[str, Any] = {"error_code": ErrorCode.topic_authorization_failed, "high_watermark": -1, "log_start_offset": -1,
            "records": b""}


def _unreadable(ctx: Any, request: Any, partitions: Any) -> frozenset[tuple[str, int]]:
    """With an authorizer: the partitions of a consumer's fetch whose topic it may not READ
    (answered TOPIC_AUTHORIZATION_FAILED). A follower's fetch needed CLUSTER_ACTION."""
    if ctx.broker.authorizer is None or replica_id(request) >= 0:
        return frozenset()
    bad = {name for name in {k[0] for k in partitions} if not topic_allowed(ctx, READ, name)}
    return frozenset(k for k in partitions if k[0] in bad) if bad else frozenset()


# Cluster mode's read context: (replicas, replica_id, epochs, now_ms, replica_epoch).
_Cluster = tuple[Any, int, dict[tuple[str, int], int], int, int]


def _read(store: Any, key: tuple[str, int], sp: SessionPartition, budget: int,
          cluster: _Cluster | None = None, min_slice: int | None = None, committed: bool = False) -> dict[str, Any]:
    """One partition's answer; its records may be a FileSlice (read when the answer is
    sent) when ``min_slice`` is given, the connection being able to send one.
    ``committed`` (isolation level read_committed): only batches below the last stable
    offset, with the aborted transactions of the range."""
    name, index = key
    meta = store.get_topic(name)
    if meta is None or not 0 <= index < meta.num_partitions:
        return {"error_code": ErrorCode.unknown_topic_or_partition, "high_watermark": -1,
                "log_start_offset": -1, "records": b""}
    if cluster is not None:
        return _read_replicated(store, key, sp, budget, *cluster, min_slice=min_slice, committed=committed)
    plog = store.partition(name, index)
    hw = plog.high_watermark
    lso = plog.last_stable_offset
    out: dict[str, Any] = {"high_watermark": hw, "last_stable_offset": lso, "log_start_offset": plog.log_start_offset}
    if committed:
        out["aborted_transactions"] = _aborted(plog, sp.fetch_offset, lso)
        if lso < hw and lso <= sp.fetch_offset <= hw:
            out["records"] = b""  # nothing stable to read yet
            return out
    if sp.fetch_offset == hw or budget <= 0:
        out["records"] = b""
        return out
    try:
        data = plog.read(sp.fetch_offset, min(sp.max_bytes, budget), min_slice)
        if committed and lso < hw:
            data = _slice_below(data, lso) if type(data) is FileSlice else _below(data, lso)
        out["records"] = data
    except ApiError as e:
        out["error_code"] = e.error_code
        out["records"] = b""
    return out


def _aborted(plog: Any, start: int, end: int) -> list[tuple[int, int]]:
    """(producer id, first offset) of the aborted transactions in [start, end)."""
    return [(a.producer_id, a.first_offset) for a in plog.aborted_transactions(start, end)]


def _read_replicated(store: Any, key: tuple[str, int], sp: SessionPartition, budget: int, replicas: Any,
                     replica_id: int, epochs: dict[tuple[str, int], int], now_ms: int,
                     replica_epoch: int = -1, min_slice: int | None = None, committed: bool = False) -> dict[str, Any]:
    """Cluster mode: the leader's answer to a consumer (below the HW; with ``committed``,
    read_committed, below the last stable offset and with the aborted transactions of the
    range, as on one broker) or a follower (to the LEO)."""
    empty = {"high_watermark": -1, "log_start_offset": -1, "records": b""}
    try:
        replica = replicas.leader_replica(*key)
    except ApiError as e:
        return dict(empty, error_code=e.error_code)
    want = epochs.get(key, -1)
    if want >= 0 and want != replica.leader_epoch:
        code = ErrorCode.fenced_leader_epoch if want < replica.leader_epoch else ErrorCode.unknown_leader_epoch
        return dict(empty, error_code=code)
    plog = replica.plog
    if replica_id >= 0:
        code = replicas.on_follower_fetch(replica, replica_id, sp.fetch_offset, now_ms,
                                          replica_epoch=replica_epoch, names_leader_epoch=want >= 0)
        if code == ErrorCode.offset_out_of_range:  # the log start tells a follower where to restart
            return {"error_code": code, "high_watermark": plog.high_watermark,
                    "log_start_offset": plog.log_start_offset, "records": b""}
        if code != ErrorCode.none:
            return dict(empty, error_code=code)
        end = plog.log_end_offset
    else:
        end = plog.high_watermark
    hw = plog.high_watermark
    out: dict[str, Any] = {"high_watermark": hw, "last_stable_offset": plog.last_stable_offset,
                           "log_start_offset": plog.log_start_offset}
    if committed and replica_id < 0:
        lso = plog.last_stable_offset
        out["aborted_transactions"] = _aborted(plog, sp.fetch_offset, lso)
        end = min(end, lso)
    if sp.fetch_offset == end or budget <= 0 or (sp.fetch_offset > end and replica_id < 0
                                                 and sp.fetch_offset <= plog.log_end_offset):
        out["records"] = b""
        return out
    whole = end == plog.log_end_offset  # else only the batches below the HW
    try:
        data = plog.read(sp.fetch_offset, min(sp.max_bytes, budget), min_slice)
        if not whole:
            data = _slice_below(data, end) if type(data) is FileSlice else _below(data, end)
    except ApiError as e:
        out["error_code"] = e.error_code
        out["records"] = b""
        return out
    out["records"] = data
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


@api(1, 4, 17)
async def handle_fetch(ctx: Any, request: Any) -> Any:
    broker = ctx.broker
    store = broker.store
    cls = ctx.response_type
    use_ids = ctx.api_version >= 13
    epochs: dict[tuple[str, int], int] = {}
    wanted, unknown, forgotten = _requested(ctx, request, epochs)

    session = None
    incremental = False
    if ctx.api_version >= 7:
        try:
            session, incremental = broker.fetch_sessions.resolve(
                request.session_id, request.session_epoch, wanted, forgotten, ctx.now_ms()
            )
        except FetchSessionError as e:
            return make(cls, throttle_time=0, error_code=e.error_code, session_id=0, responses=())
    partitions = session.partitions if session is not None else wanted
    refused = _unreadable(ctx, request, partitions)

    max_wait_ms = int(request.max_wait.total_seconds() * 1000)
    min_bytes = max(request.min_bytes, 1)
    max_bytes = min(request.max_bytes if has_field(type(request), "max_bytes") else 2**31 - 1,
                    broker.config["fetch.max.bytes"])
    deadline = broker.clock.now_ms() + max_wait_ms
    min_slice = LARGE_VALUE if getattr(ctx.connection, "sends_file_slices", False) else None
    committed = getattr(request, "isolation_level", 0) == 1
    cluster: _Cluster | None = None
    if broker.replicas is not None:
        replica_id = getattr(request, "replica_id", -1)
        replica_epoch = -1
        state = getattr(request, "replica_state", None)
        if state is not None:
            replica_id, replica_epoch = state.replica_id, state.replica_epoch
        cluster = (broker.replicas, replica_id, epochs, 0, replica_epoch)
    while True:
        if cluster is not None:
            cluster = cluster[:3] + (broker.clock.now_ms(),) + cluster[4:]
        results: dict[tuple[str, int], dict[str, Any]] = {}
        budget = max_bytes
        total = 0
        any_error = bool(unknown)
        for key, sp in partitions.items():
            r = (_read(store, key, sp, budget, cluster, min_slice, committed) if key not in refused
                 else dict(_REFUSED))
            n = len(r["records"])
            total += n
            budget -= n
            if "error_code" in r:
                any_error = True
            results[key] = r
        remaining = deadline - broker.clock.now_ms()
        if total >= min_bytes or any_error or remaining <= 0 or broker.shutting_down:
            break
        await broker.append_waiters.wait(list(partitions), remaining / 1000)
    if broker.metrics is not None:
        for key, r in results.items():
            if r["records"]:
                broker.metrics.fetched(key[0], len(r["records"]))

    tcls = sub(cls, "FetchableTopicResponse")
    pcls = sub(cls, "PartitionData")
    node_endpoints: tuple[Any, ...] = ()
    hinted = False
    if cluster is not None and any(r.get("error_code") == ErrorCode.not_leader_or_follower
                                   for r in results.values()):
        # current_leader from v12, node_endpoints from v16
        node_endpoints = leader_hints(broker.cluster, cls, pcls, [(k[0], k[1], r) for k, r in results.items()])
        hinted = any("current_leader" in r for r in results.values())
    answered: dict[str, list[tuple[int, dict[str, Any]]]] = {}
    for key, r in results.items():
        if incremental and session is not None and not session.must_send(
            key, r["high_watermark"], r["log_start_offset"], bool(r["records"]), "error_code" in r
        ):
            continue
        if session is not None and not incremental:
            session.must_send(key, r["high_watermark"], r["log_start_offset"], True, False)
        r.setdefault("error_code", ErrorCode.none)
        r.setdefault("last_stable_offset", r["high_watermark"])
        answered.setdefault(key[0], []).append((key[1], r))
    for name, index in unknown:
        answered.setdefault(name, []).append((index, {
            "error_code": ErrorCode.unknown_topic_id, "high_watermark": -1, "last_stable_offset": -1,
            "log_start_offset": -1, "records": b""}))
    session_id = session.session_id if session is not None else 0

    def topic_key(name: str, plist: list[tuple[int, dict[str, Any]]]) -> Any:
        if not use_ids:
            return name
        meta = store.get_topic(name)
        return meta.topic_id if meta is not None else unknown.get((name, plist[0][0]), ZERO_UUID)

    if ctx.api_version >= 12 and not hinted:
        # the common answer, packed directly (no leader hints to add)
        return EncodedPieces(write_fetch_response(ctx.api_version, ErrorCode.none, session_id, [
            (topic_key(name, plist).bytes if use_ids else name,
             [(index, r["error_code"], r["high_watermark"], r["last_stable_offset"], r["log_start_offset"],
               r["records"], r.get("aborted_transactions")) for index, r in plist])
            for name, plist in answered.items()]))
    topics = []
    acls = sub(cls, "AbortedTransaction")

    def aborted(r: dict[str, Any]) -> Any:
        a = r.pop("aborted_transactions", None)
        return None if a is None else tuple(make(acls, producer_id=pid, first_offset=first) for pid, first in a)

    for name, plist in answered.items():
        parts = tuple(make(pcls, partition_index=index, preferred_read_replica=-1, aborted_transactions=aborted(r),
                           **r) for index, r in plist)
        if use_ids:
            topics.append(make(tcls, topic_id=topic_key(name, plist), partitions=parts))
        else:
            topics.append(make(tcls, topic=name, partitions=parts))
    extra = {"node_endpoints": node_endpoints} if node_endpoints else {}
    return make(cls, throttle_time=0, error_code=ErrorCode.none, session_id=session_id, responses=tuple(topics),
                **extra)
