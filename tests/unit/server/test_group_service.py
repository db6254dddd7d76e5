"""The group service's glue, driven through its handlers on a real log store (no sockets).

Covers what the integration tests cannot see from a client: the contract with the share
service (initialize before answering, retry after a failure, member removal, two-stage
deletion), one namespace for all group kinds, and the timers.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from pathlib import Path
from typing import Any

from kio.schema.errors import ErrorCode

from shoal.cluster.metadata import LocalMetadata
from shoal.config import BrokerConfig
from shoal.log.store import LogStore
from shoal.protocol.codec import codec_for
from shoal.protocol.entities import make, sub
from shoal.server.broker import Flusher
from shoal.server.data_dir import StorageErrors
from shoal.server.group_service import GroupCoordinatorService
from shoal.server.handlers import consumer_groups, groups_admin, groups_classic, share_groups
from shoal.server.state_files import DynamicConfigs


class FakeClock:
    def __init__(self) -> None:
        self.ms = int(time.time() * 1000)

    def now_ms(self) -> int:
        return self.ms


class FakeBroker:
    def __init__(self, data_dir: Path, **overrides: Any) -> None:
        self.config = BrokerConfig({"offsets.topic.num.partitions": 2, **overrides})
        self.clock = FakeClock()
        self.store = LogStore(data_dir, self.config, now_ms=self.clock.now_ms())
        self.dynamic_configs = DynamicConfigs(data_dir / "dynamic-configs.json", self.config)
        self.storage_errors = StorageErrors()
        self.extensions: dict[str, Any] = {}
        self.metrics: Any = None
        self.authorizer: Any = None
        self.cluster = LocalMetadata(self)
        self.flusher = Flusher(self.clock)  # group commit: a share heartbeat's records (inline fsync)


class FakeShare:
    """Records the group service's calls; fails initializations while ``fail`` is set."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any, ...]] = []
        self.earliest: list[frozenset[uuid.UUID]] = []
        self.state_epochs: list[int] = []
        self.fail = False

    async def initialize_share_state(self, group_id: str, partitions: dict[uuid.UUID, list[int]],
                                     earliest_topics: Any = (), state_epoch: int = 0) -> None:
        await asyncio.sleep(0)
        self.state_epochs.append(state_epoch)
        self.calls.append(("initialize", group_id, {t: sorted(p) for t, p in partitions.items()}))
        self.earliest.append(frozenset(earliest_topics))
        if self.fail:
            raise RuntimeError("share coordinator unavailable")

    def state_keys(self, group_id: str) -> list[Any]:
        return []

    async def delete_share_state(self, group_id: str, partitions: dict[uuid.UUID, list[int]]) -> None:
        self.calls.append(("delete", group_id, {t: sorted(p) for t, p in partitions.items()}))

    def on_share_member_removed(self, group_id: str, member_id: str) -> None:
        self.calls.append(("removed", group_id, member_id))


class Header:
    client_id = "unit"


class Conn:
    peer = "127.0.0.1:5555"


class Ctx:
    def __init__(self, broker: FakeBroker, api_key: int, version: int) -> None:
        self.broker = broker
        self.connection = Conn()
        self.header = Header()
        self.api_key = api_key
        self.api_version = version
        self.codec = codec_for(api_key, version)
        self.response_type = self.codec.response_type

    def now_ms(self) -> int:
        return self.broker.clock.now_ms()


def request(api_key: int, version: int, **fields: Any) -> Any:
    return make(codec_for(api_key, version).request_type, **fields)


def share_heartbeat(broker: FakeBroker, group: str, member: str, epoch: int, topics: tuple[str, ...] | None) -> Any:
    req = request(76, 1, group_id=group, member_id=member, member_epoch=epoch, rack_id=None,
                  subscribed_topic_names=topics)
    return share_groups.handle_share_group_heartbeat(Ctx(broker, 76, 1), req)


def start(tmp_path: Path, **overrides: Any) -> tuple[FakeBroker, GroupCoordinatorService]:
    broker = FakeBroker(tmp_path, **overrides)
    svc = GroupCoordinatorService(broker)
    svc.load()
    broker.extensions["groups"] = svc
    return broker, svc


def test_share_state_is_initialized_before_the_heartbeat_is_answered(tmp_path: Path) -> None:
    async def scenario() -> None:
        broker, svc = start(tmp_path)
        share = broker.extensions["share"] = FakeShare()
        meta = broker.store.create_topic("t", 2, {}, now_ms=broker.clock.now_ms())
        share.fail = True
        r = await share_heartbeat(broker, "sg", "m1", 0, ("t",))
        assert r.error_code == ErrorCode.none and r.member_epoch == 1
        assert share.calls == [("initialize", "sg", {meta.topic_id: [0, 1]})]
        assert share.state_epochs == [1]  # the group epoch
        # Not initialized, so not assigned (KIP-932: the assignment stays empty meanwhile).
        assert r.assignment is not None and r.assignment.topic_partitions == ()
        assert svc.share_assignment("sg", "m1") == {}
        p = svc.partition_for("sg")
        assert not svc.share_groups(p).initialized_partitions("sg")
        # The next heartbeat retries, succeeds, and gets the partitions at once.
        share.fail = False
        r = await share_heartbeat(broker, "sg", "m1", 1, None)
        assert r.error_code == ErrorCode.none and r.member_epoch == 1
        assert [(tp.topic_id, tuple(tp.partitions)) for tp in r.assignment.topic_partitions] == [
            (meta.topic_id, (0, 1))]
        assert svc.share_assignment("sg", "m1") == {meta.topic_id: frozenset({0, 1})}
        assert share.calls[-1] == ("initialize", "sg", {meta.topic_id: [0, 1]})
        assert svc.share_groups(p).initialized_partitions("sg") == {meta.topic_id: frozenset({0, 1})}
        # Initialized partitions are not initialized again.
        await share_heartbeat(broker, "sg", "m1", 1, None)
        assert len(share.calls) == 2
        assert svc.group_type("sg") == "share" and svc.share_group_exists("sg")
        # Leaving is reported once durable; the empty group's state is deleted with it.
        r = await share_heartbeat(broker, "sg", "m1", -1, None)
        assert r.member_epoch == -1 and share.calls[-1] == ("removed", "sg", "m1")
        dg = await groups_admin.handle_delete_groups(Ctx(broker, 42, 2), request(42, 2, groups_names=("sg",)))
        assert [(x.group_id, x.error_code) for x in dg.results] == [("sg", ErrorCode.none)]
        assert share.calls[-1] == ("delete", "sg", {meta.topic_id: [0, 1]})
        assert svc.group_type("sg") is None and svc.share_assignment("sg", "m1") is None
        svc.close()

    asyncio.run(scenario())


def test_one_namespace_for_every_kind(tmp_path: Path) -> None:
    async def scenario() -> None:
        broker, svc = start(tmp_path)
        broker.store.create_topic("t", 1, {}, now_ms=broker.clock.now_ms())
        await share_heartbeat(broker, "shared", "m1", 0, ("t",))
        # A consumer-protocol heartbeat for a share group's id.
        hb = request(68, 1, group_id="shared", member_id="c1", member_epoch=0, instance_id=None, rack_id=None,
                     rebalance_timeout=30_000, subscribed_topic_names=("t",), subscribed_topic_regex=None,
                     server_assignor=None, topic_partitions=())
        r = consumer_groups.handle_consumer_group_heartbeat(Ctx(broker, 68, 1), hb)
        assert r.error_code == ErrorCode.group_id_not_found
        # A consumer group's id refuses a share member and a classic JoinGroup.
        r = consumer_groups.handle_consumer_group_heartbeat(Ctx(broker, 68, 1), dataclasses.replace(hb, group_id="cg"))
        assert r.error_code == ErrorCode.none and r.assignment is not None
        assert (await share_heartbeat(broker, "cg", "m2", 0, ("t",))).error_code == ErrorCode.group_id_not_found
        jcls = codec_for(11, 9).request_type
        join = make(jcls, group_id="cg", session_timeout=10_000, rebalance_timeout=10_000, member_id="",
                    group_instance_id=None, protocol_type="consumer", reason=None,
                    protocols=(make(sub(jcls, "JoinGroupRequestProtocol"), name="range", metadata=b""),))
        jr = await groups_classic.handle_join_group(Ctx(broker, 11, 9), join)
        assert jr.error_code == ErrorCode.inconsistent_group_protocol
        # ConsumerGroupDescribe of a share group: GROUP_ID_NOT_FOUND; ListGroups shows each kind.
        d = consumer_groups.handle_consumer_group_describe(
            Ctx(broker, 69, 1), request(69, 1, group_ids=("shared", "cg"), include_authorized_operations=False))
        assert [g.error_code for g in d.groups] == [ErrorCode.group_id_not_found, ErrorCode.none]
        lg = groups_admin.handle_list_groups(Ctx(broker, 16, 5), request(16, 5, states_filter=(), types_filter=()))
        assert {(g.group_id, g.group_type) for g in lg.groups} == {("shared", "share"), ("cg", "consumer")}
        svc.close()

    asyncio.run(scenario())


def test_expired_share_member_is_removed_by_the_timer(tmp_path: Path) -> None:
    async def scenario() -> None:
        broker, svc = start(tmp_path, **{"group.share.session.timeout.ms": 45_000})
        share = broker.extensions["share"] = FakeShare()
        broker.store.create_topic("t", 1, {}, now_ms=broker.clock.now_ms())
        broker.dynamic_configs.set_group("sg", {"share.session.timeout.ms": "50"})
        await share_heartbeat(broker, "sg", "m1", 0, ("t",))
        broker.clock.ms += 60  # the session runs out; the service's timer must notice
        deadline = time.monotonic() + 5
        while ("removed", "sg", "m1") not in share.calls:
            assert time.monotonic() < deadline, share.calls
            await asyncio.sleep(0.01)
        assert svc.share_assignment("sg", "m1") is None
        svc.close()

    asyncio.run(scenario())


def test_partitions_added_to_a_subscribed_topic_start_at_the_earliest_offset(tmp_path: Path) -> None:
    """KIP-932 "Managing the SPSO and SPEO": a new partition of a topic the group has
    state for starts at offset 0; a topic met for the first time follows
    share.auto.offset.reset."""
    async def scenario() -> None:
        broker, svc = start(tmp_path)
        share = broker.extensions["share"] = FakeShare()
        meta = broker.store.create_topic("t", 1, {}, now_ms=broker.clock.now_ms())
        await share_heartbeat(broker, "sg", "m1", 0, ("t",))
        assert share.calls == [("initialize", "sg", {meta.topic_id: [0]})]
        assert share.earliest == [frozenset()]
        broker.store.create_partitions("t", 4, now_ms=broker.clock.now_ms())
        other = broker.store.create_topic("u", 1, {}, now_ms=broker.clock.now_ms())
        r = await share_heartbeat(broker, "sg", "m1", 1, ("t", "u"))
        assert r.error_code == ErrorCode.none
        initialized = {t: ps for c in share.calls[1:] if c[0] == "initialize" for t, ps in c[2].items()}
        assert initialized == {meta.topic_id: [1, 2, 3], other.topic_id: [0]}
        assert all(e == frozenset({meta.topic_id}) for e in share.earliest[1:])
        svc.close()

    asyncio.run(scenario())


def test_offsets_topic_segment_bytes_comes_from_the_broker_key_also_for_an_existing_topic(tmp_path: Path) -> None:
    async def main() -> None:
        broker, svc = start(tmp_path)
        meta = broker.store.get_topic("__consumer_offsets")
        assert meta.configs["segment.bytes"] == str(100 * 1024 * 1024)
        assert broker.store.partition("__consumer_offsets", 0).config.segment_bytes == 100 * 1024 * 1024
        broker.store.alter_topic_configs("__consumer_offsets", delete=["segment.bytes"])  # as created before the key
        svc.close()
        broker.store.close()
        broker, svc = start(tmp_path, **{"offsets.topic.segment.bytes": 1 << 20})
        assert broker.store.get_topic("__consumer_offsets").configs["segment.bytes"] == str(1 << 20)
        assert broker.store.partition("__consumer_offsets", 1).config.segment_bytes == 1 << 20
        svc.close()
        broker.store.close()

    asyncio.run(main())


def test_cluster_mode_shards_follow_the_partition_count_of_the_existing_offsets_topic(tmp_path: Path) -> None:
    """The cluster's __consumer_offsets decides where a group lives: a broker whose
    offsets.topic.num.partitions differs takes the topic's count, at start (the local copy of
    the topic) and when the topic appears (before its first leadership change is applied)."""
    from shoal.coordinator.partitioning import coordinator_partition

    broker = FakeBroker(tmp_path, **{"metadata.store": "etcd://127.0.0.1:2379", "offsets.topic.num.partitions": 50})
    svc = GroupCoordinatorService(broker)
    svc.load()
    assert svc.runtime.follow_leadership and svc.runtime.num_partitions == 50
    # the replica manager mirrors the cluster's topic, created elsewhere with 6 partitions
    broker.store.create_topic("__consumer_offsets", 6, {"cleanup.policy": "compact"}, now_ms=broker.clock.now_ms())
    svc.leadership_changed("__consumer_offsets", 2, False)
    assert svc.runtime.num_partitions == 6 and sorted(svc._parts) == list(range(6))
    groups = [f"g{i}" for i in range(40)]
    assert [svc.runtime.partition_for_group(g) for g in groups] == [coordinator_partition(g, 6) for g in groups]
    assert svc.owned_partitions() == []
    svc.close()

    restarted = GroupCoordinatorService(broker)  # a later start finds the local copy of the topic
    restarted.load()
    assert restarted.runtime.num_partitions == 6
    restarted.close()


def test_heartbeats_add_one_timer_deadline_per_tick(tmp_path: Path) -> None:
    """Each heartbeat moves its member's session deadline; kept one per heartbeat, the
    shard's timer fired (and scanned every group) for nearly every heartbeat."""
    from shoal.server.group_service import TIMER_TICK_MS

    async def scenario() -> None:
        broker, svc = start(tmp_path, **{"group.share.session.timeout.ms": 45_000})
        broker.extensions["share"] = FakeShare()
        broker.store.create_topic("t", 1, {}, now_ms=broker.clock.now_ms())
        epochs = {}
        for i in range(20):
            epochs[f"m{i}"] = (await share_heartbeat(broker, "sg", f"m{i}", 0, ("t",))).member_epoch
        for i in range(20):
            epochs[f"m{i}"] = (await share_heartbeat(broker, "sg", f"m{i}", epochs[f"m{i}"], None)).member_epoch
        part = svc._parts[svc.partition_for("sg")]
        start_ms = broker.clock.ms
        for n in range(400):  # 400 heartbeats, one per millisecond
            broker.clock.ms += 1
            m = f"m{n % 20}"
            r = await share_heartbeat(broker, "sg", m, epochs[m], None)
            assert r.error_code == ErrorCode.none
        ticks = {-(-(t + 45_000) // TIMER_TICK_MS) for t in range(start_ms, broker.clock.ms + 1)}
        assert len(part.deadlines) <= len(ticks) + 2, len(part.deadlines)
        assert all(d % TIMER_TICK_MS == 0 for d in part.deadlines)
        assert part.timer_at == part.deadlines[0] and part.timer_at >= start_ms + 45_000 - 1000
        svc.close()

    asyncio.run(scenario())


def test_a_join_logs_its_member_without_comparing_the_whole_group(tmp_path: Path, monkeypatch: Any,
                                                                     caplog: Any) -> None:
    # Each write logs the members that joined or left its group. Finding them by comparing
    # the group's whole member list with the one last logged cost O(members) per join, and
    # a thousand members joining a share group at once paid it a thousand times. The
    # members named by the write's records are all that can have changed.
    from shoal.server import group_service

    async def scenario(n: int) -> int:
        broker, svc = start(tmp_path / str(n), **{"group.share.max.size": 1000})
        broker.store.create_topic("t", 2, {}, now_ms=broker.clock.now_ms())
        for i in range(n):
            assert (await share_heartbeat(broker, "sg", f"m{i:03d}", 0, ("t",))).error_code == ErrorCode.none
        compared: list[int] = []
        real = group_service._members
        monkeypatch.setattr(group_service, "_members", lambda inner: compared.append(len(inner.members)) or
                            real(inner))
        caplog.clear()
        with caplog.at_level("INFO", logger="shoal.groups"):
            r = await share_heartbeat(broker, "sg", "late", 0, ("t",))
            assert r.error_code == ErrorCode.none
            g = svc.share_groups(svc.partition_for("sg")).group("sg")
            left = await share_heartbeat(broker, "sg", "m001", -1, None)
            assert left.error_code == ErrorCode.none and "m001" not in g.members
        lines = [rec.getMessage() for rec in caplog.records]
        assert sum("member late joined" in line for line in lines) == 1, lines
        assert sum("member m001 left" in line for line in lines) == 1, lines
        monkeypatch.undo()
        return sum(compared)

    assert asyncio.run(scenario(5)) == asyncio.run(scenario(200)) == 0
