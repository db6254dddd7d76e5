"""The ``shoal`` Spark data source: batch and streaming reads by offsets, and the sink.

Readers
-------
* Batch (:class:`ShoalBatchReader`): offsets from ``startingOffsets``/``startingTimestamp``
  (default earliest) to ``endingOffsets``/``endingTimestamp`` (default latest), resolved
  with ListOffsets when the query is planned; each partition's range is split into pieces so
  that there are at least ``minPartitions`` tasks. Filters on ``partition`` and ``offset``
  are pushed down and applied exactly; a lower bound on ``timestamp`` narrows each range to
  the first offset at or after it (ListOffsets by time) and Spark still re-checks it.
* Streaming (:class:`ShoalStreamReader`): offsets are ``{"topic": {"partition": offset}}``,
  the next offset to read. ``maxOffsetsPerTrigger`` becomes the default ``ReadMaxRows``
  limit, split across partitions in proportion to their backlog; ``Trigger.AvailableNow``
  fixes the target offsets once. Partitions that appear later start at their earliest
  offset. The query's checkpoint holds the offsets, so a restarted query continues at the
  first offset not committed: nothing lost, nothing read twice by a sink that is itself
  exactly once (the file sink).
* ``shareGroup`` switches to the share-group source (:mod:`shoal.spark.share`).

Transactions: ``kafka.isolation.level`` is read_uncommitted by default, as in Spark's
connector. With read_committed the latest offset of a partition is its last stable
offset, so no range reaches into an open transaction, and records of aborted
transactions are not rows. Transaction markers never are: offsets in a range, and in the
``offset`` column, have gaps (see :mod:`shoal.spark.kafka`). A share group's isolation is
its group config ``share.isolation.level``. The sink (:mod:`shoal.spark.sink`) is
at-least-once, without transactions.

Rows are produced as Arrow batches. Spark ships this module to Python workers by
pickling the reader; all broker clients are created inside ``read``.
"""

from __future__ import annotations

import datetime
import logging
import time
from collections.abc import Iterator, Sequence
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
)

from .kafka import consumer as _consumer
from .kafka import list_partitions, read_range, resolve_offsets, watermarks
from .options import (
    OffsetRange,
    Options,
    check_batch_options,
    check_stream_options,
    parse_options,
    schema_ddl,
    split_range,
)

log = logging.getLogger("shoal.spark")

__all__ = ["RangePartition", "ShoalBatchReader", "ShoalDataSource", "ShoalStreamReader"]

try:  # Spark 4.2+: read limits and Trigger.AvailableNow for Python sources
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable,
        ReadLimit,
        ReadMaxRows,
        SupportsTriggerAvailableNow,
    )
except ImportError:  # pragma: no cover - Spark 4.0/4.1
    ReadLimit = object  # type: ignore[misc,assignment]
    ReadAllAvailable = ReadMaxRows = None  # type: ignore[assignment,misc]

    class SupportsTriggerAvailableNow:  # type: ignore[no-redef]
        pass


def arrow_schema_of(schema: Any) -> Any:
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema, timezone="UTC")


class RangePartition(InputPartition):
    def __init__(self, r: OffsetRange) -> None:
        super().__init__(r)
        self.range = r


def _read_partition(opts: Options, partition: InputPartition, schema: Any) -> Iterator[Any]:
    """The records of one task; nothing for the placeholder task Spark runs when a read has none.

    pyspark replaces an empty list of input partitions by one ``InputPartition(None)``
    (a range read where every partition is empty, e.g. ``startingOffsets=latest``).
    """
    r = getattr(partition, "range", None)
    if r is None:
        return
    yield from read_range(opts, r, arrow_schema_of(schema))


class ShoalDataSource(DataSource):
    """``spark.read.format("shoal")`` / ``readStream`` / ``write`` / ``writeStream``."""

    @classmethod
    def name(cls) -> str:
        return "shoal"

    def schema(self) -> str:
        return schema_ddl(parse_options(self.options))

    def reader(self, schema: Any) -> DataSourceReader:
        opts = parse_options(self.options)
        if opts.is_share:
            raise ValueError("shareGroup is a streaming source: use spark.readStream")
        check_batch_options(opts)
        if str(self.options.get("pushFilters", "true")).lower() == "true":
            return ShoalFilteringBatchReader(opts, schema)
        return ShoalBatchReader(opts, schema)

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        opts = parse_options(self.options)
        check_stream_options(opts)
        if opts.is_share:
            from .share import ShareStreamReader

            return ShareStreamReader(opts, schema)
        return ShoalStreamReader(opts, schema)

    def writer(self, schema: Any, overwrite: bool) -> DataSourceWriter:
        from .sink import ShoalWriter

        return ShoalWriter(parse_options(self.options), schema, overwrite)

    def streamWriter(self, schema: Any, overwrite: bool) -> DataSourceStreamWriter:
        from .sink import ShoalStreamWriter

        return ShoalStreamWriter(parse_options(self.options), schema)


# --- batch -------------------------------------------------------------------------------

def _ms(value: Any) -> int:
    if isinstance(value, datetime.datetime):
        return int(value.timestamp() * 1000)
    if isinstance(value, datetime.date):
        return int(datetime.datetime(value.year, value.month, value.day).timestamp() * 1000)
    return int(value)


class ShoalBatchReader(DataSourceReader):
    def __init__(self, opts: Options, schema: Any) -> None:
        self.opts = opts
        self.schema = schema
        # pushed-down bounds
        self.partitions_in: set[int] | None = None
        self.offset_lo: int | None = None  # inclusive
        self.offset_hi: int | None = None  # exclusive
        self.ts_lo: int | None = None  # inclusive, ms

    def partitions(self) -> Sequence[InputPartition]:
        c = _consumer(self.opts)
        try:
            tps = list_partitions(c, self.opts)
            if self.partitions_in is not None:
                tps = [tp for tp in tps if tp[1] in self.partitions_in]
            marks = watermarks(c, tps)
            o = self.opts
            starts = resolve_offsets(c, tps, o.starting_offsets, o.starting_timestamp, "earliest", marks,
                                     by_timestamp=o.starting_offsets_by_timestamp,
                                     strategy=o.starting_timestamp_strategy, name="startingOffsets",
                                     check_past_end=True)
            ends = resolve_offsets(c, tps, o.ending_offsets, o.ending_timestamp, "latest", marks,
                                   by_timestamp=o.ending_offsets_by_timestamp, name="endingOffsets",
                                   check_past_end=True)
            ts_starts = resolve_offsets(c, tps, None, self.ts_lo, "earliest", marks) if self.ts_lo is not None \
                else {}
        finally:
            c.close()
        ranges = []
        for tp in tps:
            lo, hi = starts[tp], ends[tp]
            if lo > hi:
                raise ValueError(f"{tp[0]}-{tp[1]}: the starting offset {lo} is after the ending offset {hi}")
            if self.offset_lo is not None:
                lo = max(lo, self.offset_lo)
            if self.offset_hi is not None:
                hi = min(hi, self.offset_hi)
            if tp in ts_starts:
                lo = max(lo, ts_starts[tp])
            ranges.append(OffsetRange(tp[0], tp[1], lo, hi))
        parts = split_range(ranges, self.opts.min_partitions)
        return [RangePartition(r) for r in parts]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        yield from _read_partition(self.opts, partition, self.schema)


class ShoalFilteringBatchReader(ShoalBatchReader):
    """:class:`ShoalBatchReader` with filter pushdown (needs ``spark.sql.python.filterPushdown.enabled``)."""

    def pushFilters(self, filters: list[Any]) -> Iterator[Any]:
        from pyspark.sql.datasource import EqualTo, GreaterThan, GreaterThanOrEqual, In, LessThan, LessThanOrEqual

        for f in filters:
            col = f.attribute[0] if len(f.attribute) == 1 else None
            if col == "partition" and isinstance(f, (EqualTo, In)):
                values = {int(f.value)} if isinstance(f, EqualTo) else {int(v) for v in f.value}
                self.partitions_in = values if self.partitions_in is None else self.partitions_in & values
            elif col == "offset" and isinstance(f, (EqualTo, GreaterThan, GreaterThanOrEqual, LessThan,
                                                    LessThanOrEqual)):
                v = int(f.value)
                lo = {EqualTo: v, GreaterThan: v + 1, GreaterThanOrEqual: v}.get(type(f))
                hi = {EqualTo: v + 1, LessThan: v, LessThanOrEqual: v + 1}.get(type(f))
                if lo is not None:
                    self.offset_lo = lo if self.offset_lo is None else max(self.offset_lo, lo)
                if hi is not None:
                    self.offset_hi = hi if self.offset_hi is None else min(self.offset_hi, hi)
            elif col == "timestamp" and isinstance(f, (GreaterThan, GreaterThanOrEqual)):
                v = _ms(f.value)
                self.ts_lo = v if self.ts_lo is None else max(self.ts_lo, v)
                yield f  # timestamps are not ordered by offset: Spark re-checks
            else:
                yield f


# --- streaming by offsets --------------------------------------------------------------------

def _to_json(offsets: dict[tuple[str, int], int]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for (t, p), o in sorted(offsets.items()):
        out.setdefault(t, {})[str(p)] = int(o)
    return out


def _from_json(data: dict[str, Any]) -> dict[tuple[str, int], int]:
    return {(t, int(p)): int(o) for t, parts in data.items() for p, o in parts.items()}


class ShoalStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, opts: Options, schema: Any) -> None:
        self.opts = opts
        self.schema = schema
        self._consumer: Any = None
        self._target: dict[tuple[str, int], int] | None = None
        self._latest: dict[tuple[str, int], int] | None = None
        self._last_batch = time.monotonic()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_consumer"] = None  # a live client never travels to executors
        return state

    def _c(self) -> Any:
        if self._consumer is None:
            self._consumer = _consumer(self.opts)
        return self._consumer

    def initialOffset(self) -> dict:
        c = self._c()
        tps = list_partitions(c, self.opts)
        o = self.opts
        return _to_json(resolve_offsets(c, tps, o.starting_offsets, o.starting_timestamp, "latest",
                                        by_timestamp=o.starting_offsets_by_timestamp,
                                        strategy=o.starting_timestamp_strategy, name="startingOffsets"))

    def _available(self, start: dict[tuple[str, int], int]) -> tuple[dict[tuple[str, int], int],
                                                                       dict[tuple[str, int], int]]:
        """(start with new partitions at their earliest offset, latest offsets)."""
        c = self._c()
        tps = list_partitions(c, self.opts)
        marks = watermarks(c, tps)
        start = dict(start)
        for tp in tps:
            if tp not in start:
                start[tp] = marks[tp][0]
        latest = {tp: marks[tp][1] for tp in tps}
        for tp, o in start.items():
            latest.setdefault(tp, o)  # a partition that disappeared stays where it was
        return start, latest

    def getDefaultReadLimit(self) -> Any:
        if self.opts.max_offsets_per_trigger and ReadMaxRows is not None:
            return ReadMaxRows(self.opts.max_offsets_per_trigger)
        return ReadAllAvailable() if ReadAllAvailable is not None else None

    def prepareForTriggerAvailableNow(self) -> None:
        _, self._target = self._available({})

    def latestOffset(self, start: dict | None = None, limit: Any = None) -> dict:
        begin, latest = self._available(_from_json(start or {}))
        self._check_data_loss(begin, latest)
        if self._target is not None:
            latest = {tp: min(o, self._target.get(tp, begin[tp])) for tp, o in latest.items()}
            latest = {tp: max(o, begin[tp]) for tp, o in latest.items()}
        self._latest = latest
        backlog = {tp: max(0, latest[tp] - begin[tp]) for tp in latest}
        total = sum(backlog.values())
        if self._too_few(total):
            return start or _to_json(begin)
        max_rows = getattr(limit, "max_rows", None)
        if max_rows is None and limit is None and self.opts.max_offsets_per_trigger:
            max_rows = self.opts.max_offsets_per_trigger  # Spark 4.0/4.1 call latestOffset() without a limit
        if max_rows is None or total <= max_rows:
            return self._batch(_to_json(latest), total)
        end = {}
        given = 0
        for tp in sorted(backlog):
            share = backlog[tp] * max_rows // total
            end[tp] = begin[tp] + share
            given += share
        for tp in sorted(backlog):  # hand out the rounding remainder
            if given >= max_rows:
                break
            if end[tp] < latest[tp]:
                end[tp] += 1
                given += 1
        return self._batch(_to_json(end), total)

    def _too_few(self, available: int) -> bool:
        """minOffsetsPerTrigger: wait for more, unless maxTriggerDelay passed since the last batch."""
        least = self.opts.min_offsets_per_trigger
        if not least or self._target is not None or available == 0:
            return False
        waited_ms = (time.monotonic() - self._last_batch) * 1000
        return available < least and waited_ms < self.opts.max_trigger_delay_ms

    def _batch(self, end: dict, available: int) -> dict:
        if available:
            self._last_batch = time.monotonic()
        return end

    def _check_data_loss(self, begin: dict[tuple[str, int], int], latest: dict[tuple[str, int], int]) -> None:
        """A partition whose latest offset is below the stream's position lost records (re-created topic)."""
        lost = sorted(tp for tp in latest if latest[tp] < begin[tp])
        if lost and self.opts.fail_on_data_loss:
            t, p = lost[0]
            raise RuntimeError(f"{t}-{p}: the latest offset {latest[(t, p)]} is below the stream's offset "
                               f"{begin[(t, p)]}: the topic was deleted and re-created, or records were lost; "
                               "set failOnDataLoss=false to go on from its earliest offset")

    def reportLatestOffset(self) -> dict | None:
        return _to_json(self._latest) if self._latest is not None else None

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        s, e = _from_json(start), _from_json(end)
        ranges = []
        missing = [tp for tp in e if tp not in s]
        if missing:
            c = self._c()
            marks = watermarks(c, missing)
            for tp in missing:
                s[tp] = marks[tp][0]
        behind = [tp for tp in e if tp in s and e[tp] < s[tp]]  # failOnDataLoss=false: start over
        if behind:
            marks = watermarks(self._c(), behind)
            for tp in behind:
                log.warning("%s-%d: offsets went back from %d to %d; reading from its earliest offset %d",
                            tp[0], tp[1], s[tp], e[tp], marks[tp][0])
                s[tp] = min(marks[tp][0], e[tp])
        for tp in sorted(e):
            ranges.append(OffsetRange(tp[0], tp[1], s[tp], e[tp]))
        return [RangePartition(r) for r in split_range(ranges, self.opts.min_partitions)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        yield from _read_partition(self.opts, partition, self.schema)

    def commit(self, end: dict) -> None:
        pass

    def stop(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
