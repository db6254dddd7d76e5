"""A broker whose contact with etcd had trouble keeps the brokers whose registration lapsed
meanwhile for one session timeout (an outage of the store fences nobody); with working
contact a lapsed registration is a dead broker at once."""

import asyncio

from shoal.cluster.etcd_store import BrokerInfo, EtcdStore, Snapshot


def brokers(*ids: int, stopping: int | None = None) -> Snapshot:
    return Snapshot(brokers={n: BrokerInfo(n, "h", 9000 + n, None, 10 + n, shutting_down=n == stopping)
                             for n in ids})


def store(me: int = 1, grace_s: float = 5.0) -> EtcdStore:
    s = EtcdStore([("127.0.0.1", 1)])
    s._node_id, s._node_key, s.grace_s = me, b"/shoal/brokers/1", grace_s
    s.snapshot = brokers(1, 2, 3)
    return s


def test_with_working_contact_a_lapsed_registration_is_gone_at_once():
    async def run():
        s = store()
        snap = brokers(1, 3)
        s._carry_lapsed(snap)
        return sorted(snap.brokers)

    assert asyncio.run(run()) == [1, 3]


def test_after_trouble_lapsed_brokers_stay_for_one_session_timeout():
    async def run():
        s = store(grace_s=0.2)
        s.note_trouble()
        during = brokers(1)
        s._carry_lapsed(during)
        s.snapshot = during
        await asyncio.sleep(0.3)
        after = brokers(1)
        s._carry_lapsed(after)
        return sorted(during.brokers), during.live(), sorted(after.brokers)

    during, live, after = asyncio.run(run())
    assert during == [1, 2, 3] and live == {1: 11, 2: 12, 3: 13}  # same registration epochs
    assert after == [1]


def test_our_own_lapsed_registration_is_trouble():
    async def run():
        s = store(me=1)
        snap = brokers(3)  # etcd expired every lease, ours too
        s._carry_lapsed(snap)
        s._regrace.cancel()
        return sorted(snap.brokers)

    assert asyncio.run(run()) == [1, 2, 3]


def test_a_broker_that_shut_down_is_not_kept():
    async def run():
        s = store()
        s.snapshot = brokers(1, 2, 3, stopping=2)
        s.note_trouble()
        snap = brokers(1, 3)
        s._carry_lapsed(snap)
        return sorted(snap.brokers)

    assert asyncio.run(run()) == [1, 3]
