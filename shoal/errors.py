"""Who is at fault, as h11 divides it.

* :class:`ProtocolViolation`: the peer sent bytes that are not a Kafka request (bad frame,
  undecodable header or body). The connection is closed and the event logged.
* :class:`ApiError`: the request is well formed but cannot be served; it is answered
  with ``error_code`` (a Kafka ErrorCode from kio).

Anything else raised while serving a request is a bug in shoal: it is logged with its
traceback and the connection is closed; the broker itself keeps running.
"""

from __future__ import annotations

from kio.schema.errors import ErrorCode

__all__ = ["ApiError", "ErrorCode", "FsyncError", "ProtocolViolation"]


class ProtocolViolation(Exception):
    """The peer broke the wire protocol; close the connection."""


class FsyncError(OSError):
    """An fsync (fdatasync) itself failed: bytes written before it may never reach the disk
    although reads still show them, and a later fsync may report success regardless. Other
    OSErrors around a sync (opening the file, no descriptors) lose nothing."""


MAX_MESSAGE_CHARS = 1000
"""An error message longer than this is cut: messages quote names from requests (up to
32,767 bytes each), and a response's error message must fit an int16-length string."""


class ApiError(Exception):
    """Answer the request (or the part of it concerned) with ``error_code``."""

    def __init__(self, error_code: ErrorCode, message: str | None = None) -> None:
        if message is not None and len(message) > MAX_MESSAGE_CHARS:
            message = message[:MAX_MESSAGE_CHARS - 1] + "…"
        super().__init__(message or error_code.name)
        self.error_code = error_code
        self.message = message
