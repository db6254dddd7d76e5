"""Apache Kafka's Java clients with transactions against shoal (tests/reference/java/TxnDriver.java).

* consume-transform-produce: a KafkaConsumer (read_committed, classic and KIP-848 groups)
  and a transactional KafkaProducer with sendOffsetsToTransaction and random aborts; a
  read_committed consumer of the output sees every input exactly once;
* a zombie producer with the same transactional.id is fenced: its send or commit fails,
  and nothing it wrote becomes visible.

shoal finalizes ``transaction.version`` 2, so the Java client uses KIP-890 part 2 (its
partitions added by the leaders through Produce v12, TxnOffsetCommit v5, EndTxn v5 that
bumps the producer epoch at every end): after the loop the coordinator's epoch for the
producer counts its transactions.
"""

from __future__ import annotations

import subprocess
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import KafkaException, TopicPartition
from kio.schema.describe_transactions.v0 import request as dtxn0

from tests.reference.conftest import SHOAL_OVERRIDES
from tests.support.broker import BrokerProcess
from tests.support.clients import consumer, wait_until
from tests.support.kafka_ref import run_tool
from tests.support.wire import RawConnection

pytestmark = [pytest.mark.integration, pytest.mark.timeout(400)]


def tagged_lines(stdout: str, tag: str) -> list[str]:
    """The driver's output lines that start with ``tag``, without it."""
    return [line[len(tag) + 1:] for line in stdout.splitlines() if line.startswith(tag + " ")]


def assert_every_input_once(out: str, err: str, n: int) -> dict[str, str]:
    """TxnDriver ctp's outcome: all ``n`` inputs done, some transactions aborted, and the
    read_committed output holds every input exactly once. Returns the driver's "I" facts."""
    info = dict(line.split(" ", 1) for line in tagged_lines(out, "I"))
    assert int(info["done"]) == n and int(info["aborts"]) > 0, out[-2000:]
    assert Counter(tagged_lines(out, "R")) == Counter(f"out-{i}" for i in range(n)), err[-3000:]
    return info


def committed_offsets(bootstrap: str, group: str, topic: str) -> int:
    """The sum of ``group``'s committed offsets on partitions 0 and 1 of ``topic`` (0 if unknown)."""
    try:
        c = consumer(bootstrap, **{"group.id": group})
        try:
            return sum(max(tp.offset, 0) for tp in c.committed([TopicPartition(topic, p) for p in (0, 1)], timeout=5))
        finally:
            c.close()
    except KafkaException:
        return 0


def ctp_through_a_kill(java: Any, bootstrap: str, src: str, dst: str, n: int, kill_after: int,
                       kill: Callable[[], None], *, timeout_s: float = 400, interval_s: float = 0.5) -> None:
    """TxnDriver's consume-transform-produce over ``n`` inputs (classic group); once its group
    committed more than ``kill_after`` input offsets, ``kill()`` while the loop still runs; then
    every input must be in the read_committed output exactly once."""
    prog = java("TxnDriver")
    with subprocess.Popen(prog.command("ctp", bootstrap, src, dst, str(n), "classic"), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True) as proc:
        try:
            wait_until("committed transactions", lambda: committed_offsets(bootstrap, "java-ctp-classic", src) > kill_after,
                       timeout_s=120, interval_s=interval_s)
            assert proc.poll() is None, "the loop ended before the kill"
            kill()
            out, err = proc.communicate(timeout=timeout_s)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == 0, err[-3000:]
    assert_every_input_once(out, err, n)


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_consume_transform_produce_exactly_once(shoal, java, protocol: str) -> None:
    src, dst, n = f"jtx-in-{protocol}", f"jtx-out-{protocol}", 1000
    for t in (src, dst):
        run_tool("kafka-topics", "--bootstrap-server", shoal.bootstrap, "--create", "--topic", t, "--partitions", "2")
    proc = java("TxnDriver").run("ctp", shoal.bootstrap, src, dst, str(n), protocol)
    info = assert_every_input_once(proc.stdout, proc.stderr, n)
    # transaction version 2: one epoch bump per transaction (commits and aborts), none with version 1
    with RawConnection(shoal.bootstrap) as conn:
        st = conn.request(dtxn0.DescribeTransactionsRequest(transactional_ids=(f"java-ctp-{protocol}",)))
    state = st.transaction_states[0]
    assert state.error_code == 0 and state.producer_epoch > int(info["aborts"]), state


def test_a_zombie_java_producer_is_fenced(shoal, java) -> None:
    dst = "jtx-zombie"
    run_tool("kafka-topics", "--bootstrap-server", shoal.bootstrap, "--create", "--topic", dst)
    proc = java("TxnDriver").run("zombie", shoal.bootstrap, "-", dst, "0")
    errors = tagged_lines(proc.stdout, "E")
    assert len(errors) == 1 and errors[0].split()[1] in ("ProducerFencedException", "InvalidProducerEpochException"), \
        proc.stdout
    assert tagged_lines(proc.stdout, "R") == ["fresh"]


def test_kafka_features_describes_transaction_version_2(shoal) -> None:
    """Kafka's kafka-features tool reads the feature from ApiVersions as the clients do."""
    out = run_tool("org.apache.kafka.tools.FeatureCommand", "--bootstrap-server", shoal.bootstrap, "describe").stdout
    fields = [line.split() for line in out.splitlines() if "transaction.version" in line]
    assert len(fields) == 1 and fields[0][fields[0].index("FinalizedVersionLevel:") + 1] == "2", out
    assert fields[0][fields[0].index("SupportedMaxVersion:") + 1] == "2", out


def test_java_exactly_once_through_a_broker_kill(tmp_path, java) -> None:
    """The Java consume-transform-produce loop over 100,000 records with random aborts while
    its only broker is killed with SIGKILL and started again on the same data: the producer
    and the consumer reconnect, and the output read with read_committed holds every input
    exactly once."""
    src, dst = "jkill-in", "jkill-out"
    with BrokerProcess(tmp_path / "broker", SHOAL_OVERRIDES) as b:
        for t in (src, dst):
            run_tool("kafka-topics", "--bootstrap-server", b.bootstrap, "--create", "--topic", t, "--partitions", "2")
        # kill -9, then the broker starts again on the same data dir and port
        ctp_through_a_kill(java, b.bootstrap, src, dst, 100_000, 20_000, lambda: b.restart(crash=True),
                           timeout_s=300, interval_s=0.2)
