"""Client quotas applied to requests, where the connection serves them (shell of ``security/quotas.py``).

As Kafka's quota managers, per request of a client (user, client id) with a quota:

* Produce is charged its request's size against ``producer_byte_rate`` before it is
  handled;
* a consumer's Fetch (not a follower's) is charged its response's size against
  ``consumer_byte_rate``. Its ``max_bytes`` is first capped to what the quota allows over
  ``quota.window.num - 1`` windows, as Kafka caps it, so one answer can never exceed the
  quota on its own; a Fetch whose answer would exceed the quota is answered *empty*
  (its records are read again by the next Fetch) and the bytes are not charged, as Kafka
  does since KIP-219. ShareFetch is charged its answer's size too, but its answer is always
  sent (its records are acquired);
* every request but ApiVersions, the SASL requests and the brokers' own requests (the
  share-state RPCs, a follower's Fetch) is charged the time its handler spent on the event
  loop against ``request_percentage`` (100 is the whole of the event loop's time);

and when a rate is over its quota, the response carries the longest throttle time in
``throttle_time_ms`` and the connection is muted for that long: the broker reads and
serves nothing more from it (``Connection.throttle``) while the answer itself is sent at
once, as Kafka does for clients that honour the throttle time (KIP-219).
"""

from __future__ import annotations

import dataclasses
import datetime
import struct
from collections.abc import Coroutine, Generator
from time import perf_counter
from typing import Any

from ..errors import ErrorCode
from ..protocol.codec import EncodedBody, EncodedPieces
from ..protocol.entities import has_field, make
from ..security.access import replica_id
from ..security.quotas import (
    CONSUMER_BYTE_RATE,
    PRODUCER_BYTE_RATE,
    REQUEST_PERCENTAGE,
    QuotaManager,
)

__all__ = ["EXEMPT_APIS", "RequestQuota"]

PRODUCE, FETCH, METADATA, SHARE_FETCH = 0, 1, 3, 78
EXEMPT_APIS = frozenset({17, 18, 36, 83, 84, 85, 86, 87})
"""SaslHandshake, ApiVersions, SaslAuthenticate and the share-state RPCs: never charged."""
_I32 = struct.Struct(">i")


class RequestQuota:
    """One request's quotas: the limits that apply to it, its handler time, its throttle time."""

    __slots__ = ("busy_s", "limits", "manager", "now_ms", "throttle_ms")

    def __init__(self, manager: QuotaManager, limits: dict[str, Any], now_ms: int) -> None:
        self.manager = manager
        self.limits = limits
        self.now_ms = now_ms
        self.throttle_ms = 0
        self.busy_s = 0.0

    @classmethod
    def begin(cls, manager: QuotaManager, limits: dict[str, Any], api_key: int, body: bytes, request: Any,
              now_ms: int) -> tuple[RequestQuota | None, Any]:
        """The request's quota state (None: nothing to charge) and the request to handle."""
        if api_key == FETCH and replica_id(request) >= 0:  # a follower's Fetch is never charged
            return None, request
        wanted = REQUEST_PERCENTAGE in limits or (api_key == PRODUCE and PRODUCER_BYTE_RATE in limits) or (
            api_key in (FETCH, SHARE_FETCH) and CONSUMER_BYTE_RATE in limits)
        if not wanted:
            return None, request
        q = cls(manager, limits, now_ms)
        if api_key == PRODUCE and PRODUCER_BYTE_RATE in limits:
            limit, tags = limits[PRODUCER_BYTE_RATE]
            q.throttle_ms = manager.record(PRODUCER_BYTE_RATE, limit, tags, len(body), now_ms)
        elif api_key == FETCH and CONSUMER_BYTE_RATE in limits and has_field(type(request), "max_bytes"):
            cap = max(1, int(manager.max_in_window(limits[CONSUMER_BYTE_RATE][0])))
            if request.max_bytes > cap:
                request = dataclasses.replace(request, max_bytes=cap)
        return q, request

    def timed(self, coro: Coroutine[Any, Any, Any]) -> Any:
        """``coro``, with the time of each of its steps added to the handler time."""
        if REQUEST_PERCENTAGE not in self.limits:
            return coro
        return _Timed(coro, self)

    def finish(self, ctx: Any, response: Any, now_ms: int) -> Any:
        """Charge the handler time; the response with the throttle time so far."""
        if REQUEST_PERCENTAGE in self.limits:
            limit, tags = self.limits[REQUEST_PERCENTAGE]
            # percent-seconds, so that the rate per second is a percentage of the event loop
            self.throttle_ms = max(self.throttle_ms, self.manager.record(
                REQUEST_PERCENTAGE, limit, tags, self.busy_s * 100.0, now_ms))
        self.now_ms = now_ms
        return with_throttle(ctx.api_key, ctx.api_version, response, self.throttle_ms) if self.throttle_ms \
            else response

    def charge_response(self, api_key: int, size: int) -> bool:
        """Charge a Fetch or ShareFetch answer of ``size`` bytes; whether a Fetch must be
        answered empty instead (then nothing is charged)."""
        if api_key not in (FETCH, SHARE_FETCH) or CONSUMER_BYTE_RATE not in self.limits:
            return False
        limit, tags = self.limits[CONSUMER_BYTE_RATE]
        throttle = self.manager.record(CONSUMER_BYTE_RATE, limit, tags, size, self.now_ms)
        if throttle <= 0:
            return False
        self.throttle_ms = max(self.throttle_ms, throttle)
        if api_key == FETCH:
            self.manager.unrecord(CONSUMER_BYTE_RATE, tags, size, self.now_ms)
            return True
        return False


class _Timed:
    """Awaits a coroutine, adding the time of each of its steps to ``quota.busy_s``."""

    __slots__ = ("coro", "quota")

    def __init__(self, coro: Coroutine[Any, Any, Any], quota: RequestQuota) -> None:
        self.coro = coro
        self.quota = quota

    def __await__(self) -> Generator[Any, Any, Any]:
        coro = self.coro
        send: Any = None
        error: BaseException | None = None
        while True:
            t0 = perf_counter()
            try:
                yielded = coro.throw(error) if error is not None else coro.send(send)
            except StopIteration as stop:
                return stop.value
            finally:
                self.quota.busy_s += perf_counter() - t0
            try:
                send, error = (yield yielded), None
            except BaseException as e:  # cancellation and the like go into the coroutine
                send, error = None, e


def with_throttle(api_key: int, version: int, response: Any, throttle_ms: int) -> Any:
    """``response`` carrying ``throttle_ms`` in its throttle time, where it has one."""
    if type(response) is EncodedBody:
        body = response.body
        if api_key == PRODUCE and len(body) >= 5:
            # written by protocol/produce_response.py: the throttle time is the last field,
            # followed in flexible versions (v9+) by the empty tagged fields byte
            end = len(body) - 1 if version >= 9 else len(body)
            return EncodedBody(body[:end - 4] + _I32.pack(throttle_ms) + body[end:])
        if api_key == METADATA and len(body) >= 4:
            return EncodedBody(_I32.pack(throttle_ms) + body[4:])
        return response
    if type(response) is EncodedPieces:
        pieces = list(response.pieces)
        if api_key in (FETCH, SHARE_FETCH) and pieces and isinstance(pieces[0], bytes | bytearray) \
                and len(pieces[0]) >= 4:
            pieces[0] = _I32.pack(throttle_ms) + bytes(pieces[0][4:])
            return EncodedPieces(pieces)
        return response
    if has_field(type(response), "throttle_time"):
        return dataclasses.replace(response, throttle_time=datetime.timedelta(milliseconds=throttle_ms))
    return response


def empty_fetch(ctx: Any, response: Any, throttle_ms: int) -> Any:
    """The empty answer of a throttled Fetch: no partitions, the session and error code of ``response``."""
    if type(response) is EncodedPieces:
        head = bytes(response.pieces[0])
        _, error_code, session_id = struct.unpack_from(">ihi", head, 0)
    else:
        error_code = getattr(response, "error_code", 0)
        session_id = getattr(response, "session_id", 0)
    return make(ctx.response_type, throttle_time=throttle_ms, error_code=ErrorCode(error_code), session_id=session_id,
                responses=())
