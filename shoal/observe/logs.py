"""The broker's log lines: ``log.format=text`` (the default) or ``json``.

One line per event, each with a UTC timestamp to the millisecond. ``text``:
``2026-01-02T03:04:05.678Z INFO shoal.broker: created topic t (...)``. ``json``: one
object per line with ``ts``, ``level``, ``logger`` and ``message`` (and ``exception``
with the traceback, when there is one), for log collectors. A traceback in ``text`` mode
follows its line, as Python's logging prints it.
"""

from __future__ import annotations

import json
import logging
import sys
from collections import OrderedDict
from datetime import UTC, datetime
from typing import TextIO

__all__ = ["JsonFormatter", "TextFormatter", "configure", "log_once"]


def _timestamp(record: logging.LogRecord) -> str:
    t = datetime.fromtimestamp(record.created, tz=UTC)
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{int(record.msecs):03d}Z"


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = f"{_timestamp(record)} {record.levelname} {record.name}: {record.getMessage()}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc = {"ts": _timestamp(record), "level": record.levelname, "logger": record.name,
               "message": record.getMessage()}
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc, ensure_ascii=False)


def configure(level: str, fmt: str = "text", stream: TextIO | None = None) -> None:
    """Send every log line at ``level`` or above to ``stream`` (stderr) in format ``fmt``."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(getattr(logging, level.upper(), logging.INFO))


_ONCE_REMEMBERED = 1000
_logged_once: OrderedDict[tuple[str, str], None] = OrderedDict()


def log_once(logger: logging.Logger, key: tuple[str, str], message: str, level: int = logging.WARNING) -> bool:
    """Log ``message`` the first time ``key`` comes (a limit refusing a group, say), not at
    every retry of the client. The keys remembered are bounded (the oldest are forgotten
    first), so endless new keys cannot grow memory. Returns whether it logged."""
    if key in _logged_once:
        return False
    if len(_logged_once) >= _ONCE_REMEMBERED:
        _logged_once.popitem(last=False)
    _logged_once[key] = None
    logger.log(level, "%s", message)
    return True
