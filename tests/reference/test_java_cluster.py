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

from tests.reference.conftest import SHOAL_OVERRIDES
from tests.reference.driver import parse
from tests.reference.test_java_clients import CODECS, records, tagged
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
    info = dict(line.split(" ", 1) for line in tagged_lines(proc.stdout, "I"))
    assert int(info["done"]) == n and int(info["aborts"]) > 0, proc.stdout[-2000:]
    assert Counter(tagged_lines(proc.stdout, "R")) == Counter(f"out-{i}" for i in range(n)), proc.stderr[-3000:]


def tagged_lines(stdout: str, tag: str) -> list[str]:
    return [line[len(tag) + 1:] for line in stdout.splitlines() if line.startswith(tag + " ")]
