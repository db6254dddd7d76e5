"""Options of the ``shoal`` Spark data source, named as Spark's Kafka connector names them.

Pure helpers: option parsing, topic selection, offset-range splitting and the Arrow
conversion of consumed records. Nothing here talks to a broker.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "EARLIEST",
    "FORBIDDEN_KAFKA_OPTIONS",
    "ISOLATION_LEVELS",
    "LATEST",
    "OffsetRange",
    "Options",
    "check_batch_options",
    "check_stream_options",
    "parse_options",
    "schema_ddl",
    "split_range",
    "to_arrow_batch",
]

EARLIEST = -2
LATEST = -1

_BASE_SCHEMA = ("key binary, value binary, topic string, partition int, offset long, timestamp timestamp, "
                "timestampType int")
_HEADERS = "headers array<struct<key:string,value:binary>>"


def _bool(v: str | None, default: bool) -> bool:
    if v is None:
        return default
    return str(v).strip().lower() in ("1", "true", "yes", "on")


@dataclass(frozen=True)
class Options:
    bootstrap: str
    subscribe: tuple[str, ...] = ()
    subscribe_pattern: str | None = None
    assign: dict[str, tuple[int, ...]] | None = None
    starting_offsets: Any = None  # "earliest" | "latest" | {topic: {partition: offset}}
    ending_offsets: Any = None
    starting_timestamp: int | None = None
    ending_timestamp: int | None = None
    starting_offsets_by_timestamp: dict[str, dict[int, int]] | None = None
    ending_offsets_by_timestamp: dict[str, dict[int, int]] | None = None
    starting_timestamp_strategy: str = "error"  # no offset at or after the timestamp: "error" | "latest"
    max_offsets_per_trigger: int | None = None
    min_offsets_per_trigger: int | None = None
    max_trigger_delay_ms: int = 15 * 60_000
    min_partitions: int | None = None
    include_headers: bool = False
    fail_on_data_loss: bool = True
    topic: str | None = None  # sink default topic
    share_group: str | None = None
    num_tasks: int | None = None
    max_records_per_task: int | None = None  # None: sized from the partitions' record-lock cap
    max_wait_ms: int = 500
    state_dir: str | None = None
    kafka_conf: tuple[tuple[str, str], ...] = ()

    @property
    def is_share(self) -> bool:
        return self.share_group is not None


def _offsets(v: str | None) -> Any:
    if v is None:
        return None
    s = v.strip()
    if s in ("earliest", "latest"):
        return s
    data = json.loads(s)
    return {t: {int(p): int(o) for p, o in parts.items()} for t, parts in data.items()}


# Kafka client settings Spark's Kafka connector refuses, with what to use instead.
FORBIDDEN_KAFKA_OPTIONS = {
    "auto.offset.reset": "set the source option startingOffsets instead",
    "key.deserializer": "keys are always read as bytes: cast or convert the key column",
    "value.deserializer": "values are always read as bytes: cast or convert the value column",
    "key.serializer": "keys are always written as bytes: cast the key column to string or binary",
    "value.serializer": "values are always written as bytes: cast the value column to string or binary",
    "enable.auto.commit": "the source commits no offsets to Kafka",
    "interceptor.classes": "interceptors would see the records as bytes and may break the query",
}

# kafka.isolation.level of the offset-based source; read_uncommitted is the default, as in
# Spark's Kafka connector (and Kafka's consumer).
ISOLATION_LEVELS = ("read_uncommitted", "read_committed")

_DURATION = re.compile(r"^\s*(\d+)\s*(ms|s|sec|seconds?|m|min|minutes?|h|hours?|d|days?)?\s*$", re.IGNORECASE)
_UNIT_MS = {"ms": 1, "s": 1000, "sec": 1000, "second": 1000, "seconds": 1000, "m": 60_000, "min": 60_000,
            "minute": 60_000, "minutes": 60_000, "h": 3_600_000, "hour": 3_600_000, "hours": 3_600_000,
            "d": 86_400_000, "day": 86_400_000, "days": 86_400_000}


def _duration_ms(v: str) -> int:
    """Spark's duration strings (``15m``, ``30s``, ``500ms``; a bare number is milliseconds)."""
    m = _DURATION.match(v)
    if not m:
        raise ValueError(f"not a duration: {v!r} (e.g. 15m, 30s, 500ms)")
    return int(m.group(1)) * _UNIT_MS[(m.group(2) or "ms").lower()]


def _by_timestamp(v: str | None, name: str) -> dict[str, dict[int, int]] | None:
    if v is None:
        return None
    try:
        data = json.loads(v)
        return {t: {int(p): int(ts) for p, ts in parts.items()} for t, parts in data.items()}
    except (ValueError, AttributeError, TypeError) as e:
        raise ValueError(f'{name} must be JSON like {{"topic": {{"0": 1700000000000}}}}: {e}') from None


def parse_options(options: Mapping[str, str]) -> Options:
    """Options from Spark's (case-insensitive) option map. Raises ValueError when invalid."""
    o = {k.lower(): v for k, v in options.items()}
    bootstrap = o.get("kafka.bootstrap.servers") or o.get("bootstrap.servers")
    if not bootstrap:
        raise ValueError("option kafka.bootstrap.servers (or bootstrap.servers) is required")
    assign = None
    if o.get("assign"):
        assign = {t: tuple(int(p) for p in ps) for t, ps in json.loads(o["assign"]).items()}
    subscribe = tuple(t.strip() for t in o.get("subscribe", "").split(",") if t.strip())
    pattern = o.get("subscribepattern")
    share_group = o.get("sharegroup")
    chosen = sum(1 for x in (subscribe, pattern, assign) if x)
    if chosen > 1:
        raise ValueError("give only one of subscribe, subscribePattern and assign")
    kafka_conf = tuple(sorted((k[len("kafka."):], v) for k, v in o.items()
                              if k.startswith("kafka.") and k != "kafka.bootstrap.servers"))
    for k, v in kafka_conf:
        if k in FORBIDDEN_KAFKA_OPTIONS:
            raise ValueError(f"Kafka option 'kafka.{k}' is not supported: {FORBIDDEN_KAFKA_OPTIONS[k]}")
        if k == "isolation.level":
            if v not in ISOLATION_LEVELS:
                raise ValueError(f"kafka.isolation.level must be read_uncommitted or read_committed, not {v!r}")
            if share_group is not None:
                raise ValueError("kafka.isolation.level does not apply to a share group: set the group config "
                                 "share.isolation.level (IncrementalAlterConfigs, e.g. shoal configs --alter "
                                 "--entity-type groups)")
    strategy = o.get("startingoffsetsbytimestampstrategy", "error").strip().lower()
    if strategy not in ("error", "latest"):
        raise ValueError(f"startingOffsetsByTimestampStrategy must be error or latest, not {strategy!r}")
    opts = Options(
        bootstrap=bootstrap,
        subscribe=subscribe,
        subscribe_pattern=pattern,
        assign=assign,
        starting_offsets=_offsets(o.get("startingoffsets")),
        ending_offsets=_offsets(o.get("endingoffsets")),
        starting_timestamp=int(o["startingtimestamp"]) if o.get("startingtimestamp") else None,
        ending_timestamp=int(o["endingtimestamp"]) if o.get("endingtimestamp") else None,
        starting_offsets_by_timestamp=_by_timestamp(o.get("startingoffsetsbytimestamp"),
                                                    "startingOffsetsByTimestamp"),
        ending_offsets_by_timestamp=_by_timestamp(o.get("endingoffsetsbytimestamp"), "endingOffsetsByTimestamp"),
        starting_timestamp_strategy=strategy,
        max_offsets_per_trigger=int(o["maxoffsetspertrigger"]) if o.get("maxoffsetspertrigger") else None,
        min_offsets_per_trigger=int(o["minoffsetspertrigger"]) if o.get("minoffsetspertrigger") else None,
        max_trigger_delay_ms=_duration_ms(o.get("maxtriggerdelay", "15m")),
        min_partitions=int(o["minpartitions"]) if o.get("minpartitions") else None,
        include_headers=_bool(o.get("includeheaders"), False),
        fail_on_data_loss=_bool(o.get("failondataloss"), True),
        topic=o.get("topic"),
        share_group=share_group,
        num_tasks=int(o["numtasks"]) if o.get("numtasks") else None,
        max_records_per_task=int(o["maxrecordspertask"]) if o.get("maxrecordspertask") else None,
        max_wait_ms=int(o.get("maxwaitms", 500)),
        state_dir=o.get("statedir"),
        kafka_conf=kafka_conf,
    )
    if opts.ending_offsets == "earliest":
        raise ValueError("endingOffsets cannot be earliest")
    if opts.min_offsets_per_trigger is not None and opts.max_offsets_per_trigger is not None \
            and opts.min_offsets_per_trigger > opts.max_offsets_per_trigger:
        raise ValueError("minOffsetsPerTrigger cannot be larger than maxOffsetsPerTrigger")
    return opts


def check_batch_options(opts: Options) -> None:
    """What Spark's Kafka connector refuses in a batch query."""
    if opts.starting_offsets == "latest":
        raise ValueError("startingOffsets cannot be latest for a batch query")
    if isinstance(opts.starting_offsets, dict) and any(o == LATEST for ps in opts.starting_offsets.values()
                                                         for o in ps.values()):
        raise ValueError("startingOffsets cannot hold -1 (latest) for a batch query")
    if isinstance(opts.ending_offsets, dict) and any(o == EARLIEST for ps in opts.ending_offsets.values()
                                                       for o in ps.values()):
        raise ValueError("endingOffsets cannot hold -2 (earliest) for a batch query")


def check_stream_options(opts: Options) -> None:
    """What Spark's Kafka connector refuses in a streaming query."""
    for given, name in ((opts.ending_offsets, "endingOffsets"), (opts.ending_timestamp, "endingTimestamp"),
                        (opts.ending_offsets_by_timestamp, "endingOffsetsByTimestamp")):
        if given is not None:
            raise ValueError(f"{name} is not valid in a streaming query (a stream has no end)")


def schema_ddl(options: Options) -> str:
    ddl = _BASE_SCHEMA
    if options.include_headers:
        ddl += ", " + _HEADERS
    if options.is_share:
        ddl += ", deliveryCount int"
    return ddl


def select_topics(options: Options, available: Sequence[str]) -> list[str]:
    """The topics a subscribe/subscribePattern/assign option names, among ``available``."""
    if options.assign:
        return sorted(options.assign)
    if options.subscribe:
        return list(options.subscribe)
    if options.subscribe_pattern:
        rx = re.compile(options.subscribe_pattern)
        return sorted(t for t in available if rx.fullmatch(t) and not t.startswith("__"))
    raise ValueError("one of subscribe, subscribePattern, assign or shareGroup+subscribe is required")


@dataclass(frozen=True)
class OffsetRange:
    """Records [start, end) of one topic-partition."""

    topic: str
    partition: int
    start: int
    end: int

    @property
    def size(self) -> int:
        return max(0, self.end - self.start)


def split_range(ranges: Sequence[OffsetRange], min_partitions: int | None) -> list[OffsetRange]:
    """Split ranges so there are at least ``min_partitions`` pieces (Spark's KafkaOffsetRangeCalculator).

    Each range gets pieces in proportion to its size; empty ranges are dropped.
    """
    ranges = [r for r in ranges if r.size > 0]
    if not min_partitions or len(ranges) >= min_partitions:
        return ranges
    total = sum(r.size for r in ranges)
    out = []
    for r in ranges:
        parts = max(1, round(min_partitions * r.size / total))
        parts = min(parts, r.size)
        step, extra = divmod(r.size, parts)
        start = r.start
        for i in range(parts):
            end = start + step + (1 if i < extra else 0)
            out.append(OffsetRange(r.topic, r.partition, start, end))
            start = end
    return out


def to_arrow_batch(columns: dict[str, list[Any]], arrow_schema: Any) -> Any:
    """A pyarrow RecordBatch from column lists (timestamps in ms), in ``arrow_schema``'s order."""
    import pyarrow as pa

    arrays = []
    for f in arrow_schema:
        data = columns[f.name]
        if pa.types.is_timestamp(f.type):
            arrays.append(pa.array(data, type=pa.int64()).cast(pa.timestamp("ms", tz=f.type.tz)).cast(f.type))
        else:
            arrays.append(pa.array(data, type=f.type))
    return pa.RecordBatch.from_arrays(arrays, schema=arrow_schema)
