"""The share service's glue against a real LogStore in a temporary directory (no sockets)."""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import uuid
from pathlib import Path
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from shoal.config import BrokerConfig
from shoal.errors import ApiError
from shoal.log.store import LogStore
from shoal.protocol.batch import build_batch
from shoal.server.broker import AppendWaiters, Flusher
from shoal.server.data_dir import StorageErrors
from shoal.server.share_service import SHARE_STATE_TOPIC, ShareService
from shoal.server.state_files import DynamicConfigs
from shoal.share.coordinator import SharePartitionKey, StateBatch
from shoal.share.partition import UpdateStatus
from shoal.share.requests import (
    AcknowledgementBatch,
    ShareAcknowledgeParams,
    ShareFetchParams,
    SharePartitionRequest,
    ShareResult,
)
from shoal.share.state import AcknowledgeType, AcquireMode, RecordState


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_000_000

    def now_ms(self) -> int:
        return self.now


class FakeBroker:
    def __init__(self, data_dir: Path, **overrides: str) -> None:
        self.config = BrokerConfig(overrides)
        self.clock = FakeClock()
        self.store = LogStore(data_dir, self.config, now_ms=self.clock.now_ms())
        self.dynamic_configs = DynamicConfigs(data_dir / "dynamic-configs.json", self.config)
        self.append_waiters = AppendWaiters()
        self.flusher = Flusher(self.clock)
        self.storage_errors = StorageErrors()
        self.extensions: dict[str, Any] = {}
        self.shutting_down = False
        self.halted: list[str] = []
        self.metrics: Any = None
        """Metrics() to have the service count (shoal/observe/metrics.py); None as with metrics.port=-1."""

    def halt_on_storage_error(self, reason: str) -> None:
        self.halted.append(reason)

    def close(self) -> None:
        self.flusher.close()
        self.store.close()


def started(data_dir: Path, group_configs: dict[str, str] | None = None,
            **overrides: str) -> tuple[FakeBroker, ShareService]:
    """A fake broker (group "g" given ``group_configs``, if any) and its started share service."""
    b = FakeBroker(data_dir, **overrides)
    if group_configs:
        b.dynamic_configs.set_group("g", group_configs)
    svc = ShareService(b)
    svc.start()
    return b, svc


def run(fn: Any) -> Any:
    async def main() -> Any:
        out = fn()
        return await out if inspect.isawaitable(out) else out

    return asyncio.run(main())


def test_state_topic_is_not_compacted_and_state_survives_a_restart(tmp_path: Path) -> None:
    async def first() -> None:
        b, svc = started(tmp_path)
        meta = b.store.get_topic(SHARE_STATE_TOPIC)
        assert meta.configs["cleanup.policy"] == "delete"
        assert meta.configs["retention.ms"] == "-1"
        key = SharePartitionKey.of("g", b.store.create_topic("t", 1, {}, now_ms=0).topic_id, 0)
        assert svc.persister.initialize(key, 0, 5).ok
        assert (await svc.persister.write(key, 0, 0, 7, [StateBatch(7, 9, 0, 2), StateBatch(10, 10, 4, 1)])).ok
        svc.stop()
        b.close()

    async def second() -> None:
        b, svc = started(tmp_path)
        st = svc.persister.read(SharePartitionKey.of("g", b.store.get_topic("t").topic_id, 0)).state
        assert st is not None and st.start_offset == 7
        assert [(x.first_offset, x.last_offset, x.delivery_state, x.delivery_count) for x in st.state_batches] == [
            (7, 9, 0, 2), (10, 10, 4, 1)]
        svc.stop()
        b.close()

    run(first)
    run(second)


def test_prune_deletes_superseded_records(tmp_path: Path) -> None:
    async def body() -> None:
        b, svc = started(tmp_path, **{"share.coordinator.snapshot.update.records.per.snapshot": "2"})
        key = SharePartitionKey.of("g", b.store.create_topic("t", 1, {}, now_ms=0).topic_id, 0)
        assert svc.persister.initialize(key, 0, 0).ok
        for i in range(1, 8):
            assert (await svc.persister.write(key, 0, 0, i, [])).ok
        plog = b.store.partition(SHARE_STATE_TOPIC, 0)
        assert plog.log_start_offset == 0
        svc.prune()
        assert plog.log_start_offset > 0
        cut = plog.log_start_offset
        svc.stop()
        b.close()
        b2 = FakeBroker(tmp_path)
        svc2 = ShareService(b2)
        svc2.start()
        assert svc2.persister.read(key).state.start_offset == 7
        assert b2.store.partition(SHARE_STATE_TOPIC, 0).log_start_offset == cut
        svc2.stop()
        b2.close()

    run(body)


def _topic_with_records(b: FakeBroker, name: str, n: int, svc: ShareService | None = None,
                        groups: tuple[str, ...] = ("g",)) -> uuid.UUID:
    """A one-partition topic with ``n`` records; with ``svc``, the share-partition of each of
    ``groups`` initialized as the group coordinator does (start offset -1: the leader applies
    ``share.auto.offset.reset`` when it loads the state)."""
    meta = b.store.create_topic(name, 1, {}, now_ms=b.clock.now_ms())
    plog = b.store.partition(name, 0)
    for i in range(n):
        plog.append(build_batch([(None, b"%d" % i, (), b.clock.now_ms())]), b.clock.now_ms())
    if svc is not None:
        for g in groups:
            assert svc.persister.initialize(SharePartitionKey.of(g, meta.topic_id, 0), 0, -1).ok
    return meta.topic_id


def test_share_partition_starts_at_latest_or_earliest(tmp_path: Path) -> None:
    async def body() -> None:
        b, svc = started(tmp_path)
        tid = _topic_with_records(b, "t", 4, svc, groups=("late", "early", "g"))
        assert svc.get_partition("late", tid, 0).start_offset == 4
        b.dynamic_configs.set_group("early", {"share.auto.offset.reset": "earliest"})
        assert svc.get_partition("early", tid, 0).start_offset == 0
        svc.stop()
        b.close()

    run(body)


def test_acknowledgement_is_durable_before_it_is_answered(tmp_path: Path) -> None:
    async def first() -> None:
        b, svc = started(tmp_path, {"share.auto.offset.reset": "earliest"})
        tid = _topic_with_records(b, "t", 3, svc)
        sp = svc.get_partition("g", tid, 0)
        got = sp.acquire("m", [(0, 0), (1, 1), (2, 2)], b.clock.now_ms(), 10)
        assert [(a.first_offset, a.last_offset) for a in got] == [(0, 2)]
        update = sp.acknowledge("m", [(0, 0, [AcknowledgeType.ACCEPT]), (1, 1, [AcknowledgeType.RELEASE])],
                                b.clock.now_ms())
        assert update.status is UpdateStatus.PENDING
        assert await svc.persist(sp)
        assert update.status is UpdateStatus.COMMITTED
        assert sp.start_offset == 1
        svc.stop()
        b.close()

    async def second() -> None:
        b, svc = started(tmp_path)
        tid = b.store.get_topic("t").topic_id
        sp = svc.get_partition("g", tid, 0)
        assert sp.start_offset == 1
        assert sp.record(1)[:2] == (RecordState.AVAILABLE, 1)
        svc.stop()
        b.close()

    run(first)
    run(second)


def test_lock_expiry_timer_releases_and_persists(tmp_path: Path) -> None:
    async def body() -> None:
        b, svc = started(tmp_path, {"share.auto.offset.reset": "earliest",
                                    "share.record.lock.duration.ms": "15000"})
        tid = _topic_with_records(b, "t", 2, svc)
        sp = svc.get_partition("g", tid, 0)
        sp.acquire("m", [(0, 1)], b.clock.now_ms(), 10)
        b.clock.now += 15_000  # the timer computes its delay from the clock: it is due now
        svc.reschedule(sp)
        await asyncio.sleep(0.05)
        assert sp.record(0)[:2] == (RecordState.AVAILABLE, 1)
        st = svc.persister.read(SharePartitionKey.of("g", tid, 0)).state
        assert [(x.first_offset, x.last_offset, x.delivery_state, x.delivery_count) for x in st.state_batches] == [
            (0, 1, 0, 1)]
        svc.stop()
        b.close()

    asyncio.run(body())


def test_failed_write_rolls_back_and_reports(tmp_path: Path) -> None:
    async def body() -> None:
        b, svc = started(tmp_path, {"share.auto.offset.reset": "earliest"})
        tid = _topic_with_records(b, "t", 1, svc)
        sp = svc.get_partition("g", tid, 0)
        sp.acquire("m", [(0, 0)], b.clock.now_ms(), 10)
        update = sp.acknowledge("m", [(0, 0, [AcknowledgeType.ACCEPT])], b.clock.now_ms())
        real = svc.persister.append_write

        def down(*a: Any, **k: Any) -> Any:
            return 0, type(svc.persister.read_summary(SharePartitionKey.of("g", tid, 0)))(
                ErrorCode.coordinator_not_available, "down", None)

        svc.persister.append_write = down  # type: ignore[method-assign]
        assert not await svc.persist(sp)
        assert update.status is UpdateStatus.ROLLED_BACK
        assert sp.record(0)[0] is RecordState.ACQUIRED
        svc.persister.append_write = real  # type: ignore[method-assign]
        svc.stop()
        b.close()

    run(body)


def test_fenced_write_drops_the_stale_share_partition_which_reloads_the_newer_state(tmp_path: Path) -> None:
    async def body() -> None:
        b, svc = started(tmp_path, {"share.auto.offset.reset": "earliest"})
        tid = _topic_with_records(b, "t", 4, svc)
        sp = svc.get_partition("g", tid, 0)
        sp.acquire("m", [(0, 3)], b.clock.now_ms(), 10)
        update = sp.acknowledge("m", [(0, 1, [AcknowledgeType.ACCEPT])], b.clock.now_ms())
        # A newer leader read the state with a higher leader epoch meanwhile.
        key = SharePartitionKey.of("g", tid, 0)
        assert svc.persister.read(key, leader_epoch=sp.leader_epoch + 1).ok
        assert not await svc.persist(sp)
        assert update.status is UpdateStatus.ROLLED_BACK
        assert ("g", tid, 0) not in svc.partitions  # stale: dropped, nothing more of it is written
        assert svc.persister.read(key).state.start_offset == 0
        again = svc.get_partition("g", tid, 0)
        assert again is not sp and again.leader_epoch == sp.leader_epoch + 1
        got = again.acquire("n", [(0, 3)], b.clock.now_ms(), 10)
        assert [(a.first_offset, a.last_offset) for a in got] == [(0, 3)]
        svc.stop()
        b.close()

    run(body)


def test_a_leader_whose_state_was_deleted_creates_none_and_drops_its_share_partition(tmp_path: Path) -> None:
    async def body() -> None:
        b, svc = started(tmp_path, {"share.auto.offset.reset": "earliest"})
        tid = _topic_with_records(b, "t", 4, svc)
        sp = svc.get_partition("g", tid, 0)
        sp.acquire("m", [(0, 3)], b.clock.now_ms(), 10)
        update = sp.acknowledge("m", [(0, 1, [AcknowledgeType.ACCEPT])], b.clock.now_ms())
        # The state is deleted behind the leader's back (another broker's group coordinator).
        key = SharePartitionKey.of("g", tid, 0)
        assert svc.persister.delete(key).ok
        assert not await svc.persist(sp)  # WriteShareGroupState of an uninitialized key: refused
        assert update.status is UpdateStatus.ROLLED_BACK
        assert ("g", tid, 0) not in svc.partitions  # stale: dropped
        assert svc.persister.read(key).error_code == ErrorCode.unknown_topic_or_partition  # nothing created
        with pytest.raises(ApiError) as e:
            svc.get_partition("g", tid, 0)
        assert e.value.error_code == ErrorCode.unknown_topic_or_partition
        assert svc.persister.read(key).error_code == ErrorCode.unknown_topic_or_partition
        svc.stop()
        b.close()

    run(body)


class _Ctx:
    """What a handler needs of its request context."""

    def __init__(self, broker: FakeBroker) -> None:
        self.broker = broker


def _wire_write(tid: uuid.UUID, leader_epoch: int, start: int, batches: list[tuple[int, int, int, int]]) -> Any:
    from kio.schema.write_share_group_state.v1.request import (
        PartitionData,
        WriteShareGroupStateRequest,
        WriteStateData,
    )
    from kio.schema.write_share_group_state.v1.request import StateBatch as WireBatch
    from kio.static.primitive import i8, i16, i32, i64

    return WriteShareGroupStateRequest(group_id="g", topics=(WriteStateData(topic_id=tid, partitions=(
        PartitionData(partition=i32(0), state_epoch=i32(0), leader_epoch=i32(leader_epoch), start_offset=i64(start),
                      state_batches=tuple(WireBatch(first_offset=i64(f), last_offset=i64(la), delivery_state=i8(s),
                                                    delivery_count=i16(c)) for f, la, s, c in batches)),)),))


def test_wire_write_drops_the_loaded_share_partition_which_reloads_from_it(tmp_path: Path) -> None:
    from shoal.server.handlers.share_state import handle_write_share_group_state

    async def body() -> None:
        b, svc = started(tmp_path, {"share.auto.offset.reset": "earliest"})
        b.extensions["share"] = svc
        tid = _topic_with_records(b, "t", 6, svc)
        sp = svc.get_partition("g", tid, 0)
        sp.acquire("m", [(i, i) for i in range(6)], b.clock.now_ms(), 10)
        svc.reschedule(sp)  # a lock-expiry timer for the old object
        key = SharePartitionKey.of("g", tid, 0)
        before = svc.persister.read(key).state
        resp = await handle_write_share_group_state(_Ctx(b), _wire_write(tid, 3, 2, [(2, 3, 4, 1), (4, 4, 0, 2)]))
        assert [p.error_code for p in resp.results[0].partitions] == [ErrorCode.none]
        # Nothing of the old in-memory state was written over the wire write.
        assert svc.persister.read(key).state.start_offset == 2
        assert before is not None and before.start_offset == 0
        assert ("g", tid, 0) not in svc.partitions and ("g", tid, 0) not in svc._timers
        again = svc.get_partition("g", tid, 0)
        assert again is not sp
        assert (again.start_offset, again.leader_epoch) == (4, 3)  # 2-3 archived, so SPSO moves on
        assert again.record(4)[:2] == (RecordState.AVAILABLE, 2)
        assert again.record(5)[:2] == (RecordState.AVAILABLE, 0)  # m's lock is gone, as after a restart
        got = again.acquire("n", [(i, i) for i in range(4, 6)], b.clock.now_ms(), 10)
        assert [(a.first_offset, a.last_offset, a.delivery_count) for a in got] == [(4, 4, 3), (5, 5, 1)]
        # The reloaded partition writes with the adopted leader epoch and is not fenced.
        update = again.acknowledge("n", [(4, 5, [AcknowledgeType.ACCEPT])], b.clock.now_ms())
        assert await svc.persist(again) and update.status is UpdateStatus.COMMITTED
        assert svc.persister.read(key).state.start_offset == 6
        # The old object is stale: its timer is cancelled and nothing it does is persisted.
        await asyncio.sleep(0)
        assert svc.persister.read(key).state.start_offset == 6
        svc.stop()
        b.close()

    asyncio.run(body())


def test_wire_write_that_fails_keeps_the_loaded_share_partition(tmp_path: Path) -> None:
    from shoal.server.handlers.share_state import handle_write_share_group_state

    async def body() -> None:
        b, svc = started(tmp_path, {"share.auto.offset.reset": "earliest"})
        b.extensions["share"] = svc
        tid = _topic_with_records(b, "t", 2, svc)
        sp = svc.get_partition("g", tid, 0)
        assert (await handle_write_share_group_state(_Ctx(b), _wire_write(tid, 5, 1, []))).results[0].partitions[0] \
            .error_code == ErrorCode.none
        sp = svc.get_partition("g", tid, 0)
        resp = await handle_write_share_group_state(_Ctx(b), _wire_write(tid, 4, 0, []))  # an older leader: fenced
        assert [p.error_code for p in resp.results[0].partitions] == [ErrorCode.fenced_leader_epoch]
        assert svc.partitions[("g", tid, 0)] is sp
        svc.stop()
        b.close()

    run(body)


def test_fetch_path_follows_the_log_start_past_the_spso(tmp_path: Path) -> None:
    b = FakeBroker(tmp_path)

    async def body() -> None:
        b.dynamic_configs.set_group("g", {"share.auto.offset.reset": "earliest"})
        svc = ShareService(b)
        svc.start()
        tid = _topic_with_records(b, "t", 10, svc)
        sp = svc.get_partition("g", tid, 0)
        sp.acquire("m", [(i, i) for i in range(4)], b.clock.now_ms(), 4, acquire_mode=AcquireMode.RECORD_LIMIT)
        update = sp.acknowledge("m", [(0, 0, [AcknowledgeType.RELEASE])], b.clock.now_ms())
        assert await svc.persist(sp) and update.status is UpdateStatus.COMMITTED
        assert sp.next_fetch_offset() == 0  # offset 0 is available again
        b.store.partition("t", 0).delete_records(6)  # DeleteRecords past SPSO and SPEO
        _data, got = svc._acquire_one("g", "n", tid, 0, 10, 1 << 20, AcquireMode.BATCH_OPTIMIZED, None)
        assert [(a.first_offset, a.last_offset, a.delivery_count) for a in got] == [(6, 9, 1)]
        assert sp.start_offset == 6
        assert await svc.persist(sp)  # the new SPSO's write was started by the fetch path
        assert svc.persister.read(SharePartitionKey.of("g", tid, 0)).state.start_offset == 6
        svc.stop()
        b.close()

    run(body)


def test_member_leaving_with_an_open_session_keeps_its_records_until_the_session_closes(tmp_path: Path) -> None:
    async def body() -> None:
        b, svc = started(tmp_path, {"share.auto.offset.reset": "earliest"})
        tid = _topic_with_records(b, "t", 4, svc)
        part = (str(tid), 0)
        assert svc.sessions.share_fetch("g", "m", 0, add=[part], connection_id="c1").ok
        assert svc.sessions.share_fetch("g", "gone", 0, add=[part], connection_id="c2").ok
        sp = svc.get_partition("g", tid, 0)
        sp.acquire("m", [(0, 1)], b.clock.now_ms(), 2, acquire_mode=AcquireMode.RECORD_LIMIT)
        sp.acquire("gone", [(2, 3)], b.clock.now_ms(), 2, acquire_mode=AcquireMode.RECORD_LIMIT)
        svc.sessions.disconnect("c2")
        # The leave heartbeat of a closing client is seen before its final acknowledgement.
        svc.on_share_member_removed("g", "m")
        svc.on_share_member_removed("g", "gone")  # no session left: released at once
        assert sp.record(0)[:3] == (RecordState.ACQUIRED, 1, "m")
        assert sp.record(2)[:3] == (RecordState.AVAILABLE, 1, None)
        update = sp.acknowledge("m", [(0, 0, [AcknowledgeType.ACCEPT])], b.clock.now_ms())
        assert await svc.persist(sp) and update.status is UpdateStatus.COMMITTED
        assert svc.sessions.share_acknowledge("g", "m", -1, connection_id="c1").closed
        svc.release_member("g", "m")
        assert sp.start_offset == 1 and sp.record(1)[:3] == (RecordState.AVAILABLE, 1, None)
        svc.stop()
        b.close()

    run(body)


def test_wire_write_refused_by_the_disk_answers_the_partition_with_an_error(tmp_path: Path) -> None:
    from kio.schema.write_share_group_state.v1.response import (
        WriteShareGroupStateResponse,
    )

    from shoal.server.handlers.share_state import handle_write_share_group_state

    class Ctx(_Ctx):
        response_type = WriteShareGroupStateResponse

    async def body() -> None:
        b, svc = started(tmp_path, {"share.auto.offset.reset": "earliest"})
        b.extensions["share"] = svc
        tid = _topic_with_records(b, "t", 2, svc)
        plog = b.store.partition(SHARE_STATE_TOPIC, 0)
        real = plog.append

        def full(*a: Any, **kw: Any) -> Any:
            raise ApiError(ErrorCode.kafka_storage_error, "append failed: [Errno 28] No space left on device")

        plog.append = full  # type: ignore[method-assign]
        resp = await handle_write_share_group_state(Ctx(b), _wire_write(tid, 5, 1, []))
        (result,) = resp.results
        assert result.topic_id == tid
        assert [(p.partition, p.error_code) for p in result.partitions] == [(0, ErrorCode.coordinator_not_available)]
        assert not b.halted  # a refused write is not fatal
        plog.append = real  # type: ignore[method-assign]
        resp = await handle_write_share_group_state(Ctx(b), _wire_write(tid, 5, 1, []))
        assert [p.error_code for p in resp.results[0].partitions] == [ErrorCode.none]
        svc.stop()
        b.close()

    run(body)


def _share_fetch(tid: uuid.UUID, member: str, epoch: int, max_wait_ms: int = 30_000) -> ShareFetchParams:
    return ShareFetchParams(group_id="g", member_id=member, session_epoch=epoch,
                            partitions=(SharePartitionRequest(tid, 0),), forgotten=(), version=2,
                            max_wait_ms=max_wait_ms, min_bytes=1, max_bytes=1 << 20, max_records=500, batch_size=500,
                            connection_id=f"conn-{member}")


def _offsets(result: ShareResult) -> dict[int, int]:
    """{offset: delivery count} of what a ShareFetch acquired."""
    assert result.error_code == ErrorCode.none
    return {o: a.delivery_count for p in result.partitions for a in p.acquired
            for o in range(a.first_offset, a.last_offset + 1)}


def test_a_parked_share_fetch_is_completed_by_a_release_and_by_an_append(tmp_path: Path) -> None:
    async def body() -> None:
        b, svc = started(tmp_path, {"share.auto.offset.reset": "earliest"})
        tid = _topic_with_records(b, "t", 2, svc)
        assert _offsets(await svc.fetch(_share_fetch(tid, "a", 0))) == {0: 1, 1: 1}
        # Nothing is acquirable for "b": its fetch parks, watched under the share-partition.
        parked = asyncio.ensure_future(svc.fetch(_share_fetch(tid, "b", 0)))
        for _ in range(20):
            await asyncio.sleep(0.01)
        assert not parked.done() and b.append_waiters.parked() == 1
        # "a" releases its records: the parked fetch completes long before its 30 s.
        acked = await svc.acknowledge(ShareAcknowledgeParams(
            group_id="g", member_id="a", session_epoch=1, version=2, connection_id="conn-a",
            partitions=(SharePartitionRequest(tid, 0, (AcknowledgementBatch(0, 1, (int(AcknowledgeType.RELEASE),)),)),)))
        assert [(p.partition, p.error_code) for p in acked.partitions] == [(0, ErrorCode.none)]
        assert _offsets(await asyncio.wait_for(parked, 10)) == {0: 2, 1: 2}
        # At the log end, a fetch parks until an append to the partition.
        parked = asyncio.ensure_future(svc.fetch(_share_fetch(tid, "b", 1)))
        for _ in range(20):
            await asyncio.sleep(0.01)
        assert not parked.done() and b.append_waiters.parked() == 1
        b.store.partition("t", 0).append(build_batch([(None, b"2", (), b.clock.now_ms())]), b.clock.now_ms())
        b.append_waiters.notify("t", 0)
        assert _offsets(await asyncio.wait_for(parked, 10)) == {2: 1}
        assert b.append_waiters.parked() == 0
        svc.stop()
        b.close()

    run(body)


def test_a_parked_share_fetch_is_watched_under_its_own_share_partition(tmp_path: Path) -> None:
    """A release in one group completes that group's parked fetches only; another group's
    fetch of the same partition stays parked (it has nothing new to acquire) until an append."""
    async def body() -> None:
        b, svc = started(tmp_path, {"share.auto.offset.reset": "earliest"})
        b.dynamic_configs.set_group("h", {"share.auto.offset.reset": "earliest"})
        tid = _topic_with_records(b, "t", 2, svc, groups=("g", "h"))
        assert _offsets(await svc.fetch(_share_fetch(tid, "a", 0))) == {0: 1, 1: 1}
        other = dataclasses.replace(_share_fetch(tid, "x", 0), group_id="h")
        assert _offsets(await svc.fetch(other)) == {0: 1, 1: 1}
        parked = asyncio.ensure_future(svc.fetch(dataclasses.replace(other, session_epoch=1)))
        for _ in range(20):
            await asyncio.sleep(0.01)
        assert not parked.done()
        (op,) = {op for ops in svc.purgatory._watchers.values() for op in ops}
        assert (("h", tid, 0) in op.keys and ("t", 0) in op.keys) and ("g", tid, 0) not in op.keys
        acked = await svc.acknowledge(ShareAcknowledgeParams(
            group_id="g", member_id="a", session_epoch=1, version=2, connection_id="conn-a",
            partitions=(SharePartitionRequest(tid, 0, (AcknowledgementBatch(0, 1, (int(AcknowledgeType.RELEASE),)),)),)))
        assert acked.partitions[0].error_code == ErrorCode.none
        for _ in range(20):
            await asyncio.sleep(0.01)
        # Not completed (and parked again): the same delayed operation is still watched.
        assert not parked.done() and not op.future.done() and b.append_waiters.parked() == 1
        b.store.partition("t", 0).append(build_batch([(None, b"2", (), b.clock.now_ms())]), b.clock.now_ms())
        b.append_waiters.notify("t", 0)
        assert _offsets(await asyncio.wait_for(parked, 10)) == {2: 1}
        svc.stop()
        b.close()

    run(body)
