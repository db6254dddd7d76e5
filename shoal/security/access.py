"""The brokers' own APIs are for brokers: who may send them on a secured broker.

On a broker with a secured listener (SSL, SASL_PLAINTEXT or SASL_SSL), these requests
need the rights Kafka asks for on the CLUSTER resource, and there is no authorizer yet,
so they are allowed only to the brokers themselves and to ``super.users``:

* the share-state RPCs, InitializeShareGroupState, ReadShareGroupState,
  WriteShareGroupState, DeleteShareGroupState and ReadShareGroupStateSummary (83-87):
  CLUSTER_ACTION, answered CLUSTER_AUTHORIZATION_FAILED per partition;
* a Fetch with a replica id (a follower's): CLUSTER_ACTION, answered with a top-level
  CLUSTER_AUTHORIZATION_FAILED (Fetch v7+; an older version closes the connection);
* AlterPartitionReassignments (45): ALTER; AlterUserScramCredentials (51): ALTER;
  DescribeUserScramCredentials (50): DESCRIBE; answered CLUSTER_AUTHORIZATION_FAILED;
* AddPartitionsToTxn v4+ (24), a partition leader's question to a transaction
  coordinator (KIP-890): CLUSTER_ACTION, answered with a top-level
  CLUSTER_AUTHORIZATION_FAILED (v0-v3, the producers' versions, are not guarded here).

"The brokers" are the connections on the inter-broker listener when it is PLAINTEXT
(whoever can reach it is trusted: keep it on a private network), and otherwise the
principal the brokers log in as on it (the JAAS ``username`` for SASL; for SSL, name the
brokers' certificate subjects in ``super.users``). A broker without any secured listener
checks nothing, as before.

With an authorizer (``authorizer.class.name``), the ACLs decide instead: CLUSTER_ACTION,
ALTER or DESCRIBE on the CLUSTER, as above; the brokers are always allowed.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any

from ..errors import ErrorCode, ProtocolViolation
from ..protocol.entities import has_field, make, sub
from ..protocol.messages.fetch_request import FetchRequest
from .acls import CLUSTER_NAME, Operation, ResourceType
from .authz import allowed, trusted_broker

log = logging.getLogger("shoal.security")

__all__ = ["GUARDED_APIS", "guarded_handler"]

FETCH = 1
ADD_PARTITIONS_TO_TXN = 24
ALTER_USER_SCRAM_CREDENTIALS = 51
SHARE_STATE_APIS = frozenset({83, 84, 85, 86, 87})
GUARDED_APIS = frozenset({FETCH, ADD_PARTITIONS_TO_TXN, 45, 50, 51} | SHARE_STATE_APIS)


def replica_id(request: FetchRequest) -> int:
    """A Fetch's replica id: ReplicaId before v15, ReplicaState's from v15 (every version
    reads both, the one it lacks as its default, -1)."""
    rid = request.replica_id
    return int(rid if rid >= 0 else request.replica_state.replica_id)


def is_broker(sec: Any) -> bool:
    """Whether the connection of ``sec`` (a ConnectionSecurity) speaks for a broker or a super user."""
    return not sec.broker_security.secured or trusted_broker(sec)


def _denied(ctx: Any, request: Any) -> Any:
    cls = ctx.response_type
    code = ErrorCode.cluster_authorization_failed
    if ctx.api_key in SHARE_STATE_APIS:
        module = sys.modules[cls.__module__]
        rcls = next(getattr(module, n) for n in dir(module)
                    if n.endswith("Result") and n != "PartitionResult" and isinstance(getattr(module, n), type))
        pcls = sub(cls, "PartitionResult")
        return make(cls, results=tuple(
            make(rcls, topic_id=t.topic_id, partitions=tuple(
                make(pcls, partition=p.partition, error_code=code, error_message="only brokers may send this")
                for p in t.partitions))
            for t in request.topics))
    if ctx.api_key == ALTER_USER_SCRAM_CREDENTIALS:
        names = dict.fromkeys(x.name for x in (*request.deletions, *request.upsertions))
        rcls = sub(cls, "AlterUserScramCredentialsResult")
        return make(cls, throttle_time=0, results=tuple(
            make(rcls, user=n, error_code=code, error_message="only brokers and super.users may alter credentials")
            for n in names))
    if not has_field(cls, "error_code"):
        raise ProtocolViolation(f"{cls.__name__} from a principal that is not a broker")
    fields: dict[str, Any] = {"error_code": code}
    if has_field(cls, "error_message"):
        fields["error_message"] = "only brokers and super.users may send this request"
    return make(cls, **fields)


_CLUSTER_OPERATION = {45: Operation.ALTER, 50: Operation.DESCRIBE, 51: Operation.ALTER}


def guarded_handler(sec: Any, route: Any) -> Callable[[Any, Any], Any]:
    """``route.handler``, or for a guarded API one that refuses a principal that is not a broker
    (with an authorizer: one without its operation on the CLUSTER). ``sec`` is None on the
    single PLAINTEXT listener of a broker without security settings."""
    if route.api_key not in GUARDED_APIS:
        return route.handler  # type: ignore[no-any-return]

    def handler(ctx: Any, request: Any) -> Any:
        if route.api_key == FETCH and replica_id(request) < 0:
            return route.handler(ctx, request)
        if route.api_key == ADD_PARTITIONS_TO_TXN and ctx.api_version < 4:
            return route.handler(ctx, request)  # a producer's request, checked by the handler
        if ctx.broker.authorizer is not None:
            if allowed(ctx, _CLUSTER_OPERATION.get(route.api_key, Operation.CLUSTER_ACTION), ResourceType.CLUSTER,
                       CLUSTER_NAME):
                return route.handler(ctx, request)
            return _denied(ctx, request)
        if sec is None or is_broker(sec):
            return route.handler(ctx, request)
        log.info("connection %s from %s: %s (API %d) refused: %s is not a broker or super user",
                 ctx.connection.connection_id, ctx.connection.peer, type(request).__name__, route.api_key,
                 sec.principal)
        return _denied(ctx, request)

    return handler
