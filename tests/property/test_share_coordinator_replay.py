"""Replaying a pruned ``__share_group_state`` log rebuilds the state a simple model predicts.

Random sequences of initialize/write/read/delete run against a ShareCoordinatorShard
(each accepted Result is appended to a log and replayed, as the shell does) and against
a reference model that keeps one (state, delivery count) per offset. Then the log is
compacted the way share-state pruning allows (per key: only its last snapshot and the
updates after it; nothing for a deleted key), replayed into a fresh shard, and both
shards must agree with the model.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from shoal.coordinator.records import CoordinatorRecord, ShareStateRecordType
from shoal.share.coordinator import ShareCoordinatorShard, SharePartitionKey, ShareState, StateBatch

KEYS = [SharePartitionKey("g", "00000000-0000-0000-0000-000000000001", p) for p in range(2)]
STATES = [0, 2, 4]


@dataclass
class ModelState:
    state_epoch: int
    leader_epoch: int
    start_offset: int
    offsets: dict[int, tuple[int, int]] = field(default_factory=dict)
    updates: int = 0
    """ShareUpdate records since the last ShareSnapshot."""

    def prune(self) -> None:
        if self.start_offset != -1:
            self.offsets = {o: v for o, v in self.offsets.items() if o >= self.start_offset}


class Model:
    """Per-offset reference: a later batch simply overwrites the offsets it covers."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.states: dict[SharePartitionKey, ModelState] = {}
        self.last_record_type: int | None = None
        """Type of the record the last accepted write/read produced (None: no record)."""

    def _count(self, old: ModelState | None, new: ModelState) -> None:
        """Snapshot for a new key, a higher state epoch or after n updates; else an update."""
        if old is None or new.state_epoch > old.state_epoch or old.updates >= self.n:
            new.updates, self.last_record_type = 0, ShareStateRecordType.SHARE_SNAPSHOT
        else:
            new.updates, self.last_record_type = old.updates + 1, ShareStateRecordType.SHARE_UPDATE

    def initialize(self, key, se, start) -> ErrorCode:
        cur = self.states.get(key)
        if cur is not None and cur.state_epoch > se:
            return ErrorCode.fenced_state_epoch
        self.states[key] = ModelState(se, -1, start)
        self.last_record_type = ShareStateRecordType.SHARE_SNAPSHOT
        return ErrorCode.none

    def write(self, key, se, le, start, batches) -> ErrorCode:
        old = cur = self.states.get(key)
        if cur is None:
            return ErrorCode.invalid_request  # only initialize creates state (Kafka's rule)
        else:
            if cur.leader_epoch > le:
                return ErrorCode.fenced_leader_epoch
            if cur.state_epoch > se:
                return ErrorCode.fenced_state_epoch
            cur = ModelState(se, cur.leader_epoch if le == -1 else le,
                             cur.start_offset if start == -1 else start, dict(cur.offsets))
        for b in batches:
            for o in range(b.first_offset, b.last_offset + 1):
                cur.offsets[o] = (b.delivery_state, b.delivery_count)
        cur.prune()
        self._count(old, cur)
        self.states[key] = cur
        return ErrorCode.none

    def read(self, key, le) -> ErrorCode:
        cur = self.states.get(key)
        if cur is None:
            return ErrorCode.unknown_topic_or_partition
        if le != -1 and le < cur.leader_epoch:
            return ErrorCode.fenced_leader_epoch
        self.last_record_type = None
        if le > cur.leader_epoch:
            new = ModelState(cur.state_epoch, le, cur.start_offset, cur.offsets)
            self._count(cur, new)
            self.states[key] = new
        return ErrorCode.none

    def delete(self, key) -> ErrorCode:
        self.states.pop(key, None)
        return ErrorCode.none


def expand(state: ShareState) -> dict[int, tuple[int, int]]:
    out = {}
    for b in state.state_batches:
        for o in range(b.first_offset, b.last_offset + 1):
            out[o] = (b.delivery_state, b.delivery_count)
    return out


def assert_canonical(state: ShareState) -> None:
    prev = None
    for b in state.state_batches:
        assert b.first_offset <= b.last_offset
        if state.start_offset != -1:
            assert b.first_offset >= state.start_offset
        if prev is not None:
            assert prev.last_offset < b.first_offset
            if prev.last_offset + 1 == b.first_offset:
                assert (prev.delivery_state, prev.delivery_count) != (b.delivery_state, b.delivery_count)
        prev = b


def compact(log: list[CoordinatorRecord]) -> list[tuple[int, CoordinatorRecord]]:
    """Per key keep its last snapshot and the updates after it; nothing if its last marker is a tombstone."""
    last_marker: dict[SharePartitionKey, int] = {}
    for i, rec in enumerate(log):
        if rec.value is None or rec.record_type == ShareStateRecordType.SHARE_SNAPSHOT:
            last_marker[SharePartitionKey.from_record_key(rec.key)] = i
    kept = []
    for i, rec in enumerate(log):
        k = SharePartitionKey.from_record_key(rec.key)
        m = last_marker.get(k)
        if m is None or log[m].value is None or i < m:
            continue
        kept.append((i, rec))
    return kept


batch = st.builds(
    lambda first, length, state, count: StateBatch(first, first + length, state, count),
    st.integers(0, 40), st.integers(0, 6), st.sampled_from(STATES), st.integers(0, 3),
)
key = st.sampled_from(KEYS)
op = st.one_of(
    st.tuples(st.just("write"), key, st.integers(0, 2), st.integers(-1, 3),
              st.one_of(st.just(-1), st.integers(0, 45)), st.lists(batch, max_size=4)),
    st.tuples(st.just("init"), key, st.integers(0, 2), st.one_of(st.just(-1), st.integers(0, 30))),
    st.tuples(st.just("read"), key, st.integers(-1, 3)),
    st.tuples(st.just("delete"), key),
)


@settings(max_examples=300, deadline=None)
@given(n=st.integers(0, 4), ops=st.lists(op, max_size=40))
def test_replay_of_pruned_log_matches_reference_model(n, ops):
    shard = ShareCoordinatorShard(snapshot_update_records_per_snapshot=n)
    model = Model(n)
    log: list[CoordinatorRecord] = []
    for o in ops:
        kind, k = o[0], o[1]
        if kind == "write":
            _, _, se, le, start, batches = o
            result, expected = shard.write(k, se, le, start, batches), model.write(k, se, le, start, batches)
        elif kind == "init":
            _, _, se, start = o
            result, expected = shard.initialize(k, se, start), model.initialize(k, se, start)
        elif kind == "read":
            _, _, le = o
            result, expected = shard.read(k, le), model.read(k, le)
        else:
            result, expected = shard.delete(k), model.delete(k)
        assert result.response.error_code == expected, o
        if expected != ErrorCode.none:
            assert result.records == []
        elif kind != "delete":
            assert [r.record_type for r in result.records] == (
                [] if model.last_record_type is None else [model.last_record_type]), o
        predicted = result.response.state
        for rec in result.records:
            rec = CoordinatorRecord.from_bytes(*rec.to_bytes(), rec.topic)
            shard.replay(rec, offset=len(log))
            log.append(rec)
        if kind in ("write", "init") and expected == ErrorCode.none:
            assert shard.get(k) == predicted

    compacted = compact(log)
    rebuilt = ShareCoordinatorShard(snapshot_update_records_per_snapshot=n)
    for off, rec in compacted:
        rebuilt.replay(rec, offset=off)

    cut = shard.last_redundant_offset()
    pruned = ShareCoordinatorShard(snapshot_update_records_per_snapshot=n)
    if cut is not None:
        for off, rec in enumerate(log):
            if off >= cut:
                pruned.replay(rec, offset=off)
        assert cut <= min((off for off, _ in compacted), default=cut)

    assert sorted(model.states) == shard.keys() == rebuilt.keys()
    if cut is not None:
        assert pruned.keys() == shard.keys()
    for k, m in model.states.items():
        live = shard.get(k)
        assert_canonical(live)
        assert (live.state_epoch, live.leader_epoch, live.start_offset) == (
            m.state_epoch, m.leader_epoch, m.start_offset)
        assert expand(live) == m.offsets
        assert shard.update_count(k) == m.updates
        assert rebuilt.get(k) == live
        assert rebuilt.update_count(k) == shard.update_count(k)
        if cut is not None:
            assert pruned.get(k) == live
            assert pruned.update_count(k) == shard.update_count(k)
