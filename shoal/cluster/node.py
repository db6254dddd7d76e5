"""Cluster mode for one broker: etcd store, registration, controller, replica manager.

Theory of operation
-------------------
Start (``Broker.start`` calls, in order): :meth:`ClusterNode.connect` before the log store
opens (the cluster id comes from etcd: the first broker's wins); :meth:`ClusterNode.start`
once the listener is bound: register under a lease of ``broker.session.timeout.ms``, read
and watch the metadata, stand for controller.

Every snapshot goes to the replica manager (leader/follower roles) and, on the
controller, to :meth:`_control`: for every partition :func:`reconcile` decides whether
its leader or ISR must change given the registered brokers, and the changes are written
as compare-and-swap transactions that also require this broker to still hold the
controller key. Whoever holds the key (a lease-backed election) is the only writer of
leader elections; leaders write their own ISR changes.

Topic administration (CreateTopics, CreatePartitions, DeleteTopics, AlterConfigs of topics,
AlterPartitionReassignments) is done by the broker that receives the request, in one etcd
transaction each (a topic is created only if its key is absent; other changes compare the
key's mod revision), with the same placement code the controller would use; it answers
once its own copy of the metadata shows the change.

Reassignment: the receiving broker writes the target into the partition's record
(``adding``/``removing``, see ``partition_state.py``); the added replicas follow the
leader like any follower and join the ISR when caught up; at each snapshot the controller
completes every reassignment whose target replicas are all in sync (switching the replica
set and, if needed, the leader) before its usual leader and ISR decisions. Removed
replicas empty their local log (``ReplicaManager.apply``).

An outage of etcd fences nobody: the lease is refreshed for as long as etcd knows it; when
etcd expired it (a pause longer than the session timeout), :meth:`_session_lost`
registers again under the same registration epoch, and while this broker's contact had
trouble its copy of the metadata keeps the brokers whose registration lapsed for one
session timeout (``EtcdStore._carry_lapsed``), so the controller sees them as they were.
A broker whose log directory is offline (``replica_manager.py``) stays registered with
``log_dir_offline`` set; ``Snapshot.live()`` leaves it out of every decision.

Stop (SIGTERM, ``controlled.shutdown.enable``): the registration is marked
``shutting_down``; the controller moves every leadership that has another in-sync
replica; the broker waits for that (at most ``shutdown.timeout.ms``), stops its fetchers
and revokes its lease, so the cluster sees it gone at once.
"""

from __future__ import annotations

import asyncio
import logging
import random
import uuid
from collections.abc import Callable
from typing import Any

from ..errors import ApiError, ErrorCode
from ..log.store import validate_topic_configs, validate_topic_name
from .etcd_store import EtcdStore, Snapshot, parse_endpoints
from .metadata import BrokerEndpoint, PartitionView
from .partition_state import (
    ReassignmentError,
    cancel_reassignment,
    complete_reassignment,
    initial_state,
    reconcile,
    start_reassignment,
)
from .placement import assign_replicas
from .replica_manager import ReplicaManager

log = logging.getLogger("shoal.cluster")

ADMIN_TIMEOUT_S = 10.0


class ClusterNode:
    clustered = True

    def __init__(self, broker: Any) -> None:
        self.broker = broker
        self.config = broker.config
        self.store = EtcdStore(parse_endpoints(self.config["metadata.store"]))
        self.registration = 0
        self.replicas = ReplicaManager(self)
        self._closed = False
        self._control_running = False
        self._control_again = False
        self._rebalance_due = False
        self._leaving = False
        self._pid_next = self._pid_limit = 0
        self._pid_lock = asyncio.Lock()
        self._tasks: list[asyncio.Task[Any]] = []
        self._metadata_revision = -1

    # -- lifecycle ------------------------------------------------------------------------
    async def connect(self, proposed_cluster_id: str) -> str:
        await self.store.connect()
        return await self.store.ensure_cluster_id(proposed_cluster_id)

    async def start(self) -> None:
        b = self.broker
        await self._register()
        self.store.add_listener(self._on_snapshot)
        await self.store.start_watching()
        self.replicas.start()
        if self.config["auto.leader.rebalance.enable"]:
            self._tasks.append(asyncio.ensure_future(self._rebalance_timer()))
        # Serve clients only once the metadata lists this broker and a controller (as a Kafka
        # broker enables its listeners once registered): a Metadata answer without them makes
        # clients such as librdkafka's admin client wait, for their whole timeout, for one.
        timeout_s = self.config["broker.session.timeout.ms"] / 1000
        if not await self.store.wait_for(lambda s: b.node_id in s.brokers and s.controller >= 0, timeout_s):
            log.warning("no controller elected within %.0f s; serving clients anyway", timeout_s)
        log.info("node %d joined cluster %s (registration %d)", b.node_id, self.store.snapshot.cluster_id,
                 self.registration)

    async def _register(self, *, again: bool = False) -> None:
        """Register (``again``: under the registration epoch this process already has)."""
        b = self.broker
        rack = self.config["broker.rack"] or None
        deadline = asyncio.get_running_loop().time() + self.config["broker.session.timeout.ms"] / 1000 + 5
        while True:
            try:
                sec = getattr(b, "security", None)
                host, port = (b.advertised_host, b.advertised_port) if sec is None else \
                    sec.advertised[sec.inter_broker.name]  # what the other brokers connect to
                self.registration = await self.store.register(
                    b.node_id, host, port, rack, self.config["broker.session.timeout.ms"],
                    self._session_lost, registration=self.registration if again else None,
                    metrics_url=b.observe.url if b.observe is not None else None,
                    endpoints=None if sec is None else sec.advertised)
                return
            except RuntimeError:
                # our previous incarnation's lease has not lapsed yet (a quick restart)
                if asyncio.get_running_loop().time() > deadline:
                    raise
                await asyncio.sleep(0.25)

    def _session_lost(self) -> None:
        if self._closed:
            return

        async def again() -> None:
            while not self._closed:
                try:
                    await self._register(again=True)
                    log.warning("registered again (registration %d kept)", self.registration)
                    self.store.mark_stale()
                    return
                except Exception as e:
                    log.error("cannot register again: %s", e)
                    await asyncio.sleep(0.25)

        self._tasks.append(asyncio.ensure_future(again()))

    async def shutdown(self) -> None:
        """Controlled shutdown, then leave the cluster."""
        self._leaving = True
        if self.config["controlled.shutdown.enable"] and self.store.client is not None:
            try:
                await self.store.set_shutting_down()
                deadline = asyncio.get_running_loop().time() + self.config["shutdown.timeout.ms"] / 1000
                while asyncio.get_running_loop().time() < deadline and self._leads_movable():
                    self.store.mark_stale()
                    await asyncio.sleep(0.05)
            except Exception as e:
                log.warning("controlled shutdown incomplete: %s", e)
        self._closed = True
        for t in self._tasks:
            t.cancel()
        await self.replicas.close()
        await self.store.deregister()
        await self.store.close()

    def _leads_movable(self) -> bool:
        """Whether this broker still leads a partition that another live in-sync replica could lead."""
        snap = self.store.snapshot
        me = self.broker.node_id
        for state, _ in snap.partitions.values():
            if state.leader == me and any(r != me and r in snap.brokers for r in state.isr):
                return True
        return False

    # -- snapshots --------------------------------------------------------------------------
    async def _on_snapshot(self, snap: Snapshot) -> None:
        self.replicas.apply(snap)
        self.broker.dynamic_configs.adopt_groups(snap.group_configs)
        if snap.revision != self._metadata_revision:
            # Brokers, leaders or ISRs may have changed: cached Metadata responses are stale.
            self._metadata_revision = snap.revision
            self.broker.store.bump_metadata_version()
        if self._closed:
            return
        if snap.controller < 0 and not self._leaving:
            try:
                if await self.store.campaign(self.broker.node_id):
                    log.info("node %d is the controller", self.broker.node_id)
            except Exception as e:  # our lease expired (registering again) or etcd went away
                log.warning("cannot stand for controller: %s", e)
            self.store.mark_stale()
            return
        if snap.controller == self.broker.node_id:
            self._control_again = True
            if not self._control_running:
                self._tasks.append(asyncio.ensure_future(self._control()))

    async def _control(self) -> None:
        self._control_running = True
        try:
            while self._control_again:
                self._control_again = False
                snap = self.store.snapshot
                if snap.controller != self.broker.node_id:
                    return
                prefer, self._rebalance_due = self._rebalance_due, False
                live = snap.live()
                stopping = {b.node_id for b in snap.brokers.values() if b.shutting_down}
                changes = []
                for (topic, index), (state, rev) in snap.partitions.items():
                    new = complete_reassignment(state, live, shutting_down=stopping) or state
                    if new is not state:
                        log.info("controller: reassignment of %s-%d to %s complete", topic, index,
                                 list(new.replicas))
                    new = reconcile(new, live, shutting_down=stopping, prefer=prefer) or new
                    if new is not state:
                        changes.append((topic, index, rev, new))
                for i in range(0, len(changes), 64):
                    chunk = changes[i:i + 64]
                    ok = await self.store.compare_and_set(chunk, controller=self.broker.node_id)
                    for t, p, _, new in chunk:
                        log.info("controller: %s-%d leader %d epoch %d isr %s%s", t, p, new.leader,
                                 new.leader_epoch, list(new.isr), "" if ok else " (stale, retrying)")
                    if not ok:
                        self._control_again = True
                if self._control_again:
                    await self.store.wait_for(lambda s, snap=snap: s.revision > snap.revision, 2)
        except Exception:
            log.exception("controller pass failed")
            await asyncio.sleep(0.5)
            self.store.mark_stale()
        finally:
            self._control_running = False

    async def _rebalance_timer(self) -> None:
        interval = self.config["leader.imbalance.check.interval.seconds"]
        while True:
            await asyncio.sleep(interval)
            self._rebalance_due = True
            self.store.mark_stale()

    # -- the metadata interface -----------------------------------------------------------------
    def brokers(self) -> list[BrokerEndpoint]:
        return [BrokerEndpoint(b.node_id, b.host, b.port, b.rack, b.endpoints)
                for b in sorted(self.store.snapshot.brokers.values(), key=lambda b: b.node_id)]

    def controller_id(self) -> int:
        return self.store.snapshot.controller

    def partition(self, topic: str, index: int) -> PartitionView | None:
        snap = self.store.snapshot
        state = snap.state(topic, index)
        if state is None:
            return None
        live = snap.live()
        return PartitionView(state.leader, state.leader_epoch, state.replicas, state.isr,
                             tuple(r for r in state.replicas if r not in live))

    def coordinator(self) -> BrokerEndpoint | None:
        snap = self.store.snapshot
        b = snap.brokers.get(snap.controller)
        return BrokerEndpoint(b.node_id, b.host, b.port, b.rack, b.endpoints) if b is not None else None

    # -- producer ids -------------------------------------------------------------------------
    PRODUCER_ID_BLOCK = 1000

    async def allocate_producer_id(self) -> int:
        """A producer id unique in the cluster, from a block reserved in etcd.

        Raises ApiError(coordinator_not_available) when etcd cannot be reached.
        """
        async with self._pid_lock:
            if self._pid_next >= self._pid_limit:
                try:
                    start = await self.store.reserve_producer_ids(self.PRODUCER_ID_BLOCK)
                except Exception as e:
                    raise ApiError(ErrorCode.coordinator_not_available, f"cannot reserve producer ids: {e}") from e
                self._pid_next, self._pid_limit = start, start + self.PRODUCER_ID_BLOCK
            pid = self._pid_next
            self._pid_next += 1
            return pid

    # -- topic administration ---------------------------------------------------------------------
    def _placement(self, num_partitions: int, rf: int, first: int = 0, start: int | None = None) -> list[list[int]]:
        snap = self.store.snapshot
        brokers = {b.node_id: b.rack for b in snap.brokers.values() if not b.shutting_down}
        if start is None:
            start = random.randrange(max(1, len(brokers)))
        return assign_replicas(brokers, num_partitions, rf, start=start, first_partition=first)

    async def create_topic(self, name: str, num_partitions: int, replication_factor: int, configs: dict[str, str],
                           assignments: list[list[int]] | None, *, validate_only: bool) -> tuple[uuid.UUID, int]:
        """Create a topic in etcd; returns (topic id, replication factor). Raises ApiError."""
        validate_topic_name(name)
        configs = {k: str(v) for k, v in configs.items()}
        validate_topic_configs(configs)
        await self.store.reload()  # place over the brokers registered now, not at the last watch event
        snap = self.store.snapshot
        if name in snap.topics:
            raise ApiError(ErrorCode.topic_already_exists, f"topic {name!r} already exists")
        if assignments:
            for reps in assignments:
                if not reps or len(set(reps)) != len(reps):
                    raise ApiError(ErrorCode.invalid_replica_assignment, "duplicate or empty replica list")
                if any(r not in snap.brokers for r in reps):
                    raise ApiError(ErrorCode.invalid_replica_assignment, "assignment names an unknown broker")
            placement = [list(r) for r in assignments]
        else:
            rf = replication_factor if replication_factor != -1 else self.config["default.replication.factor"]
            if num_partitions < 1:
                raise ApiError(ErrorCode.invalid_partitions, "the number of partitions must be at least 1")
            placement = self._placement(num_partitions, rf)
        rf = len(placement[0])
        if validate_only:
            return uuid.UUID(int=0), rf
        topic_id = uuid.uuid4()
        live = snap.live()
        states = [initial_state(reps, live) for reps in placement]
        if not await self.store.create_topic(name, topic_id, configs, states):
            raise ApiError(ErrorCode.topic_already_exists, f"topic {name!r} already exists")
        await self.store.wait_for(lambda s: name in s.topics and self.broker.store.get_topic(name) is not None,
                                  ADMIN_TIMEOUT_S)
        return topic_id, rf

    async def create_partitions(self, name: str, total: int, assignments: list[list[int]] | None = None, *,
                                validate_only: bool) -> None:
        """Grow a topic to ``total`` partitions, placed by ``assignments`` (one replica list per new
        partition) or by the placement code. Raises ApiError."""
        await self.store.reload()
        snap = self.store.snapshot
        rec = snap.topics.get(name)
        if rec is None:
            raise ApiError(ErrorCode.unknown_topic_or_partition)
        if total <= rec.num_partitions:
            raise ApiError(ErrorCode.invalid_partitions,
                           f"topic has {rec.num_partitions} partitions; a new count must be larger")
        first = snap.state(name, 0)
        rf = len(first.replicas) - len(first.adding) if first is not None else 1
        if assignments:
            if len(assignments) != total - rec.num_partitions:
                raise ApiError(ErrorCode.invalid_replica_assignment,
                               f"{len(assignments)} assignments for {total - rec.num_partitions} new partitions")
            for reps in assignments:
                if len(reps) != rf:
                    raise ApiError(ErrorCode.invalid_replica_assignment,
                                   f"inconsistent replication factor: {list(reps)} for a topic with {rf}")
                if len(set(reps)) != len(reps):
                    raise ApiError(ErrorCode.invalid_replica_assignment, f"duplicate broker in {list(reps)}")
                unknown = [r for r in reps if r not in snap.brokers]
                if unknown:
                    raise ApiError(ErrorCode.invalid_replica_assignment, f"unknown brokers {unknown}")
            placement = [list(r) for r in assignments]
        else:
            placement = self._placement(total - rec.num_partitions, rf, first=rec.num_partitions)
        if validate_only:
            return
        live = snap.live()
        if not await self.store.add_partitions(rec, [initial_state(r, live) for r in placement]):
            raise ApiError(ErrorCode.reassignment_in_progress, "the topic changed meanwhile; retry")
        await self.store.wait_for(lambda s: s.topics.get(name) is not None
                                  and s.topics[name].num_partitions == total, ADMIN_TIMEOUT_S)

    async def alter_topic_configs(self, name: str, change: Callable[[dict[str, str]], dict[str, str]], *,
                                  validate_only: bool) -> tuple[dict[str, str], dict[str, str]]:
        """Set a topic's config overrides to ``change(current)`` in etcd; returns (old, new).

        A compare-and-swap on the topic key (retried when another change came first); every
        broker applies the new configs from its metadata watch, this one before it answers.
        Raises ApiError (``change`` raises for invalid configs).
        """
        for _ in range(10):
            rec = await self.store.read_topic(name)
            if rec is None:
                raise ApiError(ErrorCode.unknown_topic_or_partition)
            new = change(dict(rec.configs))
            validate_topic_configs(new)
            if validate_only or new == rec.configs:
                return dict(rec.configs), new
            if await self.store.set_topic_configs(rec, new):
                await self.store.wait_for(
                    lambda s, new=new: (m := self.broker.store.get_topic(name)) is not None and m.configs == new,
                    ADMIN_TIMEOUT_S)
                return dict(rec.configs), new
        raise ApiError(ErrorCode.request_timed_out, f"the configs of {name} kept changing; retry")

    async def alter_group_configs(self, group_id: str, change: Callable[[dict[str, str]], dict[str, str]], *,
                                  validate_only: bool) -> tuple[dict[str, str], dict[str, str]]:
        """Set a group's config overrides to ``change(current)`` in etcd; returns (old, new).

        Group configs are the cluster's, as in Kafka's metadata: the share-partition leaders
        read ``share.auto.offset.reset`` or ``share.delivery.count.limit`` on whichever broker
        leads a partition. A compare-and-swap on the group's key (retried when another change
        came first); every broker applies it from its metadata watch, this one before it
        answers. Raises ApiError (``change`` raises for invalid configs).
        """
        for _ in range(10):
            current, rev = await self.store.read_group_configs(group_id)
            new = change(dict(current))
            if validate_only or new == current:
                return dict(current), new
            if await self.store.set_group_configs(group_id, new, rev):
                await self.store.wait_for(
                    lambda s, new=new: self.broker.dynamic_configs.groups.get(group_id, {}) == new, ADMIN_TIMEOUT_S)
                return dict(current), new
        raise ApiError(ErrorCode.request_timed_out, f"the configs of group {group_id} kept changing; retry")

    async def elect_preferred(self, topic: str, index: int) -> None:
        """Make the preferred replica lead (ElectLeaders). Raises ApiError when it cannot or need not."""
        snap = self.store.snapshot
        got = snap.partitions.get((topic, index))
        if got is None:
            raise ApiError(ErrorCode.unknown_topic_or_partition)
        state, rev = got
        preferred = state.replicas[0]
        if state.leader == preferred:
            raise ApiError(ErrorCode.election_not_needed)
        stopping = {b.node_id for b in snap.brokers.values() if b.shutting_down}
        new = reconcile(state, snap.live(), shutting_down=stopping, prefer=True)
        if new is None or new.leader != preferred:
            raise ApiError(ErrorCode.preferred_leader_not_available,
                           f"broker {preferred} is not live and in the ISR of {topic}-{index}")
        if not await self.store.compare_and_set([(topic, index, rev, new)]):
            raise ApiError(ErrorCode.preferred_leader_not_available, "the partition changed meanwhile; retry")
        await self.store.wait_for(lambda s: (st := s.state(topic, index)) is not None and st.leader == preferred,
                                  ADMIN_TIMEOUT_S)

    # -- reassignment ------------------------------------------------------------------------------
    async def reassign(self, targets: list[tuple[str, int, list[int] | None]]) -> list[ApiError | None]:
        """Start (a replica list) or cancel (None) the reassignment of each partition; the outcome of each.

        Each is a compare-and-swap on the partition's record (retried on a newer record).
        The controller completes it once the target replicas are in the ISR; this only
        waits until its own copy of the metadata shows the change.
        """
        await self.store.reload()
        out: list[ApiError | None] = []
        for topic, index, target in targets:
            try:
                await self._reassign_one(topic, index, target)
                out.append(None)
            except ApiError as e:
                out.append(e)
        return out

    async def _reassign_one(self, topic: str, index: int, target: list[int] | None) -> None:
        for _ in range(10):
            snap = self.store.snapshot
            got = snap.partitions.get((topic, index))
            if got is None or topic not in snap.topics:
                raise ApiError(ErrorCode.unknown_topic_or_partition)
            state, rev = got
            live = snap.live()
            stopping = {b.node_id for b in snap.brokers.values() if b.shutting_down}
            try:
                if target is None:
                    new = cancel_reassignment(state, live, shutting_down=stopping)
                else:
                    unknown = [b for b in target if b not in snap.brokers]
                    if unknown:
                        raise ApiError(ErrorCode.invalid_replica_assignment,
                                       f"the assignment names brokers {unknown}, which are not registered")
                    got_new = start_reassignment(state, target)
                    if got_new is None:
                        return
                    new = got_new
            except ReassignmentError as e:
                code = ErrorCode.no_reassignment_in_progress if e.none_in_progress \
                    else ErrorCode.invalid_replica_assignment
                raise ApiError(code, str(e)) from None
            if await self.store.compare_and_set([(topic, index, rev, new)]):
                log.info("%s-%d: %s", topic, index,
                         "reassignment cancelled" if target is None else f"reassigning to {target}")
                await self.store.wait_for(
                    lambda s, new=new: (st := s.state(topic, index)) is not None and st.partition_epoch >= new.partition_epoch,
                    ADMIN_TIMEOUT_S)
                return
            await self.store.reload()
        raise ApiError(ErrorCode.request_timed_out, f"{topic}-{index} kept changing; retry")

    def reassignments(self) -> dict[tuple[str, int], tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]]:
        """Ongoing reassignments: (topic, index) -> (replicas, adding, removing)."""
        return {key: (st.replicas, st.adding, st.removing)
                for key, (st, _) in self.store.snapshot.partitions.items() if st.reassigning}

    async def delete_topic(self, name: str) -> None:
        if name not in self.store.snapshot.topics:
            raise ApiError(ErrorCode.unknown_topic_or_partition)
        await self.store.delete_topic(name)
        await self.store.wait_for(lambda s: name not in s.topics and self.broker.store.get_topic(name) is None,
                                  ADMIN_TIMEOUT_S)
