"""Replay KIP-932's worked example (share_partition_worked_example.json, next to this file)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shoal.share.partition import SharePartition
from shoal.share.state import AcknowledgeType, AcquireMode, RecordState

VECTOR = Path(__file__).with_name("share_partition_worked_example.json")
LOCK_MS = 30_000
STEP_MS = 1_000


def _load() -> dict:
    return json.loads(VECTOR.read_text())


def _ack(sp: SharePartition, member: str, first: int, last: int, kind: str, now_ms: int):
    update = sp.acknowledge(member, [(first, last, [AcknowledgeType[kind]])], now_ms)
    write = sp.take_write()
    assert write is not None and update in write.updates
    sp.commit(write)
    assert update.done
    return write


@pytest.mark.parametrize("one_batch_per_produce", [True, False])
def test_worked_example(one_batch_per_produce: bool) -> None:
    """With one log batch per produce, record-limit mode splits it as the example needs;
    with one batch per record, batch-optimized mode gives the same result."""
    vector = _load()
    log_end = vector["log_end_offset_at_start"]
    sp = SharePartition("G1", "topic", 0, vector["initial"]["spso"], record_lock_duration_ms=LOCK_MS)
    log: list[tuple[int, int]] = []
    mode = AcquireMode.RECORD_LIMIT if one_batch_per_produce else AcquireMode.BATCH_OPTIMIZED
    now = 0
    acquired_at: dict[int, int] = {}
    step_ms = STEP_MS
    for step in vector["steps"]:
        now += step_ms
        op = step["op"]
        if op == "produce":
            count = step["count"]
            if one_batch_per_produce:
                log.append((log_end, log_end + count - 1))
            else:
                log.extend((o, o) for o in range(log_end, log_end + count))
            log_end += count
        elif op == "acquire":
            start = sp.next_fetch_offset()
            assert start is not None
            fetched = [b for b in log if b[1] >= start]
            got = sp.acquire(step["member"], fetched, now, step["max_records"], acquire_mode=mode)
            assert [list(r) for r in got] == step["expect_acquired"]
            for r in got:
                for o in range(r.first_offset, r.last_offset + 1):
                    acquired_at[o] = now
        elif op == "acknowledge":
            _ack(sp, step["member"], step["first"], step["last"], step["type"], now)
        elif op == "lock_timeout":
            # Jump to the deadline of the named records; no other lock may lapse.
            deadline = acquired_at[step["first"]] + LOCK_MS
            assert sp.next_deadline_ms() == deadline
            now = deadline
            step_ms = 0  # every other lock stays held until the end
            released = sp.expire(now)
            assert released == [(step["first"], step["last"])]
            write = sp.take_write()
            assert write is not None
            # A full snapshot: the released records are persisted AVAILABLE with count 1
            # (merged with the still-acquired ones, which persist the same way).
            for o in range(step["first"], step["last"] + 1):
                assert any(b.first_offset <= o <= b.last_offset and b.delivery_state == RecordState.AVAILABLE
                           and b.delivery_count == 1 for b in write.state_batches)
            sp.commit(write)
        else:  # pragma: no cover
            raise AssertionError(op)
        if "after" in step:
            after = step["after"]
            assert sp.start_offset == after["spso"], step
            assert sp.end_offset == after["speo"], step
            got_records = [[f, l, s.name, c] for f, l, s, c in sp.describe()]
            assert got_records == after["records"], step


def test_worked_example_last_write_moves_spso_to_120() -> None:
    vector = _load()
    sp = SharePartition("G1", "topic", 0, 100)
    sp.acquire("c1", [(100, 109)], 0, 10)
    write = _ack(sp, "c1", 100, 109, "ACCEPT", 1)
    assert write.start_offset == 110 and write.state_batches == ()
    assert vector["steps"][2]["after"]["spso"] == 110
