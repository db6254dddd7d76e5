"""DescribeConfigs (32), AlterConfigs (33), IncrementalAlterConfigs (44).

Resources: TOPIC (2), BROKER (4) and GROUP (32, KIP-848/KIP-932 group configs). Topic
overrides live with the topic metadata in the log store (in cluster mode they are changed
in etcd, compare-and-swap on the topic key, and every broker applies them from its
metadata watch; the receiving broker answers once it has); broker and group overrides in
``broker.dynamic_configs`` (persisted in the data directory; in cluster mode group
overrides are the cluster's, changed in etcd and applied from the watch as topic ones). Every value is checked
against ``shoal.config`` before anything is stored; a resource's changes apply all or
none. The configs that decide which records the broker deletes (``cleanup.policy``,
``retention.ms``, ``retention.bytes``) cannot be changed on the internal topics
(POLICY_VIOLATION), whose records are the group and share coordinators' state.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, TypeVar

from ...config import (
    CONFIG_DEFS,
    SENSITIVE_KEYS,
    ConfigError,
    Scope,
    check_topic_key,
    parse_value,
    share_config_problem,
    topic_broker_synonym,
    topic_keys,
)
from ...errors import ApiError, ErrorCode
from ...protocol.messages import alter_configs_response as alter_views
from ...protocol.messages import incremental_alter_configs_response as incremental_views
from ...protocol.messages.alter_configs_request import AlterConfigsRequest, AlterConfigsResource
from ...protocol.messages.alter_configs_response import AlterConfigsResponse
from ...protocol.messages.describe_configs_request import DescribeConfigsRequest, DescribeConfigsResource
from ...protocol.messages.describe_configs_response import (
    DescribeConfigsResourceResult,
    DescribeConfigsResponse,
    DescribeConfigsResult,
    DescribeConfigsSynonym,
)
from ...protocol.messages.incremental_alter_configs_request import (
    AlterConfigsResource as IncrementalAlterConfigsResource,
)
from ...protocol.messages.incremental_alter_configs_request import IncrementalAlterConfigsRequest
from ...protocol.messages.incremental_alter_configs_response import IncrementalAlterConfigsResponse
from ...security.acls import CLUSTER_NAME, Operation, ResourceType
from ...security.authz import allowed, per_entry
from ..context import RequestContext
from ..dispatch import api
from .metadata import INTERNAL_TOPICS, log_store

if TYPE_CHECKING:
    from ..broker import Broker

log = logging.getLogger("shoal.configs")

TOPIC, BROKER, BROKER_LOGGER, GROUP = 2, 4, 8, 32
SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3

CONFIG_SOURCE = {"topic": 1, "dynamic_broker": 2, "dynamic_default_broker": 3, "static_broker": 4, "default": 5,
                 "group": 8}
CONFIG_TYPE = {bool: 1, str: 2, int: 5, float: 6, list: 7}


@dataclass(frozen=True, slots=True)
class ConfigEntry:
    name: str
    value: str | None
    source: str
    read_only: bool
    config_type: int
    doc: str
    synonyms: tuple[tuple[str, str | None, str], ...] = ()


def to_text(value: object) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    return str(value)


def _broker_source(broker: Broker, name: str) -> str:
    """Where a broker key's value comes from: this broker's dynamic config (set with
    AlterConfigs on resource BROKER ``<node id>``), the properties file or ``-o``, or the default."""
    if name in broker.dynamic_configs.broker:
        return "dynamic_broker"
    default = CONFIG_DEFS[name].default
    return "static_broker" if broker.dynamic_configs.static_values().get(name, default) != default else "default"


def _broker_synonyms(broker: Broker, name: str) -> list[tuple[str, str | None, str]]:
    """Kafka's synonym chain of a broker key: dynamic, static, default (those that are set)."""
    d = CONFIG_DEFS[name]
    out: list[tuple[str, str | None, str]] = []
    if name in broker.dynamic_configs.broker:
        out.append((name, to_text(broker.config[name]), "dynamic_broker"))
    static = broker.dynamic_configs.static_values().get(name, d.default)
    if static != d.default:
        out.append((name, to_text(static), "static_broker"))
    out.append((name, to_text(d.default), "default"))
    return out


def topic_config_entries(broker: Broker, overrides: dict[str, str]) -> list[ConfigEntry]:
    out = []
    for d in topic_keys():
        synonym = topic_broker_synonym(d)
        if synonym is None:  # a topic key without a broker key (compression.type)
            if d.name in overrides:
                out.append(ConfigEntry(d.name, overrides[d.name], "topic", False, CONFIG_TYPE[d.type], d.doc,
                                       ((d.name, overrides[d.name], "topic"), (d.name, to_text(d.default), "default"))))
            else:
                out.append(ConfigEntry(d.name, to_text(d.default), "default", False, CONFIG_TYPE[d.type], d.doc,
                                       ((d.name, to_text(d.default), "default"),)))
            continue
        broker_value = to_text(broker.config[synonym])
        broker_source = _broker_source(broker, synonym)
        synonyms = _broker_synonyms(broker, synonym)
        if d.name in overrides:
            synonyms.insert(0, (d.name, overrides[d.name], "topic"))
            out.append(ConfigEntry(d.name, overrides[d.name], "topic", False, CONFIG_TYPE[d.type], d.doc,
                                   tuple(synonyms)))
        else:
            out.append(ConfigEntry(d.name, broker_value, broker_source, False, CONFIG_TYPE[d.type], d.doc,
                                   tuple(synonyms)))
    return out


def broker_config_entries(broker: Broker) -> list[ConfigEntry]:
    out = []
    for d in CONFIG_DEFS.values():
        if d.scope is not Scope.BROKER:
            continue
        shown = None if d.name in SENSITIVE_KEYS else to_text(broker.config[d.name])  # passwords, keys: never shown
        out.append(ConfigEntry(d.name, shown, _broker_source(broker, d.name), not d.dynamic, CONFIG_TYPE[d.type],
                               d.doc, tuple(_broker_synonyms(broker, d.name))))
    return out


def group_config_entries(broker: Broker, group_id: str) -> list[ConfigEntry]:
    overrides = broker.dynamic_configs.groups.get(group_id, {})
    out = []
    for d in CONFIG_DEFS.values():
        if d.scope is not Scope.GROUP:
            continue
        if d.name in overrides:
            out.append(ConfigEntry(d.name, overrides[d.name], "group", False, CONFIG_TYPE[d.type], d.doc))
        elif d.broker_synonym is not None:  # as Kafka: the source of the broker's value
            out.append(ConfigEntry(d.name, to_text(broker.config[d.broker_synonym]),
                                   _broker_source(broker, d.broker_synonym), False, CONFIG_TYPE[d.type], d.doc))
        else:
            out.append(ConfigEntry(d.name, to_text(d.default), "default", False, CONFIG_TYPE[d.type], d.doc))
    return out


_DURATION = re.compile(r"^P(?:(\d+)D)?(?:T(?:(\d+)H)?(?:(\d+)M)?(?:(\d+(?:\.\d+)?)S)?)?$")


def parse_by_duration(text: str) -> int:
    """Milliseconds of an ISO-8601 duration such as ``PT1H`` or ``P1DT2H30M``; ValueError otherwise."""
    m = _DURATION.match(text.strip().upper())
    if not m or text.strip().upper() in ("P", "PT"):
        raise ValueError(text)
    d, h, mi, s = m.groups()
    return int(((int(d or 0) * 24 + int(h or 0)) * 60 + int(mi or 0)) * 60_000 + float(s or 0) * 1000)


def check_group_config(broker: Broker, name: str, value: str) -> None:
    """Raise ApiError(INVALID_CONFIG) if ``value`` is not valid for group config ``name``."""
    d = CONFIG_DEFS.get(name)
    if d is None or d.scope is not Scope.GROUP:
        raise ApiError(ErrorCode.invalid_config, f"unknown group config {name}")
    try:
        parsed = parse_value(name, value)
    except ConfigError as e:
        raise ApiError(ErrorCode.invalid_config, str(e)) from None
    cfg = broker.config
    bounds = {
        "share.record.lock.duration.ms": ("group.share.min.record.lock.duration.ms",
                                          "group.share.max.record.lock.duration.ms"),
        "share.delivery.count.limit": ("group.share.min.delivery.count.limit", "group.share.max.delivery.count.limit"),
        "share.session.timeout.ms": ("group.share.min.session.timeout.ms", "group.share.max.session.timeout.ms"),
        "share.heartbeat.interval.ms": ("group.share.min.heartbeat.interval.ms",
                                        "group.share.max.heartbeat.interval.ms"),
        "share.partition.max.record.locks": ("group.share.min.partition.max.record.locks",
                                             "group.share.max.partition.max.record.locks"),
        "share.assignment.interval.ms": ("group.share.min.assignment.interval.ms",
                                         "group.share.max.assignment.interval.ms"),
        "consumer.assignment.interval.ms": ("group.consumer.min.assignment.interval.ms",
                                            "group.consumer.max.assignment.interval.ms"),
    }
    if name in bounds:
        lo, hi = cfg[bounds[name][0]], cfg[bounds[name][1]]
        if not lo <= parsed <= hi:
            raise ApiError(ErrorCode.invalid_config, f"{name} must be between {lo} and {hi}")
    if name == "share.auto.offset.reset" and parsed not in ("latest", "earliest"):
        kind, _, duration = parsed.partition(":")
        try:
            if kind != "by_duration":
                raise ValueError(parsed)
            if parse_by_duration(duration) < 0:
                raise ValueError(parsed)
        except ValueError:
            raise ApiError(ErrorCode.invalid_config,
                           "share.auto.offset.reset must be latest, earliest or by_duration:<ISO-8601>") from None


def _check_group_configs_together(broker: Broker, overrides: Mapping[str, str | None]) -> None:
    """KIP-932: a group's heartbeat interval must be shorter than its session timeout."""
    def effective(name: str) -> int:
        raw = overrides.get(name)
        return parse_value(name, raw) if raw is not None else broker.config.resolve(name)

    hb, session = effective("share.heartbeat.interval.ms"), effective("share.session.timeout.ms")
    if hb >= session:
        raise ApiError(ErrorCode.invalid_config,
                       f"share.heartbeat.interval.ms ({hb}) must be less than share.session.timeout.ms ({session})")


def _check_broker_configs_together(broker: Broker, dynamic: Mapping[str, str | None]) -> None:
    """The share-group broker settings as they would be once ``dynamic`` replaces the
    dynamic broker configs: each default within its min and max, heartbeat < session."""
    values = broker.dynamic_configs.static_values()
    for k, v in dynamic.items():
        if v is not None and k in values:
            values[k] = parse_value(k, v)
    problem = share_config_problem(values)
    if problem is not None:
        raise ApiError(ErrorCode.invalid_config, problem)


def _check_topic_config(name: str, value: str | None) -> None:
    try:
        check_topic_key(name)
        if value is not None:
            parse_value(name, value)
    except ConfigError as e:
        raise ApiError(ErrorCode.invalid_config, str(e)) from None


def _check_broker_config(name: str, value: str | None) -> None:
    d = CONFIG_DEFS.get(name)
    if d is None or d.scope is not Scope.BROKER:
        raise ApiError(ErrorCode.invalid_config, f"unknown broker config {name}")
    if not d.dynamic:
        raise ApiError(ErrorCode.invalid_request, f"{name} cannot be changed while the broker runs")
    if value is not None:
        try:
            parse_value(name, value)
        except ConfigError as e:
            raise ApiError(ErrorCode.invalid_config, str(e)) from None


def _apply_ops(current: dict[str, str], ops: list[tuple[str, int, str | None]]) -> dict[str, str]:
    new = dict(current)
    for name, op, value in ops:
        if op == SET:
            if value is None:
                raise ApiError(ErrorCode.invalid_config, f"null value for {name}")
            new[name] = value
        elif op == DELETE:
            new.pop(name, None)
        elif op in (APPEND, SUBTRACT):
            d = CONFIG_DEFS.get(name)
            if d is None or d.type is not list:
                raise ApiError(ErrorCode.invalid_config, f"{name} is not a list; APPEND/SUBTRACT do not apply")
            items = [x for x in (new.get(name) or "").split(",") if x]
            given = [x.strip() for x in (value or "").split(",") if x.strip()]
            if op == APPEND:
                items += [x for x in given if x not in items]
            else:
                items = [x for x in items if x not in given]
            new[name] = ",".join(items)
        else:
            raise ApiError(ErrorCode.invalid_request, f"unknown config operation {op}")
    return new


def _refresh_log_configs(broker: Broker) -> None:
    """Re-resolve every partition's settings after a broker default (``log.*``) changed.

    A topic without its own override follows the broker's dynamic default, as in Kafka.
    """
    store = log_store(broker)
    for meta in store.topics():
        cfg = store.log_config(meta.name)
        for i in range(meta.num_partitions):
            store.partition(meta.name, i).update_config(cfg)


def _log_change(kind: str, name: str, old: dict[str, str], new: dict[str, str]) -> None:
    """One INFO line naming what an alteration changed (nothing when it changed nothing)."""
    changes = [f"{k}={new[k]}" for k in sorted(new) if old.get(k) != new[k]]
    changes += [f"{k} deleted" for k in sorted(old) if k not in new]
    if changes:
        log.info("%s %s configs changed: %s", kind, name, ", ".join(changes))


PROTECTED_INTERNAL_CONFIGS = ("cleanup.policy", "retention.ms", "retention.bytes")
"""The topic configs that decide which records of a topic the broker deletes: fixed on the
internal topics, whose records are the coordinators' committed state."""


def _check_internal_topic_configs(name: str, current: dict[str, str], new: dict[str, str]) -> None:
    """Raise ApiError(POLICY_VIOLATION) if ``new`` changes how the records of internal topic
    ``name`` are deleted (set, changed or removed: AlterConfigs replaces the whole set)."""
    if name not in INTERNAL_TOPICS:
        return
    changed = [k for k in PROTECTED_INTERNAL_CONFIGS if current.get(k) != new.get(k)]
    if changed:
        raise ApiError(ErrorCode.policy_violation,
                       f"{', '.join(changed)} of internal topic {name} cannot be changed: its records are "
                       "the coordinators' state")


def _new_topic_configs(current: dict[str, str], ops: list[tuple[str, int, str | None]],
                       replace: bool, name: str = "") -> dict[str, str]:
    new = _apply_ops({} if replace else current, ops)
    for k, v in new.items():
        _check_topic_config(k, v)
    _check_internal_topic_configs(name, current, new)
    return new


async def _alter_topic_in_cluster(broker: Broker, name: str, ops: list[tuple[str, int, str | None]],
                                  validate_only: bool, replace: bool) -> None:
    """Cluster mode: the topic's configs change in etcd; every broker applies them from its watch."""
    old, new = await broker.cluster.alter_topic_configs(
        name, lambda current: _new_topic_configs(current, ops, replace, name), validate_only=validate_only)
    if not validate_only:
        _log_change("topic", name, old, new)


def _new_group_configs(broker: Broker, current: dict[str, str], ops: list[tuple[str, int, str | None]],
                       replace: bool) -> dict[str, str]:
    new = _apply_ops({} if replace else current, ops)
    for k, v in new.items():
        check_group_config(broker, k, v)
    _check_group_configs_together(broker, new)
    return new


async def _alter_group_in_cluster(broker: Broker, name: str, ops: list[tuple[str, int, str | None]],
                                  validate_only: bool, replace: bool) -> None:
    """Cluster mode: the group's configs change in etcd; every broker applies them from its watch."""
    old, new = await broker.cluster.alter_group_configs(
        name, lambda current: _new_group_configs(broker, current, ops, replace), validate_only=validate_only)
    if not validate_only:
        _log_change("group", name, old, new)


def alter_resource(broker: Broker, resource_type: int, name: str, ops: list[tuple[str, int, str | None]],
                   validate_only: bool, replace: bool = False) -> Awaitable[None] | None:
    """Apply config operations to one resource, all or nothing. Raises ApiError.

    Returns an awaitable for a topic or group in cluster mode (the change goes through
    etcd), else None.
    """
    if resource_type == TOPIC and broker.cluster.clustered:
        return _alter_topic_in_cluster(broker, name, ops, validate_only, replace)
    if resource_type == TOPIC:
        store = log_store(broker)
        meta = store.get_topic(name)
        if meta is None:
            raise ApiError(ErrorCode.unknown_topic_or_partition)
        new = _new_topic_configs(dict(meta.configs), ops, replace, name)
        if not validate_only:
            old = dict(meta.configs)
            store.alter_topic_configs(name, new, [k for k in meta.configs if k not in new])
            _log_change("topic", name, old, new)
    elif resource_type == BROKER:
        if name == "":
            raise ApiError(ErrorCode.invalid_request,
                           f"cluster-wide broker defaults (an empty broker name, --entity-default) are not "
                           f"supported: set the config per broker (--entity-name {broker.node_id})")
        if name != str(broker.node_id):
            raise ApiError(ErrorCode.invalid_request, f"unknown broker {name}")
        new = _apply_ops({} if replace else dict(broker.dynamic_configs.broker), ops)
        for k, v in new.items():
            _check_broker_config(k, v)
        _check_broker_configs_together(broker, new)
        if not validate_only:
            old = dict(broker.dynamic_configs.broker)
            broker.dynamic_configs.set_broker(new, broker.config)
            _refresh_log_configs(broker)
            _log_change("broker", str(broker.node_id), old, new)
    elif resource_type == GROUP:
        if not name:
            raise ApiError(ErrorCode.invalid_group_id)
        if broker.cluster.clustered:
            return _alter_group_in_cluster(broker, name, ops, validate_only, replace)
        new = _new_group_configs(broker, dict(broker.dynamic_configs.groups.get(name, {})), ops, replace)
        if not validate_only:
            old = dict(broker.dynamic_configs.groups.get(name, {}))
            broker.dynamic_configs.set_group(name, new)
            _log_change("group", name, old, new)
    else:
        raise ApiError(ErrorCode.invalid_request, f"resource type {resource_type} cannot be altered")
    return None


class _Resource(Protocol):
    """A config resource of a request (DescribeConfigs, AlterConfigs, IncrementalAlterConfigs)."""

    @property
    def resource_type(self) -> int: ...

    @property
    def resource_name(self) -> str: ...


R = TypeVar("R", bound=_Resource)
Result = TypeVar("Result")


def _config_refusal(ctx: RequestContext, operation: int,
                    make_result: Callable[[R, ErrorCode], Result]) -> Callable[[R], Result | None]:
    """Kafka's check of a config resource: a topic's on the TOPIC, a group's on the GROUP,
    a broker's (and its loggers', client metrics') on the CLUSTER."""
    def refusal(res: R) -> Result | None:
        if res.resource_type == TOPIC:
            ok, code = allowed(ctx, operation, ResourceType.TOPIC, res.resource_name), \
                ErrorCode.topic_authorization_failed
        elif res.resource_type == GROUP:
            ok, code = allowed(ctx, operation, ResourceType.GROUP, res.resource_name), \
                ErrorCode.group_authorization_failed
        else:
            ok, code = allowed(ctx, operation, ResourceType.CLUSTER, CLUSTER_NAME), \
                ErrorCode.cluster_authorization_failed
        return None if ok else make_result(res, code)
    return refusal


@api(32, 1, 4)
def handle_describe_configs(ctx: RequestContext, request: DescribeConfigsRequest) -> DescribeConfigsResponse:
    if ctx.broker.authorizer is None:
        return _describe_configs(ctx, request)

    def refused(res: DescribeConfigsResource, code: ErrorCode) -> DescribeConfigsResult:
        return DescribeConfigsResult(error_code=code, error_message="Authorization failed.",
                                     resource_type=res.resource_type, resource_name=res.resource_name, configs=())

    answer: DescribeConfigsResponse = per_entry(ctx, request, _describe_configs, "resources", "results",
                                                _config_refusal(ctx, Operation.DESCRIBE_CONFIGS, refused))
    return answer


def _describe_configs(ctx: RequestContext, request: DescribeConfigsRequest) -> DescribeConfigsResponse:
    broker = ctx.broker
    include_synonyms = request.include_synonyms
    include_docs = request.include_documentation  # v3 on; before, reads False
    results = []
    for res in request.resources:
        try:
            if res.resource_type == TOPIC:
                meta = log_store(broker).get_topic(res.resource_name)
                if meta is None:
                    raise ApiError(ErrorCode.unknown_topic_or_partition)
                entries = topic_config_entries(broker, dict(meta.configs))
            elif res.resource_type == BROKER:
                if res.resource_name not in ("", str(broker.node_id)):
                    raise ApiError(ErrorCode.invalid_request, f"unknown broker {res.resource_name}")
                # The empty name is the cluster-wide default, which shoal has none of (as Kafka
                # answers when no DYNAMIC_DEFAULT_BROKER_CONFIG is set).
                entries = broker_config_entries(broker) if res.resource_name else []
            elif res.resource_type == GROUP:
                entries = group_config_entries(broker, res.resource_name)
            else:
                raise ApiError(ErrorCode.invalid_request, f"resource type {res.resource_type} is not supported")
            if res.configuration_keys is not None:
                keys = set(res.configuration_keys)
                entries = [e for e in entries if e.name in keys]
            configs = tuple(
                DescribeConfigsResourceResult(
                    name=e.name, value=e.value, read_only=e.read_only, config_source=CONFIG_SOURCE[e.source],
                    is_sensitive=e.name in SENSITIVE_KEYS, config_type=e.config_type,
                    documentation=e.doc if include_docs else None,
                    synonyms=tuple(DescribeConfigsSynonym(name=n, value=v, source=CONFIG_SOURCE[s])
                                   for n, v, s in e.synonyms) if include_synonyms else ())
                for e in entries
            )
            results.append(DescribeConfigsResult(error_code=ErrorCode.none, error_message=None,
                                                 resource_type=res.resource_type, resource_name=res.resource_name,
                                                 configs=configs))
        except ApiError as e:
            results.append(DescribeConfigsResult(error_code=e.error_code, error_message=e.message,
                                                 resource_type=res.resource_type, resource_name=res.resource_name,
                                                 configs=()))
    return DescribeConfigsResponse(throttle_time=0, results=tuple(results))


AlterResult = TypeVar("AlterResult", alter_views.AlterConfigsResourceResponse,
                      incremental_views.AlterConfigsResourceResponse)
AlterResource = AlterConfigsResource | IncrementalAlterConfigsResource


Ops = list[tuple[str, int, str | None]]
"""A resource's changes: (config name, operation, value)."""


def _alter_results(ctx: RequestContext, changes: Sequence[tuple[AlterResource, Ops]], validate_only: bool,
                   replace: bool, result: Callable[[AlterResource, ApiError | None], AlterResult],
                   ) -> list[AlterResult] | Awaitable[list[AlterResult]]:
    """Each resource's outcome (all of its changes or none), as ``result(resource, error)``;
    ``replace``: the changes replace the resource's whole set of overrides (AlterConfigs)."""
    if ctx.broker.cluster.clustered and any(res.resource_type in (TOPIC, GROUP) for res, _ in changes):
        return _alter_results_async(ctx, changes, validate_only, replace, result)
    out = []
    for res, ops in changes:
        try:
            alter_resource(ctx.broker, res.resource_type, res.resource_name, ops, validate_only, replace=replace)
            out.append(result(res, None))
        except ApiError as e:
            out.append(result(res, e))
    return out


async def _alter_results_async(ctx: RequestContext, changes: Sequence[tuple[AlterResource, Ops]],
                               validate_only: bool, replace: bool,
                               result: Callable[[AlterResource, ApiError | None], AlterResult],
                               ) -> list[AlterResult]:
    out = []
    for res, ops in changes:
        try:
            done = alter_resource(ctx.broker, res.resource_type, res.resource_name, ops, validate_only,
                                  replace=replace)
            if done is not None:
                await done
            out.append(result(res, None))
        except ApiError as e:
            out.append(result(res, e))
    return out


def _alter_result(res: AlterResource, e: ApiError | None) -> alter_views.AlterConfigsResourceResponse:
    return alter_views.AlterConfigsResourceResponse(
        error_code=e.error_code if e else ErrorCode.none, error_message=e.message if e else None,
        resource_type=res.resource_type, resource_name=res.resource_name)


def _incremental_result(res: AlterResource, e: ApiError | None) -> incremental_views.AlterConfigsResourceResponse:
    return incremental_views.AlterConfigsResourceResponse(
        error_code=e.error_code if e else ErrorCode.none, error_message=e.message if e else None,
        resource_type=res.resource_type, resource_name=res.resource_name)


def _alter_configs(ctx: RequestContext,
                   request: AlterConfigsRequest) -> AlterConfigsResponse | Awaitable[AlterConfigsResponse]:
    changes = [(res, [(c.name, SET, c.value) for c in res.configs]) for res in request.resources]
    results = _alter_results(ctx, changes, request.validate_only, True, _alter_result)
    if isinstance(results, list):
        return AlterConfigsResponse(throttle_time=0, responses=tuple(results))

    async def later(pending: Awaitable[list[alter_views.AlterConfigsResourceResponse]]) -> AlterConfigsResponse:
        return AlterConfigsResponse(throttle_time=0, responses=tuple(await pending))
    return later(results)


def _incremental_alter_configs(
        ctx: RequestContext, request: IncrementalAlterConfigsRequest,
) -> IncrementalAlterConfigsResponse | Awaitable[IncrementalAlterConfigsResponse]:
    changes = [(res, [(c.name, c.config_operation, c.value) for c in res.configs]) for res in request.resources]
    results = _alter_results(ctx, changes, request.validate_only, False, _incremental_result)
    if isinstance(results, list):
        return IncrementalAlterConfigsResponse(throttle_time=0, responses=tuple(results))

    async def later(pending: Awaitable[list[incremental_views.AlterConfigsResourceResponse]],
                    ) -> IncrementalAlterConfigsResponse:
        return IncrementalAlterConfigsResponse(throttle_time=0, responses=tuple(await pending))
    return later(results)


def _refused_alter(res: AlterConfigsResource, code: ErrorCode) -> alter_views.AlterConfigsResourceResponse:
    return alter_views.AlterConfigsResourceResponse(error_code=code, error_message="Authorization failed.",
                                                    resource_type=res.resource_type, resource_name=res.resource_name)


def _refused_incremental(res: IncrementalAlterConfigsResource,
                         code: ErrorCode) -> incremental_views.AlterConfigsResourceResponse:
    return incremental_views.AlterConfigsResourceResponse(
        error_code=code, error_message="Authorization failed.", resource_type=res.resource_type,
        resource_name=res.resource_name)


@api(33, 0, 2)
def handle_alter_configs(ctx: RequestContext,
                         request: AlterConfigsRequest) -> AlterConfigsResponse | Awaitable[AlterConfigsResponse]:
    if ctx.broker.authorizer is None:
        return _alter_configs(ctx, request)
    answer: AlterConfigsResponse | Awaitable[AlterConfigsResponse] = per_entry(
        ctx, request, _alter_configs, "resources", "responses",
        _config_refusal(ctx, Operation.ALTER_CONFIGS, _refused_alter))
    return answer


@api(44, 0, 1)
def handle_incremental_alter_configs(
        ctx: RequestContext, request: IncrementalAlterConfigsRequest,
) -> IncrementalAlterConfigsResponse | Awaitable[IncrementalAlterConfigsResponse]:
    if ctx.broker.authorizer is None:
        return _incremental_alter_configs(ctx, request)
    answer: IncrementalAlterConfigsResponse | Awaitable[IncrementalAlterConfigsResponse] = per_entry(
        ctx, request, _incremental_alter_configs, "resources", "responses",
        _config_refusal(ctx, Operation.ALTER_CONFIGS, _refused_incremental))
    return answer
