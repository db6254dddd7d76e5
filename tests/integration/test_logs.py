"""The broker's log: one line per event an operator cares about, in text or JSON."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer

from tests.integration.test_share_consumer import set_group_configs, share_consumer
from tests.support.broker import BrokerProcess
from tests.support.clients import admin_client, create_topic, rdkafka_conf

pytestmark = pytest.mark.integration


def _json_lines(b: BrokerProcess) -> list[dict[str, str]]:
    lines = b.stderr_path.read_text().splitlines()
    out = []
    for line in lines:
        if line.startswith("==== ") or not line.strip():
            continue  # the command line the test harness writes before each start
        out.append(json.loads(line))  # every line the broker writes is one JSON object
    return out


def test_json_log_names_the_events(tmp_path: Path) -> None:
    b = BrokerProcess(tmp_path / "data", {"log.format": "json", "metrics.port": "0"}, log_level="DEBUG")
    b.start()
    try:
        create_topic(b.bootstrap, "logged", 2)
        set_group_configs(b.bootstrap, "sg", share_auto_offset_reset="earliest")
        c = Consumer(rdkafka_conf(b.bootstrap, **{"group.id": "cg", "auto.offset.reset": "earliest"}))
        c.subscribe(["logged"])
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and "Stable (rebalance completed)" not in b.stderr_tail(400):
            c.poll(0.2)
        c.close()
        sc = share_consumer(b.bootstrap, "sg", "logged")
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and "group sg (share): new -> Stable" not in b.stderr_tail(400):
            sc.poll(0.2)
        sc.close()
        admin = admin_client(b.bootstrap)
        admin.delete_topics(["logged"])["logged"].result(10)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and "deleted topic logged" not in b.stderr_tail(400):
            time.sleep(0.1)
    finally:
        b.stop()
    lines = _json_lines(b)
    for doc in lines:
        assert set(doc) >= {"ts", "level", "logger", "message"}
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", doc["ts"])
    messages = [d["message"] for d in lines]
    text = "\n".join(messages)

    def has(pattern: str) -> bool:
        return re.search(pattern, text) is not None

    assert has(r"starting: listener 127\.0\.0\.1:\d+, data dir .*data, config file \(none\), -o log\.format=json"
               r".*; limits: socket\.request\.max\.bytes=\d+, queued\.max\.requests=\d+")
    assert has(r"group coordinator loaded no groups")
    assert has(r"__consumer_offsets: replayed \d+ records")
    assert has(r"shoal broker ready on 127\.0\.0\.1:\d+")
    assert has(r"created topic logged \(2 partition\(s\), id [0-9a-f-]+\)")
    assert has(r"group sg configs changed: share\.auto\.offset\.reset=earliest")
    assert has(r"group cg \(classic\): member \S+ joined \(client rdkafka /127\.0\.0\.1\)")
    assert has(r"group cg \(classic\): \S+ -> PreparingRebalance \(rebalance started\)")
    assert has(r"group cg \(classic\): \w+ -> Stable \(rebalance completed\), generation 1, 1 member")
    assert has(r"group cg \(classic\): member \S+ left")
    assert has(r"group sg \(share\): member \S+ joined")
    assert has(r"group sg \(share\): new -> Stable, generation 1, 1 member")
    assert has(r"group sg \(share\): member \S+ left")
    assert has(r"deleted topic logged")
    assert has(r"connection \d+ from 127\.0\.0\.1:\d+ opened")  # DEBUG
    assert has(r"connection \d+ from 127\.0\.0\.1:\d+ closed")
    assert messages[-1] == "shut down cleanly"


def test_text_log_at_info_has_timestamps_and_no_connection_lines(tmp_path: Path) -> None:
    b = BrokerProcess(tmp_path / "data")
    b.start()
    try:
        create_topic(b.bootstrap, "t", 1)
    finally:
        b.stop()
    lines = [x for x in b.stderr_path.read_text().splitlines() if not x.startswith("==== ")]
    assert lines
    for line in lines:
        assert re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (DEBUG|INFO|WARNING|ERROR|CRITICAL) \S+: ", line), line
    assert not any("connection" in x and "opened" in x for x in lines)
    assert any("created topic t (1 partition(s)" in x for x in lines)


def test_unknown_log_format_is_refused(tmp_path: Path) -> None:
    b = BrokerProcess(tmp_path / "data", {"log.format": "xml"})
    with pytest.raises(Exception):
        b.start()
    assert "log.format" in b.stderr_path.read_text()
