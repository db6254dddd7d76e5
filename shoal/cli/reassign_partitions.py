"""``shoal reassign-partitions``: move partitions between brokers (kafka-reassign-partitions.sh).

Options and the reassignment JSON are those of Kafka's tool::

    {"version": 1, "partitions": [{"topic": "t", "partition": 0, "replicas": [2, 3]}, ...]}

(``log_dirs`` entries are accepted and must be ``any``: shoal has one log directory per
broker.)

* ``--generate --topics-to-move-json-file F --broker-list 1,2,3``: prints the current
  assignment of the topics in ``F`` (``{"topics": [{"topic": "t"}], "version": 1}``) and a
  proposed one over the listed brokers (the brokers' placement: rack-aware when every
  listed broker has a rack, unless ``--disable-rack-aware``). Changes nothing.
* ``--execute --reassignment-json-file F``: prints the current assignment (to keep for a
  rollback) and starts the reassignments (AlterPartitionReassignments). Refused while
  any reassignment runs, unless ``--additional``.
* ``--verify --reassignment-json-file F``: per partition, whether its reassignment is
  completed, still in progress, or not running with other replicas than the file's.
  Exits 1 unless every one is completed.
* ``--cancel --reassignment-json-file F``: cancels the reassignments of the file's
  partitions (a null target: they revert to their replicas from before).
* ``--list``: the ongoing reassignments (ListPartitionReassignments).

Throttles (``--throttle``, ``--replica-alter-log-dirs-throttle``) are not offered: shoal
has no replication quotas. Talks to one broker (any broker of a shoal cluster takes
these requests) through shoal's own client.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from ..protocol.entities import make, sub
from .common import CliError, add_connection_options, reach, tool_main, verbose
from .main import command

METADATA, ALTER_REASSIGNMENTS, LIST_REASSIGNMENTS = 3, 45, 46
_PREFIX = "Error: "


def _configure(p: argparse.ArgumentParser) -> None:
    add_connection_options(p)
    action = p.add_mutually_exclusive_group(required=True)
    action.add_argument("--generate", action="store_true",
                        help="propose an assignment of the topics in --topics-to-move-json-file over --broker-list")
    action.add_argument("--execute", action="store_true", help="start the reassignment in --reassignment-json-file")
    action.add_argument("--verify", action="store_true",
                        help="check whether the reassignment in --reassignment-json-file is complete")
    action.add_argument("--cancel", action="store_true",
                        help="cancel the reassignments of the partitions in --reassignment-json-file")
    action.add_argument("--list", action="store_true", help="list the ongoing reassignments")
    p.add_argument("--reassignment-json-file", metavar="FILE",
                   help='{"version":1,"partitions":[{"topic":"t","partition":0,"replicas":[1,2]}]}')
    p.add_argument("--topics-to-move-json-file", metavar="FILE", help='{"version":1,"topics":[{"topic":"t"}]}')
    p.add_argument("--broker-list", metavar="ID[,ID...]", help="with --generate: the brokers to place replicas on")
    p.add_argument("--disable-rack-aware", action="store_true", help="with --generate: ignore the brokers' racks")
    p.add_argument("--additional", action="store_true",
                   help="with --execute: start even while other reassignments run")
    p.add_argument("--preserve-throttles", action="store_true",
                   help="accepted for compatibility (shoal sets no throttles)")


def _read_json(path: str | None, option: str) -> Any:
    if not path:
        raise CliError(f"{option} is required")
    try:
        return json.loads(Path(path).read_text())
    except OSError as e:
        raise CliError(f"cannot read {path}: {e.strerror or e}") from None
    except json.JSONDecodeError as e:
        raise CliError(f"{path} is not valid JSON: {e}") from None


def parse_reassignment(doc: Any) -> dict[tuple[str, int], list[int]]:
    """The target replicas of each partition of a reassignment JSON document. Raises CliError."""
    if not isinstance(doc, dict) or not isinstance(doc.get("partitions"), list):
        raise CliError('the reassignment JSON must be {"version":1,"partitions":[...]}')
    if doc.get("version", 1) != 1:
        raise CliError(f"unsupported reassignment JSON version {doc.get('version')!r}")
    out: dict[tuple[str, int], list[int]] = {}
    for entry in doc["partitions"]:
        try:
            topic, partition, replicas = entry["topic"], int(entry["partition"]), [int(r) for r in entry["replicas"]]
        except (KeyError, TypeError, ValueError):
            raise CliError(f"invalid partition entry {json.dumps(entry)}: needs topic, partition and replicas") \
                from None
        if (topic, partition) in out:
            raise CliError(f"partition {topic}-{partition} appears more than once")
        if not replicas:
            raise CliError(f"partition {topic}-{partition} has an empty replica list")
        if len(set(replicas)) != len(replicas):
            raise CliError(f"partition {topic}-{partition} has duplicate replicas {replicas}")
        dirs = entry.get("log_dirs")
        if dirs is not None:
            if len(dirs) != len(replicas):
                raise CliError(f"partition {topic}-{partition}: log_dirs must have one entry per replica")
            if any(d != "any" for d in dirs):
                raise CliError(f"partition {topic}-{partition}: shoal has one log directory per broker; "
                               "log_dirs must be \"any\"")
        out[(topic, partition)] = replicas
    return out


def assignment_json(assignment: dict[tuple[str, int], list[int]]) -> str:
    """Kafka's reassignment JSON (one line) for ``assignment``."""
    return json.dumps({"version": 1, "partitions": [
        {"topic": t, "partition": p, "replicas": r, "log_dirs": ["any"] * len(r)}
        for (t, p), r in sorted(assignment.items())]}, separators=(",", ":"))


class _Tool:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.conn = reach(args, "shoal-reassign-partitions")

    def close(self) -> None:
        self.conn.close()

    def _call(self, api_key: int, lo: int, hi: int, fields: Any) -> Any:
        version = self.conn.version_for(api_key, lo, hi)
        cls = self.conn.request_type(api_key, version)
        return self.conn.send(make(cls, **fields(cls)))

    def metadata(self, topics: list[str] | None) -> Any:
        def fields(cls: type) -> dict[str, Any]:
            tcls = sub(cls, "MetadataRequestTopic")
            return dict(topics=None if topics is None else tuple(make(tcls, name=t) for t in topics),
                        allow_auto_topic_creation=False, include_topic_authorized_operations=False)
        return self._call(METADATA, 1, 12, fields)

    def current(self, topics: list[str]) -> dict[tuple[str, int], list[int]]:
        """The replicas of every partition of ``topics``. Raises CliError for an unknown topic."""
        out: dict[tuple[str, int], list[int]] = {}
        for t in self.metadata(sorted(set(topics))).topics:
            if t.error_code != 0:
                raise CliError(f"Topic {t.name} not found")
            for p in t.partitions:
                out[(t.name, int(p.partition_index))] = [int(r) for r in p.replica_nodes]
        return out

    def ongoing(self) -> dict[tuple[str, int], Any]:
        resp = self._call(LIST_REASSIGNMENTS, 0, 0, lambda cls: dict(timeout=self.args.timeout, topics=None))
        if resp.error_code != 0:
            raise CliError(f"ListPartitionReassignments failed: {resp.error_message or resp.error_code}")
        return {(t.name, int(p.partition_index)): p for t in resp.topics for p in t.partitions}

    def alter(self, targets: dict[tuple[str, int], list[int] | None]) -> dict[tuple[str, int], str | None]:
        """AlterPartitionReassignments; the error text of each partition (None: accepted)."""
        def fields(cls: type) -> dict[str, Any]:
            tcls, pcls = sub(cls, "ReassignableTopic"), sub(cls, "ReassignablePartition")
            by_topic: dict[str, list[Any]] = {}
            for (t, p), replicas in sorted(targets.items()):
                by_topic.setdefault(t, []).append(
                    make(pcls, partition_index=p, replicas=None if replicas is None else tuple(replicas)))
            return dict(timeout=self.args.timeout, allow_replication_factor_change=True,
                        topics=tuple(make(tcls, name=t, partitions=tuple(ps)) for t, ps in by_topic.items()))
        resp = self._call(ALTER_REASSIGNMENTS, 0, 1, fields)
        if resp.error_code != 0:
            raise CliError(f"AlterPartitionReassignments failed: {resp.error_message or resp.error_code}")
        out: dict[tuple[str, int], str | None] = {}
        for t in resp.responses:
            for p in t.partitions:
                code = int(p.error_code)
                out[(t.name, int(p.partition_index))] = None if code == 0 else (
                    f"{_error_name(code)}{': ' + p.error_message if p.error_message else ''}")
        return out


def _error_name(code: int) -> str:
    from kio.schema.errors import ErrorCode

    try:
        return ErrorCode(code).name.upper()
    except ValueError:
        return f"error {code}"


def _names(keys: Any) -> str:
    return ",".join(f"{t}-{p}" for t, p in sorted(keys))


def _generate(tool: _Tool, args: argparse.Namespace) -> int:
    from ..cluster.placement import assign_replicas
    from ..errors import ApiError

    doc = _read_json(args.topics_to_move_json_file, "--topics-to-move-json-file")
    try:
        topics = [str(t["topic"]) for t in doc["topics"]]
    except (KeyError, TypeError):
        raise CliError('the topics JSON must be {"version":1,"topics":[{"topic":"name"}, ...]}') from None
    if not args.broker_list:
        raise CliError("--generate needs --broker-list")
    try:
        wanted = [int(b) for b in args.broker_list.split(",") if b.strip()]
    except ValueError:
        raise CliError(f"invalid --broker-list {args.broker_list!r}") from None
    md = tool.metadata(None)
    racks = {int(b.node_id): b.rack for b in md.brokers}
    unknown = [b for b in wanted if b not in racks]
    if unknown:
        raise CliError(f"unknown brokers {unknown} in --broker-list")
    current = tool.current(topics)
    brokers = {b: (None if args.disable_rack_aware else racks[b]) for b in wanted}
    proposed: dict[tuple[str, int], list[int]] = {}
    for topic in sorted(set(topics)):
        parts = sorted(p for t, p in current if t == topic)
        rf = len(current[(topic, parts[0])])
        try:
            placement = assign_replicas(brokers, len(parts), rf)
        except ApiError as e:
            raise CliError(e.message or str(e)) from None
        for p, replicas in zip(parts, placement):
            proposed[(topic, p)] = replicas
    print("Current partition replica assignment")
    print(assignment_json(current))
    print()
    print("Proposed partition reassignment configuration")
    print(assignment_json(proposed))
    return 0


def _execute(tool: _Tool, args: argparse.Namespace) -> int:
    targets = parse_reassignment(_read_json(args.reassignment_json_file, "--reassignment-json-file"))
    ongoing = tool.ongoing()
    if ongoing and not args.additional:
        raise CliError("Cannot execute because there is an existing partition assignment. Use --additional to "
                       "override this and create a new partition assignment in addition to the existing one.")
    current = tool.current([t for t, _ in targets])
    missing = [k for k in targets if k not in current]
    if missing:
        raise CliError(f"unknown partitions {_names(missing)}")
    print("Current partition replica assignment")
    print()
    print(assignment_json({k: current[k] for k in targets}))
    print()
    print("Save this to use as the --reassignment-json-file option during rollback")
    results = tool.alter(dict(targets))
    failed = {k: e for k, e in results.items() if e is not None}
    started = [k for k in targets if k not in failed]
    if started:
        print(f"Successfully started partition reassignment{'s' if len(started) > 1 else ''} for {_names(started)}")
    for k, e in sorted(failed.items()):
        print(f"Error reassigning partition(s):\n{k[0]}-{k[1]}: {e}")
    return 1 if failed else 0


def _verify(tool: _Tool, args: argparse.Namespace) -> int:
    targets = parse_reassignment(_read_json(args.reassignment_json_file, "--reassignment-json-file"))
    ongoing = tool.ongoing()
    current = tool.current([t for t, _ in targets])
    print("Status of partition reassignment:")
    done = True
    for (t, p), replicas in sorted(targets.items()):
        if (t, p) in ongoing:
            print(f"Reassignment of partition {t}-{p} is still in progress.")
            done = False
        elif current.get((t, p)) == replicas:
            print(f"Reassignment of partition {t}-{p} is completed.")
        else:
            print(f"There is no active reassignment of partition {t}-{p}, but replica set is "
                  f"{current.get((t, p))} rather than {replicas}.")
            done = False
    return 0 if done else 1


def _cancel(tool: _Tool, args: argparse.Namespace) -> int:
    targets = parse_reassignment(_read_json(args.reassignment_json_file, "--reassignment-json-file"))
    results = tool.alter({k: None for k in targets})
    cancelled = [k for k, e in results.items() if e is None]
    inactive = [k for k, e in results.items() if e is not None and e.startswith("NO_REASSIGNMENT_IN_PROGRESS")]
    failed = {k: e for k, e in results.items() if e is not None and k not in inactive}
    if cancelled:
        print(f"Successfully cancelled partition reassignment{'s' if len(cancelled) > 1 else ''} for: "
              f"{_names(cancelled)}")
    if inactive:
        print(f"None of the specified partition reassignments are active for: {_names(inactive)}")
    for k, e in sorted(failed.items()):
        print(f"Error cancelling the reassignment of {k[0]}-{k[1]}: {e}")
    return 1 if failed else 0


def _list(tool: _Tool, args: argparse.Namespace) -> int:
    ongoing = tool.ongoing()
    if not ongoing:
        print("No partition reassignments found.")
        return 0
    print("Current partition reassignments:")
    for (t, p), r in sorted(ongoing.items()):
        print(f"{t}-{p}: replicas: {','.join(map(str, r.replicas))}. "
              f"adding: {','.join(map(str, r.adding_replicas))}. removing: {','.join(map(str, r.removing_replicas))}.")
    return 0


@command("reassign-partitions", "move partitions between brokers (kafka-reassign-partitions)")(_configure)
def run(args: argparse.Namespace) -> int:
    def body() -> int:
        tool = _Tool(args)
        try:
            action = next(name for name in ("generate", "execute", "verify", "cancel", "list") if getattr(args, name))
            verbose(args, f"--{action}")
            return {"generate": _generate, "execute": _execute, "verify": _verify, "cancel": _cancel,
                    "list": _list}[action](tool, args)
        finally:
            tool.close()

    return tool_main("reassign-partitions", body)
