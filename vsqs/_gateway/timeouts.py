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
  follows the bytes that come in as HTTP/1.1 frames them (:class:`Framing`:
  where each head ends, and each body, by its Content-Length or its chunks,
  whatever the app reads of it), and learns from the ASGI half when a
  request starts and when its answer is out. A head has ``header_timeout``
  seconds from when the connection opened or the previous answer went out
  (a head that came whole while an earlier request was answered starts at
  once), not moved by bytes trickling in; past it the connection is closed
  (with a 408 if part of a head had come). A head, pipelined or not, and a
  chunked body's trailers are at most ``MAX_REQUEST_HEAD_BYTES``, counted as
  they come (a 431 and the connection closed past it); blank lines before a
  request line, which the parsers skip, count as head but never end one. A
  request whose framing it cannot follow, which the parsers refuse, ends
  the connection at its answer.
* :class:`BodyDeadline` is the ASGI half: once a request has started, its
  body must have come in full within ``body_timeout`` seconds, else the app's
  read fails with a 408 (``Connection: close``) in the face's format; and it
  tells the request's :class:`HeadDeadline` (found in the context uvicorn's
  protocol makes the request's task in: a context variable the wrapper sets
  around each call into it) when the request starts and its answer is out.

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
import re
from typing import Any

from starlette.exceptions import HTTPException as StarletteHTTPException
from uvicorn.protocols.http.auto import AutoHTTPProtocol

from vsqs._gateway.asgi import ASGIApp, Message, Receive, Scope, Send
from vsqs._gateway.limits import MAX_REQUEST_HEAD_BYTES

_TIMED_OUT = b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
_HEAD_TOO_LARGE = (b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\n"
                   b"connection: close\r\n\r\n")

# the connection whose protocol is running: set by HeadDeadline around each call into uvicorn's
# protocol, so the task it makes for a request (which copies the context) finds its connection
_connection: contextvars.ContextVar[HeadDeadline | None] = contextvars.ContextVar("vsqs_connection", default=None)


class HeadTooLarge(Exception):
    """A request head (or a chunk's size line, or a chunked body's trailers) past its bound."""


_HEAD_END = re.compile(rb"\n\r?\n")  # (h11 takes bare LF line ends too)
_FRAMING = re.compile(rb"\n(content-length|transfer-encoding|upgrade)[ \t]*:[ \t]*([^\r\n]*)", re.IGNORECASE)
_CONNECTION_UPGRADE = re.compile(rb"\nconnection[ \t]*:[^\r\n]*\bupgrade\b", re.IGNORECASE)
_BLANK = re.compile(rb"[\r\n]*")
_HEX = re.compile(rb"[0-9a-fA-F]+")
_KEPT = 256  # bytes kept of a chunk-size or trailer line (its size, or whether it is empty)

# where the bytes coming in are
_HEAD, _LENGTH, _CHUNK_LINE, _CHUNK_DATA, _TRAILERS = range(5)


class Framing:
    """Where each request's head and body end in the bytes a connection
    receives, found as HTTP/1.1 frames them (RFC 9112: Content-Length, else
    chunked) and as the parser does, whatever the app reads: heads are
    measured against ``max_head`` (blank lines before a request line, which
    parsers skip, included), bodies skipped; each chunk-size line and a
    chunked body's trailers are measured as a head. An upgrade request
    (``Connection: upgrade`` and ``Upgrade``) ends at its head, as llhttp
    reads it. A framing the parsers refuse (a Transfer-Encoding not ending in
    chunked, a Content-Length that is no number or past 2**64, a chunk size
    that is no hex number or past 16 digits) makes it ``opaque``: it takes no
    more bytes."""

    def __init__(self, max_head: int = MAX_REQUEST_HEAD_BYTES) -> None:
        self.max_head = max_head
        self.opaque = False
        self._state = _HEAD
        self._head = bytearray()  # the head so far, from its first byte after blank lines
        self._blank = 0  # bytes of blank lines before it
        self._left = 0  # bytes of a body (or of a chunk and its CRLF) still to come
        self._line = bytearray()  # the start of a chunk-size or trailer line (_KEPT bytes at most)
        self._measured = 0  # bytes of a chunk's size line, or of a chunked body's trailers, so far

    @property
    def in_head(self) -> bool:
        """Part of a head has come (blank lines before it included)."""
        return self._state == _HEAD and bool(self._head or self._blank)

    def feed(self, data: bytes) -> int:
        """Takes the next bytes received; how many heads they ended.
        Raises HeadTooLarge past the bound."""
        heads = 0
        at, size = 0, len(data)
        while at < size and not self.opaque:
            state = self._state
            if state == _HEAD:
                at, ended = self._in_head(data, at)
                heads += ended
            elif state == _LENGTH or state == _CHUNK_DATA:
                step = min(self._left, size - at)
                self._left -= step
                at += step
                if not self._left:
                    self._state = _HEAD if state == _LENGTH else _CHUNK_LINE
            else:
                at = self._in_line(data, at)
        return heads

    def _in_head(self, data: bytes, at: int) -> tuple[int, bool]:
        if not self._head and data[at] in b"\r\n":  # blank lines before a request line: no head's end
            start = at
            at = _BLANK.match(data, at).end()  # type: ignore[union-attr]  # (it matches the empty string)
            self._blank += at - start
            if self._blank > self.max_head:
                raise HeadTooLarge
            if at == len(data):
                return at, False
        room = self.max_head - self._blank - len(self._head)  # head bytes the bound still allows
        if not self._head:  # the head starts in this read: found in place, no copy
            end = _HEAD_END.search(data, at, at + room)
            if end is not None:
                self._body(data, at, end.end())
                self._blank = 0
                return end.end(), True
        piece = data[at : at + room + 1]  # (one byte past the bound tells a head too large)
        before = len(self._head)
        self._head += piece
        end = _HEAD_END.search(self._head, max(0, before - 2))  # (an end may begin in what came before)
        if end is None or self._blank + end.end() > self.max_head:
            if self._blank + len(self._head) > self.max_head:
                raise HeadTooLarge
            return at + len(piece), False
        self._body(self._head, 0, end.end())
        self._head.clear()
        self._blank = 0
        return at + end.end() - before, True

    def _body(self, head: bytes | bytearray, start: int, end: int) -> None:
        """What the head (``head[start:end]``) says of the body that follows."""
        fields = _FRAMING.findall(head, start, end)
        if not fields:
            return
        if len(fields) == 1 and fields[0][0].lower() == b"content-length" and fields[0][1].strip().isdigit():
            length = fields[0][1].strip()
        else:
            names = [name.lower() for name, _ in fields]
            if b"upgrade" in names and _CONNECTION_UPGRADE.search(head, start, end):
                return  # llhttp ends an upgrade request at its head, and reads on as a new request
            codings = [value for (_, value), name in zip(fields, names, strict=True) if name == b"transfer-encoding"]
            if codings:  # (over any Content-Length)
                if b",".join(codings).split(b",")[-1].strip().lower() != b"chunked":
                    self.opaque = True
                self._state = _CHUNK_LINE
                self._measured = 0
                return
            declared = {value.strip() for (_, line), name in zip(fields, names, strict=True)
                        if name == b"content-length" for value in line.split(b",")}
            length = declared.pop() if len(declared) == 1 else b""
        if not length.isdigit() or len(length.lstrip(b"0")) > 20:  # (past 2**64: the parsers refuse it)
            self.opaque = True
        elif length.strip(b"0"):
            self._left = int(length)
            self._state = _LENGTH

    def _in_line(self, data: bytes, at: int) -> int:
        """A chunk's size line, or a trailer line (an empty one ends the body);
        each chunk-size line, and the trailers together, are measured as a head."""
        newline = data.find(b"\n", at)
        end = len(data) if newline == -1 else newline + 1
        self._measured += end - at
        if self._measured > self.max_head:
            raise HeadTooLarge
        if len(self._line) < _KEPT:
            self._line += data[at : min(end, at + _KEPT - len(self._line))]
        if newline == -1:
            return end
        line = bytes(self._line).rstrip(b"\r\n")
        self._line.clear()
        if self._state == _TRAILERS:
            if not line:
                self._state = _HEAD
            return end
        self._measured = 0
        digits = line.split(b";", 1)[0].strip(b" \t")
        if len(digits) >= _KEPT:  # a size we did not keep whole: leading zeros past reason
            raise HeadTooLarge
        if _HEX.fullmatch(digits) is None or len(digits.lstrip(b"0")) > 16:
            self.opaque = True  # (the parsers refuse it)
        elif chunk := int(digits, 16):
            self._left = chunk + 2  # (and its CRLF)
            self._state = _CHUNK_DATA
        else:
            self._state = _TRAILERS
        return end


class HeadDeadline(asyncio.Protocol):
    """uvicorn's HTTP protocol for one connection, with a deadline and a size
    bound for each request head (see the module's docstring)."""

    def __init__(self, *, header_timeout: float, http: Any = AutoHTTPProtocol, **uvicorn: Any) -> None:
        self.inner: asyncio.Protocol = http(**uvicorn)
        self.header_timeout = header_timeout
        self.transport: asyncio.Transport | None = None
        self._framing = Framing()
        self._timer: asyncio.TimerHandle | None = None
        self._waiting = 0  # heads that came whole, whose requests have not started (pipelined)
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
        if not self._framing.opaque:
            try:
                self._waiting += self._framing.feed(data)
            except HeadTooLarge:
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

    def request_started(self) -> None:
        """A head has come whole (the app is called): no deadline while it is answered."""
        self._disarm()
        self._waiting = max(0, self._waiting - 1)

    def answered(self) -> None:
        """The answer went out: the next head has ``header_timeout`` from now,
        unless it has come already (pipelined: its request starts now). After
        a request whose framing the wrapper could not follow, the connection
        ends (the parser has most often refused it already)."""
        if self._framing.opaque:
            self._refuse(b"")
        elif not self._waiting:
            self._arm()

    # -- the deadline ----------------------------------------------------------------------

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
        self._refuse(_TIMED_OUT if self._framing.in_head else b"")

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
    request started and that its answer went out. It must be the outermost
    layer, so that it sees every answer, refusals included."""

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

        connection = _connection.get()
        if connection is None:
            await self.app(scope, timed, send)
            return

        async def sending(message: Message) -> None:
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                connection.answered()  # before anything else runs: a pipelined request starts after

        connection.request_started()
        await self.app(scope, timed, sending)


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
