"""The controller's and the leader's decisions on a partition's leadership record."""

from shoal.cluster.partition_state import (
    PartitionState,
    choose_leader,
    expand_isr,
    initial_state,
    reconcile,
    shrink_isr,
)

LIVE = {1: 11, 2: 12, 3: 13}


def state(leader=1, isr=(1, 2, 3), epoch=5, reg=11):
    return PartitionState((1, 2, 3), tuple(isr), leader, epoch, 20, reg)


def test_initial_state_leads_with_the_first_live_replica():
    s = initial_state([2, 3, 1], {1: 11, 3: 13})
    assert (s.leader, s.isr, s.leader_epoch, s.partition_epoch, s.leader_registration) == (3, (3, 1), 0, 0, 13)


def test_json_round_trip():
    s = state()
    assert PartitionState.from_json(s.to_json()) == s


def test_nothing_changes_while_every_replica_is_live():
    assert reconcile(state(), LIVE) is None


def test_dead_leader_is_replaced_by_the_next_isr_member_in_preference_order():
    new = reconcile(state(), {2: 12, 3: 13})
    assert (new.leader, new.isr, new.leader_epoch, new.partition_epoch, new.leader_registration) == (2, (2, 3), 6, 21, 12)


def test_only_isr_members_are_elected_unclean_election_is_off():
    new = reconcile(state(isr=(1, 2)), {3: 13})
    assert new.leader == -1 and new.isr == (1, 2) and new.leader_epoch == 6
    # the last ISR member comes back: it leads again
    back = reconcile(new, {1: 21, 3: 13})
    assert back.leader == 1 and back.leader_registration == 21 and back.isr == (1,)
    assert reconcile(new, {3: 13}) is None


def test_a_restarted_leader_is_replaced_even_before_its_old_lease_lapses():
    new = reconcile(state(), {1: 99, 2: 12, 3: 13})
    assert new.leader == 2 and 1 not in new.isr


def test_a_restarted_leader_that_is_alone_in_the_isr_leads_again_under_a_new_epoch():
    new = reconcile(state(isr=(1,)), {1: 99, 2: 12})
    assert (new.leader, new.leader_epoch, new.leader_registration, new.isr) == (1, 6, 99, (1,))


def test_dead_follower_leaves_the_isr():
    new = reconcile(state(), {1: 11, 3: 13})
    assert new.leader == 1 and new.isr == (1, 3) and new.leader_epoch == 5 and new.partition_epoch == 21


def test_controlled_shutdown_moves_leadership_and_leaves_the_isr():
    new = reconcile(state(), LIVE, shutting_down={1})
    assert new.leader == 2 and new.isr == (2, 3)
    # a follower shutting down leaves the ISR
    assert reconcile(state(), LIVE, shutting_down={3}).isr == (1, 2)


def test_controlled_shutdown_keeps_a_leader_that_has_no_alternative():
    assert reconcile(state(isr=(1,)), LIVE, shutting_down={1}) is None


def test_preferred_leader_is_restored_when_asked():
    s = state(leader=2, reg=12)
    assert reconcile(s, LIVE) is None
    new = reconcile(s, LIVE, prefer=True)
    assert new.leader == 1 and new.leader_epoch == 6 and new.leader_registration == 11
    assert reconcile(state(leader=2, reg=12, isr=(2, 3)), LIVE, prefer=True) is None


def test_choose_leader_respects_preference_and_exclusions():
    assert choose_leader(state(), LIVE) == 1
    assert choose_leader(state(), LIVE, exclude={1}) == 2
    assert choose_leader(state(isr=(3,)), LIVE) == 3


def test_isr_shrink_and_expand_only_by_the_current_leader():
    s = state()
    assert shrink_isr(s, 1, 5, {3}).isr == (1, 2)
    assert shrink_isr(s, 1, 4, {3}) is None  # a stale leader epoch
    assert shrink_isr(s, 2, 5, {3}) is None  # not the leader
    assert shrink_isr(s, 1, 5, {1}) is None  # the leader never leaves its own ISR
    small = state(isr=(1,))
    grown = expand_isr(small, 1, 5, 3)
    assert grown.isr == (1, 3) and grown.partition_epoch == 21
    assert expand_isr(grown, 1, 5, 3) is None
    assert expand_isr(small, 1, 5, 7) is None
