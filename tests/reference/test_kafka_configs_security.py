"""Apache Kafka's kafka-configs against shoal over a SASL listener: SCRAM users and client quotas.

The tool runs as a real subprocess with ``--command-config`` holding SASL settings, as an
administrator would run it; the assertions read its own output, and what it set is
checked by logging in as the new user and with shoal's own view of the quotas.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import KafkaException

from tests.support.broker import BrokerProcess
from tests.support.clients import admin_client
from tests.support.kafka_ref import free_port, run_tool

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

JAAS = ('org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" '
        'password="admin-secret" user_admin="admin-secret";')


@pytest.fixture(scope="module")
def sasl_broker(tmp_path_factory: pytest.TempPathFactory, kafka_classpath: str) -> Iterator[tuple[BrokerProcess, str]]:
    port = free_port()
    b = BrokerProcess(tmp_path_factory.mktemp("shoal-sasl") / "data", {
        "listeners": f"PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:{port}",
        "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512",
        "listener.name.sasl_plaintext.plain.sasl.jaas.config": JAAS,
        "super.users": "User:admin",
    })
    b.start()
    try:
        yield b, f"127.0.0.1:{port}"
    finally:
        b.stop()


def _properties(path: Path, mechanism: str, user: str, password: str) -> str:
    module = "plain.PlainLoginModule" if mechanism == "PLAIN" else "scram.ScramLoginModule"
    path.write_text("security.protocol=SASL_PLAINTEXT\n"
                    f"sasl.mechanism={mechanism}\n"
                    f"sasl.jaas.config=org.apache.kafka.common.security.{module} required "
                    f'username="{user}" password="{password}";\n')
    return str(path)


def test_kafka_configs_over_sasl_manages_scram_users_and_quotas(sasl_broker: tuple[BrokerProcess, str],
                                                                 tmp_path: Path) -> None:
    b, sasl = sasl_broker
    admin = _properties(tmp_path / "admin.properties", "PLAIN", "admin", "admin-secret")

    def configs(*args: str, config: str = admin, check: bool = True):  # type: ignore[no-untyped-def]
        return run_tool("kafka-configs", "--bootstrap-server", sasl, "--command-config", config, *args, check=check)

    out = configs("--alter", "--entity-type", "users", "--entity-name", "alice", "--add-config",
                  "SCRAM-SHA-256=[iterations=8192,password=alice-secret],SCRAM-SHA-512=[password=alice-512]").stdout
    assert "Completed updating config for user alice." in out
    out = configs("--alter", "--entity-type", "users", "--entity-name", "alice", "--add-config",
                  "producer_byte_rate=1048576,consumer_byte_rate=2097152").stdout
    assert "Completed updating config for user alice." in out
    configs("--alter", "--entity-type", "users", "--entity-name", "alice", "--entity-type", "clients",
            "--entity-name", "app", "--add-config", "request_percentage=25")
    out = configs("--alter", "--entity-type", "clients", "--entity-default", "--add-config",
                  "producer_byte_rate=65536").stdout
    assert "Completed updating default config for clients in the cluster." in out

    described = configs("--describe", "--entity-type", "users", "--entity-name", "alice").stdout
    quota_line = next(line for line in described.splitlines() if line.startswith("Quota configs for user-principal"))
    assert quota_line.startswith("Quota configs for user-principal 'alice' are ")
    assert sorted(quota_line.split(" are ")[1].split(", ")) == ["consumer_byte_rate=2097152.0",
                                                               "producer_byte_rate=1048576.0"]
    scram_line = next(line for line in described.splitlines() if line.startswith("SCRAM credential configs"))
    assert sorted(scram_line.split(" are ")[1].split(", ")) == ["SCRAM-SHA-256=iterations=8192",
                                                               "SCRAM-SHA-512=iterations=4096"]
    both = configs("--describe", "--entity-type", "users", "--entity-name", "alice", "--entity-type", "clients",
                   "--entity-name", "app").stdout
    assert "Quota configs for user-principal 'alice', client-id 'app' are request_percentage=25.0" in both
    defaults = configs("--describe", "--entity-type", "clients", "--entity-default").stdout
    assert "Quota configs for the default client-id are producer_byte_rate=65536.0" in defaults

    # the credentials it set log alice in; the quotas are the broker's, seen over PLAINTEXT too
    conf = {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-256", "sasl.username": "alice",
            "sasl.password": "alice-secret"}
    assert admin_client(sasl, **conf).list_topics(timeout=20).brokers
    plain = run_tool("kafka-configs", "--bootstrap-server", b.bootstrap, "--describe", "--entity-type", "clients",
                     "--entity-default").stdout
    assert "Quota configs for the default client-id are producer_byte_rate=65536.0" in plain

    # deleting: one SCRAM mechanism, then one quota key (the tool does one kind at a time)
    configs("--alter", "--entity-type", "users", "--entity-name", "alice", "--delete-config", "SCRAM-SHA-512")
    configs("--alter", "--entity-type", "users", "--entity-name", "alice", "--delete-config", "producer_byte_rate")
    described = configs("--describe", "--entity-type", "users", "--entity-name", "alice").stdout
    assert "Quota configs for user-principal 'alice' are consumer_byte_rate=2097152.0" in described
    assert re.search(r"SCRAM credential configs for user-principal 'alice' are SCRAM-SHA-256=iterations=8192$",
                     described, re.MULTILINE)

    # alice is neither a broker nor a super user: she may not read or change quotas or users
    alice = _properties(tmp_path / "alice.properties", "SCRAM-SHA-256", "alice", "alice-secret")
    refused = configs("--alter", "--entity-type", "clients", "--entity-name", "mine", "--add-config",
                      "producer_byte_rate=1", config=alice, check=False)
    assert refused.returncode != 0
    assert "ClusterAuthorizationException" in refused.stdout + refused.stderr
    with pytest.raises(KafkaException):  # her SCRAM-SHA-512 credential is gone
        admin_client(sasl, **{**conf, "sasl.mechanism": "SCRAM-SHA-512", "sasl.password": "alice-512"}) \
            .list_topics(timeout=5)
