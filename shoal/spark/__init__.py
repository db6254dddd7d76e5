"""Spark 4 Python data source for shoal (and any Kafka broker for the offset-based parts).

    import shoal.spark
    shoal.spark.register(spark)
    df = spark.read.format("shoal").option("kafka.bootstrap.servers", "127.0.0.1:9092") \\
        .option("subscribe", "events").load()

See examples/README.md for the options, and shoal/spark/share.py for the share-group
source and its guarantees.
pyspark is imported only when these functions are called.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any

__all__ = ["register", "reject", "release"]


def register(spark: Any) -> None:
    """Register the data source name ``shoal`` in ``spark`` and enable Python filter pushdown.

    It also adds a streaming query listener that tells the share-group source which
    micro-batches Spark committed, so that a stopped query acknowledges its last batch
    instead of handing its records back (without it, a clean stop redelivers that batch).

    Spark starts its Python workers with ``PYSPARK_PYTHON``, or ``python3`` from the PATH
    when that is unset, which is usually an interpreter without shoal (and pyarrow). When
    neither ``PYSPARK_PYTHON`` nor ``spark.pyspark.python`` is set, the workers are made to
    run this interpreter (``sys.executable``), for the data source and for UDFs defined
    after this call.
    """
    from .source import ShoalDataSource

    _use_this_python(spark)
    spark.dataSource.register(ShoalDataSource)
    _listen_for_commits(spark)
    with contextlib.suppress(Exception):  # pragma: no cover - Spark versions without the setting
        spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")


def release(rows: Any, *, state_dir: str, share_group: str) -> int:
    """Ask the share-group source to RELEASE these records instead of accepting them.

    ``rows``: a DataFrame or Rows with topic, partition and offset columns, from the
    micro-batch being processed (call it inside ``foreachBatch``). Returns how many were noted.
    """
    from .share import note_dispositions

    return note_dispositions(rows, state_dir=state_dir, share_group=share_group, kind="release")


def reject(rows: Any, *, state_dir: str, share_group: str) -> int:
    """Like :func:`release`, but REJECT (archive: never delivered again)."""
    from .share import note_dispositions

    return note_dispositions(rows, state_dir=state_dir, share_group=share_group, kind="reject")


_LISTENING: set[int] = set()


def _listen_for_commits(spark: Any) -> None:
    """Add (once per session) the listener that passes committed share-source offsets on."""
    key = id(spark)
    if key in _LISTENING:
        return
    from .listener import CommitListener

    try:
        spark.streams.addListener(CommitListener())
    except Exception:  # pragma: no cover - a session that takes no Python listener (Spark Connect)
        return
    _LISTENING.add(key)


def _use_this_python(spark: Any) -> None:
    if os.environ.get("PYSPARK_PYTHON"):
        return
    try:
        chosen = spark.conf.get("spark.pyspark.python", None)
    except Exception:  # pragma: no cover - a Spark Connect session may refuse the look-up
        chosen = None
    python = chosen or sys.executable
    os.environ["PYSPARK_PYTHON"] = python
    sc = getattr(spark, "sparkContext", None)
    if sc is not None and getattr(sc, "pythonExec", None) in (None, "python3", "python"):
        sc.pythonExec = python
