"""State writes carry what changed (KIP-932's WriteShareGroupState examples), and the share
coordinator merges them into the state it holds.

The sequence is the KIP's "messier sequence of release and acknowledge" on one partition
whose log holds one record per batch, acquired in record-limit mode as the example splits
it between three consumers.  Each write is compared with the one the KIP shows; where
shoal's differs, the comment says why.
"""

from __future__ import annotations

from shoal.coordinator.records import ShareStateRecordType
from shoal.share.coordinator import ShareCoordinatorShard, SharePartitionKey
from shoal.share.coordinator import StateBatch as StoredBatch
from shoal.share.partition import SharePartition, StateBatch, StateWrite
from shoal.share.state import AcknowledgeType, AcquireMode

LOCK = 30_000
AVAILABLE, ACKNOWLEDGED, ARCHIVED = 0, 2, 4
KEY = SharePartitionKey("G1", "5c0bd3b8-77f8-4f7e-9c0c-8b58c1cbd3a1", 0)


class Leader:
    """A share-partition and the coordinator shard it writes to, committing every write."""

    def __init__(self, start: int, *, per_snapshot: int = 500) -> None:
        self.sp = SharePartition("G1", KEY.topic_id, 0, start, record_lock_duration_ms=LOCK)
        self.shard = ShareCoordinatorShard(snapshot_update_records_per_snapshot=per_snapshot)
        self.log: list[tuple[int, int]] = []
        self.records_written: list[int] = []
        self._apply(self.shard.initialize(KEY, 0, start))

    def _apply(self, result) -> None:  # type: ignore[no-untyped-def]
        assert result.response.ok, result.response
        for rec in result.records:
            self.shard.replay(rec)
            self.records_written.append(rec.record_type)

    def produce(self, first: int, last: int) -> None:
        self.log.extend((o, o) for o in range(first, last + 1))

    def fetch(self, member: str, n: int, now: int) -> list[tuple[int, int, int]]:
        start = self.sp.next_fetch_offset()
        assert start is not None
        got = self.sp.acquire(member, [b for b in self.log if b[1] >= start], now, n,
                              acquire_mode=AcquireMode.RECORD_LIMIT)
        return [tuple(a) for a in got]

    def write(self) -> StateWrite:
        w = self.sp.take_write()
        assert w is not None
        self._apply(self.shard.write(KEY, w.state_epoch, w.leader_epoch, w.start_offset,
                                     [StoredBatch(*b) for b in w.state_batches], w.delivery_complete_count))
        self.sp.commit(w)
        return w

    def ack(self, member: str, first: int, last: int, kind: AcknowledgeType, now: int) -> StateWrite:
        self.sp.acknowledge(member, [(first, last, [kind])], now)
        return self.write()

    def stored(self) -> tuple[int, tuple[tuple[int, int, int, int], ...]]:
        st = self.shard.get(KEY)
        assert st is not None
        return st.start_offset, tuple((b.first_offset, b.last_offset, b.delivery_state, b.delivery_count)
                                      for b in st.state_batches)


def test_the_kip_sequence_of_writes() -> None:
    L = Leader(100)
    L.produce(100, 109)
    assert L.fetch("c1", 10, 0) == [(100, 109, 1)]
    w = L.ack("c1", 100, 109, AcknowledgeType.ACCEPT, 1)
    assert (w.start_offset, w.state_batches) == (110, ())  # KIP: StartOffset 110, no batches

    L.produce(110, 120)
    assert L.fetch("c1", 3, 10) == [(110, 112, 1)]
    assert L.fetch("c2", 6, 20) == [(113, 118, 1)]
    assert L.fetch("c3", 1, 30) == [(119, 119, 1)]

    w = L.ack("c1", 110, 110, AcknowledgeType.RELEASE, 40)
    assert (w.start_offset, w.state_batches) == (-1, (StateBatch(110, 110, AVAILABLE, 1),))  # as the KIP

    # The KIP's write here also lists 111-118 as available with count 0; shoal writes only
    # the offset that changed (111-118 are acquired, which is never persisted).
    w = L.ack("c3", 119, 119, AcknowledgeType.ACCEPT, 50)
    assert (w.start_offset, w.state_batches) == (-1, (StateBatch(119, 119, ACKNOWLEDGED, 1),))

    assert L.fetch("c1", 2, 60) == [(110, 110, 2), (120, 120, 1)]

    # c1's lock on 111-112 (taken at 10) lapses; 110 and 120 were taken again at 60.
    assert L.sp.expire(10 + LOCK) == [(111, 112)]
    w = L.write()
    assert (w.start_offset, w.state_batches) == (-1, (StateBatch(111, 112, AVAILABLE, 1),))  # as the KIP

    w = L.ack("c2", 113, 118, AcknowledgeType.ACCEPT, 10 + LOCK)
    assert (w.start_offset, w.state_batches) == (-1, (StateBatch(113, 118, ACKNOWLEDGED, 1),))  # as the KIP

    assert L.fetch("c3", 2, 20 + LOCK) == [(111, 112, 2)]

    # The KIP writes 110 as acknowledged with StartOffset -1; shoal moves the SPSO past it
    # in the same write, which drops 110's state.
    w = L.ack("c1", 110, 110, AcknowledgeType.ACCEPT, 30 + LOCK)
    assert (w.start_offset, w.state_batches) == (111, ())
    assert L.stored() == (111, ((111, 112, AVAILABLE, 1), (113, 119, ACKNOWLEDGED, 1)))

    w = L.ack("c3", 111, 112, AcknowledgeType.ACCEPT, 40 + LOCK)
    assert (w.start_offset, w.state_batches) == (120, ())  # KIP: StartOffset 120, no batches
    assert L.stored() == (120, ())
    # initialize's snapshot, then one ShareUpdate per write.
    assert L.records_written == [ShareStateRecordType.SHARE_SNAPSHOT] + [ShareStateRecordType.SHARE_UPDATE] * 7


def test_a_write_names_only_the_changed_offsets_however_much_is_in_flight() -> None:
    L = Leader(0)
    L.produce(0, 999)
    assert L.fetch("m", 1000, 0) == [(0, 999, 1)]
    L.ack("m", 500, 500, AcknowledgeType.REJECT, 1)
    w = L.ack("m", 700, 701, AcknowledgeType.RELEASE, 2)
    assert (w.start_offset, w.state_batches) == (-1, (StateBatch(700, 701, AVAILABLE, 1),))
    assert L.stored() == (0, ((500, 500, ARCHIVED, 1), (700, 701, AVAILABLE, 1)))
    assert w.delivery_complete_count == 1


def test_a_failed_write_is_sent_again_with_the_next_changes() -> None:
    L = Leader(0)
    L.produce(0, 9)
    L.fetch("m", 10, 0)
    L.sp.acknowledge("m", [(0, 1, [AcknowledgeType.ACCEPT])], 1)
    failed = L.sp.take_write()
    assert failed is not None and failed.start_offset == 2
    L.sp.rollback(failed, 2)  # the persister refused it: memory keeps 0-1 acquired
    assert L.sp.start_offset == 0
    assert L.sp.expire(LOCK) == [(0, 9)]
    w = L.write()
    assert (w.start_offset, w.state_batches) == (-1, (StateBatch(0, 9, AVAILABLE, 1),))
    assert L.stored() == (0, ((0, 9, AVAILABLE, 1),))


def test_updates_between_snapshots_and_a_snapshot_every_n_updates() -> None:
    L = Leader(0, per_snapshot=3)
    L.produce(0, 99)
    L.fetch("m", 100, 0)
    for i in range(8):
        L.ack("m", 10 * i + 5, 10 * i + 5, AcknowledgeType.REJECT, 1 + i)
    U, S = ShareStateRecordType.SHARE_UPDATE, ShareStateRecordType.SHARE_SNAPSHOT
    assert L.records_written == [S, U, U, U, S, U, U, U, S]
    assert L.stored() == (0, tuple((10 * i + 5, 10 * i + 5, ARCHIVED, 1) for i in range(8)))
