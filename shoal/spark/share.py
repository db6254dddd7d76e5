"""Streaming read from a KIP-932 share group: ``readStream.format("shoal").option("shareGroup", G)``.

Theory of operation
-------------------
KIP-932 rules that shape the design: only the member that acquired a record may
acknowledge it; closing a share session (epoch -1), dropping its connection, or opening
a new session for the same member (epoch 0) releases the records acquired in it; a
member that stops heartbeating is fenced and its records are released. A session is
keyed by (group, member) and can be continued from another connection by whoever knows
its next epoch.

* **Members.** The driver-side reader owns ``numTasks`` member ids (UUIDs, fixed for the
  life of the reader) and keeps them alive with ShareGroupHeartbeat from a background
  thread, at the interval the coordinator asks for, learning each member's assignment.
* **Tasks.** Every micro-batch has ``numTasks`` input partitions; task k fetches as member
  k with ShareFetch, up to ``maxRecordsPerTask`` records (the first fetch waits up to
  ``maxWaitMs``), keeps only the offsets inside the AcquiredRecords ranges and yields them
  with their ``deliveryCount``. It does not close the session nor the connection: the
  connection stays in a module-level cache of the Python worker, keyed by (bootstrap,
  group, member), so the acquired records stay acquired after the task ends.
* **Member state file.** ``<stateDir>/<group>/<member>.json`` (under an ``flock``) holds the
  session's next epoch and the ranges acquired per micro-batch and not yet acknowledged.
  A task writes the ranges it acquired before it yields a single row.
* **Acknowledgement after commit.** Spark calls ``commit(end)`` once micro-batch N is in the
  commit log. The driver then, for each member, continues the member's session with the
  epoch from its state file (on its own connection) and acknowledges the ranges of batches
  <= N with ACCEPT (or RELEASE/REJECT where :func:`shoal.spark.release`/``reject`` asked).
  If the driver cannot see the state files (executors on other hosts), the next task of
  member k does the same before fetching: its batch starts only after N committed.
* **Retries.** A task that finds ranges of its *own* micro-batch in the state file is a
  retry of a failed attempt: it RELEASEs them (they come back with a higher delivery
  count) before fetching. A task whose worker process died lost its connection, so the
  broker released its records already.

Guarantees: at-least-once. Exactly once when nothing fails and every task's worker shares
a file system with the driver (local mode, or a cluster on one host / with ``stateDir`` on
shared storage). A failed task, executor or driver: its records come back after the
connection drops, the member is fenced, or the acquisition lock expires
(``group.share.record.lock.duration.ms``), with a higher ``deliveryCount``. When the state
is not shared, a task of member k that runs in a new place opens a new session, which
releases member k's records of the last, committed batch: they are delivered again.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from kio.schema.errors import ErrorCode
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition

from ..client.connection import Connection, KafkaProtocolError
from ..client.share import ACCEPT, REJECT, RELEASE, ShareMembership, ShareSession, topic_metadata
from .options import Options, to_arrow_batch

log = logging.getLogger("shoal.spark.share")

__all__ = ["ShareStreamReader", "ShareTask", "note_dispositions", "default_state_dir"]

_SESSION_GONE = (ErrorCode.invalid_share_session_epoch, ErrorCode.share_session_not_found)
_KINDS = {"accept": ACCEPT, "release": RELEASE, "reject": REJECT}
ARROW_ROWS = 8192


def default_state_dir() -> str:
    return os.path.join(tempfile.gettempdir(), "shoal-spark-share")


def _group_dir(state_dir: str, group: str) -> str:
    safe = "".join(ch if ch.isalnum() or ch in "._-" else "_" for ch in group)
    path = os.path.join(state_dir, safe)
    os.makedirs(os.path.join(path, "dispositions"), exist_ok=True)
    return path


# --- member state files ----------------------------------------------------------------------

class MemberState:
    """The state file of one member, read and written under an exclusive flock."""

    def __init__(self, state_dir: str, group: str, member_id: str) -> None:
        self.path = os.path.join(_group_dir(state_dir, group), f"{member_id}.json")
        self.epoch = 0
        self.pending: list[dict[str, Any]] = []  # [{"batch": n, "ranges": {"tid:p": [[a, b], ...]}}]
        self._fd: int | None = None

    def __enter__(self) -> MemberState:
        self._fd = os.open(self.path + ".lock", os.O_CREAT | os.O_RDWR, 0o644)
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            with open(self.path) as f:
                data = json.load(f)
            self.epoch = int(data.get("epoch", 0))
            self.pending = list(data.get("pending", []))
        except FileNotFoundError:
            pass
        return self

    def save(self) -> None:
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"epoch": self.epoch, "pending": self.pending}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


def _key(tid: uuid.UUID, p: int) -> str:
    return f"{tid}:{p}"


def _unkey(k: str) -> tuple[uuid.UUID, int]:
    t, _, p = k.rpartition(":")
    return uuid.UUID(t), int(p)


def _acks(entries: Sequence[Mapping[str, Any]], kind: int, overrides: Mapping[tuple[uuid.UUID, int, int], int]
          ) -> dict[tuple[uuid.UUID, int], list[tuple[int, int, int]]]:
    """Acknowledgement batches for the ranges of ``entries``, ``overrides`` cut out per offset."""
    out: dict[tuple[uuid.UUID, int], list[tuple[int, int, int]]] = {}
    for e in entries:
        for k, ranges in e["ranges"].items():
            tid, p = _unkey(k)
            lst = out.setdefault((tid, p), [])
            for a, b in ranges:
                special = sorted(o for (t2, p2, o) in overrides if t2 == tid and p2 == p and a <= o <= b) \
                    if overrides else []
                cur = a
                for o in special:
                    if cur < o:
                        lst.append((cur, o - 1, kind))
                    lst.append((o, o, overrides[(tid, p, o)]))
                    cur = o + 1
                if cur <= b:
                    lst.append((cur, b, kind))
    return {k: sorted(v) for k, v in out.items() if v}


# --- dispositions (release/reject on request) --------------------------------------------------

def note_dispositions(rows: Any, *, state_dir: str | None, share_group: str, kind: str) -> int:
    """Record that these rows' records must be acknowledged with ``kind`` instead of ACCEPT."""
    if kind not in _KINDS:
        raise ValueError(f"kind must be one of {sorted(_KINDS)}")
    if hasattr(rows, "select"):
        rows = rows.select("topic", "partition", "offset").collect()
    items = [[r["topic"], int(r["partition"]), int(r["offset"]), kind] for r in rows]
    if not items:
        return 0
    d = os.path.join(_group_dir(state_dir or default_state_dir(), share_group), "dispositions")
    path = os.path.join(d, f"{uuid.uuid4()}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(items, f)
    os.replace(path + ".tmp", path)
    return len(items)


def _load_dispositions(state_dir: str, group: str, ids: Mapping[str, uuid.UUID]
                       ) -> tuple[dict[tuple[uuid.UUID, int, int], int], list[str]]:
    d = os.path.join(_group_dir(state_dir, group), "dispositions")
    out: dict[tuple[uuid.UUID, int, int], int] = {}
    files = []
    for name in sorted(os.listdir(d)):
        if not name.endswith(".json"):
            continue
        path = os.path.join(d, name)
        try:
            with open(path) as f:
                for topic, p, o, kind in json.load(f):
                    if topic in ids:
                        out[(ids[topic], int(p), int(o))] = _KINDS[kind]
        except (OSError, ValueError):
            continue
        files.append(path)
    return out, files


# --- executor side -----------------------------------------------------------------------------

_CONNECTIONS: dict[tuple[str, str, str], Connection] = {}
_CONNECTIONS_LOCK = threading.Lock()


def _connection(bootstrap: str, group: str, member_id: str) -> Connection:
    """The worker process's connection for this member (kept open across tasks)."""
    key = (bootstrap, group, member_id)
    with _CONNECTIONS_LOCK:
        conn = _CONNECTIONS.get(key)
        if conn is None or not conn.connected:
            conn = Connection.to(bootstrap, client_id=f"shoal-spark-{member_id[:8]}")
            _CONNECTIONS[key] = conn
        return conn


class ShareTask(InputPartition):
    """Task k of micro-batch ``batch``: fetch as ``member_id`` from ``partitions``."""

    def __init__(self, batch: int, index: int, member_id: str, partitions: list[tuple[str, str, int]],
                 overrides: dict[tuple[str, int, int], int]) -> None:
        super().__init__((batch, index))
        self.batch = batch
        self.index = index
        self.member_id = member_id
        self.partitions = partitions  # (topic id, topic name, partition)
        self.overrides = overrides  # (topic id, partition, offset) -> acknowledge type


def read_share_task(opts: Options, task: ShareTask, arrow_schema: Any) -> Iterator[Any]:
    group = opts.share_group or ""
    state_dir = opts.state_dir or default_state_dir()
    names = {uuid.UUID(t): name for t, name, _ in task.partitions}
    wanted = [(uuid.UUID(t), p) for t, _, p in task.partitions]
    overrides = {(uuid.UUID(t), p, o): k for (t, p, o), k in task.overrides.items()}
    batches = []
    with MemberState(state_dir, group, task.member_id) as st:
        conn = _connection(opts.bootstrap, group, task.member_id)
        session = ShareSession(conn, group, task.member_id, epoch=st.epoch)
        older = [e for e in st.pending if e["batch"] < task.batch]
        mine = [e for e in st.pending if e["batch"] >= task.batch]  # a failed attempt of this batch
        acks = _acks(older, ACCEPT, overrides)
        for k, v in _acks(mine, RELEASE, {}).items():
            acks.setdefault(k, []).extend(v)
        if acks and session.epoch != 0:
            try:
                failed = session.acknowledge(acks)
                if failed:
                    log.info("member %s: acknowledgements refused: %s", task.member_id, failed)
            except KafkaProtocolError as e:
                if e.code not in _SESSION_GONE:
                    raise
                session.epoch = 0  # the session is gone: the broker released those records
        st.pending = []
        st.epoch = session.epoch
        st.save()

        cols: dict[str, list[Any]] = {n: [] for n in arrow_schema.names}
        acquired: dict[str, list[list[int]]] = {}
        total = 0
        first = True
        while total < opts.max_records_per_task:
            try:
                res = session.fetch(wanted, max_wait_ms=opts.max_wait_ms if first else 0,
                                    max_records=opts.max_records_per_task - total)
            except KafkaProtocolError as e:
                if e.code in _SESSION_GONE and session.epoch != 0:
                    session.epoch = 0
                    continue
                raise
            first = False
            for (tid, p), ranges in res.acquired.items():
                acquired.setdefault(_key(tid, p), []).extend([a, b] for a, b in ranges)
            st.epoch = session.epoch
            if acquired:
                st.pending = [{"batch": task.batch, "ranges": acquired}]
            st.save()  # before any row leaves this task
            for r in res.records:
                rec = r.record
                cols["key"].append(rec.key)
                cols["value"].append(rec.value)
                cols["topic"].append(names.get(r.topic_id, str(r.topic_id)))
                cols["partition"].append(r.partition)
                cols["offset"].append(rec.offset)
                cols["timestamp"].append(rec.timestamp if rec.timestamp >= 0 else None)
                cols["timestampType"].append(1 if rec.attributes & 0x08 else 0)
                if "headers" in cols:
                    cols["headers"].append([{"key": k, "value": v} for k, v in rec.headers])
                cols["deliveryCount"].append(r.delivery_count)
            got = sum(b - a + 1 for rs in res.acquired.values() for a, b in rs)
            total += got
            if len(cols["offset"]) >= ARROW_ROWS:
                batches.append(to_arrow_batch(cols, arrow_schema))
                cols = {n: [] for n in arrow_schema.names}
            if got == 0:
                break
        if cols["offset"]:
            batches.append(to_arrow_batch(cols, arrow_schema))
    yield from batches


# --- driver side -------------------------------------------------------------------------------

class _Heartbeats(threading.Thread):
    """Keeps the members alive; one connection, one heartbeat per member per interval."""

    def __init__(self, bootstrap: str, members: list[ShareMembership]) -> None:
        super().__init__(name="shoal-share-heartbeat", daemon=True)
        self.bootstrap = bootstrap
        self.members = members
        self.stopping = threading.Event()
        self.joined = threading.Event()
        self.conn: Connection | None = None
        self.error: Exception | None = None

    def run(self) -> None:
        due = {m.member_id: 0.0 for m in self.members}
        while not self.stopping.is_set():
            try:
                if self.conn is None or not self.conn.connected:
                    self.conn = Connection.to(self.bootstrap, client_id="shoal-spark-heartbeat")
                for m in self.members:
                    if time.monotonic() >= due[m.member_id]:
                        try:
                            m.heartbeat(self.conn)
                        except KafkaProtocolError as e:
                            log.warning("heartbeat of %s: %s", m.member_id, e)
                        due[m.member_id] = time.monotonic() + max(0.1, m.interval_ms / 1000 * 0.8)
                if all(m.member_epoch > 0 for m in self.members):
                    self.joined.set()
                self.error = None
            except (OSError, ConnectionError) as e:
                self.error = e
                log.warning("heartbeat connection: %s", e)
                if self.conn is not None:
                    self.conn.close()
                self.stopping.wait(1.0)
                continue
            self.stopping.wait(max(0.05, min(due.values()) - time.monotonic()))
        if self.conn is not None:
            for m in self.members:
                with contextlib.suppress(Exception):
                    m.leave(self.conn)
            self.conn.close()


class ShareStreamReader(DataSourceStreamReader):
    """Driver side of the share-group source. Offsets are ``{"batch": n}``."""

    def __init__(self, opts: Options, schema: Any) -> None:
        if not opts.subscribe:
            raise ValueError("the share-group source needs subscribe (topic names)")
        self.opts = opts
        self.schema = schema
        self.state_dir = opts.state_dir or default_state_dir()
        self.num_tasks = opts.num_tasks or 1
        self.member_ids = [str(uuid.uuid4()) for _ in range(self.num_tasks)]
        self._members: list[ShareMembership] | None = None
        self._hb: _Heartbeats | None = None
        self._conn: Connection | None = None
        self._topics: dict[str, Any] = {}
        self._committed = -1

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.update(_members=None, _hb=None, _conn=None)
        return state

    # -- setup -------------------------------------------------------------------------
    def _start(self) -> None:
        if self._hb is not None and self._hb.is_alive():
            return
        if self.opts.starting_offsets in ("earliest", "latest"):
            _set_group_reset(self.opts, self.opts.starting_offsets)
        self._members = [ShareMembership(self.opts.share_group or "", mid, topics=self.opts.subscribe)
                         for mid in self.member_ids]
        self._hb = _Heartbeats(self.opts.bootstrap, self._members)
        self._hb.start()
        if not self._hb.joined.wait(30.0):
            raise RuntimeError(f"share group {self.opts.share_group}: members did not join within 30 s "
                               f"({self._hb.error})")

    def _driver_conn(self) -> Connection:
        if self._conn is None or not self._conn.connected:
            self._conn = Connection.to(self.opts.bootstrap, client_id="shoal-spark-driver")
        return self._conn

    def _refresh_topics(self) -> dict[str, Any]:
        self._topics = topic_metadata(self._driver_conn(), self.opts.subscribe)
        return self._topics

    # -- DataSourceStreamReader ---------------------------------------------------------
    def initialOffset(self) -> dict:
        return {"batch": 0}

    def latestOffset(self, start: dict | None = None, limit: Any = None) -> dict:
        self._start()
        b = int((start or {}).get("batch", self._committed + 1 if self._committed >= 0 else 0))
        return {"batch": b + 1}

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        if int(start.get("batch", 0)) >= int(end["batch"]):
            return []
        self._start()
        topics = self._refresh_topics()
        by_id = {info.topic_id: info for info in topics.values()}
        everything = [(str(i.topic_id), i.name, p) for i in topics.values() for p in range(i.partitions)]
        overrides, _ = _load_dispositions(self.state_dir, self.opts.share_group or "",
                                          {n: i.topic_id for n, i in topics.items()})
        tasks = []
        assert self._members is not None
        for k, m in enumerate(self._members):
            assigned = [(str(tid), by_id[tid].name, p) for tid, ps in sorted(m.assignment.items(), key=str)
                        for p in ps if tid in by_id]
            tasks.append(ShareTask(int(end["batch"]), k, m.member_id, assigned or everything,
                                   {(str(t), p, o): v for (t, p, o), v in overrides.items()}))
        return tasks

    def read(self, partition: InputPartition) -> Iterator[Any]:
        from .source import arrow_schema_of

        yield from read_share_task(self.opts, partition, arrow_schema_of(self.schema))

    def commit(self, end: dict) -> None:
        """Micro-batch ``end["batch"]`` is durable: acknowledge what its tasks acquired."""
        n = int(end["batch"])
        group = self.opts.share_group or ""
        topics = self._topics or self._refresh_topics()
        overrides, files = _load_dispositions(self.state_dir, group, {t: i.topic_id for t, i in topics.items()})
        conn = self._driver_conn()
        for mid in self.member_ids:
            with MemberState(self.state_dir, group, mid) as st:
                done = [e for e in st.pending if e["batch"] <= n]
                if not done or st.epoch == 0:
                    continue  # nothing to do, or no session to continue: the next task settles it
                session = ShareSession(conn, group, mid, epoch=st.epoch)
                try:
                    failed = session.acknowledge(_acks(done, ACCEPT, overrides))
                    if failed:
                        log.info("member %s: acknowledgements refused: %s", mid, failed)
                except KafkaProtocolError as e:
                    if e.code not in _SESSION_GONE:
                        raise
                    session.epoch = 0  # another session replaced it: those records were released
                st.pending = [e for e in st.pending if e["batch"] > n]
                st.epoch = session.epoch
                st.save()
        for path in files:
            with contextlib.suppress(OSError):
                os.remove(path)
        self._committed = n

    def stop(self) -> None:
        """Release what uncommitted batches acquired, then leave the group (which releases the rest)."""
        group = self.opts.share_group or ""
        try:
            conn = self._driver_conn()
            for mid in self.member_ids:
                with MemberState(self.state_dir, group, mid) as st:
                    if st.pending and st.epoch != 0:
                        session = ShareSession(conn, group, mid, epoch=st.epoch)
                        with contextlib.suppress(KafkaProtocolError):
                            session.acknowledge(_acks(st.pending, RELEASE, {}))
                    with contextlib.suppress(OSError):
                        os.remove(st.path)
        except (OSError, ConnectionError) as e:
            log.warning("share source stop: %s", e)
        if self._hb is not None:
            self._hb.stopping.set()
            self._hb.join(10.0)
        if self._conn is not None:
            self._conn.close()


def _set_group_reset(opts: Options, value: str) -> None:
    """Set the group's ``share.auto.offset.reset`` (where a new share-partition starts)."""
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

    admin = AdminClient({"bootstrap.servers": opts.bootstrap, "broker.address.family": "v4"})
    res = ConfigResource(ResourceType.GROUP, opts.share_group, incremental_configs=[
        ConfigEntry("share.auto.offset.reset", value, incremental_operation=AlterConfigOpType.SET)])
    for fut in admin.incremental_alter_configs([res]).values():
        fut.result(timeout=15)
