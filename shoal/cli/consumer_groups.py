"""``shoal consumer-groups``: list, describe, reset offsets of and delete consumer groups.

The options and output columns are those of Kafka's ``kafka-consumer-groups.sh``. The
tool talks to any Kafka-compatible broker through confluent-kafka's AdminClient (a
runtime dependency of this command only, imported when the command runs), which, as
Kafka's admin client, sends each group's requests to the group's coordinator (found with
FindCoordinator) and lists groups by asking every broker. A request answered
NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS or COORDINATOR_NOT_AVAILABLE (a coordinator
that just moved) is sent again after a short backoff until ``--timeout``.
``--delete-offsets`` uses shoal's own small client (OffsetDelete) through
:class:`~shoal.cli.group_client.GroupClient`, which does the same.
"""

from __future__ import annotations

import argparse
import datetime
import sys
import time
from collections.abc import Iterable, Sequence
from typing import Any

from .common import (
    CliError,
    add_connection_options,
    add_output_options,
    emit,
    kafka_error_text,
    reach,
    timeout_s,
    tool_main,
    verbose,
)
from .group_client import BACKOFF_S
from .main import command

DRY_RUN_WARNING = ("WARN: No action will be performed as the --execute option is missing. "
                   "Add --execute to reset the offsets; add --dry-run to only show them without this warning.")


def _configure(p: argparse.ArgumentParser) -> None:
    add_connection_options(p)
    add_output_options(p)
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


@command("consumer-groups", "list, describe, reset offsets of and delete consumer groups")(_configure)
def run(args: argparse.Namespace) -> int:
    def body() -> int:
        tool = _Tool(args)
        if args.list:
            return tool.list()
        if args.describe:
            return tool.describe()
        if args.reset_offsets:
            return tool.reset_offsets()
        if args.delete:
            return tool.delete()
        return tool.delete_offsets()

    return tool_main("consumer-groups", body)


def _parse_topic(spec: str) -> tuple[str, list[int] | None]:
    name, sep, parts = spec.partition(":")
    if not sep:
        return name, None
    try:
        return name, [int(p) for p in parts.split(",") if p]
    except ValueError:
        raise CliError(f"invalid --topic {spec!r}: expected TOPIC or TOPIC:P,P,...") from None


def _dash(value: Any) -> Any:
    """None for a missing value: printed as "-" in tables, null in JSON."""
    return None if value is None or value == "" else value


class _Tool:
    def __init__(self, args: argparse.Namespace) -> None:
        from .common import admin_client

        self.args = args
        self.missing: list[str] = []
        self.t = timeout_s(args)
        reach(args, "shoal-consumer-groups").close()
        self.admin = admin_client(args)

    def _table(self, header: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
        emit(self.args, header, rows)

    def _retrying(self, what: str, request: Any) -> Any:
        """``request()`` (an AdminClient call and its result), again after a short backoff while it
        fails with a coordinator that moved or is loading, until ``--timeout``."""
        from confluent_kafka import KafkaError, KafkaException

        retriable = {KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
                     KafkaError.COORDINATOR_NOT_AVAILABLE}
        deadline = time.monotonic() + self.t
        attempt = 0
        while True:
            try:
                return request()
            except KafkaException as e:
                err = e.args[0] if e.args else None
                code = err.code() if hasattr(err, "code") else None
                if code not in retriable or time.monotonic() >= deadline:
                    raise
                verbose(self.args, f"{what}: {err.name()}; asking again")
            time.sleep(BACKOFF_S[min(attempt, len(BACKOFF_S) - 1)])
            attempt += 1

    # -- helpers -----------------------------------------------------------------
    def _groups(self) -> list[str]:
        if self.args.all_groups:
            return sorted(g.group_id for g in self._listed())
        if not self.args.group:
            raise CliError("--group or --all-groups is required")
        return list(self.args.group)

    def _listed(self) -> list[Any]:
        """Every broker's groups; asked again (until ``--timeout``) while a broker answers an error,
        so that no group is left out silently."""
        from .common import kafka_error_text

        deadline = time.monotonic() + self.t
        attempt = 0
        while True:
            result = self._retrying("list groups", lambda: self.admin.list_consumer_groups(
                request_timeout=self.t).result(self.t))
            if not result.errors:
                return list(result.valid)
            if time.monotonic() >= deadline:
                raise CliError("cannot list the groups of every broker: "
                               + "; ".join(kafka_error_text(Exception(e)) for e in result.errors))
            verbose(self.args, f"list groups: {len(result.errors)} broker(s) answered an error; asking again")
            time.sleep(BACKOFF_S[min(attempt, len(BACKOFF_S) - 1)])
            attempt += 1

    def _committed(self, group: str) -> dict[tuple[str, int], int]:
        from confluent_kafka import ConsumerGroupTopicPartitions

        result = self._retrying(f"offsets of group {group}", lambda: self.admin.list_consumer_group_offsets(
            [ConsumerGroupTopicPartitions(group)], request_timeout=self.t)[group].result(self.t))
        return {(tp.topic, tp.partition): tp.offset for tp in result.topic_partitions if tp.offset >= 0}

    def _offsets(self, tps: Iterable[tuple[str, int]], spec: Any) -> dict[tuple[str, int], int]:
        from confluent_kafka import TopicPartition

        tps = list(tps)
        if not tps:
            return {}
        futs = self.admin.list_offsets({TopicPartition(t, p): spec for t, p in tps}, request_timeout=self.t)
        return {(tp.topic, tp.partition): f.result(self.t).offset for tp, f in futs.items()}

    def _describe(self, groups: list[str]) -> dict[str, Any]:
        """Descriptions of the groups that exist; each unknown one is reported as Kafka does."""
        out = {}
        for g in groups:
            try:
                d = self._describe_one(g)
            except Exception as e:
                from .common import kafka_error_text

                raise CliError(f"cannot describe group {g}: {kafka_error_text(e)}") from None
            if d.state.name == "DEAD":
                print(f"Error: Consumer group '{g}' does not exist.", file=sys.stderr)
                self.missing.append(g)
                continue
            out[g] = d
        return out

    def _describe_one(self, group: str) -> Any:
        return self._retrying(f"group {group}", lambda: self.admin.describe_consumer_groups(
            [group], request_timeout=self.t)[group].result(self.t))

    def _topic_partitions(self, topic: str) -> list[int]:
        md = self.admin.list_topics(topic, timeout=self.t)
        t = md.topics.get(topic)
        if t is None or t.error is not None:
            raise CliError(f"topic {topic} does not exist")
        return sorted(t.partitions)

    # -- actions -----------------------------------------------------------------
    def list(self) -> int:
        listed = sorted(self._listed(), key=lambda g: g.group_id)
        if self.args.output == "json":
            emit(self.args, ["GROUP", "STATE"], [[g.group_id, g.state.name.title().replace("_", "")]
                                                 for g in listed])
        else:
            for g in listed:
                print(g.group_id)
        return 0

    def describe(self) -> int:
        self._describe_tables()
        return 1 if self.missing else 0

    def _describe_tables(self) -> None:
        from confluent_kafka.admin import OffsetSpec

        described = self._describe(self._groups())
        groups = list(described)
        if self.args.output != "json":
            for g in groups:
                if described[g].state.name == "EMPTY" and not self.args.state:
                    print(f"Consumer group '{g}' has no active members.", file=sys.stderr)
        if not groups:
            return
        if self.args.state:
            rows = []
            for g in groups:
                d = described[g]
                c = d.coordinator
                coord = f"{c.host}:{c.port} ({c.id})" if c is not None else "-"
                rows.append([g, coord, _dash(d.partition_assignor), d.state.name.title().replace("_", ""),
                             len(d.members)])
            self._table(["GROUP", "COORDINATOR (ID)", "ASSIGNMENT-STRATEGY", "STATE", "#MEMBERS"], rows)
            return
        if self.args.members:
            rows = [[g, m.member_id, _dash(m.host), _dash(m.client_id),
                     len(m.assignment.topic_partitions) if m.assignment else 0]
                    + ([_assignment(m)] if self.args.verbose else [])
                    for g in groups for m in described[g].members]
            self._table(["GROUP", "CONSUMER-ID", "HOST", "CLIENT-ID", "#PARTITIONS"]
                        + (["ASSIGNMENT"] if self.args.verbose else []), rows)
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
        self._table(["GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG", "CONSUMER-ID",
                      "HOST", "CLIENT-ID"], rows)

    def reset_offsets(self) -> int:
        from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition
        from confluent_kafka.admin import OffsetSpec

        a = self.args
        if not (a.topic or a.all_topics):
            raise CliError("One of the reset scopes should be defined: --all-topics, --topic.")
        if not (a.to_earliest or a.to_latest or a.to_offset is not None or a.to_datetime or a.shift_by is not None):
            raise CliError("Option '[reset-offsets]' requires one of the following scenarios: [to-earliest], "
                           "[to-latest], [to-offset], [to-datetime], [shift-by]")
        if not (a.dry_run or a.execute):
            print(DRY_RUN_WARNING, file=sys.stderr)
        groups = self._groups()
        described = {g: self._describe_one(g) for g in groups}
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
                result = self._retrying(f"offsets of group {g}", lambda g=g, req=req: self.admin.alter_consumer_group_offsets(
                    [req], request_timeout=self.t)[g].result(self.t))
                for tp in result.topic_partitions:
                    if tp.error is not None:
                        raise CliError(f"cannot reset {tp.topic}-{tp.partition} of {g}: {tp.error}")
            rows += [[g, t, p, o] for (t, p), o in sorted(new.items())]
            verbose(a, f"{g}: {'committed' if a.execute else 'planned (dry run)'} {len(new)} offsets")
        self._table(["GROUP", "TOPIC", "PARTITION", "NEW-OFFSET"], rows)
        return 0

    def delete(self) -> int:
        groups = self._groups()
        failed = {}
        for g in groups:
            try:
                self._retrying(f"group {g}", lambda g=g: self.admin.delete_consumer_groups(
                    [g], request_timeout=self.t)[g].result(self.t))
            except Exception as e:
                failed[g] = e
        ok = [g for g in groups if g not in failed]
        if ok:
            print("Deletion of requested consumer groups (" + ", ".join(f"'{g}'" for g in ok) + ") was successful.")
        for g, e in failed.items():
            print(f"Error: Deletion of group '{g}' failed: {kafka_error_text(e)}", file=sys.stderr)
        if failed:
            raise CliError(f"{len(failed)} group(s) could not be deleted")
        return 0

    def delete_offsets(self) -> int:
        from ..protocol.entities import make, sub

        a = self.args
        if len(a.group) != 1 or not a.topic:
            raise CliError("--delete-offsets needs one --group and at least one --topic")
        group = a.group[0]
        topics = []
        for spec in a.topic:
            name, parts = _parse_topic(spec)
            topics.append((name, parts if parts is not None else self._topic_partitions(name)))
        from .group_client import GroupClient

        def send(conn: Any) -> Any:
            req = conn.request_type(47, 0)
            tcls, pcls = sub(req, "OffsetDeleteRequestTopic"), sub(req, "OffsetDeleteRequestPartition")
            return conn.send(make(req, group_id=group, topics=tuple(
                make(tcls, name=n, partitions=tuple(make(pcls, partition_index=p) for p in ps)) for n, ps in topics)))

        client = GroupClient(a, "shoal-consumer-groups")
        try:
            resp = client.call(group, send, lambda r: r.error_code)
        finally:
            client.close()
        if resp.error_code != 0:
            raise CliError(f"cannot delete offsets of group {group}: {resp.error_code.name}")
        rows = []
        for t in resp.topics:
            for p in t.partitions:
                rows.append([t.name, p.partition_index,
                             "Successful" if p.error_code == 0 else f"Error: {p.error_code.name}"])
        self._table(["TOPIC", "PARTITION", "STATUS"], rows)
        return 0


def _assignment(member: Any) -> str:
    by_topic: dict[str, list[int]] = {}
    for tp in (member.assignment.topic_partitions if member.assignment else []):
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    return ",".join(f"{t}({','.join(map(str, sorted(ps)))})" for t, ps in sorted(by_topic.items())) or "-"


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
