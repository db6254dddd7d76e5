"""The example pipeline, end to end, on a standalone cluster (one master, two workers) it starts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.spark

ROOT = Path(__file__).resolve().parents[2]


def test_pipeline_on_standalone_cluster(spark_broker, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "pipeline.py"), "--standalone",
                           "--bootstrap", spark_broker.bootstrap, "--events", "1500", "--out", str(out),
                           "--timeout", "150"],
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "standalone cluster: spark://" in proc.stdout
    assert "done: 1500 distinct events of 1500" in proc.stdout
    assert any((out / "table").glob("*.parquet"))
