"""Dead-letter records of share groups (KIP-1191), with no I/O.

Theory of operation
-------------------
A share group whose group config ``errors.deadletterqueue.topic.name`` names a topic
gets a dead-letter record on that topic for every record it archives because a consumer
rejected it (:attr:`ArchiveCause.CLIENT_REJECT`) or because its delivery count reached
the limit (:attr:`ArchiveCause.DELIVERY_COUNT_EXCEEDED`). Gaps (offsets holding no
record) are archived without one.

:class:`~shoal.share.partition.SharePartition` lists those records in each
:class:`~shoal.share.partition.StateWrite` (``dead_letters``); the shell writes them to
the dead-letter topic before it persists the write. This module holds what that needs
and can be decided without I/O: the causes and their messages, the ``__dlq.errors.*``
headers, the dead-letter partition of a source partition, the checks of the topic name
and the :class:`DeadLetterIndex` that makes the write idempotent (an offset already on
the dead-letter topic is never written again).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from typing import NamedTuple

__all__ = [
    "HEADER_DELIVERY_COUNT",
    "HEADER_GROUP",
    "HEADER_MESSAGE",
    "HEADER_OFFSET",
    "HEADER_PARTITION",
    "HEADER_TOPIC",
    "ArchiveCause",
    "DeadLetter",
    "DeadLetterIndex",
    "dead_letter_headers",
    "dead_letter_partition",
    "source_of",
    "topic_name_problem",
]

HEADER_TOPIC = "__dlq.errors.topic"
HEADER_PARTITION = "__dlq.errors.partition"
HEADER_OFFSET = "__dlq.errors.offset"
HEADER_GROUP = "__dlq.errors.group"
HEADER_DELIVERY_COUNT = "__dlq.errors.delivery.count"
HEADER_MESSAGE = "__dlq.errors.message"


class ArchiveCause(enum.Enum):
    """Why a record went to the dead-letter topic; the value is its ``__dlq.errors.message``."""

    CLIENT_REJECT = "Offset rejected by client."
    DELIVERY_COUNT_EXCEEDED = "Offset delivery count exceeded the threshold."


class DeadLetter(NamedTuple):
    """Offsets ``first..last`` of a share-partition, archived for ``cause`` after ``delivery_count`` deliveries."""

    first_offset: int
    last_offset: int
    delivery_count: int
    cause: ArchiveCause

    def __lt__(self, other: object) -> bool:  # offset order; the cause does not order
        if not isinstance(other, DeadLetter):
            return NotImplemented
        return (self.first_offset, self.last_offset) < (other.first_offset, other.last_offset)


def dead_letter_headers(topic: str, partition: int, offset: int, group_id: str, delivery_count: int,
                        cause: ArchiveCause) -> list[tuple[str, bytes]]:
    """The context headers of one dead-letter record (every value a UTF-8 string, as Kafka writes them)."""
    return [
        (HEADER_TOPIC, topic.encode()),
        (HEADER_PARTITION, str(partition).encode()),
        (HEADER_OFFSET, str(offset).encode()),
        (HEADER_GROUP, group_id.encode()),
        (HEADER_DELIVERY_COUNT, str(delivery_count).encode()),
        (HEADER_MESSAGE, cause.value.encode()),
    ]


def source_of(headers: Iterable[tuple[str, bytes | None]]) -> tuple[str, str, int, int] | None:
    """(group, topic, partition, offset) named by a dead-letter record's headers, or None."""
    found: dict[str, bytes | None] = {}
    for k, v in headers:
        if k in (HEADER_GROUP, HEADER_TOPIC, HEADER_PARTITION, HEADER_OFFSET):
            found[k] = v
    try:
        return (found[HEADER_GROUP].decode(), found[HEADER_TOPIC].decode(),  # type: ignore[union-attr]
                int(found[HEADER_PARTITION]), int(found[HEADER_OFFSET]))  # type: ignore[arg-type]
    except (KeyError, AttributeError, ValueError, UnicodeDecodeError):
        return None


def dead_letter_partition(source_partition: int, num_partitions: int) -> int:
    """The dead-letter partition of a source partition (Kafka: source partition modulo the count)."""
    return source_partition % num_partitions


def topic_name_problem(name: str, prefix: str) -> str | None:
    """Why ``name`` may not be a dead-letter topic under ``errors.deadletterqueue.topic.name.prefix``; None if it may."""
    if name.startswith("__"):
        return f"dead-letter topic {name!r} starts with __"
    if prefix and not name.startswith(prefix):
        return f"dead-letter topic {name!r} does not start with errors.deadletterqueue.topic.name.prefix {prefix!r}"
    return None


class DeadLetterIndex:
    """Which source offsets are already on a dead-letter topic, per (group, topic, partition).

    Filled from the dead-letter topic itself (its records' headers) the first time the
    shell writes to one of its partitions, then kept up to date as it writes. Offsets
    below a share-partition's start offset can never be archived again and are pruned.
    """

    def __init__(self) -> None:
        self._offsets: dict[tuple[str, str, int], set[int]] = {}
        self._loaded: set[object] = set()

    def is_loaded(self, dlq_partition: object) -> bool:
        return dlq_partition in self._loaded

    def mark_loaded(self, dlq_partition: object) -> None:
        self._loaded.add(dlq_partition)

    def forget_loaded(self, dlq_partition: object) -> None:
        self._loaded.discard(dlq_partition)

    def add(self, group_id: str, topic: str, partition: int, offset: int) -> None:
        self._offsets.setdefault((group_id, topic, partition), set()).add(offset)

    def contains(self, group_id: str, topic: str, partition: int, offset: int) -> bool:
        s = self._offsets.get((group_id, topic, partition))
        return s is not None and offset in s

    def prune(self, group_id: str, topic: str, partition: int, below: int) -> None:
        s = self._offsets.get((group_id, topic, partition))
        if s:
            s.difference_update([o for o in s if o < below])
