"""Apache Kafka's kafka-acls against shoal's authorizer, over SASL_PLAINTEXT with
``--command-config`` (the admin in ``super.users``; alice may not manage ACLs)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.broker import BrokerProcess
from tests.support.kafka_ref import run_tool

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

JAAS = ('org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" '
        'password="admin-secret" user_admin="admin-secret" user_alice="alice-secret";')


def _client_config(path: Path, user: str) -> Path:
    path.write_text("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\n"
                    "sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required "
                    f'username="{user}" password="{user}-secret";\n')
    return path


@pytest.fixture
def secured(tmp_path: Path, kafka_classpath: str) -> Any:
    b = BrokerProcess(tmp_path / "data", {
        "listeners": "SASL_PLAINTEXT://127.0.0.1:0", "sasl.enabled.mechanisms": "PLAIN", "sasl.jaas.config": JAAS,
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "super.users": "User:admin"})
    b.start()
    try:
        yield b
    finally:
        b.stop()


def test_kafka_acls_adds_lists_and_removes(secured: BrokerProcess, tmp_path: Path) -> None:
    admin = _client_config(tmp_path / "admin.properties", "admin")

    def acls(*args: str, config: Path = admin, check: bool = True) -> Any:
        return run_tool("kafka-acls", "--bootstrap-server", secured.bootstrap, "--command-config", str(config),
                        *args, check=check)

    out = acls("--add", "--allow-principal", "User:alice", "--operation", "Read", "--operation", "Describe",
               "--topic", "orders", "--group", "g1").stdout
    assert "Adding ACLs for resource `ResourcePattern(resourceType=TOPIC, name=orders, patternType=LITERAL)`" in out
    acls("--add", "--deny-principal", "User:bob", "--deny-host", "10.0.0.1", "--operation", "Write",
         "--topic", "pay-", "--resource-pattern-type", "prefixed")
    acls("--add", "--allow-principal", "User:carol", "--consumer", "--topic", "orders", "--group", "cg")
    acls("--add", "--allow-principal", "User:broker", "--operation", "ClusterAction", "--cluster")

    listed = acls("--list", "--topic", "orders").stdout
    assert "(principal=User:alice, host=*, operation=READ, permissionType=ALLOW)" in listed
    assert "(principal=User:alice, host=*, operation=DESCRIBE, permissionType=ALLOW)" in listed
    assert "(principal=User:carol, host=*, operation=READ, permissionType=ALLOW)" in listed
    matched = acls("--list", "--topic", "pay-eu", "--resource-pattern-type", "match").stdout
    assert "ResourcePattern(resourceType=TOPIC, name=pay-, patternType=PREFIXED)" in matched
    assert "(principal=User:bob, host=10.0.0.1, operation=WRITE, permissionType=DENY)" in matched
    assert "(principal=User:broker, host=*, operation=CLUSTER_ACTION, permissionType=ALLOW)" in \
        acls("--list", "--cluster").stdout

    # a transactional producer's ACLs: Write and Describe on the transactional id
    acls("--add", "--allow-principal", "User:dave", "--producer", "--topic", "invoices", "--transactional-id",
         "billing-tx")
    listed = acls("--list", "--transactional-id", "billing-tx").stdout
    assert "ResourcePattern(resourceType=TRANSACTIONAL_ID, name=billing-tx, patternType=LITERAL)" in listed
    assert "(principal=User:dave, host=*, operation=WRITE, permissionType=ALLOW)" in listed
    assert "(principal=User:dave, host=*, operation=DESCRIBE, permissionType=ALLOW)" in listed
    acls("--remove", "--force", "--allow-principal", "User:dave", "--producer", "--topic", "invoices",
         "--transactional-id", "billing-tx")
    assert "User:dave" not in acls("--list").stdout

    acls("--remove", "--force", "--allow-principal", "User:alice", "--operation", "Read", "--topic", "orders")
    listed = acls("--list", "--topic", "orders").stdout
    assert "operation=READ, permissionType=ALLOW)" in listed  # carol's
    assert "(principal=User:alice, host=*, operation=READ" not in listed
    acls("--remove", "--force", "--group", "g1")
    assert "User:alice" not in acls("--list", "--group", "g1").stdout
    everything = acls("--list").stdout
    assert everything.count("(principal=") == 6, everything

    # alice may not manage ACLs: Kafka's tool reports the refusal
    alice = _client_config(tmp_path / "alice.properties", "alice")
    refused = acls("--add", "--allow-principal", "User:alice", "--operation", "All", "--topic", "orders",
                   config=alice, check=False)
    assert "ClusterAuthorizationException" in refused.stdout + refused.stderr, refused.stdout + refused.stderr
    secured.assert_alive()
