"""The etcd metadata store: what Kafka keeps in KRaft, kept in etcd (asyncio shell).

Keys, under ``/shoal/`` (values are JSON):

* ``cluster_id``: written once, by the first broker (create-if-absent transaction);
* ``brokers/<node.id>``: a broker's registration ``{host, port, rack, registration,
  shutting_down, log_dir_offline}``, attached to its lease: a broker that stops refreshing
  it disappears within ``broker.session.timeout.ms``. ``registration`` is the lease id of
  the process's first registration, new at every start, so a restart is visible even
  before the old lease lapses; a broker whose lease etcd let expire (an outage of etcd
  longer than the session timeout) registers again under a new lease with the same
  epoch, and brokers that had trouble reaching etcd keep the lapsed brokers registered
  for one session timeout (``_carry_lapsed``), so an outage of the store fences nobody;
* ``controller``: the elected controller's node id, attached to its lease; created only if
  absent (a lease-backed election: whoever creates it leads until its lease goes);
* ``topics/<name>``: ``{topic_id, num_partitions, configs}``; created only if absent, then
  changed (partitions added, configs altered) by compare-and-swap on its mod revision;
* ``group_configs/<group id, percent-encoded>``: a group's config overrides (KIP-848 and
  KIP-932 group configs), changed by compare-and-swap on the key's mod revision and
  applied by every broker from its watch;
* ``client_quotas/<entity>``: one client quota entity and its values
  (shoal/security/quota_store.py), applied by every broker from its watch;
* ``acls/<hash>``: one ACL binding (shoal/security/authz.py);
* ``partitions/<name>/<index>``: a :class:`PartitionState`. Every write of one compares
  the key's mod revision with the one its writer read, in one transaction, so a writer
  that decided on stale state changes nothing (compare-and-swap on the partition epoch).

One watch on the prefix marks the local copy stale; a single loop then reads the whole
prefix again and hands the new :class:`Snapshot` to the listeners (replica manager,
controller), so bursts of changes cost one read and listeners always see a consistent
revision. Concurrency: event loop only.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, unquote

from .partition_state import PartitionState

log = logging.getLogger("shoal.cluster.etcd")

__all__ = ["BrokerInfo", "EtcdStore", "Snapshot", "TopicRecord", "parse_endpoints"]

PREFIX = b"/shoal/"


def parse_endpoints(url: str) -> list[tuple[str, int]]:
    """``etcd://h1:2379,h2:2379`` -> [(h1, 2379), (h2, 2379)]. Raises ValueError."""
    if not url.startswith("etcd://"):
        raise ValueError(f"metadata.store must be 'local' or etcd://host:port[,host:port], got {url!r}")
    out = []
    for part in url[len("etcd://"):].split(","):
        host, _, port = part.strip().rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"bad etcd endpoint {part!r}")
        out.append((host, int(port)))
    return out


@dataclass(frozen=True, slots=True)
class BrokerInfo:
    node_id: int
    host: str
    port: int
    rack: str | None
    registration: int
    shutting_down: bool = False
    log_dir_offline: bool = False
    """Its log directory failed (KIP-112): it leads and follows nothing until it recovers."""
    metrics_url: str | None = None
    """The broker's metrics endpoint and queue view (``metrics.port``), None when off."""
    endpoints: tuple[tuple[str, str, int], ...] = ()
    """(listener name, host, port) of every listener; host/port are the inter-broker listener's."""


@dataclass(frozen=True, slots=True)
class TopicRecord:
    name: str
    topic_id: uuid.UUID
    num_partitions: int
    configs: dict[str, str]
    mod_revision: int = field(default=0, compare=False)
    """The topic key's mod revision when read: writers compare it (compare-and-swap)."""


@dataclass(slots=True)
class Snapshot:
    revision: int = 0
    cluster_id: str = ""
    controller: int = -1
    brokers: dict[int, BrokerInfo] = field(default_factory=dict)
    topics: dict[str, TopicRecord] = field(default_factory=dict)
    partitions: dict[tuple[str, int], tuple[PartitionState, int]] = field(default_factory=dict)
    """(topic, index) -> (state, the key's mod revision)."""
    group_configs: dict[str, dict[str, str]] = field(default_factory=dict)
    """group id -> its config overrides."""
    client_quotas: dict[str, Any] = field(default_factory=dict)
    """key under ``client_quotas/`` -> the stored entity and values (shoal/security/quota_store.py)."""
    acls: dict[str, bytes] = field(default_factory=dict)
    """ACL key -> the binding (shoal/security/authz.py decodes them)."""

    def live(self) -> dict[int, int]:
        """node id -> registration epoch of every registered broker that can hold replicas
        (its log directory is online): the brokers the controller elects leaders from and
        keeps in the ISRs."""
        return {b.node_id: b.registration for b in self.brokers.values() if not b.log_dir_offline}

    def state(self, topic: str, index: int) -> PartitionState | None:
        got = self.partitions.get((topic, index))
        return got[0] if got is not None else None


def _key(*parts: str | int) -> bytes:
    return PREFIX + "/".join(str(p) for p in parts).encode()


class EtcdStore:
    def __init__(self, endpoints: list[tuple[str, int]], *, timeout_s: float = 5.0) -> None:
        self.endpoints = endpoints
        self.timeout_s = timeout_s
        self.client: Any = None
        self.snapshot = Snapshot()
        self.lease: Any = None
        self.registration = 0
        self._listeners: list[Callable[[Snapshot], Awaitable[None] | None]] = []
        self._stale = asyncio.Event()
        self._tasks: list[asyncio.Task[Any]] = []
        self._watch: Any = None
        self._closed = False
        self.loaded = asyncio.Event()
        self._session_lost: Callable[[], None] | None = None
        self._node_id = -1
        self._node_key = b""
        self._node_info: dict[str, Any] = {}
        self.grace_s = 0.0
        """How long a broker whose registration lapsed during trouble is still taken as
        registered (one session timeout)."""
        self.trouble_at = -math.inf
        """Loop time of this broker's latest failed (or just restored) contact with etcd."""
        self._regrace: asyncio.TimerHandle | None = None
        self._carried: set[int] = set()
        self._read_failing = self._watch_failing = False

    # -- connection ---------------------------------------------------------------------
    async def connect(self) -> None:
        try:
            import aetcd
        except ImportError:
            raise OSError("metadata.store=etcd:// needs the aetcd package (pip install 'shoal[cluster]')") from None

        last: Exception | None = None
        for host, port in self.endpoints:
            client = aetcd.Client(host, port, timeout=self.timeout_s)
            try:
                await asyncio.wait_for(client.connect(), self.timeout_s)
                await asyncio.wait_for(client.get(_key("cluster_id")), self.timeout_s)
            except Exception as e:  # aetcd raises several kinds for an unreachable member
                last = e
                with contextlib.suppress(Exception):
                    await client.close()
                continue
            self.client = client
            return
        raise OSError(f"cannot reach etcd at {self.endpoints}: {last}")

    async def close(self) -> None:
        self._closed = True
        if self._regrace is not None:
            self._regrace.cancel()
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(BaseException):
                await t
        self._tasks.clear()
        if self._watch is not None:
            with contextlib.suppress(Exception):
                await self._watch.cancel()
        if self.client is not None:
            with contextlib.suppress(Exception):
                await self.client.close()

    # -- cluster id ---------------------------------------------------------------------
    async def ensure_cluster_id(self, proposed: str) -> str:
        """The cluster's id: ``proposed`` if this is the first broker, else the stored one."""
        c = self.client
        key = _key("cluster_id")
        ok, responses = await c.transaction(
            compare=[c.transactions.create(key) == 0],
            success=[c.transactions.put(key, proposed.encode())],
            failure=[c.transactions.get(key)],
        )
        if ok:
            return proposed
        return responses[0][0][0].decode()

    # -- registration -------------------------------------------------------------------
    async def register(self, node_id: int, host: str, port: int, rack: str | None, session_timeout_ms: int,
                       on_session_lost: Callable[[], None], *, registration: int | None = None,
                       metrics_url: str | None = None, endpoints: dict[str, tuple[str, int]] | None = None) -> int:
        """Register under a new lease; returns the registration epoch.

        The epoch is the lease id at a process's first registration; ``registration``
        keeps an earlier one, for a broker that registers again after etcd let its lease
        expire (the same process, so the same incarnation). Raises RuntimeError when
        another live broker already holds ``node_id``.
        """
        c = self.client
        ttl = max(1, math.ceil(session_timeout_ms / 1000))
        self.grace_s = ttl
        lease = await c.lease(ttl)
        epoch = int(lease.id) if registration is None else registration
        key = _key("brokers", node_id)
        if registration is not None and self._node_info:
            info = dict(self._node_info, registration=epoch)
        else:
            info = {"host": host, "port": port, "rack": rack, "registration": epoch, "shutting_down": False,
                    "metrics_url": metrics_url}
            if endpoints:
                info["endpoints"] = {name: [h, p] for name, (h, p) in endpoints.items()}
        value = json.dumps(info).encode()
        ok, _ = await c.transaction(compare=[c.transactions.create(key) == 0],
                                    success=[c.transactions.put(key, value, lease=lease)], failure=[])
        if not ok and registration is not None:
            # our own key from before, still there: take it over with the new lease
            got = await c.get(key)
            if got is not None and json.loads(got.value).get("registration") == registration:
                ok, _ = await c.transaction(compare=[c.transactions.mod(key) == got.mod_revision],
                                            success=[c.transactions.put(key, value, lease=lease)], failure=[])
        if not ok:
            await lease.revoke()
            raise RuntimeError(f"node.id {node_id} is registered by another live broker")
        self.lease = lease
        self.registration = epoch
        self._node_id = node_id
        self._node_key = key
        self._node_info = info
        self._session_lost = on_session_lost
        self._tasks.append(asyncio.ensure_future(self._keep_alive(lease, ttl)))
        return self.registration

    def note_trouble(self) -> None:
        """This broker's contact with etcd failed, or just came back: brokers whose
        registration lapses now are not fenced for the next session timeout."""
        self.trouble_at = asyncio.get_running_loop().time()

    async def _keep_alive(self, lease: Any, ttl: int) -> None:
        """Refresh the lease every ttl/4 for as long as etcd knows it.

        A refresh that fails (etcd down, paused, unreachable) is retried without end: a
        broker keeps serving through an outage of the store, and a lease etcd kept (a
        restart keeps them) simply goes on. Only when etcd answers that the lease is gone
        (it expired: the outage was longer than the session timeout) is the session lost,
        and the broker registers again under the same registration epoch.
        """
        interval = max(0.2, ttl / 4)
        failing = False
        while not self._closed and self.lease is lease:
            await asyncio.sleep(interval)
            try:
                reply = await asyncio.wait_for(lease.refresh(), interval * 2)
                if reply is not None and reply.TTL <= 0:
                    raise LookupError("lease expired")
                if failing:
                    log.warning("etcd answers again: the broker lease is still valid")
                    failing = False
                    self.note_trouble()
                continue
            except asyncio.CancelledError:
                raise
            except LookupError as e:
                reason: Exception = e
            except Exception as e:
                if not failing:
                    log.warning("lease refresh failed (%s); retrying", e)
                failing = True
                self.note_trouble()
                continue
            if self._closed:
                return
            self.note_trouble()
            log.error("broker session lost (%s); registering again", reason)
            if self._session_lost is not None:
                self._session_lost()
            return

    async def set_shutting_down(self) -> None:
        await self.update_registration(shutting_down=True)

    async def update_registration(self, **changes: Any) -> None:
        """Change fields of this broker's registration (kept when it registers again)."""
        info = dict(self._node_info, **changes)
        await self.client.put(self._node_key, json.dumps(info).encode(), lease=self.lease)
        self._node_info = info
        self._stale.set()

    async def deregister(self) -> None:
        self._node_key = b""  # leaving: our key vanishing is no trouble
        if self.lease is not None:
            try:
                await asyncio.wait_for(self.lease.revoke(), self.timeout_s)
            except Exception as e:
                log.warning("could not revoke the broker lease: %s", e)

    # -- controller election ---------------------------------------------------------------
    async def campaign(self, node_id: int) -> bool:
        """Try to become controller (only if nobody is); the key lives as long as our lease."""
        c = self.client
        key = _key("controller")
        ok, _ = await c.transaction(
            compare=[c.transactions.create(key) == 0],
            success=[c.transactions.put(key, str(node_id).encode(), lease=self.lease)],
            failure=[],
        )
        return bool(ok)

    # -- snapshot and watch ---------------------------------------------------------------
    def add_listener(self, fn: Callable[[Snapshot], Awaitable[None] | None]) -> None:
        self._listeners.append(fn)

    async def start_watching(self) -> None:
        await self.reload()
        self._tasks.append(asyncio.ensure_future(self._watch_loop()))
        self._tasks.append(asyncio.ensure_future(self._reload_loop()))

    def mark_stale(self) -> None:
        self._stale.set()

    async def _watch_loop(self) -> None:
        """One watch on the prefix; when it breaks (etcd restarted, connection lost) a new
        one starts after a full reload, so no change is missed."""
        while not self._closed:
            try:
                self._watch = await self.client.watch_prefix(PREFIX, start_revision=self.snapshot.revision + 1)
                async for _ in self._watch:
                    self._stale.set()
            except asyncio.CancelledError:
                raise
            except Exception as e:
                if self._closed:
                    return
                if not self._watch_failing:  # once per outage, not at every attempt
                    log.warning("etcd watch broke (%s); watching again", e)
                    self._watch_failing = True
                self.note_trouble()
            await asyncio.sleep(0.5)
            self._stale.set()

    async def _reload_loop(self) -> None:
        while not self._closed:
            await self._stale.wait()
            self._stale.clear()
            try:
                await self.reload()
                if self._read_failing:
                    log.warning("reading cluster metadata works again")
                    self._read_failing = self._watch_failing = False
            except asyncio.CancelledError:
                raise
            except Exception as e:
                if not self._read_failing:  # once per outage, not at every attempt
                    log.warning("reading cluster metadata failed: %s; retrying", e)
                    self._read_failing = True
                self.note_trouble()
                await asyncio.sleep(0.2)
                self._stale.set()

    async def reload(self) -> None:
        got = await self.client.get_prefix(PREFIX)
        snap = Snapshot(revision=int(got.header.revision) if hasattr(got, "header") else 0)
        for kv in got:
            self._parse(snap, kv)
        if snap.revision == 0:
            snap.revision = max((kv.mod_revision for kv in got), default=0)
        if snap.revision < self.snapshot.revision:
            return  # an older read finished late
        self._carry_lapsed(snap)
        self.snapshot = snap
        self.loaded.set()
        for fn in self._listeners:
            try:
                r = fn(snap)
                if r is not None:
                    await r
            except Exception:
                log.exception("cluster metadata listener failed")

    def _carry_lapsed(self, snap: Snapshot) -> None:
        """Keep in ``snap`` the brokers whose registration vanished while this broker had
        trouble reaching etcd, for one session timeout after the trouble ended.

        When etcd was down or paused for longer than the session timeout, it expires
        every lease as it comes back, although the brokers kept running and serving: as
        Kafka's new controller waits a session for the brokers' heartbeats, a broker
        (and so the controller) keeps every broker it knew as registered, with the same
        registration epoch, until it had one session timeout of working contact, time for
        each of them to register again (under the same epoch). One that does not by then
        is gone. A broker that left on purpose (controlled shutdown) is not kept, and a
        broker with working contact keeps nobody: a lapsed lease then means a dead broker.
        """
        loop = asyncio.get_running_loop()
        if self._node_key and self._node_id not in snap.brokers and not self._closed:
            self.note_trouble()  # our own lease expired: etcd lost sight of us
        until = self.trouble_at + self.grace_s
        now = loop.time()
        carried = set()
        if now < until:
            for node_id, info in self.snapshot.brokers.items():
                if node_id not in snap.brokers and not info.shutting_down:
                    snap.brokers[node_id] = info
                    carried.add(node_id)
            if carried and self._regrace is None:
                def again() -> None:
                    self._regrace = None
                    self._stale.set()
                self._regrace = loop.call_at(until + 0.05, again)
        for node_id in sorted(carried - self._carried):
            log.warning("the registration of broker %d lapsed while etcd was unreachable; it stays registered"
                        " for %.1f s to register again", node_id, until - now)
        for node_id in sorted(self._carried - carried):
            if node_id not in snap.brokers:
                log.warning("broker %d did not register again: it is gone", node_id)
        self._carried = carried

    @staticmethod
    def _parse(snap: Snapshot, kv: Any) -> None:
        parts = kv.key[len(PREFIX):].decode().split("/")
        try:
            if parts == ["cluster_id"]:
                snap.cluster_id = kv.value.decode()
            elif parts == ["controller"]:
                snap.controller = int(kv.value)
            elif parts[0] == "brokers" and len(parts) == 2:
                d = json.loads(kv.value)
                endpoints = tuple((str(n), str(hp[0]), int(hp[1])) for n, hp in d.get("endpoints", {}).items())
                snap.brokers[int(parts[1])] = BrokerInfo(int(parts[1]), d["host"], int(d["port"]), d.get("rack"),
                                                         int(d["registration"]), bool(d.get("shutting_down")),
                                                         bool(d.get("log_dir_offline")), d.get("metrics_url"),
                                                         endpoints)
            elif parts[0] == "topics" and len(parts) == 2:
                d = json.loads(kv.value)
                snap.topics[parts[1]] = TopicRecord(parts[1], uuid.UUID(d["topic_id"]), int(d["num_partitions"]),
                                                    dict(d.get("configs", {})), kv.mod_revision)
            elif parts[0] == "group_configs" and len(parts) == 2:
                snap.group_configs[unquote(parts[1])] = dict(json.loads(kv.value))
            elif parts[0] == "client_quotas" and len(parts) == 2:
                snap.client_quotas[parts[1]] = json.loads(kv.value)
            elif parts[0] == "acls" and len(parts) == 2:
                snap.acls[parts[1]] = bytes(kv.value)
            elif parts[0] == "partitions" and len(parts) == 3:
                snap.partitions[(parts[1], int(parts[2]))] = (PartitionState.from_json(kv.value), kv.mod_revision)
        except (ValueError, KeyError, TypeError) as e:
            log.error("ignoring malformed cluster metadata key %s: %s", kv.key, e)

    # -- writes -----------------------------------------------------------------------------
    async def compare_and_set(self, changes: list[tuple[str, int, int, PartitionState]], *,
                              controller: int | None = None) -> bool:
        """Write partition states iff every key still has the mod revision read with it.

        ``changes`` holds (topic, index, mod revision read, new state). With ``controller``,
        the write also requires that node to still hold the controller key.
        """
        c = self.client
        compare = [c.transactions.mod(_key("partitions", t, i)) == rev for t, i, rev, _ in changes]
        if controller is not None:
            compare.append(c.transactions.value(_key("controller")) == str(controller).encode())
        ok, _ = await c.transaction(
            compare=compare,
            success=[c.transactions.put(_key("partitions", t, i), s.to_json()) for t, i, _, s in changes],
            failure=[],
        )
        if ok:
            self._stale.set()
        return bool(ok)

    async def create_topic(self, name: str, topic_id: uuid.UUID, configs: dict[str, str],
                           states: list[PartitionState]) -> bool:
        """Create a topic and its partitions in one transaction; False if it exists.

        The transaction is conditioned on the topic key not existing, so of two brokers
        creating the same topic at once exactly one succeeds.
        """
        c = self.client
        key = _key("topics", name)
        value = _topic_value(topic_id, len(states), configs)
        ok, _ = await c.transaction(
            compare=[c.transactions.create(key) == 0],
            success=[c.transactions.put(key, value)]
            + [c.transactions.put(_key("partitions", name, i), s.to_json()) for i, s in enumerate(states)],
            failure=[],
        )
        if ok:
            self._stale.set()
        return bool(ok)

    async def add_partitions(self, topic: TopicRecord, states: list[PartitionState]) -> bool:
        """Grow a topic (its key must still have ``topic.mod_revision``)."""
        c = self.client
        key = _key("topics", topic.name)
        new = _topic_value(topic.topic_id, topic.num_partitions + len(states), topic.configs)
        ok, _ = await c.transaction(
            compare=[c.transactions.mod(key) == topic.mod_revision],
            success=[c.transactions.put(key, new)]
            + [c.transactions.put(_key("partitions", topic.name, topic.num_partitions + i), s.to_json())
               for i, s in enumerate(states)],
            failure=[],
        )
        if ok:
            self._stale.set()
        return bool(ok)

    async def read_topic(self, name: str) -> TopicRecord | None:
        """The topic's record as etcd has it now (one key read, not the whole prefix)."""
        got = await self.client.get(_key("topics", name))
        if got is None:
            return None
        d = json.loads(got.value)
        return TopicRecord(name, uuid.UUID(d["topic_id"]), int(d["num_partitions"]), dict(d.get("configs", {})),
                           got.mod_revision)

    async def set_topic_configs(self, topic: TopicRecord, configs: dict[str, str]) -> bool:
        """Replace a topic's config overrides iff its key still has ``topic.mod_revision``."""
        c = self.client
        key = _key("topics", topic.name)
        ok, _ = await c.transaction(
            compare=[c.transactions.mod(key) == topic.mod_revision],
            success=[c.transactions.put(key, _topic_value(topic.topic_id, topic.num_partitions, configs))],
            failure=[],
        )
        if ok:
            self._stale.set()
        return bool(ok)

    async def read_group_configs(self, group_id: str) -> tuple[dict[str, str], int]:
        """A group's config overrides as etcd has them now, with the key's mod revision (0: no
        key); one key read, not the whole prefix."""
        got = await self.client.get(_group_configs_key(group_id))
        return ({}, 0) if got is None else (dict(json.loads(got.value)), got.mod_revision)

    async def set_group_configs(self, group_id: str, configs: dict[str, str], mod_revision: int) -> bool:
        """Replace a group's config overrides (none: delete the key) iff the key still has
        ``mod_revision`` (0: it must not exist)."""
        c = self.client
        key = _group_configs_key(group_id)
        change = (c.transactions.put(key, json.dumps(configs, sort_keys=True).encode()) if configs
                  else c.transactions.delete(key))
        ok, _ = await c.transaction(
            compare=[c.transactions.mod(key) == mod_revision] if mod_revision else [c.transactions.create(key) == 0],
            success=[change],
            failure=[],
        )
        if ok:
            self._stale.set()
        return bool(ok)

    async def reserve_producer_ids(self, block: int) -> int:
        """Reserve ``block`` producer ids for this broker; returns the first (Kafka's AllocateProducerIds).

        A compare-and-swap on ``producer_ids`` (the next free id), so no two brokers ever
        hand out the same id. Raises RuntimeError if it keeps losing the race.
        """
        c = self.client
        key = _key("producer_ids")
        for _ in range(50):
            got = await c.get(key)
            if got is None:
                start, compare = 0, [c.transactions.create(key) == 0]
            else:
                start, compare = int(got.value), [c.transactions.mod(key) == got.mod_revision]
            ok, _ = await c.transaction(compare=compare, success=[c.transactions.put(key, str(start + block).encode())],
                                        failure=[])
            if ok:
                return start
        raise RuntimeError("could not reserve producer ids")

    async def delete_topic(self, name: str) -> None:
        c = self.client
        await c.transaction(compare=[], success=[c.transactions.delete(_key("topics", name)),
                                                 c.transactions.delete(_key("partitions", name) + b"/",
                                                                       range_end=_prefix_end(_key("partitions", name)
                                                                                             + b"/"))],
                            failure=[])
        self._stale.set()

    async def wait_for(self, predicate: Callable[[Snapshot], bool], timeout_s: float) -> bool:
        """Wait until the local copy satisfies ``predicate`` (after our own writes)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while not predicate(self.snapshot):
            if loop.time() >= deadline:
                return False
            self._stale.set()
            await asyncio.sleep(0.02)
        return True


def _group_configs_key(group_id: str) -> bytes:
    return _key("group_configs", quote(group_id, safe=""))


def _topic_value(topic_id: uuid.UUID, num_partitions: int, configs: dict[str, str]) -> bytes:
    """A topic key's value; always encoded the same way, so writers can compare it."""
    return json.dumps({"topic_id": str(topic_id), "num_partitions": num_partitions, "configs": configs},
                      sort_keys=True).encode()


def _prefix_end(prefix: bytes) -> bytes:
    b = bytearray(prefix)
    b[-1] += 1
    return bytes(b)
