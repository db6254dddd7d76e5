"""kcat (librdkafka 2.0.2 in Debian's build) as a client: produce, consume, metadata.

kcat is required: without it on PATH these tests fail, unless SHOAL_SKIP_KCAT=1 is set
(for machines where it cannot be installed; CI installs it, see scripts/test.sh).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from tests.support.clients import create_topic, produce_all, producer, records_of

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

KCAT = shutil.which("kcat") or shutil.which("kafkacat")


@pytest.fixture
def kcat():
    if KCAT is None:
        if os.environ.get("SHOAL_SKIP_KCAT") == "1":
            pytest.skip("kcat not installed and SHOAL_SKIP_KCAT=1")
        pytest.fail("kcat is not on PATH: install it (apt-get install kcat) or set SHOAL_SKIP_KCAT=1")

    def run(*args: str, input: bytes | None = None, timeout: float = 30) -> bytes:
        proc = subprocess.run([KCAT, *args], input=input, capture_output=True, timeout=timeout)
        assert proc.returncode == 0, f"kcat {' '.join(args)} exited {proc.returncode}: {proc.stderr.decode()[-2000:]}"
        return proc.stdout

    return run


def test_kcat_metadata(shared_broker, topic_name, kcat):
    create_topic(shared_broker.bootstrap, topic_name, 3)
    md = json.loads(kcat("-b", shared_broker.bootstrap, "-L", "-J", "-t", topic_name))
    assert [b["id"] for b in md["brokers"]] == [0]
    assert md["brokers"][0]["name"] == f"127.0.0.1:{shared_broker.port}"
    (t,) = md["topics"]
    assert t["topic"] == topic_name
    assert sorted(p["partition"] for p in t["partitions"]) == [0, 1, 2]
    assert all(p["leader"] == 0 for p in t["partitions"])
    text = kcat("-b", shared_broker.bootstrap, "-L").decode()
    assert topic_name in text and "3 partitions" in text


def test_kcat_produce_then_consume(shared_broker, topic_name, kcat):
    bs = shared_broker.bootstrap
    create_topic(bs, topic_name, 2)
    lines = [f"key{i}:value {i}" for i in range(200)]
    kcat("-b", bs, "-P", "-t", topic_name, "-K:", "-p", "1", input="\n".join(lines).encode() + b"\n")
    # confluent-kafka reads what kcat wrote.
    got = records_of(bs, topic_name, [1], 200)
    assert [(r.offset, r.key, r.value) for r in got] == [(i, b"key%d" % i, b"value %d" % i) for i in range(200)]
    # kcat reads it back, exits at the end (-e).
    out = kcat("-b", bs, "-C", "-t", topic_name, "-p", "1", "-o", "beginning", "-e", "-f", "%o|%k|%s\n")
    assert out.decode().splitlines() == [f"{i}|key{i}|value {i}" for i in range(200)]


def test_kcat_consumes_headers_and_offsets_from_confluent_kafka(shared_broker, topic_name, kcat):
    bs = shared_broker.bootstrap
    create_topic(bs, topic_name, 1)
    produce_all(producer(bs), topic_name, [
        {"key": b"k%d" % i, "value": b"v%d" % i, "headers": [("h", b"%d" % i)]} for i in range(50)])
    out = kcat("-b", bs, "-C", "-t", topic_name, "-o", "40", "-e", "-f", "%o %k %s %h\n")
    assert out.decode().splitlines() == [f"{i} k{i} v{i} h={i}" for i in range(40, 50)]
    # Compressed produce from kcat.
    kcat("-b", bs, "-P", "-t", topic_name, "-z", "lz4", input=b"".join(b"z%d\n" % i for i in range(30)))
    out = kcat("-b", bs, "-C", "-t", topic_name, "-o", "50", "-e", "-f", "%o %s\n")
    assert out.decode().splitlines() == [f"{50 + i} z{i}" for i in range(30)]
