"""Listener settings, JAAS lines, the SASL mechanisms and certificate subjects, without a broker."""

from __future__ import annotations

import asyncio

import pytest

from shoal.config import BrokerConfig, ConfigError
from shoal.security.credentials import ScramCredential, credential_from_password, credential_from_salted_password
from shoal.security.jaas import JaasError, login_credentials, parse_jaas, plain_users
from shoal.security.listeners import (
    ListenerError,
    advertised_endpoints,
    inter_broker_listener,
    listener_specs,
    listener_value,
)
from shoal.security.sasl import AuthenticationFailed, PlainServer, ScramServer
from shoal.security.tls import subject_name


def _config(**kw: str) -> BrokerConfig:
    return BrokerConfig({k.replace("_", "."): v for k, v in kw.items()})


def test_default_listener_and_host_port_overrides() -> None:
    specs = listener_specs(_config())
    assert [(s.name, s.protocol, s.host, s.port) for s in specs] == [("PLAINTEXT", "PLAINTEXT", "127.0.0.1", 9092)]
    specs = listener_specs(_config(listeners="SSL://:9093,SASL_SSL://[::1]:9094"), "0.0.0.0", 0)
    assert [(s.name, s.protocol, s.host, s.port) for s in specs] == [("SSL", "SSL", "0.0.0.0", 0),
                                                                      ("SASL_SSL", "SASL_SSL", "::1", 9094)]


def test_named_listeners_map_to_protocols() -> None:
    cfg = BrokerConfig({"listeners": "CLIENTS://:9094,INTERNAL://10.0.0.5:9095",
                        "listener.security.protocol.map": "CLIENTS:SASL_SSL,INTERNAL:SSL",
                        "inter.broker.listener.name": "internal"})
    specs = listener_specs(cfg)
    assert [(s.name, s.protocol) for s in specs] == [("CLIENTS", "SASL_SSL"), ("INTERNAL", "SSL")]
    assert inter_broker_listener(cfg, specs).name == "INTERNAL"
    bound = {"CLIENTS": ("0.0.0.0", 9094), "INTERNAL": ("10.0.0.5", 9095)}
    cfg2 = BrokerConfig({**{k: cfg[k] for k in ("listeners", "listener.security.protocol.map")},
                         "advertised.listeners": "CLIENTS://kafka.example.com:19094"})
    assert advertised_endpoints(cfg2, specs, bound) == {"CLIENTS": ("kafka.example.com", 19094),
                                                        "INTERNAL": ("10.0.0.5", 9095)}
    # a bare host:port is the first listener's, as the setting was read before
    cfg3 = BrokerConfig({"advertised.listeners": "broker1:9092"})
    assert advertised_endpoints(cfg3, listener_specs(cfg3), {"PLAINTEXT": ("127.0.0.1", 9092)}) == {
        "PLAINTEXT": ("broker1", 9092)}


@pytest.mark.parametrize("settings, words", [
    ({"listeners": "FOO://:1"}, "listener.security.protocol.map"),
    ({"listeners": "PLAINTEXT://:1,PLAINTEXT://:2"}, "named twice"),
    ({"listeners": "PLAINTEXT://:1,SSL://:1"}, "used by two listeners"),
    ({"listeners": "PLAINTEXT://nohost"}, "NAME://host:port"),
    ({"listener.security.protocol.map": "A:TLS"}, "NAME:PROTOCOL"),
])
def test_bad_listener_settings(settings: dict[str, str], words: str) -> None:
    # a port that is not one is refused with the configuration itself (ConfigError)
    with pytest.raises((ListenerError, ConfigError), match=words):
        listener_specs(BrokerConfig(settings))


def test_inter_broker_listener_must_exist() -> None:
    cfg = BrokerConfig({"inter.broker.listener.name": "NOPE"})
    with pytest.raises(ListenerError, match="not one of the listeners"):
        inter_broker_listener(cfg, listener_specs(cfg))


def test_per_listener_keys() -> None:
    cfg = BrokerConfig({"ssl.client.auth": "none", "listener.name.internal.ssl.client.auth": "required",
                        "listener.name.sasl_ssl.plain.sasl.jaas.config": "x required;",
                        "listener.name.sasl_ssl.sasl.enabled.mechanisms": "PLAIN"})
    assert listener_value(cfg, "INTERNAL", "ssl.client.auth") == "required"
    assert listener_value(cfg, "OTHER", "ssl.client.auth") == "none"
    assert listener_value(cfg, "SASL_SSL", "plain.sasl.jaas.config") == "x required;"
    assert listener_value(cfg, "SASL_SSL", "sasl.enabled.mechanisms") == "PLAIN"
    for bad in ({"listener.name.x.log.dirs": "/tmp"}, {"listener.name.x.ssl.client.auth": "always"},
                {"listener.name.x.sasl.enabled.mechanisms": "GSSAPI"}):
        with pytest.raises(ConfigError):
            BrokerConfig(bad)
    with pytest.raises(ConfigError, match="connections.max.reauth.ms"):
        BrokerConfig({"connections.max.reauth.ms": "-1"})


def test_jaas_lines() -> None:
    modules = parse_jaas('org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" '
                        'password="a\\"b" user_admin="a\\"b" user_alice=alice-secret;')
    assert plain_users(modules) == {"admin": 'a"b', "alice": "alice-secret"}
    assert login_credentials(modules) == ("admin", 'a"b')
    scram = parse_jaas('org.apache.kafka.common.security.scram.ScramLoginModule required username="b" password="p";')
    assert plain_users(scram) == {} and login_credentials(scram) == ("b", "p")
    for bad in ("org.x.Module required user_a=\"b\"", "org.x.Module maybe a=b;", 'a="b";', "m required a b;"):
        with pytest.raises(JaasError):
            parse_jaas(bad)


def test_plain_mechanism() -> None:
    async def run(token: bytes) -> PlainServer:
        server = PlainServer({"alice": "secret"})
        await server.step(token)
        return server

    ok = asyncio.run(run(b"\x00alice\x00secret"))
    assert ok.complete and ok.username == "alice"
    assert asyncio.run(run(b"alice\x00alice\x00secret")).complete
    for bad, words in ((b"\x00alice\x00nope", "Invalid username or password"),
                       (b"\x00bob\x00secret", "Invalid username or password"),
                       (b"bob\x00alice\x00secret", "authorization id"),
                       (b"\x00alice", "expected 3 tokens"), (b"\x00\x00secret", "username not specified")):
        with pytest.raises(AuthenticationFailed, match=words):
            asyncio.run(run(bad))


class _Store:
    def __init__(self, creds: dict[tuple[str, str], ScramCredential]) -> None:
        self.creds = creds

    async def get(self, user: str, mechanism: str) -> ScramCredential | None:
        return self.creds.get((user, mechanism))


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_scram_mechanism_against_scramps_client(mechanism: str) -> None:
    from scramp import ScramClient

    store = _Store({("al,ice", mechanism): credential_from_password(mechanism, "pw", 4096)})

    async def exchange(password: str) -> ScramServer:
        server = ScramServer(mechanism, store)
        client = ScramClient([mechanism], "al,ice", password)
        first = await server.step(client.get_client_first().encode())
        client.set_server_first(first.decode())
        final = await server.step(client.get_client_final().encode())
        client.set_server_final(final.decode())  # the server proved it knows the credential
        return server

    server = asyncio.run(exchange("pw"))
    assert server.complete and server.username == "al,ice"
    with pytest.raises(AuthenticationFailed, match=f"invalid credentials with SASL mechanism {mechanism}"):
        asyncio.run(exchange("wrong"))
    with pytest.raises(AuthenticationFailed):
        asyncio.run(ScramServer(mechanism, _Store({})).step(b"n,,n=nobody,r=abc"))


def test_credential_from_the_salted_password_matches_scramps() -> None:
    import hashlib

    cred = credential_from_password("SCRAM-SHA-256", "pw", 4096)
    salted = hashlib.pbkdf2_hmac("sha256", b"pw", cred.salt, 4096)
    assert credential_from_salted_password("SCRAM-SHA-256", cred.salt, salted, 4096) == cred


def test_certificate_subject_as_kafka_names_it() -> None:
    subject = ((("countryName", "NL"),), (("organizationName", "Example, Inc"),), (("commonName", "alice"),))
    assert subject_name(subject) == "CN=alice,O=Example\\, Inc,C=NL"
