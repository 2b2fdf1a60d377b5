"""How long a client may take to send a request: the head within
``header_timeout`` seconds, the body within ``body_timeout`` more.

uvicorn times out only idle keep-alive connections (after a response), and
any byte received cancels even that: a connection that never finishes its
request head, new or kept alive, stays open for ever and holds a slot of
``--limit-concurrency``. So:

* :class:`HttpToolsHeadDeadlineProtocol` (httptools installed) and
  :class:`HeadDeadlineProtocol` (h11) are uvicorn's protocols with a deadline
  for each request head, armed when the connection opens and after each
  response, and not moved by the bytes that trickle in; past it the
  connection is closed (with a 408 if part of a head had come). A head is at
  most ``MAX_REQUEST_HEAD_BYTES`` (h11 answers 400 past it, the httptools one
  431).
* :class:`BodyDeadline` is the ASGI half: once a request has started, its
  body must have come in full within ``body_timeout`` seconds, else the app's
  read fails with a 408 (``Connection: close``) in the face's format.

A request costs at most ``header_timeout + body_timeout`` seconds of a slot
before it is answered; what a reverse proxy must still do is in
docs/gateway.md (Timeouts).
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any

from starlette.exceptions import HTTPException as StarletteHTTPException
from uvicorn.protocols.http.h11_impl import H11Protocol

from vsqs._gateway.asgi import ASGIApp, Message, Receive, Scope, Send
from vsqs._gateway.limits import MAX_REQUEST_HEAD_BYTES

try:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError:  # httptools is not installed: h11
    HttpToolsProtocol = None  # type: ignore[assignment,misc]

_TIMED_OUT = b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
_HEAD_TOO_LARGE = (b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\n"
                   b"connection: close\r\n\r\n")


class _HeadTooLarge(Exception):
    """Raised in the parser's callback of a whole head over ``MAX_REQUEST_HEAD_BYTES``."""


class _HeadDeadline:
    """The deadline for each request head, for either of uvicorn's HTTP protocols
    (a mixin before the protocol class): armed when the connection opens and
    after each response, not moved by the bytes that trickle in; past it the
    connection is closed, with a 408 if part of a head had come."""

    header_timeout: float
    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport

    def _init_deadline(self, header_timeout: float) -> None:
        self.header_timeout = header_timeout
        self._head_timer: asyncio.TimerHandle | None = None
        self._head_started = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        self._await_head()

    def data_received(self, data: bytes) -> None:
        if self._head_timer is not None and data:
            self._head_started = True
        super().data_received(data)  # type: ignore[misc]

    def connection_lost(self, exc: Exception | None) -> None:
        self._head_came()
        super().connection_lost(exc)  # type: ignore[misc]

    def _await_head(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
        self._head_started = False
        self._head_timer = self.loop.call_later(self.header_timeout, self._head_timed_out)

    def _head_came(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.transport.is_closing():
            return
        if self._head_started:
            self.transport.write(_TIMED_OUT)
        self.transport.close()


class HeadDeadlineProtocol(_HeadDeadline, H11Protocol):
    """uvicorn's h11 protocol, with a deadline for each request head (h11 bounds
    the head's size: ``h11_max_incomplete_event_size``)."""

    def __init__(self, *args: Any, header_timeout: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._init_deadline(header_timeout)
        self._cycle_awaited: object = None  # the request cycle before the head awaited

    def handle_events(self) -> None:
        super().handle_events()
        if self._head_timer is not None and self.cycle is not self._cycle_awaited:
            self._head_came()  # a new request's head has come

    def on_response_complete(self) -> None:
        self._cycle_awaited = self.cycle
        self._await_head()  # first: the super call may parse a pipelined head at once
        super().on_response_complete()


if HttpToolsProtocol is not None:

    class HttpToolsHeadDeadlineProtocol(_HeadDeadline, HttpToolsProtocol):
        """uvicorn's httptools protocol (several times cheaper than h11), with a
        deadline for each request head and a bound on its size: past
        ``MAX_REQUEST_HEAD_BYTES``, a 431 and the connection closed (h11 has
        a bound built in; httptools has none). A head is counted as it comes,
        from the end of the previous request's body (a pipelined head comes
        while a request is answered, before its deadline is armed), and a
        whole head measured when parsed (one that came in a single read)."""

        def __init__(self, *args: Any, header_timeout: float, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._init_deadline(header_timeout)
            # A head's bytes are counted from the end of the previous request's body, not only
            # while the deadline runs: the next request's head may come (pipelined) while this
            # one is answered (a long poll reads on, for the client's disconnect), and httptools
            # buffers a partial header whole, so an uncounted one grew without bound.
            self._reading_head = True  # between a request's body and the next head's end
            self._heads = 0  # heads parsed on this connection
            self._head_size = 0  # bytes of the head being read, as far as counted
            self._head_too_large = False

        def data_received(self, data: bytes) -> None:
            reading, heads = self._reading_head, self._heads
            super().data_received(data)
            if not self._reading_head or self.transport.is_closing():
                return
            if reading and heads == self._heads:
                self._head_size += len(data)  # the whole chunk is of this head
            # else the head began inside this chunk: counted from the next one (a read's worth
            # at most goes uncounted; a chunk's start may be a previous request's body)
            if self._head_size > MAX_REQUEST_HEAD_BYTES:
                self._head_came()
                self.transport.write(_HEAD_TOO_LARGE)
                self.transport.close()

        def on_headers_complete(self) -> None:
            self._head_came()
            self._reading_head = False
            self._heads += 1
            # a head that came whole in one read was never counted above: its size, as sent
            # in the usual form (the request line, "name: value" lines, the blank line)
            size = (len(self.parser.get_method()) + len(self.url) + len(" HTTP/1.1\r\n\r\n") + 1
                    + sum(len(name) + len(value) + 4 for name, value in self.headers))
            if size > MAX_REQUEST_HEAD_BYTES:
                self._head_too_large = True
                raise _HeadTooLarge  # stops the parser; uvicorn answers its error (below)
            super().on_headers_complete()

        def send_400_response(self, msg: str) -> None:
            if not self._head_too_large:
                super().send_400_response(msg)
            elif not self.transport.is_closing():
                self.transport.write(_HEAD_TOO_LARGE)
                self.transport.close()

        def on_message_complete(self) -> None:
            self._reading_head = True  # what comes next is the next request's head
            self._head_size = 0
            super().on_message_complete()

        def on_response_complete(self) -> None:
            if not self.pipeline:  # a pipelined request's head has come already
                self._await_head()
            super().on_response_complete()


def protocol_factory(header_timeout: float) -> functools.partial[Any]:
    """What uvicorn's ``http`` takes: a callable that makes the protocol (a partial
    of a module-level class, so it travels to ``--workers`` processes). The
    httptools one when httptools is installed (the ``server`` extra has it),
    else the h11 one."""
    if HttpToolsProtocol is not None:
        return functools.partial(HttpToolsHeadDeadlineProtocol, header_timeout=header_timeout)
    return functools.partial(HeadDeadlineProtocol, header_timeout=header_timeout)


class BodyDeadline:
    """Fails the app's body read with a 408 (``Connection: close``) when the body
    has not come in full ``seconds`` after the request started."""

    def __init__(self, app: ASGIApp, seconds: float) -> None:
        self.app = app
        self.seconds = seconds

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.seconds
        complete = False

        async def timed() -> Message:
            nonlocal complete
            if complete:  # the body is in: reads now wait for a disconnect (long polls)
                return await receive()
            message = await _before(loop, deadline, receive)
            if message is None:
                raise StarletteHTTPException(
                    408, f"the request body did not come in full within {self.seconds:g} s",
                    headers={"Connection": "close"})
            if message["type"] != "http.request" or not message.get("more_body", False):
                complete = True
            return message

        await self.app(scope, timed, send)


async def _before(loop: asyncio.AbstractEventLoop, deadline: float, receive: Receive) -> Message | None:
    """``await receive()``, or None once ``deadline`` (the loop's time) has passed: a
    timer that cancels the reading task, several times cheaper than a cancel
    scope (this runs for every request, and the body is most often in already)."""
    task = asyncio.current_task()
    assert task is not None
    expired = False

    def expire() -> None:
        nonlocal expired
        expired = True
        task.cancel()

    timer = loop.call_at(deadline, expire)
    try:
        return await receive()
    except asyncio.CancelledError:
        if not expired:
            raise
        uncancel = getattr(task, "uncancel", None)  # Python 3.11+ counts cancellations
        if uncancel is not None:
            uncancel()  # the cancellation was this deadline's, and it is answered
        return None
    finally:
        timer.cancel()
