"""KIP-932 share-group calls over :class:`~shoal.client.connection.Connection`, synchronous.

* :func:`topic_metadata` - topic names to ids and partition counts (Metadata v10+).
* :class:`ShareMembership` - one member's ShareGroupHeartbeat loop state: join (epoch 0),
  heartbeat with the epoch the coordinator returned, leave (epoch -1). The caller decides
  when to call :meth:`ShareMembership.heartbeat` (``interval_ms`` says how often).
* :class:`ShareSession` - one member's share session on one connection: ShareFetch opens
  it (epoch 0), continues it (the epoch advances by one per request, wrapping at 2**31-1
  to 1), and ShareAcknowledge uses the same epochs. A session can be continued from
  another connection by passing the epoch it reached (``ShareSession(..., epoch=e)``);
  the broker then attaches it to the new connection.

Rules from KIP-932 the callers must keep: only the member that acquired a record may
acknowledge it; closing a session (epoch -1) or dropping its connection releases the
records acquired in it; opening a new session (epoch 0) for a member that has one
replaces it, releasing its records.

Acknowledge types (ShareAcknowledge ``acknowledge_types``): 0 gap, 1 accept, 2 release,
3 reject, 4 renew (version 2: the records stay acquired and their lock starts again).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from kio.schema.errors import ErrorCode

from ..protocol.batch import Record, decode_records, iter_batches
from ..protocol.entities import make, sub
from .connection import Connection, KafkaProtocolError

__all__ = [
    "ACCEPT",
    "GAP",
    "REJECT",
    "RELEASE",
    "RENEW",
    "AcquiredRecord",
    "FetchResult",
    "ShareMembership",
    "ShareSession",
    "TopicInfo",
    "coalesce",
    "next_epoch",
    "share_group_lag",
    "topic_metadata",
]

METADATA = 3
SHARE_GROUP_HEARTBEAT = 76
SHARE_FETCH = 78
SHARE_ACKNOWLEDGE = 79
DESCRIBE_SHARE_GROUP_OFFSETS = 90

GAP, ACCEPT, RELEASE, REJECT, RENEW = 0, 1, 2, 3, 4
_MAX_EPOCH = (1 << 31) - 1


def next_epoch(epoch: int) -> int:
    return 1 if epoch >= _MAX_EPOCH else epoch + 1


class TopicInfo(NamedTuple):
    name: str
    topic_id: uuid.UUID
    partitions: int


def topic_metadata(conn: Connection, topics: Iterable[str] | None) -> dict[str, TopicInfo]:
    """Name -> TopicInfo for ``topics`` (None: every topic). Unknown topics are left out."""
    v = conn.version_for(METADATA, 10, 12)
    req_type = conn.request_type(METADATA, v)
    topic_cls = sub(req_type, "MetadataRequestTopic")
    wanted = None if topics is None else tuple(make(topic_cls, name=t, topic_id=uuid.UUID(int=0)) for t in topics)
    resp = conn.send(make(req_type, topics=wanted, allow_auto_topic_creation=False))
    out = {}
    for t in resp.topics:
        if t.error_code != ErrorCode.none or t.name is None:
            continue
        out[t.name] = TopicInfo(t.name, t.topic_id, len(t.partitions))
    return out


def share_group_lag(conn: Connection, group_id: str, topics: Mapping[str, int]
                    ) -> dict[tuple[str, int], int] | None:
    """(topic, partition) -> records the group has not yet delivered completely (its lag).

    DescribeShareGroupOffsets v1 sent on ``conn``, which must reach the group's coordinator.
    ``topics``: name -> partition count. A partition with no state yet, or whose lag the
    broker does not know, is -1. None when the broker cannot answer (no v1, an error).
    """
    try:
        v = conn.version_for(DESCRIBE_SHARE_GROUP_OFFSETS, 1, 1)
    except KafkaProtocolError:
        return None
    req_type = conn.request_type(DESCRIBE_SHARE_GROUP_OFFSETS, v)
    gcls, tcls = sub(req_type, "DescribeShareGroupOffsetsRequestGroup"), sub(req_type,
                                                                             "DescribeShareGroupOffsetsRequestTopic")
    wanted = tuple(make(tcls, topic_name=t, partitions=tuple(range(n))) for t, n in sorted(topics.items()))
    resp = conn.send(make(req_type, groups=(make(gcls, group_id=group_id, topics=wanted),)))
    out: dict[tuple[str, int], int] = {}
    for g in resp.groups:
        if g.error_code != ErrorCode.none:
            return None
        for t in g.topics:
            for p in t.partitions:
                ok = p.error_code == ErrorCode.none and p.start_offset >= 0
                out[(t.topic_name, int(p.partition_index))] = int(p.lag) if ok else -1
    return out


@dataclass
class ShareMembership:
    """Heartbeat state of one share-group member (KIP-932 ShareGroupHeartbeat)."""

    group_id: str
    member_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    topics: tuple[str, ...] = ()
    member_epoch: int = 0
    interval_ms: int = 5000
    assignment: dict[uuid.UUID, tuple[int, ...]] = field(default_factory=dict)

    def heartbeat(self, conn: Connection) -> Any:
        """One heartbeat. Joins when the epoch is 0. Raises KafkaProtocolError on an error code.

        On FENCED_MEMBER_EPOCH / UNKNOWN_MEMBER_ID the epoch is reset to 0 so the next call
        rejoins with the same member id (the coordinator fenced it and released its records).
        """
        v = conn.version_for(SHARE_GROUP_HEARTBEAT, 1, 1)
        resp = conn.call(SHARE_GROUP_HEARTBEAT, v, group_id=self.group_id, member_id=self.member_id,
                         member_epoch=self.member_epoch,
                         subscribed_topic_names=self.topics if self.member_epoch == 0 else None)
        if resp.error_code != ErrorCode.none:
            if resp.error_code in (ErrorCode.fenced_member_epoch, ErrorCode.unknown_member_id):
                self.member_epoch = 0
            raise KafkaProtocolError(resp.error_code, resp.error_message or "ShareGroupHeartbeat")
        self.member_epoch = int(resp.member_epoch)
        interval = resp.heartbeat_interval
        self.interval_ms = int(interval.total_seconds() * 1000) if hasattr(interval, "total_seconds") else int(interval)
        if resp.assignment is not None:
            self.assignment = {tp.topic_id: tuple(int(p) for p in tp.partitions)
                               for tp in resp.assignment.topic_partitions}
        return resp

    def leave(self, conn: Connection) -> None:
        """Leave the group (epoch -1); errors are ignored (the member may already be gone)."""
        if self.member_epoch == 0:
            return
        v = conn.version_for(SHARE_GROUP_HEARTBEAT, 1, 1)
        try:
            conn.call(SHARE_GROUP_HEARTBEAT, v, group_id=self.group_id, member_id=self.member_id, member_epoch=-1)
        finally:
            self.member_epoch = 0


class AcquiredRecord(NamedTuple):
    topic_id: uuid.UUID
    partition: int
    record: Record
    delivery_count: int


@dataclass
class FetchResult:
    records: list[AcquiredRecord]
    acquired: dict[tuple[uuid.UUID, int], list[tuple[int, int]]]
    """(topic id, partition) -> acquired offset ranges, inclusive."""
    errors: dict[tuple[uuid.UUID, int], ErrorCode]
    acknowledge_errors: dict[tuple[uuid.UUID, int], ErrorCode]
    raw: list[tuple[tuple[uuid.UUID, int], bytes, list[tuple[int, int, int]]]] = field(default_factory=list)
    """With ``decode=False``: (topic id, partition), its records data, acquired (first, last, delivery count)."""


def coalesce(offsets: Iterable[int]) -> list[tuple[int, int]]:
    """Sorted inclusive ranges covering ``offsets``."""
    out: list[tuple[int, int]] = []
    for o in sorted(set(offsets)):
        if out and out[-1][1] + 1 == o:
            out[-1] = (out[-1][0], o)
        else:
            out.append((o, o))
    return out


def _ack_batches(cls: type, ranges: Mapping[tuple[int, int], int] | Sequence[tuple[int, int, int]]) -> tuple:
    items = ranges.items() if isinstance(ranges, Mapping) else (((a, b), t) for a, b, t in ranges)
    return tuple(make(cls, first_offset=a, last_offset=b, acknowledge_types=(t,)) for (a, b), t in items)


class ShareSession:
    """One member's share session. ``epoch`` is the epoch the next request carries."""

    def __init__(self, conn: Connection, group_id: str, member_id: str, *, epoch: int = 0) -> None:
        self.conn = conn
        self.group_id = group_id
        self.member_id = member_id
        self.epoch = epoch
        self.partitions: set[tuple[uuid.UUID, int]] = set()

    def fetch(self, partitions: Iterable[tuple[uuid.UUID, int]], *, max_wait_ms: int = 500, min_bytes: int = 1,
              max_bytes: int = 16 << 20, max_records: int = 500,
              acknowledgements: Mapping[tuple[uuid.UUID, int], Sequence[tuple[int, int, int]]] | None = None,
              forget: Iterable[tuple[uuid.UUID, int]] = (), decode: bool = True,
              ) -> FetchResult:
        """ShareFetch the given partitions (added to the session if new), optionally acknowledging.

        ``acknowledgements``: (topic id, partition) -> [(first, last, type)]. ``forget``:
        partitions to drop from the session (their leader moved). Returns only the
        records inside the acquired ranges; with ``decode=False`` it leaves the records
        data undecoded in :attr:`FetchResult.raw` (see :func:`shoal.protocol.batch.decode_columns`). Raises KafkaProtocolError on a top-level error
        (the session epoch is then unchanged).
        """
        acks = dict(acknowledgements or {})
        wanted = set(partitions)
        v = self.conn.version_for(SHARE_FETCH, 1, 2)
        req_type = self.conn.request_type(SHARE_FETCH, v)
        topic_cls, part_cls, ack_cls = (sub(req_type, n) for n in ("FetchTopic", "FetchPartition",
                                                                     "AcknowledgementBatch"))
        send = (wanted - self.partitions) | set(acks) if self.epoch != 0 else wanted | set(acks)
        by_topic: dict[uuid.UUID, list[Any]] = {}
        for tid, p in sorted(send, key=lambda x: (str(x[0]), x[1])):
            by_topic.setdefault(tid, []).append(make(part_cls, partition_index=p,
                                                     acknowledgement_batches=_ack_batches(ack_cls, acks.get((tid, p), ()))))
        topics = tuple(make(topic_cls, topic_id=tid, partitions=tuple(ps)) for tid, ps in by_topic.items())
        gone = (set(forget) & self.partitions) - send if self.epoch != 0 else set()
        forgotten: dict[uuid.UUID, list[int]] = {}
        for tid, p in sorted(gone, key=lambda x: (str(x[0]), x[1])):
            forgotten.setdefault(tid, []).append(p)
        forgot_cls = sub(req_type, "ForgottenTopic")
        req = make(req_type, group_id=self.group_id, member_id=self.member_id, share_session_epoch=self.epoch,
                   max_wait=max_wait_ms, min_bytes=min_bytes, max_bytes=max_bytes, max_records=max_records,
                   batch_size=max_records, topics=topics,
                   forgotten_topics_data=tuple(make(forgot_cls, topic_id=t, partitions=tuple(ps))
                                               for t, ps in forgotten.items()))
        resp = self.conn.send(req)
        if resp.error_code != ErrorCode.none:
            raise KafkaProtocolError(resp.error_code, resp.error_message or "ShareFetch")
        self.partitions = (self.partitions | send) - gone
        self.epoch = next_epoch(self.epoch)
        out = FetchResult([], {}, {}, {})
        for t in resp.responses:
            for p in t.partitions:
                key = (t.topic_id, int(p.partition_index))
                if p.error_code != ErrorCode.none:
                    out.errors[key] = p.error_code
                if int(p.acknowledge_error_code) != 0:
                    out.acknowledge_errors[key] = ErrorCode(int(p.acknowledge_error_code))
                if not p.acquired_records:
                    continue
                ranges = [(int(a.first_offset), int(a.last_offset), int(a.delivery_count)) for a in p.acquired_records]
                out.acquired.setdefault(key, []).extend((a, b) for a, b, _ in ranges)
                data = p.records
                if not data:
                    continue
                if not decode:
                    out.raw.append((key, data, ranges))
                    continue
                mv = memoryview(data)
                for h in iter_batches(mv):
                    if h.is_control:
                        continue
                    if not any(a <= h.last_offset and h.base_offset <= b for a, b, _ in ranges):
                        continue
                    for rec in decode_records(mv, h):
                        for a, b, dc in ranges:
                            if a <= rec.offset <= b:
                                out.records.append(AcquiredRecord(t.topic_id, key[1], rec, dc))
                                break
        return out

    def acknowledge(self, acknowledgements: Mapping[tuple[uuid.UUID, int], Sequence[tuple[int, int, int]]]
                    ) -> dict[tuple[uuid.UUID, int], ErrorCode]:
        """ShareAcknowledge; returns the partitions whose acknowledgement failed, with the code.

        Raises KafkaProtocolError on a top-level error (epoch unchanged).
        """
        if not acknowledgements:
            return {}
        v = self.conn.version_for(SHARE_ACKNOWLEDGE, 1, 2)
        req_type = self.conn.request_type(SHARE_ACKNOWLEDGE, v)
        topic_cls, part_cls, ack_cls = (sub(req_type, n) for n in ("AcknowledgeTopic", "AcknowledgePartition",
                                                                     "AcknowledgementBatch"))
        by_topic: dict[uuid.UUID, list[Any]] = {}
        for (tid, p), ranges in sorted(acknowledgements.items(), key=lambda x: (str(x[0][0]), x[0][1])):
            by_topic.setdefault(tid, []).append(make(part_cls, partition_index=p,
                                                     acknowledgement_batches=_ack_batches(ack_cls, ranges)))
        topics = tuple(make(topic_cls, topic_id=tid, partitions=tuple(ps)) for tid, ps in by_topic.items())
        fields: dict[str, Any] = {}
        if v >= 2:
            fields["is_renew_ack"] = any(t == RENEW for ranges in acknowledgements.values() for *_, t in ranges)
        elif any(t == RENEW for ranges in acknowledgements.values() for *_, t in ranges):
            raise KafkaProtocolError(ErrorCode.unsupported_version, "renewing locks needs ShareAcknowledge v2")
        resp = self.conn.send(make(req_type, group_id=self.group_id, member_id=self.member_id,
                                   share_session_epoch=self.epoch, topics=topics, **fields))
        if resp.error_code != ErrorCode.none:
            raise KafkaProtocolError(resp.error_code, resp.error_message or "ShareAcknowledge")
        self.epoch = next_epoch(self.epoch)
        failed = {}
        for t in resp.responses:
            for p in t.partitions:
                if p.error_code != ErrorCode.none:
                    failed[(t.topic_id, int(p.partition_index))] = p.error_code
        return failed

    def close(self) -> None:
        """Close the session (epoch -1): the broker releases what it still holds for this member."""
        if self.epoch == 0:
            return
        v = self.conn.version_for(SHARE_FETCH, 1, 2)
        try:
            self.conn.call(SHARE_FETCH, v, group_id=self.group_id, member_id=self.member_id, share_session_epoch=-1,
                           max_wait=0, min_bytes=0, max_records=0, batch_size=0, topics=(), forgotten_topics_data=())
        finally:
            self.epoch = 0
            self.partitions.clear()
