"""Every configuration key shoal knows, in one table, by its Kafka name.

Theory of operation
-------------------
A key is declared once in ``CONFIG_DEFS`` with its type, default, scope and a one-line
doc.  Three scopes exist, as in Kafka:

* ``BROKER``: read at start from the properties file and ``-o key=value`` overrides;
  ``log.*`` broker keys are also the defaults of the matching topic keys.
* ``TOPIC``: per-topic overrides (``CreateTopics`` configs, ``AlterConfigs``); a topic
  key without an override falls back to its broker key (``Definition.broker_synonym``).
* ``GROUP``: per-group overrides (resource type GROUP, KIP-932); a group key without an
  override falls back to its broker key.

This module is pure: it parses strings and answers look-ups; it reads no files itself
except through :func:`load_properties`, which the CLI calls.  docs/CONFIGURATION.md is
generated from this table (``python -m shoal.config``), so the two cannot drift.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "CONFIG_DEFS",
    "KAFKA_TOPIC_KEYS_NOT_SUPPORTED",
    "BrokerConfig",
    "ConfigError",
    "Definition",
    "Scope",
    "check_topic_key",
    "group_defaults",
    "load_properties",
    "parse_value",
    "topic_defaults",
    "topic_keys",
]


class ConfigError(ValueError):
    """A key is unknown or a value does not parse or fails its check."""


class Scope(enum.Enum):
    BROKER = "broker"
    TOPIC = "topic"
    GROUP = "group"


@dataclass(frozen=True, slots=True)
class Definition:
    name: str
    type: type  # int, bool, str, float or list (comma separated strings)
    default: Any
    scope: Scope
    doc: str
    broker_synonym: str | None = None
    """For TOPIC/GROUP keys: the broker key that supplies the default."""
    check: Callable[[Any], bool] | None = None
    """A Range or OneOfList (their str() names the allowed values in errors and in the docs)."""
    choices: tuple[str, ...] | None = None
    dynamic: bool = True
    """Whether IncrementalAlterConfigs may change it while running."""


MIB = 1024 * 1024
DAY_MS = 24 * 60 * 60 * 1000


class Range:
    """A numeric range check, named as Kafka's ConfigDef names it ("at least 1", "between 2 and 10")."""

    __slots__ = ("hi", "lo")

    def __init__(self, lo: int | None, hi: int | None = None) -> None:
        self.lo = lo
        self.hi = hi

    def __call__(self, value: Any) -> bool:
        return (self.lo is None or value >= self.lo) and (self.hi is None or value <= self.hi)

    def __str__(self) -> str:
        if self.hi is None:
            return f"at least {self.lo}"
        if self.lo is None:
            return f"at most {self.hi}"
        return f"between {self.lo} and {self.hi}"


def _ge(n: int) -> Range:
    return Range(n)


def _between(lo: int, hi: int) -> Range:
    return Range(lo, hi)


class OneOfList:
    """Every item of a list value must be one of ``choices`` (Kafka's ValidList.in)."""

    __slots__ = ("choices",)

    def __init__(self, *choices: str) -> None:
        self.choices = choices

    def __call__(self, value: Any) -> bool:
        items = value if isinstance(value, list) else [x.strip() for x in str(value).split(",") if x.strip()]
        return bool(items) and all(x in self.choices for x in items)

    def __str__(self) -> str:
        return f"a non-empty list of {', '.join(self.choices)}"


# Kafka's record overhead of a v0 message: the smallest segment.bytes Kafka's LogConfig allows.
_MIN_SEGMENT_BYTES = 14


class _NoLimitOr(Range):
    """-1 (no limit) or a value of the range."""

    __slots__ = ()

    def __call__(self, value: Any) -> bool:
        return value == -1 or super().__call__(value)

    def __str__(self) -> str:
        return f"-1, or {super().__str__()}"


class _HostCounts:
    """``host-or-ip:count`` pairs, comma separated; host names are resolved when the broker starts."""

    __slots__ = ()

    def __call__(self, value: Any) -> bool:
        for entry in str(value).split(","):
            host, sep, count = entry.strip().rpartition(":")
            if entry.strip() and (not sep or not host or not count.strip().isdigit()):
                return False
        return True

    def __str__(self) -> str:
        return "host-or-ip:count pairs, comma separated"


class _OnlyFalse:
    """A boolean that may only be false (a Kafka setting whose true shoal does not implement)."""

    __slots__ = ()

    def __call__(self, value: Any) -> bool:
        return value is False

    def __str__(self) -> str:
        return "false (true is not supported)"


class _Listeners:
    """``NAME://host:port`` entries, comma separated, each port 0-65535 (empty allowed when ``optional``)."""

    __slots__ = ("optional",)

    def __init__(self, optional: bool = False) -> None:
        self.optional = optional

    def __call__(self, value: Any) -> bool:
        entries = [e.strip() for e in str(value).split(",")]
        if entries == [""]:
            return self.optional
        for entry in entries:
            _, _, port = entry.split("://")[-1].rpartition(":")
            if not port.isdigit() or not 0 <= int(port) <= 65535:
                return False
        return True

    def __str__(self) -> str:
        return ("empty, or " if self.optional else "") + "NAME://host:port entries, comma separated, each port 0-65535"


_DEFS: list[Definition] = [
    # --- server -------------------------------------------------------------------
    Definition("node.id", int, 0, Scope.BROKER, "The id of this broker in Metadata replies.", check=_ge(0),
               dynamic=False),
    Definition("cluster.id", str, "", Scope.BROKER,
               "Cluster id; empty means generate one at first start and keep it in the data directory.",
               dynamic=False),
    Definition("listeners", str, "PLAINTEXT://127.0.0.1:9092", Scope.BROKER,
               "Where to listen: `NAME://host:port` entries, comma separated (an empty host: every interface); "
               "each NAME's security protocol is in `listener.security.protocol.map` (docs/SECURITY.md). "
               "`shoal serve --host/--port` replace the first listener's host and port.", check=_Listeners(),
               dynamic=False),
    Definition("advertised.listeners", str, "", Scope.BROKER,
               "`NAME://host:port` given to clients (Metadata, FindCoordinator, DescribeCluster) for the "
               "listener their request came in on; a listener not named here gives its bound address.",
               check=_Listeners(True),
               dynamic=False),
    Definition("log.dirs", str, "./shoal-data", Scope.BROKER,
               "The data directory (one is supported); `--data-dir` overrides it.", dynamic=False),
    Definition("socket.request.max.bytes", int, 100 * MIB, Scope.BROKER,
               "Largest request frame accepted; a larger one closes the connection.", check=_ge(1)),
    Definition("queued.max.requests", int, 500, Scope.BROKER,
               "Requests in flight per connection before the broker stops reading from it.", check=_ge(1)),
    Definition("queued.max.request.bytes", int, 256 * MIB, Scope.BROKER,
               "Memory for request bodies, shared by all connections: a connection takes a frame's size when "
               "it reads the size prefix and waits (stops reading) while the pool lacks it. Kafka's default is "
               "-1 (unbounded); shoal's 256 MiB keeps partly sent frames from exhausting memory (500 peers "
               "each sending most of a 100 MiB frame) while leaving room for two maximal frames and many "
               "ordinary requests. -1 means unbounded.", check=_NoLimitOr(1), dynamic=False),
    Definition("max.connections", int, 2147483647, Scope.BROKER,
               "Connections open at once; at the limit the broker stops accepting until one closes.",
               check=_ge(1), dynamic=False),
    Definition("max.connections.per.ip", int, 2147483647, Scope.BROKER,
               "Connections open at once from one address; more are accepted and closed at once.",
               check=_ge(0), dynamic=False),
    Definition("max.connections.per.ip.overrides", str, "", Scope.BROKER,
               "Per-address exceptions to max.connections.per.ip: `host-or-ip:count` pairs, comma separated.",
               check=_HostCounts(), dynamic=False),
    Definition("connections.max.idle.ms", int, 600_000, Scope.BROKER,
               "Close a connection that received and sent nothing for this long and has no request in "
               "progress (including one waiting for request memory); -1 never closes idle connections.",
               check=_NoLimitOr(1), dynamic=False),
    Definition("auto.create.topics.enable", bool, True, Scope.BROKER,
               "Create a topic (with `num.partitions` partitions) when a Metadata request that allows it "
               "names one that does not exist (in a cluster through etcd, with `default.replication.factor` "
               "replicas, as CreateTopics does)."),
    Definition("num.partitions", int, 1, Scope.BROKER, "Partitions of an auto-created topic.", check=_ge(1)),
    Definition("default.replication.factor", int, 1, Scope.BROKER,
               "Replication factor of new topics that ask for -1 and of auto-created topics (one broker: "
               "always 1; in a cluster, more than the registered brokers fails with INVALID_REPLICATION_FACTOR)."),
    Definition("delete.topic.enable", bool, True, Scope.BROKER, "Whether DeleteTopics is allowed."),
    Definition("message.max.bytes", int, 1048588, Scope.BROKER,
               "Largest record batch accepted (topic key: max.message.bytes).", check=_ge(0)),
    Definition("shutdown.timeout.ms", int, 10_000, Scope.BROKER,
               "How long a clean shutdown waits for in-flight requests.", check=_ge(0)),
    # --- security (shoal/security; docs/SECURITY.md) -----------------------------------
    Definition("listener.security.protocol.map", str,
               "PLAINTEXT:PLAINTEXT,SSL:SSL,SASL_PLAINTEXT:SASL_PLAINTEXT,SASL_SSL:SASL_SSL", Scope.BROKER,
               "`NAME:PROTOCOL` pairs: the security protocol (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL) of each "
               "listener name.", dynamic=False),
    Definition("inter.broker.listener.name", str, "", Scope.BROKER,
               "The listener brokers of a cluster connect to each other on (authenticating as its protocol "
               "asks); empty: the listener named PLAINTEXT, else the first.", dynamic=False),
    Definition("ssl.keystore.type", str, "", Scope.BROKER,
               "PEM or PKCS12 (JKS is not read: convert it with keytool); empty: PEM when "
               "`ssl.keystore.key` is set or the file is PEM text, else PKCS12.",
               choices=("", "PEM", "PKCS12", "JKS"), dynamic=False),
    Definition("ssl.keystore.location", str, "", Scope.BROKER,
               "The listener's key and certificate chain: a PEM file (the private key and the certificates) "
               "or a PKCS12 file.", dynamic=False),
    Definition("ssl.keystore.password", str, "", Scope.BROKER, "The PKCS12 keystore's password.", dynamic=False),
    Definition("ssl.key.password", str, "", Scope.BROKER,
               "The password of an encrypted private key (PEM).", dynamic=False),
    Definition("ssl.keystore.key", str, "", Scope.BROKER,
               "With `ssl.keystore.type=PEM`: the private key itself (PEM text; encrypted with "
               "`ssl.key.password` if set).", dynamic=False),
    Definition("ssl.keystore.certificate.chain", str, "", Scope.BROKER,
               "With `ssl.keystore.type=PEM`: the certificate chain itself (PEM text).", dynamic=False),
    Definition("ssl.truststore.type", str, "", Scope.BROKER,
               "PEM or PKCS12; empty: PEM when `ssl.truststore.certificates` is set or the file is PEM text, "
               "else PKCS12.", choices=("", "PEM", "PKCS12", "JKS"), dynamic=False),
    Definition("ssl.truststore.location", str, "", Scope.BROKER,
               "CA certificates that client certificates are verified against (and, between brokers, the "
               "other broker's certificate): a PEM or PKCS12 file.", dynamic=False),
    Definition("ssl.truststore.password", str, "", Scope.BROKER, "The PKCS12 truststore's password.",
               dynamic=False),
    Definition("ssl.truststore.certificates", str, "", Scope.BROKER,
               "With `ssl.truststore.type=PEM`: the CA certificates themselves (PEM text).", dynamic=False),
    Definition("ssl.client.auth", str, "none", Scope.BROKER,
               "Client certificates on SSL listeners: required, requested (verified if sent) or none. A "
               "verified certificate's subject is the principal (`User:CN=...`).",
               choices=("none", "requested", "required"), dynamic=False),
    Definition("ssl.enabled.protocols", list, ["TLSv1.2", "TLSv1.3"], Scope.BROKER,
               "TLS versions accepted.", check=OneOfList("TLSv1.2", "TLSv1.3"), dynamic=False),
    Definition("ssl.endpoint.identification.algorithm", str, "https", Scope.BROKER,
               "Between brokers: https checks that the other broker's certificate names its host; empty "
               "does not.", choices=("", "https"), dynamic=False),
    Definition("sasl.enabled.mechanisms", list, ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"], Scope.BROKER,
               "SASL mechanisms offered on SASL listeners (Kafka's default, GSSAPI, is not supported).",
               check=OneOfList("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"), dynamic=False),
    Definition("sasl.mechanism.inter.broker.protocol", str, "PLAIN", Scope.BROKER,
               "The mechanism a broker authenticates with to another on a SASL inter-broker listener.",
               choices=("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"), dynamic=False),
    Definition("sasl.jaas.config", str, "", Scope.BROKER,
               "Kafka's JAAS line: PlainLoginModule with `user_NAME=\"password\"` entries (the PLAIN users) "
               "and `username`/`password` (what this broker logs in with to others); also per listener and "
               "mechanism as `listener.name.<listener>.<mechanism>.sasl.jaas.config`.", dynamic=False),
    Definition("connection.failed.authentication.delay.ms", int, 100, Scope.BROKER,
               "How long a failed authentication waits before its answer, after which the connection is "
               "closed.", check=_ge(0), dynamic=False),
    Definition("connections.max.reauth.ms", int, 0, Scope.BROKER,
               "SASL sessions last this long (KIP-368): the client must authenticate again on the same "
               "connection before then, or its next request closes the connection; 0: sessions never expire.",
               check=_ge(0), dynamic=False),
    Definition("super.users", str, "", Scope.BROKER,
               "Principals, `;` separated (`User:admin;User:CN=broker`), allowed everything by the authorizer, "
               "and the brokers' own APIs on a secured broker without one, besides the inter-broker "
               "listener's principals.", dynamic=False),
    Definition("quota.window.num", int, 11, Scope.BROKER,
               "Samples a client quota's rate is measured over (producer_byte_rate, consumer_byte_rate, "
               "request_percentage; docs/SECURITY.md).", check=_ge(1), dynamic=False),
    Definition("quota.window.size.seconds", int, 1, Scope.BROKER,
               "Length of each of the quota.window.num samples of a client quota's rate.", check=_ge(1),
               dynamic=False),
    Definition("authorizer.class.name", str, "", Scope.BROKER,
               "The authorizer: `org.apache.kafka.metadata.authorizer.StandardAuthorizer` (or `shoal.acl`) "
               "checks every request against the ACLs (CreateAcls, `shoal acls`, `kafka-acls`); empty: "
               "no authorizer, every request is allowed (docs/SECURITY.md).", dynamic=False),
    Definition("allow.everyone.if.no.acl.found", bool, False, Scope.BROKER,
               "With an authorizer: a resource that no ACL names is open to every principal (true) or to "
               "`super.users` only (false).", dynamic=False),
    # --- observing (shoal/observe; docs/OBSERVING.md) -----------------------------------
    Definition("metrics.port", int, -1, Scope.BROKER,
               "Port of the HTTP endpoint serving Prometheus metrics (`/metrics`), `/healthz`, `/readyz` and the "
               "queue view (`/`); -1 turns it off, 0 picks a free port.", check=Range(-1, 65535), dynamic=False),
    Definition("metrics.host", str, "", Scope.BROKER,
               "Address the metrics endpoint listens on; empty means the listener's address.", dynamic=False),
    Definition("log.format", str, "text", Scope.BROKER,
               "Broker log lines: `text` (timestamp, level, logger, message) or `json` (one JSON object per line).",
               choices=("text", "json"), dynamic=False),
    # --- cluster (shoal/cluster; docs/CLUSTER.md) ----------------------------------
    Definition("metadata.store", str, "local", Scope.BROKER,
               "Where cluster metadata lives: `local` (this broker alone, files in the data directory) or "
               "`etcd://host:port[,host:port...]` (a cluster of brokers sharing one etcd).", dynamic=False),
    Definition("broker.rack", str, "", Scope.BROKER,
               "This broker's rack; replicas of a partition go to distinct racks when every broker has one.",
               dynamic=False),
    Definition("broker.session.timeout.ms", int, 9000, Scope.BROKER,
               "A broker that has not refreshed its etcd lease for this long is dead to the cluster "
               "(rounded up to whole seconds, etcd's lease unit); after an outage of etcd itself every "
               "broker gets this long again to register before it is fenced.", check=_ge(1000), dynamic=False),
    Definition("replica.lag.time.max.ms", int, 30_000, Scope.BROKER,
               "A follower that has not caught up with the leader's log end for this long leaves the ISR.",
               check=_ge(1)),
    Definition("replica.fetch.max.bytes", int, 1 * MIB, Scope.BROKER,
               "Bytes a follower asks for per partition in one Fetch.", check=_ge(1024)),
    Definition("replica.fetch.wait.max.ms", int, 500, Scope.BROKER,
               "How long a follower's Fetch may wait at the leader for new records.", check=_ge(0)),
    Definition("replica.fetch.backoff.ms", int, 1000, Scope.BROKER,
               "Pause of a follower's fetcher after an error.", check=_ge(0)),
    Definition("min.insync.replicas", int, 1, Scope.BROKER,
               "Smallest ISR with which an acks=all produce succeeds (also a topic config).", check=_ge(1)),
    Definition("unclean.leader.election.enable", bool, False, Scope.BROKER,
               "Only false is supported: a leader is always chosen from the ISR (also a topic config).",
               check=_OnlyFalse()),
    Definition("auto.leader.rebalance.enable", bool, True, Scope.BROKER,
               "The controller moves leadership back to each partition's preferred replica."),
    Definition("leader.imbalance.check.interval.seconds", int, 300, Scope.BROKER,
               "How often the controller looks for partitions not led by their preferred replica.",
               check=_ge(1)),
    Definition("controlled.shutdown.enable", bool, True, Scope.BROKER,
               "On SIGTERM, move this broker's leaderships to other in-sync replicas before exiting."),
    # --- log ---------------------------------------------------------------------
    Definition("log.segment.bytes", int, 1024 * MIB, Scope.BROKER, "Roll a segment when it reaches this size.",
               check=_ge(_MIN_SEGMENT_BYTES)),
    Definition("log.roll.ms", int, 7 * DAY_MS, Scope.BROKER, "Roll a segment older than this.", check=_ge(1)),
    Definition("log.retention.ms", int, 7 * DAY_MS, Scope.BROKER,
               "Delete segments whose newest record is older than this; -1 keeps them forever.", check=_ge(-1)),
    Definition("log.retention.bytes", int, -1, Scope.BROKER,
               "Delete the oldest segments while a partition is larger than this; -1 means no limit."),
    Definition("log.retention.check.interval.ms", int, 300_000, Scope.BROKER,
               "How often retention and compaction run.", check=_ge(1)),
    Definition("log.cleanup.policy", str, "delete", Scope.BROKER, "delete, compact, or compact,delete.",
               check=OneOfList("delete", "compact")),
    Definition("log.index.interval.bytes", int, 4096, Scope.BROKER,
               "Bytes of log between two entries of the sparse offset and time indexes.", check=_ge(0)),
    Definition("log.flush.interval.messages", int, 1, Scope.BROKER,
               "fsync a partition after this many records; 1 (shoal's default) fsyncs every append before "
               "acks=1/-1 are answered. Kafka's default (Long.MAX) leaves flushing to the OS.", check=_ge(1)),
    Definition("log.flush.interval.ms", int, -1, Scope.BROKER,
               "fsync a partition at least this often (-1: only by log.flush.interval.messages).", check=_ge(-1)),
    Definition("log.cleaner.min.compaction.lag.ms", int, 0, Scope.BROKER,
               "Records younger than this are not compacted.", check=_ge(0)),
    Definition("log.cleaner.delete.retention.ms", int, DAY_MS, Scope.BROKER,
               "How long compaction keeps tombstones.", check=_ge(0)),
    Definition("log.cleaner.min.cleanable.ratio", float, 0.5, Scope.BROKER,
               "Compact a partition once the closed segments written since its last compaction are at least "
               "this share of all its closed segments.", check=_between(0, 1)),
    Definition("log.message.timestamp.type", str, "CreateTime", Scope.BROKER, "CreateTime or LogAppendTime.",
               choices=("CreateTime", "LogAppendTime")),
    # --- topic keys (defaults from their broker synonyms) ---------------------------
    Definition("cleanup.policy", list, None, Scope.TOPIC, "delete, compact, or both.",
               broker_synonym="log.cleanup.policy", check=OneOfList("delete", "compact")),
    Definition("segment.bytes", int, None, Scope.TOPIC, "See log.segment.bytes.", broker_synonym="log.segment.bytes",
               check=_ge(_MIN_SEGMENT_BYTES)),
    Definition("segment.ms", int, None, Scope.TOPIC, "See log.roll.ms.", broker_synonym="log.roll.ms", check=_ge(1)),
    Definition("retention.ms", int, None, Scope.TOPIC, "See log.retention.ms.", broker_synonym="log.retention.ms",
               check=_ge(-1)),
    Definition("retention.bytes", int, None, Scope.TOPIC, "See log.retention.bytes.",
               broker_synonym="log.retention.bytes"),
    Definition("max.message.bytes", int, None, Scope.TOPIC, "See message.max.bytes.",
               broker_synonym="message.max.bytes", check=_ge(0)),
    Definition("flush.messages", int, None, Scope.TOPIC, "See log.flush.interval.messages.",
               broker_synonym="log.flush.interval.messages", check=_ge(1)),
    Definition("flush.ms", int, None, Scope.TOPIC, "See log.flush.interval.ms.", broker_synonym="log.flush.interval.ms",
               check=_ge(-1)),
    Definition("index.interval.bytes", int, None, Scope.TOPIC, "See log.index.interval.bytes.",
               broker_synonym="log.index.interval.bytes", check=_ge(0)),
    Definition("min.compaction.lag.ms", int, None, Scope.TOPIC, "See log.cleaner.min.compaction.lag.ms.",
               broker_synonym="log.cleaner.min.compaction.lag.ms", check=_ge(0)),
    Definition("delete.retention.ms", int, None, Scope.TOPIC, "See log.cleaner.delete.retention.ms.",
               broker_synonym="log.cleaner.delete.retention.ms", check=_ge(0)),
    Definition("min.cleanable.dirty.ratio", float, None, Scope.TOPIC, "See log.cleaner.min.cleanable.ratio.",
               broker_synonym="log.cleaner.min.cleanable.ratio", check=_between(0, 1)),
    Definition("message.timestamp.type", str, None, Scope.TOPIC, "See log.message.timestamp.type.",
               broker_synonym="log.message.timestamp.type", choices=("CreateTime", "LogAppendTime")),
    Definition("errors.deadletterqueue.group.enable", bool, False, Scope.TOPIC,
               "Whether share groups may write their dead-letter records onto this topic (KIP-1191)."),
    Definition("compression.type", str, "producer", Scope.TOPIC,
               "Codec of the stored batches: producer (keep the producer's), uncompressed, gzip, snappy, lz4 "
               "or zstd; a batch in another codec is recompressed at produce time.",
               choices=("uncompressed", "zstd", "lz4", "snappy", "gzip", "producer")),
    Definition("fetch.max.bytes", int, 16 * MIB, Scope.BROKER,
               "Largest Fetch response, whatever the client asks for (at least one batch is always "
               "returned). Kafka's default is 55 MiB; 16 MiB lets clients parse one response while the "
               "next is on its way (benchmarks/produce_consume.py: 6-partition consume +20%).",
               check=_ge(1024)),
    # --- fetch sessions ----------------------------------------------------------
    Definition("max.incremental.fetch.session.cache.slots", int, 1000, Scope.BROKER,
               "Incremental fetch sessions the broker keeps.", check=_ge(0)),
    # --- idempotent producers --------------------------------------------------
    Definition("transactional.id.expiration.ms", int, 7 * DAY_MS, Scope.BROKER,
               "The transaction coordinator forgets a transactional id with no open transaction after "
               "this long without a change.", check=_ge(1)),
    # --- transaction coordinator ------------------------------------------------
    Definition("transaction.state.log.num.partitions", int, 50, Scope.BROKER,
               "Partitions of __transaction_state when it is created; an existing topic keeps its count "
               "(which decides the partition, and so the coordinator, of every transactional id).",
               check=_ge(1), dynamic=False),
    Definition("transaction.state.log.segment.bytes", int, 100 * MIB, Scope.BROKER,
               "segment.bytes of __transaction_state (compacted; applied to the topic at every start).",
               check=_ge(14), dynamic=False),
    Definition("transaction.state.log.replication.factor", int, 3, Scope.BROKER,
               "Cluster mode: replication factor of __transaction_state, capped at the brokers registered "
               "when it is created.", check=_ge(1), dynamic=False),
    Definition("transaction.state.log.min.isr", int, 2, Scope.BROKER,
               "Cluster mode: min.insync.replicas of __transaction_state (capped at its replication "
               "factor); a transaction state change is answered once every in-sync replica has it.",
               check=_ge(1), dynamic=False),
    Definition("transaction.remove.expired.transaction.cleanup.interval.ms", int, 3_600_000, Scope.BROKER,
               "How often the transaction coordinator looks for transactional ids to forget "
               "(transactional.id.expiration.ms).", check=_ge(1)),
    Definition("transaction.max.timeout.ms", int, 900000, Scope.BROKER,
               "Largest transaction.timeout.ms a transactional producer may ask for (InitProducerId "
               "answers INVALID_TRANSACTION_TIMEOUT above it).", check=_ge(1)),
    # --- group coordinator (classic and consumer) -------------------------------
    Definition("offsets.topic.num.partitions", int, 50, Scope.BROKER,
               "Partitions of __consumer_offsets when it is created; an existing topic keeps its count "
               "(which decides the partition, and so the coordinator, of every group).", check=_ge(1),
               dynamic=False),
    Definition("offsets.topic.replication.factor", int, 3, Scope.BROKER,
               "Cluster mode: replication factor of __consumer_offsets, capped at the brokers registered "
               "when it is created.", check=_ge(1), dynamic=False),
    Definition("offsets.commit.timeout.ms", int, 5000, Scope.BROKER,
               "Cluster mode: a coordinator write waits this long for every in-sync replica.",
               check=_ge(1)),
    Definition("offsets.topic.segment.bytes", int, 100 * MIB, Scope.BROKER,
               "segment.bytes of __consumer_offsets, kept small so compaction reclaims space soon "
               "(applied to the topic at every start).", check=_ge(14), dynamic=False),
    Definition("offsets.retention.minutes", int, 7 * 24 * 60, Scope.BROKER,
               "Committed offsets of an empty group expire after this long.", check=_ge(1)),
    Definition("offsets.retention.check.interval.ms", int, 600_000, Scope.BROKER,
               "How often expired offsets are removed.", check=_ge(1)),
    Definition("group.initial.rebalance.delay.ms", int, 3000, Scope.BROKER,
               "How long the first rebalance of an empty classic group waits for more members.", check=_ge(0)),
    Definition("group.min.session.timeout.ms", int, 6000, Scope.BROKER,
               "Smallest session.timeout.ms a classic member may ask for.", check=_ge(0)),
    Definition("group.max.session.timeout.ms", int, 1_800_000, Scope.BROKER,
               "Largest session.timeout.ms a classic member may ask for.", check=_ge(0)),
    Definition("group.max.size", int, 2**31 - 1, Scope.BROKER, "Members a classic group may have.", check=_ge(1)),
    Definition("group.consumer.session.timeout.ms", int, 45_000, Scope.BROKER,
               "Session timeout of consumer-protocol (KIP-848) members.", check=_ge(1)),
    Definition("group.consumer.heartbeat.interval.ms", int, 5000, Scope.BROKER,
               "Heartbeat interval given to consumer-protocol members.", check=_ge(1)),
    Definition("group.consumer.max.size", int, 2**31 - 1, Scope.BROKER,
               "Members a consumer-protocol group may have; one more is refused with GROUP_MAX_SIZE_REACHED and a "
               "message naming this key (logged once per group).", check=_ge(1)),
    Definition("group.consumer.assignors", list, ["uniform", "range"], Scope.BROKER,
               "Server-side assignors for consumer-protocol groups; the first is the default."),
    Definition("group.consumer.assignment.interval.ms", int, 1000, Scope.BROKER,
               "Default consumer.assignment.interval.ms. Accepted for compatibility: shoal computes a group's "
               "target assignment in the heartbeat that changes the group.", check=_ge(0)),
    Definition("group.consumer.min.assignment.interval.ms", int, 0, Scope.BROKER,
               "Smallest consumer.assignment.interval.ms a group may set.", check=_ge(0)),
    Definition("group.consumer.max.assignment.interval.ms", int, 15_000, Scope.BROKER,
               "Largest consumer.assignment.interval.ms a group may set.", check=_ge(0)),
    # --- share groups (KIP-932) --------------------------------------------------
    Definition("group.share.enable", bool, True, Scope.BROKER, "Whether share groups are served."),
    Definition("group.share.record.lock.duration.ms", int, 30_000, Scope.BROKER,
               "Default acquisition lock duration.", check=_between(1000, 3_600_000)),
    Definition("group.share.min.record.lock.duration.ms", int, 15_000, Scope.BROKER,
               "Smallest share.record.lock.duration.ms a group may set.", check=_between(1000, 30_000)),
    Definition("group.share.max.record.lock.duration.ms", int, 60_000, Scope.BROKER,
               "Largest share.record.lock.duration.ms a group may set.", check=_between(30_000, 3_600_000)),
    Definition("group.share.delivery.count.limit", int, 5, Scope.BROKER,
               "Deliveries after which a released or timed-out record is archived.", check=_between(2, 10)),
    Definition("group.share.min.delivery.count.limit", int, 2, Scope.BROKER,
               "Smallest share.delivery.count.limit a group may set.", check=_between(2, 10)),
    Definition("group.share.max.delivery.count.limit", int, 10, Scope.BROKER,
               "Largest share.delivery.count.limit a group may set.", check=_between(2, 10)),
    Definition("group.share.partition.max.record.locks", int, 2000, Scope.BROKER,
               "Default share.partition.max.record.locks: in-flight (acquired or awaiting SPSO) records per "
               "share-partition.", check=_between(100, 10_000)),
    Definition("group.share.min.partition.max.record.locks", int, 100, Scope.BROKER,
               "Smallest share.partition.max.record.locks a group may set.", check=_between(100, 10_000)),
    Definition("group.share.max.partition.max.record.locks", int, 4000, Scope.BROKER,
               "Largest share.partition.max.record.locks a group may set.", check=_between(100, 10_000)),
    Definition("group.share.assignment.interval.ms", int, 1000, Scope.BROKER,
               "Default share.assignment.interval.ms. Accepted for compatibility: shoal computes a group's "
               "target assignment in the heartbeat that changes the group.", check=_ge(0)),
    Definition("group.share.min.assignment.interval.ms", int, 0, Scope.BROKER,
               "Smallest share.assignment.interval.ms a group may set.", check=_ge(0)),
    Definition("group.share.max.assignment.interval.ms", int, 15_000, Scope.BROKER,
               "Largest share.assignment.interval.ms a group may set.", check=_ge(0)),
    Definition("group.share.max.size", int, 200, Scope.BROKER,
               "Members a share group may have; one more is refused with GROUP_MAX_SIZE_REACHED and a message "
               "naming this key (logged once per group).", check=_between(10, 1000)),
    Definition("group.share.max.groups", int, 10, Scope.BROKER,
               "Share groups the broker serves; a heartbeat or AlterShareGroupOffsets that would create one more "
               "is refused with GROUP_MAX_SIZE_REACHED and a message naming this key and `shoal share-groups "
               "--delete` (logged once per group).", check=_between(1, 100)),
    Definition("group.share.session.timeout.ms", int, 45_000, Scope.BROKER,
               "Default share.session.timeout.ms.", check=_ge(1)),
    Definition("group.share.min.session.timeout.ms", int, 45_000, Scope.BROKER,
               "Smallest share.session.timeout.ms.", check=_ge(1)),
    Definition("group.share.max.session.timeout.ms", int, 60_000, Scope.BROKER,
               "Largest share.session.timeout.ms.", check=_ge(1)),
    Definition("group.share.heartbeat.interval.ms", int, 5000, Scope.BROKER,
               "Default share.heartbeat.interval.ms.", check=_ge(1)),
    Definition("group.share.min.heartbeat.interval.ms", int, 5000, Scope.BROKER,
               "Smallest share.heartbeat.interval.ms.", check=_ge(1)),
    Definition("group.share.max.heartbeat.interval.ms", int, 15_000, Scope.BROKER,
               "Largest share.heartbeat.interval.ms.", check=_ge(1)),
    Definition("group.share.assignors", list, ["simple"], Scope.BROKER, "Share-group assignors."),
    Definition("group.share.max.share.sessions", int, 2000, Scope.BROKER,
               "Share sessions the broker keeps (max.share.session.cache.slots is accepted as another name "
               "for it).", check=_ge(1)),
    Definition("share.coordinator.state.topic.num.partitions", int, 1, Scope.BROKER,
               "Partitions of __share_group_state (fixed once the topic exists).", check=_ge(1), dynamic=False),
    Definition("share.coordinator.state.topic.replication.factor", int, 3, Scope.BROKER,
               "Cluster mode: replication factor of __share_group_state, capped at the brokers registered "
               "when it is created.", check=_ge(1), dynamic=False),
    Definition("share.coordinator.state.topic.min.isr", int, 2, Scope.BROKER,
               "Cluster mode: min.insync.replicas of __share_group_state (capped at its replication "
               "factor); a share-state write is answered once every in-sync replica has it, and fails "
               "while fewer are in sync.", check=_ge(1), dynamic=False),
    Definition("share.coordinator.state.topic.segment.bytes", int, 100 * MIB, Scope.BROKER,
               "segment.bytes of __share_group_state: records below every share-partition's last snapshot "
               "go a whole segment at a time (applied to the topic at every start).", check=_ge(14),
               dynamic=False),
    Definition("share.coordinator.snapshot.update.records.per.snapshot", int, 500, Scope.BROKER,
               "ShareUpdate records written between two ShareSnapshot records of a share-partition.",
               check=_ge(0)),
    Definition("share.fetch.purgatory.purge.interval.requests", int, 1000, Scope.BROKER,
               "Accepted for compatibility; shoal wakes parked ShareFetch requests directly."),
    Definition("errors.deadletterqueue.topic.name.prefix", str, "dlq.", Scope.BROKER,
               "Prefix every share group's dead-letter topic name must start with (KIP-1191); empty allows "
               "any name not starting with __."),
    Definition("errors.deadletterqueue.auto.create.topics.enable", bool, False, Scope.BROKER,
               "Create a share group's dead-letter topic (num.partitions partitions, "
               "errors.deadletterqueue.group.enable=true) when it does not exist (KIP-1191)."),
    # --- group keys (KIP-932 group configs; defaults from broker synonyms) --------
    Definition("share.auto.offset.reset", str, "latest", Scope.GROUP,
               "Where a share group starts on a partition it has no state for: latest, earliest, "
               "or by_duration:<ISO-8601 duration>."),
    Definition("share.isolation.level", str, "read_uncommitted", Scope.GROUP,
               "read_committed: share consumers get only records below the last stable offset, "
               "never those of aborted transactions (archived without delivery); read_uncommitted: "
               "every record.",
               choices=("read_uncommitted", "read_committed")),
    Definition("share.record.lock.duration.ms", int, None, Scope.GROUP, "Acquisition lock duration of this group.",
               broker_synonym="group.share.record.lock.duration.ms"),
    Definition("share.delivery.count.limit", int, None, Scope.GROUP, "Delivery count limit of this group.",
               broker_synonym="group.share.delivery.count.limit"),
    Definition("share.session.timeout.ms", int, None, Scope.GROUP, "Member session timeout of this group.",
               broker_synonym="group.share.session.timeout.ms"),
    Definition("share.heartbeat.interval.ms", int, None, Scope.GROUP, "Member heartbeat interval of this group.",
               broker_synonym="group.share.heartbeat.interval.ms"),
    Definition("share.partition.max.record.locks", int, None, Scope.GROUP,
               "In-flight (acquired or awaiting SPSO) records per share-partition of this group.",
               broker_synonym="group.share.partition.max.record.locks"),
    Definition("share.renew.acknowledge.enable", bool, True, Scope.GROUP,
               "Whether members may renew acquisition locks (acknowledge type RENEW); when false a renewal is "
               "answered INVALID_RECORD_STATE for its partition."),
    Definition("share.assignment.interval.ms", int, None, Scope.GROUP,
               "Accepted for compatibility (shoal assigns at once).",
               broker_synonym="group.share.assignment.interval.ms"),
    Definition("errors.deadletterqueue.topic.name", str, "", Scope.GROUP,
               "Dead-letter topic of this share group (KIP-1191): rejected records and records that reached "
               "the delivery count limit are written there before they are archived. Empty: none."),
    Definition("errors.deadletterqueue.copy.record.enable", bool, False, Scope.GROUP,
               "Whether a dead-letter record carries the key and value of the source record, or only the "
               "__dlq.errors.* headers."),
    Definition("consumer.session.timeout.ms", int, None, Scope.GROUP, "Consumer-protocol session timeout.",
               broker_synonym="group.consumer.session.timeout.ms"),
    Definition("consumer.heartbeat.interval.ms", int, None, Scope.GROUP, "Consumer-protocol heartbeat interval.",
               broker_synonym="group.consumer.heartbeat.interval.ms"),
    Definition("consumer.assignment.interval.ms", int, None, Scope.GROUP,
               "Accepted for compatibility (shoal assigns at once).",
               broker_synonym="group.consumer.assignment.interval.ms"),
]

CONFIG_DEFS: dict[str, Definition] = {d.name: d for d in _DEFS}

KEY_ALIASES = {"max.share.session.cache.slots": "group.share.max.share.sessions"}
"""Broker keys accepted under another name: earlier shoal versions' name -> Kafka's."""

BROKER_KEYS_ALSO_TOPIC = frozenset({"min.insync.replicas", "unclean.leader.election.enable"})
"""Broker keys that a topic may also override under the same name (as in Kafka)."""

KAFKA_TOPIC_KEYS_NOT_SUPPORTED: dict[str, str] = {
    "segment.jitter.ms": "segments roll by segment.ms and segment.bytes, without jitter",
    "segment.index.bytes": "index file sizes are not configurable",
    "file.delete.delay.ms": "no delay before deleting segment files",
    "max.compaction.lag.ms": "compaction has no maximum lag; it follows min.cleanable.dirty.ratio",
    "preallocate": "segment files are not preallocated",
    "compression.gzip.level": "codecs use their default levels",
    "compression.lz4.level": "codecs use their default levels",
    "compression.zstd.level": "codecs use their default levels",
    "message.timestamp.difference.max.ms": "record timestamps are not checked",
    "message.timestamp.before.max.ms": "record timestamps are not checked",
    "message.timestamp.after.max.ms": "record timestamps are not checked",
    "message.downconversion.enable": "records are never down-converted",
    "message.format.version": "batches are stored as sent (Kafka 4 removed this key)",
    "remote.storage.enable": "there is no tiered storage",
    "local.retention.ms": "there is no tiered storage",
    "local.retention.bytes": "there is no tiered storage",
    "remote.log.copy.disable": "there is no tiered storage",
    "remote.log.delete.on.disable": "there is no tiered storage",
    "leader.replication.throttled.replicas": "replication is not throttled",
    "follower.replication.throttled.replicas": "replication is not throttled",
}
"""Kafka's topic configs (TopicConfig, LogConfig) that shoal refuses, and why."""


def topic_keys() -> list[Definition]:
    """Every key a topic may override: the TOPIC keys and the broker keys of the same name."""
    return [d for d in _DEFS if d.scope is Scope.TOPIC or d.name in BROKER_KEYS_ALSO_TOPIC]


def topic_broker_synonym(d: Definition) -> str | None:
    """The broker key a topic key falls back to (its own name for min.insync.replicas and the like)."""
    return d.name if d.name in BROKER_KEYS_ALSO_TOPIC else d.broker_synonym


def check_topic_key(name: str) -> Definition:
    """The definition of topic config ``name``; ConfigError saying why when a topic cannot set it."""
    d = CONFIG_DEFS.get(name)
    if d is not None and (d.scope is Scope.TOPIC or name in BROKER_KEYS_ALSO_TOPIC):
        return d
    why = KAFKA_TOPIC_KEYS_NOT_SUPPORTED.get(name)
    if why is not None:
        raise ConfigError(f"topic config {name} is not supported by shoal ({why}); "
                          f"docs/CONFIGURATION.md lists the topic configs it supports")
    if d is not None and d.scope is Scope.BROKER:
        topic = next((t.name for t in _DEFS if t.broker_synonym == name), None)
        hint = f"; the topic config is {topic}" if topic else ""
        raise ConfigError(f"{name} is a broker config, not a topic config{hint}")
    raise ConfigError(f"unknown topic config {name!r}")

_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


def parse_value(name: str, raw: Any) -> Any:
    """Parse ``raw`` (a string or an already-typed value) for key ``name``.

    Raises ConfigError for an unknown key or a value that does not parse or check.
    """
    d = CONFIG_DEFS.get(name)
    if d is None:
        raise ConfigError(f"unknown configuration key {name!r}")
    try:
        if d.type is bool:
            if isinstance(raw, bool):
                value: Any = raw
            else:
                s = str(raw).strip().lower()
                if s in _TRUE:
                    value = True
                elif s in _FALSE:
                    value = False
                else:
                    raise ValueError(raw)
        elif d.type is int:
            if isinstance(raw, bool):
                raise ValueError(raw)
            value = int(str(raw).strip()) if not isinstance(raw, int) else raw
        elif d.type is float:
            value = float(raw)
        elif d.type is list:
            if isinstance(raw, (list, tuple)):
                value = [str(x).strip() for x in raw]
            else:
                value = [x.strip() for x in str(raw).split(",") if x.strip()]
        else:
            value = str(raw).strip()
    except (TypeError, ValueError):
        raise ConfigError(f"invalid value {raw!r} for {name} (expected {d.type.__name__})") from None
    if d.choices is not None and value not in d.choices:
        raise ConfigError(f"invalid value {raw!r} for {name}: one of {', '.join(d.choices)}")
    if d.check is not None and not d.check(value):
        raise ConfigError(f"invalid value {raw!r} for {name}: must be {d.check}")
    return value


def load_properties(text: str) -> dict[str, str]:
    """Parse a Kafka-style ``key=value`` properties text (``#``/``!`` comments, ``:`` separator)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line[0] in "#!":
            continue
        for sep_i, ch in enumerate(line):
            if ch in "=:":
                out[line[:sep_i].strip()] = line[sep_i + 1 :].strip()
                break
        else:
            out[line] = ""
    return out


SENSITIVE_KEYS = frozenset({
    "ssl.keystore.password", "ssl.key.password", "ssl.keystore.key", "ssl.truststore.password", "sasl.jaas.config",
})
"""Keys whose values DescribeConfigs never shows (Kafka's PASSWORD type)."""

_LISTENER_SUFFIXES = ("ssl.", "sasl.", "plain.sasl.jaas.config", "scram-sha-256.sasl.jaas.config",
                      "scram-sha-512.sasl.jaas.config")


def listener_override(name: str, raw: Any) -> str:
    """Check a ``listener.name.<listener>.<key>`` key: ``key`` a broker ``ssl.*``/``sasl.*`` key or
    ``<mechanism>.sasl.jaas.config``; the value is parsed as that key's when it is one."""
    rest = name[len("listener.name."):]
    listener, _, key = rest.partition(".")
    if not listener or not key.startswith(_LISTENER_SUFFIXES):
        raise ConfigError(f"unknown configuration key {name!r}: listener.name.<listener>. takes ssl.* and sasl.* "
                          "keys and <mechanism>.sasl.jaas.config")
    d = CONFIG_DEFS.get(key)
    if d is not None and d.scope is Scope.BROKER:
        value = parse_value(key, raw)
        return ",".join(value) if isinstance(value, list) else str(value)
    if key.endswith("sasl.jaas.config"):
        return str(raw).strip()
    raise ConfigError(f"unknown configuration key {name!r}")


class BrokerConfig(Mapping[str, Any]):
    """The broker's effective configuration: defaults, then the file, then overrides.

    Unknown keys are refused at start (a typo should not silently do nothing) except
    those listed in ``IGNORED_KEYS``, which Kafka deployments commonly carry and which
    mean nothing to a single broker.
    """

    IGNORED_KEYS = frozenset({
        "process.roles", "controller.quorum.voters", "controller.listener.names",
        "num.network.threads",
        "num.io.threads", "socket.send.buffer.bytes", "socket.receive.buffer.bytes",
        "num.recovery.threads.per.data.dir",
        "broker.id", "zookeeper.connect", "group.coordinator.rebalance.protocols",
        "unstable.api.versions.enable", "controller.quorum.bootstrap.servers",
    })

    def __init__(self, overrides: Mapping[str, Any] | None = None) -> None:
        self.listener_overrides: dict[str, str] = {}
        """``listener.name.<listener>.<key>`` values (shoal/security/listeners.py), as given."""
        values: dict[str, Any] = {}
        for d in _DEFS:
            if d.scope is Scope.BROKER:
                values[d.name] = d.default
        self._values = values
        for k, v in (overrides or {}).items():
            self.set(k, v)
        problem = share_config_problem(self._values)
        if problem is not None:
            raise ConfigError(problem)

    def set(self, name: str, raw: Any) -> None:
        if name in self.IGNORED_KEYS:
            return
        if name.startswith("listener.name."):
            self.listener_overrides[name] = listener_override(name, raw)
            return
        name = KEY_ALIASES.get(name, name)
        d = CONFIG_DEFS.get(name)
        if d is None:
            raise ConfigError(f"unknown configuration key {name!r}")
        if d.scope is not Scope.BROKER:
            raise ConfigError(f"{name!r} is a {d.scope.value} configuration, not a broker one")
        self._values[name] = parse_value(name, raw)

    def __getitem__(self, name: str) -> Any:
        return self._values[name]

    def __iter__(self):  # type: ignore[override]
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def resolve(self, name: str, overrides: Mapping[str, Any] | None = None) -> Any:
        """The value of a TOPIC/GROUP key given its overrides, else its broker synonym, else its default."""
        if overrides and name in overrides:
            return overrides[name]
        d = CONFIG_DEFS[name]
        if d.broker_synonym is not None:
            v = self._values[d.broker_synonym]
            if name == "cleanup.policy" and isinstance(v, str):
                return [x.strip() for x in v.split(",") if x.strip()]
            return v
        return d.default


_SHARE_BOUNDED = (
    ("group.share.record.lock.duration.ms", "group.share.min.record.lock.duration.ms",
     "group.share.max.record.lock.duration.ms"),
    ("group.share.delivery.count.limit", "group.share.min.delivery.count.limit",
     "group.share.max.delivery.count.limit"),
    ("group.share.session.timeout.ms", "group.share.min.session.timeout.ms", "group.share.max.session.timeout.ms"),
    ("group.share.heartbeat.interval.ms", "group.share.min.heartbeat.interval.ms",
     "group.share.max.heartbeat.interval.ms"),
    ("group.share.partition.max.record.locks", "group.share.min.partition.max.record.locks",
     "group.share.max.partition.max.record.locks"),
    ("group.share.assignment.interval.ms", "group.share.min.assignment.interval.ms",
     "group.share.max.assignment.interval.ms"),
)


def share_config_problem(values: Mapping[str, Any]) -> str | None:
    """What is wrong with the share-group broker settings taken together, or None.

    KIP-932 (and Kafka's ShareGroupConfig): each default lies within its min and max,
    and the heartbeat interval is shorter than the session timeout.
    """
    for key, lo_key, hi_key in _SHARE_BOUNDED:
        lo, hi, v = values[lo_key], values[hi_key], values[key]
        if lo > hi:
            return f"{lo_key} ({lo}) must not be greater than {hi_key} ({hi})"
        if not lo <= v <= hi:
            return f"{key} ({v}) must be between {lo_key} and {hi_key}: between {lo} and {hi}"
    hb, session = values["group.share.heartbeat.interval.ms"], values["group.share.session.timeout.ms"]
    if hb >= session:
        return (f"group.share.heartbeat.interval.ms ({hb}) must be less than "
                f"group.share.session.timeout.ms ({session})")
    return None


def _scoped(scope: Scope) -> Iterable[Definition]:
    return (d for d in _DEFS if d.scope is scope)


def topic_defaults() -> list[Definition]:
    return list(_scoped(Scope.TOPIC))


def group_defaults() -> list[Definition]:
    return list(_scoped(Scope.GROUP))


def render_markdown() -> str:
    """docs/CONFIGURATION.md's tables, generated from CONFIG_DEFS."""
    lines: list[str] = []
    for scope, title in ((Scope.BROKER, "Broker"), (Scope.TOPIC, "Topic"), (Scope.GROUP, "Group")):
        lines += [f"## {title} configuration", "", "| key | type | default | valid values | description |",
                  "|---|---|---|---|---|"]
        for d in _scoped(scope):
            default = f"from `{d.broker_synonym}`" if d.broker_synonym else f"`{d.default!r}`"
            if isinstance(d.default, list):
                default = f"`{','.join(d.default)}`"
            valid = str(d.check) if d.check is not None else ", ".join(d.choices) if d.choices else ""
            lines.append(f"| `{d.name}` | {d.type.__name__} | {default} | {valid} | {d.doc} |")
        lines.append("")
        if scope is Scope.TOPIC:
            also = ", ".join(f"`{k}`" for k in sorted(BROKER_KEYS_ALSO_TOPIC))
            lines += [f"Broker keys a topic also sets under the same name (Kafka's topic configs too): {also}.", "",
                      ("Kafka's topic keys shoal does not support are refused at create and alter "
                       "(INVALID_CONFIG, with the reason):"), "", "| key | why |", "|---|---|"]
            lines += [f"| `{k}` | {why} |" for k, why in KAFKA_TOPIC_KEYS_NOT_SUPPORTED.items()]
            lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":  # pragma: no cover
    print(render_markdown())
