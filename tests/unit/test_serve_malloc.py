"""``shoal serve`` fixes glibc's malloc thresholds unless the environment sets them."""

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
