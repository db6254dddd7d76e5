"""Apache Kafka's Java clients on shoal's SSL (server auth and mutual TLS), SASL_PLAINTEXT and
SASL_SSL listeners, with PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512.

One broker serves every listener type; one JVM (tests/reference/java/SecurityDriver.java)
runs every case: Admin creates a topic, a KafkaProducer and a KafkaConsumer round-trip
records, and on one listener a KafkaShareConsumer reads them too; wrong passwords are refused
with Kafka's SaslAuthenticationException, and a client without a certificate on the
mutual-TLS listener gets nothing. Certificates are made by the test
(tests/support/certs.py) and given to Java as PEM (``ssl.truststore.type=PEM``,
``ssl.keystore.type=PEM``); the SCRAM users are created by the test.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import (
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)

from tests.support.broker import BrokerProcess
from tests.support.certs import make_pki
from tests.support.clients import admin_client
from tests.support.kafka_ref import free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

PLAIN_JAAS = ('org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" '
              'password="admin-secret" user_admin="admin-secret" user_alice="alice-secret";')
LISTENERS = ("TLS", "MTLS", "SASL_PLAINTEXT", "SASL_SSL")


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory, kafka_classpath: str) -> Iterator[tuple[dict[str, int], Path]]:
    from tests.reference.conftest import SHOAL_OVERRIDES, _brokers

    root = tmp_path_factory.mktemp("java-security")
    pki = make_pki(root / "pki")
    ports = {name: free_port() for name in LISTENERS}
    b = BrokerProcess(root / "data", {
        **SHOAL_OVERRIDES,
        "listeners": ",".join(["PLAINTEXT://127.0.0.1:0", *(f"{n}://127.0.0.1:{p}" for n, p in ports.items())]),
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,TLS:SSL,MTLS:SSL,SASL_PLAINTEXT:SASL_PLAINTEXT,"
                                          "SASL_SSL:SASL_SSL",
        "ssl.keystore.location": str(pki.server_pem), "ssl.key.password": pki.key_password,
        "listener.name.mtls.ssl.client.auth": "required", "ssl.truststore.location": str(pki.ca),
        "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512", "sasl.jaas.config": PLAIN_JAAS})
    _brokers[__name__] = b
    b.start()
    try:
        admin = admin_client(b.bootstrap)
        for f in admin.alter_user_scram_credentials([
                UserScramCredentialUpsertion("carol", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096),
                                             b"carol-256"),
                UserScramCredentialUpsertion("dave", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192),
                                             b"dave-512")]).values():
            f.result(timeout=20)
        client_pem = root / "client-all.pem"
        client_pem.write_text(pki.client_key.read_text() + pki.client_cert.read_text())
        (root / "truststore").write_text(f"ssl.truststore.type=PEM\nssl.truststore.location={pki.ca}\n")
        (root / "keystore").write_text(f"ssl.keystore.type=PEM\nssl.keystore.location={client_pem}\n")
        yield ports, root
        b.assert_alive()
    finally:
        try:
            b.stop()
        finally:
            _brokers.pop(__name__, None)


def _sasl(mechanism: str, user: str, password: str) -> str:
    module = "plain.PlainLoginModule" if mechanism == "PLAIN" else "scram.ScramLoginModule"
    return (f"sasl.mechanism={mechanism}\nsasl.jaas.config=org.apache.kafka.common.security.{module} required "
            f'username="{user}" password="{password}";\n')


CASES: dict[str, tuple[str, str]] = {
    # name: (listener, settings; "truststore"/"keystore" stand for the PEM files)
    "ssl": ("TLS", "security.protocol=SSL\ntruststore"),
    "mtls-share": ("MTLS", "security.protocol=SSL\ntruststore\nkeystore"),
    "sasl-plaintext-plain": ("SASL_PLAINTEXT", "security.protocol=SASL_PLAINTEXT\n" +
                             _sasl("PLAIN", "alice", "alice-secret")),
    "sasl-plaintext-scram-256": ("SASL_PLAINTEXT", "security.protocol=SASL_PLAINTEXT\n" +
                                 _sasl("SCRAM-SHA-256", "carol", "carol-256")),
    "sasl-ssl-plain": ("SASL_SSL", "security.protocol=SASL_SSL\ntruststore\n" + _sasl("PLAIN", "alice", "alice-secret")),
    "sasl-ssl-scram-512-share": ("SASL_SSL", "security.protocol=SASL_SSL\ntruststore\n" +
                                 _sasl("SCRAM-SHA-512", "dave", "dave-512")),
    "bad-plain": ("SASL_PLAINTEXT", "security.protocol=SASL_PLAINTEXT\n" + _sasl("PLAIN", "alice", "wrong")),
    "bad-scram-256": ("SASL_PLAINTEXT", "security.protocol=SASL_PLAINTEXT\n" +
                      _sasl("SCRAM-SHA-256", "carol", "wrong")),
    "bad-scram-512": ("SASL_SSL", "security.protocol=SASL_SSL\ntruststore\n" + _sasl("SCRAM-SHA-512", "dave", "wrong")),
    # mutual TLS required, no client certificate: the handshake fails (see the test for what the client sees)
    "bad-mtls-no-certificate": ("MTLS", ("security.protocol=SSL\ntruststore\ndefault.api.timeout.ms=6000\n"
                                         "request.timeout.ms=5000")),
}


def test_java_clients_on_every_listener_type(secured: tuple[dict[str, int], Path], java) -> None:
    ports, root = secured

    def secured_log() -> str:
        return (root / "data.stderr").read_text(errors="replace")

    args = []
    for name, (listener, settings) in CASES.items():
        text = f"bootstrap.servers=127.0.0.1:{ports[listener]}\n"
        for line in settings.splitlines():
            text += (root / line).read_text() if line in ("truststore", "keystore") else line + "\n"
        path = root / f"{name}.properties"
        path.write_text(text)
        args.append(f"{name}={path}")
    proc = java("SecurityDriver").run(*args, timeout=500)
    lines = [line.split(" ", 3) for line in proc.stdout.splitlines()]
    failed = [" ".join(w) for w in lines if w[0] == "F"]
    assert not failed, proc.stdout + proc.stderr[-3000:]
    for name in CASES:
        if name.startswith("bad-"):
            refusal = [w for w in lines if w[0] == "X" and w[1] == name]
            if name == "bad-mtls-no-certificate":
                # The broker ends the handshake without sending TLS's alert, so the Java client sees
                # the connection closed and retries until its timeout, where Kafka's broker makes it
                # fail at once with SslAuthenticationException.
                assert len(refusal) == 1, (name, proc.stdout)
                assert "PEER_DID_NOT_RETURN_A_CERTIFICATE" in secured_log(), "the broker took no certificate"
                continue
            assert len(refusal) == 1 and refusal[0][2] == "SaslAuthenticationException", (name, proc.stdout)
            assert "Authentication failed" in refusal[0][3], refusal
            continue
        want = [f"{name}-{i}" for i in range(3)]
        assert [w[2:] for w in lines if w[0] == "P" and w[1] == name] == [["0", str(i)] for i in range(3)], name
        assert [w[2] for w in lines if w[0] == "R" and w[1] == name] == want, (name, proc.stdout)
        if "share" in name:
            assert sorted(w[2] for w in lines if w[0] == "S" and w[1] == name) == want, (name, proc.stdout)
            assert {w[3] for w in lines if w[0] == "S" and w[1] == name} == {"1"}
        assert ["OK", name] in lines, name
