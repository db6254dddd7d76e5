"""Partition reassignment on a partition's record: start, complete, cancel (Kafka's rules)."""

import pytest

from shoal.cluster.partition_state import (
    PartitionState,
    ReassignmentError,
    cancel_reassignment,
    complete_reassignment,
    expand_isr,
    reconcile,
    start_reassignment,
)

LIVE = {1: 11, 2: 12, 3: 13, 4: 14}


def state(leader=1, replicas=(1, 2, 3), isr=(1, 2, 3)):
    return PartitionState(tuple(replicas), tuple(isr), leader, 5, 20, LIVE[leader])


def test_starting_puts_the_target_first_and_records_adding_and_removing():
    s = start_reassignment(state(), [2, 3, 4])
    assert (s.replicas, s.adding, s.removing) == ((2, 3, 4, 1), (4,), (1,))
    assert (s.isr, s.leader, s.leader_epoch, s.partition_epoch) == ((1, 2, 3), 1, 5, 21)
    assert s.target == (2, 3, 4)
    assert PartitionState.from_json(s.to_json()) == s


def test_a_reassignment_waits_until_every_target_replica_is_in_sync_then_moves_leadership():
    s = start_reassignment(state(), [2, 3, 4])
    assert complete_reassignment(s, LIVE) is None
    s = expand_isr(s, 1, 5, 4)  # the leader adds the caught-up new replica
    assert set(s.isr) == {1, 2, 3, 4}
    done = complete_reassignment(s, LIVE)
    assert (done.replicas, done.isr, done.adding, done.removing) == ((2, 3, 4), (2, 3, 4), (), ())
    assert (done.leader, done.leader_epoch, done.leader_registration) == (2, 6, 12)
    assert done.partition_epoch == s.partition_epoch + 1


def test_completion_keeps_a_leader_that_is_in_the_target():
    s = expand_isr(start_reassignment(state(), [1, 4]), 1, 5, 4)
    done = complete_reassignment(s, LIVE)
    assert (done.replicas, done.isr, done.leader, done.leader_epoch) == ((1, 4), (1, 4), 1, 5)


def test_a_pure_removal_completes_at_once_and_a_reorder_needs_no_reassignment():
    s = start_reassignment(state(), [2, 3])
    assert (s.adding, s.removing) == ((), (1,))
    done = complete_reassignment(s, LIVE)
    assert (done.replicas, done.isr, done.leader) == ((2, 3), (2, 3), 2)
    reordered = start_reassignment(state(), [3, 1, 2])
    assert (reordered.replicas, reordered.reassigning) == ((3, 1, 2), False)
    assert start_reassignment(state(), [1, 2, 3]) is None


def test_completion_waits_while_no_target_replica_can_lead():
    s = start_reassignment(state(replicas=(1,), isr=(1,)), [4])
    s = expand_isr(s, 1, 5, 4)
    assert complete_reassignment(s, {1: 11}) is None  # broker 4 is not live
    assert complete_reassignment(s, LIVE).leader == 4


def test_cancel_reverts_to_the_replicas_before_and_drops_added_ones_from_the_isr():
    s = expand_isr(start_reassignment(state(), [2, 3, 4]), 1, 5, 4)
    back = cancel_reassignment(s, LIVE)
    assert (back.replicas, back.isr, back.leader, back.adding, back.removing) == ((2, 3, 1), (2, 3, 1), 1, (), ())


def test_cancel_elects_another_leader_when_an_added_replica_led():
    s = expand_isr(start_reassignment(state(replicas=(1, 2), isr=(1, 2)), [4, 2]), 1, 5, 4)
    s = reconcile(s, {2: 12, 4: 14})  # broker 1 died: the new replica 4 leads
    assert s.leader == 4
    back = cancel_reassignment(s, LIVE)
    assert (back.replicas, back.leader, back.leader_epoch) == ((2, 1), 2, s.leader_epoch + 1)


def test_cancel_without_a_reassignment_and_bad_targets_are_refused():
    with pytest.raises(ReassignmentError) as e:
        cancel_reassignment(state(), LIVE)
    assert e.value.none_in_progress
    with pytest.raises(ReassignmentError):
        start_reassignment(state(), [])
    with pytest.raises(ReassignmentError):
        start_reassignment(state(), [2, 2])
