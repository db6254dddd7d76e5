"""Dead-letter records of a share-partition (KIP-1191), judged on the KIP-932 model.

Runs the rule-based model of tests/property/test_share_partition_model.py and also
checks what the committed writes list in ``dead_letters``:

* an offset is listed by at most one committed write, over the whole run (restarts
  included): a record is dead-lettered at most once;
* only offsets that hold a record are listed (never a gap);
* a record that a lock expiry, a member's release, a rolled-back write or an acquire
  archived at the delivery limit is listed by the first write that commits after it.
"""

from __future__ import annotations

from collections import Counter

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import invariant, precondition, rule

from shoal.share.dlq import ArchiveCause
from tests.property.test_share_partition_model import ARCHIVED, AVAILABLE, LIMIT, MEMBERS, SharePartitionModel


class DeadLetterModel(SharePartitionModel):
    def __init__(self) -> None:
        super().__init__()
        self.ever_records: set[int] = set()
        self.dead: Counter[int] = Counter()
        self.owed: set[int] = set()
        """Offsets archived at the limit outside acknowledgements, not yet in a committed write."""
        self.owed_at_take: set[int] = set()

    # Overrides of rules repeat the rule (hypothesis keeps the decorated function).
    @rule(n=st.integers(1, 8), gap=st.sampled_from([0, 0, 0, 1, 3]))
    def produce(self, n: int, gap: int) -> None:
        super().produce(n, gap)
        a, b = self.log[-1]
        self.ever_records.update(range(a, b + 1))

    def _release(self, o: int) -> None:
        super()._release(o)
        if self.recs[o].state == ARCHIVED:
            self.owed.add(o)

    @rule(member=st.sampled_from(MEMBERS), max_records=st.integers(1, 12), optimized=st.booleans(),
          batch_size=st.sampled_from([None, None, 1, 4, 10]))
    def acquire(self, member: str, max_records: int, optimized: bool, batch_size: int | None) -> None:
        at_limit = {o for o, r in self.recs.items()
                    if r.state == AVAILABLE and r.pending is None and r.count >= LIMIT and self._is_record(o)}
        super().acquire(member, max_records, optimized, batch_size)
        for o in at_limit:
            r = self.recs.get(o)
            if r is None or r.state == ARCHIVED:
                self.owed.add(o)

    @rule()
    def take_write(self) -> None:
        had = self.outstanding
        super().take_write()
        if self.outstanding is not None and self.outstanding is not had:
            self.owed_at_take = set(self.owed)

    @precondition(lambda self: self.outstanding is not None)
    @rule(ok=st.booleans())
    def finish_write(self, ok: bool) -> None:
        assert self.outstanding is not None
        write = self.outstanding[0]
        super().finish_write(ok)
        if not ok:
            return
        listed = [o for d in write.dead_letters for o in range(d.first_offset, d.last_offset + 1)]
        for d in write.dead_letters:
            assert d.delivery_count >= 1
            if d.cause is ArchiveCause.DELIVERY_COUNT_EXCEEDED:
                assert d.delivery_count >= LIMIT, d
        for o in listed:
            assert o in self.ever_records, f"gap {o} dead-lettered"
            self.dead[o] += 1
            assert self.dead[o] == 1, f"offset {o} dead-lettered twice"
        missing = self.owed_at_take - self.dead.keys()
        assert not missing, f"archived at the limit but never dead-lettered: {sorted(missing)}"
        self.owed -= self.owed_at_take
        self.owed_at_take = set()

    @rule()
    def restart(self) -> None:
        super().restart()
        # Archives that no committed write carried are lost with memory; the records are
        # whatever was persisted (available again), so they may be archived once more.
        self.owed = set()
        self.owed_at_take = set()

    @invariant()
    def dead_lettered_once(self) -> None:
        assert all(n == 1 for n in self.dead.values())

DeadLetterModel.TestCase.settings = settings(
    max_examples=200, stateful_step_count=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
TestDeadLetterModel = DeadLetterModel.TestCase
