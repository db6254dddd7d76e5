"""The command-line tools (``shoal topics``, ``configs``, ``produce``, ``consume``,
``share-consume``, ``consumer-groups``, ``share-groups``) run as subprocesses against a
real broker: their output, their exit codes, and one-line failures within ``--timeout``."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.broker import BrokerProcess
from tests.support.clients import create_topic, produce_all, producer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

ROOT = Path(__file__).resolve().parents[2]


def tool(bootstrap: str, name: str, *args: str, stdin: str | None = None,
         timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "shoal", name, "--bootstrap-server", bootstrap, *args],
                          input=stdin, capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def ok(bootstrap: str, name: str, *args: str, stdin: str | None = None) -> str:
    r = tool(bootstrap, name, *args, stdin=stdin)
    assert r.returncode == 0, f"exit {r.returncode}\nstdout: {r.stdout}\nstderr: {r.stderr}"
    return r.stdout


def table(text: str) -> list[list[str]]:
    return [line.split() for line in text.splitlines() if line.strip()]


def test_topics_create_list_describe_alter_delete(shared_broker: BrokerProcess, topic_name: str) -> None:
    bs = shared_broker.bootstrap
    assert ok(bs, "topics", "--create", "--topic", topic_name, "--partitions", "2", "--replication-factor", "1",
              "--config", "retention.ms=3600000") == f"Created topic {topic_name}.\n"
    again = tool(bs, "topics", "--create", "--topic", topic_name)
    assert again.returncode == 1
    assert again.stderr.strip() == f"Error while executing topic command : Topic '{topic_name}' already exists."
    assert ok(bs, "topics", "--create", "--topic", topic_name, "--if-not-exists") == ""

    assert topic_name in ok(bs, "topics", "--list").split("\n")
    assert "__consumer_offsets" not in ok(bs, "topics", "--list", "--exclude-internal")

    lines = ok(bs, "topics", "--describe", "--topic", topic_name).splitlines()
    assert re.fullmatch(rf"Topic: {topic_name}\tTopicId: \S+\tPartitionCount: 2\tReplicationFactor: 1\t"
                        r"Configs: retention.ms=3600000", lines[0]), lines[0]
    assert lines[1].startswith(f"\tTopic: {topic_name}\tPartition: 0\tLeader: 0\tReplicas: 0\tIsr: 0")
    assert lines[2].startswith(f"\tTopic: {topic_name}\tPartition: 1\t")

    assert ok(bs, "topics", "--alter", "--topic", topic_name, "--partitions", "3") == ""
    doc = json.loads(ok(bs, "topics", "--describe", "--topic", topic_name, "--output", "json"))
    assert doc[0]["partition_count"] == 3 and [p["partition"] for p in doc[0]["partitions"]] == [0, 1, 2]
    assert doc[0]["configs"] == {"retention.ms": "3600000"}

    assert ok(bs, "topics", "--delete", "--topic", topic_name) == ""
    gone = tool(bs, "topics", "--delete", "--topic", topic_name)
    assert gone.returncode == 1
    assert gone.stderr.strip() == f"Error while executing topic command : Topic '{topic_name}' does not exist as " \
                                  f"expected"
    assert tool(bs, "topics", "--delete", "--topic", topic_name, "--if-exists").returncode == 0


def test_configs_describe_and_alter(shared_broker: BrokerProcess, topic_name: str) -> None:
    bs = shared_broker.bootstrap
    create_topic(bs, topic_name)
    assert ok(bs, "configs", "--entity-type", "topics", "--entity-name", topic_name, "--alter", "--add-config",
              "retention.ms=5000,cleanup.policy=[delete,compact]") == f"Completed updating config for topic " \
                                                                       f"{topic_name}.\n"
    out = ok(bs, "configs", "--entity-type", "topics", "--entity-name", topic_name, "--describe").splitlines()
    assert out[0] == f"Dynamic configs for topic {topic_name} are:"
    assert out[1].startswith("  cleanup.policy=delete,compact sensitive=false synonyms={DYNAMIC_TOPIC_CONFIG:"
                             "cleanup.policy=delete,compact, DEFAULT_CONFIG:log.cleanup.policy=delete}")
    assert out[2].startswith("  retention.ms=5000 sensitive=false synonyms={DYNAMIC_TOPIC_CONFIG:retention.ms=5000")
    ok(bs, "configs", "--entity-type", "topics", "--entity-name", topic_name, "--alter", "--delete-config",
       "retention.ms")
    out = ok(bs, "configs", "--topic", topic_name, "--describe")
    assert "retention.ms" not in out and "cleanup.policy" in out
    bad = tool(bs, "configs", "--topic", topic_name, "--alter", "--delete-config", "retention.ms")
    assert (bad.returncode, bad.stderr) == (1, "Error: Invalid config(s): retention.ms\n")

    group = f"{topic_name}-g"
    assert ok(bs, "configs", "--entity-type", "groups", "--entity-name", group, "--alter", "--add-config",
              "share.auto.offset.reset=earliest") == f"Completed updating config for group {group}.\n"
    out = ok(bs, "configs", "--entity-type", "groups", "--entity-name", group, "--describe", "--output", "json")
    configs = {c["name"]: c for c in json.loads(out)[0]["configs"]}
    assert configs["share.auto.offset.reset"]["value"] == "earliest"
    assert configs["share.auto.offset.reset"]["source"] == "DYNAMIC_GROUP_CONFIG"

    for kind in ("clients", "users"):  # quotas: none yet, so nothing to print (as Kafka's tool)
        r = tool(bs, "configs", "--entity-type", kind, "--entity-name", "x", "--describe")
        assert r.returncode == 0 and r.stdout == "" and r.stderr == ""


def test_produce_and_consume_with_keys_headers_and_properties(shared_broker: BrokerProcess, topic_name: str) -> None:
    bs = shared_broker.bootstrap
    create_topic(bs, topic_name)
    ok(bs, "produce", "--topic", topic_name, "--property", "parse.key=true", "--property", "parse.headers=true",
       stdin="h1:a,h2:b\tk1\tv1\nh1:c\tk2\tv2\n")
    ok(bs, "produce", "--topic", topic_name, "--property", "parse.key=true", "--property", "key.separator=:",
       stdin="k3:v3\n")
    r = tool(bs, "consume", "--topic", topic_name, "--from-beginning", "--max-messages", "3",
             "--property", "print.key=true", "--property", "print.headers=true", "--property", "print.offset=true",
             "--property", "print.partition=true")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["Partition:0\tOffset:0\th1:a,h2:b\tk1\tv1",
                                     "Partition:0\tOffset:1\th1:c\tk2\tv2",
                                     "Partition:0\tOffset:2\tNO_HEADERS\tk3\tv3"]
    assert r.stderr.splitlines()[-1] == "Processed a total of 3 messages"
    r = tool(bs, "consume", "--topic", topic_name, "--from-beginning", "--timeout-ms", "1000",
             "--property", "print.timestamp=true")
    assert r.returncode == 0
    assert [line.split("\t")[1] for line in r.stdout.splitlines()] == ["v1", "v2", "v3"]
    assert all(re.fullmatch(r"CreateTime:\d+", line.split("\t")[0]) for line in r.stdout.splitlines())

    bad = tool(bs, "produce", "--topic", topic_name, "--property", "parse.key=true", stdin="no separator\n")
    assert bad.returncode == 1
    assert bad.stderr == "Error: No key separator found on line number 1: 'no separator'\n"


def test_consume_with_a_group_commits_and_resumes(shared_broker: BrokerProcess, topic_name: str) -> None:
    bs = shared_broker.bootstrap
    create_topic(bs, topic_name)
    produce_all(producer(bs), topic_name, [{"value": b"a%d" % i} for i in range(5)])
    group = f"{topic_name}-g"
    out = ok(bs, "consume", "--topic", topic_name, "--group", group, "--from-beginning", "--max-messages", "5")
    assert out.split() == [f"a{i}" for i in range(5)]
    rows = table(ok(bs, "consumer-groups", "--describe", "--group", group))
    assert rows[1][:6] == [group, topic_name, "0", "5", "5", "0"]
    produce_all(producer(bs), topic_name, [{"value": b"b"}])
    out = ok(bs, "consume", "--topic", topic_name, "--group", group, "--max-messages", "1")
    assert out == "b\n"


def test_produce_prints_progress_on_long_runs(shared_broker: BrokerProcess, topic_name: str) -> None:
    bs = shared_broker.bootstrap
    lines = "".join(f"line {i}\n" for i in range(3000))
    r = tool(bs, "produce", "--topic", topic_name, "--progress-interval-ms", "1", stdin=lines)
    assert r.returncode == 0, r.stderr
    progress = [ln for ln in r.stderr.splitlines() if ln.startswith(f"produced to {topic_name}: ")]
    assert progress and progress[-1].startswith(f"produced to {topic_name}: 3000 records")
    out = ok(bs, "consume", "--topic", topic_name, "--from-beginning", "--max-messages", "3000")
    assert out.splitlines() == [f"line {i}" for i in range(3000)]


def test_share_consume_accept_release_reject(shared_broker: BrokerProcess, topic_name: str) -> None:
    bs = shared_broker.bootstrap
    create_topic(bs, topic_name)
    group = f"{topic_name}-sg"
    ok(bs, "configs", "--entity-type", "groups", "--entity-name", group, "--alter", "--add-config",
       "share.auto.offset.reset=earliest")
    ok(bs, "produce", "--topic", topic_name, stdin="r0\nr1\nr2\n")
    props = ("--property", "print.offset=true", "--property", "print.delivery=true")
    # Release: the records come back with delivery count 2.
    out = ok(bs, "share-consume", "--topic", topic_name, "--group", group, "--release", "--max-messages", "3",
             *props)
    assert out.splitlines() == ["Offset:0\tDelivery:1\tr0", "Offset:1\tDelivery:1\tr1", "Offset:2\tDelivery:1\tr2"]
    # Reject one, accept the others: nothing is left.
    out = ok(bs, "share-consume", "--topic", topic_name, "--group", group, "--reject", "--max-messages", "1", *props)
    assert out == "Offset:0\tDelivery:2\tr0\n"
    r = tool(bs, "share-consume", "--topic", topic_name, "--group", group, "--timeout-ms", "5000", *props)
    assert r.returncode == 0
    # r1 and r2 again (released once more if the --reject run acquired them beyond --max-messages).
    got = sorted(r.stdout.splitlines())
    assert [re.sub(r"Delivery:[23]", "Delivery:n", line) for line in got] == ["Offset:1\tDelivery:n\tr1",
                                                                             "Offset:2\tDelivery:n\tr2"], got
    assert r.stderr.splitlines()[-1] == f"Processed a total of {len(r.stdout.splitlines())} messages"
    r = tool(bs, "share-consume", "--topic", topic_name, "--group", group, "--timeout-ms", "1000")
    assert (r.returncode, r.stdout) == (0, "")
    rows = table(ok(bs, "share-groups", "--describe", "--group", group))
    assert rows[1] == [group, topic_name, "0", "3", "0"]


def test_group_tools_notices_unknown_groups_and_json(shared_broker: BrokerProcess, topic_name: str) -> None:
    bs = shared_broker.bootstrap
    create_topic(bs, topic_name)
    produce_all(producer(bs), topic_name, [{"value": b"x"} for _ in range(4)])
    group = f"{topic_name}-cg"
    ok(bs, "consume", "--topic", topic_name, "--group", group, "--from-beginning", "--max-messages", "4")

    # Unknown groups: the same wording from both tools, and a non-zero exit.
    for name, kind in (("consumer-groups", "Consumer"), ("share-groups", "Share")):
        r = tool(bs, name, "--describe", "--group", "no-such-group")
        assert r.returncode == 1 and r.stdout == ""
        assert r.stderr == f"Error: {kind} group 'no-such-group' does not exist.\n"

    # A dry run says so; --dry-run and --execute do not warn.
    dry = tool(bs, "consumer-groups", "--reset-offsets", "--group", group, "--topic", topic_name, "--to-earliest")
    assert dry.returncode == 0 and dry.stderr.startswith("WARN: No action will be performed as the --execute "
                                                         "option is missing.")
    assert table(dry.stdout)[1] == [group, topic_name, "0", "0"]
    assert table(ok(bs, "consumer-groups", "--describe", "--group", group))[1][3] == "4"
    r = tool(bs, "consumer-groups", "--reset-offsets", "--group", group, "--topic", topic_name, "--to-earliest",
             "--execute", "--output", "json")
    assert r.returncode == 0 and "WARN" not in r.stderr
    assert json.loads(r.stdout) == [{"group": group, "topic": topic_name, "partition": 0, "new_offset": 0}]
    doc = json.loads(ok(bs, "consumer-groups", "--describe", "--group", group, "--output", "json"))
    assert [(d["partition"], d["current_offset"], d["lag"]) for d in doc] == [(0, 0, 4)]

    # share-groups --reset-offsets refuses to guess the topics, as consumer-groups does.
    share_group = f"{topic_name}-sg"
    ok(bs, "configs", "--group", share_group, "--alter", "--add-config", "share.auto.offset.reset=earliest")
    ok(bs, "share-consume", "--topic", topic_name, "--group", share_group, "--max-messages", "4")
    for name, g in (("consumer-groups", group), ("share-groups", share_group)):
        r = tool(bs, name, "--reset-offsets", "--group", g, "--to-earliest", "--execute")
        assert (r.returncode, r.stdout) == (1, "")
        assert r.stderr == "Error: One of the reset scopes should be defined: --all-topics, --topic.\n"
    r = tool(bs, "share-groups", "--reset-offsets", "--group", share_group, "--topic", topic_name, "--to-earliest",
             "--dry-run")
    assert r.returncode == 0 and r.stderr == "" and table(r.stdout)[1] == [share_group, topic_name, "0", "0"]
    assert share_group in json.dumps(json.loads(ok(bs, "share-groups", "--list", "--output", "json")))
    rows = table(ok(bs, "share-groups", "--describe", "--all-groups", "--state", "--verbose"))
    assert rows[0] == ["GROUP", "COORDINATOR", "STATE", "GROUP-EPOCH", "ASSIGNMENT-EPOCH", "#MEMBERS"]
    assert share_group in [r[0] for r in rows[1:]]


def test_command_config_is_passed_to_the_client(shared_broker: BrokerProcess, tmp_path: Path) -> None:
    props = tmp_path / "client.properties"
    props.write_text("client.id=from-command-config\n")
    r = tool(shared_broker.bootstrap, "share-groups", "--list", "--command-config", str(props), "--verbose")
    assert r.returncode == 0
    assert "client.id from-command-config" in r.stderr
    props.write_text("security.protocol=SSL\n")
    r = tool(shared_broker.bootstrap, "topics", "--list", "--command-config", str(props))
    assert r.returncode == 1 and len(r.stderr.splitlines()) == 1 and "security.protocol=SSL" in r.stderr
    assert "TLS handshake failed" in r.stderr and "PLAINTEXT listener?" in r.stderr, r.stderr


TOOL_ARGS = [
    ("topics", "--list"),
    ("configs", "--entity-type", "topics", "--entity-name", "t", "--describe"),
    ("produce", "--topic", "t"),
    ("consume", "--topic", "t"),
    ("share-consume", "--topic", "t"),
    ("consumer-groups", "--list"),
    ("share-groups", "--list"),
]


@pytest.mark.parametrize("args", TOOL_ARGS, ids=[a[0] for a in TOOL_ARGS])
def test_unreachable_broker_is_one_line_within_timeout(args: tuple[str, ...]) -> None:
    # A port nobody listens on (refused at once), and a listener that never answers (a hang
    # without --timeout): both end with one line and exit code 1 within the timeout; the
    # line names the timeout only when it passed.
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    closed_port = closed.getsockname()[1]
    closed.close()
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)
    try:
        for port in (closed_port, silent.getsockname()[1]):
            start = time.monotonic()
            r = tool(f"127.0.0.1:{port}", args[0], *args[1:], "--timeout", "1500", stdin="x\n", timeout=30)
            elapsed = time.monotonic() - start
            assert r.returncode == 1, r
            assert r.stdout == ""
            lines = r.stderr.splitlines()
            if port == closed_port:
                assert lines == [f"Error: cannot reach a broker at 127.0.0.1:{port}: Connection refused"], r.stderr
            else:
                assert len(lines) == 1 and lines[0].startswith(f"Error: cannot reach a broker at 127.0.0.1:{port} "
                                                               f"within 1500 ms"), r.stderr
                assert elapsed >= 1.5, elapsed
            assert elapsed < 10, elapsed
    finally:
        silent.close()


def test_serve_reads_the_sample_properties_file(tmp_path: Path) -> None:
    from confluent_kafka.admin import ConfigResource, ResourceType

    from shoal.config import load_properties
    from tests.support.clients import admin_client

    sample = ROOT / "config" / "server.properties"
    settings = load_properties(sample.read_text())
    proc = subprocess.Popen([sys.executable, "-m", "shoal", "serve", "--config", str(sample), "--port", "0",
                             "--data-dir", str(tmp_path / "data")], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("listening on 127.0.0.1:"), proc.stderr.read() if proc.poll() is not None else line
        bootstrap = line.split()[-1]
        res = ConfigResource(ResourceType.BROKER, "0")
        admin = admin_client(bootstrap)
        described = admin.describe_configs([res])[res].result(timeout=15)
        for key in ("auto.create.topics.enable", "num.partitions", "log.segment.bytes",
                    "group.share.delivery.count.limit", "group.share.record.lock.duration.ms",
                    "group.initial.rebalance.delay.ms"):
            assert described[key].value == settings[key], key
        # a development broker: a new classic group's first rebalance does not wait (Kafka's sample too)
        assert settings["group.initial.rebalance.delay.ms"] == "0"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
