"""Storage faults against a real ``shoal serve``: a second broker on a data directory in use,
a full disk, a deleted data directory, and running out of file descriptors.

The full-disk tests mount a 20 MiB tmpfs, so they need root (CI runs the suite as root);
run as another user they fail and say why, rather than pass without testing anything.
"""

from __future__ import annotations

import errno
import io
import os
import resource
import shutil
import signal
import socket
import struct
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, KafkaException, ShareConsumer, TopicPartition
from kio.serial import entity_writer

from shoal.client.connection import Connection
from shoal.errors import ErrorCode
from shoal.protocol.codec import codec_for
from shoal.protocol.entities import make, sub
from tests.support.broker import BrokerError, BrokerProcess
from tests.support.clients import (
    admin_client,
    consume_exact,
    consumer,
    create_topic,
    producer,
    rdkafka_conf,
)

pytestmark = pytest.mark.timeout(180)


# ---------------------------------------------------------------------------- helpers
def produce_acked(bootstrap: str, topic: str, values: list[bytes], partition: int = 0,
                  **conf: object) -> list[KafkaError | None]:
    """Produce ``values`` one by one (no retries); returns each delivery's error (None: acknowledged)."""
    p = producer(bootstrap, retries=0, **conf)
    errors: list[KafkaError | None] = []
    for v in values:
        p.produce(topic, v, partition=partition, on_delivery=lambda err, msg: errors.append(err))
        p.flush(20)
    assert len(errors) == len(values), "a delivery report is missing"
    return errors


def read_values(bootstrap: str, topic: str, partition: int, count: int) -> list[bytes]:
    """The first ``count`` values of one partition, read from offset 0."""
    c = consumer(bootstrap)
    try:
        c.assign([TopicPartition(topic, partition, 0)])
        return [r.value for r in consume_exact(c, count, timeout_s=20)]
    finally:
        c.close()


def offset_commit(bootstrap: str, group: str, topic: str, offsets: dict[int, int],
                  metadata: str = "") -> dict[int, ErrorCode]:
    """One OffsetCommit v8 on the wire (simple commit, no generation); partition -> error code.

    The socket times out after 10 s, so a missing response fails the test.
    """
    with Connection.to(bootstrap, timeout_s=10.0) as conn:
        req = conn.request_type(8, 8)
        tcls, pcls = sub(req, "OffsetCommitRequestTopic"), sub(req, "OffsetCommitRequestPartition")
        request = make(req, group_id=group, generation_id_or_member_epoch=-1, member_id="",
                       group_instance_id=None, topics=(make(tcls, name=topic, partitions=tuple(
                           make(pcls, partition_index=p, committed_offset=o, committed_leader_epoch=-1,
                                committed_metadata=metadata) for p, o in offsets.items())),))
        response = conn.send(request)
    (t,) = response.topics
    return {p.partition_index: ErrorCode(p.error_code) for p in t.partitions}


def fill_disk(path: Path) -> None:
    """Write ``path`` until the file system is full."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        chunk = b"\0" * (1 << 16)
        while True:
            try:
                if os.write(fd, chunk) == 0:
                    break
            except OSError as e:
                assert e.errno == errno.ENOSPC, e
                if len(chunk) == 1:
                    break
                chunk = chunk[: len(chunk) // 16 or 1]
    finally:
        os.close(fd)


def stop_within(b: BrokerProcess, seconds: float) -> tuple[int, float]:
    """SIGTERM; returns (exit status, seconds taken). Fails if the broker is still running after ``seconds``."""
    assert b.proc is not None
    start = time.monotonic()
    b.proc.send_signal(signal.SIGTERM)
    try:
        rc = b.proc.wait(seconds)
    except subprocess.TimeoutExpired:
        b.kill()
        raise AssertionError(f"broker still running {seconds}s after SIGTERM\n{b.stderr_tail()}") from None
    took = time.monotonic() - start
    b.stop(check=False)  # closes pipes
    return rc, took


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def share_consumer_on_full_disk(b: BrokerProcess, group: str) -> None:
    """Run a share consumer of ``t`` for 4 s: every poll returns in its time with nothing or
    COORDINATOR_NOT_AVAILABLE, close() returns, the broker lives and does not spin.

    Neither side may loop: a heartbeat that cannot be written is retried at the client's
    pace, and a fetch whose share-partition state cannot be written is answered at the end
    of its wait, as a long poll with nothing.
    """
    c = ShareConsumer(rdkafka_conf(b.bootstrap, **{"group.id": group}))
    c.subscribe(["t"])
    polls = []
    cpu_before = cpu_seconds(b.pid)
    deadline = time.monotonic() + 4
    while time.monotonic() < deadline:
        started = time.monotonic()
        try:
            polls.append(c.poll(0.5))
        except KafkaException as e:
            polls.append(e.args[0].code())
        assert time.monotonic() - started < 5
    busy = cpu_seconds(b.pid) - cpu_before
    started = time.monotonic()
    c.close()
    assert time.monotonic() - started < 15
    b.assert_alive()
    print(f"share consumer {group} on a full disk: {len(polls)} polls, broker CPU {busy:.2f} s in 4 s")
    assert all(p == KafkaError.COORDINATOR_NOT_AVAILABLE or not p for p in polls), polls
    assert len(polls) < 40, polls
    assert busy < 1.0


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A fresh 20 MiB tmpfs, unmounted at the end."""
    if os.geteuid() != 0:
        pytest.fail("the full-disk tests mount a tmpfs and must run as root (CI runs them as root)")
    mnt = tmp_path / "disk"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=20m", "tmpfs", str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.fixture
def brokers() -> Iterator[list[BrokerProcess]]:
    """Brokers a test starts itself (own data dirs); every one is stopped at the end."""
    started: list[BrokerProcess] = []
    yield started
    for b in started:
        if b.is_alive():
            b.kill()


# ------------------------------------------------------------------------------ tests
def test_second_broker_on_a_data_dir_in_use_refuses_to_start_and_nothing_is_lost(
        tmp_path: Path, brokers: list[BrokerProcess]) -> None:
    data = tmp_path / "data"
    first = BrokerProcess(data)
    brokers.append(first)
    first.start()
    create_topic(first.bootstrap, "t", 1)
    assert produce_acked(first.bootstrap, "t", [b"a%d" % i for i in range(10)]) == [None] * 10

    second = BrokerProcess(data)
    brokers.append(second)
    started = time.monotonic()
    with pytest.raises(BrokerError, match=r"exit 1"):
        second.start()
    assert time.monotonic() - started < 10, "the second broker should exit at once"
    assert f"in use by another broker (pid {first.pid})" in second.stderr_tail(200)

    first.assert_alive()
    assert produce_acked(first.bootstrap, "t", [b"b%d" % i for i in range(10)]) == [None] * 10
    first.restart()
    want = [b"a%d" % i for i in range(10)] + [b"b%d" % i for i in range(10)]
    assert read_values(first.bootstrap, "t", 0, 20) == want
    # The lock went with the first broker: a broker starts on the directory once it is free.
    first.stop()
    second.start()
    assert read_values(second.bootstrap, "t", 0, 20) == want
    second.stop()


def test_full_disk_fails_writes_with_errors_and_keeps_every_acknowledged_record(
        small_disk: Path, tmp_path: Path, brokers: list[BrokerProcess]) -> None:
    b = BrokerProcess(small_disk, {"group.share.enable": "true"})
    brokers.append(b)
    b.start()
    create_topic(b.bootstrap, "t", 2)
    acked = [b"before-%d-" % i + b"x" * 1000 for i in range(20)]
    assert produce_acked(b.bootstrap, "t", acked) == [None] * 20
    assert offset_commit(b.bootstrap, "g", "t", {0: 7, 1: 0}) == {0: ErrorCode.none, 1: ErrorCode.none}

    filler = small_disk / "filler"
    fill_disk(filler)

    # Produce: KAFKA_STORAGE_ERROR for the partition, logged once with the cause.
    big = [b"y" * 65536] * 3
    errors = produce_acked(b.bootstrap, "t", big)
    assert [e.code() if e else None for e in errors] == [KafkaError.KAFKA_STORAGE_ERROR] * 3
    stderr = b.stderr_tail(400)
    assert stderr.count("partition t-0: write failed") == 1, stderr
    assert "No space left on device" in stderr

    # A share consumer while its group can still join (the join's records may fit in the
    # page the coordinator's last write began), then, below, one that cannot join.
    share_consumer_on_full_disk(b, "sg1")

    # OffsetCommit: an answer, with the error on every partition (a commit may still fit in
    # the page the log's last write began, so commit until the disk refuses one).
    codes: dict[int, ErrorCode] = {}
    for i in range(40):
        codes = offset_commit(b.bootstrap, "g", "t", {0: 100 + i, 1: 100 + i}, metadata="m" * 2000)
        if codes[0] is not ErrorCode.none:
            break
    assert codes == {0: ErrorCode.coordinator_not_available, 1: ErrorCode.coordinator_not_available}
    for size in (200, 20, 1):  # use up what is left of that page, so group joins fail too
        while offset_commit(b.bootstrap, "g", "t", {0: 7}, metadata="m" * size)[0] is ErrorCode.none:
            pass
    # The same through a real client: commit() raises the error at once.
    c = consumer(b.bootstrap, **{"group.id": "g2"})
    started = time.monotonic()
    with pytest.raises(KafkaException) as info:
        c.commit(offsets=[TopicPartition("t", 0, 5)], asynchronous=False)
    assert info.value.args[0].code() == KafkaError.COORDINATOR_NOT_AVAILABLE
    assert time.monotonic() - started < 10
    c.close()
    share_consumer_on_full_disk(b, "sg2")
    stderr = b.stderr_tail(2000)
    assert len(stderr.splitlines()) < 100, stderr

    # Reads are still served.
    assert read_values(b.bootstrap, "t", 0, 20) == acked

    # Space returns: the same writes succeed, without a restart.
    filler.unlink()
    assert produce_acked(b.bootstrap, "t", [b"z" * 65536]) == [None]
    acked.append(b"z" * 65536)
    assert offset_commit(b.bootstrap, "g", "t", {0: 20}) == {0: ErrorCode.none}
    assert "partition t-0: writes succeed again" in b.stderr_tail(100)

    # Full again: every acknowledged record was fsynced, so a full disk costs only the
    # checkpoints, and SIGTERM shuts down cleanly.
    fill_disk(filler)
    rc, took = stop_within(b, 10)
    assert rc == 0, b.stderr_tail(50)

    filler.unlink()
    b.start()
    assert read_values(b.bootstrap, "t", 0, 21) == acked
    with Connection.to(b.bootstrap, timeout_s=10.0) as conn:
        req = conn.request_type(9, 7)
        tcls = sub(req, "OffsetFetchRequestTopic")
        got = conn.send(make(req, group_id="g", require_stable=False,
                             topics=(make(tcls, name="t", partition_indexes=(0, 1)),)))
    offsets = {p.partition_index: p.committed_offset for p in got.topics[0].partitions}
    assert offsets[0] == 20  # the last acknowledged commit
    assert produce_acked(b.bootstrap, "t", [b"after"]) == [None]
    assert read_values(b.bootstrap, "t", 0, 22) == acked + [b"after"]
    b.stop()


def test_deleted_data_dir_is_reported_and_the_broker_stops(tmp_path: Path, brokers: list[BrokerProcess]) -> None:
    b = BrokerProcess(tmp_path / "data")
    brokers.append(b)
    b.start()
    create_topic(b.bootstrap, "t", 1)
    assert produce_acked(b.bootstrap, "t", [b"one"]) == [None]
    shutil.rmtree(b.data_dir)
    assert b.proc is not None
    try:
        rc = b.proc.wait(10)
    except subprocess.TimeoutExpired:
        rc, _ = stop_within(b, 10)
        raise AssertionError(f"the broker kept running on a deleted data directory (exit {rc} after SIGTERM)")
    b.stop(check=False)
    assert rc == 1
    tail = b.stderr_tail(100)
    assert "is gone (it was deleted)" in tail


def test_create_topics_near_the_descriptor_limit_stays_below_it(tmp_path: Path,
                                                                brokers: list[BrokerProcess]) -> None:
    # Segments give their descriptors back under pressure (an LRU of open segments that
    # closes half of them on EMFILE), so 100 partitions fit in room for 40 descriptors.
    # A creation that fails half-way is covered by tests/unit/log/test_store.py.
    b = BrokerProcess(tmp_path / "data")
    brokers.append(b)
    b.start()
    create_topic(b.bootstrap, "small", 1)
    admin = admin_client(b.bootstrap)
    soft, hard = resource.prlimit(b.pid, resource.RLIMIT_NOFILE)
    used = len(os.listdir(f"/proc/{b.pid}/fd"))
    limit = used + 40  # the client's connection and a few files, not 100 partitions' segments
    resource.prlimit(b.pid, resource.RLIMIT_NOFILE, (limit, hard))
    from confluent_kafka.admin import NewTopic

    admin.create_topics([NewTopic("big", 100, 1)], operation_timeout=15, request_timeout=15)["big"].result(timeout=20)
    assert len(os.listdir(f"/proc/{b.pid}/fd")) <= limit
    assert produce_acked(b.bootstrap, "big", [b"x"], partition=99) == [None]
    assert produce_acked(b.bootstrap, "big", [b"y"], partition=0) == [None]
    assert len(os.listdir(f"/proc/{b.pid}/fd")) <= limit
    resource.prlimit(b.pid, resource.RLIMIT_NOFILE, (soft, hard))
    b.restart()
    md = admin_client(b.bootstrap).list_topics(timeout=10)
    assert len(md.topics["big"].partitions) == 100
    assert produce_acked(b.bootstrap, "big", [b"z"], partition=99) == [None]
    b.stop()


def test_half_created_topic_of_an_older_version_is_repaired_at_start(tmp_path: Path,
                                                                      brokers: list[BrokerProcess]) -> None:
    b = BrokerProcess(tmp_path / "data")
    brokers.append(b)
    b.start()
    create_topic(b.bootstrap, "t", 3)
    assert produce_acked(b.bootstrap, "t", [b"kept"]) == [None]
    b.stop()
    # What an older version left when creation failed half-way: metadata, but not every directory.
    shutil.rmtree(b.data_dir / "t-2")
    b.start()
    assert "partition t-2 has no directory" in b.stderr_tail(100)
    assert read_values(b.bootstrap, "t", 0, 1) == [b"kept"]
    assert produce_acked(b.bootstrap, "t", [b"new"], partition=2) == [None]
    b.stop()


def fetch_without_reading(bootstrap: str, topic: str, max_bytes: int) -> socket.socket:
    """Send one Fetch v4 for ``max_bytes`` of ``topic``-0 and never read the answer."""
    host, port = bootstrap.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=10)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    req = codec_for(1, 4).request_type
    tcls, pcls = sub(req, "FetchTopic"), sub(req, "FetchPartition")
    request = make(req, replica_id=-1, max_wait=0, min_bytes=1, max_bytes=max_bytes, isolation_level=0,
                   topics=(make(tcls, topic=topic, partitions=(
                       make(pcls, partition=0, fetch_offset=0, partition_max_bytes=max_bytes),)),))
    body = io.BytesIO()
    entity_writer(req)(body, request)
    payload = struct.pack(">hhih", 1, 4, 1, 4) + b"test" + body.getvalue()
    sock.sendall(struct.pack(">i", len(payload)) + payload)
    return sock


def test_a_second_sigterm_ends_a_shutdown_that_waits(tmp_path: Path, brokers: list[BrokerProcess]) -> None:
    # A client that never reads its large Fetch answer holds the shutdown for up to
    # shutdown.timeout.ms (here a minute); a second SIGTERM ends the process at once.
    b = BrokerProcess(tmp_path / "data", {"shutdown.timeout.ms": "60000"})
    brokers.append(b)
    b.start()
    create_topic(b.bootstrap, "t", 1)
    assert produce_acked(b.bootstrap, "t", [os.urandom(900_000) for _ in range(40)]) == [None] * 40
    sock = fetch_without_reading(b.bootstrap, "t", 64 << 20)
    try:
        time.sleep(1)  # the broker has the answer queued
        assert b.proc is not None
        b.proc.send_signal(signal.SIGTERM)
        with pytest.raises(subprocess.TimeoutExpired):
            b.proc.wait(2)  # the first SIGTERM waits for the slow client
        started = time.monotonic()
        b.proc.send_signal(signal.SIGTERM)
        rc = b.proc.wait(5)
        assert time.monotonic() - started < 5
        assert rc == 128 + signal.SIGTERM
        assert "second SIGTERM during shutdown: exiting at once" in b.stderr_tail(20)
    finally:
        sock.close()
        b.stop(check=False)
