"""``shoal acls``: the authorizer's ACLs (CreateAcls / DescribeAcls / DeleteAcls), as ``kafka-acls.sh``.

Kafka's options:

* ``--add``: one ACL per resource, principal, host and operation: ``--allow-principal``
  (ALLOW) and ``--deny-principal`` (DENY), each with the hosts of ``--allow-host`` /
  ``--deny-host`` (default ``*``), for every ``--operation`` (default All);
* ``--remove``: those ACLs; with no principal, every ACL of the resources (asks first,
  unless ``--force``);
* ``--list``: the ACLs of the resources (of every resource without one), optionally of
  one ``--principal``.

Resources: ``--topic``, ``--group``, ``--transactional-id`` (each repeatable) and
``--cluster``; ``--resource-pattern-type`` literal (default), prefixed, and for
``--list``/``--remove`` any or match. An operation the resource type does not take (a
transactional id takes Write, Describe and All) is refused before anything is sent, as
kafka-acls.sh does. kafka-acls.sh's shortcuts: ``--producer`` (Write, Describe and
Create on the topics, Write and Describe on the transactional ids; with ``--idempotent``
IdempotentWrite on the cluster) and ``--consumer`` (Read and Describe on the topics, Read
on the groups). It connects with confluent-kafka's admin client, so
``--command-config`` may name any listener's settings (SASL, TLS).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from .common import (
    CliError,
    add_connection_options,
    add_output_options,
    admin_client,
    timeout_s,
    tool_main,
)
from .main import command

OPERATIONS = ("All", "Read", "Write", "Create", "Delete", "Alter", "Describe", "ClusterAction", "DescribeConfigs",
              "AlterConfigs", "IdempotentWrite")
PATTERN_TYPES = ("literal", "prefixed", "any", "match")


def _configure(p: argparse.ArgumentParser) -> None:
    add_connection_options(p)
    add_output_options(p)
    action = p.add_mutually_exclusive_group(required=True)
    action.add_argument("--add", action="store_true", help="add ACLs")
    action.add_argument("--remove", action="store_true", help="remove ACLs")
    action.add_argument("--list", action="store_true", help="list ACLs")
    p.add_argument("--allow-principal", action="append", default=[], metavar="TYPE:NAME",
                   help="a principal to allow (User:alice, User:* for everyone); repeatable")
    p.add_argument("--deny-principal", action="append", default=[], metavar="TYPE:NAME",
                   help="a principal to deny; repeatable")
    p.add_argument("--allow-host", action="append", default=[], metavar="IP",
                   help="a host the allowed principals may connect from (default *); repeatable")
    p.add_argument("--deny-host", action="append", default=[], metavar="IP",
                   help="a host the denied principals are denied from (default *); repeatable")
    p.add_argument("--principal", action="append", default=[], metavar="TYPE:NAME",
                   help="with --list: only this principal's ACLs; repeatable")
    p.add_argument("--operation", action="append", default=[], metavar="OP",
                   help=f"one of {', '.join(OPERATIONS)} (default All); repeatable")
    p.add_argument("--topic", action="append", default=[], metavar="NAME", help="a topic (* for all); repeatable")
    p.add_argument("--group", action="append", default=[], metavar="NAME", help="a group (* for all); repeatable")
    p.add_argument("--transactional-id", action="append", default=[], metavar="ID",
                   help="a transactional id (* for all); repeatable")
    p.add_argument("--cluster", action="store_true", help="the cluster")
    p.add_argument("--resource-pattern-type", default="literal", type=str.lower, choices=PATTERN_TYPES,
                   help="literal (default) or prefixed; any or match with --list and --remove")
    p.add_argument("--force", action="store_true", help="--remove without asking")
    p.add_argument("--producer", action="store_true",
                   help="a producer's ACLs: Write, Describe and Create on the topics, Write and Describe on the "
                        "transactional ids")
    p.add_argument("--idempotent", action="store_true",
                   help="with --producer: also IdempotentWrite on the cluster")
    p.add_argument("--consumer", action="store_true",
                   help="a consumer's ACLs: Read and Describe on the topics, Read on the groups")


def _enums() -> Any:
    from confluent_kafka.admin import (
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
    )

    return AclOperation, AclPermissionType, ResourcePatternType, ResourceType


def _operation(name: str) -> Any:
    AclOperation = _enums()[0]
    key = {o.lower(): o for o in OPERATIONS}.get(name.replace("_", "").replace("-", "").lower())
    if key is None:
        raise CliError(f"unknown --operation {name!r}: one of {', '.join(OPERATIONS)}")
    upper = "".join("_" + c if c.isupper() and i else c for i, c in enumerate(key)).upper()
    return getattr(AclOperation, upper)


def _resources(args: argparse.Namespace, *, listing: bool) -> list[tuple[Any, str | None]]:
    ResourceType = _enums()[3]
    out: list[tuple[Any, str | None]] = [(ResourceType.TOPIC, t) for t in args.topic]
    out += [(ResourceType.GROUP, g) for g in args.group]
    out += [(ResourceType.TRANSACTIONAL_ID, t) for t in args.transactional_id]
    if args.cluster:
        out.append((ResourceType.BROKER, "kafka-cluster"))
    if not out and not listing:
        raise CliError("give a resource: --topic, --group, --transactional-id or --cluster")
    if any(not name for _, name in out):
        raise CliError("a resource name must not be empty")
    return out


def _pattern(args: argparse.Namespace, *, filtering: bool) -> Any:
    ResourcePatternType = _enums()[2]
    if not filtering and args.resource_pattern_type not in ("literal", "prefixed"):
        raise CliError("--add takes --resource-pattern-type literal or prefixed")
    return getattr(ResourcePatternType, args.resource_pattern_type.upper())


# the operations each resource type takes (besides All), as kafka-acls.sh checks them
_VALID_OPERATIONS = {
    "TOPIC": ("READ", "WRITE", "CREATE", "DESCRIBE", "DELETE", "ALTER", "DESCRIBE_CONFIGS", "ALTER_CONFIGS"),
    "GROUP": ("READ", "DESCRIBE", "DELETE", "DESCRIBE_CONFIGS", "ALTER_CONFIGS"),
    "BROKER": ("CREATE", "CLUSTER_ACTION", "DESCRIBE_CONFIGS", "ALTER_CONFIGS", "IDEMPOTENT_WRITE", "ALTER",
               "DESCRIBE"),
    "TRANSACTIONAL_ID": ("DESCRIBE", "WRITE"),
}


def _check_operations(resources: list[tuple[Any, str | None]], ops: list[Any]) -> None:
    """CliError, as kafka-acls.sh refuses it, for an operation the resource type does not take."""
    for rt, _ in resources:
        valid = _VALID_OPERATIONS.get(rt.name)
        if valid is not None and any(op.name != "ALL" and op.name not in valid for op in ops):
            kind = "CLUSTER" if rt.name == "BROKER" else rt.name
            raise CliError(f"ResourceType {kind} only supports operations {', '.join((*valid, 'ALL'))}")


def _plan(args: argparse.Namespace) -> list[tuple[Any, str, list[Any]]]:
    """(resource type, name, operations) of each resource ``--add`` or ``--remove`` acts
    on: the resources with ``--operation``'s, or kafka-acls.sh's ``--producer`` and
    ``--consumer`` shortcuts."""
    if not (args.producer or args.consumer):
        if args.idempotent:
            raise CliError("--idempotent is only valid with --producer")
        ops = [_operation(o) for o in args.operation]
        return [(rt, name, ops) for rt, name in _resources(args, listing=False)]
    if args.operation or args.deny_principal or args.deny_host:
        raise CliError("--producer and --consumer take no --operation, --deny-principal or --deny-host")
    if args.idempotent and not args.producer:
        raise CliError("--idempotent is only valid with --producer")
    if args.producer and not args.topic:
        raise CliError("With --producer you must specify a --topic")
    if args.consumer and (not args.topic or not args.group
                          or (not args.producer and (args.cluster or args.transactional_id))):
        raise CliError("With --consumer you must specify a --topic and a --group and no --cluster or "
                       "--transactional-id option should be specified.")
    AclOperation, _, _, ResourceType = _enums()
    ops: dict[tuple[Any, str], list[Any]] = {}

    def grant(rt: Any, name: str, *wanted: Any) -> None:
        have = ops.setdefault((rt, name), [])
        have.extend(op for op in wanted if op not in have)

    if args.producer:
        for t in args.topic:
            grant(ResourceType.TOPIC, t, AclOperation.WRITE, AclOperation.DESCRIBE, AclOperation.CREATE)
        for t in args.transactional_id:
            grant(ResourceType.TRANSACTIONAL_ID, t, AclOperation.WRITE, AclOperation.DESCRIBE)
        if args.idempotent:
            grant(ResourceType.BROKER, "kafka-cluster", AclOperation.IDEMPOTENT_WRITE)
    if args.consumer:
        for t in args.topic:
            grant(ResourceType.TOPIC, t, AclOperation.READ, AclOperation.DESCRIBE)
        for g in args.group:
            grant(ResourceType.GROUP, g, AclOperation.READ)
    return [(rt, name, o) for (rt, name), o in ops.items()]


def _resource_pattern(rt: Any, pattern: Any) -> Any:
    """The cluster is always named literally (--idempotent with a prefixed pattern)."""
    return _enums()[2].LITERAL if rt.name == "BROKER" and pattern.name in ("LITERAL", "PREFIXED") else pattern


def _entries(args: argparse.Namespace, ops: list[Any]) -> list[tuple[str, str, Any, Any]]:
    """(principal, host, operation, permission) of every ACL the options name, for
    ``ops`` (All when empty)."""
    AclPermissionType = _enums()[1]
    ops = ops or [_operation("All")]
    out = []
    for principals, hosts, perm in ((args.allow_principal, args.allow_host, AclPermissionType.ALLOW),
                                    (args.deny_principal, args.deny_host, AclPermissionType.DENY)):
        for principal in principals:
            if ":" not in principal:
                raise CliError(f"principal {principal!r} must be TYPE:NAME, e.g. User:alice")
            for host in hosts or ["*"]:
                out.extend((principal, host, op, perm) for op in ops)
    return out


def _add(args: argparse.Namespace) -> int:
    from confluent_kafka.admin import AclBinding

    pattern = _pattern(args, filtering=False)
    plan = [(rt, name, _resource_pattern(rt, pattern), _entries(args, ops)) for rt, name, ops in _plan(args)]
    if not any(entries for *_, entries in plan):
        raise CliError("--add needs --allow-principal or --deny-principal")
    for rt, name, _, entries in plan:
        _check_operations([(rt, name)], [e[2] for e in entries])
    bindings = [AclBinding(rt, name, pt, principal, host, op, perm)
                for rt, name, pt, entries in plan for principal, host, op, perm in entries]
    t = timeout_s(args)
    admin = admin_client(args)
    for f in admin.create_acls(bindings, request_timeout=t).values():
        f.result(t)
    if args.output == "text":
        for rt, name, pt, entries in plan:
            print(f"Adding ACLs for resource `{_pattern_text(rt, name, pt)}`: ")
            for principal, host, op, perm in entries:
                print(f" \t{_entry_text(principal, host, op, perm)} ")
            print()
    return _list_of(args, admin, [(rt, name, pt) for rt, name, pt, _ in plan], pattern)


def _remove(args: argparse.Namespace) -> int:
    from confluent_kafka.admin import AclBindingFilter

    AclOperation, AclPermissionType = _enums()[:2]
    pattern = _pattern(args, filtering=True)
    plan: list[tuple[Any, str, Any, list[tuple[str | None, str | None, Any, Any]]]] = []
    for rt, name, ops in _plan(args):
        entries: list[tuple[str | None, str | None, Any, Any]] = list(_entries(args, ops))
        if not entries:
            if args.operation:
                raise CliError("--remove with --operation needs --allow-principal or --deny-principal")
            entries = [(None, None, AclOperation.ANY, AclPermissionType.ANY)]
        _check_operations([(rt, name)], [e[2] for e in entries if e[0] is not None])
        plan.append((rt, name, _resource_pattern(rt, pattern), entries))
    if not args.force:
        what = ", ".join(f"`{_pattern_text(rt, name, pt)}`" for rt, name, pt, _ in plan)
        print(f"Are you sure you want to remove ACLs: {what} ? (y/n)", flush=True)
        if sys.stdin.readline().strip().lower() not in ("y", "yes"):
            return 1
    filters = [AclBindingFilter(rt, name, pt, principal, host, op, perm)
               for rt, name, pt, entries in plan for principal, host, op, perm in entries]
    t = timeout_s(args)
    admin = admin_client(args)
    removed = []
    for f in admin.delete_acls(filters, request_timeout=t).values():
        removed.extend(f.result(t))
    if args.output == "json":
        print(json.dumps({"removed": [_binding_json(b) for b in removed]}))
    else:
        print(f"Removed {len(removed)} ACL(s).")
    return 0


def _list(args: argparse.Namespace) -> int:
    if args.producer or args.consumer or args.idempotent:
        raise CliError("--producer, --consumer and --idempotent are only valid with --add or --remove")
    admin = admin_client(args)
    resources: list[tuple[Any, str | None]] = _resources(args, listing=True) or [(_enums()[3].ANY, None)]
    return _list_of(args, admin, resources, _pattern(args, filtering=True), args.principal or [None])


def _list_of(args: argparse.Namespace, admin: Any, resources: list[tuple[Any, ...]], pattern: Any,
             principals: list[str | None] | None = None) -> int:
    """Print the ACLs of ``resources``: (type, name), or (type, name, pattern type) where it
    is not ``pattern``."""
    from confluent_kafka.admin import AclBindingFilter

    AclOperation, AclPermissionType, ResourcePatternType, _ = _enums()
    t = timeout_s(args)
    found: dict[tuple[Any, str, Any], list[Any]] = {}
    for resource in resources:
        rt, name, pt = resource if len(resource) == 3 else (*resource, pattern)
        for principal in principals or [None]:
            flt = AclBindingFilter(rt, name, pt if name is not None else ResourcePatternType.ANY, principal,
                                   None, AclOperation.ANY, AclPermissionType.ANY)
            for b in admin.describe_acls(flt, request_timeout=t).result(t):
                found.setdefault((b.restype, b.name, b.resource_pattern_type), [])
                if b not in found[(b.restype, b.name, b.resource_pattern_type)]:
                    found[(b.restype, b.name, b.resource_pattern_type)].append(b)
    if args.output == "json":
        print(json.dumps({"acls": [_binding_json(b) for bs in found.values() for b in bs]}))
        return 0
    for (rt, name, pt), bs in found.items():
        print(f"Current ACLs for resource `{_pattern_text(rt, name, pt)}`: ")
        for b in bs:
            print(f" \t{_entry_text(b.principal, b.host, b.operation, b.permission_type)} ")
        print()
    return 0


def _pattern_text(rt: Any, name: str | None, pt: Any) -> str:
    kind = "CLUSTER" if rt.name == "BROKER" else rt.name
    return f"ResourcePattern(resourceType={kind}, name={name}, patternType={pt.name})"


def _entry_text(principal: str | None, host: str | None, op: Any, perm: Any) -> str:
    return f"(principal={principal}, host={host}, operation={op.name}, permissionType={perm.name})"


def _binding_json(b: Any) -> dict[str, Any]:
    return {"resource_type": "CLUSTER" if b.restype.name == "BROKER" else b.restype.name, "name": b.name,
            "pattern_type": b.resource_pattern_type.name, "principal": b.principal, "host": b.host,
            "operation": b.operation.name, "permission": b.permission_type.name}


@command("acls", "add, remove and list the authorizer's ACLs (kafka-acls)")(_configure)
def run(args: argparse.Namespace) -> int:
    return tool_main("acls", lambda: _add(args) if args.add else _remove(args) if args.remove else _list(args))
