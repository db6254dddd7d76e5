"""``shoal configs``: describe and alter topic, group and broker configs (kafka-configs.sh).

Kafka's options: ``--entity-type topics|groups|brokers|clients|users``, ``--entity-name``
(or ``--entity-default`` for brokers), ``--describe [--all]``, ``--alter --add-config
k=v,k2=[a,b] --delete-config k,k2``. Output as Kafka's: ``Dynamic configs for topic T
are:`` followed by ``  name=value sensitive=false synonyms={SOURCE:name=value, ...}``
lines, and ``Completed updating config for topic T.`` after an alter. Uses
confluent-kafka's AdminClient.

Client quotas (DescribeClientQuotas / AlterClientQuotas, over the tool's own connection):
``--entity-type clients|users`` with ``--entity-name NAME`` or ``--entity-default``; both
types given (``--entity-type users --entity-name alice --entity-type clients
--entity-default``) name a user's quota for a client id; ``--user``, ``--client``,
``--user-defaults`` and ``--client-defaults`` are Kafka's shortcuts. ``--add-config
producer_byte_rate=1048576,consumer_byte_rate=...,request_percentage=...`` and
``--delete-config`` alter them; ``--describe`` prints Kafka's ``Quota configs for
client-id 'app' are producer_byte_rate=1048576.0`` lines (without a name: every entity of
that type). SCRAM credentials are ``shoal users``'s.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from .common import (
    CliError,
    add_connection_options,
    add_output_options,
    admin_client,
    kafka_error_text,
    reach,
    timeout_s,
    tool_main,
    verbose,
)
from .main import command

ENTITY_TYPES = ("topics", "groups", "brokers", "clients", "users", "ips", "broker-loggers", "client-metrics")
# The APIs a broker must serve for these entity types (Kafka's tool uses them).
_QUOTA_APIS = {"clients": (48, "DescribeClientQuotas"), "users": (48, "DescribeClientQuotas"),
               "ips": (48, "DescribeClientQuotas")}
_QUOTA_TYPES = {"users": "user", "clients": "client-id"}
_QUOTA_WORDS = {"user": "user-principal", "client-id": "client-id"}
DEFAULT = object()
"""An entity name given as ``--entity-default``."""


class _EntityAction(argparse.Action):
    """--entity-type/--entity-name/--entity-default in order: each type takes the name or
    default given after it (Kafka's tool pairs them the same way)."""

    def __call__(self, parser: argparse.ArgumentParser, ns: argparse.Namespace, value: Any,
                 option: str | None = None) -> None:
        entities = list(getattr(ns, "entities", None) or [])
        if self.dest == "entity_type":
            entities.append([value, None])
            ns.entity_type = ns.entity_type or value
        else:
            name = DEFAULT if self.dest == "entity_default" else value
            if not entities or entities[-1][1] is not None:
                entities.append([None, name])
            else:
                entities[-1][1] = name
            if self.dest == "entity_default":
                ns.entity_default = True
            elif ns.entity_name is None:
                ns.entity_name = value
        ns.entities = entities
_SOURCE_NAMES = {"GROUP_CONFIG": "DYNAMIC_GROUP_CONFIG"}
_DYNAMIC = {"topics": "DYNAMIC_TOPIC_CONFIG", "groups": "DYNAMIC_GROUP_CONFIG", "brokers": "DYNAMIC_BROKER_CONFIG"}


def _configure(p: argparse.ArgumentParser) -> None:
    add_connection_options(p)
    action = p.add_mutually_exclusive_group(required=True)
    action.add_argument("--describe", action="store_true", help="list the configs of the entity")
    action.add_argument("--alter", action="store_true", help="change the configs of the entity")
    p.add_argument("--entity-type", choices=ENTITY_TYPES, action=_EntityAction,
                   help="topics, groups, brokers; clients, users: quotas (both: a user's quota for a client id)")
    p.add_argument("--entity-name", action=_EntityAction, help="the topic, group, broker id, client id or user")
    p.add_argument("--entity-default", action=_EntityAction, nargs=0,
                   help="with --entity-type clients or users: the default client id or user")
    p.set_defaults(entities=[], entity_default=False)
    p.add_argument("--user", help="same as --entity-type users --entity-name USER")
    p.add_argument("--client", help="same as --entity-type clients --entity-name CLIENT")
    p.add_argument("--user-defaults", action="store_true", help="same as --entity-type users --entity-default")
    p.add_argument("--client-defaults", action="store_true", help="same as --entity-type clients --entity-default")
    p.add_argument("--topic", help="same as --entity-type topics --entity-name TOPIC")
    p.add_argument("--group", help="same as --entity-type groups --entity-name GROUP")
    p.add_argument("--broker", help="same as --entity-type brokers --entity-name ID")
    p.add_argument("--all", action="store_true", help="with --describe: every config, not only the dynamic ones")
    p.add_argument("--add-config", metavar="K=V,K2=[A,B],...", help="configs to set")
    p.add_argument("--add-config-file", metavar="FILE", help="a properties file of configs to set")
    p.add_argument("--delete-config", metavar="K,K2", help="configs to remove (back to their defaults)")
    add_output_options(p)


def parse_add_config(text: str) -> dict[str, str]:
    """Kafka's ``k=v,k2=[a,b]`` syntax: commas inside brackets belong to the value."""
    out: dict[str, str] = {}
    item, depth = "", 0
    items = []
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "," and depth == 0:
            items.append(item)
            item = ""
        else:
            item += ch
    items.append(item)
    for it in items:
        if not it.strip():
            continue
        k, sep, v = it.partition("=")
        if not sep or not k.strip():
            raise CliError(f"Invalid entity config: all configs to be added must be in the format \"key=val\": {it!r}")
        v = v.strip()
        if v.startswith("[") and v.endswith("]"):
            v = v[1:-1]
        out[k.strip()] = v
    return out


def _quota_entity(args: argparse.Namespace) -> list[tuple[str, Any]] | None:
    """The (quota entity type, name, DEFAULT or None for any) of a clients/users command, or
    None for another entity type."""
    pairs: list[tuple[str, Any]] = []
    for etype, name in args.entities:
        if etype is None:
            raise CliError("--entity-name and --entity-default must follow an --entity-type")
        pairs.append((etype, name))
    for etype, name, flag in (("users", args.user, args.user_defaults), ("clients", args.client,
                                                                          args.client_defaults)):
        if name is not None or flag:
            pairs.append((etype, DEFAULT if flag and name is None else name))
    if not pairs or not all(t in _QUOTA_TYPES for t, _ in pairs):
        if any(t in _QUOTA_TYPES for t, _ in pairs) or args.user or args.client or args.user_defaults \
                or args.client_defaults:
            raise CliError("clients and users cannot be combined with another entity type")
        return None
    if len({t for t, _ in pairs}) != len(pairs):
        raise CliError("an entity type may be given once")
    return [(_QUOTA_TYPES[t], n) for t, n in pairs]


def _entity(args: argparse.Namespace) -> tuple[str, str | None]:
    shortcuts = [(t, v) for t, v in (("topics", args.topic), ("groups", args.group), ("brokers", args.broker)) if v]
    if shortcuts:
        if len(shortcuts) > 1 or args.entity_type:
            raise CliError("give either --entity-type/--entity-name or one of --topic, --group, --broker")
        return shortcuts[0]
    if not args.entity_type:
        raise CliError("--entity-type (topics, groups, brokers) is required")
    if args.entity_default:
        raise CliError("--entity-default is not supported yet: name the broker with --entity-name ID")
    if len(args.entities) > 1:
        raise CliError(f"--entity-type {args.entity_type} takes one --entity-name")
    return args.entity_type, args.entity_name


def _source(entry: Any) -> str:
    from confluent_kafka.admin import ConfigSource

    source = entry.source
    if isinstance(source, int) and not isinstance(source, ConfigSource):
        try:
            source = ConfigSource(source)
        except ValueError:
            return str(source)
    name = getattr(source, "name", str(source))
    return _SOURCE_NAMES.get(name, name)


def _synonyms(entry: Any) -> list[tuple[str, str, str]]:
    """(source, name, value) of an entry's synonyms, most specific first, as Kafka's tool prints them.

    confluent-kafka keeps synonyms in a dict keyed by name, so of synonyms sharing a name
    (a topic's ``min.insync.replicas`` and the broker's) only the last arrives; the entry
    itself then stands for the most specific one."""
    synonyms = [(_source(s), s.name, s.value) for s in (entry.synonyms or {}).values()]
    source = _source(entry)
    if entry.is_default or any(s == source for s, _, _ in synonyms):
        return synonyms
    own_name = source in ("DYNAMIC_TOPIC_CONFIG", "DYNAMIC_GROUP_CONFIG") or not synonyms
    synonyms.insert(0, (source, entry.name if own_name else synonyms[0][1], entry.value))
    return synonyms


class _Configs:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.t = timeout_s(args)
        self.quota_entity = _quota_entity(args)
        conn = reach(args, "shoal-configs")
        self.broker_apis = dict(conn.broker_versions)
        if self.quota_entity is not None:
            self.conn = conn
            return
        conn.close()
        self.admin = admin_client(args)

    def _resource(self, kind: str, name: str) -> Any:
        from confluent_kafka.admin import ConfigResource, ResourceType

        rtype = {"topics": ResourceType.TOPIC, "groups": ResourceType.GROUP, "brokers": ResourceType.BROKER}[kind]
        return ConfigResource(rtype, name)

    def _check_supported(self, kind: str) -> None:
        if kind in _QUOTA_APIS:
            key, api = _QUOTA_APIS[kind]
            if key not in self.broker_apis:
                raise CliError(f"the broker at {self.args.bootstrap_server} does not serve {api}: "
                               f"--entity-type {kind} (quotas, SCRAM credentials) is not supported by it")
            raise CliError(f"--entity-type {kind} is not supported by this tool yet")
        if kind not in ("topics", "groups", "brokers"):
            raise CliError(f"--entity-type {kind} is not supported by shoal")

    def _entries(self, kind: str, name: str) -> list[Any]:
        res = self._resource(kind, name)
        try:
            cfg = self.admin.describe_configs([res], request_timeout=self.t)[res].result(timeout=self.t)
        except Exception as e:
            raise CliError(f"cannot describe the configs of {kind[:-1]} {name or '(default)'}: "
                           f"{kafka_error_text(e)}") from None
        return sorted(cfg.values(), key=lambda e: e.name)

    def _names(self, kind: str) -> list[str]:
        if kind == "topics":
            return sorted(self.admin.list_topics(timeout=self.t).topics)
        if kind == "brokers":
            md = self.admin.list_topics(timeout=self.t)
            return [str(b) for b in sorted(md.brokers)]
        listed = self.admin.list_consumer_groups(request_timeout=self.t).result(timeout=self.t)
        return sorted(g.group_id for g in listed.valid)

    # -- client quotas -----------------------------------------------------------------
    def _quota_call(self, api_key: int, **fields: Any) -> Any:
        if api_key not in self.broker_apis:
            raise CliError(f"the broker at {self.args.bootstrap_server} does not serve {_QUOTA_APIS['clients'][1]}: "
                           "client quotas are not supported by it")
        from ..client.connection import KafkaProtocolError

        try:
            return self.conn.call(api_key, self.conn.version_for(api_key, 0, 1), **fields)
        except (OSError, ConnectionError, KafkaProtocolError) as e:
            raise CliError(f"cannot reach the broker: {e}") from None

    def describe_quotas(self, entity: list[tuple[str, Any]]) -> int:
        from ..protocol.entities import sub

        cls = self.conn.request_type(48, self.conn.version_for(48, 0, 1))
        ccls = sub(cls, "ComponentData")
        components = tuple(make_component(ccls, t, n) for t, n in entity)
        r = self._quota_call(48, components=components, strict=True)
        if r.error_code != 0:
            raise CliError(f"cannot describe client quotas: {r.error_code.name.upper()}: {r.error_message}")
        doc = []
        for e in r.entries or ():
            names = {x.entity_type: x.entity_name for x in e.entity}
            values = {v.key: v.value for v in e.values}
            if self.args.output == "json":
                doc.append({"entity": [{"type": t, "name": n} for t, n in names.items()], "quotas": values})
                continue
            what = ", ".join(f"{_QUOTA_WORDS.get(t, t)} '{names[t]}'" if names[t] is not None
                             else f"the default {_QUOTA_WORDS.get(t, t)}"
                             for t in ("user", "client-id", "ip") if t in names)
            print(f"Quota configs for {what} are {', '.join(f'{k}={v}' for k, v in values.items())}")
        if self.args.output == "json":
            print(json.dumps(doc))
        return 0

    def alter_quotas(self, entity: list[tuple[str, Any]]) -> int:
        from ..protocol.entities import make, sub

        a = self.args
        if any(n is None for _, n in entity):
            raise CliError("an entity name or --entity-default must be specified with --alter of clients or users")
        to_set: dict[str, str] = parse_add_config(a.add_config) if a.add_config else {}
        to_delete = [k.strip() for k in (a.delete_config or "").split(",") if k.strip()]
        if not to_set and not to_delete:
            raise CliError("--alter needs --add-config or --delete-config")
        scram = [k for k in (*to_set, *to_delete) if k.upper().startswith("SCRAM-")]
        if scram:
            raise CliError(f"{', '.join(scram)}: SCRAM credentials are managed with shoal users "
                           "(or Kafka's kafka-configs)")
        ops = []
        for k, v in to_set.items():
            try:
                value = float(v)
            except ValueError:
                raise CliError(f"Cannot parse quota configuration value for {k}: {v}") from None
            ops.append((k, value, False))
        ops += [(k, 0.0, True) for k in to_delete]
        cls = self.conn.request_type(49, self.conn.version_for(49, 0, 1))
        ecls, ocls, entry_cls = sub(cls, "EntityData"), sub(cls, "OpData"), sub(cls, "EntryData")
        entry = make(entry_cls, entity=tuple(make(ecls, entity_type=t, entity_name=None if n is DEFAULT else n)
                                             for t, n in entity),
                     ops=tuple(make(ocls, key=k, value=v, remove=rm) for k, v, rm in ops))
        r = self._quota_call(49, entries=(entry,), validate_only=False)
        for e in r.entries:
            if e.error_code != 0:
                raise CliError(f"cannot alter client quotas: {e.error_code.name.upper()}: {e.error_message}")
        verbose(a, f"set {sorted(to_set)}, deleted {to_delete}")
        kind, name = entity[0]
        word = {"user": "user", "client-id": "client"}[kind]
        if a.output == "json":
            print(json.dumps({"entity": [{"type": t, "name": None if n is DEFAULT else n} for t, n in entity],
                              "set": to_set, "deleted": to_delete}))
        elif name is DEFAULT:
            print(f"Completed updating default config for {word}s in the cluster.")
        else:
            print(f"Completed updating config for {word} {name}.")
        return 0

    def describe(self) -> int:
        if self.quota_entity is not None:
            return self.describe_quotas(self.quota_entity)
        kind, name = _entity(self.args)
        self._check_supported(kind)
        names = [name] if name is not None else self._names(kind)
        doc = []
        for n in names:
            dynamic = _DYNAMIC[kind] if not (kind == "brokers" and n == "") else "DYNAMIC_DEFAULT_BROKER_CONFIG"
            entries = self._entries(kind, n)
            if not self.args.all:
                wanted = {dynamic, "DYNAMIC_DEFAULT_BROKER_CONFIG"} if kind == "brokers" else {dynamic}
                entries = [e for e in entries if _source(e) in wanted]
            rows = []
            for e in entries:
                rows.append((e, _synonyms(e)))
            if self.args.output == "json":
                doc.append({"entity_type": kind, "entity_name": n, "configs": [
                    {"name": e.name, "value": e.value, "source": _source(e), "sensitive": bool(e.is_sensitive),
                     "read_only": bool(e.is_read_only),
                     "synonyms": [{"source": s, "name": k, "value": v} for s, k, v in syn]} for e, syn in rows]})
                continue
            if kind == "brokers" and n == "":
                print("Default configs for brokers in the cluster are:")
            else:
                print(f"{'All' if self.args.all else 'Dynamic'} configs for {kind[:-1]} {n} are:")
            for e, syn in rows:
                value = "null" if e.is_sensitive or e.value is None else e.value
                text = ", ".join(f"{s}:{k}={v}" for s, k, v in syn)
                print(f"  {e.name}={value} sensitive={str(bool(e.is_sensitive)).lower()} synonyms={{{text}}}")
        if self.args.output == "json":
            print(json.dumps(doc))
        return 0

    def alter(self) -> int:
        from confluent_kafka.admin import AlterConfigOpType, ConfigEntry

        a = self.args
        if self.quota_entity is not None:
            return self.alter_quotas(self.quota_entity)
        kind, name = _entity(a)
        self._check_supported(kind)
        if name is None:
            raise CliError("an entity name must be specified with --alter of " + kind)
        to_set: dict[str, str] = {}
        if a.add_config_file:
            from .common import client_config

            to_set.update(client_config(argparse.Namespace(command_config=a.add_config_file)))
        if a.add_config:
            to_set.update(parse_add_config(a.add_config))
        to_delete = [k.strip() for k in (a.delete_config or "").split(",") if k.strip()]
        if not to_set and not to_delete:
            raise CliError("--alter needs --add-config, --add-config-file or --delete-config")
        if kind == "topics" and name not in self.admin.list_topics(timeout=self.t).topics:
            raise CliError(f"The topic '{name}' does not exist.")
        if to_delete:
            dynamic = _DYNAMIC[kind] if not (kind == "brokers" and name == "") else "DYNAMIC_DEFAULT_BROKER_CONFIG"
            present = {e.name for e in self._entries(kind, name) if _source(e) == dynamic}
            missing = [k for k in to_delete if k not in present]
            if missing:
                raise CliError(f"Invalid config(s): {','.join(missing)}")
        ops = [ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in to_set.items()]
        ops += [ConfigEntry(k, "", incremental_operation=AlterConfigOpType.DELETE) for k in to_delete]
        res = self._resource(kind, name)
        res = type(res)(res.restype, res.name, incremental_configs=ops)
        try:
            self.admin.incremental_alter_configs([res], request_timeout=self.t)[res].result(timeout=self.t)
        except Exception as e:
            raise CliError(f"cannot alter the configs of {kind[:-1]} {name or '(default)'}: "
                           f"{kafka_error_text(e)}") from None
        verbose(a, f"set {sorted(to_set)}, deleted {to_delete}")
        if a.output == "json":
            print(json.dumps({"entity_type": kind, "entity_name": name, "set": to_set, "deleted": to_delete}))
        elif kind == "brokers" and name == "":
            print("Completed updating default config for brokers in the cluster.")
        else:
            print(f"Completed updating config for {kind[:-1]} {name}.")
        return 0


def make_component(cls: type, etype: str, name: Any) -> Any:
    """A DescribeClientQuotas filter component: exact name, default, or any name (strict)."""
    from ..protocol.entities import make

    if name is DEFAULT:
        return make(cls, entity_type=etype, match_type=1, match=None)
    if name is None:
        return make(cls, entity_type=etype, match_type=2, match=None)
    return make(cls, entity_type=etype, match_type=0, match=name)


@command("configs", "describe and alter topic, group and broker configs and client quotas (kafka-configs)")(_configure)
def run(args: argparse.Namespace) -> int:
    def body() -> int:
        tool = _Configs(args)
        return tool.describe() if args.describe else tool.alter()

    return tool_main("configs", body)
