"""The console tools take Kafka's option names for a client config file, and every tool
reports a failure as one ``Error: ...`` line, never a raw ``KafkaError{...}``."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.test_tools import ok, tool
from tests.support.broker import BrokerProcess

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


@pytest.mark.parametrize("name,option", [("produce", "--producer.config"), ("produce", "--command-config"),
                                         ("consume", "--consumer.config"), ("consume", "--command-config"),
                                         ("share-consume", "--consumer.config"),
                                         ("share-consume", "--consumer-config"),
                                         ("share-consume", "--command-config")])
def test_console_tools_read_a_client_config_file_under_kafkas_option_names(
        shared_broker: BrokerProcess, topic_name: str, tmp_path: Path, name: str, option: str) -> None:
    bs = shared_broker.bootstrap
    ok(bs, "topics", "--create", "--topic", topic_name)
    props = tmp_path / "client.properties"
    # A setting the client refuses shows that the file was read.
    props.write_text("client.id=from-the-file\nno.such.client.setting=1\n")
    args = ["--topic", topic_name, option, str(props)]
    if name != "produce":
        args += ["--timeout-ms", "500", "--max-messages", "1"]
    r = tool(bs, name, *args, stdin="x\n")
    assert r.returncode == 1, r
    errors = [line for line in r.stderr.splitlines() if line.startswith("Error")]
    assert len(errors) == 1 and "no.such.client.setting" in errors[0], r.stderr
    assert "KafkaError{" not in r.stderr and "%" not in r.stderr.split("Error", 1)[0], r.stderr


def test_deleting_a_group_that_does_not_exist_is_one_readable_line(shared_broker: BrokerProcess) -> None:
    r = tool(shared_broker.bootstrap, "consumer-groups", "--delete", "--group", "never-existed")
    assert r.returncode == 1
    assert "KafkaError{" not in r.stderr, r.stderr
    assert "Error: Deletion of group 'never-existed' failed: " in r.stderr, r.stderr
