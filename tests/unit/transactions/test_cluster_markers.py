"""Cluster mode: a coordinator that takes over a partition sends the markers of its
PrepareCommit / PrepareAbort transactions to the partitions' leaders, retries those not
written (no leader yet, a leader that refused), and records the completion only when
every marker is written."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from shoal.coordinator.records import TRANSACTION_STATE, CoordinatorRecord
from shoal.errors import ApiError, ErrorCode
from shoal.server.txn_service import TransactionService
from shoal.transactions.coordinator import (
    TransactionCoordinatorShard,
    TxnMetadata,
    TxnState,
    record_of,
)

PARTS = {("a", 0), ("a", 1), ("b", 0)}


class FakeRuntime:
    """Owns partition 0 of ``__transaction_state``; writes replay at once."""

    def __init__(self, shard: TransactionCoordinatorShard) -> None:
        self.shards = [shard]
        self.num_partitions = 1
        self.owned = {0}

    def owns(self, p: int) -> bool:
        return p in self.owned

    async def wait_durable(self, p: int, *, wrote: bool = False) -> None:
        return None

    async def apply_durable(self, p: int, result: Any) -> Any:
        for rec in result.records:
            k, v = rec.to_bytes()
            self.shards[p].replay(CoordinatorRecord.from_bytes(k, v, TRANSACTION_STATE))
        return result


def _service(leaders: dict[tuple[str, int], int]) -> tuple[TransactionService, FakeRuntime]:
    shard = TransactionCoordinatorShard(60_000)
    shard.replay(record_of(TxnMetadata("t", 7, 3, 10_000, TxnState.PREPARE_COMMIT, set(PARTS), 0, 0)))
    topics = {"a": SimpleNamespace(num_partitions=2), "b": SimpleNamespace(num_partitions=1)}
    broker = SimpleNamespace(
        shutting_down=False, node_id=1,
        config={"transaction.remove.expired.transaction.cleanup.interval.ms": 3_600_000},
        clock=SimpleNamespace(now_ms=lambda: 1000),
        store=SimpleNamespace(get_topic=topics.get),
        replicas=SimpleNamespace(leader_replica=lambda topic, p: SimpleNamespace(leader_epoch=5)),
        cluster=SimpleNamespace(partition=lambda t, i: SimpleNamespace(leader=leaders.get((t, i), -1)),
                                store=SimpleNamespace(mark_stale=lambda: None)),
    )
    svc = TransactionService.__new__(TransactionService)
    rt = FakeRuntime(shard)
    svc.broker, svc.runtime, svc.clustered = broker, rt, True
    svc._closed, svc._sending, svc._peers, svc._verifiers = False, {}, {}, {}
    svc._timer = svc._timer_at = svc._retry = svc._cleanup = None
    return svc, rt


def test_takeover_sends_the_markers_again_retries_and_completes_only_when_all_are_written():
    leaders = {("a", 0): 1, ("a", 1): 2}  # b-0 has no leader yet
    svc, rt = _service(leaders)
    sent: list[tuple[int, list[tuple[str, int]], bool, int, int]] = []
    refused_once = {("a", 1)}

    async def send_to(node: int, c: Any, parts: list[tuple[str, int]], epoch: int) -> set[tuple[str, int]]:
        sent.append((node, sorted(parts), c.commit, c.producer_epoch, epoch))
        assert rt.shards[0].txns["t"].state == TxnState.PREPARE_COMMIT  # not completed before every marker
        done = {k for k in parts if k not in refused_once}
        refused_once.difference_update(parts)  # a-1's leader refuses the first time (moved)
        leaders[("b", 0)] = 3  # b-0 gets a leader after the first round
        return done

    svc._send_to = send_to  # type: ignore[method-assign]

    async def run() -> None:
        svc._partition_loaded(0)
        task = svc._sending["t"]
        assert await asyncio.wait_for(task, 10) is True

    asyncio.run(run())
    svc.close()
    assert rt.shards[0].txns["t"].state == TxnState.COMPLETE_COMMIT
    written = [(node, p) for node, parts, *_ in sent for p in parts]
    assert written.count((2, ("a", 1))) == 2  # retried after the refusal
    assert written.count((1, ("a", 0))) == 1  # written once, not sent again
    assert (3, ("b", 0)) in written  # sent once it had a leader
    assert all(commit and epoch == 3 and coord_epoch == 5 for _n, _p, commit, epoch, coord_epoch in sent)


def test_markers_stop_when_the_partition_moves_away():
    svc, rt = _service({("a", 0): 1, ("a", 1): 1, ("b", 0): 1})

    async def send_to(node: int, c: Any, parts: list[tuple[str, int]], epoch: int) -> set[tuple[str, int]]:
        rt.owned.clear()  # leadership of __transaction_state-0 lost meanwhile
        return set()

    svc._send_to = send_to  # type: ignore[method-assign]

    async def run() -> bool:
        svc._partition_loaded(0)
        return await asyncio.wait_for(svc._sending["t"], 10)

    assert asyncio.run(run()) is False
    svc.close()
    assert rt.shards[0].txns["t"].state == TxnState.PREPARE_COMMIT  # left for the next coordinator


def test_an_end_txn_whose_replication_wait_failed_still_sends_its_markers():
    """EndTxn's PrepareCommit is appended and replayed, but the in-sync replicas did not
    confirm it in time: the client hears the error, and the markers still go out once the
    record is replicated (else the transaction would hang in PrepareCommit)."""
    svc, rt = _service({("a", 0): 1, ("a", 1): 1, ("b", 0): 1})
    m = rt.shards[0].txns["t"]
    m.state = TxnState.ONGOING
    applied = rt.apply_durable

    async def slow_replicas(p: int, result: Any) -> Any:
        await applied(p, result)
        raise ApiError(ErrorCode.coordinator_not_available, "replicas did not confirm in time")

    rt.apply_durable = slow_replicas  # type: ignore[method-assign]
    rt.check_owner = lambda p: None  # type: ignore[attr-defined]
    sent: list[list[tuple[str, int]]] = []

    async def send_to(node: int, c: Any, parts: list[tuple[str, int]], epoch: int) -> set[tuple[str, int]]:
        sent.append(sorted(parts))
        rt.apply_durable = applied  # the completion's write goes through
        return set(parts)

    svc._send_to = send_to  # type: ignore[method-assign]

    async def run() -> ErrorCode:
        code = await svc.end_txn("t", 7, 3, True)
        task = svc._sending.get("t")
        assert task is not None, "no markers were sent"
        assert await asyncio.wait_for(task, 10) is True
        return code

    assert asyncio.run(run()) == ErrorCode.coordinator_not_available
    svc.close()
    assert sent == [sorted(PARTS)]
    assert rt.shards[0].txns["t"].state == TxnState.COMPLETE_COMMIT
