"""A real shoal cluster for tests: one etcd and N ``shoal serve`` processes.

Usage::

    with LocalCluster(tmp_path, brokers=3, overrides={"min.insync.replicas": "2"}) as c:
        c.bootstrap                 # "127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3"
        c.brokers[0].kill()         # a BrokerProcess each (node.id = index + 1)
        c.broker_for(node_id)

Timeouts are short (``broker.session.timeout.ms=2000``, ``replica.lag.time.max.ms=3000``)
so failover happens within seconds. Every process is stopped (etcd by pid) and etcd's
data directory removed on exit, also when the test fails.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from tests.support.broker import BrokerProcess
from tests.support.clients import admin_client
from tests.support.etcd import EtcdProcess

__all__ = ["LocalCluster", "TEST_OVERRIDES", "partition_states"]

TEST_OVERRIDES = {
    "broker.session.timeout.ms": "2000",
    "replica.lag.time.max.ms": "3000",
    "replica.fetch.backoff.ms": "200",
    "shutdown.timeout.ms": "5000",
}


class LocalCluster:
    def __init__(self, root: Path, brokers: int = 3, overrides: Mapping[str, str] | None = None) -> None:
        self.root = Path(root)
        self.etcd = EtcdProcess(self.root / "etcd")
        self.count = brokers
        self.overrides = dict(TEST_OVERRIDES)
        self.overrides.update(overrides or {})
        self.brokers: list[BrokerProcess] = []

    @property
    def bootstrap(self) -> str:
        return ",".join(b.bootstrap for b in self.brokers if b.is_alive())

    def broker_for(self, node_id: int) -> BrokerProcess:
        return self.brokers[node_id - 1]

    def start(self) -> "LocalCluster":
        self.etcd.start()
        try:
            for i in range(self.count):
                settings = dict(self.overrides, **{"metadata.store": self.etcd.url, "node.id": str(i + 1)})
                b = BrokerProcess(self.root / f"broker{i + 1}", settings)
                self.brokers.append(b)
                b.start()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        try:
            for b in self.brokers:
                try:
                    b.stop(check=False)
                except Exception:
                    b.kill()
        finally:
            self.etcd.stop()

    def stderr_tails(self, lines: int = 60) -> str:
        return "\n".join(f"--- broker {i + 1} ---\n{b.stderr_tail(lines)}" for i, b in enumerate(self.brokers))

    def __enter__(self) -> "LocalCluster":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def partition_states(bootstrap: str, topic: str) -> dict[int, tuple[int, list[int], list[int]]]:
    """partition -> (leader, replicas, ISR) from a Metadata request; {} while the topic is unknown."""
    md = admin_client(bootstrap).list_topics(topic, timeout=5)
    t = md.topics.get(topic)
    if t is None or t.error is not None:
        return {}
    return {p.id: (p.leader, list(p.replicas), list(p.isrs)) for p in t.partitions.values()}
