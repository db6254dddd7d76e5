"""The share coordinator: durable share-partition state on ``__share_group_state``.

Theory of operation
-------------------
KIP-932's share-group state persister keeps, for every share-partition
``SharePartitionKey(group_id, topic_id, partition)``, the state a share-partition
leader needs to resume after a restart: the share-partition start offset (SPSO), the
state epoch, the leader epoch of the last leader that wrote it, and the *state
batches*, the delivery state and delivery count of the in-flight records that are not
simply "available, never delivered" (ACKNOWLEDGED, ARCHIVED, or AVAILABLE after a
failed delivery).

One :class:`ShareCoordinatorShard` owns the keys of one ``__share_group_state``
partition (:func:`partition_for` decides which). Like every shoal coordinator it has two
kinds of methods (see :mod:`shoal.coordinator.result`):

* operations (``initialize``, ``read``, ``write``, ``delete``, ``read_summary`` and
  their wire wrappers ``handle_*``) read the state, **never change it**, and return
  ``Result(records, response)``;
* :meth:`ShareCoordinatorShard.replay` applies one durable record. It is the only
  method that changes the state, and it runs the same way live and at start-up.

Records, in Kafka's ShareSnapshotKey/Value and ShareUpdateKey/Value layouts (key fields
``group_id``, ``topic_id``, ``partition``; see :mod:`shoal.coordinator.schemas`):

* ``SHARE_SNAPSHOT`` (type 0) carries the whole state of a key. It is written by
  ``initialize``, by the first ``write`` of a key, by a ``write`` that raises the state
  epoch, and by the ``write`` that follows N updates, where N is
  ``share.coordinator.snapshot.update.records.per.snapshot``.
* ``SHARE_UPDATE`` (type 1) carries a delta: the new start offset (-1: unchanged), the
  new leader epoch (-1: unchanged) and the state batches the write reported. Replay
  overlays them on the state so far.
* A delete writes tombstones (value ``None``) for both record types of the key.

The delivery-complete count (WriteShareGroupState v1, and the records' tagged field) is
derived from the state's batches, which hold every offset a leader completed; the
snapshot's create and write timestamps come from the ``now_ms`` the shell passes.

Rules and invariants
--------------------
* The state of a key is the replay of its last snapshot and the updates after it;
  nothing else. ``update_count(key)`` is the number of updates after the last snapshot
  and is rebuilt by replay, so the snapshot cadence survives a restart.
* Stored state batches are sorted, do not overlap, lie at or above the start offset
  (when it is known, i.e. not -1) and adjacent batches with equal state and delivery
  count are merged (see :func:`combine_state_batches`). This form is canonical: two
  states covering the same offsets with the same values compare equal.
* Overlaps resolve by recency: a newer batch overrides the offsets it covers; within one
  request, a later batch overrides an earlier one. (Kafka's combiner prefers the batch
  with the higher delivery count, then the higher state; for a leader that writes the
  monotonic history of its records both rules give the same result.)
* Fencing (KIP-932, share coordinator): a write whose ``leader_epoch`` is below the
  stored one fails with FENCED_LEADER_EPOCH (checked first, as Kafka does); a write or
  initialize whose ``state_epoch`` is below the stored one fails with
  FENCED_STATE_EPOCH. A ``read`` with a higher leader epoch records it (one ShareUpdate)
  so that writes of the previous leader are fenced from then on, durably.
* State exists only where ``initialize`` created it (the group coordinator's
  InitializeShareGroupState, or an offsets reset). Reading a key with no state gives
  UNKNOWN_TOPIC_OR_PARTITION (KIP-932: "this share-partition is not actually part of
  the share group"); writing one is INVALID_REQUEST (Kafka's
  WRITE_UNINITIALIZED_SHARE_PARTITION), so a share-partition leader whose state was
  deleted cannot create it again. A start offset of -1 is returned as is: the leader
  then applies ``share.auto.offset.reset``.
* Initialize, read and write of a topic or partition the metadata does not have
  (``partition_count``) answer UNKNOWN_TOPIC_OR_PARTITION; delete does not check, so
  the state of a deleted topic can still be removed.

Pruning the log
---------------
Updates of one key share its record key, so **key-based compaction must not be used on
this topic** (it would keep only the last update). Instead, as Kafka does, the shell
may delete records below :meth:`ShareCoordinatorShard.last_redundant_offset`: the
lowest offset of a live key's last snapshot. Everything below it is superseded.

What it does not know
---------------------
Topics and partitions other than through ``partition_count`` (the shell's metadata), which
``__share_group_state`` partition a request was routed to (the shell routes with
:func:`partition_for`), time, and the log itself. Event-loop only; never awaits.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from kio.schema.delete_share_group_state.v0.request import DeleteShareGroupStateRequest
from kio.schema.delete_share_group_state.v0.response import (
    DeleteShareGroupStateResponse,
    DeleteStateResult,
)
from kio.schema.delete_share_group_state.v0.response import PartitionResult as DeletePartitionResult
from kio.schema.errors import ErrorCode
from kio.schema.initialize_share_group_state.v0.request import InitializeShareGroupStateRequest
from kio.schema.initialize_share_group_state.v0.response import (
    InitializeShareGroupStateResponse,
    InitializeStateResult,
)
from kio.schema.initialize_share_group_state.v0.response import (
    PartitionResult as InitializePartitionResult,
)
from kio.schema.read_share_group_state.v0.request import ReadShareGroupStateRequest
from kio.schema.read_share_group_state.v0.response import PartitionResult as ReadPartitionResult
from kio.schema.read_share_group_state.v0.response import (
    ReadShareGroupStateResponse,
    ReadStateResult,
)
from kio.schema.read_share_group_state.v0.response import StateBatch as ReadStateBatch
from kio.schema.read_share_group_state_summary.v1.request import ReadShareGroupStateSummaryRequest
from kio.schema.read_share_group_state_summary.v1.response import (
    PartitionResult as SummaryPartitionResult,
)
from kio.schema.read_share_group_state_summary.v1.response import (
    ReadShareGroupStateSummaryResponse,
    ReadStateSummaryResult,
)
from kio.schema.write_share_group_state.v1.request import WriteShareGroupStateRequest
from kio.schema.write_share_group_state.v1.response import PartitionResult as WritePartitionResult
from kio.schema.write_share_group_state.v1.response import (
    WriteShareGroupStateResponse,
    WriteStateResult,
)
from kio.static.primitive import i8, i16, i32, i64

from shoal.coordinator.partitioning import coordinator_partition
from shoal.coordinator.records import (
    SHARE_GROUP_STATE,
    CoordinatorRecord,
    ShareStateRecordType,
    record,
    tombstone,
)
from shoal.coordinator.result import Result

__all__ = [
    "SNAPSHOT_UPDATE_RECORDS_PER_SNAPSHOT",
    "UNINITIALIZED_START_OFFSET",
    "PartitionOutcome",
    "ShareCoordinatorShard",
    "SharePartitionKey",
    "ShareState",
    "StateBatch",
    "combine_state_batches",
    "partition_for",
]

UNINITIALIZED_START_OFFSET = -1
"""Start offset of a share-partition whose SPSO the leader has yet to choose (KIP-932)."""

SNAPSHOT_UPDATE_RECORDS_PER_SNAPSHOT = "share.coordinator.snapshot.update.records.per.snapshot"

_RECORD_VERSION = 0
_COMPLETE_STATES = (2, 4)  # ACKNOWLEDGED, ARCHIVED


# --- keys and values -------------------------------------------------------------------


@dataclass(frozen=True, slots=True, order=True)
class SharePartitionKey:
    """The identity of a share-partition's durable state.

    ``topic_id`` is the topic's UUID as a canonical string (``str(uuid.UUID)``); use
    :meth:`of` to build a key from a ``uuid.UUID`` as kio decodes it.
    """

    group_id: str
    topic_id: str
    partition: int

    @classmethod
    def of(cls, group_id: str, topic_id: str | uuid.UUID | None, partition: int) -> SharePartitionKey:
        return cls(group_id, "" if topic_id is None else str(topic_id), int(partition))

    def coordinator_key(self) -> str:
        """``"group:topicId:partition"``: the FindCoordinator key of KIP-932."""
        return f"{self.group_id}:{self.topic_id}:{self.partition}"

    def record_key(self) -> dict[str, Any]:
        return {"group_id": self.group_id, "topic_id": self.topic_id, "partition": self.partition}

    @classmethod
    def from_record_key(cls, fields: Mapping[str, Any]) -> SharePartitionKey:
        return cls(str(fields["group_id"]), str(fields["topic_id"]), int(fields["partition"]))


@dataclass(frozen=True, slots=True)
class StateBatch:
    """Offsets ``first_offset..last_offset`` (inclusive) share one delivery state and count.

    ``delivery_state`` uses Kafka's persisted ids: 0 AVAILABLE, 2 ACKNOWLEDGED,
    4 ARCHIVED (1 ACQUIRED is never persisted by a correct leader but is stored as given).
    """

    first_offset: int
    last_offset: int
    delivery_state: int
    delivery_count: int

    def to_json(self) -> dict[str, int]:
        return {
            "first_offset": self.first_offset,
            "last_offset": self.last_offset,
            "delivery_state": self.delivery_state,
            "delivery_count": self.delivery_count,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> StateBatch:
        return cls(int(d["first_offset"]), int(d["last_offset"]), int(d["delivery_state"]),
                   int(d["delivery_count"]))


@dataclass(frozen=True, slots=True)
class ShareState:
    """The durable state of one share-partition, as the last snapshot plus updates give it.

    ``state_batches`` is in the canonical form described in the module docstring.
    ``snapshot_epoch`` counts the snapshots of this key since it was (re)created (0 for
    the first). ``create_timestamp`` and ``write_timestamp`` (ms; -1: unknown) are when
    the state was created and last written as a snapshot; they are not part of equality.
    """

    state_epoch: int
    leader_epoch: int
    start_offset: int
    state_batches: tuple[StateBatch, ...] = ()
    snapshot_epoch: int = 0
    create_timestamp: int = field(default=-1, compare=False)
    write_timestamp: int = field(default=-1, compare=False)

    @property
    def delivery_complete_count(self) -> int:
        """Offsets from the start offset on that are ACKNOWLEDGED or ARCHIVED.

        Derived from the batches: a leader persists every record it completes, so this is
        the figure it reports in WriteShareGroupState (which the records do not store).
        """
        return sum(b.last_offset - b.first_offset + 1 for b in self.state_batches
                   if b.delivery_state in _COMPLETE_STATES)


@dataclass(frozen=True, slots=True)
class PartitionOutcome:
    """The answer of a plain operation for one key.

    ``error_code`` is ``ErrorCode.none`` on success. ``state`` is the state read (for
    ``read``/``read_summary``), the state the records will produce (for ``initialize``
    and ``write``), or None (for ``delete`` and on errors).
    """

    error_code: ErrorCode = ErrorCode.none
    error_message: str | None = None
    state: ShareState | None = None
    delivery_complete_count: int = -1
    """A summary read over the network: the coordinator's count (the state then has no
    batches); -1: derive it from ``state``."""

    @property
    def ok(self) -> bool:
        return self.error_code == ErrorCode.none


def _error(code: ErrorCode, message: str | None = None) -> Result[PartitionOutcome]:
    return Result(records=[], response=PartitionOutcome(code, message or code.name, None))


# --- pure helpers ----------------------------------------------------------------------


def partition_for(key: SharePartitionKey, num_partitions: int) -> int:
    """The ``__share_group_state`` partition that holds ``key``.

    Kafka's rule: ``abs(hash("group:topicId:partition")) % num_partitions`` with Java's
    string hash (``Utils.abs`` maps Integer.MIN_VALUE to 0). Stable across processes,
    unlike Python's ``hash``. Raises ValueError if ``num_partitions < 1``.
    """
    return coordinator_partition(key.coordinator_key(), num_partitions)


def combine_state_batches(
    current: Iterable[StateBatch], new: Iterable[StateBatch], start_offset: int
) -> tuple[StateBatch, ...]:
    """Overlay ``new`` on ``current`` and return the canonical batch list.

    Each batch of ``new``, in order, replaces whatever covered its offsets before.
    Offsets below ``start_offset`` are dropped (unless it is -1, unknown); a batch that
    straddles it is cut. Adjacent batches with equal state and count are merged.
    ``current`` must already be non-overlapping (any canonical list is).
    """
    spans: list[StateBatch] = sorted(current, key=_first_offset)
    overlay = list(new)
    if all(a.last_offset < b.first_offset for a, b in itertools.pairwise(overlay)):
        spans = _overlay_sorted(spans, overlay)
    else:
        spans = _overlay_in_order(spans, overlay)
    merged: list[StateBatch] = []
    for s in spans:
        if start_offset != UNINITIALIZED_START_OFFSET and s.first_offset < start_offset:
            if s.last_offset < start_offset:
                continue
            s = replace(s, first_offset=start_offset)
        if merged:
            p = merged[-1]
            if (p.last_offset + 1 == s.first_offset and p.delivery_state == s.delivery_state
                    and p.delivery_count == s.delivery_count):
                merged[-1] = replace(p, last_offset=s.last_offset)
                continue
        merged.append(s)
    return tuple(merged)


def _first_offset(b: StateBatch) -> int:
    return b.first_offset


def _overlay_sorted(spans: list[StateBatch], overlay: list[StateBatch]) -> list[StateBatch]:
    """``spans`` minus the offsets ``overlay`` covers, plus ``overlay``; both sorted and
    non-overlapping (what a share-partition writes): one pass and one sort, where the
    general case costs a pass per overlay batch."""
    out: list[StateBatch] = []
    j = 0
    n = len(overlay)
    for s in spans:
        while j < n and overlay[j].last_offset < s.first_offset:
            j += 1
        lo = s.first_offset
        k = j
        while k < n and overlay[k].first_offset <= s.last_offset:
            b = overlay[k]
            if b.first_offset > lo:
                out.append(replace(s, first_offset=lo, last_offset=b.first_offset - 1))
            lo = max(lo, b.last_offset + 1)
            k += 1
        if lo == s.first_offset:
            out.append(s)
        elif lo <= s.last_offset:
            out.append(replace(s, first_offset=lo))
    out.extend(overlay)
    out.sort(key=_first_offset)
    return out


def _overlay_in_order(spans: list[StateBatch], overlay: list[StateBatch]) -> list[StateBatch]:
    """The general case: each batch of ``overlay``, in order, replaces what it covers."""
    for b in overlay:
        out: list[StateBatch] = []
        for s in spans:
            if s.last_offset < b.first_offset or s.first_offset > b.last_offset:
                out.append(s)
                continue
            if s.first_offset < b.first_offset:
                out.append(replace(s, last_offset=b.first_offset - 1))
            if s.last_offset > b.last_offset:
                out.append(replace(s, first_offset=b.last_offset + 1))
        out.append(b)
        out.sort(key=_first_offset)
        spans = out
    return spans


def _batches_json(batches: Iterable[StateBatch]) -> list[dict[str, int]]:
    return [b.to_json() for b in batches]


def _snapshot_record(key: SharePartitionKey, state: ShareState) -> CoordinatorRecord:
    return record(ShareStateRecordType.SHARE_SNAPSHOT, key.record_key(), {
        "snapshot_epoch": state.snapshot_epoch,
        "state_epoch": state.state_epoch,
        "leader_epoch": state.leader_epoch,
        "start_offset": state.start_offset,
        "delivery_complete_count": state.delivery_complete_count,
        "create_timestamp": state.create_timestamp,
        "write_timestamp": state.write_timestamp,
        "state_batches": _batches_json(state.state_batches),
    }, _RECORD_VERSION, SHARE_GROUP_STATE)


def _update_record(key: SharePartitionKey, snapshot_epoch: int, leader_epoch: int, start_offset: int,
                   batches: Iterable[StateBatch], delivery_complete_count: int) -> CoordinatorRecord:
    return record(ShareStateRecordType.SHARE_UPDATE, key.record_key(), {
        "snapshot_epoch": snapshot_epoch,
        "leader_epoch": leader_epoch,
        "start_offset": start_offset,
        "delivery_complete_count": delivery_complete_count,
        "state_batches": _batches_json(batches),
    }, _RECORD_VERSION, SHARE_GROUP_STATE)


def _apply_update(state: ShareState, value: Mapping[str, Any]) -> ShareState:
    start = int(value["start_offset"])
    leader = int(value["leader_epoch"])
    new_start = state.start_offset if start == UNINITIALIZED_START_OFFSET else start
    new_leader = state.leader_epoch if leader == -1 else leader
    batches = combine_state_batches(
        state.state_batches, (StateBatch.from_json(b) for b in value.get("state_batches", ())), new_start)
    return replace(state, start_offset=new_start, leader_epoch=new_leader, state_batches=batches)


def _validate_key(key: SharePartitionKey) -> str | None:
    if not key.group_id:
        return "group id is empty"
    if not key.topic_id:
        return "topic id is missing"
    if key.partition < 0:
        return "partition is negative"
    return None


def _validate_batches(batches: Iterable[StateBatch]) -> str | None:
    for b in batches:
        if b.first_offset < 0 or b.last_offset < b.first_offset:
            return f"invalid state batch {b.first_offset}..{b.last_offset}"
        if b.delivery_count < 0:
            return f"negative delivery count in batch {b.first_offset}..{b.last_offset}"
    return None


# --- the shard ---------------------------------------------------------------------------


class ShareCoordinatorShard:
    """The state machine of one ``__share_group_state`` partition. See module docstring.

    Event-loop only, never awaits. Operations never change the state; ``replay`` does.
    """

    def __init__(self, *, snapshot_update_records_per_snapshot: int = 500,
                 partition_count: Callable[[uuid.UUID], int | None] | None = None) -> None:
        if snapshot_update_records_per_snapshot < 0:
            raise ValueError("snapshot_update_records_per_snapshot must be >= 0")
        self.snapshot_update_records_per_snapshot = snapshot_update_records_per_snapshot
        self.partition_count = partition_count
        """The metadata the shell knows: a topic id's partition count, None for an unknown
        topic (Kafka's shard asks its metadata image). None: every key's topic exists."""
        self._states: dict[SharePartitionKey, ShareState] = {}
        """Current state of each live key: last snapshot plus the updates after it."""
        self._update_counts: dict[SharePartitionKey, int] = {}
        """ShareUpdate records replayed since the key's last snapshot."""
        self._snapshot_offsets: dict[SharePartitionKey, int] = {}
        """Log offset of each live key's last snapshot (only when replay got offsets)."""
        self._next_offset: int | None = None
        """One past the highest offset replayed, or None if replay got no offsets."""

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> ShareCoordinatorShard:
        """Build from a broker config mapping (e.g. :class:`shoal.config.BrokerConfig`)."""
        return cls(snapshot_update_records_per_snapshot=int(config.get(SNAPSHOT_UPDATE_RECORDS_PER_SNAPSHOT, 500)))

    # --- queries (no records) ----------------------------------------------------------

    def get(self, key: SharePartitionKey) -> ShareState | None:
        """The current state of ``key``, or None when it has none."""
        return self._states.get(key)

    def keys(self) -> list[SharePartitionKey]:
        """The keys with state, sorted."""
        return sorted(self._states)

    def update_count(self, key: SharePartitionKey) -> int:
        """ShareUpdate records since the last snapshot of ``key`` (0 when it has none)."""
        return self._update_counts.get(key, 0)

    def last_redundant_offset(self) -> int | None:
        """Records of this partition below the returned offset can be deleted.

        It is the lowest offset of a live key's last snapshot; with no live key it is one
        past the last record replayed. None when ``replay`` was not given offsets.
        """
        if self._next_offset is None:
            return None
        if self._snapshot_offsets:
            return min(self._snapshot_offsets.values())
        return self._next_offset

    def _unknown_partition(self, key: SharePartitionKey) -> Result[PartitionOutcome] | None:
        """UNKNOWN_TOPIC_OR_PARTITION when the metadata has no such topic or partition."""
        if self.partition_count is None:
            return None
        count = self.partition_count(uuid.UUID(str(key.topic_id)))
        if count is None or not 0 <= key.partition < count:
            return _error(ErrorCode.unknown_topic_or_partition, "The topic or partition does not exist.")
        return None

    # --- plain operations ------------------------------------------------------------

    def initialize(self, key: SharePartitionKey, state_epoch: int, start_offset: int,
                   now_ms: int = -1) -> Result[PartitionOutcome]:
        """Set the state epoch and start offset of ``key``, dropping any state batches.

        Returns one ShareSnapshot (leader epoch -1, snapshot epoch one past the current)
        and the resulting state; or no records and INVALID_REQUEST (bad key or start
        offset below -1), FENCED_STATE_EPOCH (``state_epoch`` below the stored one) or
        UNKNOWN_TOPIC_OR_PARTITION (no such topic or partition), in Kafka's order.
        """
        if (msg := _validate_key(key)) is not None:
            return _error(ErrorCode.invalid_request, msg)
        if start_offset < UNINITIALIZED_START_OFFSET:
            return _error(ErrorCode.invalid_request, "start offset below -1")
        current = self._states.get(key)
        if current is not None and current.state_epoch > state_epoch:
            return _error(ErrorCode.fenced_state_epoch)
        if (unknown := self._unknown_partition(key)) is not None:
            return unknown
        state = ShareState(
            state_epoch=state_epoch, leader_epoch=-1, start_offset=start_offset, state_batches=(),
            snapshot_epoch=0 if current is None else current.snapshot_epoch + 1,
            create_timestamp=now_ms, write_timestamp=now_ms,
        )
        return Result(records=[_snapshot_record(key, state)], response=PartitionOutcome(state=state))

    def write(
        self,
        key: SharePartitionKey,
        state_epoch: int,
        leader_epoch: int,
        start_offset: int,
        batches: Iterable[StateBatch],
        delivery_complete_count: int = -1,
        now_ms: int = -1,
    ) -> Result[PartitionOutcome]:
        """Record a leader's change of state for ``key``.

        ``start_offset`` -1 means "unchanged"; so does ``leader_epoch`` -1, which is
        only accepted while the stored leader epoch is -1 (any higher one fences it).
        ``batches`` override the offsets they cover (later ones win within the list).
        ``delivery_complete_count`` (WriteShareGroupState v1) is not stored: the state
        derives it from its batches (see :attr:`ShareState.delivery_complete_count`).

        Returns one record and the state it will produce:

        * a ShareSnapshot when ``state_epoch`` is above the stored one, or when
          ``update_count(key)`` has reached ``snapshot_update_records_per_snapshot``;
        * otherwise a ShareUpdate holding the start offset, leader epoch and the
          (self-combined) batches of this write.

        Errors (no records), in Kafka's order: INVALID_REQUEST for a bad key, start
        offset or batch, and for a key with no state (only ``initialize`` creates state:
        Kafka's WRITE_UNINITIALIZED_SHARE_PARTITION); FENCED_LEADER_EPOCH if
        ``leader_epoch`` is below the stored one; FENCED_STATE_EPOCH if ``state_epoch``
        is below the stored one; UNKNOWN_TOPIC_OR_PARTITION for a topic or partition
        that does not exist.
        """
        batches = tuple(batches)
        if (msg := _validate_key(key) or _validate_batches(batches)) is not None:
            return _error(ErrorCode.invalid_request, msg)
        if start_offset < UNINITIALIZED_START_OFFSET:
            return _error(ErrorCode.invalid_request, "start offset below -1")
        current = self._states.get(key)
        if current is None:
            return _error(ErrorCode.invalid_request, "Write operation on uninitialized share partition not allowed.")
        if current.leader_epoch > leader_epoch:
            return _error(ErrorCode.fenced_leader_epoch)
        if current.state_epoch > state_epoch:
            return _error(ErrorCode.fenced_state_epoch)
        if (unknown := self._unknown_partition(key)) is not None:
            return unknown
        update = {"start_offset": start_offset, "leader_epoch": leader_epoch,
                  "state_batches": _batches_json(batches)}
        merged = _apply_update(current, update)
        if (state_epoch > current.state_epoch
                or self.update_count(key) >= self.snapshot_update_records_per_snapshot):
            state = replace(merged, state_epoch=state_epoch,
                            snapshot_epoch=current.snapshot_epoch + 1, write_timestamp=now_ms)
            return Result(records=[_snapshot_record(key, state)], response=PartitionOutcome(state=state))
        rec = _update_record(key, current.snapshot_epoch, leader_epoch, start_offset,
                             combine_state_batches((), batches, start_offset), merged.delivery_complete_count)
        return Result(records=[rec], response=PartitionOutcome(state=merged))

    def read(self, key: SharePartitionKey, leader_epoch: int = -1, now_ms: int = -1) -> Result[PartitionOutcome]:
        """The state of ``key`` for a share-partition leader that is loading it.

        Returns the state and, when ``leader_epoch`` is above the stored one, one record
        (update or snapshot, by the same rule as ``write``) that stores the new leader
        epoch, so that the previous leader's writes are fenced. Errors (no records):
        INVALID_REQUEST (bad key), UNKNOWN_TOPIC_OR_PARTITION (no state: the partition
        was never initialized, or was deleted), FENCED_LEADER_EPOCH (``leader_epoch`` is
        below the stored one; -1 is never fenced).
        """
        if (msg := _validate_key(key)) is not None:
            return _error(ErrorCode.invalid_request, msg)
        current = self._states.get(key)
        if current is not None and leader_epoch != -1 and leader_epoch < current.leader_epoch:
            return _error(ErrorCode.fenced_leader_epoch)
        if (unknown := self._unknown_partition(key)) is not None:
            return unknown
        if current is None:
            return _error(ErrorCode.unknown_topic_or_partition, "Read operation on uninitialized share partition.")
        if leader_epoch == -1 or leader_epoch == current.leader_epoch:
            return Result(records=[], response=PartitionOutcome(state=current))
        return self.write(key, current.state_epoch, leader_epoch, UNINITIALIZED_START_OFFSET, (), now_ms=now_ms)

    def read_summary(self, key: SharePartitionKey, leader_epoch: int = -1) -> Result[PartitionOutcome]:
        """Start offset, state epoch and leader epoch of ``key`` (admin lag computation).

        Never writes records. Errors: INVALID_REQUEST (bad key), UNKNOWN_TOPIC_OR_PARTITION
        (no state), FENCED_LEADER_EPOCH (``leader_epoch`` given, i.e. not -1, and below
        the stored one).
        """
        if (msg := _validate_key(key)) is not None:
            return _error(ErrorCode.invalid_request, msg)
        current = self._states.get(key)
        if current is not None and leader_epoch != -1 and leader_epoch < current.leader_epoch:
            return _error(ErrorCode.fenced_leader_epoch)
        if (unknown := self._unknown_partition(key)) is not None:
            return unknown
        if current is None:
            return _error(ErrorCode.unknown_topic_or_partition, "Read operation on uninitialized share partition.")
        return Result(records=[], response=PartitionOutcome(state=current))

    def delete(self, key: SharePartitionKey) -> Result[PartitionOutcome]:
        """Forget ``key``.

        Returns tombstones for its ShareSnapshot and ShareUpdate record keys when it has
        state, no records when it has none (deleting nothing succeeds), and
        INVALID_REQUEST for a bad key.
        """
        if (msg := _validate_key(key)) is not None:
            return _error(ErrorCode.invalid_request, msg)
        if key not in self._states:
            return Result(records=[], response=PartitionOutcome())
        return Result(records=[
            tombstone(ShareStateRecordType.SHARE_SNAPSHOT, key.record_key(), SHARE_GROUP_STATE),
            tombstone(ShareStateRecordType.SHARE_UPDATE, key.record_key(), SHARE_GROUP_STATE),
        ], response=PartitionOutcome())

    # --- replay ---------------------------------------------------------------------------

    def replay(self, rec: CoordinatorRecord, offset: int | None = None) -> None:
        """Apply one durable record of this partition (live, or at start-up in log order).

        ``offset`` is the record's offset in ``__share_group_state``; give it to make
        :meth:`last_redundant_offset` available. A snapshot replaces the key's state; an
        update merges into it (an update for a key without state, or carrying another
        snapshot epoch, is stale and ignored); a tombstone of either type removes the key.
        Raises ValueError for a record type this topic does not have.
        """
        if offset is not None:
            self._next_offset = max(self._next_offset or 0, offset + 1)
        key = SharePartitionKey.from_record_key(rec.key)
        if rec.record_type not in (ShareStateRecordType.SHARE_SNAPSHOT, ShareStateRecordType.SHARE_UPDATE):
            raise ValueError(f"unknown __share_group_state record type {rec.record_type}")
        value = rec.value
        if value is None:
            self._states.pop(key, None)
            self._update_counts.pop(key, None)
            self._snapshot_offsets.pop(key, None)
            return
        if rec.record_type == ShareStateRecordType.SHARE_SNAPSHOT:
            self._states[key] = ShareState(
                state_epoch=int(value["state_epoch"]),
                leader_epoch=int(value["leader_epoch"]),
                start_offset=int(value["start_offset"]),
                state_batches=tuple(StateBatch.from_json(b) for b in value.get("state_batches", ())),
                snapshot_epoch=int(value.get("snapshot_epoch", 0)),
                create_timestamp=int(value.get("create_timestamp", -1)),
                write_timestamp=int(value.get("write_timestamp", -1)),
            )
            self._update_counts[key] = 0
            if offset is not None:
                self._snapshot_offsets[key] = offset
            return
        current = self._states.get(key)
        if current is None or int(value.get("snapshot_epoch", current.snapshot_epoch)) != current.snapshot_epoch:
            return
        self._states[key] = _apply_update(current, value)
        self._update_counts[key] = self._update_counts.get(key, 0) + 1

    # --- wire handlers -------------------------------------------------------------------
    #
    # A request may name several partitions. Each is answered against the state as the
    # records of the partitions before it in the same request leave it (a scratch copy
    # replays them), so naming one key twice behaves like two requests in a row.

    def _scratch(self) -> ShareCoordinatorShard:
        s = ShareCoordinatorShard(snapshot_update_records_per_snapshot=self.snapshot_update_records_per_snapshot,
                                  partition_count=self.partition_count)
        s._states = dict(self._states)
        s._update_counts = dict(self._update_counts)
        return s

    def _each_partition(self, request: Any, operate: Callable[[ShareCoordinatorShard, SharePartitionKey, Any],
                                                             Result[PartitionOutcome]],
                        answer: Callable[[Any, PartitionOutcome], Any], topic_result: type,
                        ) -> tuple[list[CoordinatorRecord], tuple[Any, ...]]:
        """Run ``operate(scratch, key, partition)`` for every partition the request names.

        The partitions run in request order against one scratch copy that replays each
        one's records. Returns the records to append and the per-topic
        results (``topic_result`` of ``answer(partition, outcome)`` per partition).
        """
        scratch = self._scratch()
        records: list[CoordinatorRecord] = []
        results = []
        for topic in request.topics:
            parts = []
            for p in topic.partitions:
                r = operate(scratch, SharePartitionKey.of(request.group_id, topic.topic_id, p.partition), p)
                _take(scratch, r, records)
                assert r.response is not None
                parts.append(answer(p, r.response))
            results.append(topic_result(topic_id=topic.topic_id, partitions=tuple(parts)))
        return records, tuple(results)

    def handle_initialize_share_group_state(
        self, request: InitializeShareGroupStateRequest
    ) -> Result[InitializeShareGroupStateResponse]:
        """InitializeShareGroupState v0: one ``initialize`` per partition."""
        records, results = self._each_partition(
            request, lambda s, key, p: s.initialize(key, int(p.state_epoch), int(p.start_offset)),
            lambda p, o: InitializePartitionResult(partition=p.partition, error_code=o.error_code,
                                                   error_message=o.error_message),
            InitializeStateResult)
        return Result(records=records, response=InitializeShareGroupStateResponse(results=results))

    def handle_write_share_group_state(
        self, request: WriteShareGroupStateRequest
    ) -> Result[WriteShareGroupStateResponse]:
        """WriteShareGroupState v1: one ``write`` per partition."""
        def write(s: ShareCoordinatorShard, key: SharePartitionKey, p: Any) -> Result[PartitionOutcome]:
            batches = tuple(StateBatch(int(b.first_offset), int(b.last_offset), int(b.delivery_state),
                                       int(b.delivery_count)) for b in p.state_batches)
            return s.write(key, int(p.state_epoch), int(p.leader_epoch), int(p.start_offset), batches,
                           int(p.delivery_complete_count))

        records, results = self._each_partition(
            request, write,
            lambda p, o: WritePartitionResult(partition=p.partition, error_code=o.error_code,
                                              error_message=o.error_message),
            WriteStateResult)
        return Result(records=records, response=WriteShareGroupStateResponse(results=results))

    def handle_read_share_group_state(
        self, request: ReadShareGroupStateRequest
    ) -> Result[ReadShareGroupStateResponse]:
        """ReadShareGroupState v0: one ``read`` per partition (may record leader epochs)."""
        def answer(p: Any, o: PartitionOutcome) -> ReadPartitionResult:
            st = o.state if o.ok else None
            return ReadPartitionResult(
                partition=p.partition, error_code=o.error_code, error_message=o.error_message,
                state_epoch=i32(st.state_epoch if st else 0),
                start_offset=i64(st.start_offset if st else UNINITIALIZED_START_OFFSET),
                state_batches=tuple(
                    ReadStateBatch(first_offset=i64(b.first_offset), last_offset=i64(b.last_offset),
                                   delivery_state=i8(b.delivery_state), delivery_count=i16(b.delivery_count))
                    for b in (st.state_batches if st else ())),
            )

        records, results = self._each_partition(request, lambda s, key, p: s.read(key, int(p.leader_epoch)), answer,
                                 ReadStateResult)
        return Result(records=records, response=ReadShareGroupStateResponse(results=results))

    def handle_read_share_group_state_summary(
        self, request: ReadShareGroupStateSummaryRequest
    ) -> Result[ReadShareGroupStateSummaryResponse]:
        """ReadShareGroupStateSummary v1: one ``read_summary`` per partition; no records."""
        def answer(p: Any, o: PartitionOutcome) -> SummaryPartitionResult:
            st = o.state if o.ok else None
            return SummaryPartitionResult(
                partition=p.partition, error_code=o.error_code, error_message=o.error_message,
                state_epoch=i32(st.state_epoch if st else 0),
                leader_epoch=i32(st.leader_epoch if st else -1),
                start_offset=i64(st.start_offset if st else UNINITIALIZED_START_OFFSET),
                delivery_complete_count=i32(st.delivery_complete_count if st else -1),
            )

        records, results = self._each_partition(request, lambda s, key, p: s.read_summary(key, int(p.leader_epoch)), answer,
                                 ReadStateSummaryResult)
        return Result(records=records, response=ReadShareGroupStateSummaryResponse(results=results))

    def handle_delete_share_group_state(
        self, request: DeleteShareGroupStateRequest
    ) -> Result[DeleteShareGroupStateResponse]:
        """DeleteShareGroupState v0: one ``delete`` per partition."""
        records, results = self._each_partition(
            request, lambda s, key, p: s.delete(key),
            lambda p, o: DeletePartitionResult(partition=p.partition, error_code=o.error_code,
                                               error_message=o.error_message),
            DeleteStateResult)
        return Result(records=records, response=DeleteShareGroupStateResponse(results=results))


def _take(scratch: ShareCoordinatorShard, r: Result[PartitionOutcome], records: list[CoordinatorRecord]) -> None:
    for rec in r.records:
        scratch.replay(rec)
        records.append(rec)
