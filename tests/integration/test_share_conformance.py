"""Share groups to the letter of KIP-932, over the wire with real clients.

Each test states the rule it checks (the KIP section, or Kafka's behaviour where the
KIP is silent) and drives a real ``shoal serve`` with confluent-kafka's ShareConsumer,
or with raw requests where no client sends them.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from confluent_kafka import ShareConsumer
from confluent_kafka.admin import NewPartitions
from kio.schema.errors import ErrorCode

from tests.support.broker import BrokerProcess
from tests.support.clients import admin_client, create_topic, producer, rdkafka_conf

pytestmark = pytest.mark.integration


def share_consumer(bootstrap: str, group: str, topic: str, **extra: Any) -> ShareConsumer:
    c = ShareConsumer(rdkafka_conf(bootstrap, **{"group.id": group, **extra}))
    c.subscribe([topic])
    return c


class Polling:
    """A ShareConsumer polled on a thread (implicit acknowledgement), collecting what it gets."""

    def __init__(self, c: ShareConsumer) -> None:
        self.c = c
        self.got: list[tuple[int, int]] = []
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            for m in self.c.poll(0.2):
                if m.error() is None:
                    with self.lock:
                        self.got.append((m.partition(), m.offset()))

    def seen(self) -> set[tuple[int, int]]:
        with self.lock:
            return set(self.got)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(10)
        self.c.close()


def wait_for(what: str, check: Any, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


# --- 1. new partitions start at the earliest offset ---------------------------------------


def test_partitions_added_while_producing_deliver_every_record(broker: BrokerProcess, topic_name: str) -> None:
    """KIP-932 "Managing the SPSO and SPEO": when partitions are added to a subscribed
    topic, the new share-partitions start at offset 0, whatever
    share.auto.offset.reset (latest here) says."""
    bs = broker.bootstrap
    create_topic(bs, topic_name, partitions=1)
    c = Polling(share_consumer(bs, "g", topic_name))
    p = producer(bs, **{"linger.ms": 0, "topic.metadata.refresh.interval.ms": 200})
    produced: set[tuple[int, int]] = set()

    def delivered(err: Any, msg: Any) -> None:
        if err is None:
            produced.add((msg.partition(), msg.offset()))

    try:
        # The group exists once a record produced now is delivered (latest: earlier ones are not).
        def probe() -> bool:
            p.produce(topic_name, value=b"probe", partition=0, on_delivery=delivered)
            p.flush(5)
            time.sleep(0.3)
            return bool(c.seen())

        wait_for("the share group to deliver", probe, 30)
        first = min(o for _p, o in c.seen())
        produced = {(pp, o) for pp, o in produced if o >= first}
        admin = admin_client(bs)
        admin.create_partitions([NewPartitions(topic_name, 4)])[topic_name].result(timeout=10)
        fresh = producer(bs, **{"linger.ms": 0})
        for i in range(200):
            fresh.produce(topic_name, value=b"%d" % i, partition=i % 4, on_delivery=delivered)
            fresh.poll(0)
            if i % 20 == 0:
                time.sleep(0.05)
        assert fresh.flush(15) == 0
        assert {pp for pp, _o in produced} == {0, 1, 2, 3}
        wait_for("every record produced after the group existed", lambda: produced <= c.seen(), 40)
    finally:
        c.close()


# --- 2. a member removed from the group still acknowledges what it holds -----------------

_PAUSED_CONSUMER = r"""
import sys, time
from confluent_kafka import AcknowledgeType, ShareConsumer
bootstrap, group, topic, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
c = ShareConsumer({"bootstrap.servers": bootstrap, "group.id": group, "share.acknowledgement.mode": "explicit",
                   "log_level": 0})
c.subscribe([topic])
got = []
deadline = time.monotonic() + 30
while len(got) < n and time.monotonic() < deadline:
    for m in c.poll(0.5):
        if m.error() is None:
            got.append(m)
for m in got:
    c.acknowledge(m, AcknowledgeType.ACCEPT)
print("ACKED", len(got), flush=True)
sys.stdin.readline()
end = time.monotonic() + 4
while time.monotonic() < end:
    c.poll(0.5)
try:
    c.commit_sync()
except Exception as e:
    print("COMMIT", e, flush=True)
c.close()
print("CLOSED", flush=True)
"""


def test_member_removed_by_session_timeout_still_acknowledges(start_broker: Any, topic_name: str,
                                                               tmp_path: Any) -> None:
    """A consumer stopped past its session timeout is removed from the group; when it
    resumes, the acknowledgements it had made are applied (Kafka keeps a departed
    member's acquired records its own until its share session or locks end), so the
    records it accepted are never delivered to anyone else."""
    import signal
    import subprocess
    import sys

    b = start_broker({"group.share.min.session.timeout.ms": "1000", "group.share.min.heartbeat.interval.ms": "200"})
    bs = b.bootstrap
    create_topic(bs, topic_name)
    from tests.integration.test_share_consumer import produce, set_group_configs
    set_group_configs(bs, "g", share_auto_offset_reset="earliest", share_session_timeout_ms="2000",
                      share_heartbeat_interval_ms="500")
    produce(bs, topic_name, 20)
    script = tmp_path / "paused.py"
    script.write_text(_PAUSED_CONSUMER)
    proc = subprocess.Popen([sys.executable, str(script), bs, "g", topic_name, "20"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    other = None
    try:
        assert proc.stdout is not None and proc.stdin is not None
        line = proc.stdout.readline()
        assert line.split() == ["ACKED", "20"], line
        os_kill = __import__("os").kill
        os_kill(proc.pid, signal.SIGSTOP)
        try:
            # Past the session timeout: the group coordinator removes the member.
            from shoal.client.connection import Connection
            with Connection.to(bs) as conn:
                def members() -> int:
                    r = conn.call(77, 1, group_ids=("g",), include_authorized_operations=False)
                    return len(r.groups[0].members)
                wait_for("the stopped member to be removed", lambda: members() == 0, 20)
        finally:
            os_kill(proc.pid, signal.SIGCONT)
        proc.stdin.write("go\n")
        proc.stdin.flush()
        out, _ = proc.communicate(timeout=40)
        assert "CLOSED" in out, out
        # Nothing it accepted comes back: another member gets nothing.
        other = share_consumer(bs, "g", topic_name)
        again: list[Any] = []
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            again.extend(m for m in other.poll(0.5) if m.error() is None)
        assert [m.offset() for m in again] == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        if other is not None:
            other.close()


# --- 4. ShareFetch validation -------------------------------------------------------------

SHARE_FETCH = 78


def joined(bs: str, group: str, topic: str) -> tuple[Any, Any, Any]:
    """(connection, membership, topic id) of a member that joined ``group`` on ``topic``."""
    from shoal.client.connection import Connection
    from shoal.client.share import ShareMembership, topic_metadata

    conn = Connection.to(bs)
    m = ShareMembership(group, topics=(topic,))
    m.heartbeat(conn)
    return conn, m, topic_metadata(conn, [topic])[topic].topic_id


def raw_fetch(conn: Any, member: Any, epoch: int, parts: dict[int, tuple] | None, tid: Any, **fields: Any) -> Any:
    """A ShareFetch v2; ``parts``: partition -> acknowledgement batches (first, last, type)."""
    from shoal.protocol.entities import make, sub

    req_type = conn.request_type(SHARE_FETCH, 2)
    topics = ()
    if parts:
        topics = (make(sub(req_type, "FetchTopic"), topic_id=tid, partitions=tuple(
            make(sub(req_type, "FetchPartition"), partition_index=p, acknowledgement_batches=tuple(
                make(sub(req_type, "AcknowledgementBatch"), first_offset=a, last_offset=b, acknowledge_types=(t,))
                for a, b, t in acks)) for p, acks in parts.items())),)
    values = dict(group_id=member.group_id, member_id=member.member_id, share_session_epoch=epoch, max_wait=0,
                  min_bytes=1, max_bytes=1 << 20, max_records=100, batch_size=100, topics=topics,
                  forgotten_topics_data=())
    values.update(fields)
    return conn.send(make(req_type, **values))


def acquired_offsets(resp: Any) -> list[int]:
    return sorted(o for t in resp.responses for p in t.partitions for a in p.acquired_records
                  for o in range(a.first_offset, a.last_offset + 1))


@pytest.fixture
def member_on_topic(shared_broker: BrokerProcess, topic_name: str) -> Any:
    from tests.integration.test_share_consumer import produce, set_group_configs

    bs = shared_broker.bootstrap
    create_topic(bs, topic_name)
    group = f"g-{topic_name}"
    set_group_configs(bs, group, share_auto_offset_reset="earliest")
    produce(bs, topic_name, 10)
    conn, m, tid = joined(bs, group, topic_name)
    yield bs, conn, m, tid
    conn.close()


def test_acknowledgements_in_a_session_opening_fetch_are_invalid(member_on_topic: Any) -> None:
    bs, conn, m, tid = member_on_topic
    r = raw_fetch(conn, m, 0, {0: [(0, 0, 1)]}, tid)
    assert r.error_code == ErrorCode.invalid_request and r.responses == ()
    # Nothing was opened: the member's first real fetch gets every record.
    r = raw_fetch(conn, m, 0, {0: []}, tid)
    assert r.error_code == ErrorCode.none and acquired_offsets(r) == list(range(10))


def test_partitions_to_fetch_in_a_session_closing_fetch_are_invalid(member_on_topic: Any) -> None:
    bs, conn, m, tid = member_on_topic
    assert acquired_offsets(raw_fetch(conn, m, 0, {0: []}, tid)) == list(range(10))
    r = raw_fetch(conn, m, -1, {0: []}, tid)
    assert r.error_code == ErrorCode.invalid_request
    # The session is still open, and its records still the member's: it acknowledges them.
    r = raw_fetch(conn, m, 1, {0: [(0, 9, 1)]}, tid)
    assert r.error_code == ErrorCode.none
    assert [p.acknowledge_error_code for t in r.responses for p in t.partitions] == [ErrorCode.none]


def test_unknown_acquire_mode_is_an_invalid_request_not_a_closed_connection(member_on_topic: Any) -> None:
    bs, conn, m, tid = member_on_topic
    assert acquired_offsets(raw_fetch(conn, m, 0, {0: []}, tid)) == list(range(10))
    r = raw_fetch(conn, m, 1, {0: []}, tid, share_acquire_mode=7)
    assert r.error_code == ErrorCode.invalid_request
    # Same connection, same session (epoch 1 again, as the invalid request changed nothing):
    # the records are still held by the member, so it can accept them.
    r = raw_fetch(conn, m, 1, {0: [(0, 9, 1)]}, tid)
    assert r.error_code == ErrorCode.none
    assert [p.acknowledge_error_code for t in r.responses for p in t.partitions] == [ErrorCode.none]


def test_min_bytes_waits_up_to_max_wait_for_more_records(member_on_topic: Any) -> None:
    from tests.integration.test_share_consumer import produce

    bs, conn, m, tid = member_on_topic
    topic = [n for n in [m.topics[0]]][0]
    started = time.monotonic()
    r = raw_fetch(conn, m, 0, {0: []}, tid, min_bytes=1 << 20, max_wait=1500)
    waited = time.monotonic() - started
    assert acquired_offsets(r) == list(range(10))
    assert waited >= 1.2, waited  # fewer bytes than MinBytes: the whole MaxWaitMs
    # Records arriving during the wait are added to the same answer, which leaves as
    # soon as MinBytes is reached.
    threading.Timer(0.5, produce, args=(bs, topic, 200), kwargs={"start": 10}).start()
    started = time.monotonic()
    r = raw_fetch(conn, m, 1, {0: [(0, 9, 1)]}, tid, min_bytes=500, max_wait=8000, max_records=1000)
    waited = time.monotonic() - started
    assert 0.4 <= waited < 6, waited
    assert acquired_offsets(r)[:1] == [10]


# --- 3, 5. resetting offsets: empty groups, unknown groups, the tool ----------------------

_HOLDING_CONSUMER = r"""
import sys, time
from confluent_kafka import ShareConsumer
bootstrap, group, topic = sys.argv[1], sys.argv[2], sys.argv[3]
c = ShareConsumer({"bootstrap.servers": bootstrap, "group.id": group, "share.acknowledgement.mode": "explicit",
                   "log_level": 0})
c.subscribe([topic])
got = 0
while True:
    for m in c.poll(0.5):
        if m.error() is None:
            got += 1
            if got == 5:
                print("HOLDING", flush=True)
"""


def share_groups_tool(bs: str, *args: str) -> Any:
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "shoal", "share-groups", "--bootstrap-server", bs, *args],
                          capture_output=True, text=True, timeout=60)


def describe_offsets(bs: str, group: str) -> Any:
    from shoal.client.connection import Connection
    from shoal.protocol.entities import make, sub

    with Connection.to(bs) as conn:
        req_type = conn.request_type(90, 1)
        return conn.send(make(req_type, groups=(make(sub(req_type, "DescribeShareGroupOffsetsRequestGroup"),
                                                     group_id=group, topics=None),))).groups[0]


def members_of(bs: str, group: str) -> int:
    from shoal.client.connection import Connection

    with Connection.to(bs) as conn:
        r = conn.call(77, 1, group_ids=(group,), include_authorized_operations=False)
        return len(r.groups[0].members)


@pytest.mark.parametrize("how", ["SIGKILL", "SIGSTOP"])
def test_reset_offsets_after_the_last_consumer_was_killed(start_broker: Any, topic_name: str, tmp_path: Any,
                                                          how: str) -> None:
    """KIP-932: AlterShareGroupOffsets needs an empty group; a consumer killed (SIGKILL)
    or frozen (SIGSTOP: its connection stays open) leaves the group when its session
    times out, and nothing it left behind (its share session, its acquired records)
    keeps the group from being reset."""
    import signal
    import subprocess
    import sys

    from tests.integration.test_share_consumer import produce, set_group_configs

    b = start_broker({"group.share.min.session.timeout.ms": "1000", "group.share.min.heartbeat.interval.ms": "200"})
    bs = b.bootstrap
    create_topic(bs, topic_name)
    set_group_configs(bs, "g", share_auto_offset_reset="earliest", share_session_timeout_ms="2000",
                      share_heartbeat_interval_ms="500")
    produce(bs, topic_name, 10)
    script = tmp_path / "holding.py"
    script.write_text(_HOLDING_CONSUMER)
    proc = subprocess.Popen([sys.executable, str(script), bs, "g", topic_name], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "HOLDING"
        assert members_of(bs, "g") == 1
        if how == "SIGSTOP":
            proc.send_signal(signal.SIGSTOP)
        else:
            proc.kill()
            proc.wait(10)
        wait_for("the member's session to time out", lambda: members_of(bs, "g") == 0, 20)
        r = share_groups_tool(bs, "--group", "g", "--topic", topic_name, "--reset-offsets", "--to-earliest",
                              "--execute")
    finally:
        proc.kill()
        proc.wait(10)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Error" not in r.stdout + r.stderr, r.stdout + r.stderr
    d = describe_offsets(bs, "g")
    assert [(p.partition_index, p.start_offset, p.lag) for t in d.topics for p in t.partitions] == [(0, 0, 10)]
    c = share_consumer(bs, "g", topic_name)
    got: list[Any] = []
    deadline = time.monotonic() + 20
    while len(got) < 10 and time.monotonic() < deadline:
        got.extend(m for m in c.poll(0.5) if m.error() is None)
    c.close()
    assert sorted(m.offset() for m in got) == list(range(10))
    assert {m.delivery_count() for m in got} == {1}  # a new state epoch: counts start over


def test_reset_offsets_of_a_group_that_does_not_exist_yet(broker: BrokerProcess, topic_name: str) -> None:
    """KIP-932: "to start using a share group S1 to consume for the first time from the
    earliest offset of a topic T1" reset its offsets first. The group is created, listed,
    and its first consumer starts where the reset said, not at share.auto.offset.reset
    (latest by default)."""
    from tests.integration.test_share_consumer import produce

    bs = broker.bootstrap
    create_topic(bs, topic_name, partitions=2)
    produce(bs, topic_name, 20)
    r = share_groups_tool(bs, "--group", "fresh", "--topic", topic_name, "--reset-offsets", "--to-earliest",
                          "--execute")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Error" not in r.stdout + r.stderr, r.stdout + r.stderr
    listed = share_groups_tool(bs, "--list")
    assert listed.returncode == 0 and "fresh" in listed.stdout.split(), listed.stdout
    state = share_groups_tool(bs, "--describe", "--group", "fresh", "--state")
    assert state.returncode == 0 and "Empty" in state.stdout, state.stdout
    c = share_consumer(bs, "fresh", topic_name)
    got: list[Any] = []
    deadline = time.monotonic() + 20
    while len(got) < 20 and time.monotonic() < deadline:
        got.extend(m for m in c.poll(0.5) if m.error() is None)
    c.close()
    assert len(got) == 20 and len({(m.partition(), m.offset()) for m in got}) == 20


def test_offsets_of_an_unknown_group_and_out_of_range_offsets(shared_broker: BrokerProcess, topic_name: str) -> None:
    from shoal.client.connection import Connection
    from shoal.protocol.entities import make, sub
    from tests.integration.test_share_consumer import produce

    bs = shared_broker.bootstrap
    create_topic(bs, topic_name)
    produce(bs, topic_name, 5)
    assert describe_offsets(bs, "no-such-group").error_code == ErrorCode.group_id_not_found
    r = share_groups_tool(bs, "--describe", "--group", "no-such-group")
    assert r.returncode == 1 and ("GROUP_ID_NOT_FOUND" in r.stdout + r.stderr
                                  or "does not exist" in r.stderr), r.stdout + r.stderr
    with Connection.to(bs) as conn:
        req_type = conn.request_type(91, 0)

        def alter(offset: int) -> Any:
            return conn.send(make(req_type, group_id="ranged", topics=(make(
                sub(req_type, "AlterShareGroupOffsetsRequestTopic"), topic_name=topic_name, partitions=(make(
                    sub(req_type, "AlterShareGroupOffsetsRequestPartition"), partition_index=0,
                    start_offset=offset),)),)))

        for bad in (6, 1000, -5):
            resp = alter(bad)
            assert resp.error_code == ErrorCode.none
            assert [p.error_code for t in resp.responses for p in t.partitions] == [ErrorCode.offset_out_of_range]
        resp = alter(5)
        assert [p.error_code for t in resp.responses for p in t.partitions] == [ErrorCode.none]
    d = describe_offsets(bs, "ranged")
    assert [(p.start_offset, p.lag) for t in d.topics for p in t.partitions] == [(5, 0)]


# --- 6. configs with the KIP's ranges; group.share.max.groups --------------------------------


def _alter(bs: str, rtype: Any, name: str, **configs: str) -> Any:
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource

    res = ConfigResource(rtype, name, incremental_configs=[
        ConfigEntry(k.replace("_", "."), v, incremental_operation=AlterConfigOpType.SET) for k, v in configs.items()])
    admin = admin_client(bs)
    try:
        admin.incremental_alter_configs([res])[res].result(timeout=10)
    except KafkaException as e:
        return e.args[0]
    return None


def test_share_configs_outside_their_ranges_are_invalid_config(shared_broker: BrokerProcess) -> None:
    from confluent_kafka import KafkaError
    from confluent_kafka.admin import ResourceType

    bs = shared_broker.bootstrap
    cases = [
        (ResourceType.GROUP, "cfg", {"share_delivery_count_limit": "11"}, "between 2 and 10"),
        (ResourceType.GROUP, "cfg", {"share_record_lock_duration_ms": "500"}, "between 15000 and 60000"),
        (ResourceType.GROUP, "cfg", {"share_heartbeat_interval_ms": "15000", "share_session_timeout_ms": "45000"},
         None),
        (ResourceType.BROKER, "0", {"group_share_delivery_count_limit": "11"}, "between 2 and 10"),
        (ResourceType.BROKER, "0", {"group_share_partition_max_record_locks": "10001"}, "between 100 and 10000"),
        (ResourceType.BROKER, "0", {"group_share_record_lock_duration_ms": "5000"}, "between 15000 and 60000"),
    ]
    for rtype, name, configs, says in cases:
        err = _alter(bs, rtype, name, **configs)
        if says is None:
            assert err is None, (configs, err)
            continue
        assert err is not None and err.code() == KafkaError.INVALID_CONFIG, (configs, err)
        assert says in err.str(), (configs, err.str())
    # A refused change changed nothing.
    assert _alter(bs, ResourceType.BROKER, "0", group_share_delivery_count_limit="10") is None
    assert _alter(bs, ResourceType.BROKER, "0", group_share_delivery_count_limit="5") is None


def test_share_isolation_level_takes_kafkas_two_values(shared_broker: BrokerProcess) -> None:
    """KIP-932's share.isolation.level: read_uncommitted and read_committed are served;
    anything else is INVALID_CONFIG."""
    from confluent_kafka import KafkaError
    from confluent_kafka.admin import ResourceType

    bs = shared_broker.bootstrap
    assert _alter(bs, ResourceType.GROUP, "iso", share_isolation_level="read_committed") is None
    err = _alter(bs, ResourceType.GROUP, "iso", share_isolation_level="serializable")
    assert err is not None and err.code() == KafkaError.INVALID_CONFIG, err
    assert _alter(bs, ResourceType.GROUP, "iso", share_isolation_level="read_uncommitted") is None


def test_group_heartbeat_interval_must_be_below_its_session_timeout(start_broker: Any) -> None:
    from confluent_kafka import KafkaError
    from confluent_kafka.admin import ResourceType

    b = start_broker({"group.share.min.session.timeout.ms": "1000", "group.share.min.heartbeat.interval.ms": "200"})
    err = _alter(b.bootstrap, ResourceType.GROUP, "cfg", share_heartbeat_interval_ms="2000",
                 share_session_timeout_ms="2000")
    assert err is not None and err.code() == KafkaError.INVALID_CONFIG and "must be less than" in err.str(), err
    # The broker's default interval (5000) is not below 3000 either.
    err = _alter(b.bootstrap, ResourceType.GROUP, "cfg", share_session_timeout_ms="3000")
    assert err is not None and err.code() == KafkaError.INVALID_CONFIG, err
    assert _alter(b.bootstrap, ResourceType.GROUP, "cfg", share_session_timeout_ms="3000",
                  share_heartbeat_interval_ms="1000") is None


def test_max_groups_is_enforced(start_broker: Any, topic_name: str) -> None:
    from shoal.client.connection import KafkaProtocolError

    b = start_broker({"group.share.max.groups": "2"})
    bs = b.bootstrap
    create_topic(bs, topic_name)
    conns = []
    try:
        for g in ("one", "two"):
            conn, _m, _tid = joined(bs, g, topic_name)
            conns.append(conn)
        with pytest.raises(KafkaProtocolError) as e:
            joined(bs, "three", topic_name)
        assert e.value.code == ErrorCode.group_max_size_reached
        r = share_groups_tool(bs, "--group", "three", "--topic", topic_name, "--reset-offsets", "--to-earliest",
                              "--execute")
        assert r.returncode == 1 and "GROUP_MAX_SIZE_REACHED" in r.stdout + r.stderr, r.stdout + r.stderr
        # Existing groups keep working: a second member joins "one".
        conn, _m, _tid = joined(bs, "one", topic_name)
        conns.append(conn)
        listed = share_groups_tool(bs, "--list")
        assert listed.stdout.split() == ["one", "two"]
    finally:
        for c in conns:
            c.close()


def test_kafka_share_session_limit_key_is_served(start_broker: Any, topic_name: str) -> None:
    """Kafka's broker key group.share.max.share.sessions bounds the share sessions."""
    from shoal.client.connection import KafkaProtocolError
    from shoal.client.share import ShareSession

    b = start_broker({"group.share.max.share.sessions": "1"})
    bs = b.bootstrap
    create_topic(bs, topic_name)
    conn, m, tid = joined(bs, "one", topic_name)
    conn2, m2, _ = joined(bs, "one", topic_name)
    try:
        ShareSession(conn, "one", m.member_id).fetch([(tid, 0)], max_wait_ms=0)
        with pytest.raises(KafkaProtocolError) as e:
            ShareSession(conn2, "one", m2.member_id).fetch([(tid, 0)], max_wait_ms=0)
        assert e.value.code == ErrorCode.share_session_limit_reached
    finally:
        conn.close()
        conn2.close()


# --- 9. ShareFetch v2 and the admin paths, over the wire -----------------------------------


def produce_batches(bs: str, topic: str, batches: int, per_batch: int, **extra: Any) -> None:
    """``batches`` record batches of ``per_batch`` records each (one flush per batch)."""
    p = producer(bs, **{"linger.ms": 200, "batch.num.messages": per_batch, **extra})
    for b in range(batches):
        for i in range(per_batch):
            p.produce(topic, value=b"%d-%d" % (b, i))
        assert p.flush(10) == 0


def acquired_ranges(resp: Any) -> list[tuple[int, int]]:
    return [(a.first_offset, a.last_offset) for t in resp.responses for p in t.partitions
            for a in p.acquired_records]


@pytest.fixture
def fresh_member(shared_broker: BrokerProcess, topic_name: str) -> Any:
    """(bootstrap, connection, membership, topic id) for a new earliest-reset group on an empty topic."""
    from tests.integration.test_share_consumer import set_group_configs

    bs = shared_broker.bootstrap
    create_topic(bs, topic_name)
    group = f"v2-{topic_name}"
    set_group_configs(bs, group, share_auto_offset_reset="earliest")
    conn, m, tid = joined(bs, group, topic_name)
    yield bs, conn, m, tid
    conn.close()


def test_batch_size_is_the_preferred_acquired_batch_size(fresh_member: Any) -> None:
    bs, conn, m, tid = fresh_member
    produce_batches(bs, m.topics[0], 6, 5)
    r = raw_fetch(conn, m, 0, {0: []}, tid, batch_size=10, max_records=100)
    # Log batches are never split; consecutive ones are grouped up to BatchSize records.
    assert acquired_ranges(r) == [(0, 9), (10, 19), (20, 29)]


def test_record_limit_acquire_mode_never_exceeds_max_records(fresh_member: Any) -> None:
    bs, conn, m, tid = fresh_member
    produce_batches(bs, m.topics[0], 1, 10)
    r = raw_fetch(conn, m, 0, {0: []}, tid, max_records=3, share_acquire_mode=1)
    assert acquired_ranges(r) == [(0, 2)]
    # batch_optimized (the mode clients use): max_records is soft, whole batches are taken.
    r = raw_fetch(conn, m, 1, {0: []}, tid, max_records=3, share_acquire_mode=0)
    assert acquired_ranges(r) == [(3, 9)]


def test_renew_keeps_records_past_their_lock_and_is_renew_ack_fetches_nothing(start_broker: Any,
                                                                             topic_name: str) -> None:
    from tests.integration.test_share_consumer import set_group_configs

    b = start_broker({"group.share.min.record.lock.duration.ms": "1000"})
    bs = b.bootstrap
    create_topic(bs, topic_name)
    set_group_configs(bs, "g", share_auto_offset_reset="earliest", share_record_lock_duration_ms="2000")
    produce_batches(bs, topic_name, 1, 5)
    conn, m, tid = joined(bs, "g", topic_name)
    other_conn, other, _ = joined(bs, "g", topic_name)
    try:
        r = raw_fetch(conn, m, 0, {0: []}, tid)
        assert acquired_ranges(r) == [(0, 4)]
        started = time.monotonic()
        produce_batches(bs, topic_name, 1, 5)
        time.sleep(1.2)
        # RENEW (type 4) with IsRenewAck: the locks move on; nothing is acquired.
        r = raw_fetch(conn, m, 1, {0: [(0, 4, 4)]}, tid, is_renew_ack=True, max_wait=1000)
        assert r.error_code == ErrorCode.none and acquired_ranges(r) == []
        assert [p.acknowledge_error_code for t in r.responses for p in t.partitions] == [ErrorCode.none]
        time.sleep(max(0.0, 2.6 - (time.monotonic() - started)))
        # Past the first lock's end, the renewed records are still the first member's.
        r = raw_fetch(other_conn, other, 0, {0: []}, tid)
        assert acquired_ranges(r) == [(5, 9)]
        r = raw_fetch(conn, m, 2, {0: [(0, 4, 1)]}, tid, max_records=1)
        assert [p.acknowledge_error_code for t in r.responses for p in t.partitions] == [ErrorCode.none]
        # RENEW needs ShareFetch/ShareAcknowledge v2; v1 refuses it for the partition.
        from shoal.protocol.entities import make, sub
        v1 = other_conn.request_type(79, 1)
        r = other_conn.send(make(v1, group_id=other.group_id, member_id=other.member_id, share_session_epoch=1,
                                 topics=(make(sub(v1, "AcknowledgeTopic"), topic_id=tid, partitions=(make(
                                     sub(v1, "AcknowledgePartition"), partition_index=0, acknowledgement_batches=(
                                         make(sub(v1, "AcknowledgementBatch"), first_offset=5, last_offset=9,
                                              acknowledge_types=(4,)),)),)),)))
        assert [p.error_code for t in r.responses for p in t.partitions] == [ErrorCode.invalid_request]
    finally:
        conn.close()
        other_conn.close()


def test_by_duration_reset_starts_at_the_first_record_that_recent(shared_broker: BrokerProcess,
                                                                  topic_name: str) -> None:
    from tests.integration.test_share_consumer import set_group_configs

    bs = shared_broker.bootstrap
    create_topic(bs, topic_name)
    now = int(time.time() * 1000)
    p = producer(bs, **{"linger.ms": 0})
    for i in range(5):
        p.produce(topic_name, value=b"old", timestamp=now - 2 * 3_600_000 + i)
    for i in range(5):
        p.produce(topic_name, value=b"new", timestamp=now - 600_000 + i)
    assert p.flush(10) == 0
    set_group_configs(bs, "dur", share_auto_offset_reset="by_duration:PT1H")
    c = share_consumer(bs, "dur", topic_name)
    got: list[Any] = []
    deadline = time.monotonic() + 15
    while len(got) < 5 and time.monotonic() < deadline:
        got.extend(x for x in c.poll(0.5) if x.error() is None)
    c.close()
    assert sorted(x.offset() for x in got) == [5, 6, 7, 8, 9]


def test_describe_list_and_delete_share_groups_and_offsets_lag(shared_broker: BrokerProcess,
                                                               topic_name: str) -> None:
    from shoal.client.share import ShareSession
    from tests.integration.test_share_consumer import produce, set_group_configs

    bs = shared_broker.bootstrap
    group = f"adm-{topic_name}"[:200]
    create_topic(bs, topic_name)
    set_group_configs(bs, group, share_auto_offset_reset="earliest")
    produce(bs, topic_name, 10)
    conn, m, tid = joined(bs, group, topic_name)
    try:
        d = conn.call(77, 1, group_ids=(group,), include_authorized_operations=False).groups[0]
        assert (d.error_code, d.group_state, [x.member_id for x in d.members]) == (ErrorCode.none, "Stable",
                                                                                   [m.member_id])
        assert [(tp.topic_name, tuple(tp.partitions)) for tp in d.members[0].assignment.topic_partitions] == \
            [(topic_name, (0,))]
        listed = conn.call(16, 5, states_filter=(), types_filter=("share",))
        assert (group, "share") in {(g.group_id, g.group_type) for g in listed.groups}
        # Several acknowledgement batches in one request; lag counts what is left.
        s = ShareSession(conn, group, m.member_id)
        assert len(s.fetch([(tid, 0)]).records) == 10
        assert s.acknowledge({(tid, 0): [(0, 3, 1), (6, 7, 1), (8, 8, 3)]}) == {}
        off = describe_offsets(bs, group)
        assert [(p.start_offset, p.lag) for t in off.topics for p in t.partitions] == [(4, 3)]
        tool = share_groups_tool(bs, "--describe", "--group", group)
        assert tool.returncode == 0 and tool.stdout.split()[-5:] == [group, topic_name, "0", "4", "3"], tool.stdout
        tool = share_groups_tool(bs, "--describe", "--group", group, "--members")
        assert tool.returncode == 0 and m.member_id in tool.stdout, tool.stdout
        tool = share_groups_tool(bs, "--describe", "--group", group, "--state")
        assert tool.returncode == 0 and "Stable" in tool.stdout, tool.stdout
        dg = conn.call(42, 2, groups_names=(group,))
        assert [r.error_code for r in dg.results] == [ErrorCode.non_empty_group]
        tool = share_groups_tool(bs, "--delete-offsets", "--group", group, "--topic", topic_name)
        assert tool.returncode == 1 and "NON_EMPTY_GROUP" in tool.stdout + tool.stderr, tool.stdout + tool.stderr
        s.close()
        m.leave(conn)
        tool = share_groups_tool(bs, "--delete-offsets", "--group", group, "--topic", topic_name)
        assert tool.returncode == 0 and "Successful" in tool.stdout, tool.stdout
        assert [p.start_offset for t in describe_offsets(bs, group).topics for p in t.partitions] == []
        tool = share_groups_tool(bs, "--delete", "--group", group)
        assert tool.returncode == 0 and "successful" in tool.stdout, tool.stdout
        assert group not in share_groups_tool(bs, "--list").stdout.split()
        d = conn.call(77, 1, group_ids=(group,), include_authorized_operations=False).groups[0]
        assert d.error_code == ErrorCode.group_id_not_found
        assert describe_offsets(bs, group).error_code == ErrorCode.group_id_not_found
    finally:
        conn.close()


# --- acknowledgement validation as Kafka's ------------------------------------------------


@pytest.fixture
def member_on_own_broker(broker: BrokerProcess, topic_name: str) -> Any:
    """As ``member_on_topic``, on a broker of the test's own (the shared one serves at most
    group.share.max.groups groups)."""
    from tests.integration.test_share_consumer import produce, set_group_configs

    bs = broker.bootstrap
    create_topic(bs, topic_name)
    group = f"g-{topic_name}"
    set_group_configs(bs, group, share_auto_offset_reset="earliest")
    produce(bs, topic_name, 10)
    conn, m, tid = joined(bs, group, topic_name)
    yield bs, conn, m, tid
    conn.close()


def test_acknowledgement_batches_are_validated_as_kafka_does(member_on_own_broker: Any) -> None:
    """Kafka's share-fetch request checks, then its share-partition leader's: batches out of
    order or overlapping, and ranges past the fetched records, are INVALID_REQUEST for the
    partition (nothing of it applied); offsets below the start offset are already archived
    and succeed."""
    from shoal.client.share import ShareSession

    bs, conn, m, tid = member_on_own_broker
    s = ShareSession(conn, m.group_id, m.member_id)
    assert len(s.fetch([(tid, 0)]).records) == 10
    key = (tid, 0)
    assert s.acknowledge({key: [(5, 6, 1), (0, 1, 1)]}) == {key: ErrorCode.invalid_request}  # descending
    assert s.acknowledge({key: [(0, 3, 1), (2, 4, 1)]}) == {key: ErrorCode.invalid_request}  # overlapping
    assert s.acknowledge({key: [(8, 12, 1)]}) == {key: ErrorCode.invalid_request}  # past what was fetched
    # None of it was applied: 0-4 are still the member's to accept, and are.
    assert s.acknowledge({key: [(0, 4, 1)]}) == {}
    assert [p.start_offset for t in describe_offsets(bs, m.group_id).topics for p in t.partitions] == [5]
    # Below the start offset: already archived, a success.
    assert s.acknowledge({key: [(1, 2, 1)]}) == {}
    # Straddling it: 5 and 6 are accepted.
    assert s.acknowledge({key: [(3, 6, 1)]}) == {}
    assert [p.start_offset for t in describe_offsets(bs, m.group_id).topics for p in t.partitions] == [7]
    s.close()


def test_a_departed_member_with_its_session_gets_its_acknowledgements_answered(member_on_own_broker: Any) -> None:
    """Kafka's share-partition leader checks the share session, not the group membership: a
    ShareFetch of a member no longer in the group has its acknowledgements applied and
    answered per partition (no UNKNOWN_MEMBER_ID that would make the client reset its
    session), and a new session for that member id is served as well; its next heartbeat
    tells it to join again."""
    from shoal.client.share import ShareSession

    bs, conn, m, tid = member_on_own_broker
    s = ShareSession(conn, m.group_id, m.member_id)
    assert len(s.fetch([(tid, 0)]).records) == 10
    m.leave(conn)
    assert members_of(bs, m.group_id) == 0
    r = s.fetch([(tid, 0)], acknowledgements={(tid, 0): [(0, 4, 1)]}, max_wait_ms=200)
    assert (r.acknowledge_errors, r.errors, r.records) == ({}, {}, [])
    assert [p.start_offset for t in describe_offsets(bs, m.group_id).topics for p in t.partitions] == [5]
    # Acknowledging what it does not hold fails for that partition only.
    r = s.fetch([(tid, 0)], acknowledgements={(tid, 0): [(5, 5, 1), (6, 6, 9)]}, max_wait_ms=0)
    assert r.acknowledge_errors == {(tid, 0): ErrorCode.invalid_request}
    s.close()
    # Closing the session released what it still held (5-9); a new session for the member
    # id the group no longer has is served, as Kafka serves it: those records come again.
    s = ShareSession(conn, m.group_id, m.member_id)
    r = s.fetch([(tid, 0)], max_wait_ms=2000)
    assert r.errors == {} and sorted((a.record.offset, a.delivery_count) for a in r.records) == [
        (o, 2) for o in range(5, 10)]
    s.close()


# --- smaller points: FindCoordinator's SHARE key type, authorized operations ---------------


def test_find_coordinator_share_key_type_only_from_v6(shared_broker: BrokerProcess) -> None:
    """Kafka answers key type SHARE (2) with INVALID_REQUEST below FindCoordinator v6."""
    from shoal.client.connection import Connection

    key = "g:AAAAAAAAAAAAAAAAAAAAAQ:0"
    with Connection.to(shared_broker.bootstrap) as conn:
        old = conn.call(10, 5, key_type=2, coordinator_keys=(key,)).coordinators[0]
        assert old.error_code == ErrorCode.invalid_request
        new = conn.call(10, 6, key_type=2, coordinator_keys=(key,)).coordinators[0]
        assert new.error_code == ErrorCode.none and new.node_id >= 0
        group = conn.call(10, 5, key_type=0, coordinator_keys=("g",)).coordinators[0]
        assert group.error_code == ErrorCode.none


def test_share_group_describe_fills_authorized_operations(member_on_own_broker: Any) -> None:
    """IncludeAuthorizedOperations: READ, DELETE, DESCRIBE, DESCRIBE_CONFIGS and ALTER_CONFIGS
    (AclOperation ids 3, 6, 8, 10, 11), as Kafka without an authorizer; otherwise Kafka's
    "not requested" value."""
    _bs, conn, m, _tid = member_on_own_broker
    with_ops = conn.call(77, 1, group_ids=(m.group_id, "missing"), include_authorized_operations=True).groups
    assert with_ops[0].authorized_operations == (1 << 3) | (1 << 6) | (1 << 8) | (1 << 10) | (1 << 11)
    assert with_ops[1].error_code == ErrorCode.group_id_not_found
    without = conn.call(77, 1, group_ids=(m.group_id,), include_authorized_operations=False).groups[0]
    assert without.authorized_operations == -2147483648


# --- group configs of Kafka 4.4: record locks per share-partition, renewals, assignment intervals --


def test_group_configs_for_record_locks_renewals_and_assignment_intervals(broker: BrokerProcess,
                                                                         topic_name: str) -> None:
    """share.partition.max.record.locks (within group.share.min/max.partition.max.record.locks)
    overrides the broker's in-flight limit for the group; share.renew.acknowledge.enable=false
    refuses RENEW with INVALID_RECORD_STATE for the partition (nothing of it applied), as
    Kafka 4.4; consumer/share.assignment.interval.ms are accepted (within their bounds) and
    described."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import ConfigResource, ResourceType

    from shoal.client.share import ShareSession
    from tests.integration.test_share_consumer import produce, set_group_configs

    bs = broker.bootstrap
    create_topic(bs, topic_name)
    group = f"g-{topic_name}"
    produce(bs, topic_name, 300)
    for name, bad in (("share_partition_max_record_locks", "99"), ("share_partition_max_record_locks", "4001"),
                      ("share_assignment_interval_ms", "15001"), ("consumer_assignment_interval_ms", "-1")):
        with pytest.raises(KafkaException) as e:
            set_group_configs(bs, group, **{name: bad})
        assert e.value.args[0].code() == ErrorCode.invalid_config, (name, bad)
    set_group_configs(bs, group, share_auto_offset_reset="earliest", share_partition_max_record_locks="100",
                      share_renew_acknowledge_enable="false", share_assignment_interval_ms="2000",
                      consumer_assignment_interval_ms="3000")
    res = ConfigResource(ResourceType.GROUP, group)
    admin = admin_client(bs)
    described = {k: v.value for k, v in admin.describe_configs([res])[res].result(timeout=10).items()}
    assert {k: described[k] for k in ("share.partition.max.record.locks", "share.renew.acknowledge.enable",
                                      "share.assignment.interval.ms", "consumer.assignment.interval.ms")} == {
        "share.partition.max.record.locks": "100", "share.renew.acknowledge.enable": "false",
        "share.assignment.interval.ms": "2000", "consumer.assignment.interval.ms": "3000"}

    conn, m, tid = joined(bs, group, topic_name)
    try:
        s = ShareSession(conn, m.group_id, m.member_id)
        r = s.fetch([(tid, 0)], max_records=500, max_wait_ms=2000)
        # The group's limit (100), not the broker's (2000): 100 of the 300 records in flight.
        assert sorted(a.record.offset for a in r.records) == list(range(100))
        key = (tid, 0)
        assert s.acknowledge({key: [(0, 9, 4)]}) == {key: ErrorCode.invalid_record_state}
        assert s.acknowledge({key: [(0, 99, 1)]}) == {}
        # Renewals enabled again: taken.
        set_group_configs(bs, group, share_renew_acknowledge_enable="true")
        r = s.fetch([(tid, 0)], max_records=500, max_wait_ms=2000)
        assert sorted(a.record.offset for a in r.records) == list(range(100, 200))
        assert s.acknowledge({key: [(100, 109, 4)]}) == {}
        s.close()
    finally:
        conn.close()
