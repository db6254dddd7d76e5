"""A broker whose log directory is offline is registered but holds no replica: the controller
takes it out of every ISR and never elects it."""

from shoal.cluster.etcd_store import BrokerInfo, Snapshot
from shoal.cluster.partition_state import PartitionState, reconcile


def snapshot(offline: int | None) -> Snapshot:
    return Snapshot(brokers={n: BrokerInfo(n, "h", 9000 + n, None, 10 + n, log_dir_offline=n == offline)
                             for n in (1, 2, 3)})


def test_live_leaves_out_a_broker_whose_log_directory_is_offline():
    assert snapshot(None).live() == {1: 11, 2: 12, 3: 13}
    assert snapshot(3).live() == {1: 11, 2: 12}


def test_a_follower_with_an_offline_directory_leaves_the_isr():
    s = PartitionState((1, 3, 2), (1, 3, 2), 1, 4, 9, 11)
    new = reconcile(s, snapshot(3).live())
    assert new is not None and (new.leader, new.leader_epoch, new.isr) == (1, 4, (1, 2))


def test_a_leader_with_an_offline_directory_is_replaced_by_an_in_sync_replica_never_by_itself():
    s = PartitionState((3, 1, 2), (3, 1, 2), 3, 4, 9, 13)
    new = reconcile(s, snapshot(3).live())
    assert new is not None and (new.leader, new.leader_epoch, new.isr) == (1, 5, (1, 2))
    # its only in-sync replica offline: no leader, and the ISR kept for when it comes back
    alone = PartitionState((3, 1, 2), (3,), 3, 4, 9, 13)
    new = reconcile(alone, snapshot(3).live())
    assert new is not None and (new.leader, new.isr) == (-1, (3,))
    back = reconcile(new, snapshot(None).live())
    assert back is not None and (back.leader, back.leader_registration) == (3, 13)
