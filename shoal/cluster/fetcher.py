"""A follower's fetcher: one connection to one leader broker, many partitions per Fetch.

Theory of operation
-------------------
The replica manager adds a partition when this broker becomes its follower under a new
leader epoch, and removes it when that changes again. The fetcher's loop:

1. (re)connects to the leader;
2. for every partition marked for truncation (new to this fetcher, or its leader epoch
   changed) sends OffsetsForLeaderEpoch (v4, replica id set) with the follower's latest
   epoch and cuts the divergent tail the leader does not have (KIP-101/279);
3. sends one Fetch (v12, replica id set, current leader epoch per partition) for every
   partition, waits at most ``replica.fetch.wait.max.ms`` at the leader, appends what comes
   back through the replica manager and repeats. The fsync the flush policy asks for runs
   in the background, one pass at a time per fetcher and at least ``FLUSH_GAP_S`` after
   the previous pass ended, and the loop never waits for it: rounds fetched meanwhile
   are covered by the next pass. The leader may count a follower's records before they
   are on the follower's disk (they are in its page cache, so a killed process loses
   nothing; Kafka's followers do not fsync by default).

A partition whose fetch offset is below the leader's log start (a new replica of a
partition whose old records were deleted) starts again with an empty log at the leader's
log start. A partition that gets NOT_LEADER_OR_FOLLOWER or a leader-epoch error pauses for
``replica.fetch.backoff.ms`` (new metadata moves it meanwhile if leadership changed), then
truncates again; a broken connection backs off as long.
Concurrency: one task per fetcher, on the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import ErrorCode
from ..protocol.codec import codec_for
from ..protocol.entities import make, sub
from ..protocol.fetch_request import write_fetch_request_v12
from ..protocol.fetch_response import read_fetch_response_v12
from .peer import PeerConnection

if TYPE_CHECKING:
    from .replica_manager import ReplicaManager

log = logging.getLogger("shoal.cluster.fetcher")

FETCH, OFFSETS_FOR_LEADER_EPOCH = 1, 23
FETCH_VERSION, OFFSETS_VERSION = 12, 4
FLUSH_GAP_S = 0.1
"""The pause between the end of a follower's fsync pass and the start of the next: fewer,
larger passes cost the brokers less CPU per replicated megabyte. A much longer pause makes
each pass a burst of writes on the disk the leaders' own fsyncs (which acks=all answers
wait for) share: at 250 ms the slowest acks=all answers took longer than with no pause
(docs/PERFORMANCE.md). A machine crash can take from a follower up to this long plus one
pass of what it had fetched; a killed process loses nothing of it."""


@dataclass(slots=True)
class FetchState:
    leader_epoch: int
    fetch_offset: int
    needs_truncation: bool = True
    retry_at: float = 0.0
    """After an error, the loop time before which the partition is not fetched."""


class Fetcher:
    def __init__(self, manager: ReplicaManager, leader_id: int, host: str, port: int) -> None:
        self.manager = manager
        self.leader_id = leader_id
        self.host, self.port = host, port
        self.partitions: dict[tuple[str, int], FetchState] = {}
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._conn = PeerConnection(host, port, f"shoal-replica-{manager.node_id}",
                                    getattr(getattr(manager, "broker", None), "peer_security", None))
        self._flushing: asyncio.Future[None] | None = None
        self._dirty: set[tuple[str, int]] = set()
        self.closed = False

    # -- membership -------------------------------------------------------------------
    def add(self, key: tuple[str, int], leader_epoch: int, fetch_offset: int) -> None:
        self.partitions[key] = FetchState(leader_epoch, fetch_offset)
        self._wake.set()
        if self._task is None:
            self._task = asyncio.ensure_future(self._run())

    def remove(self, key: tuple[str, int]) -> None:
        self.partitions.pop(key, None)

    async def close(self) -> None:
        self.closed = True
        self._wake.set()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task
        self._disconnect()

    def _disconnect(self) -> None:
        self._conn.close()

    # -- the loop ---------------------------------------------------------------------
    async def _run(self) -> None:
        backoff = self.manager.config["replica.fetch.backoff.ms"] / 1000
        loop = asyncio.get_running_loop()
        while not self.closed:
            now = loop.time()
            active = {k: s for k, s in self.partitions.items() if s.retry_at <= now}
            if not active:
                self._wake.clear()
                later = [s.retry_at for s in self.partitions.values()]
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), max(0.01, min(later) - now) if later else None)
                continue
            try:
                await self._conn.connect()
                trunc = {k: s for k, s in active.items() if s.needs_truncation}
                if trunc:
                    await self._truncate(trunc)
                    continue
                await self._fetch(active)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # connection refused/reset, a bad frame: reconnect after a pause
                if not self.closed:
                    log.info("fetcher for leader %d: %s; retrying", self.leader_id, e)
                self._disconnect()
                await asyncio.sleep(backoff)

    async def _call(self, api_key: int, version: int, request: Any) -> Any:
        return await self._conn.call(api_key, version, request)

    async def _truncate(self, parts: dict[tuple[str, int], FetchState]) -> None:
        codec = codec_for(OFFSETS_FOR_LEADER_EPOCH, OFFSETS_VERSION)
        assert codec is not None
        req_cls = codec.request_type
        tcls, pcls = sub(req_cls, "OffsetForLeaderTopic"), sub(req_cls, "OffsetForLeaderPartition")
        by_topic: dict[str, list[Any]] = {}
        asked: dict[tuple[str, int], int] = {}
        for (topic, index), st in parts.items():
            latest = self.manager.latest_epoch(topic, index)
            asked[(topic, index)] = latest
            by_topic.setdefault(topic, []).append(
                make(pcls, partition=index, current_leader_epoch=st.leader_epoch, leader_epoch=max(latest, 0)))
        request = make(req_cls, replica_id=self.manager.node_id,
                       topics=tuple(make(tcls, topic=t, partitions=tuple(ps)) for t, ps in by_topic.items()))
        response = await self._call(OFFSETS_FOR_LEADER_EPOCH, OFFSETS_VERSION, request)
        for t in response.topics:
            for p in t.partitions:
                key = (t.topic, p.partition)
                st = self.partitions.get(key)
                if st is None or key not in parts or st is not parts[key]:
                    continue  # re-added meanwhile: ask again
                if p.error_code != ErrorCode.none:
                    self._on_error(key, st, p.error_code)
                    continue
                leo = self.manager.truncate_follower(key, asked[key], p.leader_epoch, p.end_offset)
                st.fetch_offset = leo
                st.needs_truncation = False

    async def _fetch(self, parts: dict[tuple[str, int], FetchState]) -> None:
        cfg = self.manager.config
        by_topic: dict[str, list[tuple[int, int, int, int]]] = {}
        max_part = cfg["replica.fetch.max.bytes"]
        for (topic, index), st in parts.items():
            by_topic.setdefault(topic, []).append((index, st.leader_epoch, st.fetch_offset, max_part))
        body = write_fetch_request_v12(self.manager.node_id, cfg["replica.fetch.wait.max.ms"], 1,
                                       cfg["fetch.max.bytes"], by_topic.items())
        # records are views of the connection's buffer: appended before the next call
        error_code, fetched = read_fetch_response_v12(await self._conn.call_body(FETCH, FETCH_VERSION, body))
        if error_code != ErrorCode.none:
            raise ConnectionError(f"fetch failed: {ErrorCode(error_code).name}")
        appended = []
        for p in fetched:
            key = (p.topic, p.partition_index)
            st = self.partitions.get(key)
            if st is None or st is not parts.get(key) or st.needs_truncation:
                continue
            if p.error_code == ErrorCode.offset_out_of_range and p.log_start_offset > st.fetch_offset:
                leo = self.manager.restart_follower_at(key, p.log_start_offset)
                if leo is not None:
                    st.fetch_offset = leo
                    continue
            if p.error_code != ErrorCode.none:
                self._on_error(key, st, p.error_code)
                continue
            new_leo = self.manager.append_follower(key, p.records or b"", p.high_watermark, p.log_start_offset)
            if new_leo is None:
                st.needs_truncation = True
                continue
            if new_leo != st.fetch_offset:
                appended.append(key)
            st.fetch_offset = new_leo
        if appended:
            self._dirty.update(appended)
            if self._flushing is None:
                self._flushing = asyncio.ensure_future(self._flush_dirty())

    async def _flush_dirty(self) -> None:
        """fsync the partitions appended to, in the background, one pass at a time, each
        pass at least ``FLUSH_GAP_S`` after the previous one ended.

        The fetch loop never waits for it: rounds fetched while a pass runs or during the
        gap are covered by the next pass, so under load one fsync covers many rounds and
        a slow fsync does not hold back the followers' progress.
        """
        try:
            while self._dirty and not self.closed:
                keys, self._dirty = list(self._dirty), set()
                await self.manager.flush_followers(keys)
                await asyncio.sleep(FLUSH_GAP_S)
        finally:
            self._flushing = None

    def _on_error(self, key: tuple[str, int], st: FetchState, code: int) -> None:
        if code == ErrorCode.offset_out_of_range:
            st.needs_truncation = True
            return
        # not (yet, or no longer) the leader at our epoch: retry after a pause; new metadata
        # moves the partition to another fetcher meanwhile if leadership changed
        log.info("fetch of %s-%d from leader %d: %s", key[0], key[1], self.leader_id, ErrorCode(code).name)
        st.retry_at = asyncio.get_running_loop().time() + self.manager.config["replica.fetch.backoff.ms"] / 1000
        st.needs_truncation = True
        self.manager.node.store.mark_stale()
