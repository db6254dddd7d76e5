"""The leader's replication rules: high watermark, caught-up and lagging followers."""

from shoal.cluster.replication import caught_up_at, high_watermark, lagging


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
