"""One client connection: frames in, handlers called, responses out in request order.

Theory of operation
-------------------
``data_received`` feeds a :class:`FrameDecoder` and serves every complete frame at once
(pipelining). Each request that expects a response takes a *slot* in ``_slots`` in
arrival order. A synchronous handler fills its slot immediately; an ``async`` one is
run at once up to its first wait, and fills its slot then if it needed none (a Fetch
with records, a heartbeat that writes nothing); one that waits (long poll, fsync wait,
coordinator write) goes on in a task and fills it when the task ends. ``_flush`` writes the
filled slots at the head of the queue, so responses leave in the order their requests
came, even when handlers finish out of order (Kafka's rule). Produce with acks=0 takes no
slot: it has no response, and a partition error closes the connection instead (Kafka's
rule, so that the client notices).

Backpressure: past ``queued.max.requests`` open slots, while the transport's write
buffer is above its high-water mark, while responses are queued that the transport has
not taken (``_out``) or more than ``UNSENT_BYTES`` of encoded responses wait behind an
unanswered request, or while it waits for request memory, the connection is *muted*: it
serves no further request, not even one already received, and stops reading; it resumes
when all of them clear, serving what it had received first. So a client that sends
requests and never reads its socket gets at most about one response's worth of its
answers encoded (Kafka mutes a channel while its response is being sent), and pipelined
small requests are served as before.

Output: the filled slots at the head of the queue move to ``_out`` as their pieces;
``_pump`` hands them to the socket and the transport at most ``PUMP_BYTES`` at a time
while the transport's buffer is below its high-water mark, and again when it drains
(``resume_writing``). A FileSlice waits in ``_out`` unread (split where a pass ends), so
an unread response costs the broker little memory however large it is.

Request memory (``queued.max.request.bytes``, see ``memory_pool.py``): when the decoder
has read a frame's size prefix, the connection takes that many bytes from the broker's
pool before the body is buffered; if the pool lacks them it stops reading and queues,
and reads on when the pool grants them. The bytes go back to the pool when the request
has been handled (its response encoded, or for acks=0 Produce its task ended).

Records from the page cache: a Fetch answer's records may be a
:class:`~shoal.log.segment.FileSlice` (``sends_file_slices``). ``_flush`` then writes the
response itself while the transport has nothing buffered: it reads the slices into a
scratch buffer that the thread reuses and writes them with the bytes around them in one
``writev``. Measured over loopback (docs/PERFORMANCE.md), this costs the sender and the
receiver less CPU than ``sendfile(2)`` (Kafka's FileRecords path), and far less than a
new buffer per answer, whose fresh pages the kernel must fault in and zero. What the
socket does not take at once is copied out of the scratch buffer (or read into memory)
and handed to the transport, which writes it when it can, after everything written
directly. A slice whose segment was truncated or closed since the read (a
follower's truncation, compaction, retention, deletion) closes the connection, as Kafka
closes one whose FileRecords shrank while being sent; the client fetches again.

Throttling (client quotas, ``throttle.py``): when the broker has quotas, each request of a
client with one is charged (its size, its answer's size, its handler time); a request over
a quota is answered with the throttle time in ``throttle_time_ms``, and the connection is
muted for that time (``throttle``) as for backpressure: it serves and reads nothing more
until then, while the answer itself leaves at once.

Idleness: ``last_active_s`` (loop time) moves whenever bytes are received or a response
is written; the listener closes connections idle past ``connections.max.idle.ms``
(``close_idle``).

Security (shoal/security): on a broker with TLS or SASL listeners, ``security`` holds the
connection's listener and authentication state. Until SASL completes only ApiVersions and
the SASL requests are served (bare token frames after a v0 SaslHandshake are answered by
``_serve_raw_sasl``), and the brokers' own APIs go through ``guarded_handler``. On the
single PLAINTEXT listener of a broker without security settings it is None and nothing
of this runs.

Errors: a frame that is not a Kafka request (bad size, truncated, undecodable header or
body, unknown API key, unsupported version of an API other than ApiVersions) is a
ProtocolViolation: logged, connection closed. Bytes after a decoded body are ignored, as
Kafka's request parser ignores them (librdkafka's AdminClient sends Metadata v12 with
three). An exception escaping a handler is a bug:
logged with its traceback (once per exception type and place, then as one line),
connection closed. A response that cannot be encoded (a value out of its field's range)
is a bug too: logged the same way and answered INVALID_REQUEST where the response has a
top-level error code, else the connection is closed; no request is left unanswered on
an open connection. The broker keeps serving everyone else.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import socket
import struct
import threading
from collections import deque
from time import perf_counter
from typing import TYPE_CHECKING, Any

from ..errors import ApiError, ErrorCode, ProtocolViolation
from ..log.segment import FileSlice
from ..protocol.codec import codec_for, decode_request, encode_response
from ..protocol.entities import has_field, make
from ..protocol.framing import FrameDecoder
from ..protocol.header import parse_request_header
from ..security.access import guarded_handler
from ..security.serving import REQUEST_LISTENER
from .context import RequestContext
from .throttle import (
    EXEMPT_APIS,
    FETCH,
    SHARE_FETCH,
    RequestQuota,
    empty_fetch,
    with_throttle,
)

if TYPE_CHECKING:
    from .broker import Broker

log = logging.getLogger("shoal.connection")

_KEY_VERSION = struct.Struct(">hh")
_API_VERSIONS = 18
_PRODUCE = 0


class _Slot:
    __slots__ = ("pieces", "reserved", "size", "task")

    def __init__(self) -> None:
        self.pieces: list[Any] | None = None
        self.task: asyncio.Future[Any] | None = None
        self.reserved = 0
        """Pool bytes of the request's frame, released when its task ends."""
        self.size = 0
        """Bytes of the encoded response (counted in ``Connection._held`` until flushed)."""


class Connection(asyncio.Protocol):
    def __init__(self, broker: Broker, connection_id: int) -> None:
        self.broker = broker
        self.connection_id = connection_id
        self.transport: asyncio.Transport | None = None
        self.peer: str = "?"
        self._decoder = FrameDecoder(broker.config["socket.request.max.bytes"], gated=True)
        self._pool = broker.memory_pool
        self._frame_reserved = 0
        """Pool bytes granted for the frame being read (0 between frames)."""
        self._memory_wait: Any = None
        """The pool's handle while this connection waits (muted) for request memory."""
        self._slots: deque[_Slot] = deque()
        self._held = 0
        """Bytes of the responses in filled slots not yet moved to ``_out``."""
        self._out: deque[Any] = deque()
        """Response pieces (bytes, memoryviews, FileSlices) not yet handed to the transport."""
        self._serve_pending = False
        self._eof = False
        self._max_inflight: int = broker.config["queued.max.requests"]
        self._reading_paused = False
        self._write_paused = False
        self._closing = False
        self._routes = broker.routes
        self._loop = asyncio.get_running_loop()
        self.closed = self._loop.create_future()
        self.last_active_s = self._loop.time()
        self._fd = -1
        self.sends_file_slices = False
        """Whether a Fetch answer may carry FileSlices (the transport has a socket to send them to)."""
        self.security: Any = None
        """The listener and authentication state (shoal/security/session.py); None on the default
        PLAINTEXT listener of a broker without security settings."""
        self._quotas: Any = getattr(broker, "extensions", {}).get("quotas")
        """The broker's client quotas (shoal/security/quota_store.py; see Throttling above)."""
        self._quota_key: tuple[Any, ...] = ()
        self._quota_limits: dict[str, Any] = {}
        self._throttle_handle: asyncio.TimerHandle | None = None
        self._throttled_until = 0.0

    # -- asyncio.Protocol ---------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
            try:
                self._fd = sock.fileno()
            except (OSError, AttributeError):
                self._fd = -1
            self.sends_file_slices = self._fd >= 0
        peer = transport.get_extra_info("peername")
        if peer:
            self.peer = f"{peer[0]}:{peer[1]}"
        if self.security is not None:
            self.security.connection_made(self, transport)
        self.broker.connection_opened(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self._closing = True
        if self._throttle_handle is not None:
            self._throttle_handle.cancel()
            self._throttle_handle = None
        if self._memory_wait is not None:
            self._pool.cancel(self._memory_wait)
            self._memory_wait = None
        if self._frame_reserved:
            self._pool.release(self._frame_reserved)
            self._frame_reserved = 0
        for slot in self._slots:
            if slot.task is not None and not slot.task.done():
                slot.task.cancel()
        self._slots.clear()
        self._out.clear()
        self._held = 0
        self.broker.connection_closed(self)
        if not self.closed.done():
            self.closed.set_result(None)

    def data_received(self, data: bytes) -> None:
        if self._closing:
            return
        self.last_active_s = self._loop.time()
        self._decoder.feed(data)
        self._serve_frames()

    def _serve_frames(self) -> None:
        self._serve_pending = False
        decoder = self._decoder
        try:
            while not self._closing and not self._muted():
                body = decoder.next_frame()
                if body is None:
                    want = decoder.memory_wanted
                    if want is None:
                        break
                    if not self._pool.try_reserve(want):
                        self._wait_for_memory(want)
                        break
                    self._frame_reserved = want
                    decoder.grant()
                    continue
                reserved, self._frame_reserved = self._frame_reserved, 0
                self._serve(body, reserved)
        except ProtocolViolation as e:
            self._abort(f"protocol violation: {e}")
        except Exception as e:
            _log_failure("connection %s from %s: internal error; closing", self.connection_id, self.peer, exc=e)
            self._abort(None)
        else:
            self._maybe_pause()

    def eof_received(self) -> bool | None:
        if self._decoder.buffered and (self._muted() or self._serve_pending):
            # requests received before the end wait to be served: close once answered
            self._eof = True
            return True
        try:
            self._decoder.feed(b"")
            self._decoder.next_frame()
        except ProtocolViolation as e:
            log.info("connection %s from %s: %s", self.connection_id, self.peer, e)
        if self._slots or self._out:
            self._eof = True  # close once every answer has gone to the transport
            return True
        return None  # close our side once we are done writing

    def pause_writing(self) -> None:
        self._write_paused = True
        self._maybe_pause()

    def resume_writing(self) -> None:
        self._write_paused = False
        self._flush()

    # -- request memory -----------------------------------------------------------
    def _wait_for_memory(self, size: int) -> None:
        self._memory_wait = self._pool.wait(size, lambda: self._memory_granted(size))
        self._maybe_pause()

    def _memory_granted(self, size: int) -> None:
        self._memory_wait = None
        if self._closing:
            self._pool.release(size)
            return
        self._frame_reserved = size
        self._decoder.grant()
        self._maybe_resume()
        self._serve_frames()

    # -- requests -----------------------------------------------------------------
    def _serve(self, body: bytes, reserved: int) -> None:
        """Serve one frame whose body holds ``reserved`` pool bytes, and see that they go back."""
        try:
            slot = self._serve_frame(body, reserved)
        except BaseException:
            self._pool.release(reserved)
            raise
        if slot is None:
            return  # the acks=0 task releases them
        if slot.task is None:
            self._pool.release(reserved)
        else:
            slot.reserved = reserved

    def _serve_frame(self, body: bytes, reserved: int) -> _Slot | None:
        sec = self.security
        if sec is not None and not sec.authenticated and sec.raw_tokens:
            return self._serve_raw_sasl(body)
        if len(body) < 4:
            raise ProtocolViolation(f"frame of {len(body)} bytes is too short for a request header")
        api_key, version = _KEY_VERSION.unpack_from(body, 0)
        if sec is not None and (not sec.authenticated or sec.expires_at):
            sec.check(api_key)  # before SASL completes (or after it expired), only ApiVersions and SASL
        route = self._routes.get(api_key)
        if route is None:
            raise ProtocolViolation(f"unknown or unsupported API key {api_key}")
        if not route.min_version <= version <= route.max_version:
            if api_key == _API_VERSIONS:
                return self._unsupported_api_versions(body)
            raise ProtocolViolation(
                f"API {api_key} version {version} not in {route.min_version}..{route.max_version}"
            )
        codec = codec_for(api_key, version)
        assert codec is not None
        header, request = decode_request(body, codec)
        ctx = RequestContext(self.broker, self, header, codec)
        quota = None
        if self._quotas is not None and api_key not in EXEMPT_APIS:
            quota, request = self._begin_quota(ctx, body, request)
        metrics = self.broker.metrics
        started = perf_counter() if metrics is not None else 0.0
        if api_key == _PRODUCE and request.acks == 0:
            self._run_no_response(ctx, route, request, reserved)
            if quota is not None:
                self.throttle(quota.throttle_ms)
            return None
        slot = _Slot()
        self._slots.append(slot)
        if sec is not None:
            REQUEST_LISTENER.set(sec.listener.name)  # for the leader hints; an async handler's task keeps it
        handler = route.handler if sec is None and self.broker.authorizer is None else guarded_handler(sec, route)
        t_handler = perf_counter() if quota is not None else 0.0
        try:
            response = handler(ctx, request)
        except ApiError as e:
            response = self._error_response(ctx, e)
        if sec is None and self.broker.authorizer is None and asyncio.iscoroutine(response):
            try:
                response = _first_step(response)
            except ApiError as e:
                response = self._error_response(ctx, e)
            except Exception as e:  # as when the handler's task fails (_answer_async)
                _log_failure("connection %s from %s: %s v%d failed; closing", self.connection_id, self.peer,
                             ctx.codec.request_type.__name__, ctx.api_version, exc=e)
                if metrics is not None:
                    metrics.request_failed(api_key)
                self._abort(None)
                return slot
        if quota is not None:
            quota.busy_s += perf_counter() - t_handler
        if asyncio.iscoroutine(response):
            # An async handler, or a synchronous one that must wait (a coordinator write):
            # the slot is filled when the task ends.
            task = asyncio.ensure_future(response if quota is None else quota.timed(response))
            slot.task = task
            task.add_done_callback(functools.partial(self._async_done, slot, ctx, started=started, quota=quota))
            return slot
        if isinstance(response, asyncio.Future):
            # A handler's answer to come (Produce waiting for its fsync), without a task:
            # the slot is filled when the future resolves; closing the connection cancels it.
            slot.task = response
            response.add_done_callback(functools.partial(self._async_done, slot, ctx, started=started, quota=quota))
            return slot
        pieces = self._encode(ctx, response) if quota is None else self._encode_charged(ctx, response, quota)
        if pieces is None:
            return slot
        self._fill(slot, pieces)
        if metrics is not None:
            metrics.request_done(api_key, perf_counter() - started)
        self._flush()
        return slot

    def _serve_raw_sasl(self, body: bytes) -> _Slot:
        """A bare SASL token frame (after a v0 SaslHandshake); its answer is a bare frame too."""
        slot = _Slot()
        self._slots.append(slot)
        task = asyncio.ensure_future(self.security.raw_token(self, body))
        slot.task = task

        def done(t: asyncio.Task[bytes]) -> None:
            self._pool.release(slot.reserved)
            slot.reserved = 0
            if t.cancelled():
                return
            exc = t.exception()
            if self._closing:
                return
            if exc is not None:
                self._abort(str(exc))
                return
            slot.pieces = [t.result()]
            self._flush()

        task.add_done_callback(done)
        return slot

    def _run_no_response(self, ctx: RequestContext, route: Any, request: Any, reserved: int) -> None:
        """acks=0 Produce: no response; a partition error closes the connection (Kafka's rule)."""
        def check(response: Any) -> None:
            failed = [(t.name, p.index, p.error_code.name) for t in response.responses
                      for p in t.partition_responses if p.error_code != 0]
            if failed:
                self._abort(f"acks=0 produce failed ({failed[:3]})")

        def done(t: asyncio.Future[Any]) -> None:
            self._pool.release(reserved)
            if t.cancelled():
                return
            if t.exception() is not None:
                log.error("acks=0 produce failed on connection %s", self.connection_id, exc_info=t.exception())
                self._abort(None)
            elif t.result() is not None:
                check(t.result())

        result = route.handler(ctx, request)  # if it raises, _serve gives the memory back
        if asyncio.iscoroutine(result):
            asyncio.ensure_future(result).add_done_callback(done)
        elif isinstance(result, asyncio.Future):
            result.add_done_callback(done)
        else:
            self._pool.release(reserved)
            if result is not None:
                check(result)

    def _async_done(self, slot: _Slot, ctx: RequestContext, task: asyncio.Future[Any], started: float = 0.0,
                    quota: RequestQuota | None = None) -> None:
        try:
            self._answer_async(slot, ctx, task, started, quota)
        except Exception as e:  # never leave the slot unfilled: that would hang the connection
            _log_failure("connection %s from %s: answering %s v%d failed; closing", self.connection_id, self.peer,
                         ctx.codec.request_type.__name__, ctx.api_version, exc=e)
            self._abort(None)

    def _answer_async(self, slot: _Slot, ctx: RequestContext, task: asyncio.Future[Any], started: float,
                      quota: RequestQuota | None = None) -> None:
        self._pool.release(slot.reserved)
        slot.reserved = 0
        if task.cancelled():
            return
        exc = task.exception()  # read even when closing: asyncio reports an exception never read
        if self._closing:
            return
        if exc is not None:
            if isinstance(exc, ApiError):
                try:
                    response = self._error_response(ctx, exc)
                except ProtocolViolation as e:  # never leave the request unanswered: close instead
                    self._abort(f"cannot answer: {e}")
                    return
            else:
                _log_failure("connection %s from %s: %s v%d failed; closing", self.connection_id, self.peer,
                             ctx.codec.request_type.__name__, ctx.api_version, exc=exc)
                if self.broker.metrics is not None:
                    self.broker.metrics.request_failed(ctx.api_key)
                self._abort(None)
                return
        else:
            response = task.result()
        pieces = self._encode(ctx, response) if quota is None else self._encode_charged(ctx, response, quota)
        if pieces is None:
            return
        self._fill(slot, pieces)
        if self.broker.metrics is not None:
            self.broker.metrics.request_done(ctx.api_key, perf_counter() - started)
        self._flush()

    def _encode(self, ctx: RequestContext, response: Any) -> list[Any] | None:
        """The response's frame pieces. A response that cannot be encoded (a value out of its
        field's range) is a bug: it is logged and the request answered with INVALID_REQUEST
        where the response has a top-level error code; else the connection is closed. None
        when it was closed."""
        try:
            return encode_response(ctx.codec, ctx.api_key, ctx.header.correlation_id, response)
        except Exception as e:
            name = f"{ctx.codec.response_type.__name__} v{ctx.api_version}"
            try:
                error = self._error_response(ctx, ApiError(ErrorCode.invalid_request, f"cannot encode {name}"))
                pieces = encode_response(ctx.codec, ctx.api_key, ctx.header.correlation_id, error)
            except Exception:
                _log_failure("connection %s from %s: cannot encode %s; closing", self.connection_id, self.peer,
                             name, exc=e)
                self._abort(None)
                return None
            _log_failure("connection %s from %s: cannot encode %s; answered INVALID_REQUEST", self.connection_id,
                         self.peer, name, exc=e)
            return pieces

    # -- client quotas (shoal/server/throttle.py) -----------------------------------------
    def _begin_quota(self, ctx: RequestContext, body: bytes, request: Any) -> tuple[RequestQuota | None, Any]:
        manager = self._quotas.current()
        if not manager.active:
            return None, request
        sec = self.security
        user = "ANONYMOUS" if sec is None else sec.principal.partition(":")[2]
        client_id = ctx.header.client_id or ""
        key = (manager.version, user, client_id)
        if key != self._quota_key:
            self._quota_key, self._quota_limits = key, manager.limits(user, client_id)
        if not self._quota_limits:
            return None, request
        return RequestQuota.begin(manager, self._quota_limits, ctx.api_key, body, request, ctx.now_ms())

    def _encode_charged(self, ctx: RequestContext, response: Any, quota: RequestQuota) -> list[Any] | None:
        """``_encode``, charging the request's quotas: the answer carries the throttle time, a
        Fetch over its quota is answered empty, and the connection is muted for that time."""
        response = quota.finish(ctx, response, ctx.now_ms())
        pieces = self._encode(ctx, response)
        if pieces is not None and ctx.api_key in (FETCH, SHARE_FETCH):
            before = quota.throttle_ms
            if quota.charge_response(ctx.api_key, sum(map(len, pieces))):
                pieces = self._encode(ctx, empty_fetch(ctx, response, quota.throttle_ms))
            elif quota.throttle_ms != before:
                pieces = self._encode(ctx, with_throttle(ctx.api_key, ctx.api_version, response, quota.throttle_ms))
        self.throttle(quota.throttle_ms)
        return pieces

    def throttle(self, ms: int) -> None:
        """Serve and read nothing more from this connection for ``ms`` milliseconds (a quota's
        throttle time); answers already due are still sent."""
        if ms <= 0 or self._closing:
            return
        until = self._loop.time() + ms / 1000
        if self._throttle_handle is not None:
            if until <= self._throttled_until:
                return
            self._throttle_handle.cancel()
        self._throttled_until = until
        self._throttle_handle = self._loop.call_at(until, self._unthrottle)
        self._maybe_pause()

    def _unthrottle(self) -> None:
        self._throttle_handle = None
        self._maybe_resume()

    def _error_response(self, ctx: RequestContext, e: ApiError) -> Any:
        cls = ctx.codec.response_type
        if not has_field(cls, "error_code"):
            raise ProtocolViolation(f"{cls.__name__} has no top-level error code for {e.error_code.name}")
        fields: dict[str, Any] = {"error_code": e.error_code}
        if has_field(cls, "error_message"):
            fields["error_message"] = e.message
        return make(cls, **fields)

    def _unsupported_api_versions(self, body: bytes) -> _Slot:
        """Answer an ApiVersions version we do not know in the v0 format (KIP-511)."""
        header, _ = parse_request_header(body, None)
        from .handlers.api_versions import unsupported_version_response

        codec0 = codec_for(_API_VERSIONS, 0)
        assert codec0 is not None
        slot = _Slot()
        self._slots.append(slot)
        self._fill(slot, encode_response(codec0, _API_VERSIONS, header.correlation_id,
                                         unsupported_version_response(self.broker)))
        self._flush()
        return slot

    # -- output and flow control -----------------------------------------------------
    def _fill(self, slot: _Slot, pieces: list[Any]) -> None:
        """The slot's response is encoded: it counts as held until it is flushed."""
        slot.pieces = pieces
        slot.size = sum(map(len, pieces))
        self._held += slot.size

    def _flush(self) -> None:
        slots = self._slots
        transport = self.transport
        if transport is None or self._closing:
            return
        out = self._out
        while slots and slots[0].pieces is not None:
            slot = slots.popleft()
            self._held -= slot.size
            out.extend(slot.pieces)  # type: ignore[arg-type]
        if out:
            self._pump()
            if self._closing:
                return
        self._maybe_resume()
        if (self.broker.shutting_down or (self._eof and not self._serve_pending and not self._decoder.buffered)) \
                and not slots and not out:
            transport.close()

    def _pump(self) -> None:
        """Hand ``_out`` to the socket and the transport, ``PUMP_BYTES`` at a time, while
        the transport's buffer is below its high-water mark (it calls ``pause_writing``
        once above, ``resume_writing`` once drained). The socket takes what it can
        directly (``_send_direct``) while the transport holds nothing."""
        out = self._out
        transport = self.transport
        if transport is None:
            return
        wrote = False
        while out and not self._write_paused and not self._closing:
            batch: list[Any] = []
            room = PUMP_BYTES
            has_slice = False
            while out and room > 0:
                piece = out[0]
                n = len(piece)
                if type(piece) is FileSlice:
                    has_slice = True
                    if n > room:  # the rest of the slice waits, unread
                        out[0] = piece.part(room, n - room)
                        piece = piece.part(0, room)
                        n = room
                    else:
                        out.popleft()
                else:
                    out.popleft()
                batch.append(piece)
                room -= n
            if has_slice and self.sends_file_slices and transport.get_write_buffer_size() == 0:
                rest = self._send_direct(batch)
                if rest is None:
                    return
            else:
                try:
                    rest = [piece.read() if type(piece) is FileSlice else piece for piece in batch]
                except OSError as e:  # a slice went stale or its read failed
                    self._abort(f"cannot send a response: {e}")
                    return
            if rest:
                transport.writelines(rest)
            wrote = True
        if wrote:
            self.last_active_s = self._loop.time()

    def _send_direct(self, out: list[Any]) -> list[Any] | None:
        """Write ``out`` (bytes and FileSlices) to the socket while it takes them at once.

        Slices are read into the scratch buffer and written with the bytes around them in
        one ``writev``, as many as the buffer holds at a time. Returns what is left for the
        transport, as bytes of its own (nothing refers to the scratch buffer); None when
        the connection was closed instead (a stale slice, a failed read or write).
        """
        for piece in out:
            if type(piece) is FileSlice and not piece.usable():  # before writing any of it
                self._abort(f"cannot send a response: {piece!r} was truncated or closed since it was read")
                return None
        fd = self._fd
        rest: list[Any] = []
        i, n = 0, len(out)
        try:
            if self.transport is not None and self.transport.get_write_buffer_size() == 0:
                scratch = _scratch_buffer()
                room = len(scratch)
                while i < n:
                    iov: list[Any] = []
                    used = 0
                    while i < n and len(iov) < _IOV_MAX:
                        piece = out[i]
                        if type(piece) is FileSlice:
                            if piece.length > room:
                                if iov:
                                    break  # send what is gathered first
                                piece = piece.read()  # larger than the scratch buffer: its own bytes
                            elif piece.length > room - used:
                                break
                            else:
                                view = scratch[used:used + piece.length]
                                piece.read_into(view)
                                used += piece.length
                                piece = view
                        iov.append(piece)
                        i += 1
                    try:
                        sent = os.writev(fd, iov)
                    except BlockingIOError:
                        sent = 0
                    for k, piece in enumerate(iov):
                        if sent >= len(piece):
                            sent -= len(piece)
                            continue
                        # the socket is full: the rest waits in the transport, copied out
                        # of the scratch buffer
                        left = [memoryview(piece)[sent:] if sent else piece, *iov[k + 1:]]
                        rest = [bytes(p) if type(p) is memoryview and p.obj is scratch.obj else p for p in left]
                        break
                    if rest:
                        break
            for piece in out[i:]:
                rest.append(piece.read() if type(piece) is FileSlice else piece)
        except (BrokenPipeError, ConnectionResetError) as e:  # the client went away
            log.info("connection %s from %s: %s while sending a response; closing", self.connection_id,
                     self.peer, e)
            self._abort(None)
            return None
        except OSError as e:  # reading a slice failed
            self._abort(f"cannot send a response: {e}")
            return None
        return rest

    def _muted(self) -> bool:
        """Whether to serve no further request for now (see Backpressure above)."""
        return (self._write_paused or bool(self._out) or self._held > UNSENT_BYTES
                or len(self._slots) >= self._max_inflight or self._throttle_handle is not None)

    def _maybe_pause(self) -> None:
        if not self._reading_paused and self.transport is not None and (
            self._muted() or self._memory_wait is not None
        ):
            self._reading_paused = True
            self.transport.pause_reading()

    def _maybe_resume(self) -> None:
        if (
            self._reading_paused
            and self._memory_wait is None
            and not self._muted()
            and not self.broker.shutting_down
            and self.transport is not None
            and not self._closing
        ):
            self._reading_paused = False
            self.transport.resume_reading()
            if not self._serve_pending and self._decoder.buffered:
                # requests received while muted: served from the loop, not from inside a flush
                self._serve_pending = True
                self._loop.call_soon(self._serve_frames)

    def _abort(self, reason: str | None) -> None:
        if reason:
            log.warning("connection %s from %s: %s; closing", self.connection_id, self.peer, reason)
        self._closing = True
        if self.transport is not None:
            self.transport.abort()

    def close_idle(self, idle_s: float) -> None:
        """Close this connection: nothing was received or sent for ``idle_s`` seconds."""
        if self._closing:
            return
        waiting = " while waiting for request memory" if self._memory_wait is not None else ""
        log.info("connection %s from %s: idle for %.1f s%s (connections.max.idle.ms); closing",
                 self.connection_id, self.peer, idle_s, waiting)
        self._abort(None)

    def begin_shutdown(self) -> None:
        """Stop reading; close once every accepted request has been answered."""
        if self.transport is None:
            return
        if not self._reading_paused:
            self._reading_paused = True
            self.transport.pause_reading()
        if not self._slots and not self._out:
            self.transport.close()

    @property
    def inflight(self) -> int:
        return len(self._slots)


def _first_step(coro: Any) -> Any:
    """Run an ``async`` handler up to its first wait: its answer when it needs none (a Fetch
    with records, a heartbeat that writes nothing), else a coroutine that goes on from
    there, for the task that waits. An answer that needs no wait then costs no task and
    no extra pass of the event loop. Not for connections with security settings, whose
    handlers may use the task they run in (``asyncio.current_task``)."""
    try:
        waiting_on = coro.send(None)
    except StopIteration as done:
        return done.value
    return _resume(coro, waiting_on)


class _Resumed:
    """Awaitable: a coroutine already run up to its first wait, driven on from there."""

    __slots__ = ("coro", "waiting_on")

    def __init__(self, coro: Any, waiting_on: Any) -> None:
        self.coro = coro
        self.waiting_on = waiting_on

    def __await__(self) -> Any:
        coro, waiting_on = self.coro, self.waiting_on
        while True:
            try:
                value = yield waiting_on
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as e:  # thrown in by the task (a cancellation)
                try:
                    waiting_on = coro.throw(e)
                except StopIteration as done:
                    return done.value
            else:
                try:
                    waiting_on = coro.send(value)
                except StopIteration as done:
                    return done.value


async def _resume(coro: Any, waiting_on: Any) -> Any:
    return await _Resumed(coro, waiting_on)


_IOV_MAX = 512
"""Pieces per writev call (Linux takes at most 1024)."""
PUMP_BYTES = 1 << 20
"""Response bytes handed to the socket and the transport per pass of ``_pump``."""
UNSENT_BYTES = 1 << 20
"""Encoded responses waiting behind an unanswered request beyond which a connection is muted."""
SCRATCH_BYTES = 4 << 20
"""Size of the buffer FileSlices are read into before they are written (see _send_direct)."""
_local = threading.local()


def _scratch_buffer() -> memoryview:
    """This thread's scratch buffer for slices being sent: allocated on first use and then
    reused, so its pages stay mapped. The event loop writes from it synchronously; nothing
    that outlives a ``_send_direct`` call refers to it. One per thread, so that brokers on
    event loops in different threads of one process never share it."""
    scratch: memoryview | None = getattr(_local, "scratch", None)
    if scratch is None or len(scratch) != SCRATCH_BYTES:
        scratch = _local.scratch = memoryview(bytearray(SCRATCH_BYTES))
    return scratch


_FAILURES_SEEN: set[tuple[Any, ...]] = set()
_FAILURES_REMEMBERED = 1000


def _log_failure(message: str, *args: Any, exc: BaseException) -> None:
    """Log an unexpected exception (a bug): with its traceback the first time one of its type
    is raised at its place, as one line after that, so that a client repeating a request
    that trips the bug does not flood the log with tracebacks."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    where = (type(exc), tb.tb_frame.f_code.co_filename, tb.tb_lineno) if tb is not None else (type(exc), str(exc))
    if where in _FAILURES_SEEN:
        log.error(message + " (%s: %s; traceback logged before)", *args, type(exc).__name__, exc)
        return
    if len(_FAILURES_SEEN) < _FAILURES_REMEMBERED:
        _FAILURES_SEEN.add(where)
    log.error(message, *args, exc_info=exc)
