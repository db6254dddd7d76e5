"""The broker's authorizer: where its ACLs live, and the one check the handlers call.

With ``authorizer.class.name`` set (Kafka's
``org.apache.kafka.metadata.authorizer.StandardAuthorizer``, or ``shoal.acl``), the
broker holds an :class:`AclAuthority` in ``broker.authorizer``; without it that is None
and every check allows (a broker without an authorizer serves everyone, as before).

ACLs are kept where SCRAM credentials are:

* one broker: ``<data dir>/acls.json``, rewritten whole and atomically on each change;
* a cluster (``metadata.store=etcd://``): one etcd key per binding,
  ``/shoal/acls/<hash of the binding>``, read by every broker with the rest of the
  cluster metadata (its watch), so a change made on one broker holds on all of them.
  CreateAcls and DeleteAcls answer once this broker's copy shows the change.

:func:`allowed` is the check: the principal of the request's connection (``User:ANONYMOUS``
on a connection without authentication), its IP address, an operation and a resource.
The brokers themselves (see ``access.is_broker``: the inter-broker PLAINTEXT listener of a
secured broker, the inter-broker login and ``super.users``) are always allowed. The
decision is the pure :class:`~shoal.security.acls.Authorizer`'s, cached until the ACLs
change. Each decision is logged on the ``shoal.authorizer`` logger: denials at INFO,
allows at DEBUG (Kafka's ``kafka.authorizer.logger``).
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import logging
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..errors import ErrorCode
from ..log.partition_log import atomic_write
from ..protocol.entities import make, sub
from .acls import AclBinding, Authorizer, Operation, ResourceType

log = logging.getLogger("shoal.security")
audit = logging.getLogger("shoal.authorizer")

__all__ = ["AUTHORIZER_NAMES", "AclAuthority", "allowed", "install", "principal_of"]

AUTHORIZER_NAMES = frozenset({"org.apache.kafka.metadata.authorizer.StandardAuthorizer",
                              "kafka.security.authorizer.AclAuthorizer", "shoal.acl"})
ANONYMOUS = "User:ANONYMOUS"
_RESOURCE_NAMES = {ResourceType.TOPIC: "Topic", ResourceType.GROUP: "Group", ResourceType.CLUSTER: "Cluster",
                   ResourceType.TRANSACTIONAL_ID: "TransactionalId"}


class AclAuthority:
    """The ACLs of this broker (or cluster) and the current Authorizer made of them."""

    def __init__(self, broker: Any) -> None:
        config = broker.config
        self._broker = broker
        self.super_users = frozenset(p.strip() for p in str(config["super.users"]).split(";") if p.strip())
        self.allow_if_no_acl = bool(config["allow.everyone.if.no.acl.found"])
        self.clustered = config["metadata.store"] != "local"
        self._path = Path(broker.data_dir) / "acls.json"
        self._raw: Any = None
        bindings: frozenset[AclBinding] = frozenset()
        if not self.clustered and self._path.exists():
            try:
                raw = json.loads(self._path.read_text())
                bindings = frozenset(AclBinding.from_json(x) for x in raw.get("acls", []))
            except (OSError, ValueError, TypeError, AttributeError) as e:
                raise OSError(f"{self._path} is unreadable ({e}); the ACLs cannot be enforced") from None
        self._authorizer = Authorizer(bindings, self.super_users, self.allow_if_no_acl)

    # -- the current ACLs -------------------------------------------------------------------
    def current(self) -> Authorizer:
        if self.clustered:
            raw = self._broker.cluster.store.snapshot.acls
            if raw is not self._raw:
                bindings = _parse(raw)
                if bindings != self._authorizer.bindings:
                    self._authorizer = Authorizer(bindings, self.super_users, self.allow_if_no_acl)
                self._raw = raw
        return self._authorizer

    @property
    def bindings(self) -> frozenset[AclBinding]:
        return self.current().bindings

    async def change(self, add: Iterable[AclBinding], remove: Iterable[AclBinding]) -> None:
        """Add and remove bindings together. Raises OSError when they cannot be stored."""
        add, remove = set(add), set(remove)
        if not add and not remove:
            return
        if not self.clustered:
            new = (self._authorizer.bindings - remove) | add
            data = {"version": 1, "acls": sorted(list(b) for b in new)}
            atomic_write(self._path, json.dumps(data, indent=1).encode())
            self._authorizer = Authorizer(new, self.super_users, self.allow_if_no_acl)
            return
        store = self._broker.cluster.store
        c = store.client
        ops = [c.transactions.put(_KEY + b.key().encode(), b.to_json()) for b in add]
        ops += [c.transactions.delete(_KEY + b.key().encode()) for b in remove if b not in add]
        try:
            await c.transaction(compare=[], success=ops, failure=[])
        except Exception as e:
            raise OSError(f"writing ACLs to etcd failed: {e}") from e
        want_in = {b.key() for b in add}
        want_out = {b.key() for b in remove} - want_in
        store.mark_stale()
        if not await store.wait_for(lambda s: want_in <= s.acls.keys() and not want_out & s.acls.keys(), 10.0):
            raise OSError("the ACLs were written to etcd but this broker has not seen them within 10 s")

    # -- decisions --------------------------------------------------------------------------
    def check(self, ctx: Any, operation: int, resource_type: int, name: str, log_denied: bool) -> bool:
        conn = ctx.connection
        sec = getattr(conn, "security", None)
        if sec is not None and trusted_broker(sec):
            return True
        principal = sec.principal if sec is not None else ANONYMOUS
        host = _host(conn)
        ok = self.current().authorize(principal, host, operation, resource_type, name)
        if ok:
            if audit.isEnabledFor(logging.DEBUG):
                audit.debug(_line(ctx, principal, host, ok, operation, resource_type, name))
        elif log_denied and audit.isEnabledFor(logging.INFO):
            audit.info(_line(ctx, principal, host, ok, operation, resource_type, name))
        return ok


_KEY = b"/shoal/acls/"


def _parse(raw: dict[str, bytes]) -> frozenset[AclBinding]:
    out = set()
    for key, value in raw.items():
        try:
            out.add(AclBinding.from_json(value))
        except (ValueError, TypeError):
            log.error("ignoring a malformed ACL in etcd (key %s)", key)
    return frozenset(out)


def trusted_broker(sec: Any) -> bool:
    """Whether the connection of ``sec`` (a ConnectionSecurity) on a secured broker speaks
    for a broker (the inter-broker listener unsecured, or a broker principal) or a super user."""
    bsec = sec.broker_security
    if not bsec.secured:
        return False
    if sec.listener.name == bsec.inter_broker.name and not sec.listener.secured:
        return True
    return sec.principal in bsec.broker_principals


def _host(conn: Any) -> str:
    peer = getattr(conn, "peer", "") or ""
    return peer.rpartition(":")[0] or peer


def _line(ctx: Any, principal: str, host: str, ok: bool, operation: int, resource_type: int, name: str) -> str:
    from kio.schema.index import api_key_map

    api = "".join(p.capitalize() for p in api_key_map.get(ctx.api_key, str(ctx.api_key)).split("_"))
    kind = _RESOURCE_NAMES.get(ResourceType(resource_type), str(resource_type))
    return (f"Principal = {principal} is {'Allowed' if ok else 'Denied'} operation = {Operation(operation).name} "
            f"from host = {host} on resource = {kind}:LITERAL:{name} for request = {api}")


def principal_of(ctx: Any) -> str:
    sec = getattr(ctx.connection, "security", None)
    return sec.principal if sec is not None else ANONYMOUS


def allowed(ctx: Any, operation: int, resource_type: int, name: str, *, log_denied: bool = True) -> bool:
    """Whether the request of ``ctx`` may do ``operation`` on the resource (True without an authorizer)."""
    authority = ctx.broker.authorizer
    if authority is None:
        return True
    return authority.check(ctx, operation, resource_type, name, log_denied)  # type: ignore[no-any-return]


def install(broker: Any) -> None:
    """Set ``broker.authorizer`` from ``authorizer.class.name``. Raises OSError for a name not known."""
    name = str(broker.config["authorizer.class.name"]).strip()
    if not name:
        broker.authorizer = None
        return
    if name not in AUTHORIZER_NAMES:
        raise OSError(f"authorizer.class.name={name} is not supported: use "
                      "org.apache.kafka.metadata.authorizer.StandardAuthorizer (or shoal.acl)")
    authority = AclAuthority(broker)
    broker.authorizer = authority
    log.info("authorizer on (%s): super.users %s, allow.everyone.if.no.acl.found=%s",
             "ACLs in etcd" if authority.clustered else f"{len(authority.bindings)} ACLs in {authority._path.name}",
             ";".join(sorted(authority.super_users)) or "(none)", str(authority.allow_if_no_acl).lower())


# -- what the handlers call --------------------------------------------------------------------
READ, WRITE, CREATE, DELETE, ALTER, DESCRIBE = (Operation.READ, Operation.WRITE, Operation.CREATE, Operation.DELETE,
                                                Operation.ALTER, Operation.DESCRIBE)
TOPIC, GROUP, CLUSTER, TRANSACTIONAL_ID = (ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER,
                                           ResourceType.TRANSACTIONAL_ID)
CLUSTER_RESOURCE = "kafka-cluster"


def refusal(ctx: Any, code: Any, message: str, **fields: Any) -> Any:
    """The request's response carrying ``code`` at the top (its other fields empty)."""
    return make(ctx.response_type, throttle_time=0, error_code=code, error_message=message, **fields)


def group_refusal(ctx: Any, operation: int, group_id: str, **fields: Any) -> Any:
    """None when the request may do ``operation`` on the group, else its response with
    GROUP_AUTHORIZATION_FAILED."""
    if ctx.broker.authorizer is None or allowed(ctx, operation, GROUP, group_id):
        return None
    return refusal(ctx, ErrorCode.group_authorization_failed, "Group authorization failed.", **fields)


def cluster_refusal(ctx: Any, operation: int, **fields: Any) -> Any:
    """None when the request may do ``operation`` on the CLUSTER, else its response with
    CLUSTER_AUTHORIZATION_FAILED."""
    if ctx.broker.authorizer is None or allowed(ctx, operation, CLUSTER, CLUSTER_RESOURCE):
        return None
    return refusal(ctx, ErrorCode.cluster_authorization_failed, "Cluster authorization failed.", **fields)


def topic_allowed(ctx: Any, operation: int, topic: str, *, log_denied: bool = True) -> bool:
    return ctx.broker.authorizer is None or allowed(ctx, operation, TOPIC, topic, log_denied=log_denied)


def hide_undescribable(ctx: Any, entries: Any) -> tuple[Any, ...]:
    """Describe entries (each with ``group_id``) with those of groups the request may not
    DESCRIBE replaced by an empty entry with GROUP_AUTHORIZATION_FAILED."""
    if ctx.broker.authorizer is None:
        return tuple(entries)
    return tuple(e if allowed(ctx, DESCRIBE, GROUP, e.group_id) else
                 make(type(e), group_id=e.group_id, error_code=ErrorCode.group_authorization_failed,
                      error_message="Group authorization failed.", authorized_operations=-2**31)
                 for e in entries)


async def authorized_share_request(ctx: Any, request: Any, serve: Any) -> Any:
    """ShareFetch (78) and ShareAcknowledge (79) as Kafka authorizes them: READ on the group
    (else GROUP_AUTHORIZATION_FAILED for the whole request), then READ on each topic: the
    partitions of a topic the request may not READ are left out of what ``serve`` sees
    (so they never join the share session) and answered TOPIC_AUTHORIZATION_FAILED."""
    if (denied := group_refusal(ctx, READ, request.group_id or "", responses=(), node_endpoints=())) is not None:
        return denied
    store = ctx.broker.store
    kept, refused = [], []
    for t in request.topics:
        meta = store.topic_by_id(t.topic_id) if t.topic_id is not None else None
        (refused if meta is not None and not allowed(ctx, READ, TOPIC, meta.name) else kept).append(t)
    if not refused:
        return await serve(ctx, request)
    response = await serve(ctx, dataclasses.replace(request, topics=tuple(kept)))
    if response.error_code != ErrorCode.none:
        return response
    cls = ctx.response_type
    fetch = ctx.api_key == 78
    tcls = sub(cls, "ShareFetchableTopicResponse" if fetch else "ShareAcknowledgeTopicResponse")
    pcls, lcls = sub(cls, "PartitionData"), sub(cls, "LeaderIdAndEpoch")
    code = ErrorCode.topic_authorization_failed
    extra = tuple(make(tcls, topic_id=t.topic_id or uuid.UUID(int=0), partitions=tuple(
        make(pcls, partition_index=p.partition_index, error_code=code, error_message="Topic authorization failed.",
             acknowledge_error_code=code if getattr(p, "acknowledgement_batches", None) else ErrorCode.none,
             current_leader=make(lcls, leader_id=-1, leader_epoch=-1))
        for p in t.partitions)) for t in refused)
    return dataclasses.replace(response, responses=(*response.responses, *extra))


def per_topic(ctx: Any, request: Any, serve: Any, operation: int, topics_field: str, results_field: str,
              refused_result: Any, name_of: Any = lambda t: t.name) -> Any:
    """``serve(ctx, request)`` for the topics of ``request.<topics_field>`` the request may do
    ``operation`` on, with ``refused_result(topic entry)`` (TOPIC_AUTHORIZATION_FAILED) added
    to ``response.<results_field>`` for the others. ``serve`` may return a coroutine."""
    if ctx.broker.authorizer is None:
        return serve(ctx, request)

    def refusal(t: Any) -> Any:
        name = name_of(t)
        return None if name is None or topic_allowed(ctx, operation, name) else refused_result(t)

    return per_entry(ctx, request, serve, topics_field, results_field, refusal)


def per_entry(ctx: Any, request: Any, serve: Any, entries_field: str, results_field: str, refusal: Any) -> Any:
    """``serve(ctx, request)`` for the entries of ``request.<entries_field>`` whose
    ``refusal(entry)`` is None, with the refusals added to ``response.<results_field>``."""
    kept, extra = [], []
    for t in getattr(request, entries_field):
        r = refusal(t)
        (kept if r is None else extra).append(t if r is None else r)
    if not extra:
        return serve(ctx, request)

    def merged(response: Any) -> Any:
        return dataclasses.replace(response, **{results_field: (*getattr(response, results_field), *extra)})

    response = serve(ctx, dataclasses.replace(request, **{entries_field: tuple(kept)}))
    if inspect.isawaitable(response):
        async def later() -> Any:
            return merged(await response)
        return later()
    return merged(response)


def allowed_on_any(ctx: Any, operation: int, resource_type: int) -> bool:
    """Whether the request may do ``operation`` on some resource of the type (True without an authorizer)."""
    authority = ctx.broker.authorizer
    if authority is None:
        return True
    sec = getattr(ctx.connection, "security", None)
    if sec is not None and trusted_broker(sec):
        return True
    return authority.current().authorize_any(principal_of(ctx), _host(ctx.connection), operation, resource_type)


def authorized_operations(ctx: Any, resource_type: int, name: str, operations: Any) -> int:
    """Kafka's authorized-operations bit field: the ``operations`` (AclOperation ids) the
    request may do on the resource (every one of them without an authorizer)."""
    return sum(1 << op for op in operations
               if ctx.broker.authorizer is None or allowed(ctx, op, resource_type, name, log_denied=False))


def subscription_refusal(ctx: Any, topics: Any, **fields: Any) -> Any:
    """ConsumerGroupHeartbeat and ShareGroupHeartbeat, as Kafka 4 checks them: None when the
    request may DESCRIBE every subscribed topic, else its response with TOPIC_AUTHORIZATION_FAILED."""
    if ctx.broker.authorizer is None or not topics:
        return None
    refused = sorted(t for t in set(topics) if not allowed(ctx, DESCRIBE, TOPIC, t))
    if not refused:
        return None
    return refusal(ctx, ErrorCode.topic_authorization_failed,
                   f"The member is not authorized to describe the subscribed topics {', '.join(refused)}.", **fields)
