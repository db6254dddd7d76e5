"""Transactional offsets in the offset store: pending per producer, applied by a commit
marker, dropped by an abort marker, UNSTABLE_OFFSET_COMMIT for require_stable readers."""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from shoal.groups.offsets import CommitPartition, OffsetStore


def _records(store: OffsetStore, offset: int):
    records, _ = store.commit("g", None, member_id="", group_instance_id=None, generation_id=-1, api_version=8,
                              topics=[("t", [CommitPartition(0, offset)])], retention_ms=-1, now_ms=1)
    return records


def _row(store: OffsetStore, stable: bool) -> tuple[int, int]:
    row = store.fetch("g", None, topics=[("t", [0])], require_stable=stable)["topics"][0]["partitions"][0]
    return row["error_code"], row["committed_offset"]


def test_pending_offsets_follow_their_transaction():
    store = OffsetStore()
    for rec in _records(store, 5):
        store.replay(rec)
    for rec in _records(store, 9):
        store.replay_pending(rec, producer_id=3)
    assert _row(store, False) == (ErrorCode.none, 5)
    assert _row(store, True) == (ErrorCode.unstable_offset_commit, -1)
    assert store.complete_transaction(3, commit=False) == []
    assert _row(store, True) == (ErrorCode.none, 5)
    for rec in _records(store, 12):
        store.replay_pending(rec, producer_id=3)
    assert store.complete_transaction(4, commit=True) == []  # another producer's marker
    assert _row(store, True) == (ErrorCode.unstable_offset_commit, -1)
    assert store.complete_transaction(3, commit=True) == ["g"]
    assert _row(store, True) == (ErrorCode.none, 12) and not store.pending
