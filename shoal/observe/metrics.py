"""The broker's metrics: cheap counters on the hot path, everything else computed at scrape time.

Theory of operation
-------------------
The handlers and the connection call a few methods of :class:`Metrics`
(``broker.metrics``, None when ``metrics.port`` is -1) per request or per batch, never
per record: each adds to a plain ``dict`` on the event loop, with no lock and no
prometheus_client object on the way. Latencies go into fixed histogram buckets the same
way (``bisect`` into one list per label set).

At scrape time :class:`BrokerCollector` turns those dicts into Prometheus metric
families and reads the live objects for the gauges: records by state, delivery counts
and lag of every loaded share-partition, group counts by state, consumer lag from the
committed offsets, purgatory sizes. Scrapes run on the broker's event loop (the HTTP
server of ``shoal/observe/http.py`` lives there), so they read the same objects the
handlers change, never concurrently with them.

Names follow Kafka's JMX names as the Prometheus JMX exporter renders them
(``kafka.server:type=BrokerTopicMetrics,name=MessagesInPerSec,topic=t`` becomes
``kafka_server_brokertopicmetrics_messagesin_total{topic="t"}``); metrics Kafka has no
name for are prefixed ``shoal_``. docs/OBSERVING.md lists them all.

Event loop only, never awaits.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

__all__ = ["DELIVERY_COUNT_BUCKETS", "LATENCY_BUCKETS_S", "BrokerCollector", "Metrics"]

LATENCY_BUCKETS_S: tuple[float, ...] = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)
"""Upper bounds (seconds) of the latency histograms; +Inf is implied."""

DELIVERY_COUNT_BUCKETS: tuple[int, ...] = (1, 2, 3, 4, 5, 10)
"""Upper bounds of the in-flight records' delivery-count histogram; +Inf is implied."""


class _Histogram:
    """Bucket counts (not cumulative), sum and count of one label set."""

    __slots__ = ("count", "counts", "total")

    def __init__(self, n: int) -> None:
        self.counts = [0] * (n + 1)
        self.total = 0.0
        self.count = 0

    def observe(self, value: float, bounds: tuple[float, ...]) -> None:
        self.counts[bisect_left(bounds, value)] += 1
        self.total += value
        self.count += 1

    def buckets(self, bounds: tuple[float, ...]) -> list[tuple[str, float]]:
        out: list[tuple[str, float]] = []
        acc = 0
        for bound, n in zip(bounds, self.counts):
            acc += n
            out.append((_fmt(bound), acc))
        out.append(("+Inf", acc + self.counts[-1]))
        return out


def _fmt(bound: float) -> str:
    return repr(float(bound))


class Metrics:
    """The broker's counters and histograms (``broker.metrics``). Event loop only."""

    def __init__(self) -> None:
        self.requests: dict[int, _Histogram] = {}
        """API key -> total time of its requests (arrival to response queued), seconds."""
        self.request_errors: dict[int, int] = {}
        """API key -> requests that closed the connection (a malformed or failing request)."""
        self.messages_in: dict[str, int] = {}
        self.bytes_in: dict[str, int] = {}
        self.produce_requests: dict[str, int] = {}
        self.bytes_out: dict[str, int] = {}
        self.fetch_requests: dict[str, int] = {}
        self.records_acquired: dict[tuple[str, str], int] = {}
        """(group, topic) -> records acquired by share consumers (deliveries)."""
        self.record_acknowledgements: dict[tuple[str, str], int] = {}
        """(group, ack type) -> records acknowledged (ACCEPT, RELEASE, REJECT, RENEW)."""
        self.share_acknowledgements: dict[str, int] = {}
        """group -> acknowledgement sets applied (one per share-partition of a ShareFetch or ShareAcknowledge)."""
        self.lock_timeouts: dict[tuple[str, str, int], int] = {}
        """(group, topic, partition) -> records whose acquisition lock timed out."""
        self.persister_writes = _Histogram(len(LATENCY_BUCKETS_S))
        """One commit round of share-state writes: append + fsync, seconds."""
        self.persister_write_failures = 0
        self.connections_opened = 0
        self.connections_closed = 0

    # -- hot path: one call per request or per partition batch -----------------------------
    def request_done(self, api: int, seconds: float) -> None:
        h = self.requests.get(api)
        if h is None:
            h = self.requests[api] = _Histogram(len(LATENCY_BUCKETS_S))
        h.observe(seconds, LATENCY_BUCKETS_S)

    def request_failed(self, api: int) -> None:
        self.request_errors[api] = self.request_errors.get(api, 0) + 1

    def produced(self, topic: str, records: int, nbytes: int) -> None:
        """One batch appended to ``topic``."""
        self.messages_in[topic] = self.messages_in.get(topic, 0) + records
        self.bytes_in[topic] = self.bytes_in.get(topic, 0) + nbytes
        self.produce_requests[topic] = self.produce_requests.get(topic, 0) + 1

    def fetched(self, topic: str, nbytes: int) -> None:
        """Record bytes of ``topic`` sent in one Fetch or ShareFetch partition response."""
        self.bytes_out[topic] = self.bytes_out.get(topic, 0) + nbytes
        self.fetch_requests[topic] = self.fetch_requests.get(topic, 0) + 1

    def acquired(self, group: str, topic: str, records: int) -> None:
        key = (group, topic)
        self.records_acquired[key] = self.records_acquired.get(key, 0) + records

    def acknowledged(self, group: str, ack_type: str, records: int) -> None:
        key = (group, ack_type)
        self.record_acknowledgements[key] = self.record_acknowledgements.get(key, 0) + records

    def acknowledgement_request(self, group: str) -> None:
        self.share_acknowledgements[group] = self.share_acknowledgements.get(group, 0) + 1

    def lock_timed_out(self, group: str, topic: str, partition: int, records: int) -> None:
        key = (group, topic, partition)
        self.lock_timeouts[key] = self.lock_timeouts.get(key, 0) + records

    def persister_write(self, seconds: float, ok: bool) -> None:
        self.persister_writes.observe(seconds, LATENCY_BUCKETS_S)
        if not ok:
            self.persister_write_failures += 1


_API_NAMES: dict[int, str] = {}


def api_name(api_key: int) -> str:
    """Kafka's request name of an API key (``Produce``, ``ShareFetch``), as its RequestMetrics tag it."""
    name = _API_NAMES.get(api_key)
    if name is None:
        from kio.schema.index import api_key_map

        raw = api_key_map.get(api_key)
        name = "".join(p.capitalize() for p in raw.split("_")) if raw else str(api_key)
        _API_NAMES[api_key] = name
    return name


def _counter(name: str, doc: str, labels: list[str], items: Any) -> CounterMetricFamily:
    m = CounterMetricFamily(name, doc, labels=labels)
    for key, value in items:
        m.add_metric([str(k) for k in (key if isinstance(key, tuple) else (key,))], value)
    return m


class BrokerCollector(Collector):
    """Yields every metric family at scrape time (prometheus_client's custom-collector contract)."""

    def __init__(self, broker: Any, metrics: Metrics) -> None:
        self.broker = broker
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        from .views import consumer_group_lags, group_counts, purgatory_sizes, share_partition_views

        m = self.metrics
        yield _counter("kafka_server_brokertopicmetrics_messagesin", "Records appended, per topic.",
                       ["topic"], m.messages_in.items())
        yield _counter("kafka_server_brokertopicmetrics_bytesin", "Record-batch bytes appended, per topic.",
                       ["topic"], m.bytes_in.items())
        yield _counter("kafka_server_brokertopicmetrics_bytesout",
                       "Record-batch bytes sent by Fetch and ShareFetch, per topic.", ["topic"], m.bytes_out.items())
        yield _counter("kafka_server_brokertopicmetrics_totalproducerequests",
                       "Partition batches produced, per topic.", ["topic"], m.produce_requests.items())
        yield _counter("kafka_server_brokertopicmetrics_totalfetchrequests",
                       "Partition reads by Fetch and ShareFetch that returned records, per topic.", ["topic"],
                       m.fetch_requests.items())
        yield _counter("kafka_network_requestmetrics_requests", "Requests answered, per API.",
                       ["request"], ((api_name(k), h.count) for k, h in m.requests.items()))
        yield _counter("kafka_network_requestmetrics_errors",
                       "Requests that closed their connection (malformed, or failed), per API.", ["request"],
                       ((api_name(k), n) for k, n in m.request_errors.items()))
        lat = HistogramMetricFamily("kafka_network_requestmetrics_totaltime_seconds",
                                    "Time from a request's arrival to its response being queued, per API.",
                                    labels=["request"])
        for api, h in sorted(m.requests.items()):
            lat.add_metric([api_name(api)], h.buckets(LATENCY_BUCKETS_S), h.total)
        yield lat
        conns = GaugeMetricFamily("kafka_server_socket_server_metrics_connection_count", "Open client connections.")
        conns.add_metric([], len(self.broker.connections))
        yield conns
        yield _counter("kafka_server_socket_server_metrics_connection_creation", "Client connections accepted.",
                       [], [((), m.connections_opened)])
        yield _counter("kafka_server_socket_server_metrics_connection_close", "Client connections closed.",
                       [], [((), m.connections_closed)])

        purg = GaugeMetricFamily("kafka_server_delayedoperationpurgatory_purgatorysize",
                                 "Requests parked: Produce waiting for its fsync, Fetch and ShareFetch long polls.",
                                 labels=["delayedOperation"])
        for op, n in purgatory_sizes(self.broker).items():
            purg.add_metric([op], n)
        yield purg

        groups = GaugeMetricFamily("kafka_server_group_coordinator_metrics_group_count",
                                   "Groups by protocol (classic, consumer, share) and state.",
                                   labels=["protocol", "state"])
        for (protocol, state), n in sorted(group_counts(self.broker).items()):
            groups.add_metric([protocol, state], n)
        yield groups

        lag = GaugeMetricFamily("kafka_consumergroup_lag",
                                "Consumer group lag: high watermark minus committed offset.",
                                labels=["consumergroup", "topic", "partition"])
        for g, t, p, n in consumer_group_lags(self.broker):
            lag.add_metric([g, t, str(p)], n)
        yield lag

        # -- share groups (KIP-932) ------------------------------------------------------
        yield _counter("kafka_server_sharegroupmetrics_recordsacquired",
                       "Records acquired by share consumers (each delivery counts), per group and topic.",
                       ["group", "topic"], m.records_acquired.items())
        yield _counter("kafka_server_sharegroupmetrics_recordacknowledgements",
                       "Records acknowledged, per group and acknowledgement type.", ["group", "ackType"],
                       m.record_acknowledgements.items())
        yield _counter("kafka_server_sharegroupmetrics_shareacknowledgements",
                       "Acknowledgement sets applied (one per share-partition of a ShareFetch or "
                       "ShareAcknowledge carrying acknowledgements), per group.", ["group"],
                       m.share_acknowledgements.items())
        yield _counter("kafka_server_sharepartitionmetrics_acquisitionlocktimeout",
                       "Records whose acquisition lock timed out, per share-partition.",
                       ["group", "topic", "partition"], m.lock_timeouts.items())
        pw = HistogramMetricFamily("kafka_server_share_coordinator_metrics_write_latency_seconds",
                                   "Share-state persister writes: one commit round (append and fsync) of a "
                                   "__share_group_state partition.")
        pw.add_metric([], m.persister_writes.buckets(LATENCY_BUCKETS_S), m.persister_writes.total)
        yield pw
        yield _counter("kafka_server_share_coordinator_metrics_write_failures",
                       "Share-state commit rounds that failed.", [], [((), m.persister_write_failures)])

        labels = ["group", "topic", "partition"]
        by_state = GaugeMetricFamily("shoal_sharepartition_records", "In-flight records by state, per "
                                     "share-partition.", labels=labels + ["state"])
        inflight = GaugeMetricFamily("kafka_server_sharepartitionmetrics_inflightmessagecount",
                                     "In-flight records (SPSO to SPEO), per share-partition.", labels=labels)
        batches = GaugeMetricFamily("kafka_server_sharepartitionmetrics_inflightbatchcount",
                                    "In-flight state ranges, per share-partition.", labels=labels)
        start = GaugeMetricFamily("shoal_sharepartition_start_offset", "SPSO, per share-partition.", labels=labels)
        end = GaugeMetricFamily("shoal_sharepartition_end_offset", "SPEO, per share-partition.", labels=labels)
        splag = GaugeMetricFamily("shoal_sharepartition_lag",
                                  "Records not yet acknowledged or archived: high watermark minus SPSO, minus "
                                  "the acknowledged and archived records in flight.", labels=labels)
        deliveries = HistogramMetricFamily("shoal_sharepartition_delivery_count",
                                           "Delivery counts of the in-flight records not yet acknowledged or "
                                           "archived, per share-partition.", labels=labels)
        oldest = GaugeMetricFamily("shoal_sharepartition_oldest_available_age_seconds",
                                   "Age of the oldest record available for delivery (in flight or not yet "
                                   "fetched), by its batch's first timestamp, per share-partition; absent when "
                                   "none is available.", labels=labels)
        for v in share_partition_views(self.broker):
            key = [v["group"], v["topic"], str(v["partition"])]
            if v["oldest_available_age_ms"] is not None:
                oldest.add_metric(key, v["oldest_available_age_ms"] / 1000.0)
            for state, n in v["states"].items():
                by_state.add_metric(key + [state], n)
            inflight.add_metric(key, v["end_offset"] - v["start_offset"])
            batches.add_metric(key, v["ranges"])
            start.add_metric(key, v["start_offset"])
            end.add_metric(key, v["end_offset"])
            splag.add_metric(key, v["lag"])
            acc = 0
            buckets = []
            for bound, n in zip(DELIVERY_COUNT_BUCKETS, v["delivery_counts"]):
                acc += n
                buckets.append((_fmt(bound), acc))
            buckets.append(("+Inf", acc + v["delivery_counts"][-1]))
            deliveries.add_metric(key, buckets, v["delivery_count_sum"])
        yield from (by_state, inflight, batches, start, end, splag, deliveries, oldest)
