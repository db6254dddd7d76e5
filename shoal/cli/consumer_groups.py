"""``shoal consumer-groups``: list, describe, reset offsets of and delete consumer groups.

The options and output columns are those of Kafka's ``kafka-consumer-groups.sh``. The
tool talks to any Kafka-compatible broker through confluent-kafka's AdminClient (a
runtime dependency of this command only, imported when the command runs);
``--delete-offsets`` uses shoal's own small client (OffsetDelete), sent to the broker
given (shoal is its own group coordinator).
"""

from __future__ import annotations

import argparse
import datetime
import sys
from collections.abc import Iterable, Sequence
from typing import Any

from .main import command

_TIMEOUT_S = 30.0


def _configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--bootstrap-server", required=True, help="host:port of a broker")
    action = p.add_mutually_exclusive_group(required=True)
    action.add_argument("--list", action="store_true", help="list every consumer group")
    action.add_argument("--describe", action="store_true", help="describe groups: offsets and lag (default), "
                        "--members or --state")
    action.add_argument("--reset-offsets", action="store_true", help="reset a group's committed offsets "
                        "(dry run unless --execute)")
    action.add_argument("--delete", action="store_true", help="delete groups (they must be empty)")
    action.add_argument("--delete-offsets", action="store_true", help="delete a group's offsets of --topic")
    p.add_argument("--group", action="append", default=[], help="a group id; repeatable")
    p.add_argument("--all-groups", action="store_true", help="every group")
    p.add_argument("--members", action="store_true", help="with --describe: one row per member")
    p.add_argument("--state", action="store_true", help="with --describe: one row per group")
    p.add_argument("--topic", action="append", default=[], help="T or T:P,P,... (--reset-offsets, --delete-offsets)")
    p.add_argument("--all-topics", action="store_true", help="with --reset-offsets: every topic the group has offsets for")
    spec = p.add_mutually_exclusive_group()
    spec.add_argument("--to-earliest", action="store_true")
    spec.add_argument("--to-latest", action="store_true")
    spec.add_argument("--to-offset", type=int, metavar="N")
    spec.add_argument("--to-datetime", metavar="YYYY-MM-DDTHH:mm:SS.sss")
    spec.add_argument("--shift-by", type=int, metavar="N")
    run = p.add_mutually_exclusive_group()
    run.add_argument("--dry-run", action="store_true", help="print the new offsets only (the default)")
    run.add_argument("--execute", action="store_true", help="commit the new offsets")
    p.epilog = "Requires confluent-kafka (pip install confluent-kafka)."


class CliError(Exception):
    pass


@command("consumer-groups", "list, describe, reset offsets of and delete consumer groups")(_configure)
def run(args: argparse.Namespace) -> int:
    try:
        import confluent_kafka  # noqa: F401
    except ImportError:
        print("shoal consumer-groups needs confluent-kafka: pip install confluent-kafka", file=sys.stderr)
        return 2
    try:
        tool = _Tool(args)
        if args.list:
            tool.list()
        elif args.describe:
            tool.describe()
        elif args.reset_offsets:
            tool.reset_offsets()
        elif args.delete:
            tool.delete()
        else:
            tool.delete_offsets()
    except CliError as e:
        print(f"Error: {e}", file=sys.stderr)
        return 1
    return 0


def _print_table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    rows = [[str(c) for c in r] for r in rows]
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(header)]
    for r in [list(header)] + rows:
        print(" ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())


def _parse_topic(spec: str) -> tuple[str, list[int] | None]:
    name, sep, parts = spec.partition(":")
    if not sep:
        return name, None
    try:
        return name, [int(p) for p in parts.split(",") if p]
    except ValueError:
        raise CliError(f"invalid --topic {spec!r}: expected TOPIC or TOPIC:P,P,...") from None


def _dash(value: Any) -> str:
    return "-" if value is None or value == "" else str(value)


class _Tool:
    def __init__(self, args: argparse.Namespace) -> None:
        from confluent_kafka.admin import AdminClient

        self.args = args
        self.admin = AdminClient({"bootstrap.servers": args.bootstrap_server, "log_level": 0})

    # -- helpers -----------------------------------------------------------------
    def _groups(self) -> list[str]:
        if self.args.all_groups:
            return sorted(g.group_id for g in self._listed())
        if not self.args.group:
            raise CliError("--group or --all-groups is required")
        return list(self.args.group)

    def _listed(self) -> list[Any]:
        result = self.admin.list_consumer_groups(request_timeout=_TIMEOUT_S).result(_TIMEOUT_S)
        return list(result.valid)

    def _committed(self, group: str) -> dict[tuple[str, int], int]:
        from confluent_kafka import ConsumerGroupTopicPartitions

        fut = self.admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)],
                                                     request_timeout=_TIMEOUT_S)[group]
        return {(tp.topic, tp.partition): tp.offset for tp in fut.result(_TIMEOUT_S).topic_partitions
                if tp.offset >= 0}

    def _offsets(self, tps: Iterable[tuple[str, int]], spec: Any) -> dict[tuple[str, int], int]:
        from confluent_kafka import TopicPartition

        tps = list(tps)
        if not tps:
            return {}
        futs = self.admin.list_offsets({TopicPartition(t, p): spec for t, p in tps}, request_timeout=_TIMEOUT_S)
        return {(tp.topic, tp.partition): f.result(_TIMEOUT_S).offset for tp, f in futs.items()}

    def _describe(self, groups: list[str]) -> dict[str, Any]:
        futs = self.admin.describe_consumer_groups(groups, request_timeout=_TIMEOUT_S)
        out = {}
        for g, f in futs.items():
            try:
                out[g] = f.result(_TIMEOUT_S)
            except Exception as e:
                raise CliError(f"cannot describe group {g}: {e}") from None
        return out

    def _topic_partitions(self, topic: str) -> list[int]:
        md = self.admin.list_topics(topic, timeout=_TIMEOUT_S)
        t = md.topics.get(topic)
        if t is None or t.error is not None:
            raise CliError(f"topic {topic} does not exist")
        return sorted(t.partitions)

    # -- actions -----------------------------------------------------------------
    def list(self) -> None:
        for g in sorted(self._listed(), key=lambda g: g.group_id):
            print(g.group_id)

    def describe(self) -> None:
        from confluent_kafka.admin import OffsetSpec

        groups = self._groups()
        described = self._describe(groups)
        if self.args.state:
            rows = []
            for g in groups:
                d = described[g]
                c = d.coordinator
                coord = f"{c.host}:{c.port} ({c.id})" if c is not None else "-"
                rows.append([g, coord, _dash(d.partition_assignor), d.state.name.title().replace("_", ""),
                             len(d.members)])
            _print_table(["GROUP", "COORDINATOR (ID)", "ASSIGNMENT-STRATEGY", "STATE", "#MEMBERS"], rows)
            return
        if self.args.members:
            rows = [[g, m.member_id, _dash(m.host), _dash(m.client_id),
                     len(m.assignment.topic_partitions) if m.assignment else 0]
                    for g in groups for m in described[g].members]
            _print_table(["GROUP", "CONSUMER-ID", "HOST", "CLIENT-ID", "#PARTITIONS"], rows)
            return
        rows = []
        for g in groups:
            committed = self._committed(g)
            owner: dict[tuple[str, int], Any] = {}
            for m in described[g].members:
                for tp in (m.assignment.topic_partitions if m.assignment else []):
                    owner[(tp.topic, tp.partition)] = m
            tps = sorted(set(committed) | set(owner))
            ends = self._offsets(tps, OffsetSpec.latest())
            for tp in tps:
                cur = committed.get(tp)
                end = ends.get(tp)
                lag = end - cur if cur is not None and end is not None else None
                m = owner.get(tp)
                rows.append([g, tp[0], tp[1], _dash(cur), _dash(end), _dash(lag),
                             _dash(m.member_id if m else None), _dash(m.host if m else None),
                             _dash(m.client_id if m else None)])
        _print_table(["GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG", "CONSUMER-ID",
                      "HOST", "CLIENT-ID"], rows)

    def reset_offsets(self) -> None:
        from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition
        from confluent_kafka.admin import OffsetSpec

        a = self.args
        if not (a.topic or a.all_topics):
            raise CliError("--reset-offsets needs --topic or --all-topics")
        if not (a.to_earliest or a.to_latest or a.to_offset is not None or a.to_datetime or a.shift_by is not None):
            raise CliError("--reset-offsets needs one of --to-earliest, --to-latest, --to-offset, --to-datetime, "
                           "--shift-by")
        groups = self._groups()
        described = self._describe(groups)
        rows = []
        for g in groups:
            state = described[g].state.name
            if a.execute and state not in ("EMPTY", "DEAD", "UNKNOWN"):
                raise CliError(f"Assignments can only be reset if the group '{g}' is inactive, but the current "
                               f"state is {state.title()}.")
            committed = self._committed(g)
            if a.all_topics:
                tps = sorted(committed)
            else:
                tps = []
                for spec in a.topic:
                    name, parts = _parse_topic(spec)
                    tps += [(name, p) for p in (parts if parts is not None else self._topic_partitions(name))]
            earliest = self._offsets(tps, OffsetSpec.earliest())
            latest = self._offsets(tps, OffsetSpec.latest())
            if a.to_datetime:
                ts = _parse_datetime(a.to_datetime)
                by_time = self._offsets(tps, OffsetSpec.for_timestamp(ts))
            new: dict[tuple[str, int], int] = {}
            for tp in tps:
                lo, hi = earliest[tp], latest[tp]
                if a.to_earliest:
                    target = lo
                elif a.to_latest:
                    target = hi
                elif a.to_offset is not None:
                    target = a.to_offset
                elif a.to_datetime:
                    target = by_time[tp] if by_time[tp] >= 0 else hi
                else:
                    target = committed.get(tp, lo) + a.shift_by
                new[tp] = min(max(target, lo), hi)
            if a.execute and new:
                req = ConsumerGroupTopicPartitions(g, [TopicPartition(t, p, o) for (t, p), o in sorted(new.items())])
                result = self.admin.alter_consumer_group_offsets([req], request_timeout=_TIMEOUT_S)[g].result(_TIMEOUT_S)
                for tp in result.topic_partitions:
                    if tp.error is not None:
                        raise CliError(f"cannot reset {tp.topic}-{tp.partition} of {g}: {tp.error}")
            rows += [[g, t, p, o] for (t, p), o in sorted(new.items())]
        _print_table(["GROUP", "TOPIC", "PARTITION", "NEW-OFFSET"], rows)

    def delete(self) -> None:
        groups = self._groups()
        futs = self.admin.delete_consumer_groups(groups, request_timeout=_TIMEOUT_S)
        failed = {}
        for g, f in futs.items():
            try:
                f.result(_TIMEOUT_S)
            except Exception as e:
                failed[g] = e
        ok = [g for g in groups if g not in failed]
        if ok:
            print("Deletion of requested consumer groups (" + ", ".join(f"'{g}'" for g in ok) + ") was successful.")
        for g, e in failed.items():
            print(f"Error: Deletion of group '{g}' failed: {e}", file=sys.stderr)
        if failed:
            raise CliError(f"{len(failed)} group(s) could not be deleted")

    def delete_offsets(self) -> None:
        from ..client.connection import Connection
        from ..protocol.entities import make, sub

        a = self.args
        if len(a.group) != 1 or not a.topic:
            raise CliError("--delete-offsets needs one --group and at least one --topic")
        group = a.group[0]
        topics = []
        for spec in a.topic:
            name, parts = _parse_topic(spec)
            topics.append((name, parts if parts is not None else self._topic_partitions(name)))
        with Connection.to(a.bootstrap_server, client_id="shoal-consumer-groups") as conn:
            req = conn.request_type(47, 0)
            tcls, pcls = sub(req, "OffsetDeleteRequestTopic"), sub(req, "OffsetDeleteRequestPartition")
            resp = conn.send(make(req, group_id=group, topics=tuple(
                make(tcls, name=n, partitions=tuple(make(pcls, partition_index=p) for p in ps)) for n, ps in topics)))
        if resp.error_code != 0:
            raise CliError(f"cannot delete offsets of group {group}: {resp.error_code.name}")
        rows = []
        for t in resp.topics:
            for p in t.partitions:
                rows.append([t.name, p.partition_index,
                             "Successful" if p.error_code == 0 else f"Error: {p.error_code.name}"])
        _print_table(["TOPIC", "PARTITION", "STATUS"], rows)


def _parse_datetime(text: str) -> int:
    """Milliseconds since the epoch of ``YYYY-MM-DDTHH:mm:SS.sss`` (local time, optional zone)."""
    for fmt in ("%Y-%m-%dT%H:%M:%S.%f%z", "%Y-%m-%dT%H:%M:%S.%f", "%Y-%m-%dT%H:%M:%S%z", "%Y-%m-%dT%H:%M:%S"):
        try:
            dt = datetime.datetime.strptime(text, fmt)
            break
        except ValueError:
            continue
    else:
        raise CliError(f"invalid --to-datetime {text!r}: expected YYYY-MM-DDTHH:mm:SS.sss")
    return int(dt.timestamp() * 1000)
