"""``shoal share-groups``: list, describe, reset and delete share groups (kafka-share-groups.sh).

Speaks the Kafka protocol through :mod:`shoal.client.connection` (confluent-kafka's
AdminClient has no share-group calls): ListGroups (type filter "share"),
ShareGroupDescribe, DescribeShareGroupOffsets, AlterShareGroupOffsets (reset, only for
an empty group), DeleteShareGroupOffsets, DeleteGroups and ListOffsets.

Group requests go to each group's coordinator and ``--list`` asks every broker
(:class:`~shoal.cli.group_client.GroupClient`); ListOffsets goes to each partition's
leader. So the tool works against any broker of a cluster, also while a coordinator moves.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from typing import Any

from ..protocol.entities import make, sub
from .common import CliError, add_connection_options, add_output_options, emit, tool_main
from .group_client import GroupClient
from .main import command

LIST_OFFSETS, LIST_GROUPS, DELETE_GROUPS = 2, 16, 42
SHARE_GROUP_DESCRIBE, DESCRIBE_OFFSETS, ALTER_OFFSETS, DELETE_OFFSETS = 77, 90, 91, 92
EARLIEST, LATEST = -2, -1


DRY_RUN_WARNING = ("WARN: No action will be performed as the --execute option is missing. "
                   "Add --execute to reset the offsets; add --dry-run to only show them without this warning.")


def _configure(p: argparse.ArgumentParser) -> None:
    add_connection_options(p)
    add_output_options(p)
    action = p.add_mutually_exclusive_group(required=True)
    action.add_argument("--list", action="store_true", help="list share groups")
    action.add_argument("--describe", action="store_true", help="describe a share group")
    action.add_argument("--reset-offsets", action="store_true", help="reset the start offsets of a share group")
    action.add_argument("--delete", action="store_true", help="delete share groups")
    action.add_argument("--delete-offsets", action="store_true", help="delete a share group's offsets of topics")
    p.add_argument("--group", action="append", default=[], help="share group id (repeatable)")
    p.add_argument("--all-groups", action="store_true", help="every share group")
    p.add_argument("--topic", action="append", default=[], help="TOPIC or TOPIC:P1,P2 (repeatable)")
    p.add_argument("--all-topics", action="store_true", help="with --reset-offsets: every topic the group has state for")
    shown = p.add_mutually_exclusive_group()
    shown.add_argument("--members", action="store_true", help="with --describe: the members")
    shown.add_argument("--state", action="store_true", help="with --describe: the group state")
    shown.add_argument("--offsets", action="store_true", help="with --describe: start offsets and lag (default)")
    to = p.add_mutually_exclusive_group()
    to.add_argument("--to-earliest", action="store_true")
    to.add_argument("--to-latest", action="store_true")
    to.add_argument("--to-datetime", metavar="YYYY-MM-DDTHH:mm:SS.sss", help="first offset at or after this time (UTC"
                    " unless an offset like +02:00 is given)")
    p.add_argument("--metrics-url", action="append", default=[], metavar="URL",
                   help="with --describe --state: a broker's metrics endpoint (http://HOST:PORT, its metrics.port), "
                        "repeatable; adds each share-partition's in-flight records and lock timeouts, which no "
                        "Kafka API carries")
    run_mode = p.add_mutually_exclusive_group()
    run_mode.add_argument("--dry-run", action="store_true", help="show the new offsets (default)")
    run_mode.add_argument("--execute", action="store_true", help="apply the new offsets")


_ARGS: list[argparse.Namespace] = []


def _table(rows: list[list[Any]], header: list[str]) -> None:
    emit(_ARGS[-1], header, rows)


def _topic_args(values: list[str]) -> dict[str, list[int] | None]:
    out: dict[str, list[int] | None] = {}
    for v in values:
        name, sep, parts = v.partition(":")
        out[name] = [int(x) for x in parts.split(",") if x] if sep else None
    return out


class _Admin:
    def __init__(self, args: argparse.Namespace) -> None:
        self.groups = GroupClient(args, "shoal-share-groups")
        self.conn = self.groups.bootstrap
        self.coordinator_address = ""
        """host:port of the coordinator that answered the last group request."""

    def close(self) -> None:
        self.groups.close()

    def call(self, api_key: int, lo: int, hi: int, **fields: Any) -> Any:
        return self.conn.call(api_key, self.conn.version_for(api_key, lo, hi), **fields)

    def group_call(self, group: str, api_key: int, lo: int, hi: int, fields: Any,
                   error_of: Any = lambda r: r.error_code) -> Any:
        """Request ``api_key`` (fields built by ``fields(request class)``) to ``group``'s coordinator."""
        def send(conn: Any) -> Any:
            self.coordinator_address = f"{conn.host}:{conn.port}"
            version = conn.version_for(api_key, lo, hi)
            cls = conn.request_type(api_key, version)
            return conn.send(make(cls, **fields(cls)))
        return self.groups.call(group, send, error_of)

    def share_groups(self) -> list[tuple[str, str]]:
        out = []
        for g in self.groups.list_groups(states_filter=(), types_filter=("share",)):
            gtype = getattr(g, "group_type", None) or ""
            if gtype and gtype.lower() != "share":
                continue
            if not gtype and getattr(g, "protocol_type", "") != "share":
                continue
            out.append((str(g.group_id), getattr(g, "group_state", "") or ""))
        return sorted(out)

    def describe(self, group: str) -> Any:
        resp = self.group_call(group, SHARE_GROUP_DESCRIBE, 1, 1, lambda cls: dict(
            group_ids=(group,), include_authorized_operations=False), lambda r: r.groups[0].error_code)
        return resp.groups[0]

    def offsets(self, group: str) -> Any:
        resp = self.group_call(group, DESCRIBE_OFFSETS, 0, 1, lambda cls: dict(groups=(make(
            sub(cls, "DescribeShareGroupOffsetsRequestGroup"), group_id=group, topics=None),)),
            lambda r: r.groups[0].error_code)
        return resp.groups[0]

    def _topic(self, topic: str) -> Any:
        resp = self.call(3, 10, 12, topics=None, allow_auto_topic_creation=False,
                         include_topic_authorized_operations=False)
        for t in resp.topics:
            if t.name == topic:
                return resp, t
        raise CliError(f"Topic '{topic}' does not exist.")

    def partitions(self, topic: str) -> int:
        return len(self._topic(topic)[1].partitions)

    def list_offsets(self, topic: str, partitions: list[int], timestamp: int) -> dict[int, int]:
        """ListOffsets of ``partitions``, each asked of its leader (Metadata names them)."""
        md, t = self._topic(topic)
        brokers = {int(b.node_id): (b.host, int(b.port)) for b in md.brokers}
        leaders = {int(p.partition_index): int(p.leader_id) for p in t.partitions}
        by_leader: dict[tuple[str, int], list[int]] = {}
        for p in partitions:
            address = brokers.get(leaders.get(p, -1), (self.conn.host, self.conn.port))
            by_leader.setdefault(address, []).append(p)
        out = {}
        for (host, port), parts in by_leader.items():
            conn = self.groups.connection(host, port)
            version = conn.version_for(LIST_OFFSETS, 1, 8)
            cls = conn.request_type(LIST_OFFSETS, version)
            req = make(cls, replica_id=-1, isolation_level=0, topics=(make(
                sub(cls, "ListOffsetsTopic"), name=topic, partitions=tuple(
                    make(sub(cls, "ListOffsetsPartition"), partition_index=p, current_leader_epoch=-1,
                         timestamp=timestamp) for p in parts)),))
            for rt in conn.send(req).topics:
                for p in rt.partitions:
                    if int(p.error_code) != 0:
                        raise CliError(f"cannot list offsets of {topic}-{p.partition_index}: "
                                       f"{_error_name(p.error_code)}")
                    out[int(p.partition_index)] = int(p.offset)
        return out


def _error_name(code: Any) -> str:
    return getattr(code, "name", str(code)).upper()


@command("share-groups", "list, describe, reset and delete share groups")(_configure)
def run(args: argparse.Namespace) -> int:
    _ARGS.append(args)
    return tool_main("share-groups", lambda: _run(args))


def _run(args: argparse.Namespace) -> int:
    admin = _Admin(args)
    try:
        if args.list:
            listed = admin.share_groups()
            if args.output == "json":
                emit(args, ["GROUP", "STATE"], listed)
            else:
                for group, _state in listed:
                    print(group)
            return 0
        if args.all_groups:
            if args.group:
                raise CliError("give either --group or --all-groups")
            args.group = [g for g, _state in admin.share_groups()]
            if args.reset_offsets and not args.group:
                return 0
        if not args.group:
            raise CliError("--group or --all-groups is required")
        if args.describe:
            return _describe(admin, args)
        if args.reset_offsets:
            return _reset(admin, args)
        if args.delete:
            rc = 0
            results = [admin.group_call(g, DELETE_GROUPS, 0, 2, lambda cls, g=g: dict(groups_names=(g,)),
                                        lambda r: r.results[0].error_code).results[0] for g in args.group]
            for r in results:
                if int(r.error_code) == 0:
                    print(f"Deletion of share group '{r.group_id}' was successful.")
                else:
                    print(f"Deletion of share group '{r.group_id}' failed: {_error_name(r.error_code)}")
                    rc = 1
            return rc
        if args.delete_offsets:
            if not args.topic:
                print("--topic is required with --delete-offsets", file=sys.stderr)
                return 2
            resp = admin.group_call(args.group[0], DELETE_OFFSETS, 0, 0, lambda cls: dict(
                group_id=args.group[0], topics=tuple(make(sub(cls, "DeleteShareGroupOffsetsRequestTopic"), topic_name=t)
                                                    for t in _topic_args(args.topic))))
            if int(resp.error_code) != 0:
                print(f"Error: {_error_name(resp.error_code)} {resp.error_message or ''}".rstrip())
                return 1
            _table([[t.topic_name, "Error: " + _error_name(t.error_code) if int(t.error_code) else "Successful"]
                    for t in resp.responses], ["TOPIC", "STATUS"])
            return 0
    finally:
        admin.close()
    return 2


def _describe(admin: _Admin, args: argparse.Namespace) -> int:
    rc = 0
    for group in args.group:
        d = admin.describe(group)
        if int(d.error_code) != 0:
            if _error_name(d.error_code) == "GROUP_ID_NOT_FOUND":
                print(f"Error: Share group '{group}' does not exist.", file=sys.stderr)
            else:
                print(f"Error: Share group '{group}': {_error_name(d.error_code)}", file=sys.stderr)
            rc = 1
            continue
        if not d.members and not args.state and args.output != "json":
            print(f"Share group '{group}' has no active members.", file=sys.stderr)
        if args.state:
            row = [group, admin.coordinator_address, d.group_state, len(d.members)]
            header = ["GROUP", "COORDINATOR", "STATE", "#MEMBERS"]
            if args.verbose:
                row[3:3] = [d.group_epoch, d.assignment_epoch]
                header[3:3] = ["GROUP-EPOCH", "ASSIGNMENT-EPOCH"]
            parts = _partition_state(admin, args, group)
            if args.output == "json":
                keys = [h.lower().replace("-", "_").lstrip("#") for h in header]
                part_keys = [h.lower().replace("-", "_") for h in _STATE_HEADER]
                print(json.dumps([{**dict(zip(keys, row)), "partitions": [dict(zip(part_keys, r)) for r in parts]}],
                                 default=str))
            else:
                _table([row], header)
                if parts:
                    print()
                    _table(parts, _STATE_HEADER)
        elif args.members:
            rows = []
            for m in d.members:
                parts = [f"{tp.topic_name}:{','.join(str(p) for p in tp.partitions)}"
                         for tp in (m.assignment.topic_partitions if m.assignment is not None else ())]
                rows.append([group, m.member_id, m.client_host, m.client_id,
                             sum(len(tp.partitions) for tp in (m.assignment.topic_partitions
                                                               if m.assignment is not None else ())),
                             ";".join(parts) or "-"])
            _table(rows, ["GROUP", "CONSUMER-ID", "HOST", "CLIENT-ID", "#PARTITIONS", "ASSIGNMENT"])
        else:
            o = admin.offsets(group)
            if int(o.error_code) != 0:
                print(f"Error: Share group '{group}': {_error_name(o.error_code)}", file=sys.stderr)
                rc = 1
                continue
            rows = []
            for t in sorted(o.topics, key=lambda t: t.topic_name):
                for p in sorted(t.partitions, key=lambda p: p.partition_index):
                    rows.append([group, t.topic_name, p.partition_index,
                                 p.start_offset if p.start_offset >= 0 else None, p.lag if p.lag >= 0 else None])
            if not rows and args.output != "json":
                print(f"Share group '{group}' has no offsets.")
            else:
                _table(rows, ["GROUP", "TOPIC", "PARTITION", "START-OFFSET", "LAG"])
    return rc


_STATE_HEADER = ["GROUP", "TOPIC", "PARTITION", "START-OFFSET", "LAG", "AVAILABLE", "ACQUIRED", "LOCK-TIMEOUTS",
                 "OLDEST-AVAILABLE-AGE-MS"]


def _metrics_views(urls: list[str], timeout: float) -> dict[tuple[str, str, int], dict[str, Any]]:
    """(group, topic, partition) -> the share-partition as each broker's ``/api/share-groups`` shows it."""
    import urllib.request

    out: dict[tuple[str, str, int], dict[str, Any]] = {}
    for url in urls:
        base = url.rstrip("/")
        if "://" not in base:
            base = "http://" + base
        try:
            with urllib.request.urlopen(base + "/api/share-groups", timeout=timeout) as resp:
                doc = json.loads(resp.read())
        except (OSError, ValueError) as e:
            raise CliError(f"cannot read the share groups from the metrics endpoint {base}: "
                           f"{getattr(e, 'reason', None) or e}") from None
        for g in doc.get("share_groups", []):
            for p in g.get("partitions", []):
                out[(str(p["group"]), str(p["topic"]), int(p["partition"]))] = p
    return out


def _partition_state(admin: _Admin, args: argparse.Namespace, group: str) -> list[list[Any]]:
    """Per share-partition: start offset and lag (DescribeShareGroupOffsets) and, from the
    brokers' metrics endpoints (``--metrics-url``), available and acquired records, lock
    timeouts and the age of the oldest available record."""
    o = admin.offsets(group)
    if int(o.error_code) != 0:
        print(f"Error: the offsets of share group '{group}': {_error_name(o.error_code)}", file=sys.stderr)
        return []
    views = _metrics_views(args.metrics_url, max(0.5, args.timeout / 1000)) if args.metrics_url else {}
    rows = []
    for t in sorted(o.topics, key=lambda t: t.topic_name):
        for p in sorted(t.partitions, key=lambda p: p.partition_index):
            v = views.get((group, t.topic_name, int(p.partition_index)))
            states = v["states"] if v else {}
            rows.append([group, t.topic_name, p.partition_index, p.start_offset if p.start_offset >= 0 else None,
                         p.lag if p.lag >= 0 else None, states.get("available"), states.get("acquired"),
                         v.get("lock_timeouts") if v else None, v.get("oldest_available_age_ms") if v else None])
    if rows and not args.metrics_url and args.output != "json":
        print("In-flight records and lock timeouts are not part of any Kafka API: add --metrics-url "
              "http://HOST:PORT (each broker's metrics.port) to show them.", file=sys.stderr)
    return rows


def _timestamp(text: str) -> int:
    dt = datetime.datetime.fromisoformat(text)
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=datetime.UTC)
    return int(dt.timestamp() * 1000)


def _reset(admin: _Admin, args: argparse.Namespace) -> int:
    if args.to_earliest:
        ts = EARLIEST
    elif args.to_latest:
        ts = LATEST
    elif args.to_datetime:
        ts = _timestamp(args.to_datetime)
    else:
        raise CliError("Option '[reset-offsets]' requires one of the following scenarios: [to-earliest], "
                       "[to-latest], [to-datetime]")
    if not (args.topic or args.all_topics):
        raise CliError("One of the reset scopes should be defined: --all-topics, --topic.")
    if not (args.dry_run or args.execute):
        print(DRY_RUN_WARNING, file=sys.stderr)
    group = args.group[0]
    topics = _topic_args(args.topic)
    if args.all_topics:
        o = admin.offsets(group)
        for t in o.topics:
            topics.setdefault(t.topic_name, [])
            topics[t.topic_name] = sorted({*(topics[t.topic_name] or []), *(p.partition_index for p in t.partitions)})
    plan: dict[str, dict[int, int]] = {}
    for name, parts in topics.items():
        parts = parts if parts else list(range(admin.partitions(name)))
        found = admin.list_offsets(name, parts, ts)
        if ts >= 0:  # no record at or after the time: the log end
            missing = [p for p, off in found.items() if off < 0]
            if missing:
                found.update(admin.list_offsets(name, missing, LATEST))
        plan[name] = found
    rows = [[group, name, p, off] for name, found in plan.items() for p, off in sorted(found.items())]
    if args.execute:
        resp = admin.group_call(group, ALTER_OFFSETS, 0, 0, lambda cls: dict(group_id=group, topics=tuple(
            make(sub(cls, "AlterShareGroupOffsetsRequestTopic"), topic_name=name, partitions=tuple(
                make(sub(cls, "AlterShareGroupOffsetsRequestPartition"), partition_index=p, start_offset=off)
                for p, off in sorted(found.items())))
            for name, found in plan.items())))
        if int(resp.error_code) != 0:
            raise CliError(f"cannot reset offsets of share group '{group}': {_error_name(resp.error_code)}"
                           + (" (the group must be empty)" if _error_name(resp.error_code) == "NON_EMPTY_GROUP"
                              else ""))
        errors = {(t.topic_name, p.partition_index): p.error_code for t in resp.responses for p in t.partitions}
        for r in rows:
            code = errors.get((r[1], r[2]), 0)
            if int(code):
                r[3] = f"Error: {_error_name(code)}"
    _table(rows, ["GROUP", "TOPIC", "PARTITION", "NEW-OFFSET"])
    return 0
