"""A producer thread sending numbered records, and what the broker acknowledged of them.

    s = Sender(bootstrap, "t", partitions=3, prefix="all", **{"enable.idempotence": True}).start()
    s.wait_progress(100, "records acknowledged")
    s.stop()
    s.acked      # partition -> values acknowledged, in order
    s.failed     # delivery errors
"""

from __future__ import annotations

import threading

from confluent_kafka import KafkaError

from tests.support.clients import producer, wait_until

__all__ = ["Sender"]


class Sender:
    """Records ``<prefix>-<n>`` (``<n>`` without a prefix), n zero-padded, round-robin over the partitions."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, prefix: str = "", **conf: object) -> None:
        self.p = producer(bootstrap, **{"message.timeout.ms": 60_000, "linger.ms": 2, **conf})
        self.topic, self.partitions, self.prefix = topic, partitions, prefix
        self.acked: dict[int, list[bytes]] = {p: [] for p in range(partitions)}
        self.failed: list[KafkaError] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _report(self, err, msg) -> None:  # type: ignore[no-untyped-def]
        if err is not None:
            self.failed.append(err)
        else:
            self.acked[msg.partition()].append(msg.value())

    def _run(self) -> None:
        head = f"{self.prefix}-" if self.prefix else ""
        i = 0
        while not self._stop.is_set():
            try:
                self.p.produce(self.topic, f"{head}{i:08d}".encode(), partition=i % self.partitions,
                               on_delivery=self._report)
                i += 1
            except BufferError:
                pass
            self.p.poll(0.002)
        self.p.flush(60)

    def start(self) -> Sender:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(90)

    def acked_count(self) -> int:
        return sum(len(v) for v in self.acked.values())

    def wait_progress(self, n: int, what: str, timeout_s: float = 30) -> None:
        before = self.acked_count()
        wait_until(what, lambda: self.acked_count() >= before + n, timeout_s=timeout_s)
