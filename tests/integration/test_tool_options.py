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


def test_share_groups_state_shows_in_flight_records_and_lock_timeouts(start_broker, topic_name: str) -> None:
    import json
    import time

    from confluent_kafka import ShareConsumer

    from tests.integration.test_observe import get, metrics_url, produce_n, scrape, value
    from tests.integration.test_share_consumer import set_group_configs
    from tests.support.clients import create_topic, rdkafka_conf

    b = start_broker({"metrics.port": "0", "group.share.min.record.lock.duration.ms": "1000"})
    base = metrics_url(b)
    create_topic(b.bootstrap, topic_name, 1)
    set_group_configs(b.bootstrap, "held", share_auto_offset_reset="earliest",
                      share_record_lock_duration_ms="1000")
    produce_n(b.bootstrap, topic_name, 20)
    c = ShareConsumer(rdkafka_conf(b.bootstrap, **{"group.id": "held", "share.acknowledgement.mode": "explicit"}))
    try:
        c.subscribe([topic_name])
        got: list = []
        deadline = time.monotonic() + 20
        while not got and time.monotonic() < deadline:
            got = [m for m in c.poll(0.5) if m.error() is None]
        assert got
        labels = {"group": "held", "topic": topic_name, "partition": "0"}
        deadline = time.monotonic() + 20  # not acknowledged: the locks run out
        while time.monotonic() < deadline and not value(
                scrape(base), "kafka_server_sharepartitionmetrics_acquisitionlocktimeout_total", **labels):
            time.sleep(0.2)
        r = tool(b.bootstrap, "share-groups", "--describe", "--group", "held", "--state", "--metrics-url", base,
                 "--output", "json")
        assert r.returncode == 0, r.stderr
        (doc,) = json.loads(r.stdout)
        (part,) = doc["partitions"]
        samples = scrape(base)
        assert part["lock_timeouts"] == value(samples, "kafka_server_sharepartitionmetrics_acquisitionlocktimeout_total",
                                              **labels) > 0
        for state in ("available", "acquired"):
            assert part[state] == value(samples, "shoal_sharepartition_records", state=state, **labels), state
        assert part["start_offset"] == 0 and part["lag"] == 20
        view = json.loads(get(base + "/api/share-groups")[1])["share_groups"][0]["partitions"][0]
        assert part["oldest_available_age_ms"] is not None and view["oldest_available_offset"] == 0

        text = ok(b.bootstrap, "share-groups", "--describe", "--group", "held", "--state", "--metrics-url", base)
        header = next(line.split() for line in text.splitlines() if line.startswith("GROUP") and "TOPIC" in line)
        assert header == ["GROUP", "TOPIC", "PARTITION", "START-OFFSET", "LAG", "AVAILABLE", "ACQUIRED",
                          "LOCK-TIMEOUTS", "OLDEST-AVAILABLE-AGE-MS"]
        plain = tool(b.bootstrap, "share-groups", "--describe", "--group", "held", "--state")
        assert plain.returncode == 0 and "--metrics-url" in plain.stderr
    finally:
        c.close()
