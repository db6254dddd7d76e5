"""The network persister's shell: retries re-resolve the coordinator, one request carries
every queued operation for a broker, a dead broker's operations fail over to its successor.

A real asyncio server stands in for the coordinator brokers: it decodes each share-state
request with kio and answers it from a ShareCoordinatorShard, or with the error a test
asks for.
"""

from __future__ import annotations

import asyncio
import io
import struct
import uuid
from typing import Any

import pytest
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader, entity_writer

from shoal.cluster.metadata import BrokerEndpoint, PartitionView
from shoal.protocol.codec import codec_for
from shoal.protocol.framing import FrameDecoder
from shoal.protocol.header import read_uvarint
from shoal.server import share_persister
from shoal.server.share_persister import RemoteStates
from shoal.share.coordinator import PartitionOutcome, SharePartitionKey, ShareCoordinatorShard, partition_for
from shoal.share.state_rpc import Rpc, StateOp

TID = uuid.UUID(int=42)


class FakeCoordinator:
    """A broker that answers share-state RPCs from one shard (or with ``fail_with``)."""

    def __init__(self) -> None:
        self.shard = ShareCoordinatorShard()
        self.fail_with: ErrorCode | None = None
        self.requests: list[tuple[int, int]] = []
        """(api key, partitions in the request) per request received."""
        self.server: asyncio.AbstractServer | None = None
        self.port = 0

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        decoder = FrameDecoder(1 << 20)
        try:
            while True:
                chunk = await reader.read(1 << 16)
                if not chunk:
                    return
                decoder.feed(chunk)
                while (frame := decoder.next_frame()) is not None:
                    writer.write(self._answer(bytes(frame)))
                await writer.drain()
        finally:
            writer.close()

    def _answer(self, frame: bytes) -> bytes:
        api_key, version, cid = struct.unpack_from(">hhi", frame, 0)
        (n,) = struct.unpack_from(">h", frame, 8)
        pos = 10 + n
        count, pos = read_uvarint(frame, pos)  # request header tagged fields
        assert count == 0
        codec = codec_for(api_key, version)
        assert codec is not None
        request, _ = entity_reader(codec.request_type)(frame, pos)
        self.requests.append((api_key, sum(len(t.partitions) for t in request.topics)))
        method = {83: "handle_initialize_share_group_state", 84: "handle_read_share_group_state",
                  85: "handle_write_share_group_state", 86: "handle_delete_share_group_state",
                  87: "handle_read_share_group_state_summary"}[api_key]
        result = getattr(self.shard, method)(request)
        for i, rec in enumerate(result.records):
            self.shard.replay(rec, i)
        response = result.response
        if self.fail_with is not None:
            response = _with_error(response, self.fail_with)
        body = io.BytesIO()
        entity_writer(type(response))(body, response)
        payload = struct.pack(">i", cid) + b"\x00" + body.getvalue()
        return struct.pack(">i", len(payload)) + payload


def _with_error(response: Any, code: ErrorCode) -> Any:
    import dataclasses

    return dataclasses.replace(response, results=tuple(
        dataclasses.replace(t, partitions=tuple(dataclasses.replace(p, error_code=code) for p in t.partitions))
        for t in response.results))


class FakeCluster:
    clustered = True

    def __init__(self, endpoints: dict[int, int], leader: int) -> None:
        self.endpoints = endpoints
        self.leader = leader
        self.stale_marks = 0
        store = self

        class Snapshot:
            topics = {"__share_group_state": object()}

        class Store:
            snapshot = Snapshot()

            def mark_stale(self) -> None:
                store.stale_marks += 1

        self.store = Store()

    def brokers(self) -> list[BrokerEndpoint]:
        return [BrokerEndpoint(n, "127.0.0.1", port) for n, port in sorted(self.endpoints.items())]

    def partition(self, topic: str, index: int) -> PartitionView:
        return PartitionView(self.leader, 1, tuple(self.endpoints), tuple(self.endpoints))


class FakeBroker:
    node_id = 1
    shutting_down = False

    def __init__(self, cluster: FakeCluster) -> None:
        self.cluster = cluster


@pytest.fixture(autouse=True)
def quick_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    real = share_persister.retry_delay_ms
    monkeypatch.setattr(share_persister, "retry_delay_ms",
                        lambda attempt, code, rand: None if real(attempt, code, rand) is None else 10)


def _key(p: int) -> SharePartitionKey:
    return SharePartitionKey.of("g", TID, p)


async def _local_never(op: StateOp) -> PartitionOutcome:
    raise AssertionError("not this broker's key")


def test_operations_queued_together_go_in_one_request_per_group() -> None:
    async def body() -> None:
        coord = FakeCoordinator()
        await coord.start()
        remote = RemoteStates(FakeBroker(FakeCluster({1: 1, 2: coord.port}, leader=2)), lambda: 3)
        try:
            ops = [StateOp(Rpc.INITIALIZE, _key(p), start_offset=p) for p in range(50)]
            outcomes = await asyncio.gather(*(remote.call(op, _local_never) for op in ops))
            assert all(o.ok for o in outcomes)
            assert coord.requests == [(83, 50)]  # queued in one loop iteration: one request
            coord.requests.clear()
            first = asyncio.ensure_future(remote.call(StateOp(Rpc.SUMMARY, _key(0)), _local_never))
            while not coord.requests:
                await asyncio.sleep(0.001)
            # queued while a request is out: all in the next one
            rest = await asyncio.gather(*(remote.call(StateOp(Rpc.SUMMARY, _key(p)), _local_never)
                                          for p in range(1, 50)))
            assert (await first).ok and all(o.ok for o in rest)
            assert coord.requests == [(87, 1), (87, 49)]
            reads = await asyncio.gather(*(remote.call(StateOp(Rpc.READ, _key(p), leader_epoch=3), _local_never)
                                           for p in range(50)))
            assert [o.state.start_offset for o in reads] == list(range(50))
        finally:
            await remote.close()
            await coord.stop()

    asyncio.run(body())


def test_not_coordinator_is_retried_against_the_coordinator_resolved_again() -> None:
    async def body() -> None:
        old, new = FakeCoordinator(), FakeCoordinator()
        await old.start()
        await new.start()
        cluster = FakeCluster({1: 1, 2: old.port, 3: new.port}, leader=2)
        remote = RemoteStates(FakeBroker(cluster), lambda: 3)
        old.fail_with = ErrorCode.not_coordinator
        for rec in new.shard.initialize(_key(0), 0, 7).records:  # the new coordinator has the state
            new.shard.replay(rec, 0)
        try:
            call = asyncio.ensure_future(remote.call(StateOp(Rpc.READ, _key(0)), _local_never))
            while not old.requests:
                await asyncio.sleep(0.001)
            cluster.leader = 3  # the metadata names the new leader of the state partition
            outcome = await call
            assert outcome.ok and outcome.state is not None and outcome.state.start_offset == 7
            assert cluster.stale_marks >= 1  # metadata re-read after NOT_COORDINATOR
            # a broken connection is retried too: the old coordinator is gone, this broker leads now
            await new.stop()
            cluster.leader = 1
            local_calls: list[StateOp] = []

            async def local(op: StateOp) -> PartitionOutcome:
                local_calls.append(op)
                return PartitionOutcome()

            assert (await remote.call(StateOp(Rpc.DELETE, _key(0)), local)).ok
            assert [op.rpc for op in local_calls] == [Rpc.DELETE]
        finally:
            await remote.close()
            await old.stop()

    asyncio.run(body())


def test_a_coordinator_that_stays_away_fails_the_operation_after_the_attempts() -> None:
    async def body() -> None:
        coord = FakeCoordinator()
        await coord.start()
        port = coord.port
        await coord.stop()  # nothing listens there any more
        remote = RemoteStates(FakeBroker(FakeCluster({1: 1, 2: port}, leader=2)), lambda: 3)
        try:
            outcome = await remote.call(StateOp(Rpc.READ, _key(0)), _local_never)
            assert outcome.error_code == ErrorCode.network_exception
        finally:
            await remote.close()

    asyncio.run(body())


def test_keys_route_to_the_leader_of_their_state_partition() -> None:
    cluster = FakeCluster({1: 1, 2: 2, 3: 3}, leader=3)
    remote = RemoteStates(FakeBroker(cluster), lambda: 3)
    assert remote.coordinator(StateOp(Rpc.READ, _key(0))) == 3
    assert partition_for(_key(0), 3) in range(3)
    cluster.leader = -1
    assert remote.coordinator(StateOp(Rpc.READ, _key(0))) is None
