"""shoal's tools on SSL (mutual TLS), SASL_PLAINTEXT and SASL_SSL listeners, with ``--command-config``.

One broker serves every listener type; each case is a Kafka client properties file, in
Apache Kafka's names (``ssl.truststore.location``, ``ssl.keystore.*``, ``sasl.jaas.config``)
or librdkafka's (``ssl.ca.location``, ``sasl.username``). The tools built on shoal's own
client (share-groups, configs, reassign-partitions, consumer-groups' group requests) and the
ones whose reachability check uses it (topics, console-producer, console-consumer) run
against each listener; a wrong password gets one ``Error:`` line naming the refusal.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import (
    NewTopic,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)

from tests.support.broker import BrokerProcess
from tests.support.certs import Pki, make_pki
from tests.support.clients import admin_client, produce_all, producer
from tests.support.etcd import free_port

pytestmark = pytest.mark.integration

PLAIN_JAAS = ('org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" '
              'password="admin-secret" user_admin="admin-secret" user_alice="alice-secret";')
TOPIC = "secured-tools"
GROUP = "secured-share"


class Secured:
    def __init__(self, broker: BrokerProcess, ports: dict[str, int], pki: Pki, root: Path) -> None:
        self.broker, self.ports, self.pki, self.root = broker, ports, pki, root

    def bootstrap(self, listener: str) -> str:
        return f"127.0.0.1:{self.ports[listener]}"


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    from tests.integration.conftest import _started

    root = tmp_path_factory.mktemp("tools-security")
    pki = make_pki(root / "pki")
    ports = {name: free_port() for name in ("SSL", "SASL_PLAINTEXT", "SASL_SSL")}
    b = BrokerProcess(root / "data", {
        "listeners": ",".join(["PLAINTEXT://127.0.0.1:0", *(f"{n}://127.0.0.1:{p}" for n, p in ports.items())]),
        "ssl.keystore.location": str(pki.server_pem), "ssl.key.password": pki.key_password,
        "listener.name.ssl.ssl.client.auth": "required", "ssl.truststore.location": str(pki.ca),
        "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512", "sasl.jaas.config": PLAIN_JAAS})
    key = f"module:{__name__}"
    _started[key] = [b]
    b.start()
    try:
        admin = admin_client(b.bootstrap)
        admin.create_topics([NewTopic(TOPIC, 2, 1)], operation_timeout=15)[TOPIC].result(timeout=20)
        for f in admin.alter_user_scram_credentials([
                UserScramCredentialUpsertion("carol", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096),
                                             b"carol-256"),
                UserScramCredentialUpsertion("dave", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096),
                                             b"dave-512")]).values():
            f.result(timeout=20)
        produce_all(producer(b.bootstrap), TOPIC, [{"value": f"v{i}".encode(), "partition": i % 2} for i in range(4)])
        yield Secured(b, ports, pki, root)
    finally:
        try:
            b.stop()
        finally:
            _started.pop(key, None)


def _props(s: Secured, case: str, password: str | None = None) -> Path:
    pki = s.pki
    client_pem = s.root / "client-all.pem"
    if not client_pem.exists():
        client_pem.write_text(pki.client_key.read_text() + pki.client_cert.read_text())
    lines = {
        # mutual TLS, Kafka's names: a PEM truststore file and a PEM keystore file of key and chain
        "ssl-mtls": ["security.protocol=SSL", f"ssl.truststore.location={pki.ca}", "ssl.truststore.type=PEM",
                     f"ssl.keystore.location={client_pem}", "ssl.keystore.type=PEM"],
        "sasl-plaintext-plain": ["security.protocol=SASL_PLAINTEXT", "sasl.mechanism=PLAIN",
                                 ("sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required "
                                  f'username="alice" password="{password or "alice-secret"}";')],
        "sasl-plaintext-scram-256": ["security.protocol=SASL_PLAINTEXT", "sasl.mechanism=SCRAM-SHA-256",
                                     "sasl.username=carol", f"sasl.password={password or 'carol-256'}"],
        "sasl-ssl-scram-512": ["security.protocol=SASL_SSL", "sasl.mechanism=SCRAM-SHA-512",
                               ("sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required "
                                f'username="dave" password="{password or "dave-512"}";'),
                               f"ssl.truststore.location={pki.ca}", "ssl.endpoint.identification.algorithm=https"],
        # librdkafka's names
        "sasl-ssl-plain": ["security.protocol=SASL_SSL", "sasl.mechanism=PLAIN", "sasl.username=alice",
                           f"sasl.password={password or 'alice-secret'}", f"ssl.ca.location={pki.ca}"],
    }[case]
    path = s.root / f"{case}-{password or 'ok'}.properties"
    path.write_text("\n".join(lines) + "\n")
    return path


LISTENER = {"ssl-mtls": "SSL", "sasl-plaintext-plain": "SASL_PLAINTEXT", "sasl-plaintext-scram-256": "SASL_PLAINTEXT",
            "sasl-ssl-scram-512": "SASL_SSL", "sasl-ssl-plain": "SASL_SSL"}


def _shoal(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "shoal", *args], capture_output=True, text=True, timeout=90,
                          check=False, input=stdin)


@pytest.mark.parametrize("case", list(LISTENER))
def test_tools_on_a_secured_listener(secured: Secured, case: str) -> None:
    common = ["--bootstrap-server", secured.bootstrap(LISTENER[case]),
              "--command-config", str(_props(secured, case)), "--timeout", "20000"]
    done = _shoal("share-groups", *common, "--list")
    assert done.returncode == 0, done
    done = _shoal("configs", *common, "--describe", "--entity-type", "topics", "--entity-name", TOPIC, "--all")
    assert done.returncode == 0 and "cleanup.policy=delete" in done.stdout, done
    done = _shoal("reassign-partitions", *common, "--list")
    assert done.returncode == 0, done
    done = _shoal("consumer-groups", *common, "--list")
    assert done.returncode == 0, done
    done = _shoal("topics", *common, "--describe", "--topic", TOPIC)
    assert done.returncode == 0 and "PartitionCount: 2" in done.stdout.replace("\t", " "), done


def test_records_and_share_groups_over_sasl_ssl(secured: Secured) -> None:
    case = "sasl-ssl-scram-512"
    common = ["--bootstrap-server", secured.bootstrap("SASL_SSL"), "--command-config", str(_props(secured, case)),
              "--timeout", "20000"]
    done = _shoal("produce", *common, "--topic", TOPIC, "--property", "parse.key=false",
                  stdin="over-tls\n")
    assert done.returncode == 0, done
    done = _shoal("consume", *common, "--topic", TOPIC, "--from-beginning", "--max-messages", "5")
    assert done.returncode == 0 and "over-tls" in done.stdout.split(), done
    done = _shoal("configs", *common, "--alter", "--entity-type", "groups", "--entity-name", GROUP,
                  "--add-config", "share.auto.offset.reset=earliest")
    assert done.returncode == 0, done
    done = _shoal("share-consume", *common, "--topic", TOPIC, "--group", GROUP, "--max-messages", "5",
                  "--timeout-ms", "30000")
    assert done.returncode == 0 and sorted(done.stdout.split()) == ["over-tls", "v0", "v1", "v2", "v3"], done
    done = _shoal("share-groups", *common, "--describe", "--group", GROUP)
    assert done.returncode == 0 and GROUP in done.stdout and TOPIC in done.stdout, done


@pytest.mark.parametrize("case", ["sasl-plaintext-plain", "sasl-plaintext-scram-256", "sasl-ssl-scram-512"])
def test_a_wrong_password_is_one_clear_line(secured: Secured, case: str) -> None:
    common = ["--bootstrap-server", secured.bootstrap(LISTENER[case]),
              "--command-config", str(_props(secured, case, "wrong")), "--timeout", "20000"]
    for tool in (["share-groups", "--list"], ["configs", "--describe", "--entity-type", "topics",
                                              "--entity-name", TOPIC]):
        done = _shoal(*tool[:1], *common, *tool[1:])
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 1 and len(lines) == 1, done
        assert lines[0].startswith("Error: authentication failed at ") and "SASL_AUTHENTICATION_FAILED" in lines[0], done
    secured.broker.assert_alive()


def test_plaintext_client_at_a_tls_listener_and_bad_settings(secured: Secured, tmp_path: Path) -> None:
    # no security.protocol at an SSL listener: a clear error, no hang, no traceback
    done = _shoal("share-groups", "--bootstrap-server", secured.bootstrap("SASL_SSL"), "--timeout", "8000", "--list")
    assert done.returncode == 1 and done.stderr.startswith("Error: cannot reach a broker"), done
    assert "set security.protocol" in done.stderr, done
    assert "Traceback" not in done.stderr, done
    # mutual TLS without a client certificate: refused at the handshake
    props = tmp_path / "no-cert.properties"
    props.write_text(f"security.protocol=SSL\nssl.truststore.location={secured.pki.ca}\n")
    done = _shoal("share-groups", "--bootstrap-server", secured.bootstrap("SSL"), "--command-config", str(props),
                  "--timeout", "8000", "--list")
    assert done.returncode == 1 and len(done.stderr.strip().splitlines()) == 1, done
    assert "require a client certificate" in done.stderr, done
    # a CA that did not sign the broker's certificate
    props.write_text(f"security.protocol=SASL_SSL\nsasl.mechanism=PLAIN\nsasl.username=alice\n"
                     f"sasl.password=alice-secret\nssl.truststore.location={secured.pki.other_ca}\n")
    done = _shoal("share-groups", "--bootstrap-server", secured.bootstrap("SASL_SSL"), "--command-config", str(props),
                  "--timeout", "8000", "--list")
    assert done.returncode == 1 and "TLS handshake failed" in done.stderr and "CERTIFICATE_VERIFY_FAILED" in \
        done.stderr.upper().replace(" ", "_"), done
    # an unsupported mechanism
    props.write_text("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=GSSAPI\n")
    done = _shoal("configs", "--bootstrap-server", secured.bootstrap("SASL_PLAINTEXT"), "--command-config", str(props),
                  "--describe", "--entity-type", "topics", "--entity-name", TOPIC)
    assert done.returncode == 1 and "sasl.mechanism=GSSAPI is not supported" in done.stderr, done
    secured.broker.assert_alive()
