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
  k with ShareFetch, up to ``maxRecordsPerTask`` records (by default the in-flight cap of
  each partition it fetches, the group's ``share.partition.max.record.locks``, 2000 unless
  raised, which the brokers enforce; the first fetch waits up to
  ``maxWaitMs`` only when the driver could not learn the group's lag, since a batch is
  planned only when records are waiting; later fetches never wait), at most
  ``FETCH_RECORDS`` per ShareFetch. It decodes each answer straight into columns
  (:func:`shoal.protocol.batch.decode_columns`), only the offsets inside the
  AcquiredRecords ranges, with their ``deliveryCount``, and yields it as one Arrow batch
  before it fetches again, so Spark works on rows while the task fetches. It does not
  close the session nor the connection: the connections stay in a module-level cache of
  the Python worker, keyed by (bootstrap, group, member), so the acquired records stay
  acquired after the task ends.
* **Brokers.** In a cluster a share group has a coordinator (heartbeats, lag) and each
  partition a leader (ShareFetch, ShareAcknowledge), usually on different brokers. The
  source finds them as KafkaShareConsumer does (:class:`shoal.client.brokers.Brokers`:
  FindCoordinator, Metadata) and keeps one share session per member *and leader*. A task
  fetches each partition from its leader; a partition answered NOT_LEADER_OR_FOLLOWER (or
  whose broker went away) is dropped from that session and fetched from the leader that
  Metadata names next (a task with no records yet waits up to ``LEADER_WAIT_S`` for one).
  Acknowledgements go to the broker that delivered the records; a broker that stopped or
  no longer leads has released them already, and they come again from the new leader.
  Heartbeats and lag requests find the coordinator again after NOT_COORDINATOR or a
  broken connection.
* **Member state file.** ``<stateDir>/<group>/<member>.json`` (under an ``flock``) holds the
  next epoch of the member's session on each broker and the ranges acquired per
  micro-batch and broker and not yet acknowledged. A task writes the ranges it acquired
  before it yields a single row.
* **Acknowledgement after commit.** Spark asks a source for its next offset only after the
  previous micro-batch is in the query's commit log. So ``latestOffset(start)`` first
  acknowledges what the batches up to ``start`` acquired: for each member it continues the
  member's session with the epoch from its state file (on its own connection) and sends
  ACCEPT (or RELEASE/REJECT where :func:`shoal.spark.release`/``reject`` asked). Then it
  asks the group coordinator for the group's lag (DescribeShareGroupOffsets): with nothing
  left to deliver it returns ``start`` and Spark runs no micro-batch, otherwise the next
  batch. ``commit(end)`` acknowledges too, for what is left. If the driver cannot see the
  state files (executors on other hosts), the next task of member k does the same before
  fetching: its batch starts only after the previous one committed.
* **Lock renewal.** While a batch's records wait for it to commit, the driver's heartbeat
  thread renews their acquisition locks (RENEW, ShareAcknowledge v2) every third of the
  group's ``share.record.lock.duration.ms``, so a micro-batch slower than the lock keeps
  its records.
* **Stopping.** When a query stops, Spark has not yet said whether its last micro-batch
  committed. The query listener that :func:`shoal.spark.register` adds writes, for every
  progress event (posted after the commit log), the share source's end offset into
  ``<stateDir>/<group>/committed/``; ``stop()`` waits up to ``STOP_WAIT_S`` for it, accepts
  what committed batches acquired, releases the rest and leaves the group. Spark ends the
  reader's process with SIGTERM; the reader turns that into a normal exit so that
  ``stop()`` runs.
* **Trigger.AvailableNow** runs micro-batches until the group has nothing to deliver (its
  lag is 0, or the last batch acquired nothing), then the query ends; its last batch is
  accepted at the stop.
* **Retries.** A task that finds ranges of its *own* micro-batch in the state file is a
  retry of a failed attempt: it RELEASEs them (they come back with a higher delivery
  count) before fetching. A task whose worker process died lost its connection, so the
  broker released its records already.

Guarantees: at-least-once; exactly once when nothing fails, including clean stops,
restarts from the checkpoint and ``Trigger.AvailableNow``, provided that every task's
worker shares a file system with the driver (local mode, or a cluster on one host / with
``stateDir`` on shared storage) and the session called :func:`shoal.spark.register`. What
each failure costs, always as records delivered again with a higher ``deliveryCount``:

* a failed task: its records, when the task is retried (released) or its worker's
  connection drops;
* a killed driver: the records of the batch in progress and of the last batch not yet
  acknowledged, after the acquisition lock expires or the members are fenced
  (``group.share.session.timeout.ms``);
* a stop without the listener (no ``register`` call): the last micro-batch, unless the
  next trigger acknowledged it before the stop;
* state not shared with the executors: a task of member k that runs in a new place opens a
  new session, which releases member k's records of the last, committed batch.

Transactions: what the group delivers is decided by its config ``share.isolation.level``
(IncrementalAlterConfigs, ``shoal configs --entity-type groups``); with read_committed the
brokers hand out only committed records below the last stable offset, so the source never
yields a record of an aborted or open transaction. The source reads that config when the
query starts; for a read_committed group it leaves the records at or above each
partition's last stable offset out of the lag that decides whether a micro-batch runs, so
an open transaction starts no empty micro-batches. ``kafka.isolation.level`` is refused
with ``shareGroup``, as Kafka's share consumer refuses ``isolation.level``.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import signal
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Self

from kio.schema.errors import ErrorCode
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition

try:  # Spark 4.2+
    from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow
except ImportError:  # pragma: no cover - Spark 4.0/4.1: no Trigger.AvailableNow for Python sources
    class SupportsTriggerAvailableNow:  # type: ignore[no-redef]
        pass

from ..client.brokers import COORDINATOR_MOVED, LEADER_MOVED, Brokers
from ..client.connection import KafkaProtocolError
from ..client.share import (
    ACCEPT,
    REJECT,
    RELEASE,
    RENEW,
    ShareMembership,
    ShareSession,
    share_group_lag,
)
from ..protocol.batch import decode_columns, iter_batches
from .options import Options, to_arrow_batch

log = logging.getLogger("shoal.spark.share")

__all__ = ["ShareStreamReader", "ShareTask", "default_state_dir", "note_dispositions"]

_SESSION_GONE = (ErrorCode.invalid_share_session_epoch, ErrorCode.share_session_not_found)
_KINDS = {"accept": ACCEPT, "release": RELEASE, "reject": REJECT}
FETCH_RECORDS = 2048
"""Records asked for per ShareFetch: each answer becomes an Arrow batch that Spark takes on
while the task fetches the next."""


def default_state_dir() -> str:
    return os.path.join(tempfile.gettempdir(), "shoal-spark-share")


def _group_dir(state_dir: str, group: str) -> str:
    safe = "".join(ch if ch.isalnum() or ch in "._-" else "_" for ch in group)
    path = os.path.join(state_dir, safe)
    os.makedirs(os.path.join(path, "dispositions"), exist_ok=True)
    return path


# --- member state files ----------------------------------------------------------------------

class MemberState:
    """The state file of one member, read and written under an exclusive flock.

    ``epochs``: broker node id (a string) -> the next epoch of the member's share session
    on that broker (0: none). ``pending``: what batches acquired and nobody acknowledged
    yet, one entry per batch and broker: ``{"batch": n, "node": id, "ranges": {"tid:p": [[a, b], ...]}}``.
    """

    def __init__(self, state_dir: str, group: str, member_id: str) -> None:
        self.path = os.path.join(_group_dir(state_dir, group), f"{member_id}.json")
        self.epochs: dict[str, int] = {}
        self.pending: list[dict[str, Any]] = []
        self._fd: int | None = None

    def load(self) -> None:
        try:
            with open(self.path) as f:
                data = json.load(f)
            self.epochs = {str(k): int(v) for k, v in dict(data.get("epochs", {})).items()}
            self.pending = list(data.get("pending", []))
        except (FileNotFoundError, ValueError):
            self.epochs, self.pending = {}, []

    def __enter__(self) -> Self:
        self._fd = os.open(self.path + ".lock", os.O_CREAT | os.O_RDWR, 0o644)
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        self.load()
        return self

    def save(self) -> None:
        """Replace the file atomically. No fsync: the file must outlive a process, not the
        host, since a host that goes down takes its connections, and with them the records
        they acquired, along."""
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"epochs": self.epochs, "pending": self.pending}, f)
        os.replace(tmp, self.path)

    def add(self, batch: int, node: int, acquired: Mapping[tuple[uuid.UUID, int], Sequence[tuple[int, int]]]) -> None:
        """Note ranges that batch ``batch`` acquired from broker ``node``."""
        entry = next((e for e in self.pending if e["batch"] == batch and e.get("node", -1) == node), None)
        if entry is None:
            entry = {"batch": batch, "node": node, "ranges": {}}
            self.pending.append(entry)
        for (tid, p), ranges in acquired.items():
            entry["ranges"].setdefault(_key(tid, p), []).extend([a, b] for a, b in ranges)

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


def _by_node(entries: Sequence[Mapping[str, Any]]) -> dict[int, list[Mapping[str, Any]]]:
    out: dict[int, list[Mapping[str, Any]]] = {}
    for e in entries:
        out.setdefault(int(e.get("node", -1)), []).append(e)
    return out


def _acknowledge(brokers: Brokers, group: str, member_id: str, st: MemberState,
                 acks_by_node: Mapping[int, Mapping[tuple[uuid.UUID, int], Sequence[tuple[int, int, int]]]], *,
                 renew: bool = False) -> None:
    """Send each broker's acknowledgements on the member's share session there.

    Acknowledgements go to the broker that delivered the records, whoever leads the
    partition now. A session that is gone, or a broker that cannot be reached (it stopped, or
    no longer leads: then it released what it held), leaves nothing to acknowledge there:
    its epoch becomes 0. Renewals (``renew``) that fail are only logged.
    """
    for node, acks in acks_by_node.items():
        epoch = st.epochs.get(str(node), 0)
        if not acks or epoch == 0:
            continue
        try:
            session = ShareSession(brokers.to(node), group, member_id, epoch=epoch)
            failed = session.acknowledge(acks)
            if failed:
                log.info("member %s: acknowledgements refused by broker %d: %s", member_id, node, failed)
            st.epochs[str(node)] = session.epoch
        except KafkaProtocolError as e:
            if e.code not in _SESSION_GONE:
                if renew:
                    log.warning("member %s: renewing locks on broker %d: %s", member_id, node, e)
                    continue
                raise
            st.epochs[str(node)] = 0  # the session is gone: the broker released those records
            if renew:
                st.pending = [x for x in st.pending if int(x.get("node", -1)) != node]
        except (OSError, ConnectionError) as e:
            log.info("member %s: broker %d unreachable (%s)", member_id, node, e)
            if not renew:
                st.epochs[str(node)] = 0


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


def _acks_by_node(entries: Sequence[Mapping[str, Any]], kind: int,
                  overrides: Mapping[tuple[uuid.UUID, int, int], int],
                  into: dict[int, dict[tuple[uuid.UUID, int], list[tuple[int, int, int]]]] | None = None,
                  ) -> dict[int, dict[tuple[uuid.UUID, int], list[tuple[int, int, int]]]]:
    out = {} if into is None else into
    for node, es in _by_node(entries).items():
        acks = out.setdefault(node, {})
        for k, v in _acks(es, kind, overrides).items():
            acks.setdefault(k, []).extend(v)
    return out


# --- executor side -----------------------------------------------------------------------------

_BROKERS: dict[tuple[str, str, str], Brokers] = {}
_BROKERS_LOCK = threading.Lock()
LEADER_WAIT_S = 20.0
"""How long a task that has no records yet waits for partitions whose leader moved to get a new one."""


def _brokers(bootstrap: str, group: str, member_id: str) -> Brokers:
    """The worker process's connections for this member, one per broker (kept open across
    tasks: closing one would release what the member acquired through it)."""
    key = (bootstrap, group, member_id)
    with _BROKERS_LOCK:
        b = _BROKERS.get(key)
        if b is None:
            b = _BROKERS[key] = Brokers(bootstrap, client_id=f"shoal-spark-{member_id[:8]}")
        return b


class ShareTask(InputPartition):
    """Task k of micro-batch ``batch``: fetch as ``member_id`` from ``partitions``, each from its leader."""

    def __init__(self, batch: int, index: int, member_id: str, partitions: list[tuple[str, str, int]],
                 overrides: dict[tuple[str, int, int], int], *, reader_id: str = "", wait_ms: int | None = None,
                 max_records: int = 1000, leaders: dict[tuple[str, int], int] | None = None,
                 nodes: dict[int, tuple[str, int]] | None = None,
                 others: list[tuple[str, int]] | None = None) -> None:
        super().__init__((batch, index))
        self.batch = batch
        self.index = index
        self.member_id = member_id
        self.partitions = partitions  # (topic id, topic name, partition)
        self.overrides = overrides  # (topic id, partition, offset) -> acknowledge type
        self.reader_id = reader_id
        self.wait_ms = wait_ms  # the first ShareFetch's long poll (None: the option maxWaitMs)
        self.max_records = max_records  # records to acquire at most
        self.leaders = leaders or {}  # (topic id, partition) -> leader's node id, when planned
        self.nodes = nodes or {}  # node id -> (host, port)
        self.others = others or []  # (topic id, partition) of the subscription that are not this task's


def read_share_task(opts: Options, task: ShareTask, arrow_schema: Any) -> Iterator[Any]:
    group = opts.share_group or ""
    state_dir = opts.state_dir or default_state_dir()
    names = {uuid.UUID(t): name for t, name, _ in task.partitions}
    overrides = {(uuid.UUID(t), p, o): k for (t, p, o), k in task.overrides.items()}
    brokers = _brokers(opts.bootstrap, group, task.member_id)
    for node, address in task.nodes.items():  # the driver's metadata is the newer: a broker may have moved
        brokers.nodes[int(node)] = tuple(address)  # type: ignore[assignment]
    marked = False
    with brokers.lock, MemberState(state_dir, group, task.member_id) as st:
        # what earlier batches acquired (committed, or the driver could not see it): ACCEPT;
        # what a failed attempt of this batch acquired: RELEASE
        acks = _acks_by_node([e for e in st.pending if e["batch"] < task.batch], ACCEPT, overrides)
        _acks_by_node([e for e in st.pending if e["batch"] >= task.batch], RELEASE, {}, into=acks)
        _acknowledge(brokers, group, task.member_id, st, acks)
        st.pending = []
        st.save()

        leaders: dict[int, list[tuple[uuid.UUID, int]]] = {}  # node -> partitions to fetch there
        for t, _, p in task.partitions:
            node = task.leaders.get((t, p), -1)
            leaders.setdefault(node, []).append((uuid.UUID(t), p))
        homeless: set[tuple[uuid.UUID, int]] = set(leaders.pop(-1, []))  # leader unknown or moved
        forget: dict[int, set[tuple[uuid.UUID, int]]] = {}
        sessions: dict[int, ShareSession] = {}
        cols: dict[str, list[Any]] = {n: [] for n in arrow_schema.names}
        total = 0
        first = True
        first_wait = opts.max_wait_ms if task.wait_ms is None else task.wait_ms
        deadline = time.monotonic() + LEADER_WAIT_S
        while total < task.max_records:
            if homeless:
                if time.monotonic() >= deadline:
                    log.warning("member %s: no leader for %s within %.0f s", task.member_id, sorted(homeless),
                                LEADER_WAIT_S)
                    break
                _place(brokers, homeless, leaders, names, opts.subscribe or [])
            if not any(leaders.values()):
                if homeless:
                    time.sleep(0.5)
                    continue
                break
            got_now = 0
            # one broker: it may long-poll; several: none does, so that one does not hold up the others
            wait = first_wait if first and len([n for n, ps in leaders.items() if ps]) == 1 else 0
            for node, parts in list(leaders.items()):
                if not parts or total >= task.max_records:
                    continue
                session = sessions.get(node)
                try:
                    if session is None:
                        session = sessions[node] = ShareSession(brokers.to(node), group, task.member_id,
                                                                epoch=st.epochs.get(str(node), 0))
                        if session.epoch:
                            # a continued session may still hold partitions of an earlier assignment
                            # (which another member now fetches): drop them from it
                            session.partitions = {(uuid.UUID(t), p) for t, p in task.others}
                            forget.setdefault(node, set()).update(session.partitions)
                    try:
                        res = session.fetch(parts, max_wait_ms=wait,
                                            max_records=min(FETCH_RECORDS, task.max_records - total),
                                            forget=forget.pop(node, ()), decode=False)
                    except KafkaProtocolError as e:
                        if e.code not in _SESSION_GONE or session.epoch == 0:
                            raise
                        session.epoch = 0  # the broker lost the session (a restart): open a new one
                        res = session.fetch(parts, max_wait_ms=wait,
                                            max_records=min(FETCH_RECORDS, task.max_records - total), decode=False)
                except (OSError, ConnectionError) as e:
                    log.info("member %s: broker %d unreachable (%s); finding the new leaders", task.member_id,
                             node, e)
                    homeless.update(leaders.pop(node))
                    sessions.pop(node, None)
                    st.epochs[str(node)] = 0
                    st.save()
                    continue
                st.epochs[str(node)] = session.epoch
                moved = [tp for tp, code in res.errors.items() if code in LEADER_MOVED]
                if moved:
                    leaders[node] = [tp for tp in parts if tp not in moved]
                    forget.setdefault(node, set()).update(moved)
                    homeless.update(moved)
                if res.acquired:
                    st.add(task.batch, node, res.acquired)
                st.save()  # before any row leaves this task
                got = sum(b - a + 1 for rs in res.acquired.values() for a, b in rs)
                total += got
                got_now += got
                if got and task.reader_id and not marked:
                    _touch(os.path.join(_group_dir(state_dir, group), "acquired", f"{task.reader_id}.{task.batch}"))
                    marked = True
                for (tid, p), data, ranges in res.raw:
                    _columns(cols, memoryview(data), ranges, names.get(tid, str(tid)), p)
                if cols["offset"]:
                    yield to_arrow_batch(cols, arrow_schema)
                    cols = {n: [] for n in arrow_schema.names}
            first = False
            if got_now == 0:
                if not homeless or total:
                    break  # nothing more to get; a partition without a leader waits for the next batch
                time.sleep(0.3)


def _columns(cols: dict[str, list[Any]], data: memoryview, ranges: Sequence[tuple[int, int, int]], topic: str,
             partition: int) -> None:
    """Append the records of one partition's ShareFetch data that lie in the acquired ``ranges``
    to the row columns, a batch at a time."""
    headers: list[Any] | None = [] if "headers" in cols else None
    for h in iter_batches(data):
        if h.is_control:
            continue
        for a, b, dc in ranges:
            if a > h.last_offset or h.base_offset > b:
                continue
            n = decode_columns(data, h, cols["offset"], cols["timestamp"], cols["key"], cols["value"], headers,
                               lo=a, hi=b)
            cols["deliveryCount"].extend([dc] * n)
            cols["timestampType"].extend([h.timestamp_type] * n)
            cols["partition"].extend([partition] * n)
            cols["topic"].extend([topic] * n)
            if headers:
                cols["headers"].extend([{"key": k, "value": v} for k, v in hs] for hs in headers)
                headers.clear()


def _place(brokers: Brokers, homeless: set[tuple[uuid.UUID, int]], leaders: dict[int, list[tuple[uuid.UUID, int]]],
           names: Mapping[uuid.UUID, str], subscribe: Sequence[str]) -> None:
    """Ask Metadata for the leaders of ``homeless`` partitions; move those that have one."""
    try:
        brokers.refresh(sorted(set(names.values()) | set(subscribe)))
    except (OSError, ConnectionError) as e:
        log.info("metadata: %s", e)
        return
    for tp in sorted(homeless, key=lambda x: (str(x[0]), x[1])):
        node = brokers.leader(*tp)
        if node >= 0 and node in brokers.nodes:
            leaders.setdefault(node, []).append(tp)
            homeless.discard(tp)


def _touch(path: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "a"):
        pass


# --- driver side -------------------------------------------------------------------------------

STOP_WAIT_S = 5.0
"""How long ``stop`` waits to learn whether the last planned micro-batch committed."""
RECONNECT_S = 60.0
"""How long the driver side retries a broker it cannot reach before the query fails."""


def _committed_marker(state_dir: str, group: str, reader: str) -> str:
    return os.path.join(_group_dir(state_dir, group), "committed", reader)


def note_committed(offset: Mapping[str, Any]) -> bool:
    """Record that the micro-batch ending at ``offset`` (a share-source offset) is in Spark's commit log.

    Called by the query listener that :func:`shoal.spark.register` installs, for every
    progress event: Spark reports progress only after it wrote the batch to the commit
    log. Returns False for an offset that is not the share source's.
    """
    reader, group, state_dir = offset.get("reader"), offset.get("group"), offset.get("stateDir")
    if not reader or group is None or not state_dir:
        return False
    path = _committed_marker(state_dir, group, reader)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    batch = int(offset.get("batch", 0))
    with contextlib.suppress(OSError, ValueError), open(path) as f:
        if int(f.read().strip() or -1) >= batch:
            return True
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    with open(tmp, "w") as f:
        f.write(str(batch))
    os.replace(tmp, path)
    return True


def _read_committed(path: str) -> int | None:
    try:
        with open(path) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


class _MemberLock:
    """Non-blocking variant of :class:`MemberState`: enter() is False while a task holds the member."""

    def __init__(self, state: MemberState) -> None:
        self.state = state

    def try_enter(self) -> bool:
        st = self.state
        st._fd = os.open(st.path + ".lock", os.O_CREAT | os.O_RDWR, 0o644)
        try:
            fcntl.flock(st._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(st._fd)
            st._fd = None
            return False
        st.load()
        return True


class _Heartbeats(threading.Thread):
    """Keeps the members alive (one heartbeat per member per interval) and renews their locks.

    While a micro-batch's records wait for the batch to commit, every ``renew_ms`` the
    records each member acquired get a RENEW acknowledgement (ShareAcknowledge v2), so a
    batch that runs longer than the acquisition lock keeps its records. A member whose
    task is fetching right now (its state file is locked) is renewed at the next round.
    """

    def __init__(self, bootstrap: str, members: list[ShareMembership], *, state_dir: str, group: str,
                 renew_ms: int | None) -> None:
        super().__init__(name="shoal-share-heartbeat", daemon=True)
        self.brokers = Brokers(bootstrap, client_id="shoal-spark-heartbeat")
        self.members = members
        self.state_dir = state_dir
        self.group = group
        self.renew_ms = renew_ms
        self.stopping = threading.Event()
        self.joined = threading.Event()
        self.error: Exception | None = None
        self.leave_on_stop = True

    def _renew(self) -> None:
        for m in self.members:
            st = MemberState(self.state_dir, self.group, m.member_id)
            if not _MemberLock(st).try_enter():
                continue
            try:
                if not st.pending:
                    continue
                _acknowledge(self.brokers, self.group, m.member_id, st, _acks_by_node(st.pending, RENEW, {}),
                             renew=True)
                st.save()
            finally:
                st.__exit__()

    def run(self) -> None:
        due = {m.member_id: 0.0 for m in self.members}
        renew_due = time.monotonic() + (self.renew_ms or 0) / 1000
        while not self.stopping.is_set():
            try:
                epochs = [m.member_epoch for m in self.members]
                for m in self.members:
                    if time.monotonic() >= due[m.member_id]:
                        try:
                            m.heartbeat(self.brokers.coordinator(self.group))
                        except KafkaProtocolError as e:
                            if e.code in COORDINATOR_MOVED:
                                self.brokers.forget_coordinator(self.group)  # it moved: find it again
                            log.warning("heartbeat of %s: %s", m.member_id, e)
                        due[m.member_id] = time.monotonic() + max(0.1, m.interval_ms / 1000 * 0.8)
                if epochs != [m.member_epoch for m in self.members]:
                    # a member joined or its assignment moved: the group's target assignment changed,
                    # so the others learn theirs now rather than at their next interval (until then a
                    # member fetches partitions assigned to another, and the micro-batches fill unevenly)
                    due = dict.fromkeys(due, 0.0)
                if all(m.member_epoch > 0 for m in self.members):
                    self.joined.set()
                if self.renew_ms and time.monotonic() >= renew_due:
                    self._renew()
                    renew_due = time.monotonic() + self.renew_ms / 1000
                self.error = None
            except (OSError, ConnectionError) as e:
                self.error = e
                log.warning("heartbeat connection: %s", e)
                self.brokers.forget_coordinator(self.group)
                self.stopping.wait(1.0)
                continue
            wake = min(due.values())
            if self.renew_ms:
                wake = min(wake, renew_due)
            self.stopping.wait(max(0.05, wake - time.monotonic()))
        if self.leave_on_stop:
            for m in self.members:
                with contextlib.suppress(Exception):
                    m.leave(self.brokers.coordinator(self.group))
        self.brokers.close()


class ShareStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Driver side of the share-group source.

    Offsets are ``{"batch": n, "reader": id, "group": g, "stateDir": d}``: ``n`` numbers the
    micro-batches that read records; the rest lets the query listener of
    :func:`shoal.spark.register` tell this reader which batches Spark committed.
    """

    def __init__(self, opts: Options, schema: Any) -> None:
        if not opts.subscribe:
            raise ValueError("the share-group source needs subscribe (topic names)")
        self.opts = opts
        self.schema = schema
        self.state_dir = opts.state_dir or default_state_dir()
        self.group = opts.share_group or ""
        self.num_tasks = opts.num_tasks or 1
        self.reader_id = str(uuid.uuid4())
        self.member_ids = [str(uuid.uuid4()) for _ in range(self.num_tasks)]
        self._members: list[ShareMembership] | None = None
        self._hb: _Heartbeats | None = None
        self._brokers: Brokers | None = None
        self._topics: dict[str, Any] = {}
        self._settled = 0  # batches <= this one are acknowledged
        self._planned = 0  # the newest batch handed to tasks
        self._available_now = False
        self._record_locks = RECORD_LOCKS  # the group's in-flight cap per share-partition
        self._last_lag: dict[tuple[str, int], int] | None = None
        self._committed_only = False  # the group's share.isolation.level is read_committed
        self._offset_clients: tuple[Any, Any] | None = None  # ListOffsets, read_uncommitted and read_committed
        self._offset_readers = {self.reader_id}  # reader ids in the offsets of the batches planned here
        _stop_on_sigterm()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.update(_members=None, _hb=None, _brokers=None, _offset_clients=None)
        return state

    # -- setup -------------------------------------------------------------------------
    def _start(self) -> None:
        if self._hb is not None and self._hb.is_alive():
            return
        if self.opts.starting_offsets in ("earliest", "latest"):
            _set_group_reset(self.opts, self.opts.starting_offsets)
        self._members = [ShareMembership(self.group, mid, topics=self.opts.subscribe) for mid in self.member_ids]
        configs = _group_configs(self.opts)
        lock_ms = int(configs["share.record.lock.duration.ms"]) if "share.record.lock.duration.ms" in configs else None
        self._committed_only = configs.get("share.isolation.level") == "read_committed"
        self._record_locks = _record_locks(configs)
        self._hb = _Heartbeats(self.opts.bootstrap, self._members, state_dir=self.state_dir, group=self.group,
                               renew_ms=max(500, lock_ms // 3) if lock_ms else None)
        self._hb.start()
        if not self._hb.joined.wait(30.0):
            raise RuntimeError(f"share group {self.group}: members did not join within 30 s ({self._hb.error})")

    def _cluster(self) -> Brokers:
        if self._brokers is None:
            self._brokers = Brokers(self.opts.bootstrap, client_id="shoal-spark-driver")
        return self._brokers

    def _refresh_topics(self) -> dict[str, Any]:
        self._topics = self._cluster().refresh(self.opts.subscribe)
        return self._topics

    def _offset(self, batch: int) -> dict:
        return {"batch": batch, "reader": self.reader_id, "group": self.group, "stateDir": self.state_dir}

    # -- acknowledging -----------------------------------------------------------------
    def _settle(self, committed: int, *, release_rest: bool = False) -> None:
        """ACCEPT what batches <= ``committed`` acquired (RELEASE the later ones if asked)."""
        topics = self._topics or self._refresh_topics()
        overrides, files = _load_dispositions(self.state_dir, self.group, {t: i.topic_id for t, i in topics.items()})
        brokers = self._cluster()
        for mid in self.member_ids:
            with MemberState(self.state_dir, self.group, mid) as st:
                done = [e for e in st.pending if e["batch"] <= committed]
                rest = [e for e in st.pending if e["batch"] > committed] if release_rest else []
                if not done and not rest:
                    continue
                acks = _acks_by_node(done, ACCEPT, overrides)
                _acks_by_node(rest, RELEASE, {}, into=acks)
                _acknowledge(brokers, self.group, mid, st, acks)
                st.pending = [e for e in st.pending if e["batch"] > committed and not release_rest]
                st.save()
        for path in files:
            with contextlib.suppress(OSError):
                os.remove(path)
        self._settled = max(self._settled, committed)

    def _lag(self) -> dict[tuple[str, int], int] | None:
        """The group's lag per partition; for a read_committed group, without the records at
        or above the last stable offset, which the group cannot deliver yet (an open
        transaction would otherwise start an empty micro-batch on every trigger)."""
        topics = self._topics or self._refresh_topics()
        brokers = self._cluster()
        unstable = self._unstable([(t, p) for t, i in topics.items() for p in range(i.partitions)]) \
            if self._committed_only else {}  # read before the lag: at worst one empty batch, never a late one
        try:
            lag = share_group_lag(brokers.coordinator(self.group), self.group,
                                  {t: i.partitions for t, i in topics.items()})
        except (KafkaProtocolError, OSError, ConnectionError) as e:
            brokers.forget_coordinator(self.group)
            log.info("share group %s: lag unknown: %s", self.group, e)
            return None
        if lag is None or not unstable:
            return lag
        return {tp: max(0, v - unstable.get(tp, 0)) if v > 0 else v for tp, v in lag.items()}

    def _unstable(self, tps: Sequence[tuple[str, int]]) -> dict[tuple[str, int], int]:
        """Records at or above the last stable offset per partition (high watermark minus LSO);
        empty when the offsets cannot be read."""
        from confluent_kafka import Consumer, KafkaException, TopicPartition

        if self._offset_clients is None:
            base = {"bootstrap.servers": self.opts.bootstrap, "broker.address.family": "v4",
                    "group.id": "shoal-spark-unused", "log_level": 3}
            self._offset_clients = (Consumer({**base, "isolation.level": "read_uncommitted"}),
                                    Consumer({**base, "isolation.level": "read_committed"}))
        every, stable = self._offset_clients
        out = {}
        try:
            for t, p in tps:
                hw = every.get_watermark_offsets(TopicPartition(t, p), timeout=15, cached=False)[1]
                lso = stable.get_watermark_offsets(TopicPartition(t, p), timeout=15, cached=False)[1]
                out[(t, p)] = max(0, hw - lso)
        except KafkaException as e:
            log.info("share group %s: last stable offsets unknown: %s", self.group, e)
            return {}
        return out

    # -- DataSourceStreamReader ---------------------------------------------------------
    def initialOffset(self) -> dict:
        return self._offset(0)

    def _reconnecting(self, what: str, fn: Any, *args: Any) -> Any:
        """Run ``fn`` again on a new connection while the broker is unreachable (a restart, a
        leader move), for up to ``RECONNECT_S``; the query fails only after that."""
        deadline = time.monotonic() + RECONNECT_S
        while True:
            try:
                return fn(*args)
            except (OSError, ConnectionError) as e:
                if self._brokers is not None:
                    self._brokers.close()
                if time.monotonic() >= deadline:
                    raise
                log.warning("share source %s: %s; connecting again", what, e)
                time.sleep(1.0)

    def latestOffset(self, start: dict | None = None, limit: Any = None) -> dict:
        return self._reconnecting("latestOffset", self._latest_offset, start)

    def _latest_offset(self, start: dict | None) -> dict:
        """A new batch when the group has records to deliver; ``start`` again when it has none.

        Spark asks for the next batch only once the previous one is in its commit log, so
        this is where what that batch acquired is acknowledged (ACCEPT).
        """
        self._start()
        start = start or self.initialOffset()
        b = int(start.get("batch", 0))
        if b > self._settled:
            self._settle(b)  # labels only grow, also across restarts: ours <= b are committed
        if self._available_now and self._planned > 0 and not self._acquired_in(self._planned):
            return start  # the last batch found nothing: the group has nothing available for us
        lag = self._lag()
        self._last_lag = lag
        if lag is not None and lag and all(v == 0 for v in lag.values()):
            return start
        return self._offset(max(b, self._planned) + 1)

    def _acquired_in(self, batch: int) -> bool:
        marker = os.path.join(_group_dir(self.state_dir, self.group), "acquired", f"{self.reader_id}.{batch}")
        return os.path.exists(marker)

    def reportLatestOffset(self) -> dict | None:
        """What query progress shows as this source's ``latestOffset``: the newest batch and the
        group's lag per partition (records not yet delivered completely, from the coordinator;
        -1 where unknown). pyspark's Python data sources have no metrics hook (Spark's
        ``ReportsSourceMetrics``), so this is where progress can carry the lag."""
        lag = self._last_lag
        out: dict[str, Any] = {"batch": self._planned}
        if lag is not None:
            out["lag"] = {f"{t}-{p}": v for (t, p), v in sorted(lag.items())}
        return out

    def prepareForTriggerAvailableNow(self) -> None:
        self._available_now = True

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        return self._reconnecting("planning a batch", self._partitions, start, end)

    def _partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        if int(start.get("batch", 0)) >= int(end["batch"]) and start.get("reader") == end.get("reader"):
            return []
        self._start()
        topics = self._refresh_topics()
        by_id = {info.topic_id: info for info in topics.values()}
        everything = [(str(i.topic_id), i.name, p) for i in topics.values() for p in range(i.partitions)]
        overrides, _ = _load_dispositions(self.state_dir, self.group, {n: i.topic_id for n, i in topics.items()})
        n = int(end["batch"])
        self._planned = max(self._planned, n)
        if end.get("reader"):
            self._offset_readers.add(end["reader"])  # a batch planned by an earlier run, retried
        # the driver saw records to deliver: a task that finds none returns at once, no long poll
        wait_ms = 0 if self._last_lag else self.opts.max_wait_ms
        leaders = {(str(i.topic_id), p): lead for i in topics.values() for p, lead in enumerate(i.leaders)}
        nodes = dict(self._cluster().nodes)
        tasks = []
        assert self._members is not None
        for k, m in enumerate(self._members):
            assigned = [(str(tid), by_id[tid].name, p) for tid, ps in sorted(m.assignment.items(), key=str)
                        for p in ps if tid in by_id]
            parts = assigned or everything
            # the brokers cap each share-partition's records in flight; a task may take up to the
            # cap of every partition it fetches (assignments can overlap while members join)
            per_task = self.opts.max_records_per_task or _records_per_task(len(parts), self._record_locks)
            mine = {(t, p) for t, _, p in parts}
            tasks.append(ShareTask(n, k, m.member_id, parts,
                                   {(str(t), p, o): v for (t, p, o), v in overrides.items()},
                                   reader_id=self.reader_id, wait_ms=wait_ms, max_records=per_task,
                                   leaders=leaders, nodes=nodes,
                                   others=[(t, p) for t, _, p in everything if (t, p) not in mine]))
        return tasks

    def read(self, partition: InputPartition) -> Iterator[Any]:
        from .source import arrow_schema_of

        yield from read_share_task(self.opts, partition, arrow_schema_of(self.schema))

    def commit(self, end: dict) -> None:
        """Micro-batch ``end["batch"]`` is durable: acknowledge what its tasks acquired."""
        if int(end["batch"]) > self._settled:
            self._reconnecting("commit", self._settle, int(end["batch"]))

    def stop(self) -> None:
        """Accept what committed batches acquired, release the rest, then leave the group.

        Spark tells a source which batch committed only when it plans the next one, so at
        a stop the last batch's fate comes from the query listener (see :func:`note_committed`);
        its note is waited for up to ``STOP_WAIT_S``.
        """
        try:
            if self._planned > self._settled:
                deadline = time.monotonic() + STOP_WAIT_S
                committed = self._committed_by_listener()
                while committed < self._planned and time.monotonic() < deadline:
                    time.sleep(0.05)
                    committed = self._committed_by_listener()
                self._settle(max(self._settled, committed), release_rest=True)
        except (OSError, ConnectionError, KafkaProtocolError) as e:
            log.warning("share source stop: %s", e)
        if self._hb is not None:
            self._hb.stopping.set()
            self._hb.join(10.0)
        if self._brokers is not None:
            self._brokers.close()
        if self._offset_clients is not None:
            for c in self._offset_clients:
                c.close()
            self._offset_clients = None
        self._clean_files()

    def _committed_by_listener(self) -> int:
        marks = [_read_committed(_committed_marker(self.state_dir, self.group, r)) for r in self._offset_readers]
        return max((m for m in marks if m is not None), default=0)

    def _clean_files(self) -> None:
        d = _group_dir(self.state_dir, self.group)
        paths = [_committed_marker(self.state_dir, self.group, r) for r in self._offset_readers]
        for mid in self.member_ids:
            paths += [os.path.join(d, f"{mid}.json"), os.path.join(d, f"{mid}.json.lock")]
        acquired = os.path.join(d, "acquired")
        with contextlib.suppress(OSError):
            paths += [os.path.join(acquired, f) for f in os.listdir(acquired) if f.startswith(self.reader_id)]
        for path in paths:
            with contextlib.suppress(OSError):
                os.remove(path)


RECORD_LOCKS = 2000
"""Kafka's default ``group.share.partition.max.record.locks``: records in flight per share-partition."""


def _records_per_task(partitions: int, record_locks: int = RECORD_LOCKS) -> int:
    """What a task fetching ``partitions`` may acquire: their in-flight caps together, so that the
    micro-batch fills every partition's cap whichever task reaches a partition first."""
    return record_locks * max(1, partitions)


def _group_configs(opts: Options) -> dict[str, str]:
    """The group's configs (its own values, else the brokers' defaults), asked once when the
    query starts; empty if they cannot be read (a broker without group configs)."""
    from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

    admin = AdminClient({"bootstrap.servers": opts.bootstrap, "broker.address.family": "v4"})
    try:
        for fut in admin.describe_configs([ConfigResource(ResourceType.GROUP, opts.share_group)]).values():
            return {name: e.value for name, e in fut.result(timeout=15).items() if e.value is not None}
    except Exception as e:  # an older broker: no group configs
        log.info("share group %s: group configs unknown (%s)", opts.share_group, e)
    return {}


def _record_locks(configs: Mapping[str, str]) -> int:
    """The group's in-flight cap per share-partition (``share.partition.max.record.locks``,
    which defaults to the brokers' ``group.share.partition.max.record.locks``): it sizes a
    micro-batch. Kafka's default when unknown."""
    value = configs.get("share.partition.max.record.locks")
    try:
        return int(value) if value is not None else RECORD_LOCKS
    except ValueError:
        return RECORD_LOCKS


def _stop_on_sigterm() -> None:
    """Make SIGTERM end the streaming source runner through ``stop()``.

    Spark ends the Python process that runs a streaming reader with SIGTERM (twice) when
    the query stops; by default that ends Python at once, and ``stop()`` (which pyspark
    calls in a ``finally``) never runs. The first SIGTERM now raises SystemExit in the main
    thread, and later ones are ignored so that ``stop()`` can finish. Other processes that
    make a reader (Spark's planner workers) keep their handlers.
    """
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if getattr(spec, "name", None) != _RUNNER_MODULE or threading.current_thread() is not threading.main_thread():
        return

    def _raise(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _raise)


_RUNNER_MODULE = "pyspark.sql.streaming.python_streaming_source_runner"


def _set_group_reset(opts: Options, value: str) -> None:
    """Set the group's ``share.auto.offset.reset`` (where a new share-partition starts)."""
    from confluent_kafka.admin import (
        AdminClient,
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
        ResourceType,
    )

    admin = AdminClient({"bootstrap.servers": opts.bootstrap, "broker.address.family": "v4"})
    res = ConfigResource(ResourceType.GROUP, opts.share_group, incremental_configs=[
        ConfigEntry("share.auto.offset.reset", value, incremental_operation=AlterConfigOpType.SET)])
    for fut in admin.incremental_alter_configs([res]).values():
        fut.result(timeout=15)
