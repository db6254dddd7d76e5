"""AddPartitionsToTxn (24) v0-v5, AddOffsetsToTxn (25) v0-v4, EndTxn (26) v0-v5,
TxnOffsetCommit (28) v0-v5.

The transaction coordinator's APIs for a transactional producer, transaction versions 1
and 2 (KIP-890 part 2: EndTxn v5 bumps the epoch at every end; the producer's partitions
are added by their leaders, Produce v12, and its offsets partition by TxnOffsetCommit v5). AddPartitionsToTxn v4+ is the
brokers' form (KIP-890 part 1): a partition leader asks, with VerifyOnly, whether a
producer's transaction holds a partition before appending its first transactional batch
there (``txn_service.verify_in_transaction``); only brokers may send it (``security.access``). The work is
done by :mod:`shoal.server.txn_service`; InitProducerId is in ``producer_id.py``.
PRODUCER_FENCED is answered as INVALID_PRODUCER_EPOCH to versions older than 2, which
predate it (KIP-588), as Kafka does. In cluster mode AddPartitionsToTxn, AddOffsetsToTxn
and EndTxn go to the leader of the transactional id's ``__transaction_state`` partition
(NOT_COORDINATOR elsewhere), TxnOffsetCommit to the group's coordinator.

With an authorizer, as Kafka's broker checks them: each needs WRITE on the
TRANSACTIONAL_ID (else TRANSACTIONAL_ID_AUTHORIZATION_FAILED for the whole request);
AddPartitionsToTxn also WRITE on each topic (a topic refused, or internal, answers
TOPIC_AUTHORIZATION_FAILED and the other partitions OPERATION_NOT_ATTEMPTED: nothing is
added); AddOffsetsToTxn and TxnOffsetCommit READ on the group (GROUP_AUTHORIZATION_FAILED),
TxnOffsetCommit READ on each topic (its partitions TOPIC_AUTHORIZATION_FAILED, the others
are committed).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from ...errors import ApiError, ErrorCode
from ...protocol.messages.add_offsets_to_txn_request import AddOffsetsToTxnRequest
from ...protocol.messages.add_offsets_to_txn_response import AddOffsetsToTxnResponse
from ...protocol.messages.add_partitions_to_txn_request import AddPartitionsToTxnRequest
from ...protocol.messages.add_partitions_to_txn_response import (
    AddPartitionsToTxnPartitionResult,
    AddPartitionsToTxnResponse,
    AddPartitionsToTxnResult,
    AddPartitionsToTxnTopicResult,
)
from ...protocol.messages.end_txn_request import EndTxnRequest
from ...protocol.messages.end_txn_response import EndTxnResponse
from ...protocol.messages.txn_offset_commit_request import TxnOffsetCommitRequest
from ...protocol.messages.txn_offset_commit_response import (
    TxnOffsetCommitResponse,
    TxnOffsetCommitResponsePartition,
    TxnOffsetCommitResponseTopic,
)
from ...security.authz import GROUP, READ, TRANSACTIONAL_ID, WRITE, allowed, topic_allowed
from ..context import RequestContext
from ..dispatch import api
from ..group_service import group_service
from ..internal_topics import OFFSETS_TOPIC
from ..txn_service import transaction_service
from .metadata import INTERNAL_TOPICS

if TYPE_CHECKING:
    from ...log.store import LogStore

NOT_SERVED = ErrorCode.transactional_id_authorization_failed
_OFFSET_VERIFICATION_ERRORS = {
    # TxnOffsetCommit v0-3 predates TRANSACTION_ABORTABLE; a coordinator that does not
    # answer is retried as a loading group coordinator (Kafka's maybeConvertOffsetCommitError)
    ErrorCode.transaction_abortable: ErrorCode.invalid_txn_state,
    ErrorCode.network_exception: ErrorCode.coordinator_load_in_progress,
}
TXN_ID_DENIED = ErrorCode.transactional_id_authorization_failed
Key = tuple[str, int]


def txn_id_allowed(ctx: RequestContext, transactional_id: str) -> bool:
    """WRITE on the TRANSACTIONAL_ID (True without an authorizer)."""
    return ctx.broker.authorizer is None or allowed(ctx, WRITE, TRANSACTIONAL_ID, transactional_id)


def fenced_code(code: ErrorCode, version: int, first: int = 2) -> ErrorCode:
    """PRODUCER_FENCED for clients that know it (from ``first``), else INVALID_PRODUCER_EPOCH."""
    if code == ErrorCode.producer_fenced and version < first:
        return ErrorCode.invalid_producer_epoch
    return code


def _topic_results(by_topic: Iterable[tuple[str, Iterable[int]]],
                   code_of: dict[Key, ErrorCode]) -> tuple[AddPartitionsToTxnTopicResult, ...]:
    return tuple(AddPartitionsToTxnTopicResult(name=name, results_by_partition=tuple(
        AddPartitionsToTxnPartitionResult(partition_index=p, partition_error_code=code_of[(name, p)])
        for p in partitions)) for name, partitions in by_topic)


@api(24, 0, 5)
async def handle_add_partitions_to_txn(ctx: RequestContext,
                                       request: AddPartitionsToTxnRequest) -> AddPartitionsToTxnResponse:
    if ctx.api_version >= 4:
        return await _add_partitions_for_brokers(ctx, request)
    svc = transaction_service(ctx.broker)
    store = _store(ctx)
    topics = request.v3_and_below_topics
    wanted = [(t.name, int(p)) for t in topics for p in t.partitions]
    id_allowed = txn_id_allowed(ctx, request.v3_and_below_transactional_id)
    refused = {name for name in {k[0] for k in wanted}
               if name in INTERNAL_TOPICS or not topic_allowed(ctx, WRITE, name)} if id_allowed else set()
    unknown = _unknown_partitions(store, wanted)
    if not id_allowed:
        code_of = {k: TXN_ID_DENIED for k in wanted}
    elif refused or unknown:
        code_of = {k: ErrorCode.topic_authorization_failed if k[0] in refused else
                   ErrorCode.unknown_topic_or_partition if k in unknown else ErrorCode.operation_not_attempted
                   for k in wanted}
    elif svc is None:
        code_of = {k: NOT_SERVED for k in wanted}
    else:
        code = await svc.add_partitions(request.v3_and_below_transactional_id, request.v3_and_below_producer_id,
                                        request.v3_and_below_producer_epoch, wanted)
        code = fenced_code(code, ctx.api_version)
        code_of = {k: code for k in wanted}
    return AddPartitionsToTxnResponse(results_by_topic_v3_and_below=_topic_results(
        ((t.name, (int(p) for p in t.partitions)) for t in topics), code_of))


def _store(ctx: RequestContext) -> LogStore:
    store = ctx.broker.store
    assert store is not None  # set at start, before any request
    return store


def _unknown_partitions(store: LogStore, wanted: list[Key]) -> set[Key]:
    unknown = set()
    for name, p in wanted:
        meta = store.get_topic(name)
        if meta is None or not 0 <= p < meta.num_partitions:
            unknown.add((name, p))
    return unknown


async def _add_partitions_for_brokers(ctx: RequestContext,
                                      request: AddPartitionsToTxnRequest) -> AddPartitionsToTxnResponse:
    """v4+, a partition leader's batch form (KIP-890; refused to clients by
    ``security.access``, Kafka's CLUSTER_ACTION): per transaction either add the
    partitions or, with VerifyOnly, only say whether each is in the transaction. As
    Kafka: no topic authorization, a partition that does not exist fails the whole
    transaction (UNKNOWN_TOPIC_OR_PARTITION, the others OPERATION_NOT_ATTEMPTED), and
    TRANSACTION_ABORTABLE is answered from v5 (INVALID_TXN_STATE before)."""
    svc = transaction_service(ctx.broker)
    results = []
    for txn in request.transactions:
        wanted = list(dict.fromkeys((t.name, int(p)) for t in txn.topics for p in t.partitions))
        unknown = _unknown_partitions(_store(ctx), wanted)
        code_of: dict[Key, ErrorCode]
        if unknown:
            code_of = {k: ErrorCode.unknown_topic_or_partition if k in unknown else ErrorCode.operation_not_attempted
                       for k in wanted}
        elif svc is None:
            code_of = dict.fromkeys(wanted, ErrorCode.coordinator_not_available)
        elif txn.verify_only:
            code_of = svc.verify_partitions(txn.transactional_id, txn.producer_id, txn.producer_epoch, wanted)
        else:
            # v4+ comes from a broker for a producer of transaction version 2 (as Kafka infers)
            code = await svc.add_partitions(txn.transactional_id, txn.producer_id, txn.producer_epoch, wanted,
                                            tv2=True)
            code_of = dict.fromkeys(wanted, code)
        if ctx.api_version < 5:
            code_of = {k: ErrorCode.invalid_txn_state if c == ErrorCode.transaction_abortable else c
                       for k, c in code_of.items()}
        by_topic: dict[str, list[int]] = {}
        for name, p in wanted:
            by_topic.setdefault(name, []).append(p)
        results.append(AddPartitionsToTxnResult(transactional_id=txn.transactional_id,
                                                topic_results=_topic_results(by_topic.items(), code_of)))
    return AddPartitionsToTxnResponse(error_code=ErrorCode.none, results_by_transaction=tuple(results))


@api(25, 0, 4)
async def handle_add_offsets_to_txn(ctx: RequestContext, request: AddOffsetsToTxnRequest) -> AddOffsetsToTxnResponse:
    if not txn_id_allowed(ctx, request.transactional_id):
        return AddOffsetsToTxnResponse(error_code=TXN_ID_DENIED)
    if ctx.broker.authorizer is not None and not allowed(ctx, READ, GROUP, request.group_id):
        return AddOffsetsToTxnResponse(error_code=ErrorCode.group_authorization_failed)
    svc = transaction_service(ctx.broker)
    if svc is None:
        return AddOffsetsToTxnResponse(error_code=NOT_SERVED)
    if not request.group_id:
        return AddOffsetsToTxnResponse(error_code=ErrorCode.invalid_group_id)
    groups = ctx.broker.extensions.get("groups")
    if groups is None:
        return AddOffsetsToTxnResponse(error_code=ErrorCode.coordinator_not_available)
    partition: int = groups.runtime.partition_for_group(request.group_id)
    code = await svc.add_partitions(request.transactional_id, request.producer_id, request.producer_epoch,
                                    [(OFFSETS_TOPIC, partition)])
    return AddOffsetsToTxnResponse(error_code=fenced_code(code, ctx.api_version))


@api(26, 0, 5)
async def handle_end_txn(ctx: RequestContext, request: EndTxnRequest) -> EndTxnResponse:
    """v5 is transaction version 2's (KIP-890 part 2): the epoch is bumped at every end and
    the answer carries the producer id and epoch to go on with (-1 on an error)."""
    if not txn_id_allowed(ctx, request.transactional_id):
        return EndTxnResponse(error_code=TXN_ID_DENIED, producer_id=-1, producer_epoch=-1)
    svc = transaction_service(ctx.broker)
    if svc is None:
        return EndTxnResponse(error_code=NOT_SERVED, producer_id=-1, producer_epoch=-1)
    tv2 = ctx.api_version >= 5
    code = await svc.end_txn(request.transactional_id, request.producer_id, request.producer_epoch,
                             bool(request.committed), tv2)
    if tv2 and code == ErrorCode.none:
        pid, epoch = svc.producer_after_end(request.transactional_id)
        return EndTxnResponse(error_code=code, producer_id=pid, producer_epoch=epoch)
    return EndTxnResponse(error_code=fenced_code(code, ctx.api_version), producer_id=-1, producer_epoch=-1)


@api(28, 0, 5)
async def handle_txn_offset_commit(ctx: RequestContext, request: TxnOffsetCommitRequest) -> TxnOffsetCommitResponse:
    """Offsets committed in a transaction: pending in the group coordinator until the
    transaction's marker reaches the group's ``__consumer_offsets`` partition. The
    producer's transaction must be open and hold that partition (AddOffsetsToTxn); v5
    (transaction version 2) adds it to the transaction here instead. TRANSACTION_ABORTABLE
    is answered from v4 (INVALID_TXN_STATE before)."""
    store = _store(ctx)

    def answer(code_of: Callable[[str, int], ErrorCode]) -> TxnOffsetCommitResponse:
        return TxnOffsetCommitResponse(topics=tuple(
            TxnOffsetCommitResponseTopic(name=t.name, partitions=tuple(
                TxnOffsetCommitResponsePartition(partition_index=x.partition_index,
                                                 error_code=code_of(t.name, x.partition_index))
                for x in t.partitions)) for t in request.topics))

    if not txn_id_allowed(ctx, request.transactional_id):
        return answer(lambda t, p: TXN_ID_DENIED)
    if ctx.broker.authorizer is not None and not allowed(ctx, READ, GROUP, request.group_id):
        return answer(lambda t, p: ErrorCode.group_authorization_failed)
    svc = transaction_service(ctx.broker)
    if svc is None:
        return answer(lambda t, p: NOT_SERVED)
    if not request.group_id:
        return answer(lambda t, p: ErrorCode.invalid_group_id)
    groups = group_service(ctx.broker)
    partition = groups.runtime.partition_for_group(request.group_id)
    # KIP-890: ask the transactional id's coordinator (in a cluster often another broker)
    # whether the transaction holds the group's offsets partition; v5: add it
    key = (OFFSETS_TOPIC, partition)
    code = (await svc.verify_in_transaction(request.transactional_id, request.producer_id,
                                            request.producer_epoch, [key], add=ctx.api_version >= 5))[key]
    if code != ErrorCode.transaction_abortable or ctx.api_version < 4:
        code = _OFFSET_VERIFICATION_ERRORS.get(code, code)
    if code in (ErrorCode.invalid_producer_epoch, ErrorCode.producer_fenced):
        code = fenced_code(ErrorCode.producer_fenced, ctx.api_version, first=3)
    if code != ErrorCode.none:
        return answer(lambda t, p: code)
    refused = {t.name for t in request.topics if not topic_allowed(ctx, READ, t.name)}
    unknown = set()
    for t in request.topics:
        meta = store.get_topic(t.name)
        for x in t.partitions:
            if meta is None or not 0 <= x.partition_index < meta.num_partitions:
                unknown.add((t.name, x.partition_index))

    def left_out(t: str, p: int) -> ErrorCode | None:
        if t in refused:
            return ErrorCode.topic_authorization_failed
        return ErrorCode.unknown_topic_or_partition if (t, p) in unknown else None

    # the group coordinator takes the request's own entity (the kio class of its version; the
    # view Protocol does not say it is a dataclass), without the left-out partitions
    known = dataclasses.replace(request, topics=tuple(  # type: ignore[type-var]
        dataclasses.replace(t, partitions=kept) for t in request.topics  # type: ignore[type-var]
        if (kept := tuple(x for x in t.partitions if left_out(t.name, x.partition_index) is None))))
    if not known.topics:
        return answer(lambda t, p: left_out(t, p) or ErrorCode.none)  # each partition is left out
    try:
        result = await groups.apply_durable(partition, groups.shard(partition).handle_txn_offset_commit(
            known, ctx.now_ms()))
    except ApiError as e:
        failed = e.error_code
        return answer(lambda t, p: failed)
    codes: dict[Key, ErrorCode] = {(t.name, x.partition_index): x.error_code
                                   for t in result.answer().topics for x in t.partitions}
    return answer(lambda t, p: left_out(t, p) or codes[(t, p)])
