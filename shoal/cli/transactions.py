"""``shoal transactions``: list, describe, describe-producers, find-hanging and abort
transactions (kafka-transactions.sh).

Speaks the Kafka protocol through :mod:`shoal.client.connection`: ListTransactions,
DescribeTransactions, DescribeProducers, Metadata, FindCoordinator and WriteTxnMarkers,
each to the broker that serves it, as Kafka's admin client routes them (see
:class:`_Client`): in a cluster the tool needs any one broker's address.
``find-hanging`` reports, as Kafka's tool does, the open transactions of partitions whose
last write is older than ``--max-transaction-timeout`` minutes and that the transaction
coordinator does not know as an ongoing transaction holding that partition; ``abort``
writes an abort marker for one (named by ``--start-offset``, or by producer id, epoch and
coordinator epoch), so read_committed readers move past it.

``describe`` of a transactional id with no transaction open shows no start time and
duration: DescribeTransactions then says -1 (as Kafka does), which kio's reader refuses,
so the tool reads that answer with :func:`shoal.client.lenient.lenient_response`.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from ..client.lenient import lenient_response
from ..protocol.entities import make
from .common import CliError, add_connection_options, add_output_options, emit, reach, tool_main
from .main import command

METADATA, FIND_COORDINATOR, WRITE_TXN_MARKERS, DESCRIBE_PRODUCERS, DESCRIBE_TXNS, LIST_TXNS = (
    3, 10, 27, 61, 65, 66)
KEY_TRANSACTION = 1


def _configure(p: argparse.ArgumentParser) -> None:
    add_connection_options(p)
    add_output_options(p)
    subs = p.add_subparsers(dest="action", required=True)
    lst = subs.add_parser("list", help="list transactions")
    lst.add_argument("--state", action="append", default=[], help="only transactions in this state (repeatable)")
    lst.add_argument("--producer-id", action="append", type=int, default=[], help="only this producer id")
    lst.add_argument("--duration-filter", type=int, default=-1, metavar="MS",
                     help="only transactions running for longer than this")
    d = subs.add_parser("describe", help="describe a transaction")
    d.add_argument("--transactional-id", required=True)
    dp = subs.add_parser("describe-producers", help="the producer state of a partition")
    dp.add_argument("--topic", required=True)
    dp.add_argument("--partition", type=int, required=True)
    fh = subs.add_parser("find-hanging", help="find open transactions the coordinator does not know")
    fh.add_argument("--topic", help="only this topic (default: every topic)")
    fh.add_argument("--partition", type=int, help="with --topic: only this partition")
    fh.add_argument("--max-transaction-timeout", type=int, default=15, metavar="MINUTES",
                    help="transaction.max.timeout.ms of the brokers, in minutes (default 15)")
    ab = subs.add_parser("abort", help="abort a hanging transaction (writes an abort marker)")
    ab.add_argument("--topic", required=True)
    ab.add_argument("--partition", type=int, required=True)
    ab.add_argument("--start-offset", type=int, help="the first offset of the transaction to abort")
    ab.add_argument("--producer-id", type=int)
    ab.add_argument("--producer-epoch", type=int)
    ab.add_argument("--coordinator-epoch", type=int)


def _check(code: Any, what: str) -> None:
    if int(code) != 0:
        raise CliError(f"{what}: {getattr(code, 'name', str(code)).upper()}")


class _Client:
    """The tool's connections: the bootstrap broker, and one per other broker it must ask.

    Each request goes where Kafka's admin client sends it: ListTransactions to every broker
    (each lists the transactional ids it coordinates), DescribeTransactions to the
    transactional id's coordinator (FindCoordinator, key type TRANSACTION),
    DescribeProducers and WriteTxnMarkers to each partition's leader (Metadata). On one
    broker all of them are that broker."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.conn = reach(args)
        self._conns: dict[tuple[str, int], Any] = {(self.conn.host, int(self.conn.port)): self.conn}
        self._brokers: dict[int, tuple[str, int]] | None = None
        self._leaders: dict[str, list[int]] = {}
        self._internal: set[str] = set()

    def close(self) -> None:
        for conn in self._conns.values():
            conn.close()
        self._conns.clear()

    # -- routing ---------------------------------------------------------------------------
    def _metadata(self) -> None:
        resp = self._call(METADATA, 1, 12, topics=None, allow_auto_topic_creation=False,
                          include_topic_authorized_operations=False)
        self._brokers = {int(b.node_id): (b.host, int(b.port)) for b in resp.brokers}
        self._leaders = {}
        self._internal = {t.name for t in resp.topics if t.is_internal}
        for t in resp.topics:
            if int(t.error_code) != 0:
                continue
            leaders = [-1] * len(t.partitions)
            for part in t.partitions:
                if 0 <= int(part.partition_index) < len(leaders):
                    leaders[int(part.partition_index)] = int(part.leader_id)
            self._leaders[t.name] = leaders

    def brokers(self) -> dict[int, tuple[str, int]]:
        if self._brokers is None:
            self._metadata()
        assert self._brokers is not None
        return self._brokers

    def to(self, node: int) -> Any:
        """A connection to broker ``node`` (the bootstrap one when it is that broker)."""
        address = self.brokers().get(node)
        if address is None:
            raise CliError(f"broker {node} is not in the cluster's metadata")
        conn = self._conns.get(address)
        if conn is None:
            conn = self._conns[address] = reach(argparse.Namespace(
                **{**vars(self.args), "bootstrap_server": f"{address[0]}:{address[1]}"}))
        return conn

    def leader(self, topic: str, partition: int) -> int:
        """The node id of the leader of ``topic``-``partition``."""
        if topic not in self._leaders:
            self._metadata()
        leaders = self._leaders.get(topic)
        if leaders is None:
            raise CliError(f"Topic '{topic}' does not exist.")
        if not 0 <= partition < len(leaders):
            raise CliError(f"{topic} has no partition {partition}")
        if leaders[partition] < 0:
            raise CliError(f"{topic}-{partition} has no leader")
        return leaders[partition]

    def coordinator(self, txn_id: str) -> Any:
        """A connection to the transaction coordinator of ``txn_id``."""
        v = self.conn.version_for(FIND_COORDINATOR, 1, 6)
        if v >= 4:
            c = self.conn.call(FIND_COORDINATOR, v, key_type=KEY_TRANSACTION,
                               coordinator_keys=(txn_id,)).coordinators[0]
        else:
            c = self.conn.call(FIND_COORDINATOR, v, key=txn_id, key_type=KEY_TRANSACTION)
        _check(c.error_code, f"cannot find the transaction coordinator of {txn_id!r}")
        self.brokers()[int(c.node_id)] = (c.host, int(c.port))
        return self.to(int(c.node_id))

    def _call(self, key: int, lo: int, hi: int, conn: Any = None, **fields: Any) -> Any:
        conn = self.conn if conn is None else conn
        return conn.call(key, conn.version_for(key, lo, hi), **fields)

    # -- requests --------------------------------------------------------------------------
    def list(self, states: list[str], pids: list[int], duration: int) -> list[Any]:
        out: dict[str, Any] = {}
        for node in sorted(self.brokers()):
            resp = self._call(LIST_TXNS, 0, 1, self.to(node), state_filters=tuple(states),
                              producer_id_filters=tuple(pids), duration_filter=duration)
            _check(resp.error_code, f"cannot list the transactions of broker {node}")
            if resp.unknown_state_filters:
                raise CliError(f"unknown transaction states: {', '.join(resp.unknown_state_filters)}")
            for t in resp.transaction_states:
                out.setdefault(t.transactional_id, t)
        return list(out.values())

    def describe(self, txn_id: str) -> Any:
        """The transaction state of ``txn_id``; its ``transaction_start_time`` in
        milliseconds, -1 when no transaction is open (Kafka's value, which kio refuses)."""
        conn = self.coordinator(txn_id)
        version = conn.version_for(DESCRIBE_TXNS, 0, 0)
        request = make(conn.request_type(DESCRIBE_TXNS, version), transactional_ids=(txn_id,))
        resp = conn.send(request, response_type=lenient_response(DESCRIBE_TXNS, version))
        st = resp.transaction_states[0]
        _check(st.error_code, f"cannot describe transactional id {txn_id!r}")
        return st

    def producers(self, topic: str, partitions: list[int]) -> dict[int, list[Any]]:
        from ..protocol.entities import sub

        by_leader: dict[int, list[int]] = {}
        for p in partitions:
            by_leader.setdefault(self.leader(topic, p), []).append(p)
        out = {}
        for node, ps in sorted(by_leader.items()):
            conn = self.to(node)
            version = conn.version_for(DESCRIBE_PRODUCERS, 0, 0)
            cls = conn.request_type(DESCRIBE_PRODUCERS, version)
            resp = conn.send(make(cls, topics=(make(sub(cls, "TopicRequest"), name=topic,
                                                    partition_indexes=tuple(ps)),)))
            for p in resp.topics[0].partitions:
                _check(p.error_code, f"cannot describe the producers of {topic}-{p.partition_index}")
                out[int(p.partition_index)] = list(p.active_producers)
        return out

    def topics(self) -> dict[str, int]:
        self._metadata()
        return {t: len(leaders) for t, leaders in self._leaders.items() if t not in self._internal}

    def abort(self, topic: str, partition: int, pid: int, epoch: int, coordinator_epoch: int) -> None:
        from ..protocol.entities import sub

        conn = self.to(self.leader(topic, partition))
        version = conn.version_for(WRITE_TXN_MARKERS, 1, 2)
        cls = conn.request_type(WRITE_TXN_MARKERS, version)
        req = make(cls, markers=(make(sub(cls, "WritableTxnMarker"), producer_id=pid, producer_epoch=epoch,
                                      transaction_result=False, coordinator_epoch=coordinator_epoch,
                                      topics=(make(sub(cls, "WritableTxnMarkerTopic"), name=topic,
                                                   partition_indexes=(partition,)),)),))
        resp = conn.send(req)
        _check(resp.markers[0].topics[0].partitions[0].error_code,
               f"cannot abort the transaction of producer {pid} in {topic}-{partition}")


@command("transactions", "list, describe, find hanging and abort transactions")(_configure)
def run(args: argparse.Namespace) -> int:
    return tool_main("transactions", lambda: _run(args))


def _run(args: argparse.Namespace) -> int:
    client = _Client(args)
    try:
        return _ACTIONS[args.action](client, args)
    finally:
        client.close()


def _list(client: _Client, args: argparse.Namespace) -> int:
    rows = [(t.transactional_id, int(t.producer_id), t.transaction_state)
            for t in client.list(args.state, args.producer_id, args.duration_filter)]
    emit(args, ["TransactionalId", "ProducerId", "TransactionState"], sorted(rows))
    return 0


def _describe(client: _Client, args: argparse.Namespace) -> int:
    st = client.describe(args.transactional_id)
    start = int(st.transaction_start_time)
    now = int(time.time() * 1000)
    parts = ",".join(f"{t.topic}-{p}" for t in st.topics for p in t.partitions)
    emit(args, ["TransactionalId", "ProducerId", "ProducerEpoch", "TransactionState", "TransactionTimeoutMs",
                "CurrentTransactionStartTimeMs", "TransactionDurationMs", "TopicPartitions"],
         [(st.transactional_id, int(st.producer_id), int(st.producer_epoch), st.transaction_state,
           int(st.transaction_timeout.total_seconds() * 1000), start if start >= 0 else None,
           now - start if start >= 0 else None, parts)])
    return 0


def _describe_producers(client: _Client, args: argparse.Namespace) -> int:
    producers = client.producers(args.topic, [args.partition])[args.partition]
    emit(args, ["ProducerId", "ProducerEpoch", "LatestCoordinatorEpoch", "LastSequence", "LastTimestamp",
                "CurrentTransactionStartOffset"],
         [(int(s.producer_id), int(s.producer_epoch), int(s.coordinator_epoch), int(s.last_sequence),
           int(s.last_timestamp), int(s.current_txn_start_offset) if s.current_txn_start_offset >= 0 else None)
          for s in producers])
    return 0


def hanging(client: _Client, topics: dict[str, list[int]], max_timeout_ms: int, now_ms: int) -> list[tuple]:
    """(topic, partition, producer id, epoch, coordinator epoch, start offset, last timestamp)
    of every open transaction older than ``max_timeout_ms`` that the coordinator does not
    know as an ongoing transaction holding its partition."""
    candidates = []
    for topic, parts in sorted(topics.items()):
        for p, producers in sorted(client.producers(topic, parts).items()):
            for s in producers:
                if s.current_txn_start_offset >= 0 and now_ms - s.last_timestamp > max_timeout_ms:
                    candidates.append((topic, p, s))
    if not candidates:
        return []
    by_pid: dict[int, list[str]] = {}
    for t in client.list([], sorted({int(s.producer_id) for _t, _p, s in candidates}), -1):
        by_pid.setdefault(int(t.producer_id), []).append(t.transactional_id)
    out = []
    for topic, p, s in candidates:
        known = False
        for txn_id in by_pid.get(int(s.producer_id), ()):
            try:
                st = client.describe(txn_id)
            except CliError:
                continue
            if (st.transaction_state == "Ongoing" and int(st.producer_epoch) == int(s.producer_epoch)
                    and any(t.topic == topic and p in t.partitions for t in st.topics)):
                known = True
        if not known:
            out.append((topic, p, int(s.producer_id), int(s.producer_epoch), int(s.coordinator_epoch),
                        int(s.current_txn_start_offset), int(s.last_timestamp)))
    return out


def _find_hanging(client: _Client, args: argparse.Namespace) -> int:
    if args.partition is not None and not args.topic:
        raise CliError("--partition needs --topic")
    counts = client.topics()
    if args.topic:
        if args.topic not in counts:
            raise CliError(f"Topic '{args.topic}' does not exist.")
        counts = {args.topic: counts[args.topic]}
    topics = {t: [args.partition] if args.partition is not None else list(range(n)) for t, n in counts.items()}
    now = int(time.time() * 1000)
    rows = hanging(client, topics, args.max_transaction_timeout * 60_000, now)
    emit(args, ["Topic", "Partition", "ProducerId", "ProducerEpoch", "CoordinatorEpoch", "StartOffset",
                "LastTimestamp", "Duration(min)"],
         [r + ((now - r[6]) // 60_000,) for r in rows])
    return 0


def _abort(client: _Client, args: argparse.Namespace) -> int:
    if args.start_offset is not None:
        found = [s for s in client.producers(args.topic, [args.partition])[args.partition]
                 if int(s.current_txn_start_offset) == args.start_offset]
        if not found:
            raise CliError(f"no open transaction starts at offset {args.start_offset} of "
                           f"{args.topic}-{args.partition}")
        s = found[0]
        pid, epoch, coord = int(s.producer_id), int(s.producer_epoch), int(s.coordinator_epoch)
    elif None in (args.producer_id, args.producer_epoch, args.coordinator_epoch):
        raise CliError("give --start-offset, or --producer-id, --producer-epoch and --coordinator-epoch")
    else:
        pid, epoch, coord = args.producer_id, args.producer_epoch, args.coordinator_epoch
    client.abort(args.topic, args.partition, pid, epoch, coord)
    return 0


_ACTIONS = {"list": _list, "describe": _describe, "describe-producers": _describe_producers,
            "find-hanging": _find_hanging, "abort": _abort}
