"""The share-state persister over the network: routing, batching and retries (pure).

Theory of operation
-------------------
In a cluster the state of a share-partition lives with the share coordinator that leads
its ``__share_group_state`` partition, usually another broker than the share-partition
leader. The persister's five operations then travel as KIP-932's share-state RPCs
(InitializeShareGroupState 83, ReadShareGroupState 84, WriteShareGroupState 85,
DeleteShareGroupState 86, ReadShareGroupStateSummary 87). This module decides, without
any I/O:

* **Routing** (:func:`coordinator_of`): a key's state partition by Kafka's hash, and the
  broker leading it in the metadata the caller passes (None while it has no leader).
* **Batching** (:func:`take_batch`, :func:`build_request`): operations queued for one
  coordinator broker go out together, one request per (RPC, group id), since every
  share-state request names a single group, with as many share-partitions as are queued.
  One key appears at most once per request (its answer is found by topic and partition);
  a second operation on the same key waits for the next request.
* **Answers** (:func:`outcomes_of`): each share-partition's result of a response as a
  :class:`~shoal.share.coordinator.PartitionOutcome`; a share-partition the response does
  not mention gets UNKNOWN_SERVER_ERROR.
* **Retries** (:func:`retry_delay_ms`): NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS,
  COORDINATOR_NOT_AVAILABLE and connection errors (NETWORK_EXCEPTION) are retried after an
  exponential backoff with jitter (Kafka's persister constants: 1 s doubling up to 30 s,
  +-20 %, five attempts), re-resolving the coordinator before each attempt. Anything else
  (FENCED_LEADER_EPOCH, FENCED_STATE_EPOCH, UNKNOWN_TOPIC_OR_PARTITION, ...) is the answer.

The shell (``shoal/server/share_persister.py``) owns the connections and the clock.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

from kio.schema.errors import ErrorCode

from ..protocol.codec import codec_for
from ..protocol.entities import make, sub
from .coordinator import PartitionOutcome, SharePartitionKey, ShareState, StateBatch, partition_for

__all__ = [
    "MAX_ATTEMPTS",
    "REQUEST_BACKOFF_MAX_MS",
    "REQUEST_BACKOFF_MS",
    "RETRIABLE",
    "Rpc",
    "StateOp",
    "build_request",
    "coordinator_of",
    "failed",
    "outcomes_of",
    "retry_delay_ms",
    "take_batch",
]

REQUEST_BACKOFF_MS = 1_000
REQUEST_BACKOFF_MAX_MS = 30_000
MAX_ATTEMPTS = 5
BACKOFF_EXP_BASE = 2
BACKOFF_JITTER = 0.2

RETRIABLE = frozenset({ErrorCode.not_coordinator, ErrorCode.coordinator_load_in_progress,
                       ErrorCode.coordinator_not_available, ErrorCode.network_exception})
"""Errors after which the operation is sent again, to the coordinator resolved anew."""


class Rpc(IntEnum):
    """The share-state RPCs, by API key."""

    INITIALIZE = 83
    READ = 84
    WRITE = 85
    DELETE = 86
    SUMMARY = 87

    @property
    def version(self) -> int:
        return 1 if self in (Rpc.WRITE, Rpc.SUMMARY) else 0


@dataclass(frozen=True, slots=True)
class StateOp:
    """One persister operation on one share-partition's state."""

    rpc: Rpc
    key: SharePartitionKey
    state_epoch: int = 0
    leader_epoch: int = -1
    start_offset: int = -1
    batches: tuple[StateBatch, ...] = ()
    delivery_complete_count: int = -1


def retry_delay_ms(attempt: int, code: ErrorCode | int, rand: float, *, base_ms: int = REQUEST_BACKOFF_MS,
                   max_ms: int = REQUEST_BACKOFF_MAX_MS, max_attempts: int = MAX_ATTEMPTS) -> int | None:
    """How long to wait before attempt ``attempt + 1`` after attempt ``attempt`` (0-based)
    answered ``code``; None when ``code`` is the final answer (success, an error that is not
    retriable, or the attempts are used up). ``rand`` is uniform in [0, 1)."""
    if ErrorCode(int(code)) not in RETRIABLE or attempt + 1 >= max_attempts:
        return None
    exp = min(float(max_ms), base_ms * float(BACKOFF_EXP_BASE) ** attempt)
    return max(0, int(exp * (1 - BACKOFF_JITTER + 2 * BACKOFF_JITTER * rand)))


def coordinator_of(key: SharePartitionKey, num_partitions: int, leaders: Mapping[int, int]) -> int | None:
    """The node id leading ``key``'s ``__share_group_state`` partition, or None (no leader known).

    ``leaders`` maps partition index to leader node id (-1: none)."""
    if num_partitions < 1:
        return None
    leader = leaders.get(partition_for(key, num_partitions), -1)
    return leader if leader >= 0 else None


def take_batch(queued: Sequence[StateOp]) -> tuple[Rpc, str, list[int]]:
    """The next request from a coordinator's queue: (RPC, group id, indexes into ``queued``).

    The RPC and group of the oldest queued operation; every queued operation of the same
    RPC and group, except a key already taken. ``queued`` must not be empty.
    """
    first = queued[0]
    taken: list[int] = []
    keys: set[SharePartitionKey] = set()
    for i, op in enumerate(queued):
        if op.rpc is first.rpc and op.key.group_id == first.key.group_id and op.key not in keys:
            keys.add(op.key)
            taken.append(i)
    return first.rpc, first.key.group_id, taken


def _uuid(topic_id: str) -> uuid.UUID:
    return uuid.UUID(topic_id)


def build_request(rpc: Rpc, group_id: str, ops: Iterable[StateOp]) -> Any:
    """The kio request entity of ``rpc`` for ``ops`` (all of ``group_id``, distinct keys)."""
    codec = codec_for(int(rpc), rpc.version)
    assert codec is not None, rpc
    cls = codec.request_type
    pcls = sub(cls, "PartitionData")
    by_topic: dict[str, list[Any]] = {}
    for op in ops:
        k = op.key
        if rpc is Rpc.INITIALIZE:
            p = make(pcls, partition=k.partition, state_epoch=op.state_epoch, start_offset=op.start_offset)
        elif rpc in (Rpc.READ, Rpc.SUMMARY):
            p = make(pcls, partition=k.partition, leader_epoch=op.leader_epoch)
        elif rpc is Rpc.DELETE:
            p = make(pcls, partition=k.partition)
        else:
            bcls = sub(cls, "StateBatch")
            p = make(pcls, partition=k.partition, state_epoch=op.state_epoch, leader_epoch=op.leader_epoch,
                     start_offset=op.start_offset, delivery_complete_count=op.delivery_complete_count,
                     state_batches=tuple(make(bcls, first_offset=b.first_offset, last_offset=b.last_offset,
                                              delivery_state=b.delivery_state, delivery_count=b.delivery_count)
                                         for b in op.batches))
        by_topic.setdefault(k.topic_id, []).append(p)
    tcls = next(c for c in (_topic_class(cls, n) for n in _TOPIC_CLASSES[rpc]) if c is not None)
    return make(cls, group_id=group_id,
                topics=tuple(make(tcls, topic_id=_uuid(t), partitions=tuple(ps)) for t, ps in by_topic.items()))


_TOPIC_CLASSES = {
    Rpc.INITIALIZE: ("InitializeStateData",), Rpc.READ: ("ReadStateData",), Rpc.WRITE: ("WriteStateData",),
    Rpc.DELETE: ("DeleteStateData",), Rpc.SUMMARY: ("ReadStateSummaryData",),
}


def _topic_class(cls: type, name: str) -> type | None:
    try:
        return sub(cls, name)
    except (AttributeError, KeyError, LookupError):
        return None


def outcomes_of(rpc: Rpc, group_id: str, response: Any) -> dict[SharePartitionKey, PartitionOutcome]:
    """Each share-partition's outcome in a share-state response of ``rpc``."""
    out: dict[SharePartitionKey, PartitionOutcome] = {}
    for t in response.results:
        for p in t.partitions:
            key = SharePartitionKey.of(group_id, t.topic_id, int(p.partition))
            code = ErrorCode(int(p.error_code))
            state = None
            if code == ErrorCode.none and rpc is Rpc.READ:
                state = ShareState(state_epoch=int(p.state_epoch), leader_epoch=-1, start_offset=int(p.start_offset),
                                   state_batches=tuple(StateBatch(int(b.first_offset), int(b.last_offset),
                                                                  int(b.delivery_state), int(b.delivery_count))
                                                       for b in p.state_batches))
            elif code == ErrorCode.none and rpc is Rpc.SUMMARY:
                state = ShareState(state_epoch=int(p.state_epoch), leader_epoch=int(p.leader_epoch),
                                   start_offset=int(p.start_offset))
                out[key] = PartitionOutcome(code, p.error_message, state,
                                            delivery_complete_count=int(p.delivery_complete_count))
                continue
            out[key] = PartitionOutcome(code, p.error_message if code != ErrorCode.none else None, state)
    return out


def failed(code: ErrorCode, message: str) -> PartitionOutcome:
    return PartitionOutcome(code, message, None)


def answer_for(op: StateOp, outcomes: Mapping[SharePartitionKey, PartitionOutcome]) -> PartitionOutcome:
    """``op``'s outcome in a response's outcomes (UNKNOWN_SERVER_ERROR if it is missing)."""
    got = outcomes.get(op.key)
    if got is None:
        return failed(ErrorCode.unknown_server_error, "the response does not mention this share-partition")
    return got
