"""Share groups survive kill -9 of the broker: nothing confirmed is redelivered, nothing is lost.

Several ShareConsumers (explicit acknowledgement) work through a topic while the broker
is killed with SIGKILL at random moments and restarted on the same port. Each consumer
records, per delivery, the offset and delivery count it saw, and per commit_sync the
offsets the broker confirmed. Afterwards:

* every record was accepted: the share-partition start offset reached the log end;
* no offset whose acceptance was confirmed was delivered again after the confirmation;
* per offset, delivery counts never went down.
"""

from __future__ import annotations

import random
import threading
import time
from typing import Any

import pytest
from confluent_kafka import AcknowledgeType

from tests.integration.test_share_consumer import consume_until, produce, set_group_configs, share_consumer
from tests.support.broker import BrokerProcess
from tests.support.clients import create_topic

pytestmark = pytest.mark.integration

TOTAL = 600
CONSUMERS = 4
KILLS = 3


def _describe_start_offset(bootstrap: str, group: str, topic: str) -> int:
    from shoal.client.connection import Connection
    from shoal.protocol.entities import make, sub
    from kio.schema.describe_share_group_offsets.v1.request import DescribeShareGroupOffsetsRequest as Req

    with Connection.to(bootstrap) as conn:
        req = make(Req, groups=(make(sub(Req, "DescribeShareGroupOffsetsRequestGroup"), group_id=group, topics=(
            make(sub(Req, "DescribeShareGroupOffsetsRequestTopic"), topic_name=topic, partitions=(0,)),)),))
        resp = conn.send(req)
        return int(resp.groups[0].topics[0].partitions[0].start_offset)


def test_kill_9_during_share_consumption(start_broker: Any, topic_name: str) -> None:
    b: BrokerProcess = start_broker()
    bs = b.bootstrap
    create_topic(bs, topic_name)
    set_group_configs(bs, "g", share_auto_offset_reset="earliest", share_delivery_count_limit="10")
    produce(bs, topic_name, TOTAL, **{"batch.num.messages": 10, "linger.ms": 0})

    lock = threading.Lock()
    clock = [0]
    deliveries: list[tuple[int, int, int, int]] = []  # (seq, offset, delivery_count, consumer)
    confirmed: dict[int, int] = {}  # offset -> seq of the confirmation
    stop = threading.Event()
    rng = random.Random(932)

    def tick() -> int:
        clock[0] += 1
        return clock[0]

    def run(i: int) -> None:
        c = share_consumer(bs, "g", topic_name, **{"share.acknowledgement.mode": "explicit",
                                                     "max.poll.records": 25})

        def handle(msgs: list[Any]) -> None:
            with lock:
                for m in msgs:
                    deliveries.append((tick(), m.offset(), m.delivery_count(), i))
            accepted = []
            for m in msgs:
                time.sleep(0.001)
                if rng.random() < 0.05:
                    c.acknowledge(m, AcknowledgeType.RELEASE)
                else:
                    c.acknowledge(m, AcknowledgeType.ACCEPT)
                    accepted.append(m.offset())
            try:
                result = c.commit_sync(10)
            except Exception:
                return
            ok = all(err is None and tp.error is None for tp, err in (result or {}).items()) and bool(result)
            if ok:
                with lock:
                    seq = tick()
                    for o in accepted:
                        confirmed.setdefault(o, seq)

        consume_until(c, stop, handle)

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(CONSUMERS)]
    for t in threads:
        t.start()
    for _ in range(KILLS):
        time.sleep(rng.uniform(0.5, 2.0))
        b.kill()
        time.sleep(rng.uniform(0.0, 0.5))
        b.start()
    deadline = time.monotonic() + 60
    spso = -1
    while time.monotonic() < deadline:
        spso = _describe_start_offset(bs, "g", topic_name)
        if spso >= TOTAL:
            break
        time.sleep(0.5)
    stop.set()
    for t in threads:
        t.join(30)

    assert spso == TOTAL, f"share-partition start offset {spso}, {len(confirmed)} confirmed"
    assert {o for _s, o, _c, _i in deliveries} == set(range(TOTAL))
    late = [(o, c, i) for s, o, c, i in deliveries if o in confirmed and s > confirmed[o]]
    assert not late, f"confirmed records delivered again: {late[:10]}"
    last_count: dict[int, int] = {}
    for _s, o, c, _i in sorted(deliveries):
        assert c >= last_count.get(o, 0), f"delivery count of {o} went down to {c}"
        last_count[o] = c
    assert len(confirmed) > TOTAL // 2
