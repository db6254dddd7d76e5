"""combine_state_batches against a per-offset reference: the overlay's batches, in order,
replace what they cover; offsets below the start go; equal neighbours merge."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from shoal.share.coordinator import UNINITIALIZED_START_OFFSET, StateBatch, combine_state_batches

batch = st.builds(lambda first, length, state, count: StateBatch(first, first + length, state, count),
                  st.integers(0, 60), st.integers(0, 8), st.sampled_from([0, 2, 4]), st.integers(0, 3))


def _canonical(per_offset: dict[int, tuple[int, int]]) -> tuple[StateBatch, ...]:
    out: list[StateBatch] = []
    for o in sorted(per_offset):
        state, count = per_offset[o]
        if out and out[-1].last_offset + 1 == o and (out[-1].delivery_state, out[-1].delivery_count) == (state, count):
            out[-1] = StateBatch(out[-1].first_offset, o, state, count)
        else:
            out.append(StateBatch(o, o, state, count))
    return tuple(out)


def _reference(current: list[StateBatch], new: list[StateBatch], start: int) -> tuple[StateBatch, ...]:
    per_offset: dict[int, tuple[int, int]] = {}
    for b in (*current, *new):
        for o in range(b.first_offset, b.last_offset + 1):
            per_offset[o] = (b.delivery_state, b.delivery_count)
    if start != UNINITIALIZED_START_OFFSET:
        per_offset = {o: v for o, v in per_offset.items() if o >= start}
    return _canonical(per_offset)


def _disjoint(batches: list[StateBatch]) -> list[StateBatch]:
    out: list[StateBatch] = []
    for b in sorted(batches, key=lambda x: x.first_offset):
        if not out or b.first_offset > out[-1].last_offset:
            out.append(b)
    return out


@settings(max_examples=400, deadline=None)
@given(current=st.lists(batch, max_size=8), new=st.lists(batch, max_size=8), sorted_new=st.booleans(),
       start=st.sampled_from([UNINITIALIZED_START_OFFSET, 0, 5, 20, 40]))
def test_combine_matches_the_per_offset_reference(current: list[StateBatch], new: list[StateBatch],
                                                  sorted_new: bool, start: int) -> None:
    current = list(combine_state_batches((), _disjoint(current), UNINITIALIZED_START_OFFSET))
    if sorted_new:  # what a share-partition writes: the fast path
        new = _disjoint(new)
    got = combine_state_batches(current, new, start)
    assert got == _reference(current, new, start)
