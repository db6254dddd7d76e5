"""Apache Kafka's Java clients (KafkaProducer, KafkaConsumer, Admin) against shoal.

One JVM per scenario (tests/reference/java/ClientDriver.java); the assertions are about
what the clients saw.
"""

from __future__ import annotations

from collections import Counter, defaultdict

import pytest

from tests.reference.driver import parse
from tests.support.kafka_ref import run_tool

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

CODECS = ("none", "gzip", "snappy", "lz4", "zstd")


def records(stdout: str) -> list[list[str]]:
    return [line.split(" ", 6) for line in stdout.splitlines() if line.startswith("R ")]


def tagged(stdout: str, tag: str) -> list[list[str]]:
    return [line.split()[1:] for line in stdout.splitlines() if line.startswith(tag + " ")]


def test_idempotent_producer_every_codec_and_headers(shoal, java) -> None:
    n = 200
    proc = java("ClientDriver").run("produce", shoal.bootstrap, "java-codec", f"records={n}")
    by_codec: dict[str, list[list[str]]] = defaultdict(list)
    for _, codec, partition, offset, key, value, headers in records(proc.stdout):
        by_codec[codec].append([partition, offset, key, value, headers])
    assert sorted(by_codec) == sorted(CODECS)
    for codec, got in by_codec.items():
        assert sorted(int(r[3].split("-")[1]) for r in got) == list(range(n)), codec
        for partition, offset, key, value, headers in got:
            i = int(value.split("-")[1])
            assert value == f"{codec}-{i}" and key == f"k{i}" and int(partition) == i % 2
            want = f"codec={codec},i={i}" + (",empty=<null>" if i % 10 == 0 else "")
            assert headers == want, (codec, i, headers)
        # offsets are dense per partition: nothing lost, nothing duplicated by the idempotent producer
        for p in (0, 1):
            assert sorted(int(r[1]) for r in got if r[0] == str(p)) == list(range(n // 2))


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_group_subscribe_commit_rebalance(shoal, java, protocol: str) -> None:
    """Two KafkaConsumers (group.protocol=classic or consumer): one alone, then a second joins;
    the partitions are split between them, every record is consumed, the commits land."""
    topic = f"java-group-{protocol}"
    run_tool("kafka-topics", "--bootstrap-server", shoal.bootstrap, "--create", "--topic", topic, "--partitions", "4")
    proc = java("ClientDriver").run("group", shoal.bootstrap, topic, f"protocol={protocol}", "records=400",
                                    f"group=java-{protocol}")
    got = Counter(r[5] for r in records(proc.stdout))
    assert sorted(got, key=int) == [str(i) for i in range(400)]
    assignments = tagged(proc.stdout, "A")
    assert assignments[0] == ["a", "0", "1", "2", "3"]  # alone: every partition
    final = {a[0]: set(a[1:]) for a in assignments[1:]}
    assert final["a"] and final["b"] and final["a"] | final["b"] == {"0", "1", "2", "3"} and not final["a"] & final["b"]
    assert tagged(proc.stdout, "K") == [[str(p), "100"] for p in range(4)]
    kind = "Classic" if protocol == "classic" else "Consumer"
    assert tagged(proc.stdout, "I") == [["group", kind, "Empty", "0"]]
    if protocol == "classic":
        assert tagged(proc.stdout, "E") == [] and set(got.values()) == {1}


def test_seek_and_offsets_for_times(shoal, java) -> None:
    run_tool("kafka-topics", "--bootstrap-server", shoal.bootstrap, "--create", "--topic", "java-seek")
    proc = java("ClientDriver").run("seek", shoal.bootstrap, "java-seek", "records=100")
    assert records(proc.stdout) == [["R", "seek42", "0", "42", "k42", "42", "-"]]
    assert tagged(proc.stdout, "T") == [
        ["0", "0", "0", "0"], ["50000", "0", "50", "50000"], ["50500", "0", "51", "51000"],
        ["99000", "0", "99", "99000"], ["100000", "0", "null"],
        ["begin", "0", "0"], ["end", "0", "100"], ["position", "0", "100"]]


@pytest.fixture(scope="module")
def share_group(shoal, java) -> str:
    """A share group that consumed 10 records of java-share-admin (implicit mode)."""
    run_tool("kafka-topics", "--bootstrap-server", shoal.bootstrap, "--create", "--topic", "java-share-admin")
    out = parse(java("ShareDriver").run("implicit", shoal.bootstrap, "java-share-admin", "java-sg", "produce=10",
                                        "records=10", "consumers=1"))
    assert out.errors == [] and out.start_offsets == {0: (10, 0)}
    return "java-sg"


def test_admin_topics_partitions_configs_groups(shoal, java, share_group: str) -> None:
    # a classic group with committed offsets, for listGroups
    run_tool("kafka-topics", "--bootstrap-server", shoal.bootstrap, "--create", "--topic", "java-admin-src")
    run_tool("kafka-consumer-groups", "--bootstrap-server", shoal.bootstrap, "--group", "java-admin-classic",
             "--topic", "java-admin-src", "--reset-offsets", "--to-earliest", "--execute")
    proc = java("ClientDriver").run("admin", shoal.bootstrap, "java-admin", "broker=0")
    info = [" ".join(x) for x in tagged(proc.stdout, "I")]
    errors = [" ".join(x) for x in tagged(proc.stdout, "E")]
    assert errors[0].startswith("recreate TopicExistsException")
    assert errors[1].startswith("shrink InvalidPartitionsException")
    assert errors[2].startswith("badconfig InvalidConfigurationException")
    assert any(x.startswith("describe java-admin 5 false ") for x in info)
    assert "list true" in info
    assert "config cleanup.policy compact DYNAMIC_TOPIC_CONFIG" in info
    assert "config retention.ms 604800000 DEFAULT_CONFIG" in info
    assert "brokerconfig num.partitions 1" in info
    assert "cluster 1 true" in info
    assert f"group {share_group} Share share" in info
    assert "group java-admin-classic Classic" in info  # only committed offsets: no protocol type
    of = {x.split()[1]: x.split()[2].split(",") if len(x.split()) > 2 else []
          for x in info if x.startswith("groups-of")}
    assert share_group in of["Share"] and share_group not in of["Classic"] and share_group not in of["Consumer"]
    assert "java-admin-classic" in of["Classic"] and "java-admin-classic" not in of["Share"]
    assert "deleted true" in info


def test_admin_share_group_offsets(shoal, java, share_group: str) -> None:
    proc = java("ClientDriver").run("share-admin", shoal.bootstrap, "java-share-admin", f"group={share_group}")
    lines = [" ".join(x) for x in tagged(proc.stdout, "I") + tagged(proc.stdout, "E")]
    assert lines[:3] == [f"describe {share_group} Empty 0 2",  # state, members, group epoch
                         "offsets java-share-admin-0 10 0",     # start offset, lag
                         "altered java-share-admin-0 3 7"]
    assert "after-delete-offsets 0 0" in lines
    errors = sorted(x for x in lines if x.split()[0] in ("alter-out-of-range", "describe-missing", "describe-deleted"))
    assert [e.split()[:2] for e in errors] == [["alter-out-of-range", "OffsetOutOfRangeException"],
                                               ["describe-deleted", "GroupIdNotFoundException"],
                                               ["describe-missing", "GroupIdNotFoundException"]], errors
