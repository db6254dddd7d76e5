"""Topic and broker configs through ``shoal topics`` and ``shoal configs`` as subprocesses:
every topic key accepted at create is described with its source and alterable; Kafka's
topic keys shoal does not support are refused with a message; a config set on broker
``0`` is that broker's (DYNAMIC_BROKER_CONFIG), as in Kafka."""

from __future__ import annotations

import json

import pytest

from shoal.config import KAFKA_TOPIC_KEYS_NOT_SUPPORTED, topic_keys
from tests.integration.test_tools import ok, tool
from tests.support.broker import BrokerProcess

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def _configs(bs: str, kind: str, name: str) -> dict[str, dict]:
    doc = json.loads(ok(bs, "configs", "--describe", "--all", "--entity-type", kind, "--entity-name", name,
                        "--output", "json"))
    return {c["name"]: c for c in doc[0]["configs"]}


def test_min_insync_replicas_is_described_and_alterable(shared_broker: BrokerProcess, topic_name: str) -> None:
    bs = shared_broker.bootstrap
    ok(bs, "topics", "--create", "--topic", topic_name, "--config", "min.insync.replicas=1")
    described = ok(bs, "configs", "--describe", "--entity-type", "topics", "--entity-name", topic_name)
    assert ("  min.insync.replicas=1 sensitive=false synonyms={DYNAMIC_TOPIC_CONFIG:min.insync.replicas=1, "
            "DEFAULT_CONFIG:min.insync.replicas=1}") in described.splitlines(), described
    assert "Completed updating config" in ok(bs, "configs", "--alter", "--entity-type", "topics", "--entity-name",
                                             topic_name, "--add-config", "min.insync.replicas=2")
    entry = _configs(bs, "topics", topic_name)["min.insync.replicas"]
    assert (entry["value"], entry["source"]) == ("2", "DYNAMIC_TOPIC_CONFIG")
    ok(bs, "configs", "--alter", "--entity-type", "topics", "--entity-name", topic_name,
       "--delete-config", "min.insync.replicas")
    entry = _configs(bs, "topics", topic_name)["min.insync.replicas"]
    assert (entry["value"], entry["source"]) == ("1", "DEFAULT_CONFIG")


def test_every_topic_key_accepted_at_create_is_described_and_alterable(shared_broker: BrokerProcess,
                                                                       topic_name: str) -> None:
    bs = shared_broker.bootstrap
    ok(bs, "topics", "--create", "--topic", topic_name)
    described = _configs(bs, "topics", topic_name)
    assert {d.name for d in topic_keys()} <= set(described)
    # Setting every key to the value described is accepted, and each then shows as the topic's own.
    values = [(d.name, described[d.name]["value"]) for d in topic_keys()]
    ok(bs, "configs", "--alter", "--entity-type", "topics", "--entity-name", topic_name, "--add-config",
       ",".join(f"{k}=[{v}]" if "," in v else f"{k}={v}" for k, v in values))
    after = _configs(bs, "topics", topic_name)
    assert {d.name: after[d.name]["source"] for d in topic_keys()} == {
        d.name: "DYNAMIC_TOPIC_CONFIG" for d in topic_keys()}


@pytest.mark.parametrize("key,value", [("segment.jitter.ms", "100"), ("preallocate", "true"),
                                       ("remote.storage.enable", "true"), ("message.downconversion.enable", "false")])
def test_kafka_topic_keys_shoal_lacks_are_refused_at_create(shared_broker: BrokerProcess, topic_name: str,
                                                            key: str, value: str) -> None:
    assert key in KAFKA_TOPIC_KEYS_NOT_SUPPORTED
    bs = shared_broker.bootstrap
    r = tool(bs, "topics", "--create", "--topic", topic_name, "--config", f"{key}={value}")
    assert r.returncode == 1
    assert f"topic config {key} is not supported by shoal" in r.stderr, r.stderr
    assert topic_name not in ok(bs, "topics", "--list").split()


def test_a_broker_key_given_as_topic_config_names_the_topic_key(shared_broker: BrokerProcess,
                                                                topic_name: str) -> None:
    r = tool(shared_broker.bootstrap, "topics", "--create", "--topic", topic_name, "--config", "log.retention.ms=5")
    assert r.returncode == 1 and "the topic config is retention.ms" in r.stderr, r.stderr


def test_a_config_set_on_broker_0_is_its_dynamic_broker_config(broker: BrokerProcess, topic_name: str) -> None:
    bs = broker.bootstrap
    ok(bs, "configs", "--alter", "--entity-type", "brokers", "--entity-name", "0",
       "--add-config", "log.retention.ms=7200000")
    described = ok(bs, "configs", "--describe", "--entity-type", "brokers", "--entity-name", "0")
    assert ("  log.retention.ms=7200000 sensitive=false synonyms={DYNAMIC_BROKER_CONFIG:log.retention.ms=7200000, "
            "DEFAULT_CONFIG:log.retention.ms=604800000}") in described.splitlines(), described
    ok(bs, "topics", "--create", "--topic", topic_name)
    entry = _configs(bs, "topics", topic_name)["retention.ms"]
    assert (entry["value"], entry["source"]) == ("7200000", "DYNAMIC_BROKER_CONFIG")
    assert "DYNAMIC_DEFAULT_BROKER_CONFIG" not in json.dumps(_configs(bs, "brokers", "0"))
