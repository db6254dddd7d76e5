"""The streaming query listener that :func:`shoal.spark.register` adds.

Spark posts a query's progress only after the micro-batch is in the query's commit log.
For every source whose end offset is the share-group source's, the listener notes that
offset as committed (:func:`shoal.spark.share.note_committed`), in the source's state
directory. The share source reads the note when the query stops, to accept the records
of its last micro-batch instead of releasing them.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from pyspark.sql.streaming import StreamingQueryListener

__all__ = ["CommitListener"]

log = logging.getLogger("shoal.spark")


class CommitListener(StreamingQueryListener):
    def onQueryStarted(self, event: Any) -> None:
        pass

    def onQueryProgress(self, event: Any) -> None:
        from .share import note_committed

        for source in event.progress.sources:
            offset = source.endOffset
            try:
                data = json.loads(offset) if isinstance(offset, str) else offset
            except ValueError:
                continue
            if isinstance(data, dict) and "reader" in data:
                try:
                    note_committed(data)
                except OSError as e:
                    log.warning("share source: cannot note committed batch %s: %s", data.get("batch"), e)

    def onQueryIdle(self, event: Any) -> None:
        pass

    def onQueryTerminated(self, event: Any) -> None:
        pass
