"""Record states of a share-partition and the moves allowed between them (KIP-932).

Theory of operation
-------------------
Every offset between the share-partition start offset (SPSO) and end offset (SPEO) is
in one of four states, with Kafka's persisted ids:

* ``AVAILABLE`` (0): may be acquired by the next fetch.
* ``ACQUIRED`` (1): handed to one member under an acquisition lock; never persisted as
  such (it is written as AVAILABLE with its delivery count).
* ``ACKNOWLEDGED`` (2): processed; terminal.
* ``ARCHIVED`` (4): rejected, a gap (no record at the offset), or past the delivery
  count limit; terminal.

The only moves are those in :data:`TRANSITIONS`.  ACKNOWLEDGED and ARCHIVED are
terminal: once there, a record is never delivered again and only waits for the SPSO to
pass it.  AVAILABLE may also go straight to ARCHIVED, when a record that already reached
the delivery count limit would be acquired again (after a restart, or when the limit
was lowered) or when a fetch shows that an offset holds no record.

Acknowledge types are the numbers of ShareAcknowledge/ShareFetch ``acknowledge_types``
(0 gap, 1 accept, 2 release, 3 reject, 4 renew).  This module knows nothing about
offsets, members or time.
"""

from __future__ import annotations

import enum

__all__ = [
    "TERMINAL_STATES",
    "TRANSITIONS",
    "AcknowledgeType",
    "AcquireMode",
    "RecordState",
    "can_transition",
]


class RecordState(enum.IntEnum):
    """State of one in-flight record; values are the ids persisted in share-group state."""

    AVAILABLE = 0
    ACQUIRED = 1
    ACKNOWLEDGED = 2
    ARCHIVED = 4


class AcknowledgeType(enum.IntEnum):
    """``acknowledge_types`` values of ShareAcknowledge v2 / ShareFetch v2."""

    GAP = 0
    ACCEPT = 1
    RELEASE = 2
    REJECT = 3
    RENEW = 4


class AcquireMode(enum.IntEnum):
    """ShareFetch v2 ``share_acquire_mode``."""

    BATCH_OPTIMIZED = 0
    """``max_records`` is a soft limit: whole batches are acquired."""
    RECORD_LIMIT = 1
    """Never acquire more than ``max_records`` records, splitting a batch if needed."""


TRANSITIONS: dict[RecordState, frozenset[RecordState]] = {
    RecordState.AVAILABLE: frozenset({RecordState.ACQUIRED, RecordState.ARCHIVED}),
    RecordState.ACQUIRED: frozenset({RecordState.AVAILABLE, RecordState.ACKNOWLEDGED, RecordState.ARCHIVED}),
    RecordState.ACKNOWLEDGED: frozenset(),
    RecordState.ARCHIVED: frozenset(),
}
"""Allowed moves: state -> states it may become."""

TERMINAL_STATES = frozenset({RecordState.ACKNOWLEDGED, RecordState.ARCHIVED})


def can_transition(current: RecordState, new: RecordState) -> bool:
    """True if a record in ``current`` may move to ``new``."""
    return new in TRANSITIONS[current]
