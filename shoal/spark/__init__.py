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

from typing import Any

__all__ = ["register", "release", "reject"]


def register(spark: Any) -> None:
    """Register the data source name ``shoal`` in ``spark`` and enable Python filter pushdown."""
    from .source import ShoalDataSource

    spark.dataSource.register(ShoalDataSource)
    try:
        spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")
    except Exception:  # pragma: no cover - Spark versions without the setting
        pass


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
