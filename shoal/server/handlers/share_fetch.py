"""ShareFetch (78) and ShareAcknowledge (79), v1-v2 (KIP-932).

A ShareFetch is first checked as Kafka checks it (INVALID_REQUEST for the whole
request, nothing applied): acknowledgements in a request that opens a session (epoch
0), partitions to fetch (without acknowledgements) in one that closes it (epoch -1), an
unknown ShareAcquireMode, a negative MinBytes or MaxWaitMs. It then goes through the
member's share session (``ShareSessionCache``: epoch 0 opens, -1 closes, any other must
match). As in Kafka 4.4, the group id must not be null and the member id must be 1 to
36 characters (INVALID_REQUEST otherwise), but the group membership is not checked:
Kafka's share-partition leader (usually not the group's coordinator) knows only share
sessions, so a member id the group does not have (yet, or any more) opens a session and
is served, and a member removed from the group goes on with its session. The assignment
decides what a client puts in its session; what a stray session acquires is released
when it closes, when its connection closes, or when the locks expire. A fetch serves the
partitions its session names.

Acknowledgements (ShareAcknowledge, or riding on a ShareFetch) are applied first, per
partition, all or nothing; the partition's acknowledge error code is sent only after
the write carrying them committed (or failed). Then, for a ShareFetch that did not
close its session: for each session partition in rotated order, whole batches are read
from the log at ``next_fetch_offset()``, their (base, last) offsets go to
``SharePartition.acquire``, and the batches overlapping the acquired ranges are
returned (never a split batch; ``acquired_records`` says which offsets the member
owns). Until the acquired records add up to MinBytes the request parks on
``broker.append_waiters`` (an append, a release or a lock expiry touching one of its
partitions wakes it, and what it acquires is added to the answer), at most MaxWaitMs; a
parked request whose session was closed or replaced meanwhile acquires nothing.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import Any

from ...errors import ApiError, ErrorCode
from ...protocol.batch import iter_batches
from ...protocol.entities import ZERO_UUID, make, sub
from ...security.authz import authorized_share_request
from ...security.serving import client_endpoint, own_endpoint
from ...share.partition import SharePartition, UpdateStatus
from ...share.session import FINAL_EPOCH, INITIAL_EPOCH
from ...share.state import AcknowledgeType, AcquireMode
from ..dispatch import api
from ..share_service import ShareService, share_service

PARTITION_MAX_READ_BYTES = 1 << 20
DEFAULT_MAX_RECORDS = 500


MAX_MEMBER_ID_LENGTH = 36
"""Kafka's limit on the member id of ShareFetch and ShareAcknowledge (a UUID string)."""


def _invalid_ids(group_id: str | None, member_id: str | None) -> str | None:
    """Kafka's first checks of ShareFetch and ShareAcknowledge (INVALID_REQUEST), or None:
    a null group id (an empty one is a group id), a null, empty or too long member id."""
    if group_id is None:
        return "Invalid group id in the request."
    if not member_id or len(member_id) > MAX_MEMBER_ID_LENGTH:
        return "Invalid member id in the request."
    return None


def _ack_keys(topics: Any) -> list[tuple[uuid.UUID, int]]:
    return [(_uuid(t.topic_id), int(p.partition_index)) for t in topics for p in t.partitions
            if p.acknowledgement_batches]


def _uuid(topic_id: Any) -> uuid.UUID:
    if not topic_id:  # kio reads the zero uuid as None (a share session keeps it as "")
        return ZERO_UUID
    return topic_id if isinstance(topic_id, uuid.UUID) else uuid.UUID(str(topic_id))


def apply_acknowledgements(ctx: Any, svc: ShareService, group_id: str, member_id: str,
                           topics: Any) -> list[tuple[tuple[uuid.UUID, int], SharePartition | None, Any]]:
    """Apply every partition's acknowledgement batches in memory and start their writes.

    Returns one (key, share-partition, PendingUpdate or ErrorCode) per partition; pass
    it to :func:`acknowledgement_codes` before answering.
    """
    now = ctx.now_ms()
    pending: list[tuple[tuple[uuid.UUID, int], SharePartition | None, Any]] = []
    for t in topics:
        for p in t.partitions:
            if not p.acknowledgement_batches:
                continue
            key = (_uuid(t.topic_id), int(p.partition_index))
            try:
                if ctx.api_version < 2 and any(int(x) == AcknowledgeType.RENEW
                                               for b in p.acknowledgement_batches for x in b.acknowledge_types):
                    raise ApiError(ErrorCode.invalid_request, "renew needs version 2")
                if not svc.renew_acknowledge_enabled(group_id) and any(
                        int(x) == AcknowledgeType.RENEW for b in p.acknowledgement_batches for x in b.acknowledge_types):
                    # As Kafka: the partition's acknowledgements fail, none of them applied.
                    raise ApiError(ErrorCode.invalid_record_state,
                                   "Renewing acquisition locks is not enabled for the group.")
                sp = svc.get_partition(group_id, key[0], key[1])
                update = sp.acknowledge(
                    member_id,
                    [(b.first_offset, b.last_offset, [int(x) for x in b.acknowledge_types])
                     for b in p.acknowledgement_batches],
                    now,
                )
            except ApiError as e:
                pending.append((key, None, ErrorCode(e.error_code)))
                continue
            pending.append((key, sp, update))
            if ctx.broker.metrics is not None:
                count_acknowledgements(ctx.broker.metrics, group_id, p.acknowledgement_batches)
            svc.schedule_persist(sp)
            svc.reschedule(sp)  # renewals move deadlines
    return pending


def count_acknowledgements(metrics: Any, group_id: str, batches: Any) -> None:
    """Add one partition's applied acknowledgements to the metrics, by type (gaps are not records)."""
    metrics.acknowledgement_request(group_id)
    for b in batches:
        types = b.acknowledge_types
        if len(types) == 1:
            if int(types[0]) != AcknowledgeType.GAP:
                metrics.acknowledged(group_id, AcknowledgeType(int(types[0])).name, b.last_offset - b.first_offset + 1)
        else:
            for t in types:
                if int(t) != AcknowledgeType.GAP:
                    metrics.acknowledged(group_id, AcknowledgeType(int(t)).name, 1)


async def acknowledgement_codes(svc: ShareService, pending: list[tuple[tuple[uuid.UUID, int],
                                                                        SharePartition | None, Any]]
                                ) -> dict[tuple[uuid.UUID, int], ErrorCode]:
    """Wait until each acknowledgement's write is durable (or failed); its error code per partition."""
    codes: dict[tuple[uuid.UUID, int], ErrorCode] = {}
    for key, sp, update in pending:
        if sp is None:
            codes[key] = update
            continue
        await svc.wait_for(sp, update)
        codes[key] = ErrorCode.none if update.status is UpdateStatus.COMMITTED else ErrorCode.coordinator_not_available
    return codes


def _invalid_share_fetch(ctx: Any, request: Any, epoch: int) -> str | None:
    """Why the request is INVALID_REQUEST as a whole (Kafka's checks), or None.

    Nothing of an invalid request is applied: no session change, no acknowledgement.
    """
    with_acks = [p for t in request.topics for p in t.partitions if p.acknowledgement_batches]
    if epoch == INITIAL_EPOCH and with_acks:
        return "acknowledgements in a ShareFetch that opens a share session (epoch 0)"
    if epoch == FINAL_EPOCH and any(not p.acknowledgement_batches for t in request.topics for p in t.partitions):
        return "partitions to fetch in a ShareFetch that closes its share session (epoch -1)"
    mode = int(getattr(request, "share_acquire_mode", 0) or 0)
    if mode not in _ACQUIRE_MODES:
        return f"unknown ShareAcquireMode {mode}"
    if int(request.min_bytes) < 0 or int(request.max_wait.total_seconds() * 1000) < 0:
        return "negative MinBytes or MaxWaitMs"
    return None


_ACQUIRE_MODES = frozenset(int(m) for m in AcquireMode)


def _node_endpoints(ctx: Any, cls: Any, others: Iterable[int] = ()) -> tuple[Any, ...]:
    """This broker's endpoint, and those of the leaders named in NOT_LEADER_OR_FOLLOWER results."""
    b = ctx.broker
    ecls = sub(cls, "NodeEndpoint")
    host, port = own_endpoint(ctx)
    out = [make(ecls, node_id=b.node_id, host=host, port=port, rack=None)]
    wanted = set(others) - {b.node_id}
    if wanted:
        out.extend(make(ecls, node_id=e.node_id, host=hp[0], port=hp[1], rack=e.rack)
                   for e in b.cluster.brokers() if e.node_id in wanted and (hp := client_endpoint(ctx, e)) is not None)
    return tuple(out)


def _leader(ctx: Any, cls: Any, key: tuple[uuid.UUID, int] | None = None, code: Any = None) -> Any:
    """This broker at its leader epoch; for NOT_LEADER_OR_FOLLOWER, the partition's leader (cluster mode)."""
    b = ctx.broker
    lcls = sub(cls, "LeaderIdAndEpoch")
    if getattr(b, "replicas", None) is not None and key is not None:
        meta = b.store.topic_by_id(key[0])
        if meta is not None:
            view = b.cluster.partition(meta.name, key[1])
            if view is not None and (code == ErrorCode.not_leader_or_follower or view.leader == b.node_id):
                return make(lcls, leader_id=view.leader, leader_epoch=view.leader_epoch)
    return make(lcls, leader_id=b.node_id, leader_epoch=0)


def _acquire_one(ctx: Any, svc: ShareService, group_id: str, member_id: str, topic_id: uuid.UUID, partition: int,
                 max_records: int, budget: int, mode: AcquireMode,
                 batch_size: int | None) -> tuple[dict[int, bytes], list[Any]]:
    """Acquire what ``member_id`` may get of one share-partition.

    Returns ({base offset: batch bytes} of the log batches holding acquired records,
    the acquired ranges).
    """
    store = ctx.broker.store
    sp = svc.get_partition(group_id, topic_id, partition)
    svc.refresh_config(sp)
    if budget <= 0:
        return {}, []
    meta = store.topic_by_id(topic_id)
    plog = store.partition(meta.name, partition)
    svc.follow_log_start(sp, plog.log_start_offset)
    offset = sp.next_fetch_offset()
    if offset is None:
        return {}, []
    # Read a little at a time: the records wanted are usually few batches, and every
    # batch read is parsed and offered to acquire.
    chunk = max(8192, max_records * 128)
    acquired: list[Any] = []
    parts: dict[int, bytes] = {}
    # share.isolation.level read_committed: nothing at or above the last stable offset, and
    # aborted transactions' batches are left out (acquire archives what it is not offered)
    committed = svc.read_committed(group_id)
    end = plog.last_stable_offset if committed else plog.high_watermark
    skipped_from: int | None = None  # read_committed: where the trailing batches with nothing to deliver begin
    while max_records > 0 and budget > 0 and offset < end:
        try:
            data = plog.read(offset, min(budget, chunk, PARTITION_MAX_READ_BYTES))
        except ApiError as e:
            if e.error_code != ErrorCode.offset_out_of_range or offset >= plog.log_start_offset:
                raise
            # Retention or DeleteRecords removed what was to be read: SPSO follows.
            svc.follow_log_start(sp, plog.log_start_offset)
            nxt = sp.next_fetch_offset()
            if nxt is None or nxt <= offset:
                break
            offset = nxt
            continue
        if not data:
            break
        headers = list(iter_batches(data))
        if committed:
            headers = [h for h in headers if h.next_offset <= end]
            if not headers:
                break
        offset = headers[-1].next_offset
        first_read = headers[0].base_offset
        headers = [h for h in headers if not h.is_control]
        if committed:
            headers = plog.without_aborted(headers)
            if headers:
                skipped_from = headers[-1].next_offset if headers[-1].next_offset < offset else None
            elif skipped_from is None:
                skipped_from = first_read
        got = sp.acquire(member_id, [(h.base_offset, h.last_offset) for h in headers], ctx.now_ms(),
                         max_records, acquire_mode=mode, batch_size=batch_size)
        j = 0
        for h in headers:
            while j < len(got) and got[j].last_offset < h.base_offset:
                j += 1
            if j < len(got) and got[j].first_offset <= h.last_offset:
                parts[h.base_offset] = bytes(data[h.position:h.position + h.size])
                budget -= h.size
        acquired.extend(got)
        max_records -= sum(a.last_offset - a.first_offset + 1 for a in got)
        chunk *= 4
        if sp.next_fetch_offset() is None:
            break
    if skipped_from is not None and offset > skipped_from:
        sp.archive_gap(skipped_from, offset - 1)  # markers and aborted records up to the LSO
    if sp.needs_write:
        svc.schedule_persist(sp)
    if acquired:
        svc.reschedule(sp)
        metrics = ctx.broker.metrics
        if metrics is not None:
            metrics.acquired(group_id, meta.name, sum(a.last_offset - a.first_offset + 1 for a in acquired))
            metrics.fetched(meta.name, sum(len(b) for b in parts.values()))
    return parts, acquired


_WAIT_OUT = frozenset({ErrorCode.coordinator_not_available, ErrorCode.kafka_storage_error})
"""Partition errors of state that cannot be written: the fetch still waits out its max wait."""


@api(78, 1, 2)
async def handle_share_fetch(ctx: Any, request: Any) -> Any:
    if ctx.broker.authorizer is not None:
        return await authorized_share_request(ctx, request, _share_fetch)
    return await _share_fetch(ctx, request)


async def _share_fetch(ctx: Any, request: Any) -> Any:
    broker = ctx.broker
    cls = ctx.response_type
    svc = share_service(broker)
    group_id = request.group_id or ""
    member_id = request.member_id or ""
    lock_ms = svc.record_lock_duration_ms(group_id)

    def fail(code: ErrorCode, message: str | None = None) -> Any:
        return make(cls, throttle_time=0, error_code=code, error_message=message, acquisition_lock_timeout=lock_ms,
                    responses=(), node_endpoints=())

    epoch = int(request.share_session_epoch)
    invalid = _invalid_ids(request.group_id, request.member_id) or _invalid_share_fetch(ctx, request, epoch)
    if invalid is not None:
        return fail(ErrorCode.invalid_request, invalid)
    previous = svc.sessions.get(group_id, member_id)
    previous_parts = tuple(previous.partitions) if previous is not None else ()
    outcome = svc.sessions.handle_share_fetch(request, ctx.connection.connection_id)
    if not outcome.ok:
        return fail(outcome.error_code)

    # Cluster mode: the share-partitions' state may have to come from another broker first
    # (and a new session checks that no offsets reset happened behind their back).
    if epoch == INITIAL_EPOCH and outcome.partitions:
        await svc.drop_if_reset(group_id, [(_uuid(t), p) for t, p in outcome.partitions],
                                max(1.0, request.max_wait.total_seconds()))
    await svc.load_partitions(group_id, _ack_keys(request.topics))
    acks = apply_acknowledgements(ctx, svc, group_id, member_id, request.topics)
    if outcome.closed or outcome.replaced or outcome.forgotten:
        # Settle the acknowledgements before releasing: a write that fails leaves its
        # records acquired by the member, and the release below must see them.
        ack_codes = await acknowledgement_codes(svc, acks)

    # Release what the member held where it no longer fetches. A session replaced by
    # epoch 0 (the client reset it after an error) keeps the member's records in the
    # partitions the new session still names, as in Kafka: they stay the member's to
    # acknowledge, and are not released and re-acquired by this very request with a
    # delivery count one higher.
    if outcome.closed:
        svc.release_member(group_id, member_id, previous_parts)
    else:
        dropped = [sp for sp in outcome.replaced if sp not in outcome.added] + list(outcome.forgotten)
        if dropped:
            svc.release_member(group_id, member_id, dropped)
    session = svc.sessions.get(group_id, member_id)

    errors: dict[tuple[uuid.UUID, int], ErrorCode] = {}
    fetched: dict[tuple[uuid.UUID, int], tuple[dict[int, bytes], list[Any]]] = {}
    renew_only = bool(getattr(request, "is_renew_ack", False))
    if not outcome.closed and not renew_only and outcome.partitions:
        order = [(_uuid(t), p) for t, p in outcome.partitions]
        max_records = int(request.max_records) if int(getattr(request, "max_records", 0) or 0) > 0 \
            else DEFAULT_MAX_RECORDS
        mode = AcquireMode(int(getattr(request, "share_acquire_mode", 0) or 0))
        bs = int(getattr(request, "batch_size", 0) or 0)
        batch_size = bs if bs > 0 else None
        max_bytes = int(request.max_bytes) if int(request.max_bytes) > 0 else 2**31 - 1
        max_wait_ms = int(request.max_wait.total_seconds() * 1000)
        deadline = broker.clock.now_ms() + max_wait_ms
        # MinBytes: the request waits (up to MaxWaitMs) until the records it acquired
        # add up to MinBytes; what each pass acquires is kept and added to.
        min_bytes = max(1, int(request.min_bytes))
        remaining_records = max_records
        budget = max_bytes
        while True:
            # Cluster mode: load (or, after a failover, reload) what is not loaded yet, for at
            # most the fetch's wait; a share-partition still loading gives nothing this time.
            await svc.load_partitions(group_id, [k for k in order if k not in errors],
                                      max(0.0, deadline - broker.clock.now_ms()) / 1000)
            for key in order:
                if key in errors or remaining_records <= 0 or budget <= 0:
                    continue
                if svc.is_loading(group_id, key[0], key[1]):
                    continue  # nothing to acquire yet; its load wakes this fetch when done
                try:
                    data, acquired = _acquire_one(ctx, svc, group_id, member_id, key[0], key[1], remaining_records,
                                                  budget, mode, batch_size)
                except ApiError as e:
                    errors[key] = ErrorCode(e.error_code)
                    continue
                if acquired:
                    # A batch may hold records of two passes (one split by RECORD_LIMIT):
                    # it is sent once.
                    parts, got = fetched.setdefault(key, ({}, []))
                    budget -= sum(len(b) for base, b in data.items() if base not in parts)
                    parts.update(data)
                    got.extend(acquired)
                    remaining_records -= sum(a.last_offset - a.first_offset + 1 for a in acquired)
            left = deadline - broker.clock.now_ms()
            got_bytes = max_bytes - budget
            if (fetched and (got_bytes >= min_bytes or remaining_records <= 0 or budget <= 0)) \
                    or left <= 0 or broker.shutting_down:
                break
            if any(c not in _WAIT_OUT for c in errors.values()):
                break
            # A partition whose state cannot be written (a full disk) does not end the long
            # poll: its error is answered at the deadline, with whatever the others found, so
            # a client that retries at once does not spin.
            keys = []
            for t, p in order:
                meta = broker.store.topic_by_id(t)
                if meta is not None:
                    keys.append((meta.name, p))
            await broker.append_waiters.wait(keys, left / 1000)
            # While parked, the session may have been closed (final epoch, disconnect) or
            # replaced by a new one (epoch 0): this request then acquires nothing; the
            # client no longer waits for its answer.
            if svc.sessions.get(group_id, member_id) is not session:
                break

    # The fetch ran while the acknowledgements' writes were in flight; answer only once
    # they are durable (or failed).
    if not (outcome.closed or outcome.replaced or outcome.forgotten):
        ack_codes = await acknowledgement_codes(svc, acks)
    tcls = sub(cls, "ShareFetchableTopicResponse")
    pcls = sub(cls, "PartitionData")
    acls = sub(cls, "AcquiredRecords")
    by_topic: dict[uuid.UUID, list[Any]] = {}
    leaders: set[int] = set()
    for key in dict.fromkeys([*ack_codes, *errors, *fetched]):
        parts, acquired = fetched.get(key, ({}, []))
        data = b"".join(parts[base] for base in sorted(parts))
        acquired = sorted(acquired)
        moved = ErrorCode.not_leader_or_follower in (errors.get(key), ack_codes.get(key))
        leader = _leader(ctx, cls, key, ErrorCode.not_leader_or_follower if moved else None)
        if moved:
            leaders.add(leader.leader_id)
        by_topic.setdefault(key[0], []).append(make(
            pcls, partition_index=key[1], error_code=errors.get(key, ErrorCode.none), error_message=None,
            acknowledge_error_code=ack_codes.get(key, ErrorCode.none), acknowledge_error_message=None,
            current_leader=leader, records=data,
            acquired_records=tuple(make(acls, first_offset=a.first_offset, last_offset=a.last_offset,
                                        delivery_count=a.delivery_count) for a in acquired),
        ))
    topics = tuple(make(tcls, topic_id=t, partitions=tuple(ps)) for t, ps in by_topic.items())
    return make(cls, throttle_time=0, error_code=ErrorCode.none, error_message=None,
                acquisition_lock_timeout=lock_ms, responses=topics,
                node_endpoints=_node_endpoints(ctx, cls, leaders))


@api(79, 1, 2)
async def handle_share_acknowledge(ctx: Any, request: Any) -> Any:
    if ctx.broker.authorizer is not None:
        return await authorized_share_request(ctx, request, _share_acknowledge)
    return await _share_acknowledge(ctx, request)


async def _share_acknowledge(ctx: Any, request: Any) -> Any:
    broker = ctx.broker
    cls = ctx.response_type
    svc = share_service(broker)
    group_id = request.group_id or ""
    member_id = request.member_id or ""
    lock_ms = svc.record_lock_duration_ms(group_id)

    def fail(code: ErrorCode, message: str | None = None) -> Any:
        return make(cls, throttle_time=0, error_code=code, error_message=message, acquisition_lock_timeout=lock_ms,
                    responses=(), node_endpoints=())

    invalid = _invalid_ids(request.group_id, request.member_id)
    if invalid is not None:
        return fail(ErrorCode.invalid_request, invalid)
    # A member that left the group keeps its share session until the client closes it,
    # and may still acknowledge what it holds (see ShareService.on_share_member_removed).
    previous = svc.sessions.get(group_id, member_id)
    previous_parts = tuple(previous.partitions) if previous is not None else ()
    outcome = svc.sessions.handle_share_acknowledge(request, ctx.connection.connection_id)
    if not outcome.ok:
        return fail(outcome.error_code)
    await svc.load_partitions(group_id, _ack_keys(request.topics))
    codes = await acknowledgement_codes(svc, apply_acknowledgements(ctx, svc, group_id, member_id, request.topics))
    if outcome.closed:
        svc.release_member(group_id, member_id, previous_parts)

    tcls = sub(cls, "ShareAcknowledgeTopicResponse")
    pcls = sub(cls, "PartitionData")
    by_topic: dict[uuid.UUID, list[Any]] = {}
    leaders: set[int] = set()
    for t in request.topics:
        for p in t.partitions:
            key = (_uuid(t.topic_id), int(p.partition_index))
            code = codes.get(key, ErrorCode.none)
            leader = _leader(ctx, cls, key, code)
            if code == ErrorCode.not_leader_or_follower:
                leaders.add(leader.leader_id)
            by_topic.setdefault(key[0], []).append(make(
                pcls, partition_index=key[1], error_code=code, error_message=None, current_leader=leader))
    topics = tuple(make(tcls, topic_id=t, partitions=tuple(ps)) for t, ps in by_topic.items())
    return make(cls, throttle_time=0, error_code=ErrorCode.none, error_message=None,
                acquisition_lock_timeout=lock_ms, responses=topics,
                node_endpoints=_node_endpoints(ctx, cls, leaders))
