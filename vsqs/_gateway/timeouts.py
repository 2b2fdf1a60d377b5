"""How long a client may take to send a request: the head within
``header_timeout`` seconds, the body within ``body_timeout`` more.

uvicorn times out only idle keep-alive connections (after a response), and
any byte received cancels even that: a connection that never finishes its
request head, new or kept alive, stays open for ever and holds a slot of
``--limit-concurrency``; and its httptools protocol buffers a partial head
without bound. No server option covers that (uvicorn has none; an ASGI app is
called only once a head is whole), so:

* :class:`HeadDeadline` is the connection's half: an ``asyncio.Protocol``
  that uvicorn makes through its documented ``http`` option (a protocol
  class, called with uvicorn's keyword arguments), and that makes uvicorn's
  own protocol (``auto``: httptools when installed, else h11) and passes it
  every call, unchanged. It subclasses nothing and reads nothing of it: it
  sees the bytes that come in, finds where a head ends (the blank line), and
  learns from the ASGI half when a request's body is in and its answer out.
  A head has ``header_timeout`` seconds from when the connection opened or
  the previous answer went out, not moved by bytes trickling in; past it the
  connection is closed (with a 408 if part of a head had come). A head is
  at most ``MAX_REQUEST_HEAD_BYTES``, counted as it comes (a 431 and the
  connection closed past it), a pipelined one too, from the start of a
  request without a body, else from the end of its body (or from the
  answer, for a request answered before its body was read: a refusal,
  whose declared rest is then no head's). Blank lines before a request
  line, which the parsers skip, count as head but never end one. Where a
  body ends only uvicorn's parser knows: the answer to a request whose
  chunked body was not read in full closes the connection (``Connection:
  close``; clients open another), and requests pipelined in one read with an
  earlier one are not counted apart (a read is scanned for the first head's
  end only).
* :class:`BodyDeadline` is the ASGI half: once a request has started, its
  body must have come in full within ``body_timeout`` seconds, else the app's
  read fails with a 408 (``Connection: close``) in the face's format; and it
  tells the request's :class:`HeadDeadline` (found in the context uvicorn's
  protocol makes the request's task in: a context variable the wrapper sets
  around each call into it) when the body is in and the answer out.

A request costs at most ``header_timeout + body_timeout`` seconds of a slot
before it is answered; what a reverse proxy must still do is in
docs/gateway.md (Timeouts). The seam the wrapper rests on is the ``http``
option's calling convention and ``asyncio.Protocol``; uvicorn's
``reset_contextvars`` option would cut the link to the ASGI half (the
gateway does not set it; a request would then meet the head deadline while
it is answered, which ``tests/gateway/test_fast_paths.py`` would show).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
from typing import Any

from starlette.exceptions import HTTPException as StarletteHTTPException
from uvicorn.protocols.http.auto import AutoHTTPProtocol

from vsqs._gateway.asgi import ASGIApp, Message, Receive, Scope, Send
from vsqs._gateway.limits import MAX_REQUEST_HEAD_BYTES

_TIMED_OUT = b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
_HEAD_TOO_LARGE = (b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\n"
                   b"connection: close\r\n\r\n")
_HEAD_END = b"\r\n\r\n"

# the connection whose protocol is running: set by HeadDeadline around each call into uvicorn's
# protocol, so the task it makes for a request (which copies the context) finds its connection
_connection: contextvars.ContextVar[HeadDeadline | None] = contextvars.ContextVar("vsqs_connection", default=None)


class HeadDeadline(asyncio.Protocol):
    """uvicorn's HTTP protocol for one connection, with a deadline and a size
    bound for each request head (see the module's docstring)."""

    def __init__(self, *, header_timeout: float, http: Any = AutoHTTPProtocol, **uvicorn: Any) -> None:
        self.inner: asyncio.Protocol = http(**uvicorn)
        self.header_timeout = header_timeout
        self.transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._counting = True  # the bytes coming are a head's (until its blank line)
        self._head_size = 0  # bytes of that head so far
        self._tail = b""  # the last bytes of it, for a blank line split between reads
        self._head_waiting = False  # a whole head came whose request has not started (pipelined)
        self._begun = False  # the head has a byte other than the blank lines a parser skips before it
        self._body_pending = False  # the request started has a body to come: the next head starts after it
        self._skip = 0  # bytes of a body the app answered without reading, still to come: no head's
        self._lost = False

    # -- asyncio.Protocol, passed on ------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # (uvloop's is no asyncio.Transport subclass)
        self._arm()
        token = _connection.set(self)
        try:
            self.inner.connection_made(transport)
        finally:
            _connection.reset(token)

    def data_received(self, data: bytes) -> None:
        if self._counting and not self._counted(data):
            self._refuse(_HEAD_TOO_LARGE)
            return
        token = _connection.set(self)
        try:
            self.inner.data_received(data)
        finally:
            _connection.reset(token)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True  # (an answer sent after this arms no timer)
        self._disarm()
        self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    # -- what the ASGI half tells ------------------------------------------------------------

    def request_started(self, *, has_body: bool) -> None:
        """A head has come whole (the app is called): no deadline while it is
        answered. Without a body, what comes next is the next request's head,
        counted from now (a long poll may read its empty body only at its end)."""
        self._disarm()
        self._head_waiting = False
        self._body_pending = has_body
        if has_body:
            self._counting = False
        else:
            self._start_head()

    def body_came(self) -> None:
        """The request's body is in: what comes next is the next request's head."""
        if self._body_pending:
            self._body_pending = False
            self._start_head()

    def answered(self, unread: int = 0) -> None:
        """The answer went out: the next head has ``header_timeout`` from now.
        ``unread``: bytes of the request's body the app did not read (a refusal
        before it), which are still to come and are no head's."""
        if not self._head_waiting:  # (a pipelined request's head has come: it starts now)
            if not self._counting:
                self._start_head()
                self._skip = unread
            self._body_pending = False
            self._arm()

    # -- the head ------------------------------------------------------------------------

    def _start_head(self) -> None:
        self._counting = True
        self._head_size = 0
        self._tail = b""
        self._begun = False
        self._skip = 0

    def _counted(self, data: bytes) -> bool:
        """Counts ``data`` into the head it belongs to; False past MAX_REQUEST_HEAD_BYTES.
        (The deadline runs on until the request starts: the parser may yet refuse the head.)"""
        if self._skip:  # the rest of a body the app did not read
            skipped = min(self._skip, len(data))
            self._skip -= skipped
            data = data[skipped:]
        if not self._begun:  # blank lines before a request line, which parsers skip: counted, no head's end
            start = len(data) - len(data.lstrip(b"\r\n"))
            self._head_size += start
            data = data[start:]
            if not data:
                return self._head_size <= MAX_REQUEST_HEAD_BYTES
            self._begun = True
        across = (self._tail + data[:3]).find(_HEAD_END) if self._tail else -1
        if across != -1:
            self._head_size += across - len(self._tail) + len(_HEAD_END)
        elif (end := data.find(_HEAD_END)) != -1:
            self._head_size += end + len(_HEAD_END)
        else:
            self._head_size += len(data)
            self._tail = (self._tail + data)[-3:]
            return self._head_size <= MAX_REQUEST_HEAD_BYTES
        self._counting = False  # the body, if any, is not a head's
        self._head_waiting = True
        return self._head_size <= MAX_REQUEST_HEAD_BYTES

    def _arm(self) -> None:
        self._disarm()
        if self._lost:
            return
        self._timer = asyncio.get_running_loop().call_later(self.header_timeout, self._timed_out)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _timed_out(self) -> None:
        self._timer = None
        self._refuse(_TIMED_OUT if self._head_size else b"")

    def _refuse(self, answer: bytes) -> None:
        self._disarm()
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        if answer:
            transport.write(answer)
        transport.close()


def protocol_factory(header_timeout: float, http: Any = AutoHTTPProtocol) -> functools.partial[Any]:
    """What uvicorn's ``http`` option takes: :class:`HeadDeadline` around the
    protocol ``http`` (uvicorn's choice by default), as a partial of
    module-level names, so it travels to ``--workers`` processes."""
    return functools.partial(HeadDeadline, header_timeout=header_timeout, http=http)


class BodyDeadline:
    """Fails the app's body read with a 408 (``Connection: close``) when the body
    has not come in full ``seconds`` after the request started; and tells the
    request's connection (:class:`HeadDeadline`, when there is one) that the
    request started, that its body came, that its answer went out. It must be
    the outermost layer, so that it sees every answer, refusals included."""

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
        received = 0  # bytes of the body the app has read
        connection = _connection.get()

        async def timed() -> Message:
            nonlocal complete, received
            if complete:  # the body is in: reads now wait for a disconnect (long polls)
                return await receive()
            message = await _before(loop, deadline, receive)
            if message is None:
                raise StarletteHTTPException(
                    408, f"the request body did not come in full within {self.seconds:g} s",
                    headers={"Connection": "close"})
            received += len(message.get("body", b""))
            if message["type"] != "http.request" or not message.get("more_body", False):
                complete = True
                if connection is not None:
                    connection.body_came()
            return message

        if connection is None:
            await self.app(scope, timed, send)
            return

        length = _declared_length(scope)

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start" and length is None and not complete:
                message = _closing(message)  # where the rest of a chunked body ends is the parser's to know
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                # before anything else runs: a pipelined request starts after
                connection.answered(0 if complete or length is None else max(0, length - received))

        connection.request_started(has_body=length != 0)
        await self.app(scope, timed, sending)


def _closing(start: Message) -> Message:
    """``start`` (an ``http.response.start``) with ``Connection: close``: the answer
    to a request whose chunked body was not read in full ends its connection, as
    only the parser can tell the rest of that body from the next request's head."""
    headers = [(name, value) for name, value in start.get("headers", ()) if name.lower() != b"connection"]
    return {**start, "headers": [*headers, (b"connection", b"close")]}


def _declared_length(scope: Scope) -> int | None:
    """The request body's Content-Length: 0 for none (no body), None for a
    chunked body or a length that is no number (its end is the parser's to find)."""
    length = 0
    for name, value in scope["headers"]:
        if name == b"transfer-encoding":
            return None
        if name == b"content-length":
            if not value.isdigit() or len(value) > 18:
                return None
            length = int(value)
    return length


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
