"""The metrics endpoint (metrics.port): Prometheus metrics, health checks, the queue view's JSON.

Real ``shoal serve`` processes with ``metrics.port=0``, driven by confluent-kafka
producers, consumers and ShareConsumers; the endpoint is read over HTTP.
"""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import AcknowledgeType, Consumer, ShareConsumer
from prometheus_client.parser import text_string_to_metric_families

from tests.support.broker import BrokerProcess
from tests.support.clients import create_topic, producer, rdkafka_conf
from tests.integration.test_share_consumer import set_group_configs

pytestmark = pytest.mark.integration


def metrics_url(b: BrokerProcess) -> str:
    """The endpoint's base URL, from the broker's start-up log line."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        m = re.search(r"queue view on (http://[^/\s]+)/", b.stderr_tail(400))
        if m:
            return m.group(1)
        time.sleep(0.05)
    raise AssertionError("no metrics endpoint line in the broker log:\n" + b.stderr_tail())


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def scrape(base: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """{sample name: [(labels, value)]} of one /metrics scrape."""
    status, text = get(base + "/metrics")
    assert status == 200
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def value(samples: dict[str, list[tuple[dict[str, str], float]]], name: str, **labels: Any) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels``."""
    want = {k: str(v) for k, v in labels.items()}
    return sum(v for lab, v in samples.get(name, []) if all(lab.get(k) == x for k, x in want.items()))


def wait_for(check: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def produce_n(bootstrap: str, topic: str, n: int, partitions: int = 1) -> None:
    p = producer(bootstrap)
    for i in range(n):
        p.produce(topic, value=b"v%d" % i, partition=i % partitions)
        p.poll(0)
    assert p.flush(15) == 0


def test_disabled_by_default(broker: BrokerProcess) -> None:
    assert "queue view on" not in broker.stderr_tail(400)


def test_health_metrics_and_consumer_lag(start_broker: Callable[..., BrokerProcess], topic_name: str) -> None:
    b = start_broker(metrics_port="0")
    base = metrics_url(b)
    assert get(base + "/healthz") == (200, "ok\n")
    assert get(base + "/readyz") == (200, "ready\n")
    assert get(base + "/nothing-here")[0] == 404
    create_topic(b.bootstrap, topic_name, 2)
    produce_n(b.bootstrap, topic_name, 30, partitions=2)
    s = scrape(base)
    assert value(s, "kafka_server_brokertopicmetrics_messagesin_total", topic=topic_name) == 30
    assert value(s, "kafka_server_brokertopicmetrics_bytesin_total", topic=topic_name) > 30 * 2
    assert value(s, "kafka_network_requestmetrics_requests_total", request="Produce") >= 1
    assert value(s, "kafka_network_requestmetrics_totaltime_seconds_count", request="Metadata") >= 1
    assert value(s, "kafka_server_socket_server_metrics_connection_creation_total") >= 1

    c = Consumer(rdkafka_conf(b.bootstrap, **{"group.id": "cg", "auto.offset.reset": "earliest",
                                              "enable.auto.commit": False}))
    try:
        c.subscribe([topic_name])
        got = 0
        deadline = time.monotonic() + 20
        while got < 10 and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and m.error() is None:
                got += 1
                last = m
        assert got == 10
        c.commit(message=last, asynchronous=False)
        committed = last.offset() + 1
        hw = 15  # 30 records over 2 partitions
        s = scrape(base)
        assert value(s, "kafka_consumergroup_lag", consumergroup="cg", topic=topic_name,
                     partition=last.partition()) == hw - committed
        assert value(s, "kafka_server_brokertopicmetrics_bytesout_total", topic=topic_name) > 0
        assert value(s, "kafka_server_group_coordinator_metrics_group_count", protocol="classic",
                     state="Stable") == 1
        # The consumer has fetched everything: its next Fetch waits at the broker (a long poll).
        wait_for(lambda: value(scrape(base), "kafka_server_delayedoperationpurgatory_purgatorysize",
                               delayedOperation="Fetch") >= 1, 10, "a parked Fetch")
        status, body = get(base + "/api/consumer-groups")
        assert status == 200
        (g,) = json.loads(body)["consumer_groups"]
        assert g["group"] == "cg"
        (p,) = [p for p in g["partitions"] if p["partition"] == last.partition()]
        assert (p["committed"], p["high_watermark"], p["lag"]) == (committed, hw, hw - committed)
    finally:
        c.close()


def _share_totals(base: str, group: str, topic: str) -> dict[str, float]:
    s = scrape(base)
    out = {state: value(s, "shoal_sharepartition_records", group=group, topic=topic, state=state)
           for state in ("available", "acquired", "acknowledged", "archived")}
    out["start_offset"] = value(s, "shoal_sharepartition_start_offset", group=group, topic=topic)
    out["lag"] = value(s, "shoal_sharepartition_lag", group=group, topic=topic)
    out["accepted"] = value(s, "kafka_server_sharegroupmetrics_recordacknowledgements_total", group=group,
                            ackType="ACCEPT")
    out["rejected"] = value(s, "kafka_server_sharegroupmetrics_recordacknowledgements_total", group=group,
                            ackType="REJECT")
    out["acquired_total"] = value(s, "kafka_server_sharegroupmetrics_recordsacquired_total", group=group,
                                  topic=topic)
    return out


class ShareWorkers:
    """``n`` explicit-acknowledgement ShareConsumers on threads; each accepts what it gets
    (rejecting offsets divisible by ``reject_every``) and counts it."""

    def __init__(self, bootstrap: str, group: str, topic: str, n: int, reject_every: int = 0) -> None:
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.accepted = 0
        self.rejected = 0
        self.errors: list[BaseException] = []
        self.consumers = []
        for _ in range(n):
            c = ShareConsumer(rdkafka_conf(bootstrap, **{"group.id": group,
                                                         "share.acknowledgement.mode": "explicit"}))
            c.subscribe([topic])
            self.consumers.append(c)
        self.reject_every = reject_every
        self.threads = [threading.Thread(target=self._run, args=(c,), daemon=True) for c in self.consumers]
        for t in self.threads:
            t.start()

    def _run(self, c: ShareConsumer) -> None:
        try:
            while not self.stop.is_set():
                msgs = [m for m in c.poll(0.3) if m.error() is None]
                for m in msgs:
                    reject = self.reject_every and m.offset() % self.reject_every == 0
                    c.acknowledge(m, AcknowledgeType.REJECT if reject else AcknowledgeType.ACCEPT)
                if msgs:
                    c.commit_sync()
                    with self.lock:
                        for m in msgs:
                            if self.reject_every and m.offset() % self.reject_every == 0:
                                self.rejected += 1
                            else:
                                self.accepted += 1
        except BaseException as e:  # reported by close()
            self.errors.append(e)

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(10)
        for c in self.consumers:
            c.close()
        assert not self.errors, self.errors


def test_share_partition_gauges_move_as_eight_consumers_acknowledge(
        start_broker: Callable[..., BrokerProcess], topic_name: str) -> None:
    b = start_broker(metrics_port="0")
    base = metrics_url(b)
    create_topic(b.bootstrap, topic_name, 4)
    set_group_configs(b.bootstrap, "sg", share_auto_offset_reset="earliest")
    workers = ShareWorkers(b.bootstrap, "sg", topic_name, 8, reject_every=10)
    try:
        wait_for(lambda: value(scrape(base), "kafka_server_group_coordinator_metrics_group_count",
                               protocol="share", state="Stable") == 1, 20, "the share group")
        seen_start: list[float] = []
        for wave in range(1, 4):
            produce_n(b.bootstrap, topic_name, 100, partitions=4)
            # Every record of the wave is acknowledged (SPSO moves past it) and the lag drains.
            wait_for(lambda: _share_totals(base, "sg", topic_name)["start_offset"] == 100 * wave, 30,
                     f"SPSO to reach {100 * wave}")
            seen_start.append(_share_totals(base, "sg", topic_name)["start_offset"])
        totals = _share_totals(base, "sg", topic_name)
        assert seen_start == [100, 200, 300]
        assert totals["lag"] == 0
        assert totals["acquired"] == 0 and totals["available"] == 0
        assert totals["acquired_total"] == 300
        with workers.lock:
            # offsets 0..74 of each of the 4 partitions; multiples of 10 were rejected
            assert (workers.accepted, workers.rejected) == (268, 32)
        assert (totals["accepted"], totals["rejected"]) == (268, 32)
        s = scrape(base)
        assert value(s, "kafka_server_share_coordinator_metrics_write_latency_seconds_count") >= 1
        assert value(s, "kafka_network_requestmetrics_requests_total", request="ShareFetch") >= 1
        status, body = get(base + "/api/share-groups")
        (g,) = json.loads(body)["share_groups"]
        assert g["group"] == "sg" and g["state"] == "Stable" and len(g["members"]) == 8
        assigned = {(a["topic"], p) for m in g["members"] for a in m["assignment"] for p in a["partitions"]}
        assert assigned == {(topic_name, p) for p in range(4)}
    finally:
        workers.close()


def test_acquired_records_show_until_acknowledged(start_broker: Callable[..., BrokerProcess],
                                                  topic_name: str) -> None:
    b = start_broker(metrics_port="0")
    base = metrics_url(b)
    create_topic(b.bootstrap, topic_name, 1)
    set_group_configs(b.bootstrap, "held", share_auto_offset_reset="earliest")
    produce_n(b.bootstrap, topic_name, 20)
    c = ShareConsumer(rdkafka_conf(b.bootstrap, **{"group.id": "held", "share.acknowledgement.mode": "explicit"}))
    try:
        c.subscribe([topic_name])
        got: list[Any] = []
        deadline = time.monotonic() + 20
        while not got and time.monotonic() < deadline:
            got = [m for m in c.poll(0.5) if m.error() is None]
        assert got
        t = _share_totals(base, "held", topic_name)
        assert t["acquired"] == len(got)
        assert t["available"] == 20 - len(got) or t["available"] == 0  # fetched batches only
        assert t["lag"] == 20
        for m in got:
            c.acknowledge(m, AcknowledgeType.REJECT if m.offset() < 5 else AcknowledgeType.ACCEPT)
        c.commit_sync()
        t = _share_totals(base, "held", topic_name)
        assert t["acquired"] == 0
        assert t["start_offset"] == len(got)
        assert t["lag"] == 20 - len(got)
        assert t["rejected"] == min(5, len(got))
    finally:
        c.close()


def test_endpoint_refuses_what_it_does_not_serve(start_broker: Callable[..., BrokerProcess]) -> None:
    import socket
    from urllib.parse import urlsplit

    b = start_broker(metrics_port="0")
    u = urlsplit(metrics_url(b))

    def raw(data: bytes) -> bytes:
        with socket.create_connection((u.hostname, u.port), timeout=5) as s:
            s.sendall(data)
            out = b""
            while chunk := s.recv(65536):
                out += chunk
            return out

    assert raw(b"POST /metrics HTTP/1.1\r\nHost: x\r\n\r\n").startswith(b"HTTP/1.1 405 ")
    assert raw(b"not http at all\r\n\r\n").startswith(b"HTTP/1.1 400 ")
    assert raw(b"GET / HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello").startswith(b"HTTP/1.1 400 ")
    head = raw(b"HEAD /healthz HTTP/1.1\r\nConnection: close\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ") and head.endswith(b"\r\n\r\n")  # no body
    page = raw(b"GET /queues HTTP/1.0\r\n\r\n")
    assert page.startswith(b"HTTP/1.1 200 ") and b"<title>shoal: queues</title>" in page
    # the broker still serves Kafka clients
    create_topic(b.bootstrap, "still-serving", 1)
