"""ShareCoordinatorShard: every operation and error, snapshot cadence, replay."""

from __future__ import annotations

import uuid

import pytest
from kio.schema.delete_share_group_state.v0.request import DeleteShareGroupStateRequest, DeleteStateData
from kio.schema.delete_share_group_state.v0.request import PartitionData as DeletePartitionData
from kio.schema.errors import ErrorCode
from kio.schema.initialize_share_group_state.v0.request import (
    InitializeShareGroupStateRequest,
    InitializeStateData,
)
from kio.schema.initialize_share_group_state.v0.request import PartitionData as InitPartitionData
from kio.schema.read_share_group_state.v0.request import PartitionData as ReadPartitionData
from kio.schema.read_share_group_state.v0.request import ReadShareGroupStateRequest, ReadStateData
from kio.schema.read_share_group_state_summary.v1.request import PartitionData as SummaryPartitionData
from kio.schema.read_share_group_state_summary.v1.request import (
    ReadShareGroupStateSummaryRequest,
    ReadStateSummaryData,
)
from kio.schema.write_share_group_state.v1.request import PartitionData as WritePartitionData
from kio.schema.write_share_group_state.v1.request import StateBatch as WireBatch
from kio.schema.write_share_group_state.v1.request import WriteShareGroupStateRequest, WriteStateData
from kio.static.primitive import i8, i16, i32, i64

from shoal.config import BrokerConfig
from shoal.coordinator.partitioning import java_string_hash
from shoal.coordinator.records import CoordinatorRecord, ShareStateRecordType
from shoal.share.coordinator import (
    PartitionOutcome,
    ShareCoordinatorShard,
    SharePartitionKey,
    ShareState,
    StateBatch,
    combine_state_batches,
    partition_for,
)

TOPIC = uuid.UUID("5f0c7a1e-8a52-4d8e-9a57-3c3a8b0f2a11")
KEY = SharePartitionKey.of("G1", TOPIC, 0)
AVAILABLE, ACKNOWLEDGED, ARCHIVED = 0, 2, 4


class Harness:
    """A shard plus its log: ``apply`` appends a Result's records and replays them."""

    def __init__(self, n: int = 500) -> None:
        self.shard = ShareCoordinatorShard(snapshot_update_records_per_snapshot=n)
        self.log: list[CoordinatorRecord] = []

    def apply(self, result):
        for rec in result.records:
            # through bytes, as the log would store them
            rec = CoordinatorRecord.from_bytes(*rec.to_bytes(), rec.topic)
            self.shard.replay(rec, offset=len(self.log))
            self.log.append(rec)
        return result.response

    def rebuilt(self) -> ShareCoordinatorShard:
        s = ShareCoordinatorShard(snapshot_update_records_per_snapshot=self.shard.snapshot_update_records_per_snapshot)
        for off, rec in enumerate(self.log):
            s.replay(rec, offset=off)
        return s


def B(first, last, state=AVAILABLE, count=1) -> StateBatch:
    return StateBatch(first, last, state, count)


# --- keys and partitioning ----------------------------------------------------------


def test_key_of_uuid_and_coordinator_key():
    assert KEY.topic_id == str(TOPIC)
    assert KEY.coordinator_key() == f"G1:{TOPIC}:0"


def test_java_string_hash_matches_java():
    # Values of "".hashCode(), "a".hashCode(), "hello".hashCode(), and an overflowing one in Java.
    assert java_string_hash("") == 0
    assert java_string_hash("a") == 97
    assert java_string_hash("hello") == 99162322
    assert java_string_hash("polygenelubricants") == -2147483648


def test_partition_for_is_stable_and_in_range():
    keys = [SharePartitionKey("g%d" % i, str(TOPIC), i % 7) for i in range(200)]
    parts = [partition_for(k, 50) for k in keys]
    assert all(0 <= p < 50 for p in parts)
    assert len(set(parts)) > 10
    assert parts == [partition_for(k, 50) for k in keys]
    assert partition_for(KEY, 1) == 0
    with pytest.raises(ValueError):
        partition_for(KEY, 0)


def test_partition_for_min_int_hash_maps_to_zero():
    # "polygenelubricants" hashes to Integer.MIN_VALUE; Kafka's Utils.abs gives 0
    k = SharePartitionKey("polygenelubricants", "", 0)
    assert java_string_hash(k.coordinator_key()) != -(1 << 31)  # the full key hashes differently
    assert partition_for(k, 3) in range(3)


# --- combining batches ----------------------------------------------------------------


def test_combine_overrides_overlap_and_splits():
    cur = (B(10, 20, AVAILABLE, 1),)
    assert combine_state_batches(cur, [B(13, 15, ACKNOWLEDGED, 1)], -1) == (
        B(10, 12), B(13, 15, ACKNOWLEDGED), B(16, 20))


def test_combine_prunes_below_start_offset_and_cuts_straddler():
    cur = (B(0, 4), B(5, 9, ACKNOWLEDGED))
    assert combine_state_batches(cur, [], 7) == (B(7, 9, ACKNOWLEDGED),)
    assert combine_state_batches(cur, [], 10) == ()
    assert combine_state_batches(cur, [], -1) == cur


def test_combine_merges_adjacent_equal_batches():
    assert combine_state_batches((B(0, 4),), [B(5, 9)], -1) == (B(0, 9),)
    assert combine_state_batches((B(0, 4),), [B(5, 9, count=2)], -1) == (B(0, 4), B(5, 9, count=2))


def test_combine_later_batch_in_request_wins():
    assert combine_state_batches((), [B(0, 9, ARCHIVED, 3), B(3, 4, ACKNOWLEDGED, 1)], -1) == (
        B(0, 2, ARCHIVED, 3), B(3, 4, ACKNOWLEDGED, 1), B(5, 9, ARCHIVED, 3))


def test_combine_new_batch_swallows_several():
    cur = (B(0, 2), B(4, 6, ACKNOWLEDGED), B(8, 9, ARCHIVED))
    assert combine_state_batches(cur, [B(1, 8, AVAILABLE, 2)], -1) == (
        B(0, 0), B(1, 8, AVAILABLE, 2), B(9, 9, ARCHIVED))


# --- initialize -----------------------------------------------------------------------


def test_initialize_writes_snapshot_and_sets_state():
    h = Harness()
    r = h.shard.initialize(KEY, state_epoch=3, start_offset=100)
    assert [x.record_type for x in r.records] == [ShareStateRecordType.SHARE_SNAPSHOT]
    assert h.shard.get(KEY) is None  # operations do not change state
    out = h.apply(r)
    assert out.ok and out.state == ShareState(3, -1, 100, (), 0)
    assert h.shard.get(KEY) == out.state


def test_initialize_uninitialized_start_offset_is_readable():
    h = Harness()
    h.apply(h.shard.initialize(KEY, 0, -1))
    out = h.apply(h.shard.read(KEY, 0))
    assert out.ok and out.state.start_offset == -1


def test_reinitialize_bumps_snapshot_epoch_and_clears_batches():
    h = Harness()
    h.apply(h.shard.initialize(KEY, 1, 0))
    h.apply(h.shard.write(KEY, 1, 0, -1, [B(0, 3, ACKNOWLEDGED)]))
    out = h.apply(h.shard.initialize(KEY, 2, 50))
    assert out.state == ShareState(2, -1, 50, (), 1)
    assert h.shard.get(KEY) == out.state


def test_initialize_fenced_by_lower_state_epoch():
    h = Harness()
    h.apply(h.shard.initialize(KEY, 5, 0))
    r = h.shard.initialize(KEY, 4, 0)
    assert r.records == [] and r.response.error_code == ErrorCode.fenced_state_epoch
    assert h.shard.initialize(KEY, 5, 0).response.ok  # equal is allowed


@pytest.mark.parametrize("key", [SharePartitionKey("", str(TOPIC), 0), SharePartitionKey("G", "", 0),
                                 SharePartitionKey("G", str(TOPIC), -1)])
def test_bad_keys_are_invalid_requests(key):
    shard = ShareCoordinatorShard()
    for r in (shard.initialize(key, 0, 0), shard.write(key, 0, 0, 0, []), shard.read(key),
              shard.read_summary(key), shard.delete(key)):
        assert r.records == [] and r.response.error_code == ErrorCode.invalid_request


def test_bad_start_offset_and_batches_are_invalid_requests():
    shard = ShareCoordinatorShard()
    assert shard.initialize(KEY, 0, -2).response.error_code == ErrorCode.invalid_request
    assert shard.write(KEY, 0, 0, -2, []).response.error_code == ErrorCode.invalid_request
    assert shard.write(KEY, 0, 0, 0, [B(5, 4)]).response.error_code == ErrorCode.invalid_request
    assert shard.write(KEY, 0, 0, 0, [B(-1, 4)]).response.error_code == ErrorCode.invalid_request
    assert shard.write(KEY, 0, 0, 0, [B(1, 4, count=-1)]).response.error_code == ErrorCode.invalid_request


# --- write ------------------------------------------------------------------------------


def test_write_without_initialize_is_refused_and_creates_nothing():
    # Kafka's WRITE_UNINITIALIZED_SHARE_PARTITION: only initialize creates state.
    h = Harness()
    r = h.shard.write(KEY, 0, 1, 10, [B(10, 12, ACKNOWLEDGED)])
    assert r.records == [] and r.response.error_code == ErrorCode.invalid_request
    assert h.shard.get(KEY) is None
    # Nor after a delete: a leader still holding the deleted state cannot bring it back.
    h.apply(h.shard.initialize(KEY, 0, 10))
    h.apply(h.shard.delete(KEY))
    r = h.shard.write(KEY, 0, 1, -1, [B(10, 12, ACKNOWLEDGED)])
    assert r.records == [] and r.response.error_code == ErrorCode.invalid_request
    assert h.shard.get(KEY) is None


def test_unknown_topic_or_partition_as_the_metadata_says():
    counts = {TOPIC: 2}
    h = Harness()
    h.shard.partition_count = counts.get
    other = SharePartitionKey.of("G1", uuid.UUID(int=9), 0)
    beyond = SharePartitionKey.of("G1", TOPIC, 2)
    for key in (other, beyond):
        for r in (h.shard.initialize(key, 0, 0), h.shard.read(key), h.shard.read_summary(key)):
            assert r.records == [] and r.response.error_code == ErrorCode.unknown_topic_or_partition
        # a write is refused first for having no state, as Kafka checks that before the metadata
        assert h.shard.write(key, 0, 0, -1, []).response.error_code == ErrorCode.invalid_request
    # Known ones work; state of a topic that then disappears answers UNKNOWN_TOPIC_OR_PARTITION,
    # and can still be deleted.
    assert h.apply(h.shard.initialize(KEY, 1, 0)).ok
    assert h.apply(h.shard.write(KEY, 1, 0, -1, [B(0, 0, ACKNOWLEDGED)])).ok
    del counts[TOPIC]
    assert h.shard.write(KEY, 1, 0, -1, []).response.error_code == ErrorCode.unknown_topic_or_partition
    assert h.shard.read(KEY).response.error_code == ErrorCode.unknown_topic_or_partition
    r = h.shard.delete(KEY)
    assert r.response.ok and len(r.records) == 2


def test_write_after_snapshot_is_an_update_with_only_the_delta():
    h = Harness()
    h.apply(h.shard.initialize(KEY, 0, 100))
    h.apply(h.shard.write(KEY, 0, 1, -1, [B(100, 104, ACKNOWLEDGED)]))
    r = h.shard.write(KEY, 0, 1, -1, [B(105, 105, AVAILABLE, 2)])
    (rec,) = r.records
    assert rec.record_type == ShareStateRecordType.SHARE_UPDATE
    assert rec.value["state_batches"] == [B(105, 105, AVAILABLE, 2).to_json()]
    assert rec.value["start_offset"] == -1
    h.apply(r)
    assert h.shard.get(KEY).state_batches == (B(100, 104, ACKNOWLEDGED), B(105, 105, AVAILABLE, 2))
    assert h.shard.update_count(KEY) == 2


def test_write_start_offset_drops_batches_below():
    h = Harness()
    h.apply(h.shard.initialize(KEY, 0, 0))
    h.apply(h.shard.write(KEY, 0, 0, -1, [B(0, 9, ACKNOWLEDGED), B(10, 12, AVAILABLE, 2)]))
    out = h.apply(h.shard.write(KEY, 0, 0, 11, []))
    assert out.state.start_offset == 11
    assert h.shard.get(KEY).state_batches == (B(11, 12, AVAILABLE, 2),)


def test_write_fenced_leader_epoch_and_state_epoch():
    h = Harness()
    h.apply(h.shard.initialize(KEY, 2, 0))
    h.apply(h.shard.write(KEY, 2, 5, -1, []))
    r = h.shard.write(KEY, 2, 4, -1, [B(0, 0, ACKNOWLEDGED)])
    assert r.records == [] and r.response.error_code == ErrorCode.fenced_leader_epoch
    r = h.shard.write(KEY, 1, 5, -1, [])
    assert r.records == [] and r.response.error_code == ErrorCode.fenced_state_epoch
    # both stale: leader epoch is checked first, as Kafka does
    assert h.shard.write(KEY, 1, 4, -1, []).response.error_code == ErrorCode.fenced_leader_epoch
    assert h.shard.write(KEY, 2, 6, -1, []).response.ok


def test_write_keeps_leader_epoch_when_minus_one_and_stored_is_minus_one():
    h = Harness()
    h.apply(h.shard.initialize(KEY, 0, 0))
    out = h.apply(h.shard.write(KEY, 0, -1, 3, []))
    assert out.ok and h.shard.get(KEY).leader_epoch == -1 and h.shard.get(KEY).start_offset == 3


def test_write_with_higher_state_epoch_is_a_snapshot():
    h = Harness()
    h.apply(h.shard.initialize(KEY, 1, 0))
    r = h.shard.write(KEY, 2, 0, -1, [B(0, 0, ACKNOWLEDGED)])
    assert r.records[0].record_type == ShareStateRecordType.SHARE_SNAPSHOT
    h.apply(r)
    assert h.shard.get(KEY).state_epoch == 2
    assert h.shard.update_count(KEY) == 0


@pytest.mark.parametrize("n", [0, 1, 3])
def test_snapshot_after_n_updates(n):
    h = Harness(n)
    h.apply(h.shard.initialize(KEY, 0, 0))
    types = []
    for i in range(2 * (n + 1)):
        r = h.shard.write(KEY, 0, 0, -1, [B(i, i, ACKNOWLEDGED)])
        types.append(r.records[0].record_type)
        h.apply(r)
    S, U = ShareStateRecordType.SHARE_SNAPSHOT, ShareStateRecordType.SHARE_UPDATE
    assert types == ([U] * n + [S]) * 2
    assert h.shard.get(KEY).state_batches == (B(0, 2 * (n + 1) - 1, ACKNOWLEDGED),)
    assert h.shard.get(KEY).snapshot_epoch == 2


def test_snapshot_cadence_survives_replay():
    h = Harness(3)
    h.apply(h.shard.initialize(KEY, 0, 0))
    for i in range(2):
        h.apply(h.shard.write(KEY, 0, 0, -1, [B(i, i, ACKNOWLEDGED)]))
    restarted = h.rebuilt()
    assert restarted.update_count(KEY) == 2
    r1 = restarted.write(KEY, 0, 0, -1, [B(5, 5, ACKNOWLEDGED)])
    assert r1.records[0].record_type == ShareStateRecordType.SHARE_UPDATE
    for rec in r1.records:
        restarted.replay(rec)
    r2 = restarted.write(KEY, 0, 0, -1, [B(6, 6, ACKNOWLEDGED)])
    assert r2.records[0].record_type == ShareStateRecordType.SHARE_SNAPSHOT


def test_from_config_reads_snapshot_cadence():
    cfg = BrokerConfig({"share.coordinator.snapshot.update.records.per.snapshot": "7"})
    assert ShareCoordinatorShard.from_config(cfg).snapshot_update_records_per_snapshot == 7
    assert ShareCoordinatorShard.from_config(BrokerConfig()).snapshot_update_records_per_snapshot == 500


def test_stale_update_after_new_snapshot_is_ignored_and_orphan_update_too():
    h = Harness()
    h.apply(h.shard.initialize(KEY, 0, 0))
    stale = h.shard.write(KEY, 0, 0, -1, [B(0, 0, ACKNOWLEDGED)]).records[0]
    h.apply(h.shard.initialize(KEY, 1, 0))  # snapshot epoch 1
    h.shard.replay(stale)
    assert h.shard.get(KEY).state_batches == ()
    other = SharePartitionKey("G2", str(TOPIC), 0)
    orphan = CoordinatorRecord(ShareStateRecordType.SHARE_UPDATE, other.record_key(), stale.value)
    h.shard.replay(orphan)
    assert h.shard.get(other) is None


def test_replay_rejects_unknown_record_type():
    with pytest.raises(ValueError):
        ShareCoordinatorShard().replay(CoordinatorRecord(7, KEY.record_key(), {}))


# --- read and summary -------------------------------------------------------------------


def test_read_unknown_key():
    r = ShareCoordinatorShard().read(KEY, 0)
    assert r.records == [] and r.response.error_code == ErrorCode.unknown_topic_or_partition
    assert r.response.state is None


def test_read_returns_state_and_records_a_higher_leader_epoch():
    h = Harness()
    h.apply(h.shard.initialize(KEY, 4, 10))
    h.apply(h.shard.write(KEY, 4, 1, -1, [B(10, 11, ACKNOWLEDGED)]))
    same = h.shard.read(KEY, 1)
    assert same.records == [] and same.response.state == h.shard.get(KEY)
    assert h.shard.read(KEY, -1).records == []
    bump = h.shard.read(KEY, 2)
    assert len(bump.records) == 1
    out = h.apply(bump)
    assert out.ok and out.state.state_batches == (B(10, 11, ACKNOWLEDGED),) and out.state.start_offset == 10
    assert h.shard.get(KEY).leader_epoch == 2
    # the old leader is now fenced
    assert h.shard.write(KEY, 4, 1, -1, []).response.error_code == ErrorCode.fenced_leader_epoch
    assert h.shard.read(KEY, 1).response.error_code == ErrorCode.fenced_leader_epoch


def test_read_summary():
    h = Harness()
    assert h.shard.read_summary(KEY).response.error_code == ErrorCode.unknown_topic_or_partition
    h.apply(h.shard.initialize(KEY, 3, 7))
    h.apply(h.shard.write(KEY, 3, 2, 9, [B(10, 11, ACKNOWLEDGED), B(12, 12, 0, 1), B(13, 14, ARCHIVED)],
                          delivery_complete_count=4))
    r = h.shard.read_summary(KEY)
    assert r.records == []
    st = r.response.state
    # the delivery-complete count is derived from the stored batches (the records do not hold it)
    assert (st.start_offset, st.state_epoch, st.leader_epoch, st.delivery_complete_count) == (9, 3, 2, 4)
    assert h.shard.read_summary(KEY, 1).response.error_code == ErrorCode.fenced_leader_epoch
    assert h.shard.read_summary(KEY, -1).response.ok


# --- delete -----------------------------------------------------------------------------


def test_delete_writes_tombstones_and_forgets():
    h = Harness(1)
    h.apply(h.shard.initialize(KEY, 0, 0))
    h.apply(h.shard.write(KEY, 0, 0, -1, [B(0, 0, ACKNOWLEDGED)]))
    r = h.shard.delete(KEY)
    assert [(x.record_type, x.value) for x in r.records] == [
        (ShareStateRecordType.SHARE_SNAPSHOT, None), (ShareStateRecordType.SHARE_UPDATE, None)]
    assert h.apply(r) == PartitionOutcome()
    assert h.shard.get(KEY) is None and h.shard.update_count(KEY) == 0
    assert h.shard.read(KEY).response.error_code == ErrorCode.unknown_topic_or_partition
    # deleting nothing succeeds without records
    again = h.shard.delete(KEY)
    assert again.records == [] and again.response.ok
    # after a delete, a write is refused; only a new initialize starts a fresh snapshot
    assert h.shard.write(KEY, 0, 0, 0, []).response.error_code == ErrorCode.invalid_request
    r = h.shard.initialize(KEY, 0, 0)
    assert r.records[0].record_type == ShareStateRecordType.SHARE_SNAPSHOT


# --- replay equals live, and log pruning -------------------------------------------------


def test_replay_from_records_equals_live_state():
    h = Harness(2)
    k2 = SharePartitionKey.of("G1", TOPIC, 1)
    h.apply(h.shard.initialize(KEY, 0, 0))
    h.apply(h.shard.initialize(k2, 0, 0))
    for i in range(7):
        h.apply(h.shard.write(KEY, 0, i, -1 if i % 3 else i, [B(i, i + 2, i % 3 * 2, i)]))
        h.apply(h.shard.write(k2, 0, 0, -1, [B(i * 2, i * 2, ACKNOWLEDGED)]))
    h.apply(h.shard.read(KEY, 10))
    rebuilt = h.rebuilt()
    for k in (KEY, k2):
        assert rebuilt.get(k) == h.shard.get(k)
        assert rebuilt.update_count(k) == h.shard.update_count(k)
    assert rebuilt.keys() == h.shard.keys()


def test_last_redundant_offset_allows_pruning():
    h = Harness(1)
    k2 = SharePartitionKey.of("G1", TOPIC, 1)
    assert h.shard.last_redundant_offset() is None
    h.apply(h.shard.initialize(KEY, 0, 0))       # 0 snapshot KEY
    h.apply(h.shard.initialize(k2, 0, 0))        # 1 snapshot k2
    h.apply(h.shard.write(KEY, 0, 0, -1, [B(0, 0, ACKNOWLEDGED)]))  # 2 update KEY
    h.apply(h.shard.write(KEY, 0, 0, -1, [B(1, 1, ACKNOWLEDGED)]))  # 3 snapshot KEY
    assert h.shard.last_redundant_offset() == 1
    h.apply(h.shard.write(k2, 0, 0, -1, [B(0, 0, ACKNOWLEDGED)]))   # 4 update k2
    h.apply(h.shard.write(k2, 0, 0, -1, [B(1, 1, ACKNOWLEDGED)]))   # 5 snapshot k2
    cut = h.shard.last_redundant_offset()
    assert cut == 3
    pruned = ShareCoordinatorShard(snapshot_update_records_per_snapshot=1)
    for off, rec in enumerate(h.log):
        if off >= cut:
            pruned.replay(rec, offset=off)
    assert pruned.get(KEY) == h.shard.get(KEY) and pruned.get(k2) == h.shard.get(k2)
    h.apply(h.shard.delete(KEY))
    h.apply(h.shard.delete(k2))
    assert h.shard.last_redundant_offset() == len(h.log)


# --- the worked example of KIP-932 (persisted state) -------------------------------------


def test_kip932_worked_example():
    """The WriteShareGroupState sequence of KIP-932's "State changes" example, group G1."""
    h = Harness()
    h.apply(h.shard.initialize(KEY, 0, 100))                      # SPSO=100, SPEO=100
    h.apply(h.shard.write(KEY, 0, 0, 110, []))                    # ack 100-109
    assert h.shard.get(KEY).start_offset == 110 and h.shard.get(KEY).state_batches == ()
    # fetch 110-119; release 110 (consumer 1)
    h.apply(h.shard.write(KEY, 0, 0, -1, [B(110, 110, AVAILABLE, 1)]))
    # 111-118 as available/0 and 119 acknowledged
    h.apply(h.shard.write(KEY, 0, 0, -1, [B(111, 118, AVAILABLE, 0), B(119, 119, ACKNOWLEDGED, 1)]))
    assert h.shard.get(KEY).state_batches == (
        B(110, 110, AVAILABLE, 1), B(111, 118, AVAILABLE, 0), B(119, 119, ACKNOWLEDGED, 1))
    # lock timeout of 111-112
    h.apply(h.shard.write(KEY, 0, 0, -1, [B(111, 112, AVAILABLE, 1)]))
    # consumer 2 acknowledges 113-118
    h.apply(h.shard.write(KEY, 0, 0, -1, [B(113, 118, ACKNOWLEDGED, 1)]))
    assert h.shard.get(KEY).state_batches == (B(110, 112, AVAILABLE, 1), B(113, 119, ACKNOWLEDGED, 1))
    # consumer 1 acknowledges 110 (delivery count 2)
    h.apply(h.shard.write(KEY, 0, 0, -1, [B(110, 110, ACKNOWLEDGED, 2)]))
    assert h.shard.get(KEY).state_batches == (
        B(110, 110, ACKNOWLEDGED, 2), B(111, 112, AVAILABLE, 1), B(113, 119, ACKNOWLEDGED, 1))
    # eventually everything up to 119 is done: SPSO moves to 120
    h.apply(h.shard.write(KEY, 0, 0, 120, []))
    assert h.shard.get(KEY).start_offset == 120 and h.shard.get(KEY).state_batches == ()
    assert h.rebuilt().get(KEY) == h.shard.get(KEY)


# --- wire handlers ----------------------------------------------------------------------


def _wire_write(group, partitions):
    return WriteShareGroupStateRequest(group_id=group, topics=(WriteStateData(topic_id=TOPIC, partitions=tuple(
        WritePartitionData(partition=i32(p), state_epoch=i32(se), leader_epoch=i32(le), start_offset=i64(so),
                           state_batches=tuple(WireBatch(first_offset=i64(b.first_offset),
                                                         last_offset=i64(b.last_offset),
                                                         delivery_state=i8(b.delivery_state),
                                                         delivery_count=i16(b.delivery_count)) for b in bs))
        for p, se, le, so, bs in partitions)),))


def test_wire_round_trip():
    h = Harness()
    init = InitializeShareGroupStateRequest(group_id="G1", topics=(InitializeStateData(topic_id=TOPIC, partitions=(
        InitPartitionData(partition=i32(0), state_epoch=i32(1), start_offset=i64(5)),
        InitPartitionData(partition=i32(1), state_epoch=i32(1), start_offset=i64(-1)),
    )),))
    resp = h.apply(h.shard.handle_initialize_share_group_state(init))
    assert [p.error_code for p in resp.results[0].partitions] == [ErrorCode.none, ErrorCode.none]
    assert resp.results[0].topic_id == TOPIC

    # the same key twice in one request behaves like two requests in a row
    wreq = _wire_write("G1", [(0, 1, 0, -1, [B(5, 6, ACKNOWLEDGED)]), (0, 1, 0, -1, [B(7, 7, ARCHIVED, 5)]),
                              (1, 0, 0, -1, [])])
    r = h.shard.handle_write_share_group_state(wreq)
    assert len(r.records) == 2
    resp = h.apply(r)
    assert [p.error_code for p in resp.results[0].partitions] == [
        ErrorCode.none, ErrorCode.none, ErrorCode.fenced_state_epoch]
    assert h.shard.get(KEY).state_batches == (B(5, 6, ACKNOWLEDGED), B(7, 7, ARCHIVED, 5))

    rreq = ReadShareGroupStateRequest(group_id="G1", topics=(ReadStateData(topic_id=TOPIC, partitions=(
        ReadPartitionData(partition=i32(0), leader_epoch=i32(1)),
        ReadPartitionData(partition=i32(9), leader_epoch=i32(0)),
    )),))
    r = h.shard.handle_read_share_group_state(rreq)
    assert len(r.records) == 1  # leader epoch 1 recorded
    resp = h.apply(r)
    p0, p9 = resp.results[0].partitions
    assert p0.error_code == ErrorCode.none and p0.start_offset == 5 and p0.state_epoch == 1
    assert [(b.first_offset, b.last_offset, b.delivery_state, b.delivery_count) for b in p0.state_batches] == [
        (5, 6, 2, 1), (7, 7, 4, 5)]
    assert p9.error_code == ErrorCode.unknown_topic_or_partition and p9.state_batches == ()

    sreq = ReadShareGroupStateSummaryRequest(group_id="G1", topics=(ReadStateSummaryData(topic_id=TOPIC, partitions=(
        SummaryPartitionData(partition=i32(0), leader_epoch=i32(-1)),)),))
    r = h.shard.handle_read_share_group_state_summary(sreq)
    (s0,) = r.response.results[0].partitions
    assert r.records == [] and (s0.start_offset, s0.state_epoch, s0.leader_epoch) == (5, 1, 1)

    dreq = DeleteShareGroupStateRequest(group_id="G1", topics=(DeleteStateData(topic_id=TOPIC, partitions=(
        DeletePartitionData(partition=i32(0)), DeletePartitionData(partition=i32(1)))),))
    resp = h.apply(h.shard.handle_delete_share_group_state(dreq))
    assert [p.error_code for p in resp.results[0].partitions] == [ErrorCode.none, ErrorCode.none]
    assert h.shard.keys() == []
    assert h.rebuilt().keys() == []


def test_wire_null_topic_id_is_invalid_request():
    shard = ShareCoordinatorShard()
    req = WriteShareGroupStateRequest(group_id="G1", topics=(WriteStateData(topic_id=None, partitions=(
        WritePartitionData(partition=i32(0), state_epoch=i32(0), leader_epoch=i32(0), start_offset=i64(0),
                           state_batches=()),)),))
    r = shard.handle_write_share_group_state(req)
    assert r.records == [] and r.response.results[0].partitions[0].error_code == ErrorCode.invalid_request


def test_snapshots_carry_create_and_write_timestamps_and_the_complete_count():
    h = Harness(n=1)
    h.apply(h.shard.initialize(KEY, 0, 10, now_ms=1_000))
    snap = h.log[-1]
    assert (snap.value["create_timestamp"], snap.value["write_timestamp"]) == (1_000, 1_000)
    h.apply(h.shard.write(KEY, 0, 0, -1, [B(10, 12, ACKNOWLEDGED)], now_ms=2_000))  # an update
    assert h.log[-1].record_type == ShareStateRecordType.SHARE_UPDATE
    assert h.log[-1].value["delivery_complete_count"] == 3
    h.apply(h.shard.write(KEY, 0, 0, -1, [B(14, 14, ARCHIVED)], now_ms=3_000))  # the next snapshot
    snap = h.log[-1]
    assert snap.record_type == ShareStateRecordType.SHARE_SNAPSHOT
    assert (snap.value["create_timestamp"], snap.value["write_timestamp"]) == (1_000, 3_000)
    assert snap.value["delivery_complete_count"] == 4
    st = h.rebuilt().get(KEY)
    assert (st.create_timestamp, st.write_timestamp, st.delivery_complete_count) == (1_000, 3_000, 4)
