"""Share sessions: which share-partitions a member fetches from, and in what order.

Theory of operation
-------------------
KIP-932's ShareFetch works like incremental Fetch: a consumer keeps one *share
session* per broker, keyed by ``(group_id, member_id)``, holding a set of
share-partitions ``(topic_id, partition)``. Each request carries
``share_session_epoch``:

* ``0`` opens a session with the partitions the request names. An existing session of
  the same member is replaced; the outcome lists its partitions in ``replaced``. As in
  Kafka, the member keeps the records it acquired in partitions the new session names
  (it may acknowledge them); the shell releases those of partitions it no longer names.
* ``-1`` closes the session (the request may still acknowledge; it fetches nothing).
* any other value must equal the session's expected epoch; it adds the partitions the
  request names (``topics``) and removes ``forgotten_topics_data``. The expected epoch
  then advances by one, wrapping from 2**31-1 to 1 (0 and -1 are reserved).

ShareAcknowledge uses the same epochs, except that it may not open a session (epoch 0
is INVALID_SHARE_SESSION_EPOCH) and it never changes the partition set.

Errors (from kio's ErrorCode; the cache is unchanged when one is returned):
SHARE_SESSION_NOT_FOUND (no session for a non-zero epoch), INVALID_SHARE_SESSION_EPOCH
(wrong epoch), SHARE_SESSION_LIMIT_REACHED (opening a session while
``group.share.max.share.sessions`` sessions exist; replacing one's own session never
hits the limit).

Each session remembers the connection it was last used on; :meth:`disconnect` closes
the sessions of a connection and returns their members, whose acquired records the
shell must release. :meth:`remove_member` does the same for a member that left the
group or was fenced.

Partition order: a session keeps its partitions in insertion order and a cursor;
:meth:`ShareSessionCache.rotate` returns them starting at the cursor and advances it,
so with a response size limit no partition is always served last.

What it does not know: the group's membership and assignment (the group coordinator
decides whether a member may fetch), records, time (sessions have no timeout of their
own; they end with the connection or the member). Event-loop only; never awaits.
"""

from __future__ import annotations

import uuid
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from kio.schema.errors import ErrorCode

__all__ = [
    "FINAL_EPOCH",
    "INITIAL_EPOCH",
    "MAX_SHARE_SESSION_CACHE_SLOTS",
    "SessionKey",
    "SessionOutcome",
    "SharePartition",
    "ShareSession",
    "ShareSessionCache",
    "next_epoch",
    "rotate",
]

INITIAL_EPOCH = 0
FINAL_EPOCH = -1
_MAX_EPOCH = (1 << 31) - 1
MAX_SHARE_SESSION_CACHE_SLOTS = "group.share.max.share.sessions"

SharePartition = tuple[str, int]
"""``(topic_id, partition)``; ``topic_id`` is ``str(uuid.UUID)``."""
SessionKey = tuple[str, str]
"""``(group_id, member_id)``."""

T = TypeVar("T")


def next_epoch(epoch: int) -> int:
    """The epoch expected after a request with ``epoch`` (-1 stays -1; 2**31-1 wraps to 1)."""
    if epoch < 0:
        return FINAL_EPOCH
    return 1 if epoch >= _MAX_EPOCH else epoch + 1


def rotate(items: Sequence[T], start: int) -> list[T]:
    """``items`` starting at ``start % len(items)``, wrapping around ([] for no items)."""
    if not items:
        return []
    k = start % len(items)
    return list(items[k:]) + list(items[:k])


@dataclass(slots=True)
class ShareSession:
    """One member's share session. Mutated only by :class:`ShareSessionCache`."""

    group_id: str
    member_id: str
    epoch: int
    """The epoch the next request must carry."""
    partitions: dict[SharePartition, None] = field(default_factory=dict)
    """The session's share-partitions, in the order they were added (a dict as an ordered set)."""
    connection_id: Hashable | None = None
    """The connection the session was last used on."""
    cursor: int = 0
    """Where the next :meth:`ShareSessionCache.rotate` starts."""

    @property
    def key(self) -> SessionKey:
        return (self.group_id, self.member_id)


@dataclass(frozen=True, slots=True)
class SessionOutcome:
    """What a ShareFetch/ShareAcknowledge did to the session cache.

    On error only ``error_code`` (and ``replaced=()``) is meaningful and nothing changed.
    On success:

    * ``partitions``: the session's share-partitions after the request, in rotated
      fetch order (empty when the session was closed);
    * ``added``/``forgotten``: partitions this request added to or removed from the
      session (the shell may release the member's acquired records of ``forgotten``);
    * ``replaced``: for epoch 0 over an existing session, the old session's partitions
      (release the member's acquired records in those not in ``added``); else ();
    * ``closed``: epoch -1 closed the session (release the member's acquired records);
    * ``next_epoch``: the epoch the member's next request must carry (-1 once closed).
    """

    error_code: ErrorCode = ErrorCode.none
    partitions: tuple[SharePartition, ...] = ()
    added: tuple[SharePartition, ...] = ()
    forgotten: tuple[SharePartition, ...] = ()
    replaced: tuple[SharePartition, ...] = ()
    closed: bool = False
    next_epoch: int = FINAL_EPOCH

    @property
    def ok(self) -> bool:
        return self.error_code == ErrorCode.none


def _fail(code: ErrorCode) -> SessionOutcome:
    return SessionOutcome(error_code=code)


def _sp(topic_id: str | uuid.UUID | None, partition: int) -> SharePartition:
    return ("" if topic_id is None else str(topic_id), int(partition))


class ShareSessionCache:
    """All share sessions of the broker. See module docstring. Event-loop only."""

    def __init__(self, max_slots: int = 1000) -> None:
        if max_slots < 0:
            raise ValueError("max_slots must be >= 0")
        self.max_slots = max_slots
        self._sessions: dict[SessionKey, ShareSession] = {}
        self._by_connection: dict[Hashable, set[SessionKey]] = {}
        """connection id -> keys of the sessions last used on it."""

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> ShareSessionCache:
        return cls(int(config.get(MAX_SHARE_SESSION_CACHE_SLOTS, 2000)))

    # --- queries --------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._sessions)

    def get(self, group_id: str, member_id: str) -> ShareSession | None:
        """The session of the member, or None."""
        return self._sessions.get((group_id, member_id))

    def sessions_of(self, connection_id: Hashable) -> list[SessionKey]:
        """Keys of the sessions last used on ``connection_id``, sorted."""
        return sorted(self._by_connection.get(connection_id, ()))

    # --- requests -------------------------------------------------------------------

    def share_fetch(
        self,
        group_id: str,
        member_id: str,
        epoch: int,
        *,
        add: Iterable[SharePartition] = (),
        forget: Iterable[SharePartition] = (),
        connection_id: Hashable | None = None,
    ) -> SessionOutcome:
        """Apply the session part of a ShareFetch request. See :class:`SessionOutcome`.

        ``add`` are the request's ``topics`` partitions, ``forget`` its
        ``forgotten_topics_data``. Epoch 0 ignores ``forget`` (a new session starts from
        ``add`` only); epoch -1 ignores both.
        """
        key = (group_id, member_id)
        current = self._sessions.get(key)
        if epoch == INITIAL_EPOCH:
            if current is None and len(self._sessions) >= self.max_slots:
                return _fail(ErrorCode.share_session_limit_reached)
            replaced: tuple[SharePartition, ...] = ()
            if current is not None:
                replaced = tuple(current.partitions)
                self._drop(current)
            session = ShareSession(group_id, member_id, next_epoch(epoch), dict.fromkeys(add),
                                   connection_id)
            self._sessions[key] = session
            self._attach(session, connection_id)
            return SessionOutcome(partitions=tuple(self._rotate(session)), added=tuple(session.partitions),
                                  replaced=replaced, next_epoch=session.epoch)
        if current is None:
            return _fail(ErrorCode.share_session_not_found)
        if epoch == FINAL_EPOCH:
            self._drop(current)
            return SessionOutcome(closed=True, next_epoch=FINAL_EPOCH)
        if epoch != current.epoch:
            return _fail(ErrorCode.invalid_share_session_epoch)
        added = []
        for sp in add:
            if sp not in current.partitions:
                current.partitions[sp] = None
                added.append(sp)
        forgotten = []
        for sp in forget:
            if sp in current.partitions:
                del current.partitions[sp]
                forgotten.append(sp)
        current.epoch = next_epoch(epoch)
        self._attach(current, connection_id)
        return SessionOutcome(partitions=tuple(self._rotate(current)), added=tuple(added),
                              forgotten=tuple(forgotten), next_epoch=current.epoch)

    def share_acknowledge(
        self, group_id: str, member_id: str, epoch: int, *, connection_id: Hashable | None = None
    ) -> SessionOutcome:
        """Apply the session part of a ShareAcknowledge request.

        Epoch 0 is INVALID_SHARE_SESSION_EPOCH (acknowledging cannot open a session); -1
        closes the session (``closed=True``); otherwise the epoch must match and advances.
        ``partitions`` is the session's set (not rotated); the partition set never changes.
        """
        current = self._sessions.get((group_id, member_id))
        if epoch == INITIAL_EPOCH:
            return _fail(ErrorCode.invalid_share_session_epoch)
        if current is None:
            return _fail(ErrorCode.share_session_not_found)
        if epoch == FINAL_EPOCH:
            self._drop(current)
            return SessionOutcome(closed=True, next_epoch=FINAL_EPOCH)
        if epoch != current.epoch:
            return _fail(ErrorCode.invalid_share_session_epoch)
        current.epoch = next_epoch(epoch)
        self._attach(current, connection_id)
        return SessionOutcome(partitions=tuple(current.partitions), next_epoch=current.epoch)

    def handle_share_fetch(self, request: Any, connection_id: Hashable | None = None) -> SessionOutcome:
        """:meth:`share_fetch` from a kio ShareFetchRequest (v1/v2)."""
        add = [_sp(t.topic_id, p.partition_index) for t in request.topics for p in t.partitions]
        forget = [_sp(t.topic_id, p) for t in request.forgotten_topics_data for p in t.partitions]
        return self.share_fetch(request.group_id or "", request.member_id or "", int(request.share_session_epoch),
                                add=add, forget=forget, connection_id=connection_id)

    def handle_share_acknowledge(self, request: Any, connection_id: Hashable | None = None) -> SessionOutcome:
        """:meth:`share_acknowledge` from a kio ShareAcknowledgeRequest (v1/v2)."""
        return self.share_acknowledge(request.group_id or "", request.member_id or "",
                                      int(request.share_session_epoch), connection_id=connection_id)

    # --- ordering -------------------------------------------------------------------

    def rotate(self, group_id: str, member_id: str) -> list[SharePartition]:
        """The member's partitions starting at its cursor; advances the cursor by one.

        Returns [] when the member has no session.
        """
        session = self._sessions.get((group_id, member_id))
        return [] if session is None else self._rotate(session)

    @staticmethod
    def _rotate(session: ShareSession) -> list[SharePartition]:
        order = rotate(list(session.partitions), session.cursor)
        session.cursor = (session.cursor + 1) % max(1, len(session.partitions))
        return order

    # --- endings --------------------------------------------------------------------

    def disconnect(self, connection_id: Hashable) -> list[SessionKey]:
        """Close the sessions last used on ``connection_id``.

        Returns their ``(group_id, member_id)`` keys, sorted: the shell releases those
        members' acquired records. [] when the connection had none.
        """
        keys = sorted(self._by_connection.pop(connection_id, ()))
        for key in keys:
            session = self._sessions.pop(key, None)
            if session is not None:
                session.connection_id = None
        return keys

    def remove_member(self, group_id: str, member_id: str) -> ShareSession | None:
        """Close the member's session (it left the group or was fenced).

        Returns the removed session (its ``partitions`` say where to release the
        member's records), or None when it had none.
        """
        session = self._sessions.get((group_id, member_id))
        if session is not None:
            self._drop(session)
        return session

    # --- internals ------------------------------------------------------------------

    def _attach(self, session: ShareSession, connection_id: Hashable | None) -> None:
        if connection_id is None or session.connection_id == connection_id and \
                session.key in self._by_connection.get(connection_id, ()):
            return
        self._detach(session)
        session.connection_id = connection_id
        self._by_connection.setdefault(connection_id, set()).add(session.key)

    def _detach(self, session: ShareSession) -> None:
        cid = session.connection_id
        if cid is None:
            return
        keys = self._by_connection.get(cid)
        if keys is not None:
            keys.discard(session.key)
            if not keys:
                del self._by_connection[cid]

    def _drop(self, session: ShareSession) -> None:
        self._detach(session)
        self._sessions.pop(session.key, None)
