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
    "Options", "parse_options", "schema_ddl", "split_range", "OffsetRange", "to_arrow_batch",
    "EARLIEST", "LATEST",
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
    max_offsets_per_trigger: int | None = None
    min_partitions: int | None = None
    include_headers: bool = False
    fail_on_data_loss: bool = True
    topic: str | None = None  # sink default topic
    share_group: str | None = None
    num_tasks: int | None = None
    max_records_per_task: int = 1000
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
    opts = Options(
        bootstrap=bootstrap,
        subscribe=subscribe,
        subscribe_pattern=pattern,
        assign=assign,
        starting_offsets=_offsets(o.get("startingoffsets")),
        ending_offsets=_offsets(o.get("endingoffsets")),
        starting_timestamp=int(o["startingtimestamp"]) if o.get("startingtimestamp") else None,
        ending_timestamp=int(o["endingtimestamp"]) if o.get("endingtimestamp") else None,
        max_offsets_per_trigger=int(o["maxoffsetspertrigger"]) if o.get("maxoffsetspertrigger") else None,
        min_partitions=int(o["minpartitions"]) if o.get("minpartitions") else None,
        include_headers=_bool(o.get("includeheaders"), False),
        fail_on_data_loss=_bool(o.get("failondataloss"), True),
        topic=o.get("topic"),
        share_group=share_group,
        num_tasks=int(o["numtasks"]) if o.get("numtasks") else None,
        max_records_per_task=int(o.get("maxrecordspertask", 1000)),
        max_wait_ms=int(o.get("maxwaitms", 500)),
        state_dir=o.get("statedir"),
        kafka_conf=kafka_conf,
    )
    if opts.ending_offsets == "earliest":
        raise ValueError("endingOffsets cannot be earliest")
    return opts


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
