"""``shoal serve`` fixes glibc's malloc thresholds unless the environment sets them, and
freezes its startup heap out of the garbage collector's reach."""

from __future__ import annotations

import os

import pytest

from shoal.cli import serve


def test_the_environment_s_malloc_tunables_win():
    for name in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "GLIBC_TUNABLES"):
        assert serve.tune_malloc({name: "131072"}) is False


@pytest.mark.skipif(not hasattr(os, "confstr") or not os.confstr("CS_GNU_LIBC_VERSION"), reason="not glibc")
def test_thresholds_are_set_with_glibc():
    assert serve.tune_malloc({}) is True


def test_the_startup_heap_is_frozen_out_of_the_collector_s_reach():
    """Objects alive when the broker has started are not walked by later collections
    (a full one over them stops the event loop for 60-120 ms); later ones still are."""
    import gc

    before = [object()]  # a tracked container, alive at "startup"
    try:
        frozen = serve.freeze_startup_heap()
        assert frozen > 0 and gc.get_freeze_count() == frozen
        tracked = {id(o) for o in gc.get_objects()}
        assert id(before) not in tracked
        after = [object()]
        assert id(after) in {id(o) for o in gc.get_objects()}
    finally:
        gc.unfreeze()
