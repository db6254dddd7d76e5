"""TLS and SASL listeners, driven by confluent-kafka, kafka-python, kcat and raw requests.

Every certificate is made by the test (tests/support/certs.py); every SCRAM user is
created through AlterUserScramCredentials or ``shoal users``.
"""

from __future__ import annotations

import shutil
import ssl
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import NewTopic, ScramCredentialInfo, ScramMechanism, UserScramCredentialDeletion, \
    UserScramCredentialUpsertion

from tests.support.broker import BrokerProcess
from tests.support.certs import Pki, make_pki
from tests.support.clients import admin_client, produce_all, producer, records_of, wait_until
from tests.support.etcd import free_port

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def _tls_settings(pki: Pki, prefix: str = "") -> dict[str, str]:
    """A PEM keystore file with an encrypted key."""
    return {f"{prefix}ssl.keystore.location": str(pki.server_pem), f"{prefix}ssl.key.password": pki.key_password}


def _listeners(**ports: int) -> str:
    return ",".join(f"{name}://127.0.0.1:{port}" for name, port in ports.items())


def _ssl_conf(pki: Pki, *, client_cert: bool = False, **extra: Any) -> dict[str, Any]:
    conf: dict[str, Any] = {"security.protocol": "SSL", "ssl.ca.location": str(pki.ca)}
    if client_cert:
        conf.update({"ssl.certificate.location": str(pki.client_cert), "ssl.key.location": str(pki.client_key)})
    conf.update(extra)
    return conf


def _round_trip(bootstrap: str, topic: str, conf: dict[str, Any], n: int = 5) -> list[bytes]:
    """Create ``topic``, produce ``n`` records and read them back, all with ``conf``."""
    admin = admin_client(bootstrap, **conf)
    admin.create_topics([NewTopic(topic, 1, 1)], operation_timeout=15)[topic].result(timeout=20)
    p = producer(bootstrap, **conf)
    produce_all(p, topic, [{"value": f"v{i}".encode()} for i in range(n)])
    return [r.value for r in records_of(bootstrap, topic, [0], n, **conf)]


@pytest.fixture
def started(request: pytest.FixtureRequest) -> Any:
    """Start a BrokerProcess made by the test; stopped at the end, its stderr in a failure's report."""
    from tests.integration.conftest import _started

    brokers: list[BrokerProcess] = []
    _started[request.node.nodeid] = brokers

    def start(_request: Any, b: BrokerProcess) -> BrokerProcess:
        brokers.append(b)
        return b.start()

    yield start
    try:
        for b in brokers:
            b.stop()
    finally:
        _started.pop(request.node.nodeid, None)


def _log_has(b: Any, text: str) -> bool:
    return text in b.stderr_path.read_text(errors="replace")


# -- TLS ---------------------------------------------------------------------------------------


def test_ssl_listener_beside_plaintext_serves_confluent_and_kafka_python(start_broker: Any, pki: Pki,
                                                                         topic_name: str) -> None:
    ssl_port = free_port()
    b = start_broker({"listeners": _listeners(PLAINTEXT=0, SSL=ssl_port), **_tls_settings(pki)})
    ssl_bootstrap = f"127.0.0.1:{ssl_port}"
    assert _round_trip(ssl_bootstrap, topic_name, _ssl_conf(pki)) == [f"v{i}".encode() for i in range(5)]

    # Metadata names the port of the listener the request came in on
    md = admin_client(ssl_bootstrap, **_ssl_conf(pki)).list_topics(timeout=10)
    assert [(x.host, x.port) for x in md.brokers.values()] == [("127.0.0.1", ssl_port)]
    md = admin_client(b.bootstrap).list_topics(timeout=10)
    assert [(x.host, x.port) for x in md.brokers.values()] == [("127.0.0.1", b.port)]

    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    kp = KafkaProducer(bootstrap_servers=ssl_bootstrap, security_protocol="SSL", ssl_cafile=str(pki.ca))
    kp.send(topic_name, b"from kafka-python").get(timeout=20)
    kp.close()
    kc = KafkaConsumer(bootstrap_servers=ssl_bootstrap, security_protocol="SSL", ssl_cafile=str(pki.ca),
                       consumer_timeout_ms=10_000)
    kc.assign([TopicPartition(topic_name, 0)])
    kc.seek(TopicPartition(topic_name, 0), 5)
    assert [m.value for m in kc][:1] == [b"from kafka-python"]
    kc.close()

    # a TLS client on the PLAINTEXT port, and a plaintext client on the SSL port, get nowhere;
    # the broker goes on serving
    with pytest.raises(KafkaException):
        admin_client(b.bootstrap, **_ssl_conf(pki)).list_topics(timeout=3)
    with pytest.raises(KafkaException):
        admin_client(ssl_bootstrap).list_topics(timeout=3)
    b.assert_alive()
    assert admin_client(ssl_bootstrap, **_ssl_conf(pki)).list_topics(timeout=10).topics


def test_ssl_only_listener_with_pkcs12_keystore(start_broker: Any, pki: Pki, topic_name: str) -> None:
    b = start_broker({"listeners": "SSL://127.0.0.1:0", "ssl.keystore.type": "PKCS12",
                      "ssl.keystore.location": str(pki.server_p12), "ssl.keystore.password": pki.store_password})
    assert _round_trip(b.bootstrap, topic_name, _ssl_conf(pki), 3) == [b"v0", b"v1", b"v2"]
    # TLS 1.2 and 1.3 only
    ctx = ssl.create_default_context(cafile=str(pki.ca))
    ctx.maximum_version = ssl.TLSVersion.TLSv1_1
    ctx.minimum_version = ssl.TLSVersion.MINIMUM_SUPPORTED
    import socket

    with socket.create_connection(("127.0.0.1", b.port), timeout=10) as raw:
        with pytest.raises((ssl.SSLError, ConnectionError)):
            ctx.wrap_socket(raw, server_hostname="127.0.0.1")
    ctx13 = ssl.create_default_context(cafile=str(pki.ca))
    with socket.create_connection(("127.0.0.1", b.port), timeout=10) as raw:
        with ctx13.wrap_socket(raw, server_hostname="127.0.0.1") as s:
            assert s.version() in ("TLSv1.2", "TLSv1.3")


def test_mutual_tls_required_with_inline_pem_keystore(started: Any, request: Any, tmp_path: Path, pki: Pki,
                                                      topic_name: str) -> None:
    b = started(request, BrokerProcess(tmp_path / "data", {
        "listeners": "SSL://127.0.0.1:0", "ssl.keystore.type": "PEM", "ssl.keystore.key": pki.server_key.read_text(),
        "ssl.keystore.certificate.chain": pki.server_cert.read_text(), "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(pki.ca), "ssl.client.auth": "required"}, log_level="DEBUG"))
    logged = b.stderr_path.read_text()
    assert "BEGIN PRIVATE KEY" not in logged[logged.index(" INFO "):]  # the broker does not log the key
    conf = _ssl_conf(pki, client_cert=True)
    assert _round_trip(b.bootstrap, topic_name, conf, 2) == [b"v0", b"v1"]
    # the certificate's subject is the principal
    wait_until("the principal in the log", lambda: _log_has(b, f"User:{pki.client_subject}"))
    # without a client certificate the handshake fails
    with pytest.raises(KafkaException):
        admin_client(b.bootstrap, **_ssl_conf(pki)).list_topics(timeout=3)

    from kafka import KafkaProducer

    kp = KafkaProducer(bootstrap_servers=b.bootstrap, security_protocol="SSL", ssl_cafile=str(pki.ca),
                       ssl_certfile=str(pki.client_cert), ssl_keyfile=str(pki.client_key))
    kp.send(topic_name, b"mtls").get(timeout=20)
    kp.close()
    assert records_of(b.bootstrap, topic_name, [0], 1, start=2, **conf)[0].value == b"mtls"


def test_client_certificate_requested_is_optional(start_broker: Any, pki: Pki, topic_name: str) -> None:
    b = start_broker({"listeners": "SSL://127.0.0.1:0", **_tls_settings(pki),
                      "ssl.truststore.location": str(pki.ca), "ssl.client.auth": "requested"})
    assert _round_trip(b.bootstrap, topic_name, _ssl_conf(pki), 1) == [b"v0"]
    assert admin_client(b.bootstrap, **_ssl_conf(pki, client_cert=True)).list_topics(timeout=10).topics


@pytest.mark.skipif(shutil.which("kcat") is None, reason="kcat is not installed")
def test_kcat_over_ssl(start_broker: Any, pki: Pki, topic_name: str) -> None:
    b = start_broker({"listeners": "SSL://127.0.0.1:0", **_tls_settings(pki)})
    ssl_opts = ["-X", "security.protocol=SSL", "-X", f"ssl.ca.location={pki.ca}"]
    subprocess.run(["kcat", "-b", b.bootstrap, *ssl_opts, "-P", "-t", topic_name], input=b"a\nb\n",
                   check=True, timeout=30)
    out = subprocess.run(["kcat", "-b", b.bootstrap, *ssl_opts, "-C", "-t", topic_name, "-e", "-c", "2"],
                         capture_output=True, check=True, timeout=30)
    assert out.stdout.split() == [b"a", b"b"]


def test_bad_tls_settings_stop_the_start_with_one_line(tmp_path: Path, pki: Pki) -> None:
    for settings, words in [
        ({"listeners": "SSL://127.0.0.1:0"}, "needs a keystore"),
        ({"listeners": "SSL://127.0.0.1:0", "ssl.keystore.location": str(pki.server_pem)}, "cannot be used"),
        ({"listeners": "SSL://127.0.0.1:0", "ssl.keystore.type": "JKS", "ssl.keystore.location": "x.jks"},
         "JKS"),
        ({"listeners": "FOO://127.0.0.1:0"}, "listener.security.protocol.map"),
    ]:
        cmd = [sys.executable, "-m", "shoal", "serve", "--port", "0", "--data-dir", str(tmp_path / "d")]
        for k, v in settings.items():
            cmd += ["-o", f"{k}={v}"]
        done = subprocess.run(cmd, capture_output=True, timeout=60, text=True)
        assert done.returncode == 1, done
        assert words in done.stdout + done.stderr, done
