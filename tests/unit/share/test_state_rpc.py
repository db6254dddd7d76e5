"""The network persister's pure decisions: retries, routing, batching, requests and answers."""

from __future__ import annotations

import io
import uuid

import pytest
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader, entity_writer

from shoal.share.coordinator import SharePartitionKey, ShareCoordinatorShard, StateBatch, partition_for
from shoal.share.state_rpc import (
    MAX_ATTEMPTS,
    REQUEST_BACKOFF_MAX_MS,
    REQUEST_BACKOFF_MS,
    Rpc,
    StateOp,
    answer_for,
    build_request,
    coordinator_of,
    outcomes_of,
    retry_delay_ms,
    take_batch,
)

T1, T2 = uuid.UUID(int=1), uuid.UUID(int=2)


def key(group: str, topic: uuid.UUID, p: int) -> SharePartitionKey:
    return SharePartitionKey.of(group, topic, p)


@pytest.mark.parametrize("code", [ErrorCode.not_coordinator, ErrorCode.coordinator_load_in_progress,
                                  ErrorCode.coordinator_not_available, ErrorCode.network_exception])
def test_retriable_errors_back_off_exponentially_with_jitter(code: ErrorCode) -> None:
    for attempt in range(MAX_ATTEMPTS - 1):
        exp = min(REQUEST_BACKOFF_MAX_MS, REQUEST_BACKOFF_MS * 2 ** attempt)
        assert retry_delay_ms(attempt, code, 0.0) == int(exp * 0.8)
        assert retry_delay_ms(attempt, code, 0.5) == exp
        assert retry_delay_ms(attempt, code, 0.999999) == int(exp * 1.2 - 0.001)
    assert retry_delay_ms(MAX_ATTEMPTS - 1, code, 0.5) is None  # attempts used up: the error is the answer


def test_backoff_is_capped() -> None:
    assert retry_delay_ms(10, ErrorCode.not_coordinator, 0.5, max_attempts=20) == REQUEST_BACKOFF_MAX_MS


@pytest.mark.parametrize("code", [ErrorCode.none, ErrorCode.fenced_leader_epoch, ErrorCode.fenced_state_epoch,
                                  ErrorCode.unknown_topic_or_partition, ErrorCode.invalid_request])
def test_other_answers_are_final(code: ErrorCode) -> None:
    assert retry_delay_ms(0, code, 0.5) is None


def test_coordinator_is_the_leader_of_the_keys_state_partition() -> None:
    k = key("g", T1, 0)
    n = 5
    leaders = {i: 10 + i for i in range(n)}
    assert coordinator_of(k, n, leaders) == 10 + partition_for(k, n)
    assert coordinator_of(k, n, {**leaders, partition_for(k, n): -1}) is None  # no leader yet
    assert coordinator_of(k, n, {}) is None
    assert coordinator_of(k, 0, leaders) is None


def test_a_batch_takes_every_queued_operation_of_the_oldest_rpc_and_group_once_per_key() -> None:
    queued = [
        StateOp(Rpc.WRITE, key("g", T1, 0)),
        StateOp(Rpc.READ, key("g", T1, 1)),
        StateOp(Rpc.WRITE, key("h", T1, 0)),  # another group: another request
        StateOp(Rpc.WRITE, key("g", T2, 3)),
        StateOp(Rpc.WRITE, key("g", T1, 0)),  # the same key again: the next request
        StateOp(Rpc.WRITE, key("g", T1, 2)),
    ]
    assert take_batch(queued) == (Rpc.WRITE, "g", [0, 3, 5])
    assert take_batch(queued[1:]) == (Rpc.READ, "g", [0])


def _wire_round_trip(request: object) -> object:
    """Encode and decode the request as the broker would read it."""
    buf = io.BytesIO()
    entity_writer(type(request))(buf, request)
    value, _ = entity_reader(type(request))(buf.getvalue(), 0)
    return value


def _apply(shard: ShareCoordinatorShard, result: object) -> object:
    for i, rec in enumerate(result.records):  # type: ignore[attr-defined]
        shard.replay(rec, i)
    return result.response  # type: ignore[attr-defined]


def test_requests_batch_many_share_partitions_and_answers_map_back_to_each() -> None:
    shard = ShareCoordinatorShard()
    keys = [key("g", T1, 0), key("g", T1, 1), key("g", T2, 0)]
    init = build_request(Rpc.INITIALIZE, "g", [StateOp(Rpc.INITIALIZE, k, state_epoch=0, start_offset=10 * i)
                                                for i, k in enumerate(keys)])
    assert [len(t.partitions) for t in init.topics] == [2, 1]  # grouped per topic
    out = outcomes_of(Rpc.INITIALIZE, "g", _apply(shard, shard.handle_initialize_share_group_state(
        _wire_round_trip(init))))
    assert {k: o.error_code for k, o in out.items()} == {k: ErrorCode.none for k in keys}

    write = build_request(Rpc.WRITE, "g", [
        StateOp(Rpc.WRITE, keys[0], state_epoch=0, leader_epoch=4, start_offset=2,
                batches=(StateBatch(2, 3, 0, 1), StateBatch(4, 4, 2, 1))),
        StateOp(Rpc.WRITE, keys[1], state_epoch=0, leader_epoch=4, start_offset=-1, batches=()),
    ])
    out = outcomes_of(Rpc.WRITE, "g", _apply(shard, shard.handle_write_share_group_state(_wire_round_trip(write))))
    assert all(o.ok for o in out.values()) and set(out) == set(keys[:2])

    read = build_request(Rpc.READ, "g", [StateOp(Rpc.READ, k, leader_epoch=4) for k in keys])
    out = outcomes_of(Rpc.READ, "g", _apply(shard, shard.handle_read_share_group_state(_wire_round_trip(read))))
    st = out[keys[0]].state
    assert st is not None and (st.start_offset, st.state_epoch) == (2, 0)
    assert st.state_batches == (StateBatch(2, 3, 0, 1), StateBatch(4, 4, 2, 1))
    assert out[keys[2]].state is not None and out[keys[2]].state.start_offset == 20

    summary = build_request(Rpc.SUMMARY, "g", [StateOp(Rpc.SUMMARY, keys[0])])
    out = outcomes_of(Rpc.SUMMARY, "g", _apply(shard, shard.handle_read_share_group_state_summary(
        _wire_round_trip(summary))))
    o = out[keys[0]]
    assert o.state is not None and (o.state.start_offset, o.state.leader_epoch) == (2, 4)
    assert o.delivery_complete_count == 1  # offset 4 acknowledged

    # A stale leader (epoch 3: the read recorded 4) is fenced; the answer says so for that
    # share-partition only.
    stale = build_request(Rpc.WRITE, "g", [StateOp(Rpc.WRITE, keys[0], state_epoch=0, leader_epoch=3),
                                           StateOp(Rpc.WRITE, keys[2], state_epoch=0, leader_epoch=5)])
    out = outcomes_of(Rpc.WRITE, "g", _apply(shard, shard.handle_write_share_group_state(_wire_round_trip(stale))))
    assert out[keys[0]].error_code == ErrorCode.fenced_leader_epoch
    assert out[keys[2]].ok

    delete = build_request(Rpc.DELETE, "g", [StateOp(Rpc.DELETE, keys[1])])
    out = outcomes_of(Rpc.DELETE, "g", _apply(shard, shard.handle_delete_share_group_state(_wire_round_trip(delete))))
    assert out[keys[1]].ok and shard.get(keys[1]) is None


def test_a_share_partition_missing_from_the_answer_is_an_error() -> None:
    o = answer_for(StateOp(Rpc.READ, key("g", T1, 9)), {})
    assert o.error_code == ErrorCode.unknown_server_error
