"""Connections that send large Fetch requests and do not read the answers cost the broker
little memory: a connection serves no further request while its answers wait to be sent,
and an unsent answer waits as unread file slices. Read later, every answer arrives whole
and in order; another client is served meanwhile."""

from __future__ import annotations

import datetime
import socket
import struct
import time
from pathlib import Path

import pytest
from confluent_kafka import TopicPartition
from kio.index import load_response_schema
from kio.schema.errors import ErrorCode
from kio.schema.fetch.v12 import request as fetch12
from kio.serial import entity_reader

from tests.support.clients import consume_exact, consumer, create_topic, produce_all, producer
from tests.support.wire import RawConnection, request_bytes

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

MIB = 1 << 20
DATA_MIB = 16
READERS = 3
REQUESTS = 12


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def _fetch(topic: str, correlation_id: int) -> bytes:
    part = fetch12.FetchPartition(partition=0, current_leader_epoch=-1, fetch_offset=0, last_fetched_epoch=-1,
                                  log_start_offset=-1, partition_max_bytes=DATA_MIB * MIB)
    req = fetch12.FetchRequest(replica_id=-1, max_wait=datetime.timedelta(0), min_bytes=1, max_bytes=DATA_MIB * MIB,
                               isolation_level=0, session_id=0, session_epoch=-1,
                               topics=(fetch12.FetchTopic(topic=topic, partitions=(part,)),),
                               forgotten_topics_data=(), rack_id="")
    return request_bytes(req, correlation_id)


read_response = entity_reader(load_response_schema(1, 12))


def _read_frame(sock) -> bytes:
    def exact(n: int) -> bytes:
        buf = bytearray(n)
        view = memoryview(buf)
        got = 0
        while got < n:
            k = sock.recv_into(view[got:])
            assert k, "connection closed by the broker"
            got += k
        return bytes(buf)

    (size,) = struct.unpack(">i", exact(4))
    return exact(size)


def test_unread_fetch_answers_do_not_pile_up_in_memory(start_broker, topic_name):
    # few requests in flight, so that a connection is muted with requests already read
    broker = start_broker(queued_max_requests="4")
    bs = broker.bootstrap
    create_topic(bs, topic_name, 1)
    value = b"x" * 900_000
    produce_all(producer(bs, **{"linger.ms": 5}),
                topic_name, [{"value": value, "partition": 0} for _ in range(DATA_MIB * MIB // len(value) + 1)])
    before = _rss_mib(broker.pid)

    conns = [RawConnection(bs) for _ in range(READERS)]
    try:
        for c in conns:  # at once (the broker reads them together); none of the answers is read
            c.send(b"".join(_fetch(topic_name, i) for i in range(REQUESTS)))
        conns[1].sock.shutdown(socket.SHUT_WR)  # one says it sends nothing more: still answered
        peak = before
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            peak = max(peak, _rss_mib(broker.pid))
            time.sleep(0.05)
        # another client is served meanwhile
        other = f"{topic_name}-other"
        create_topic(bs, other, 1)
        produce_all(producer(bs), other, [{"value": b"hello", "partition": 0}])
        cons = consumer(bs)
        try:
            cons.assign([TopicPartition(other, 0, 0)])
            assert [r.value for r in consume_exact(cons, 1)] == [b"hello"]
        finally:
            cons.close()
        peak = max(peak, _rss_mib(broker.pid))
        # unanswered, the requests would hold READERS x REQUESTS x DATA_MIB = 576 MiB of answers
        assert peak - before < 150, f"broker grew from {before:.0f} MiB to {peak:.0f} MiB"

        # read late, every answer arrives whole and in order (then the end, after a shutdown)
        for c in conns[:2]:
            _read_all(c.sock)
        assert conns[1].sock.recv(1) == b""
        assert "Traceback" not in broker.stderr_tail(400)
    finally:
        for c in conns:
            c.close()
    broker.assert_alive()


def _read_all(sock) -> None:
    sock.settimeout(30)
    for i in range(REQUESTS):
        frame = _read_frame(sock)
        (correlation_id,) = struct.unpack_from(">i", frame, 0)
        assert correlation_id == i
        response, used = read_response(frame, 5)  # correlation id, no tagged header fields
        assert used == len(frame) - 5
        (p,) = response.responses[0].partitions
        assert p.error_code == ErrorCode.none and len(p.records) > DATA_MIB * MIB * 0.9
