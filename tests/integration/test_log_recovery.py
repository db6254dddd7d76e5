"""A damaged data directory at start: only the damaged bytes are lost, and the broker says so.

Each test produces acknowledged records (acks=all) with a real client to a broker with
small segments, stops it (SIGKILL or SIGTERM), damages the partition's files, starts it
again and reads everything back with a real consumer: every acknowledged record outside
the damaged bytes is served at its offset, the damaged ones are not served at all, the
broker's log names the damage, and new records get offsets past every old one.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, TopicPartition

from shoal.protocol.batch import iter_batches
from tests.support.broker import BrokerProcess
from tests.support.clients import consumer, create_topic, produce_all, producer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

N = 8000
SETTINGS = {"log.segment.bytes": "16384"}


def produce_acked(bs: str, topic: str, n: int = N, first: int = 0) -> dict[int, bytes]:
    items = [{"partition": 0, "value": b"record-%06d" % i + b"." * (i % 40)} for i in range(first, first + n)]
    reports = produce_all(producer(bs, **{"acks": "all", "batch.size": 4000, "linger.ms": 2}), topic, items,
                          timeout_s=60)
    return {r.offset(): r.value() for r in reports}


def batches_on_disk(part_dir: Path) -> list[tuple[Path, int, int, int, int]]:
    """(segment file, position, size, first offset, last offset) of every batch."""
    out = []
    for f in sorted(part_dir.glob("*.log")):
        data = f.read_bytes()
        out.extend((f, h.position, h.size, h.base_offset, h.last_offset) for h in iter_batches(data))
    return out


def offsets_in(batches, path: Path, start: int, end: int) -> set[int]:
    """The offsets of the batches of ``path`` that overlap bytes [start, end)."""
    return {o for f, pos, size, first, last in batches if f == path and pos < end and pos + size > start
            for o in range(first, last + 1)}


def read_back(bs: str, topic: str, *, corrupt_skip: dict[int, int] | None = None,
              timeout_s: float = 60) -> tuple[dict[int, bytes], list[int]]:
    """Every record a consumer gets from the log start to the high watermark, and the offsets
    at which the broker answered CORRUPT_MESSAGE (``corrupt_skip`` says where to seek then)."""
    c = consumer(bs)
    got: dict[int, bytes] = {}
    corrupt: list[int] = []
    try:
        low, high = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=15)
        c.assign([TopicPartition(topic, 0, low)])
        deadline = time.monotonic() + timeout_s
        while not got or max(got) < high - 1:
            assert time.monotonic() < deadline, f"read up to {max(got, default=None)} of {high}"
            for msg in c.consume(500, timeout=0.5):
                err = msg.error()
                if err is not None:
                    assert corrupt_skip is not None and err.code() == KafkaError.INVALID_MSG, err  # CORRUPT_MESSAGE (2)
                    at = next(o for o in corrupt_skip if o <= max(got, default=-1) + 1 <= corrupt_skip[o])
                    corrupt.append(at)
                    c.seek(TopicPartition(topic, 0, corrupt_skip[at] + 1))
                    continue
                got[msg.offset()] = msg.value()
        return got, corrupt
    finally:
        c.close()


def check(b: BrokerProcess, topic: str, acked: dict[int, bytes], damaged: set[int], **kw) -> dict[int, bytes]:
    assert damaged and len(damaged) < len(acked) // 4  # the damage hit some records, not most of them
    got, _ = read_back(b.bootstrap, topic, **kw)
    kept = {o: v for o, v in acked.items() if o not in damaged}
    assert {o: got.get(o) for o in kept} == kept, "acknowledged records outside the damage were lost"
    assert not set(got) & damaged, "records from damaged bytes were served"
    assert set(got) <= set(acked)
    # new records go after every old offset
    more = produce_acked(b.bootstrap, topic, 20, first=N)
    assert min(more) >= max(acked) + 1
    again, _ = read_back(b.bootstrap, topic, **kw)
    assert {o: again[o] for o in more} == more
    return got


def broker_log(b: BrokerProcess) -> str:
    return b.stderr_path.read_text(errors="replace")


def test_a_missing_middle_segment_loses_only_its_records(start_broker, topic_name):
    b = start_broker(SETTINGS)
    create_topic(b.bootstrap, topic_name, 1)
    acked = produce_acked(b.bootstrap, topic_name)
    b.kill()
    part = b.data_dir / f"{topic_name}-0"
    batches = batches_on_disk(part)
    files = sorted(part.glob("*.log"))
    assert len(files) > 6
    victim = files[len(files) // 2]
    damaged = offsets_in(batches, victim, 0, victim.stat().st_size)
    for ext in (".log", ".index", ".timeindex"):
        victim.with_suffix(ext).unlink(missing_ok=True)
    b.start()
    check(b, topic_name, acked, damaged)
    text = broker_log(b)
    assert f"partition {topic_name}-0: offsets {min(damaged)}-{max(damaged)} ({len(damaged)}) are missing" in text
    assert len(list(part.glob("*.log"))) >= len(files) - 1  # nothing deleted


def test_a_closed_segment_cut_short_by_1000_bytes_loses_only_those_bytes(start_broker, topic_name):
    b = start_broker(SETTINGS)
    create_topic(b.bootstrap, topic_name, 1)
    acked = produce_acked(b.bootstrap, topic_name)
    b.kill()
    part = b.data_dir / f"{topic_name}-0"
    batches = batches_on_disk(part)
    files = sorted(part.glob("*.log"))
    victim = files[2]
    size = victim.stat().st_size
    damaged = offsets_in(batches, victim, size - 1000, size)
    with open(victim, "r+b") as f:
        f.truncate(size - 1000)
    b.start()
    check(b, topic_name, acked, damaged)
    text = broker_log(b)
    base = int(victim.name[:20])
    assert f"partition {topic_name}-0: segment {base} is damaged" in text
    assert f"offsets {min(damaged)}-{max(damaged)} ({len(damaged)}), are cut" in text
    assert len(list(part.glob("*.log"))) >= len(files)  # nothing deleted


def test_a_garbage_recovery_point_and_a_4_byte_flip_in_segment_2_lose_one_batch(start_broker, topic_name):
    b = start_broker(SETTINGS)
    create_topic(b.bootstrap, topic_name, 1)
    acked = produce_acked(b.bootstrap, topic_name)
    b.kill()
    part = b.data_dir / f"{topic_name}-0"
    batches = batches_on_disk(part)
    files = sorted(part.glob("*.log"))
    victim = files[1]
    (part / "recovery-point").write_bytes(b"\x17\x00garbage\xff\xfe")
    # four bytes in the middle of the segment, inside a batch's records
    mid = victim.stat().st_size // 2
    pos, size = next((p, s) for f, p, s, _, _ in batches if f == victim and p <= mid < p + s)
    at = pos + 61 + (size - 61) // 2
    with open(victim, "r+b") as f:
        f.seek(at)
        old = f.read(4)
        f.seek(at)
        f.write(bytes(x ^ 0xA5 for x in old))
    damaged = offsets_in(batches, victim, at, at + 4)
    b.start()
    check(b, topic_name, acked, damaged)
    text = broker_log(b)
    assert f"partition {topic_name}-0: the recovery-point file holds" in text
    assert f"segment {int(victim.name[:20])} is damaged at byte {pos} (CRC-32C mismatch)" in text
    assert f"offsets {min(damaged)}-{max(damaged)} ({len(damaged)}) are cut" in text


def test_corrupt_bytes_below_the_recovery_point_are_answered_corrupt_message_and_logged_once(start_broker,
                                                                                                topic_name):
    b = start_broker(SETTINGS)
    create_topic(b.bootstrap, topic_name, 1)
    acked = produce_acked(b.bootstrap, topic_name)
    b.stop()  # a clean stop: the next start validates the active segment only, as Kafka
    part = b.data_dir / f"{topic_name}-0"
    batches = batches_on_disk(part)
    victim = sorted(part.glob("*.log"))[1]
    in_victim = [x for x in batches if x[0] == victim]
    assert len(in_victim) > 2
    _, pos, _, first, last = in_victim[1]
    with open(victim, "r+b") as f:
        f.seek(pos + 70)
        f.write(b"\x00\x01\x02\x03")
    b.start()
    got = check(b, topic_name, acked, set(range(first, last + 1)), corrupt_skip={first: last})
    assert not set(range(first, last + 1)) & set(got)
    text = broker_log(b)
    assert text.count(f"partition {topic_name}-0: corrupt bytes in segment {int(victim.name[:20])}") == 1
    assert f"offsets {first}-{last} ({last - first + 1}) are answered CORRUPT_MESSAGE" in text
    assert "the batches after them are served" in text
