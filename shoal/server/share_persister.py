"""The share-state persister's network half: share-state RPCs to coordinator brokers.

Theory of operation
-------------------
Cluster mode only. :class:`RemoteStates.call` runs one persister operation
(:class:`~shoal.share.state_rpc.StateOp`) against the share coordinator of its key:

1. resolve the coordinator, the leader of the key's ``__share_group_state`` partition in
   this broker's copy of the cluster metadata (the topic is created first if it does not
   exist yet, see ``server/internal_topics.py``);
2. this broker: run ``local(op)`` (the in-process share coordinator); another broker:
   queue the operation on that broker's :class:`_Channel`;
3. a retriable answer (NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS,
   COORDINATOR_NOT_AVAILABLE, a broken connection) is retried after the backoff
   :func:`~shoal.share.state_rpc.retry_delay_ms` gives, resolving the coordinator again;
   anything else is the answer. A shutting-down broker does not retry.

One :class:`_Channel` per coordinator broker: one connection, one request in flight.
Everything queued while a request is out goes in the next one, batched per RPC and group
(:func:`~shoal.share.state_rpc.take_batch`), so many share-partitions share one request.
A broken connection fails the request's operations with NETWORK_EXCEPTION (retried by
``call``) and reconnects on the next request.

Event loop only. The decisions are pure (``shoal/share/state_rpc.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Awaitable, Callable
from typing import Any

from ..cluster.peer import PeerConnection
from ..errors import ErrorCode
from ..share.coordinator import PartitionOutcome, partition_for
from ..share.state_rpc import (
    StateOp,
    answer_for,
    build_request,
    coordinator_of,
    failed,
    outcomes_of,
    retry_delay_ms,
    take_batch,
)
from .internal_topics import SHARE_STATE_TOPIC, ensure_internal_topic

log = logging.getLogger("shoal.share.persister")

__all__ = ["RemoteStates"]

REQUEST_TIMEOUT_S = 30.0


class _Channel:
    """The connection to one coordinator broker and the operations queued for it."""

    def __init__(self, owner: RemoteStates, node_id: int, host: str, port: int) -> None:
        self.owner = owner
        self.node_id = node_id
        self.host, self.port = host, port
        self.queue: list[tuple[StateOp, asyncio.Future[PartitionOutcome]]] = []
        self._task: asyncio.Task[None] | None = None
        self._conn = PeerConnection(host, port, f"shoal-persister-{owner.broker.node_id}",
                                    getattr(owner.broker, "peer_security", None))
        self.requests = 0
        """Requests sent (for tests and logs)."""

    def submit(self, op: StateOp) -> asyncio.Future[PartitionOutcome]:
        fut: asyncio.Future[PartitionOutcome] = asyncio.get_running_loop().create_future()
        self.queue.append((op, fut))
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._run())
        return fut

    async def _run(self) -> None:
        while self.queue:
            rpc, group_id, taken = take_batch([op for op, _f in self.queue])
            chosen = set(taken)
            items = [self.queue[i] for i in taken]
            self.queue = [item for i, item in enumerate(self.queue) if i not in chosen]
            try:
                request = build_request(rpc, group_id, [op for op, _f in items])
                response = await asyncio.wait_for(self._conn.call(int(rpc), rpc.version, request),
                                                  REQUEST_TIMEOUT_S)
                self.requests += 1
                outcomes = outcomes_of(rpc, group_id, response)
                answers = [answer_for(op, outcomes) for op, _f in items]
            except asyncio.CancelledError:
                for _op, fut in items:
                    if not fut.done():
                        fut.set_result(failed(ErrorCode.network_exception, "the persister stopped"))
                raise
            except Exception as e:  # refused, reset, timed out, undecodable: reconnect next time
                log.info("share-state %s to broker %d failed: %s", rpc.name, self.node_id, e)
                self.disconnect()
                answers = [failed(ErrorCode.network_exception, f"broker {self.node_id}: {e}") for _ in items]
            for (_op, fut), answer in zip(items, answers):
                if not fut.done():
                    fut.set_result(answer)

    def disconnect(self) -> None:
        self._conn.close()

    async def close(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task
        for _op, fut in self.queue:
            if not fut.done():
                fut.set_result(failed(ErrorCode.network_exception, "the persister stopped"))
        self.queue.clear()
        self.disconnect()


class RemoteStates:
    """Persister operations routed to the share coordinator of each key (cluster mode)."""

    def __init__(self, broker: Any, num_partitions: Callable[[], int]) -> None:
        self.broker = broker
        self._num_partitions = num_partitions
        self.channels: dict[int, _Channel] = {}
        self._closed = False
        self.remote_calls = 0
        """Operations sent to another broker (for tests and logs)."""
        self.local_calls = 0

    def coordinator(self, op: StateOp) -> int | None:
        """The node id of ``op``'s share coordinator in the current metadata, or None."""
        n = self._num_partitions()
        if n < 1:
            return None
        i = partition_for(op.key, n)
        view = self.broker.cluster.partition(SHARE_STATE_TOPIC, i)
        return coordinator_of(op.key, n, {i: view.leader if view is not None else -1})

    async def call(self, op: StateOp, local: Callable[[StateOp], Awaitable[PartitionOutcome]]) -> PartitionOutcome:
        attempt = 0
        while True:
            outcome = await self._attempt(op, local)
            delay_ms = retry_delay_ms(attempt, outcome.error_code, random.random())
            if delay_ms is None or self._closed or self.broker.shutting_down:
                return outcome
            log.debug("share-state %s of %s: %s; retrying in %d ms", op.rpc.name, op.key,
                      ErrorCode(outcome.error_code).name, delay_ms)
            if outcome.error_code in (ErrorCode.not_coordinator, ErrorCode.coordinator_not_available):
                self.broker.cluster.store.mark_stale()  # read the metadata again before the next attempt
            await asyncio.sleep(delay_ms / 1000)
            attempt += 1

    async def _attempt(self, op: StateOp, local: Callable[[StateOp], Awaitable[PartitionOutcome]]) -> PartitionOutcome:
        node = self.broker.cluster
        if SHARE_STATE_TOPIC not in node.store.snapshot.topics and not await ensure_internal_topic(
                self.broker, SHARE_STATE_TOPIC):
            return failed(ErrorCode.coordinator_not_available, f"{SHARE_STATE_TOPIC} does not exist yet")
        target = self.coordinator(op)
        if target is None:
            return failed(ErrorCode.coordinator_not_available, "the share coordinator has no leader")
        if target == self.broker.node_id:
            self.local_calls += 1
            return await local(op)
        endpoint = next((e for e in node.brokers() if e.node_id == target), None)
        if endpoint is None:
            return failed(ErrorCode.coordinator_not_available, f"broker {target} is not registered")
        ch = self.channels.get(target)
        if ch is not None and (ch.host, ch.port) != (endpoint.host, endpoint.port):
            await ch.close()
            ch = None
        if ch is None:
            ch = self.channels[target] = _Channel(self, target, endpoint.host, endpoint.port)
        self.remote_calls += 1
        return await ch.submit(op)

    async def close(self) -> None:
        self._closed = True
        for ch in list(self.channels.values()):
            await ch.close()
        self.channels.clear()
