"""Start and stop: readiness, prompt clean shutdown with clients attached, port reuse."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import TopicPartition

from tests.support.broker import BrokerProcess
from tests.support.clients import consumer, create_topic, produce_all, producer, records_of

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def test_sigterm_with_a_parked_long_poll_exits_promptly(start_broker, topic_name):
    b = start_broker()
    create_topic(b.bootstrap, topic_name, 1)
    c = consumer(b.bootstrap, **{"fetch.wait.max.ms": 8000, "socket.timeout.ms": 20_000})
    try:
        c.assign([TopicPartition(topic_name, 0, 0)])
        assert c.consume(1, timeout=1.5) == []  # a fetch is now parked on the broker
        t0 = time.monotonic()
        assert b.stop() == 0
        # Parked fetches are answered at once, not after their 8 s max wait.
        assert time.monotonic() - t0 < 4
    finally:
        c.close()


def test_sigterm_during_produce_exits_cleanly_and_keeps_acknowledged_records(start_broker, topic_name):
    b = start_broker()
    bs = b.bootstrap
    create_topic(bs, topic_name, 1)
    p = producer(bs, **{"linger.ms": 1, "message.timeout.ms": 3000, "retries": 0})
    acked: dict[int, bytes] = {}

    def on_delivery(err, msg):
        if err is None:
            acked[msg.offset()] = msg.value()

    for i in range(2000):
        p.produce(topic_name, value=b"%05d" % i, on_delivery=on_delivery)
        if i == 1000:
            p.poll(0.2)
            assert b.stop() == 0
    p.flush(10)
    assert len(acked) >= 1
    b.start()
    got = records_of(bs, topic_name, [0], len(acked))
    stored = {r.offset: r.value for r in got}
    for offset, value in acked.items():
        assert stored[offset] == value


def test_restart_reuses_the_port_and_serves_again(tmp_path):
    b = BrokerProcess(tmp_path / "data")
    with b:
        port = b.port
        create_topic(b.bootstrap, "t", 1)
        produce_all(producer(b.bootstrap), "t", [{"value": b"one"}])
        b.restart()
        assert b.port == port
        produce_all(producer(b.bootstrap), "t", [{"value": b"two"}])
        assert [r.value for r in records_of(b.bootstrap, "t", [0], 2)] == [b"one", b"two"]
    assert not b.is_alive()


def test_bad_config_is_refused_at_start(tmp_path):
    b = BrokerProcess(tmp_path / "data", {"log.segment.bytes": "tiny"})
    with pytest.raises(Exception, match="did not report readiness"):
        b.start()
    assert "log.segment.bytes" in b.stderr_tail()
