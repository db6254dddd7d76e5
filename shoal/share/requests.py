"""ShareFetch and ShareAcknowledge as plain requests and results (KIP-932), with no I/O.

The handlers (``shoal/server/handlers/share_fetch.py``) translate a kio request of any
version into one of these, hand it to the share service (``ShareService.fetch`` /
``ShareService.acknowledge``, as Kafka's KafkaApis hands a ShareFetch to
SharePartitionManager) and translate the result back into the kio response. Fields a
version lacks take the value Kafka gives them (acquire mode 0, no renew-only request).

A share-partition is named by ``(topic_id, partition)`` with the topic id a
``uuid.UUID`` (the zero uuid for a request that carried none). ``acknowledge_types``
holds one type per offset of the batch, or a single type for all of them (KIP-932's
AcknowledgementBatch).

Also here, pure: Kafka's request-wide checks (INVALID_REQUEST, nothing applied).

The requests are plain slotted dataclasses, not frozen ones (a frozen dataclass costs a
few microseconds more to build, once per request); nothing changes them once built.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from kio.schema.errors import ErrorCode

from .session import FINAL_EPOCH, INITIAL_EPOCH
from .state import AcquireMode

__all__ = [
    "DEFAULT_MAX_RECORDS",
    "MAX_MEMBER_ID_LENGTH",
    "AcknowledgementBatch",
    "PartitionResult",
    "ShareAcknowledgeParams",
    "ShareFetchParams",
    "SharePartitionRequest",
    "ShareResult",
    "invalid_ids",
    "invalid_share_fetch",
]

MAX_MEMBER_ID_LENGTH = 36
"""Kafka's limit on the member id of ShareFetch and ShareAcknowledge (a UUID string)."""
DEFAULT_MAX_RECORDS = 500
"""Records a ShareFetch acquires at most when its MaxRecords is not positive."""

Key = tuple[uuid.UUID, int]
"""``(topic_id, partition)``."""

_ACQUIRE_MODES = frozenset(int(m) for m in AcquireMode)


@dataclass(slots=True)
class AcknowledgementBatch:
    first_offset: int
    last_offset: int
    acknowledge_types: tuple[int, ...]


@dataclass(slots=True)
class SharePartitionRequest:
    """One partition of a request, in request order, with its acknowledgement batches
    (ShareFetch: also a partition to fetch, or to add to the session)."""

    topic_id: uuid.UUID
    partition: int
    acknowledgements: tuple[AcknowledgementBatch, ...] = ()

    @property
    def key(self) -> Key:
        return (self.topic_id, self.partition)


@dataclass(slots=True)
class ShareAcknowledgeParams:
    group_id: str | None
    member_id: str | None
    session_epoch: int
    partitions: tuple[SharePartitionRequest, ...]
    version: int
    """The request's version (RENEW needs version 2)."""
    connection_id: Any = None


@dataclass(slots=True)
class ShareFetchParams:
    group_id: str | None
    member_id: str | None
    session_epoch: int
    partitions: tuple[SharePartitionRequest, ...]
    """The request's ``topics``: partitions to fetch, with their acknowledgements."""
    forgotten: tuple[Key, ...]
    """The request's ``forgotten_topics_data``: partitions leaving the session."""
    version: int
    max_wait_ms: int
    min_bytes: int
    max_bytes: int
    max_records: int
    batch_size: int
    acquire_mode: int = int(AcquireMode.BATCH_OPTIMIZED)
    renew_only: bool = False
    """IsRenewAck: the request only renews locks and acquires nothing."""
    connection_id: Any = None


@dataclass(slots=True)
class PartitionResult:
    """One partition of the answer. ``batches``: {base offset: batch bytes} of the log
    batches holding acquired records; ``acquired``: the acquired ranges (offsets the member
    owns), both filled only by a ShareFetch."""

    topic_id: uuid.UUID
    partition: int
    error_code: ErrorCode = ErrorCode.none
    acknowledge_error_code: ErrorCode = ErrorCode.none
    batches: dict[int, bytes] = field(default_factory=dict)
    acquired: list[Any] = field(default_factory=list)

    def records(self) -> bytes:
        """The batches' bytes in offset order."""
        return b"".join(self.batches[base] for base in sorted(self.batches))


@dataclass(slots=True)
class ShareResult:
    """The answer to a ShareFetch or ShareAcknowledge: a request-wide error, or one result
    per partition (ShareAcknowledge: per request partition, in request order)."""

    acquisition_lock_timeout_ms: int
    error_code: ErrorCode = ErrorCode.none
    error_message: str | None = None
    partitions: list[PartitionResult] = field(default_factory=list)


def invalid_ids(group_id: str | None, member_id: str | None) -> str | None:
    """Kafka's first checks of ShareFetch and ShareAcknowledge (INVALID_REQUEST), or None:
    a null group id (an empty one is a group id), a null, empty or too long member id."""
    if group_id is None:
        return "Invalid group id in the request."
    if not member_id or len(member_id) > MAX_MEMBER_ID_LENGTH:
        return "Invalid member id in the request."
    return None


def invalid_share_fetch(request: ShareFetchParams) -> str | None:
    """Why a ShareFetch is INVALID_REQUEST as a whole (Kafka's checks), or None.

    Nothing of an invalid request is applied: no session change, no acknowledgement.
    """
    epoch = request.session_epoch
    if epoch == INITIAL_EPOCH and any(p.acknowledgements for p in request.partitions):
        return "acknowledgements in a ShareFetch that opens a share session (epoch 0)"
    if epoch == FINAL_EPOCH and any(not p.acknowledgements for p in request.partitions):
        return "partitions to fetch in a ShareFetch that closes its share session (epoch -1)"
    if request.acquire_mode not in _ACQUIRE_MODES:
        return f"unknown ShareAcquireMode {request.acquire_mode}"
    if request.min_bytes < 0 or request.max_wait_ms < 0:
        return "negative MinBytes or MaxWaitMs"
    return None
