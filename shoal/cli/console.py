"""``shoal produce``, ``shoal consume`` and ``shoal share-consume``: Kafka's console clients.

* ``produce`` (kafka-console-producer.sh) reads lines from stdin and sends one record per
  line. ``--property parse.key=true`` splits the key off at ``key.separator`` (a tab by
  default); ``parse.headers=true`` reads ``h1:v1,h2:v2`` before ``headers.delimiter`` (a
  tab); ``null.marker`` makes a key, value or header value null; ``ignore.error=true``
  keeps a line without a separator as a value. Long runs print a progress line on stderr.
* ``consume`` (kafka-console-consumer.sh) prints records as Kafka's DefaultMessageFormatter
  does: ``--property print.timestamp|print.partition|print.offset|print.headers|print.key
  =true`` add ``CreateTime:ts``, ``Partition:p``, ``Offset:o``, ``k:v,...`` and the key
  before the value, separated by ``key.separator`` (a tab). Without ``--group`` it reads
  the topic's partitions directly and commits nothing; with ``--group`` it joins the
  group and commits. ``--timeout-ms`` ends it after that long without a record.
  It ends with ``Processed a total of N messages`` on stderr, as Kafka's does.
* ``share-consume`` (kafka-console-share-consumer.sh) reads as a member of a share group
  (default ``console-share-consumer``) and accepts each record, or releases
  (``--release``) or rejects (``--reject``) it. ``print.delivery=true`` shows the delivery
  count.

A share group starts at the latest offset; ``shoal configs --entity-type groups
--entity-name G --alter --add-config share.auto.offset.reset=earliest`` makes it start at
the earliest.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import sys
import time
from collections.abc import Iterator
from typing import Any

from .common import (
    CliError,
    Progress,
    add_connection_options,
    client_config,
    group_limit_text,
    is_group_full,
    kafka_error_text,
    librdkafka_config,
    quiet_logger,
    reach,
    timeout_s,
    tool_main,
    verbose,
)
from .main import command


def _props(items: list[str], what: str) -> dict[str, str]:
    out = {}
    for item in items:
        k, sep, v = item.partition("=")
        if not sep:
            raise CliError(f"{what} expects key=value, got {item!r}")
        out[k.strip()] = v
    return out


def _true(props: dict[str, str], key: str, default: bool = False) -> bool:
    v = props.get(key)
    return default if v is None else v.strip().lower() == "true"


def _unescape(text: str) -> str:
    """Separators given on a shell command line: ``\\t`` and ``\\n`` mean tab and newline."""
    return text.replace("\\t", "\t").replace("\\n", "\n")


# -- produce ------------------------------------------------------------------------------
def _configure_produce(p: argparse.ArgumentParser) -> None:
    add_connection_options(p, timeout_help="how long to wait for the broker, and for each record to be "
                           "acknowledged, in ms (default 10000)")
    p.add_argument("--topic", required=True, help="the topic to produce to")
    p.add_argument("--property", action="append", default=[], metavar="KEY=VALUE",
                   help="line reader settings: parse.key, key.separator, parse.headers, headers.delimiter, "
                        "headers.separator, headers.key.separator, null.marker, ignore.error")
    p.add_argument("--producer-property", action="append", default=[], metavar="KEY=VALUE",
                   help="a producer setting (librdkafka's names, which are mostly Kafka's)")
    p.add_argument("--producer.config", dest="producer_config", metavar="FILE",
                   help="a properties file of producer settings (Kafka's name; --command-config is the same)")
    p.add_argument("--compression-codec", nargs="?", const="gzip", choices=("none", "gzip", "snappy", "lz4", "zstd"),
                   help="compress batches (default none; gzip when given without a value)")
    p.add_argument("--request-required-acks", default="-1", help="acks: -1/all (default), 1 or 0")
    p.add_argument("--sync", action="store_true", help="wait for each record's acknowledgement before the next")
    p.add_argument("--progress-interval-ms", type=int, default=5000, metavar="MS",
                   help="print a progress line on stderr this often during long runs (0: never)")


class LineReader:
    """Kafka's LineMessageReader: one record per line, with optional headers and key."""

    def __init__(self, props: dict[str, str]) -> None:
        self.parse_key = _true(props, "parse.key")
        self.key_separator = _unescape(props.get("key.separator", "\t"))
        self.parse_headers = _true(props, "parse.headers")
        self.headers_delimiter = _unescape(props.get("headers.delimiter", "\t"))
        self.headers_separator = _unescape(props.get("headers.separator", ","))
        self.headers_key_separator = _unescape(props.get("headers.key.separator", ":"))
        self.ignore_error = _true(props, "ignore.error")
        self.null_marker = props.get("null.marker")
        if self.headers_delimiter == self.headers_separator:
            raise CliError("headers.delimiter and headers.separator may not be equal")
        if self.headers_delimiter == self.headers_key_separator:
            raise CliError("headers.delimiter and headers.key.separator may not be equal")
        if self.headers_separator == self.headers_key_separator:
            raise CliError("headers.separator and headers.key.separator may not be equal")
        if self.null_marker is not None and self.null_marker in (self.key_separator, self.headers_separator,
                                                                 self.headers_delimiter, self.headers_key_separator):
            raise CliError("null.marker may not equal a separator")

    def _part(self, enabled: bool, line: str, start: int, sep: str, name: str, number: int) -> str | None:
        if not enabled:
            return None
        i = line.find(sep, start)
        if i < 0:
            if self.ignore_error:
                return None
            raise CliError(f"No {name} found on line number {number}: '{line}'")
        return line[start:i]

    def _bytes(self, text: str | None) -> bytes | None:
        if text is None or (self.null_marker is not None and text == self.null_marker):
            return None
        return text.encode()

    def record(self, line: str, number: int) -> tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]]]:
        headers_text = self._part(self.parse_headers, line, 0, self.headers_delimiter, "headers delimiter", number)
        offset = 0 if headers_text is None else len(headers_text) + len(self.headers_delimiter)
        key = self._part(self.parse_key, line, offset, self.key_separator, "key separator", number)
        offset += 0 if key is None else len(key) + len(self.key_separator)
        value = line[offset:]
        headers: list[tuple[str, bytes | None]] = []
        if headers_text is not None and headers_text != self.null_marker:
            for pair in headers_text.split(self.headers_separator):
                k, sep, v = pair.partition(self.headers_key_separator)
                if not sep:
                    if self.ignore_error:
                        headers.append((pair, None))
                        continue
                    raise CliError(f"No header key separator found in pair '{pair}' on line number {number}")
                if self.null_marker is not None and k == self.null_marker:
                    raise CliError(f"Header keys should not be equal to the null marker '{self.null_marker}' "
                                   f"as they can't be null")
                headers.append((k, self._bytes(v)))
        return self._bytes(key), self._bytes(value), headers


def _lines(stream: Any) -> Iterator[str]:
    for raw in stream:
        line = raw.decode("utf-8", errors="replace")
        line = line.removesuffix("\n")
        line = line.removesuffix("\r")
        yield line


@command("produce", "send lines from stdin as records (kafka-console-producer)")(_configure_produce)
def run_produce(args: argparse.Namespace) -> int:
    def body() -> int:
        from confluent_kafka import Producer

        reader = LineReader(_props(args.property, "--property"))
        reach(args, "console-producer").close()
        t = timeout_s(args)
        conf: dict[str, Any] = {"client.id": "console-producer",
                                **librdkafka_config(client_config(args, args.producer_config)),
                                **_props(args.producer_property, "--producer-property")}
        conf.update({"bootstrap.servers": args.bootstrap_server, "log_level": 0, "logger": quiet_logger(),
                     "acks": "all" if args.request_required_acks in ("-1", "all") else args.request_required_acks,
                     "message.timeout.ms": max(1000, int(t * 1000))})
        if args.compression_codec:
            conf["compression.type"] = args.compression_codec
        failures: list[str] = []

        def delivered(err: Any, _msg: Any) -> None:
            if err is not None:
                failures.append(err.str())

        producer = Producer(conf)
        progress = Progress(f"produced to {args.topic}", args.progress_interval_ms / 1000.0,
                            enabled=args.progress_interval_ms > 0)
        sent = 0
        try:
            for number, line in enumerate(_lines(sys.stdin.buffer), 1):
                key, value, headers = reader.record(line, number)
                while True:
                    try:
                        producer.produce(args.topic, value=value, key=key, headers=headers or None,
                                         on_delivery=delivered)
                        break
                    except BufferError:
                        producer.poll(0.1)
                sent += 1
                if args.sync:
                    if producer.flush(t) > 0:
                        raise CliError(f"record {number} was not acknowledged within {int(t * 1000)} ms")
                else:
                    producer.poll(0)
                if failures:
                    raise CliError(f"cannot produce to {args.topic}: {failures[0]}")
                progress.add()
        finally:
            left = producer.flush(t)
        progress.finish()
        if failures:
            raise CliError(f"{len(failures)} of {sent} records were not produced: {failures[0]}")
        if left:
            raise CliError(f"{left} of {sent} records were not acknowledged within {int(t * 1000)} ms")
        verbose(args, f"produced {sent} records to {args.topic}")
        return 0

    return tool_main("produce", body)


# -- formatting (consume, share-consume) ---------------------------------------------------
class Formatter:
    """Kafka's DefaultMessageFormatter, with its ``print.*`` and separator properties."""

    def __init__(self, props: dict[str, str]) -> None:
        self.timestamp = _true(props, "print.timestamp")
        self.partition = _true(props, "print.partition")
        self.offset = _true(props, "print.offset")
        self.delivery = _true(props, "print.delivery")
        self.headers = _true(props, "print.headers")
        self.key = _true(props, "print.key")
        self.value = _true(props, "print.value", True)
        self.key_separator = _unescape(props.get("key.separator", "\t")).encode()
        self.line_separator = _unescape(props.get("line.separator", "\n")).encode()
        self.headers_separator = _unescape(props.get("headers.separator", ",")).encode()
        self.null_literal = props.get("null.literal", "null").encode()

    def format(self, msg: Any, delivery_count: int | None = None) -> bytes:
        cols: list[bytes] = []
        if self.timestamp:
            kind, ts = msg.timestamp()
            cols.append({1: b"CreateTime:%d" % ts, 2: b"LogAppendTime:%d" % ts}.get(kind, b"NO_TIMESTAMP"))
        if self.partition:
            cols.append(b"Partition:%d" % msg.partition())
        if self.offset:
            cols.append(b"Offset:%d" % msg.offset())
        if self.delivery:
            cols.append(b"Delivery:" + (b"%d" % delivery_count if delivery_count is not None else b"NOT_PRESENT"))
        if self.headers:
            hs = msg.headers() or []
            cols.append(self.headers_separator.join(
                k.encode() + b":" + (v if v is not None else self.null_literal) for k, v in hs) or b"NO_HEADERS")
        if self.key:
            k = msg.key()
            cols.append(k if k is not None else self.null_literal)
        out = self.key_separator.join(cols)
        if self.value:
            v = msg.value()
            out = (out + self.key_separator if cols else b"") + (v if v is not None else self.null_literal)
            return out + self.line_separator
        return out + (self.key_separator if cols else b"")


def _add_consumer_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-messages", type=int, default=-1, help="stop after this many records")
    p.add_argument("--timeout-ms", type=int, default=None, help="stop when no record arrives for this long")
    p.add_argument("--property", action="append", default=[], metavar="KEY=VALUE",
                   help="formatter settings: print.timestamp, print.partition, print.offset, print.headers, "
                        "print.key, print.value, key.separator, line.separator, headers.separator, null.literal")
    p.add_argument("--consumer-property", action="append", default=[], metavar="KEY=VALUE",
                   help="a consumer setting (librdkafka's names, which are mostly Kafka's)")


def _configure_consume(p: argparse.ArgumentParser) -> None:
    add_connection_options(p)
    p.add_argument("--topic", help="the topic to read")
    p.add_argument("--include", help="a regular expression of topics to read (with a group)")
    p.add_argument("--group", help="the consumer group (default: none; nothing is committed)")
    p.add_argument("--from-beginning", action="store_true", help="start at the earliest offset when the group has "
                   "no committed offset (default: the latest)")
    p.add_argument("--partition", type=int, help="read only this partition")
    p.add_argument("--offset", default=None, help="with --partition: earliest, latest or an offset")
    p.add_argument("--consumer.config", dest="consumer_config", metavar="FILE",
                   help="a properties file of consumer settings (Kafka's name; --command-config is the same)")
    p.add_argument("--isolation-level", choices=("read_committed", "read_uncommitted"), default=None)
    _add_consumer_options(p)


_JOIN_GRACE_S = 30.0  # before the first assignment, --timeout-ms counts only after this long


def _write(data: bytes) -> None:
    sys.stdout.buffer.write(data)
    sys.stdout.buffer.flush()


@command("consume", "print records of topics (kafka-console-consumer)")(_configure_consume)
def run_consume(args: argparse.Namespace) -> int:
    def body() -> int:
        from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, TopicPartition

        a = args
        if not a.topic and not a.include:
            raise CliError("Exactly one of --include/--topic is required.")
        if a.offset is not None and a.partition is None:
            raise CliError("The partition is required when offset is specified.")
        if a.partition is not None and a.group:
            raise CliError("Options --group and --partition cannot be specified together.")
        formatter = Formatter(_props(a.property, "--property"))
        conn = reach(a, "console-consumer")
        conn.close()
        t = timeout_s(a)
        extra = {**librdkafka_config(client_config(a, a.consumer_config)),
                 **_props(a.consumer_property, "--consumer-property")}
        if a.from_beginning and extra.get("auto.offset.reset", "earliest") != "earliest":
            raise CliError(f"Can't simultaneously specify --from-beginning and 'auto.offset.reset="
                           f"{extra['auto.offset.reset']}', please remove one option")
        conf: dict[str, Any] = {"client.id": "console-consumer", "auto.offset.reset": "latest",
                                "enable.auto.commit": True, **extra}
        if a.from_beginning:
            conf["auto.offset.reset"] = "earliest"
        if a.isolation_level:
            conf["isolation.level"] = a.isolation_level
        group = a.group or extra.get("group.id")
        conf.update({"bootstrap.servers": a.bootstrap_server, "log_level": 0, "logger": quiet_logger(),
                     "group.id": group or f"console-consumer-{random.randrange(100000)}"})
        if not group:
            conf["enable.auto.commit"] = False
        consumer = Consumer(conf)
        count = 0
        try:
            assigned_at: list[float] = []
            if group:
                def on_assign(_c: Any, parts: Any) -> None:
                    assigned_at.append(time.monotonic())
                    verbose(a, f"group {group} assigned {', '.join(f'{p.topic}-{p.partition}' for p in parts)}")

                consumer.subscribe([a.topic] if a.topic else ["^" + a.include.replace(",", "|")], on_assign=on_assign)
                verbose(a, f"joining group {group}")
            else:
                if not a.topic:
                    raise CliError("--include needs --group")
                md = consumer.list_topics(a.topic, timeout=t).topics.get(a.topic)
                if md is None or md.error is not None:
                    raise CliError(f"topic {a.topic} does not exist"
                                   + (f": {md.error.str()}" if md is not None and md.error is not None else ""))
                parts = sorted(md.partitions) if a.partition is None else [a.partition]
                if a.partition is not None and a.partition not in md.partitions:
                    raise CliError(f"topic {a.topic} has no partition {a.partition}")
                if a.offset is None:
                    start = OFFSET_BEGINNING if a.from_beginning else OFFSET_END
                elif a.offset == "earliest":
                    start = OFFSET_BEGINNING
                elif a.offset == "latest":
                    start = OFFSET_END
                else:
                    try:
                        start = int(a.offset)
                    except ValueError:
                        raise CliError(f"invalid --offset {a.offset!r}: earliest, latest or a number") from None
                consumer.assign([TopicPartition(a.topic, p, start) for p in parts])
                assigned_at.append(time.monotonic())
                verbose(a, f"reading {a.topic} partitions {parts} without a group")
            started = last = time.monotonic()
            while a.max_messages < 0 or count < a.max_messages:
                msg = consumer.poll(0.2)
                if msg is None:
                    # The clock starts when the group has assigned partitions (joining takes a while).
                    waited = time.monotonic() - (max(last, assigned_at[0]) if assigned_at else started + _JOIN_GRACE_S)
                    if a.timeout_ms is not None and waited * 1000 >= a.timeout_ms:
                        verbose(a, f"no record for {a.timeout_ms} ms")
                        break
                    continue
                if msg.error() is not None:
                    if msg.error().code() == -191:  # _PARTITION_EOF
                        continue
                    if is_group_full(msg.error()) and group:
                        raise CliError(f"cannot consume: {group_limit_text(a, group, 'consumer')}")
                    if msg.error().fatal() or not msg.error().retriable():
                        raise CliError(f"cannot consume: {kafka_error_text(msg.error())}")
                    continue
                last = time.monotonic()
                _write(formatter.format(msg))
                count += 1
        finally:
            with contextlib.suppress(Exception):
                consumer.close()
            print(f"Processed a total of {count} messages", file=sys.stderr, flush=True)
        return 0

    return tool_main("consume", body)


def _configure_share_consume(p: argparse.ArgumentParser) -> None:
    add_connection_options(p)
    p.add_argument("--topic", required=True, help="the topic to read")
    p.add_argument("--group", default="console-share-consumer",
                   help="the share group (default console-share-consumer)")
    ack = p.add_mutually_exclusive_group()
    ack.add_argument("--reject", action="store_true", help="reject each record (never delivered again)")
    ack.add_argument("--release", action="store_true", help="release each record (delivered again)")
    p.add_argument("--consumer.config", "--consumer-config", dest="consumer_config", metavar="FILE",
                   help="a properties file of consumer settings (Kafka's name; --command-config is the same)")
    _add_consumer_options(p)


@command("share-consume", "print records read in a share group (kafka-console-share-consumer)")(
    _configure_share_consume)
def run_share_consume(args: argparse.Namespace) -> int:
    def body() -> int:
        try:
            from confluent_kafka import AcknowledgeType, ShareConsumer
        except ImportError:
            raise CliError("shoal share-consume needs confluent-kafka 2.16 or later (ShareConsumer)") from None

        a = args
        formatter = Formatter(_props(a.property, "--property"))
        reach(a, "console-share-consumer").close()
        kind = AcknowledgeType.REJECT if a.reject else AcknowledgeType.RELEASE if a.release else AcknowledgeType.ACCEPT
        extra = {**librdkafka_config(client_config(a, a.consumer_config)),
                 **_props(a.consumer_property, "--consumer-property")}
        conf: dict[str, Any] = {"client.id": "console-share-consumer", **extra,
                                "bootstrap.servers": a.bootstrap_server, "log_level": 0, "logger": quiet_logger(),
                                "group.id": a.group, "share.acknowledgement.mode": "explicit"}
        consumer = ShareConsumer(conf)
        count = 0
        try:
            consumer.subscribe([a.topic])
            verbose(a, f"joined share group {a.group}; acknowledging with {kind.name}")
            last = time.monotonic()
            while a.max_messages < 0 or count < a.max_messages:
                msgs = consumer.poll(0.5)
                got = False
                for msg in msgs:
                    if msg.error() is not None:
                        continue
                    if 0 <= a.max_messages <= count:
                        consumer.acknowledge(msg, AcknowledgeType.RELEASE)
                        continue
                    got = True
                    _write(formatter.format(msg, msg.delivery_count()))
                    consumer.acknowledge(msg, kind)
                    count += 1
                if got:
                    last = time.monotonic()
                    consumer.commit_sync()
                elif a.timeout_ms is not None and (time.monotonic() - last) * 1000 >= a.timeout_ms:
                    verbose(a, f"no record for {a.timeout_ms} ms")
                    break
        except Exception as e:
            if isinstance(e, CliError):
                raise
            if is_group_full(e):
                raise CliError(f"cannot consume: {group_limit_text(a, a.group, 'share')}") from None
            raise CliError(f"cannot consume: {kafka_error_text(e)}") from None
        finally:
            with contextlib.suppress(Exception):
                consumer.commit_sync()
            with contextlib.suppress(Exception):
                consumer.close()
            print(f"Processed a total of {count} messages", file=sys.stderr, flush=True)
        return 0

    return tool_main("share-consume", body)
