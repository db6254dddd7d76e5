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

from collections import Counter

import pytest
from kio.schema.describe_transactions.v0 import request as dtxn0

from tests.support.kafka_ref import run_tool
from tests.support.wire import RawConnection

pytestmark = [pytest.mark.integration, pytest.mark.timeout(400)]


def _lines(stdout: str, tag: str) -> list[str]:
    return [line[len(tag) + 1:] for line in stdout.splitlines() if line.startswith(tag + " ")]


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_consume_transform_produce_exactly_once(shoal, java, protocol: str) -> None:
    src, dst, n = f"jtx-in-{protocol}", f"jtx-out-{protocol}", 1000
    for t in (src, dst):
        run_tool("kafka-topics", "--bootstrap-server", shoal.bootstrap, "--create", "--topic", t, "--partitions", "2")
    proc = java("TxnDriver").run("ctp", shoal.bootstrap, src, dst, str(n), protocol)
    info = dict(line.split(" ", 1) for line in _lines(proc.stdout, "I"))
    assert int(info["done"]) == n and int(info["aborts"]) > 0, proc.stdout[-2000:]
    got = Counter(_lines(proc.stdout, "R"))
    assert got == Counter(f"out-{i}" for i in range(n)), proc.stderr[-3000:]
    # transaction version 2: one epoch bump per transaction (commits and aborts), none with version 1
    with RawConnection(shoal.bootstrap) as conn:
        st = conn.request(dtxn0.DescribeTransactionsRequest(transactional_ids=(f"java-ctp-{protocol}",)))
    state = st.transaction_states[0]
    assert state.error_code == 0 and state.producer_epoch > int(info["aborts"]), state


def test_a_zombie_java_producer_is_fenced(shoal, java) -> None:
    dst = "jtx-zombie"
    run_tool("kafka-topics", "--bootstrap-server", shoal.bootstrap, "--create", "--topic", dst)
    proc = java("TxnDriver").run("zombie", shoal.bootstrap, "-", dst, "0")
    errors = _lines(proc.stdout, "E")
    assert len(errors) == 1 and errors[0].split()[1] in ("ProducerFencedException", "InvalidProducerEpochException"), \
        proc.stdout
    assert _lines(proc.stdout, "R") == ["fresh"]


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
    import subprocess

    from tests.reference.conftest import SHOAL_OVERRIDES
    from tests.reference.test_java_cluster import _committed
    from tests.support.broker import BrokerProcess
    from tests.support.clients import wait_until

    src, dst, n = "jkill-in", "jkill-out", 100_000
    with BrokerProcess(tmp_path / "broker", SHOAL_OVERRIDES) as b:
        for t in (src, dst):
            run_tool("kafka-topics", "--bootstrap-server", b.bootstrap, "--create", "--topic", t, "--partitions", "2")
        prog = java("TxnDriver")
        with subprocess.Popen(prog.command("ctp", b.bootstrap, src, dst, str(n), "classic"), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) as proc:
            try:
                wait_until("committed transactions", lambda: _committed(b.bootstrap, "java-ctp-classic", src) > 20_000,
                           timeout_s=120, interval_s=0.2)
                assert proc.poll() is None, "the loop ended before the kill"
                b.restart(crash=True)  # kill -9, then the broker starts again on the same data dir and port
                out, err = proc.communicate(timeout=300)
            finally:
                if proc.poll() is None:
                    proc.kill()
    assert proc.returncode == 0, err[-3000:]
    info = dict(line.split(" ", 1) for line in _lines(out, "I"))
    assert int(info["done"]) == n and int(info["aborts"]) > 0, out[-2000:]
    got = Counter(_lines(out, "R"))
    assert got == Counter(f"out-{i}" for i in range(n)), err[-3000:]
