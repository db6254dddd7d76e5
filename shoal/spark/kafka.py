"""Broker access for the offset-based source and the sink, through confluent-kafka.

Offsets are resolved with ListOffsets (``get_watermark_offsets``, ``offsets_for_times``);
tasks read a range ``[start, end)`` of one partition with a Consumer assigned at
``start``, with no group and no committed offsets, so reads are exact and repeatable.

``kafka.isolation.level`` (read_uncommitted by default, as Spark's connector) is the
consumer's: with read_committed the latest offset that ListOffsets reports is the last
stable offset, so a range never reaches into an open transaction, and Fetch leaves out the
records of aborted transactions. Control records (transaction markers) are never rows. A
range's offsets are therefore not all rows: a task reads until it sees an offset at or
past ``end``, or the end of what is readable (partition EOF).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from .options import EARLIEST, LATEST, OffsetRange, Options, select_topics, to_arrow_batch

__all__ = ["consumer", "consumer_conf", "list_partitions", "producer_conf", "read_range", "resolve_offsets", "watermarks"]

log = logging.getLogger("shoal.spark")

TopicPartition_ = tuple[str, int]
ARROW_ROWS = 8192
METADATA_TIMEOUT_S = 15.0


def _base_conf(opts: Options) -> dict[str, Any]:
    conf: dict[str, Any] = {"bootstrap.servers": opts.bootstrap, "broker.address.family": "v4",
                            "socket.timeout.ms": 15_000, "log_level": 3}
    conf.update(dict(opts.kafka_conf))
    return conf


def consumer(opts: Options) -> Any:
    from confluent_kafka import Consumer

    return Consumer(consumer_conf(opts))


def consumer_conf(opts: Options) -> dict[str, Any]:
    conf = _base_conf(opts)
    # isolation.level: read_uncommitted unless the options say otherwise, as Spark's connector
    # (librdkafka's own default is read_committed)
    conf.update({"group.id": "shoal-spark-unused", "enable.auto.commit": False, "enable.auto.offset.store": False,
                 "enable.partition.eof": True, "fetch.wait.max.ms": 50, "fetch.queue.backoff.ms": 1,
                 "auto.offset.reset": "earliest", "isolation.level": "read_uncommitted"})
    for k, v in opts.kafka_conf:
        conf[k] = v
    return conf


def producer_conf(opts: Options) -> dict[str, Any]:
    conf = _base_conf(opts)
    conf.update({"enable.idempotence": True, "acks": "all", "linger.ms": 5, "message.timeout.ms": 60_000})
    for k, v in opts.kafka_conf:
        conf[k] = v
    conf.pop("isolation.level", None)  # a consumer setting, shared by the source and sink options
    return conf


def list_partitions(c: Any, opts: Options) -> list[TopicPartition_]:
    """Every (topic, partition) the options select, sorted. Unknown subscribed topics have none."""
    md = c.list_topics(timeout=METADATA_TIMEOUT_S)
    topics = select_topics(opts, list(md.topics))
    out = []
    for t in topics:
        tm = md.topics.get(t)
        if tm is None or tm.error is not None:
            continue
        parts = sorted(tm.partitions)
        if opts.assign:
            parts = [p for p in parts if p in opts.assign[t]]
        out.extend((t, p) for p in parts)
    return out


def watermarks(c: Any, tps: Sequence[TopicPartition_]) -> dict[TopicPartition_, tuple[int, int]]:
    from confluent_kafka import TopicPartition

    return {(t, p): tuple(c.get_watermark_offsets(TopicPartition(t, p), timeout=METADATA_TIMEOUT_S, cached=False))
            for t, p in tps}


def _for_times(c: Any, wanted: Mapping[TopicPartition_, int], marks: Mapping[TopicPartition_, tuple[int, int]],
               strategy: str) -> dict[TopicPartition_, int]:
    """The first offset at or after each partition's timestamp (ListOffsets by time).

    Where no record is that recent: the high watermark with ``strategy`` "latest", an
    error with "error" (Spark's startingOffsetsByTimestampStrategy).
    """
    from confluent_kafka import TopicPartition

    if not wanted:
        return {}
    found = c.offsets_for_times([TopicPartition(t, p, ts) for (t, p), ts in wanted.items()],
                                timeout=METADATA_TIMEOUT_S)
    out = {}
    for tp in found:
        key = (tp.topic, tp.partition)
        if tp.offset >= 0:
            out[key] = tp.offset
        elif strategy == "latest":
            out[key] = marks[key][1]
        else:
            raise ValueError(f"no record of {tp.topic}-{tp.partition} at or after timestamp {wanted[key]}; "
                             f"set startingOffsetsByTimestampStrategy=latest to start at the latest offset")
    return out


def _check_complete(spec: Mapping[str, Mapping[int, Any]], tps: Sequence[TopicPartition_], name: str) -> None:
    """Spark's rule: specific offsets (or timestamps) name every partition of their topics, and only those."""
    given = {(t, p) for t, parts in spec.items() for p in parts}
    topics = set(spec)
    actual = {tp for tp in tps if tp[0] in topics}
    missing, unknown = sorted(actual - given), sorted(given - set(tps))
    if missing or unknown or not topics <= {t for t, _ in tps}:
        detail = "; ".join(x for x in (
            f"missing {', '.join(f'{t}-{p}' for t, p in missing)}" if missing else "",
            f"unknown {', '.join(f'{t}-{p}' for t, p in unknown)}" if unknown else "") if x)
        raise ValueError(f"{name} must give every partition of its topics ({detail}); "
                         "use -2 for earliest and -1 for latest")


def resolve_offsets(c: Any, tps: Sequence[TopicPartition_], spec: Any, ts_ms: int | None, default: str,
                    marks: Mapping[TopicPartition_, tuple[int, int]] | None = None, *,
                    by_timestamp: Mapping[str, Mapping[int, int]] | None = None, strategy: str = "latest",
                    name: str = "offsets", check_past_end: bool = False) -> dict[TopicPartition_, int]:
    """Concrete offsets for ``spec`` ("earliest", "latest", JSON dict with -2/-1) or timestamps.

    A timestamp for all partitions (``ts_ms``) wins over per-partition timestamps
    (``by_timestamp``), which win over ``spec``. A JSON spec, like ``by_timestamp``, must
    name every partition of the topics it names. ``check_past_end``: a specific offset past
    a partition's latest offset is an error (batch queries).
    """
    marks = dict(marks) if marks is not None else watermarks(c, tps)
    if ts_ms is not None:
        return _for_times(c, {tp: ts_ms for tp in tps}, marks, strategy)
    if by_timestamp is not None:
        _check_complete(by_timestamp, tps, name + "ByTimestamp")
        return _for_times(c, {tp: by_timestamp[tp[0]][tp[1]] for tp in tps if tp[0] in by_timestamp}, marks,
                          strategy) | {tp: marks[tp][0 if default == "earliest" else 1]
                                       for tp in tps if tp[0] not in by_timestamp}
    if isinstance(spec, dict):
        _check_complete(spec, tps, name)
    out = {}
    for tp in tps:
        lo, hi = marks[tp]
        want: Any = spec if isinstance(spec, str) else default
        if isinstance(spec, dict):
            o = spec.get(tp[0], {}).get(tp[1])
            if o is not None:
                want = o
        if want in ("earliest", EARLIEST):
            out[tp] = lo
        elif want in ("latest", LATEST):
            out[tp] = hi
        else:
            out[tp] = int(want)
            if check_past_end and out[tp] > hi:
                raise ValueError(f"{name}: offset {out[tp]} of {tp[0]}-{tp[1]} is past its latest offset {hi}")
    return out


def read_range(opts: Options, r: OffsetRange, arrow_schema: Any, *, check_data_loss: bool = True
               ) -> Iterator[Any]:
    """Yield pyarrow RecordBatches of the records in ``r`` (control records skipped).

    Stops at ``r.end`` or at the end of the partition. Raises RuntimeError if the range
    starts below the log start offset and ``failOnDataLoss`` is set.
    """
    from confluent_kafka import KafkaError, KafkaException, TopicPartition

    if r.size <= 0:
        return
    c = consumer(opts)
    try:
        if check_data_loss:
            lo, _hi = c.get_watermark_offsets(TopicPartition(r.topic, r.partition), timeout=METADATA_TIMEOUT_S,
                                              cached=False)
            if lo > r.start:
                msg = f"{r.topic}-{r.partition}: offsets {r.start}..{lo - 1} are gone (log start offset {lo})"
                if opts.fail_on_data_loss:
                    raise RuntimeError(msg + "; set failOnDataLoss=false to skip them")
                log.warning("%s; skipped", msg)
        c.assign([TopicPartition(r.topic, r.partition, r.start)])
        headers = opts.include_headers
        cols: dict[str, list[Any]] = {n: [] for n in arrow_schema.names}
        keys, values, offsets, tss, tstypes = cols["key"], cols["value"], cols["offset"], cols["timestamp"], \
            cols["timestampType"]
        hdrs = cols.get("headers")
        n = 0
        done = False
        idle_deadline = time.monotonic() + 60.0
        while not done:
            msgs = c.consume(num_messages=10_000, timeout=0.5)
            if not msgs:
                if time.monotonic() > idle_deadline:
                    raise RuntimeError(f"{r.topic}-{r.partition}: no data for 60 s before offset {r.end}")
                continue
            idle_deadline = time.monotonic() + 60.0
            for m in msgs:
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:  # nothing more below r.end
                        done = True
                        break
                    raise KafkaException(err)
                off = m.offset()
                if off >= r.end:
                    done = True
                    break
                keys.append(m.key())
                values.append(m.value())
                offsets.append(off)
                tst, ts = m.timestamp()
                tss.append(ts if tst != 0 else None)
                tstypes.append(max(0, tst - 1) if tst != 0 else -1)
                if headers:
                    h = m.headers()
                    hdrs.append([{"key": k, "value": v} for k, v in h] if h else [])
                n += 1
                if off == r.end - 1:
                    done = True
                    break
                if n >= ARROW_ROWS:
                    yield _flush(cols, r, arrow_schema)
                    n = 0
        if n:
            yield _flush(cols, r, arrow_schema)
    finally:
        c.close()


def _flush(cols: dict[str, list[Any]], r: OffsetRange, arrow_schema: Any) -> Any:
    count = len(cols["offset"])
    cols["topic"] = [r.topic] * count
    cols["partition"] = [r.partition] * count
    batch = to_arrow_batch(cols, arrow_schema)
    for v in cols.values():
        v.clear()
    return batch
