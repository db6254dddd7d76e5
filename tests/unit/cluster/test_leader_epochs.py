"""The leader-epoch cache and the follower's truncation rule."""

from shoal.cluster.leader_epochs import UNDEFINED, LeaderEpochCache, divergence_offset


def test_assign_keeps_epochs_and_offsets_growing():
    c = LeaderEpochCache()
    assert c.assign(0, 0)
    assert not c.assign(0, 5)
    assert c.assign(2, 10)
    assert not c.assign(1, 12)
    assert c.entries == [(0, 0), (2, 10)]
    assert c.assign(3, 10)  # epoch 2 wrote nothing: superseded
    assert c.entries == [(0, 0), (3, 10)]


def test_end_offset_for_an_epoch():
    c = LeaderEpochCache([(0, 0), (2, 10), (4, 30)])
    assert c.end_offset_for(4, 45) == (4, 45)
    assert c.end_offset_for(7, 45) == (4, 45)
    assert c.end_offset_for(2, 45) == (2, 30)
    assert c.end_offset_for(3, 45) == (2, 30)
    assert c.end_offset_for(0, 45) == (0, 10)
    assert LeaderEpochCache([(3, 5)]).end_offset_for(1, 9) == UNDEFINED


def test_checkpoint_text_round_trip_and_kafka_layout():
    c = LeaderEpochCache([(0, 0), (2, 10)])
    assert c.to_text() == "0\n2\n0 0\n2 10\n"
    assert LeaderEpochCache.from_text(c.to_text()).entries == c.entries
    assert LeaderEpochCache.from_text("garbage").entries == []


def test_truncate_from_end():
    c = LeaderEpochCache([(0, 0), (2, 10), (4, 30)])
    c.truncate_from_end(30)
    assert c.entries == [(0, 0), (2, 10)]


def test_follower_cuts_the_tail_the_new_leader_never_had():
    # follower wrote epoch 2 at 10.. (never replicated); the new leader has epoch 1 from 5 to 20
    follower = LeaderEpochCache([(0, 0), (2, 10)])
    leader = LeaderEpochCache([(0, 0), (1, 5), (3, 20)])
    epoch, end = leader.end_offset_for(follower.latest_epoch, 25)
    assert (epoch, end) == (1, 20)
    assert divergence_offset(follower, epoch, end, 14) == 10
    # same latest epoch: keep up to the shorter log
    same = LeaderEpochCache([(0, 0), (1, 5)])
    assert divergence_offset(same, *leader.end_offset_for(1, 25), 24) == 20
    assert divergence_offset(same, 1, 30, 24) == 24
    assert divergence_offset(same, -1, -1, 24) == 0


def test_a_follower_takes_the_epochs_of_the_batches_it_appends():
    c = LeaderEpochCache([(0, 0), (2, 10)])
    assert not c.follow(2, 15)  # the same epoch continues
    assert c.follow(3, 20)
    assert c.entries == [(0, 0), (2, 10), (3, 20)]
    # it led epoch 4 from 30 without writing; the next leader had epoch-3 batches there
    c = LeaderEpochCache([(0, 0), (3, 20), (4, 30)])
    assert c.follow(3, 30)
    assert c.entries == [(0, 0), (3, 20)]
    assert c.follow(5, 35)
    assert c.entries == [(0, 0), (3, 20), (5, 35)]
    # an entry where nothing was written is replaced by the batch's epoch at the same offset
    c = LeaderEpochCache([(0, 0), (4, 30)])
    assert c.follow(1, 30)
    assert c.entries == [(0, 0), (1, 30)]
    assert not LeaderEpochCache().follow(-1, 0)
