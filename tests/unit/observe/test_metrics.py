"""Metrics of the share service and the views behind the queue view, on a fake broker."""

from __future__ import annotations

import asyncio
from pathlib import Path

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

from shoal.observe.metrics import BrokerCollector, Metrics
from shoal.observe.views import share_partition_views
from shoal.share.state import AcknowledgeType
from tests.unit.server.test_share_service import _topic_with_records, started


def _samples(b, m: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:  # type: ignore[no-untyped-def]
    b.connections = set()
    reg = CollectorRegistry(auto_describe=False)
    reg.register(BrokerCollector(b, m))
    out = {}
    for fam in text_string_to_metric_families(generate_latest(reg).decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_lock_timeouts_persister_writes_and_state_gauges(tmp_path: Path) -> None:
    async def body() -> None:
        b, svc = started(tmp_path, {"share.auto.offset.reset": "earliest",
                                    "share.record.lock.duration.ms": "15000"})
        m = b.metrics = Metrics()
        b.extensions["share"] = svc
        tid = _topic_with_records(b, "t", 6, svc)
        sp = svc.get_partition("g", tid, 0)
        sp.acquire("m", [(0, 5)], b.clock.now_ms(), 10)
        b.clock.now += 15_000  # every lock runs out: the timer computes its delay from the clock
        svc.reschedule(sp)
        # the timer fires at once; the write of the releases ends after an fsync in a worker thread
        for _ in range(500):
            if m.lock_timeouts and m.persister_writes.count:
                break
            await asyncio.sleep(0.01)
        assert m.lock_timeouts == {("g", "t", 0): 6}
        assert m.persister_writes.count == 1  # the releases were written

        sp.acquire("m", [(0, 5)], b.clock.now_ms(), 10)
        sp.acknowledge("m", [(0, 1, [AcknowledgeType.ACCEPT]), (2, 2, [AcknowledgeType.REJECT]),
                             (3, 3, [AcknowledgeType.RELEASE])], b.clock.now_ms())
        assert await svc.persist(sp)
        (v,) = share_partition_views(b)
        assert (v["start_offset"], v["end_offset"], v["high_watermark"]) == (3, 6, 6)
        assert v["states"] == {"available": 1, "acquired": 2, "acknowledged": 0, "archived": 0}
        assert v["lag"] == 3 and v["not_fetched"] == 0
        assert v["delivery_counts"][:2] == [0, 3]  # three records delivered twice, not yet done
        assert v["lock_timeouts"] == 6
        assert v["oldest_available_offset"] == 3  # released: the next one a consumer is given
        assert v["oldest_available_age_ms"] is not None and v["oldest_available_age_ms"] >= 0
        s = _samples(b, m)
        labels = (("group", "g"), ("partition", "0"), ("topic", "t"))
        assert s[("shoal_sharepartition_records", tuple(sorted(labels + (("state", "available"),))))] == 1
        assert s[("shoal_sharepartition_records", tuple(sorted(labels + (("state", "acquired"),))))] == 2
        assert s[("kafka_server_sharepartitionmetrics_acquisitionlocktimeout_total", labels)] == 6
        assert s[("shoal_sharepartition_start_offset", labels)] == 3
        assert s[("shoal_sharepartition_lag", labels)] == 3
        assert s[("shoal_sharepartition_delivery_count_bucket", tuple(sorted(labels + (("le", "2.0"),))))] == 3
        assert s[("kafka_server_share_coordinator_metrics_write_latency_seconds_count", ())] == 2
        svc.stop()
        b.close()

    asyncio.run(body())


def test_request_histogram_buckets_are_cumulative() -> None:
    m = Metrics()
    for seconds in (0.00005, 0.0003, 0.0003, 0.2, 100.0):
        m.request_done(0, seconds)
    h = m.requests[0]
    buckets = dict(h.buckets((0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                              1.0, 2.5, 5.0, 10.0, 30.0)))
    assert buckets["0.0001"] == 1
    assert buckets["0.0005"] == 3
    assert buckets["0.25"] == 4
    assert buckets["30.0"] == 4
    assert buckets["+Inf"] == 5
    assert h.count == 5
