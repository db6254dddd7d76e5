"""Incremental fetch sessions (KIP-227), as a pure cache.

Theory of operation
-------------------
A consumer opens a session with ``session_id=0, session_epoch=0``: the partitions of
that request become the session's, and the response carries a new session id. Later
requests name the session and the next epoch, and list only partitions whose fetch
position changed (added or updated) plus those to forget; partitions not mentioned
keep their last fetch offset. A response to an incremental request lists only the
partitions with something new: records, an error, or a changed high watermark or log
start offset. ``session_epoch=-1`` closes the session (with ``session_id`` 0, the
request is a plain full fetch without a session).

Errors: FETCH_SESSION_ID_NOT_FOUND for an unknown id, INVALID_FETCH_SESSION_EPOCH for
a wrong epoch. Over ``max.incremental.fetch.session.cache.slots`` sessions, the least
recently used is evicted.

Pure: the caller passes ``now_ms`` and owns the partitions' data.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from kio.schema.errors import ErrorCode

__all__ = ["FetchSession", "FetchSessionCache", "FetchSessionError", "SessionPartition"]

PartitionKey = tuple[str, int]  # (topic name, partition)


class FetchSessionError(Exception):
    def __init__(self, error_code: ErrorCode) -> None:
        super().__init__(error_code.name)
        self.error_code = error_code


@dataclass(slots=True)
class SessionPartition:
    fetch_offset: int
    max_bytes: int
    high_watermark: int = -1
    log_start_offset: int = -1


@dataclass(slots=True)
class FetchSession:
    session_id: int
    epoch: int
    partitions: dict[PartitionKey, SessionPartition] = field(default_factory=dict)
    last_used_ms: int = 0

    def must_send(self, key: PartitionKey, high_watermark: int, log_start_offset: int, has_data: bool,
                  has_error: bool) -> bool:
        """Whether an incremental response includes ``key``; records what was sent."""
        sp = self.partitions[key]
        changed = has_data or has_error or sp.high_watermark != high_watermark or (
            sp.log_start_offset != log_start_offset
        )
        if changed:
            sp.high_watermark = high_watermark
            sp.log_start_offset = log_start_offset
        return changed


class FetchSessionCache:
    def __init__(self, max_slots: int) -> None:
        self._sessions: OrderedDict[int, FetchSession] = OrderedDict()
        self._max = max_slots
        self._next_id = 1

    def __len__(self) -> int:
        return len(self._sessions)

    def resolve(
        self,
        session_id: int,
        epoch: int,
        updates: dict[PartitionKey, SessionPartition],
        forgotten: list[PartitionKey],
        now_ms: int,
    ) -> tuple[FetchSession | None, bool]:
        """Apply a request to the cache.

        Returns (session, incremental): ``session`` is None for a sessionless full fetch
        (no session could or should be kept); ``incremental`` says whether the response
        may omit unchanged partitions. Raises FetchSessionError.
        """
        if session_id == 0:
            if epoch == -1 or self._max == 0:
                return None, False
            if epoch != 0:
                raise FetchSessionError(ErrorCode.invalid_fetch_session_epoch)
            if len(self._sessions) >= self._max:
                self._sessions.popitem(last=False)
            sid = self._allocate_id()
            created = FetchSession(sid, 1, dict(updates), now_ms)
            self._sessions[sid] = created
            return created, False
        session = self._sessions.get(session_id)
        if session is None:
            raise FetchSessionError(ErrorCode.fetch_session_id_not_found)
        if epoch == -1:
            del self._sessions[session_id]
            return None, False
        if epoch != session.epoch:
            raise FetchSessionError(ErrorCode.invalid_fetch_session_epoch)
        session.epoch = epoch + 1 if epoch < 2**31 - 1 else 1
        for key in forgotten:
            session.partitions.pop(key, None)
        for key, sp in updates.items():
            old = session.partitions.get(key)
            if old is not None:
                old.fetch_offset = sp.fetch_offset
                old.max_bytes = sp.max_bytes
            else:
                session.partitions[key] = sp
        session.last_used_ms = now_ms
        self._sessions.move_to_end(session_id)
        return session, True

    def remove_topic(self, topic: str) -> None:
        for s in self._sessions.values():
            for key in [k for k in s.partitions if k[0] == topic]:
                del s.partitions[key]

    def _allocate_id(self) -> int:
        while True:
            sid = self._next_id
            self._next_id = self._next_id + 1 if self._next_id < 2**31 - 1 else 1
            if sid not in self._sessions:
                return sid
