"""Apache Kafka's command-line tools (the classes behind bin/kafka-*.sh) against shoal.

Each call is a real subprocess with the tool's real options; the assertions read the
tool's own output.
"""

from __future__ import annotations

import json
import re

import pytest

from tests.support.kafka_ref import run_tool

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def tool(shoal, name: str, *args: str, input: str | None = None) -> str:
    return run_tool(name, "--bootstrap-server", shoal.bootstrap, *args, input=input).stdout


def table(text: str) -> list[list[str]]:
    """The rows of a tool's whitespace-aligned table, header first."""
    return [line.split() for line in text.splitlines() if line.strip()]


def test_topics_configs_and_console_clients(shoal) -> None:
    assert tool(shoal, "kafka-topics", "--create", "--topic", "tools-t", "--partitions", "2",
                "--config", "retention.ms=100000").strip() == "Created topic tools-t."
    described = tool(shoal, "kafka-topics", "--describe", "--topic", "tools-t")
    assert re.search(r"Topic: tools-t\tTopicId: \S+\tPartitionCount: 2\tReplicationFactor: 1\t"
                     r"Configs: retention.ms=100000", described)
    assert len(re.findall(r"\tTopic: tools-t\tPartition: \d\tLeader: 0\tReplicas: 0\tIsr: 0", described)) == 2
    tool(shoal, "kafka-topics", "--alter", "--topic", "tools-t", "--partitions", "3")
    assert "PartitionCount: 3" in tool(shoal, "kafka-topics", "--describe", "--topic", "tools-t")
    assert "tools-t" in tool(shoal, "kafka-topics", "--list").split()

    assert "Completed updating config for topic tools-t." in tool(
        shoal, "kafka-configs", "--entity-type", "topics", "--entity-name", "tools-t", "--alter",
        "--add-config", "cleanup.policy=compact,retention.ms=200000")
    configs = tool(shoal, "kafka-configs", "--entity-type", "topics", "--entity-name", "tools-t", "--describe")
    assert "cleanup.policy=compact sensitive=false synonyms={DYNAMIC_TOPIC_CONFIG:cleanup.policy=compact" in configs
    assert "retention.ms=200000 sensitive=false synonyms={DYNAMIC_TOPIC_CONFIG:retention.ms=200000" in configs
    tool(shoal, "kafka-configs", "--entity-type", "topics", "--entity-name", "tools-t", "--alter",
         "--delete-config", "cleanup.policy")
    assert "cleanup.policy" not in tool(shoal, "kafka-configs", "--entity-type", "topics", "--entity-name", "tools-t",
                                        "--describe")
    brokers = tool(shoal, "kafka-configs", "--entity-type", "brokers", "--entity-name", "0", "--describe", "--all")
    assert re.search(r"^  num\.partitions=1 sensitive=false", brokers, re.MULTILINE)
    assert re.search(r"^  group\.share\.min\.record\.lock\.duration\.ms=1000 sensitive=false", brokers, re.MULTILINE)

    out = run_tool("kafka-console-producer", "--bootstrap-server", shoal.bootstrap, "--topic", "tools-t",
                   "--reader-property", "parse.key=true", "--reader-property", "key.separator=:",
                   input="k1:v1\nk2:v2\nk3:v3\n")
    assert out.returncode == 0
    consumed = tool(shoal, "kafka-console-consumer", "--topic", "tools-t", "--from-beginning", "--max-messages", "3",
                    "--formatter-property", "print.key=true", "--formatter-property", "print.offset=true",
                    "--group", "tools-cg")
    rows = sorted(line.split("\t")[1:] for line in consumed.splitlines() if line.startswith("Offset:"))
    assert rows == [["k1", "v1"], ["k2", "v2"], ["k3", "v3"]]

    offsets = tool(shoal, "kafka-get-offsets", "--topic", "tools-t")
    assert sum(int(line.rsplit(":", 1)[1]) for line in offsets.split()) == 3
    assert min(offsets.split()).startswith("tools-t:0:")
    assert tool(shoal, "kafka-get-offsets", "--topic", "tools-t", "--time", "-2").split() == [
        "tools-t:0:0", "tools-t:1:0", "tools-t:2:0"]

    dirs = tool(shoal, "kafka-log-dirs", "--describe", "--topic-list", "tools-t")
    doc = json.loads(dirs.splitlines()[-1])
    parts = {p["partition"]: p for d in doc["brokers"][0]["logDirs"] for p in d["partitions"]}
    assert sorted(parts) == ["tools-t-0", "tools-t-1", "tools-t-2"]
    assert sum(p["size"] for p in parts.values()) > 0 and doc["brokers"][0]["logDirs"][0]["error"] is None

    assert "Valid replica already elected for partitions" in tool(
        shoal, "kafka-leader-election", "--election-type", "preferred", "--topic", "tools-t", "--partition", "0")
    assert "No partition reassignments found." in tool(shoal, "kafka-reassign-partitions", "--list")

    tool(shoal, "kafka-topics", "--delete", "--topic", "tools-t")
    assert "tools-t" not in tool(shoal, "kafka-topics", "--list").split()


def test_consumer_groups_tool(shoal) -> None:
    tool(shoal, "kafka-topics", "--create", "--topic", "tools-cg-t", "--partitions", "2")
    run_tool("kafka-console-producer", "--bootstrap-server", shoal.bootstrap, "--topic", "tools-cg-t",
             input="".join(f"m{i}\n" for i in range(6)))
    tool(shoal, "kafka-console-consumer", "--topic", "tools-cg-t", "--from-beginning", "--max-messages", "6",
         "--group", "tools-848", "--consumer-property", "group.protocol=consumer")
    rows = table(tool(shoal, "kafka-consumer-groups", "--describe", "--group", "tools-848"))
    assert rows[0][:6] == ["GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG"]
    body = sorted(r[:6] for r in rows[1:])
    assert sum(int(r[3]) for r in body) == 6 and all(r[3] == r[4] and r[5] == "0" for r in body)
    state = table(tool(shoal, "kafka-consumer-groups", "--describe", "--group", "tools-848", "--state"))
    assert state[1][0] == "tools-848" and state[1][-2:] == ["Empty", "0"]
    assert "tools-848" in tool(shoal, "kafka-consumer-groups", "--list").split()
    reset = table(tool(shoal, "kafka-consumer-groups", "--group", "tools-848", "--topic", "tools-cg-t",
                       "--reset-offsets", "--to-earliest", "--execute"))
    assert sorted(r[1:] for r in reset[1:]) == [["tools-cg-t", "0", "0"], ["tools-cg-t", "1", "0"]]
    rows = table(tool(shoal, "kafka-consumer-groups", "--describe", "--group", "tools-848"))
    assert sorted(r[3] for r in rows[1:]) == ["0", "0"]
    groups = table(tool(shoal, "kafka-groups", "--list"))
    assert ["tools-848", "Consumer", "consumer"] in groups


def test_share_groups_tool_and_console_share_consumer(shoal) -> None:
    tool(shoal, "kafka-topics", "--create", "--topic", "tools-sg-t", "--partitions", "2")
    run_tool("kafka-console-producer", "--bootstrap-server", shoal.bootstrap, "--topic", "tools-sg-t",
             "--producer-property", "partitioner.class=org.apache.kafka.clients.producer.RoundRobinPartitioner",
             input="".join(f"s{i}\n" for i in range(4)))
    assert "Completed updating config for group tools-sg." in tool(
        shoal, "kafka-configs", "--entity-type", "groups", "--entity-name", "tools-sg", "--alter",
        "--add-config", "share.auto.offset.reset=earliest")
    assert "share.auto.offset.reset=earliest" in tool(
        shoal, "kafka-configs", "--entity-type", "groups", "--entity-name", "tools-sg", "--describe")
    got = tool(shoal, "kafka-console-share-consumer", "--topic", "tools-sg-t", "--group", "tools-sg",
               "--max-messages", "4", "--timeout-ms", "60000")
    assert sorted(got.split()) == ["s0", "s1", "s2", "s3"]

    assert "tools-sg" in tool(shoal, "kafka-share-groups", "--list").split()
    rows = table(tool(shoal, "kafka-share-groups", "--describe", "--group", "tools-sg"))
    assert rows[0] == ["GROUP", "TOPIC", "PARTITION", "START-OFFSET", "LAG"]
    start = {r[2]: int(r[3]) for r in rows[1:]}
    assert sorted(start) == ["0", "1"] and sum(start.values()) == 4 and all(r[4] == "0" for r in rows[1:])
    verbose = table(tool(shoal, "kafka-share-groups", "--describe", "--group", "tools-sg", "--offsets", "--verbose"))
    assert verbose[0] == ["GROUP", "TOPIC", "PARTITION", "LEADER-EPOCH", "START-OFFSET", "LAG"]
    state = table(tool(shoal, "kafka-share-groups", "--describe", "--group", "tools-sg", "--state"))
    assert state[0] == ["GROUP", "COORDINATOR", "(ID)", "STATE", "#MEMBERS"]
    assert state[1][0] == "tools-sg" and state[1][-2:] == ["Empty", "0"]
    members = run_tool("kafka-share-groups", "--bootstrap-server", shoal.bootstrap, "--describe", "--group", "tools-sg",
                       "--members")
    assert "Share group 'tools-sg' has no active members." in members.stdout + members.stderr

    reset = table(tool(shoal, "kafka-share-groups", "--reset-offsets", "--group", "tools-sg", "--topic", "tools-sg-t",
                       "--to-earliest", "--execute"))
    assert sorted(r[1:] for r in reset[1:]) == [["tools-sg-t", "0", "0"], ["tools-sg-t", "1", "0"]]
    rows = table(tool(shoal, "kafka-share-groups", "--describe", "--group", "tools-sg", "--offsets"))
    assert sorted((r[2], r[3], r[4]) for r in rows[1:]) == [("0", "0", str(start["0"])), ("1", "0", str(start["1"]))]
    assert table(tool(shoal, "kafka-share-groups", "--delete-offsets", "--group", "tools-sg",
                      "--topic", "tools-sg-t")) == [
        ["TOPIC", "STATUS"], ["tools-sg-t", "Successful"]]
    assert "Deletion of requested share groups ('tools-sg') was successful." in tool(
        shoal, "kafka-share-groups", "--delete", "--group", "tools-sg")
    assert "tools-sg" not in tool(shoal, "kafka-share-groups", "--list").split()
