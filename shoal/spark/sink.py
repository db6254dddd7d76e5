"""The ``shoal`` sink: ``df.write.format("shoal")`` and ``writeStream.format("shoal")``.

Columns as in Spark's Kafka sink: ``value`` (required, string or binary), ``key``,
``headers`` (array<struct<key:string,value:binary>>), ``topic`` (the option ``topic``
wins over the column, as in Spark), ``partition`` (int; absent or null lets the
producer's partitioner choose). Each task has its own idempotent producer
(``enable.idempotence=true``); it flushes before returning its commit message, and any
delivery error fails the task, so a committed task's records are all in the log.

Guarantee: at-least-once, as Spark's Kafka sink. Spark re-runs a failed task, and a
streaming query re-runs a micro-batch whose commit it did not record (a killed driver);
the records such a run had already written stay in the topic, so a retry or a re-run
writes them again, and readers see them twice whatever their isolation level. The sink
uses no transactions: a Spark task that committed its own transaction could still be
re-run, or belong to a job that fails, so a per-task transaction would not make the
output exactly once. ``kafka.transactional.id`` is therefore refused, rather than
accepted for a guarantee the sink cannot give. For exactly-once output, make the
records' consumers idempotent (e.g. by key), or write with ``foreachBatch`` to a sink
that is itself exactly once (the file sink) keyed by the batch id.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter, WriterCommitMessage

from .kafka import producer_conf
from .options import Options

__all__ = ["ShoalStreamWriter", "ShoalWriter", "WriteReport", "write_rows"]

FLUSH_TIMEOUT_S = 120.0


@dataclass
class WriteReport(WriterCommitMessage):
    records: int
    bytes: int


def _b(v: Any) -> bytes | None:
    if v is None:
        return None
    if isinstance(v, str):
        return v.encode()
    if isinstance(v, (bytes, bytearray, memoryview)):
        return bytes(v)
    raise TypeError(f"expected string or binary, got {type(v).__name__}")


def _columns(iterator: Iterator[Any]) -> Iterator[dict[str, list[Any]]]:
    """Column lists per batch, from pyarrow RecordBatches (the Arrow writers) or Spark Rows."""
    rows: list[dict[str, Any]] = []
    for item in iterator:
        if hasattr(item, "to_pydict") and hasattr(item, "schema"):
            yield item.to_pydict()
        else:
            rows.append(item.asDict(recursive=True))
            if len(rows) >= 8192:
                yield {k: [r.get(k) for r in rows] for k in rows[0]}
                rows = []
    if rows:
        yield {k: [r.get(k) for r in rows] for k in rows[0]}


def write_rows(opts: Options, iterator: Iterator[Any]) -> WriteReport:
    """Produce every row; only failed deliveries call back (``delivery.report.only.error``)."""
    from confluent_kafka import KafkaException, Producer

    errors: list[Any] = []

    def on_delivery(err: Any, _msg: Any) -> None:
        if err is not None:
            errors.append(err)

    producer = Producer({**producer_conf(opts), "delivery.report.only.error": True, "on_delivery": on_delivery})
    produce, poll = producer.produce, producer.poll
    n = size = 0
    for cols in _columns(iterator):
        count = len(cols.get("value", ()))
        values = [_b(v) for v in cols["value"]]
        keys = [_b(k) for k in cols["key"]] if "key" in cols else [None] * count
        topics = [opts.topic] * count if opts.topic else cols.get("topic") or [None] * count
        parts = cols.get("partition")
        hdrs = cols.get("headers")
        for i in range(count):
            topic = topics[i]
            if not topic:
                raise ValueError("no topic: give the option topic or a topic column")
            kw: dict[str, Any] = {}
            if parts is not None and parts[i] is not None:
                kw["partition"] = int(parts[i])
            if hdrs is not None and hdrs[i]:
                kw["headers"] = [(h["key"], _b(h["value"])) for h in hdrs[i]]
            while True:
                try:
                    produce(topic, values[i], keys[i], **kw)
                    break
                except BufferError:
                    poll(0.05)
            size += len(values[i] or b"") + len(keys[i] or b"")
        n += count
        poll(0)
        if errors:
            raise KafkaException(errors[0])
    left = producer.flush(FLUSH_TIMEOUT_S)
    if errors:
        raise KafkaException(errors[0])
    if left:
        raise RuntimeError(f"{left} records not delivered within {FLUSH_TIMEOUT_S} s")
    return WriteReport(n, size)


try:
    from pyspark.sql.datasource import DataSourceArrowWriter as _BatchBase
except ImportError:  # pragma: no cover
    _BatchBase = DataSourceWriter  # type: ignore[misc,assignment]
try:
    from pyspark.sql.datasource import DataSourceStreamArrowWriter as _StreamBase
except ImportError:  # pragma: no cover
    _StreamBase = DataSourceStreamWriter  # type: ignore[misc,assignment]


class ShoalWriter(_BatchBase):  # type: ignore[misc,valid-type]
    def __init__(self, opts: Options, schema: Any, overwrite: bool = False) -> None:
        self.opts = opts
        _check_mode(overwrite)
        _check_options(opts)
        _check_schema(opts, schema)

    def write(self, iterator: Iterator[Any]) -> WriteReport:
        return write_rows(self.opts, iterator)

    def commit(self, messages: list[Any]) -> None:
        pass

    def abort(self, messages: list[Any]) -> None:
        pass


class ShoalStreamWriter(_StreamBase):  # type: ignore[misc,valid-type]
    """The streaming sink; Complete output mode writes every row (as Spark's Kafka sink: a topic is never truncated)."""

    def __init__(self, opts: Options, schema: Any) -> None:
        self.opts = opts
        _check_options(opts)
        _check_schema(opts, schema)

    def write(self, iterator: Iterator[Any]) -> WriteReport:
        return write_rows(self.opts, iterator)

    def commit(self, messages: list[Any], batchId: int) -> None:
        pass

    def abort(self, messages: list[Any], batchId: int) -> None:
        pass


def _check_options(opts: Options) -> None:
    """Refuse producer settings that would promise what the sink cannot keep."""
    if any(k == "transactional.id" for k, _ in opts.kafka_conf):
        raise ValueError("kafka.transactional.id is not supported: the sink writes at-least-once without "
                         "transactions (a retried Spark task writes its records again)")


def _check_schema(opts: Options, schema: Any) -> None:
    """Refuse the columns Spark's Kafka sink refuses, before any task runs."""
    from pyspark.sql.types import ArrayType, BinaryType, IntegerType, StringType, StructType

    types = {f.name: f.dataType for f in schema.fields}
    if "value" not in types:
        raise ValueError("the sink needs a value column (string or binary)")
    for column in ("key", "value"):
        if column in types and not isinstance(types[column], (StringType, BinaryType)):
            raise ValueError(f"{column} column type must be string or binary, not {types[column].simpleString()}")
    if opts.topic is None:
        if "topic" not in types:
            raise ValueError("the sink needs the option topic or a topic column")
        if not isinstance(types["topic"], StringType):
            raise ValueError(f"topic column type must be string, not {types['topic'].simpleString()}")
    if "partition" in types and not isinstance(types["partition"], IntegerType):
        raise ValueError(f"partition column type must be int, not {types['partition'].simpleString()}")
    if "headers" in types:
        h = types["headers"]
        ok = (isinstance(h, ArrayType) and isinstance(h.elementType, StructType)
              and [f.name for f in h.elementType.fields] == ["key", "value"]
              and isinstance(h.elementType["key"].dataType, StringType)
              and isinstance(h.elementType["value"].dataType, BinaryType))
        if not ok:
            raise ValueError(f"headers column type must be array<struct<key:string,value:binary>>, "
                             f"not {h.simpleString()}")


def _check_mode(overwrite: bool) -> None:
    if overwrite:
        raise ValueError("save mode overwrite is not allowed for a topic (records cannot be replaced): use append")
