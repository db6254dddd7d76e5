"""``shoal topics``: create, list, describe, alter and delete topics (kafka-topics.sh).

Options and output are those of Kafka's ``kafka-topics.sh``: ``--topic`` is a regular
expression for everything but ``--create`` (``,`` separates alternatives), ``--describe``
prints one ``Topic: ... PartitionCount: ...`` line per topic and one tab-indented line per
partition, errors read ``Error while executing topic command : ...``. ``--output json``
prints the same facts as one JSON document. Talks to the broker through confluent-kafka's
AdminClient.
"""

from __future__ import annotations

import argparse
import json
import re
from typing import Any

from .common import (
    CliError,
    add_connection_options,
    add_output_options,
    admin_client,
    kafka_error_text,
    reach,
    timeout_s,
    tool_main,
    verbose,
)
from .main import command

INTERNAL_TOPICS = frozenset({"__consumer_offsets", "__share_group_state", "__transaction_state"})
_PREFIX = "Error while executing topic command : "


def _configure(p: argparse.ArgumentParser) -> None:
    add_connection_options(p)
    action = p.add_mutually_exclusive_group(required=True)
    action.add_argument("--create", action="store_true", help="create a topic")
    action.add_argument("--list", action="store_true", help="list the topics")
    action.add_argument("--describe", action="store_true", help="describe topics: partitions, replicas, configs")
    action.add_argument("--alter", action="store_true", help="add partitions to a topic (--partitions)")
    action.add_argument("--delete", action="store_true", help="delete topics")
    p.add_argument("--topic", help="the topic (a regular expression except with --create)")
    p.add_argument("--partitions", type=int, help="partitions of a new topic, or the new total with --alter")
    p.add_argument("--replication-factor", type=int, help="replication factor of a new topic")
    p.add_argument("--config", action="append", default=[], metavar="NAME=VALUE",
                   help="a topic config of a new topic; repeatable")
    p.add_argument("--if-not-exists", action="store_true", help="with --create: no error if the topic exists")
    p.add_argument("--if-exists", action="store_true",
                   help="with --alter, --describe, --delete: no error if the topic does not exist")
    p.add_argument("--exclude-internal", action="store_true", help="leave out internal topics")
    p.add_argument("--topics-with-overrides", action="store_true",
                   help="with --describe: only topics with configs that differ from the defaults")
    p.add_argument("--under-replicated-partitions", action="store_true",
                   help="with --describe: only partitions whose in-sync replicas are fewer than their replicas")
    p.add_argument("--unavailable-partitions", action="store_true",
                   help="with --describe: only partitions without a leader")
    add_output_options(p)


class _Topics:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.t = timeout_s(args)
        reach(args, "shoal-topics").close()
        self.admin = admin_client(args)

    def names(self) -> list[str]:
        md = self.admin.list_topics(timeout=self.t)
        names = sorted(md.topics)
        if self.args.exclude_internal:
            names = [n for n in names if n not in INTERNAL_TOPICS and not n.startswith("__")]
        if self.args.topic:
            rx = re.compile(self.args.topic.replace(",", "|"))
            names = [n for n in names if rx.fullmatch(n)]
        return names

    def selected(self) -> list[str]:
        names = self.names()
        if self.args.topic and not names and not self.args.if_exists:
            raise CliError(f"Topic '{self.args.topic}' does not exist as expected", prefix=_PREFIX)
        return names

    def _wait(self, futures: dict[Any, Any]) -> dict[Any, BaseException]:
        failed = {}
        for k, f in futures.items():
            try:
                f.result(timeout=self.t)
            except Exception as e:
                failed[k] = e
        return failed

    def create(self) -> int:
        from confluent_kafka import KafkaError
        from confluent_kafka.admin import NewTopic

        a = self.args
        if not a.topic:
            raise CliError("--create needs --topic", prefix=_PREFIX)
        if a.replication_factor is not None and not 1 <= a.replication_factor <= 32767:
            raise CliError("The replication factor must be between 1 and 32767 inclusive", prefix=_PREFIX)
        if a.partitions is not None and a.partitions < 1:
            raise CliError("The partitions must be greater than 0", prefix=_PREFIX)
        configs = {}
        for item in a.config:
            k, sep, v = item.partition("=")
            if not sep:
                raise CliError(f"Invalid topic config: all configs to be added must be in the format \"key=val\": "
                               f"{item!r}", prefix=_PREFIX)
            configs[k.strip()] = v.strip()
        if "." in a.topic and "_" in a.topic:
            print("WARNING: Due to limitations in metric names, topics with a period ('.') or underscore ('_') "
                  "could collide. To avoid issues it is best to use either, but not both.")
        new = NewTopic(a.topic, a.partitions if a.partitions is not None else -1,
                       a.replication_factor if a.replication_factor is not None else -1, config=configs)
        fut = self.admin.create_topics([new], request_timeout=self.t)[a.topic]
        failed = self._wait({a.topic: fut})
        if failed:
            e = failed[a.topic]
            err = e.args[0] if e.args else None
            if getattr(err, "code", lambda: None)() == KafkaError.TOPIC_ALREADY_EXISTS:
                if a.if_not_exists:
                    verbose(a, f"topic {a.topic} exists already")
                    return 0
                raise CliError(f"Topic '{a.topic}' already exists.", prefix=_PREFIX)
            raise CliError(kafka_error_text(e), prefix=_PREFIX)
        if a.output == "json":
            print(json.dumps({"created": a.topic}))
        else:
            print(f"Created topic {a.topic}.")
        return 0

    def list(self) -> int:
        names = self.names()
        if self.args.output == "json":
            print(json.dumps(names))
        elif names:
            print("\n".join(names))
        return 0

    def alter(self) -> int:
        from confluent_kafka.admin import NewPartitions

        a = self.args
        if a.partitions is None:
            raise CliError("--alter needs --partitions (topic configs are changed with shoal configs)", prefix=_PREFIX)
        if a.config:
            raise CliError("--config is not supported with --alter: use shoal configs --alter", prefix=_PREFIX)
        names = self.selected()
        if not names:
            return 0
        futs = self.admin.create_partitions([NewPartitions(n, a.partitions) for n in names], request_timeout=self.t)
        failed = self._wait(futs)
        if failed:
            raise CliError("; ".join(f"{n}: {kafka_error_text(e)}" for n, e in failed.items()), prefix=_PREFIX)
        verbose(a, f"{', '.join(names)}: {a.partitions} partitions")
        return 0

    def delete(self) -> int:
        names = self.selected()
        internal = [n for n in names if n in INTERNAL_TOPICS]
        if internal:
            raise CliError(f"Topic {internal[0]} is a kafka internal topic and is not allowed to be marked for "
                           f"deletion.", prefix=_PREFIX)
        if not names:
            return 0
        failed = self._wait(self.admin.delete_topics(names, request_timeout=self.t))
        if failed:
            raise CliError("; ".join(f"{n}: {kafka_error_text(e)}" for n, e in failed.items()), prefix=_PREFIX)
        verbose(self.args, f"deleted {', '.join(names)}")
        return 0

    def describe(self) -> int:
        from confluent_kafka import TopicCollection
        from confluent_kafka.admin import ConfigResource, ResourceType

        a = self.args
        names = self.selected()
        if not names:
            if a.output == "json":
                print("[]")
            return 0
        described = self.admin.describe_topics(TopicCollection(names), request_timeout=self.t)
        resources = {n: ConfigResource(ResourceType.TOPIC, n) for n in names}
        configs = self.admin.describe_configs(list(resources.values()), request_timeout=self.t)
        out = []
        for n in names:
            try:
                td = described[n].result(timeout=self.t)
            except Exception as e:
                if a.if_exists:
                    continue
                raise CliError(f"{n}: {kafka_error_text(e)}", prefix=_PREFIX) from None
            entries = configs[resources[n]].result(timeout=self.t)
            overrides = {k: v.value for k, v in sorted(entries.items()) if not v.is_default}
            parts = sorted(td.partitions, key=lambda p: p.id)
            replication = len(parts[0].replicas) if parts else 0
            rows = []
            for p in parts:
                leader = p.leader.id if p.leader is not None and p.leader.id >= 0 else None
                rows.append({"partition": p.id, "leader": leader, "replicas": [r.id for r in p.replicas],
                             "isr": [r.id for r in p.isr]})
            if a.under_replicated_partitions:
                rows = [r for r in rows if len(r["isr"]) < len(r["replicas"])]
            if a.unavailable_partitions:
                rows = [r for r in rows if r["leader"] is None]
            partition_filter = a.under_replicated_partitions or a.unavailable_partitions
            if a.topics_with_overrides and not overrides:
                continue
            out.append({"topic": n, "topic_id": str(td.topic_id) if td.topic_id else None,
                        "partition_count": len(parts), "replication_factor": replication, "configs": overrides,
                        "partitions": rows, "_filtered": partition_filter})
        if a.output == "json":
            for t in out:
                t.pop("_filtered")
            print(json.dumps(out))
            return 0
        for t in out:
            if not t["_filtered"]:
                cfg = ",".join(f"{k}={v}" for k, v in t["configs"].items())
                line = f"Topic: {t['topic']}"
                if t["topic_id"]:
                    line += f"\tTopicId: {t['topic_id']}"
                print(f"{line}\tPartitionCount: {t['partition_count']}\tReplicationFactor: "
                      f"{t['replication_factor']}\tConfigs: {cfg}")
            if a.topics_with_overrides:
                continue
            for r in t["partitions"]:
                leader = "none" if r["leader"] is None else r["leader"]
                print(f"\tTopic: {t['topic']}\tPartition: {r['partition']}\tLeader: {leader}\t"
                      f"Replicas: {','.join(map(str, r['replicas']))}\tIsr: {','.join(map(str, r['isr']))}\t"
                      f"Elr: \tLastKnownElr: ")
        return 0


@command("topics", "create, list, describe, alter and delete topics (kafka-topics)")(_configure)
def run(args: argparse.Namespace) -> int:
    def body() -> int:
        tool = _Topics(args)
        if args.create:
            return tool.create()
        if args.list:
            return tool.list()
        if args.describe:
            return tool.describe()
        if args.alter:
            return tool.alter()
        return tool.delete()

    return tool_main("topics", body)
