"""Kafka's Java producer (kafka-producer-perf-test) under a client-id quota on shoal: it is held
to the quota, and its own metrics show the throttle times shoal sent."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from tests.support.broker import BrokerProcess
from tests.support.clients import create_topic
from tests.support.kafka_ref import run_tool

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

MIB = 1 << 20


@pytest.fixture(scope="module")
def quota_broker(tmp_path_factory: pytest.TempPathFactory, kafka_classpath: str) -> Iterator[BrokerProcess]:
    # three windows of 1 s: a fresh client may run ahead by two windows' worth (ten with Kafka's 11)
    b = BrokerProcess(tmp_path_factory.mktemp("shoal-quotas") / "data",
                      {"quota.window.num": "3", "quota.window.size.seconds": "1"})
    b.start()
    try:
        yield b
    finally:
        b.stop()


def test_java_producer_is_held_to_its_client_id_quota(quota_broker: BrokerProcess) -> None:
    bs = quota_broker.bootstrap
    create_topic(bs, "java-quota")
    out = run_tool("kafka-configs", "--bootstrap-server", bs, "--alter", "--entity-type", "clients", "--entity-name",
                   "java-metered", "--add-config", f"producer_byte_rate={MIB}").stdout
    assert "Completed updating config for client java-metered." in out
    perf = run_tool("org.apache.kafka.tools.ProducerPerformance", "--topic", "java-quota", "--num-records", "1000",
                    "--record-size", "10000", "--throughput", "-1", "--print-metrics", "--producer-props",
                    f"bootstrap.servers={bs}", "client.id=java-metered", "acks=1", timeout=240).stdout
    summary = re.search(r"1000 records sent, [\d.]+ records/sec \(([\d.]+) MB/sec\)", perf)
    assert summary, perf[-2000:]
    rate = float(summary.group(1))  # MiB/s
    print(summary.group(0))
    assert 0.8 <= rate <= 1.25, perf[-2000:]
    throttle_max = re.search(r"producer-metrics:produce-throttle-time-max:\{client-id=java-metered\}\s*:\s*([\d.]+)",
                             perf)
    assert throttle_max and float(throttle_max.group(1)) > 0, perf[-4000:]


def test_java_consumer_is_held_to_its_client_id_quota(quota_broker: BrokerProcess, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The Java consumer (fetch sessions, KIP-219 throttling) reads 10 MB under a 1 MiB/s quota."""
    bs = quota_broker.bootstrap
    create_topic(bs, "java-quota-read")
    run_tool("org.apache.kafka.tools.ProducerPerformance", "--topic", "java-quota-read", "--num-records", "1000",
             "--record-size", "10000", "--throughput", "-1", "--producer-props", f"bootstrap.servers={bs}",
             "acks=1", timeout=240)
    run_tool("kafka-configs", "--bootstrap-server", bs, "--alter", "--entity-type", "clients", "--entity-name",
             "java-reader", "--add-config", f"consumer_byte_rate={MIB}")
    config = tmp_path / "consumer.properties"
    config.write_text("client.id=java-reader\nauto.offset.reset=earliest\n")
    perf = run_tool("org.apache.kafka.tools.ConsumerPerformance", "--bootstrap-server", bs, "--topic",
                    "java-quota-read", "--num-records", "1000", "--group", "java-quota-group", "--command-config",
                    str(config), "--print-metrics", timeout=240).stdout
    rows = [line.split(", ") for line in perf.splitlines() if re.match(r"\d{4}-\d\d-\d\d ", line)]
    assert rows, perf[:3000]
    consumed_mb, fetch_rate = float(rows[-1][2]), float(rows[-1][8])  # MiB, MiB/s while fetching
    print(", ".join(rows[-1]))
    assert consumed_mb >= 9.5 and fetch_rate <= 1.25, perf[:2000]
    throttle_max = re.search(
        r"consumer-fetch-manager-metrics:fetch-throttle-time-max:\{client-id=java-reader\}\s*:\s*([\d.]+)", perf)
    assert throttle_max and float(throttle_max.group(1)) > 0, perf[-4000:]
