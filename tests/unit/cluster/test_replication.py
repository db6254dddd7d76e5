"""The leader's replication rules: high watermark, caught-up and lagging followers, valid follower fetches."""

from shoal.cluster.replication import caught_up_at, follower_fetch_error, high_watermark, lagging
from shoal.errors import ErrorCode


def test_high_watermark_is_the_smallest_log_end_among_the_isr():
    assert high_watermark(0, 10, 1, (1, 2, 3), {2: 7, 3: 9}) == 7
    assert high_watermark(0, 10, 1, (1, 3), {2: 7, 3: 9}) == 9  # 2 is out of the ISR: it does not hold it back
    assert high_watermark(0, 10, 1, (1,), {}) == 10  # alone in the ISR


def test_high_watermark_never_goes_down_and_unknown_followers_hold_it():
    assert high_watermark(8, 10, 1, (1, 2), {2: 5}) == 8
    assert high_watermark(4, 10, 1, (1, 2), {}) == 4  # a follower not heard from yet counts at the old HW


def test_caught_up_when_fetching_the_log_end_or_what_it_was_at_the_previous_fetch():
    assert caught_up_at(10, 10, None, None, 500) == 500
    assert caught_up_at(8, 10, 8, 400, 500) == 400  # reached the previous log end: caught up then
    assert caught_up_at(7, 10, 8, 400, 500) is None
    assert caught_up_at(7, 10, None, None, 500) is None


def test_lagging_followers_are_those_not_caught_up_for_the_lag_time():
    caught = {2: 1000, 3: 9000}
    assert lagging((1, 2, 3), 1, caught, 10_000, 5000) == [2]
    assert lagging((1, 2, 3), 1, caught, 5000, 5000) == []
    assert lagging((1, 4), 1, caught, 10_000, 5000) == []  # unknown: counts as caught up now


def _check(follower=2, offset=5, **kw):
    args = dict(leader=1, replicas=(1, 2, 3), log_start=3, leader_leo=10, names_leader_epoch=True)
    args.update(kw)
    return follower_fetch_error(follower, offset, **args)


def test_a_follower_fetch_within_the_leaders_log_is_valid():
    for offset in (3, 5, 10):  # log start, middle, log end
        assert _check(offset=offset) == ErrorCode.none
    assert _check(follower=3, replica_epoch=77, registered_epoch=77) == ErrorCode.none
    assert _check(replica_epoch=77, registered_epoch=None) == ErrorCode.none  # not registered: nothing to compare
    assert _check(replica_epoch=-1, registered_epoch=77) == ErrorCode.none  # before Fetch v15: no epoch sent


def test_a_fetch_offset_outside_the_leaders_log_is_out_of_range():
    assert _check(offset=11) == ErrorCode.offset_out_of_range
    assert _check(offset=2**60) == ErrorCode.offset_out_of_range
    assert _check(offset=2) == ErrorCode.offset_out_of_range
    assert _check(offset=-1) == ErrorCode.offset_out_of_range


def test_a_fetch_from_a_broker_that_is_not_a_follower_is_refused():
    assert _check(follower=4) == ErrorCode.unknown_leader_epoch  # names a leader epoch: maybe not known yet
    assert _check(follower=4, names_leader_epoch=False) == ErrorCode.not_leader_or_follower
    assert _check(follower=1, names_leader_epoch=False) == ErrorCode.not_leader_or_follower  # the leader itself
    assert _check(follower=2, replicas=()) == ErrorCode.unknown_leader_epoch


def test_a_fetch_with_another_broker_epoch_than_the_registration_is_refused():
    assert _check(replica_epoch=76, registered_epoch=77) == ErrorCode.not_leader_or_follower
    assert _check(replica_epoch=78, registered_epoch=77) == ErrorCode.not_leader_or_follower
