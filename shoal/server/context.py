"""What a handler gets besides its request: the broker, the connection, the header."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..protocol.codec import Codec
from ..protocol.header import RequestHeader

if TYPE_CHECKING:
    from .broker import Broker
    from .connection import Connection


class RequestContext:
    __slots__ = ("api_key", "api_version", "broker", "codec", "connection", "header")

    def __init__(self, broker: Broker, connection: Connection | Any, header: RequestHeader, codec: Codec) -> None:
        self.broker = broker
        self.connection = connection
        self.header = header
        self.codec = codec
        self.api_key = header.api_key
        self.api_version = header.api_version

    @property
    def response_type(self) -> type:
        return self.codec.response_type

    def now_ms(self) -> int:
        return self.broker.clock.now_ms()
