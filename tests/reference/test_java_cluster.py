"""Apache Kafka's Java clients against a three-broker shoal cluster (one etcd).

The same drivers as the single-broker tests: topics whose partitions are led by different
brokers, a KIP-848 and a classic group, and KafkaShareConsumers on a replicated partition
whose leader, group coordinator and share coordinator may be three different brokers.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from shoal.client.connection import Connection
from tests.reference.conftest import SHOAL_OVERRIDES
from tests.reference.driver import parse
from tests.reference.test_java_clients import CODECS, records, tagged
from tests.reference.test_java_transactions import assert_every_input_once, ctp_through_a_kill
from tests.support.clients import wait_until
from tests.support.cluster import LocalCluster
from tests.support.kafka_ref import run_tool

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, kafka_classpath: str) -> Iterator[LocalCluster]:
    with LocalCluster(Path(tmp_path_factory.mktemp("java-cluster")), brokers=3, overrides=SHOAL_OVERRIDES) as c:
        yield c


def test_producer_every_codec_on_a_cluster(cluster: LocalCluster, java) -> None:
    n = 100
    proc = java("ClientDriver").run("produce", cluster.bootstrap, "jc-codec", f"records={n}")
    got: dict[str, list[tuple[int, int, int]]] = {}
    for _, codec, partition, offset, _key, value, _headers in records(proc.stdout):
        got.setdefault(codec, []).append((int(partition), int(offset), int(value.split("-")[1])))
    assert sorted(got) == sorted(CODECS)
    for codec, rows in got.items():
        assert sorted(i for _, _, i in rows) == list(range(n)), codec
        for p in (0, 1):  # dense offsets per partition: nothing lost or written twice
            assert sorted(o for q, o, _ in rows if q == p) == list(range(n // 2)), (codec, p)


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_group_rebalance_on_a_cluster(cluster: LocalCluster, java, protocol: str) -> None:
    topic = f"jc-group-{protocol}"
    run_tool("kafka-topics", "--bootstrap-server", cluster.bootstrap, "--create", "--topic", topic,
             "--partitions", "4", "--replication-factor", "3")
    proc = java("ClientDriver").run("group", cluster.bootstrap, topic, f"protocol={protocol}", "records=400",
                                    f"group=jc-{protocol}")
    got = Counter(r[5] for r in records(proc.stdout))
    assert sorted(got, key=int) == [str(i) for i in range(400)]
    final = {a[0]: set(a[1:]) for a in tagged(proc.stdout, "A")[1:]}
    assert final["a"] | final["b"] == {"0", "1", "2", "3"} and not final["a"] & final["b"]
    assert tagged(proc.stdout, "K") == [[str(p), "100"] for p in range(4)]


def test_share_consumers_on_a_cluster(cluster: LocalCluster, java) -> None:
    """Four explicit-mode KafkaShareConsumers on a partition replicated three times."""
    n = 5000
    run_tool("kafka-topics", "--bootstrap-server", cluster.bootstrap, "--create", "--topic", "jc-share",
             "--partitions", "1", "--replication-factor", "3")
    out = parse(java("ShareDriver").run("explicit", cluster.bootstrap, "jc-share", "jc-share-g", f"produce={n}",
                                        f"records={n}", "consumers=4", "release=50", "reject=100",
                                        "timeout.ms=200000", timeout=260))
    assert out.errors == [], out.errors[:10]
    seen = out.by_value()
    assert set(seen) == {str(i) for i in range(n)}
    for i in range(n):
        got = [(d.delivery_count, d.action) for d in seen[str(i)]]
        want = [(1, "J")] if i % 100 == 1 else [(1, "R"), (2, "A")] if i % 50 == 0 else [(1, "A")]
        assert got == want, (i, got)
    assert out.start_offsets == {0: (n, 0)}


def test_transactions_of_version_2_on_a_cluster(cluster: LocalCluster, java) -> None:
    """KafkaProducer with transaction version 2 (finalized by shoal): the partition leaders
    add the partitions (AddPartitionsToTxn v5 to the coordinator, often another broker),
    the group coordinator the offsets partition (TxnOffsetCommit v5), EndTxn v5 bumps the
    epoch; consume-transform-produce with random aborts delivers every input once."""
    src, dst, n = "jc-tx-in", "jc-tx-out", 600
    for t in (src, dst):
        run_tool("kafka-topics", "--bootstrap-server", cluster.bootstrap, "--create", "--topic", t,
                 "--partitions", "2", "--replication-factor", "3")
    proc = java("TxnDriver").run("ctp", cluster.bootstrap, src, dst, str(n), "classic")
    assert_every_input_once(proc.stdout, proc.stderr, n)


def test_transactions_of_version_2_survive_the_coordinators_kill(tmp_path: Path, java) -> None:
    """The same loop while the broker coordinating its transactional id is killed with
    SIGKILL in the middle: the Java client finds the new coordinator (which finishes or
    aborts what was left) and the output still holds every input exactly once."""
    src, dst, n = "jk-tx-in", "jk-tx-out", 3000
    with LocalCluster(tmp_path, brokers=3, overrides=SHOAL_OVERRIDES) as c:
        for t in (src, dst):
            run_tool("kafka-topics", "--bootstrap-server", c.bootstrap, "--create", "--topic", t,
                     "--partitions", "2", "--replication-factor", "3")
        victim: list[int] = []

        def kill() -> None:
            """Some transactions committed (the consumer group has offsets): kill the coordinator."""
            victim.append(wait_until("the coordinator", lambda: _txn_coordinator(c, "java-ctp-classic"), timeout_s=30))
            c.broker_for(victim[0]).kill()

        ctp_through_a_kill(java, c.bootstrap, src, dst, n, 300, kill)
        assert _txn_coordinator(c, "java-ctp-classic") not in (victim[0], None)



def _txn_coordinator(c: LocalCluster, txn_id: str) -> int | None:
    for b in c.brokers:
        if not b.is_alive():
            continue
        try:
            with Connection.to(b.bootstrap, timeout_s=5) as conn:
                r = conn.call(10, 4, key_type=1, coordinator_keys=(txn_id,)).coordinators[0]
        except (OSError, ConnectionError):
            continue
        return int(r.node_id) if int(r.error_code) == 0 else None
    return None

