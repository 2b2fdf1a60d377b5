"""How long a client may take to send a request: the head within
``header_timeout`` seconds, the body within ``body_timeout`` more.

uvicorn times out only idle keep-alive connections (after a response), and
any byte received cancels even that: a connection that never finishes its
request head, new or kept alive, stays open for ever and holds a slot of
``--limit-concurrency``. So:

* :class:`HeadDeadlineProtocol` is uvicorn's h11 protocol with a deadline for
  each request head, armed when the connection opens and after each response,
  and not moved by the bytes that trickle in; past it the connection is
  closed (with a 408 if part of a head had come). Its head is at most
  ``MAX_REQUEST_HEAD_BYTES`` (h11 answers 400 past it).
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

import anyio
from starlette.exceptions import HTTPException as StarletteHTTPException
from uvicorn.protocols.http.h11_impl import H11Protocol

from vsqs._gateway.asgi import ASGIApp, Message, Receive, Scope, Send

_TIMED_OUT = b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"


class HeadDeadlineProtocol(H11Protocol):
    """uvicorn's h11 protocol, with a deadline for each request head."""

    def __init__(self, *args: Any, header_timeout: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.header_timeout = header_timeout
        self._head_timer: asyncio.TimerHandle | None = None
        self._cycle_awaited: object = None  # the request cycle before the head awaited
        self._head_started = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:  # type: ignore[override]
        super().connection_made(transport)  # type: ignore[arg-type]
        self._await_head()

    def data_received(self, data: bytes) -> None:
        if self._head_timer is not None and data:
            self._head_started = True
        super().data_received(data)

    def handle_events(self) -> None:
        super().handle_events()
        if self._head_timer is not None and self.cycle is not self._cycle_awaited:
            self._head_timer.cancel()  # a new request's head has come
            self._head_timer = None

    def on_response_complete(self) -> None:
        self._await_head()  # first: the super call may parse a pipelined head at once
        super().on_response_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        super().connection_lost(exc)

    def _await_head(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
        self._cycle_awaited = self.cycle
        self._head_started = False
        self._head_timer = self.loop.call_later(self.header_timeout, self._head_timed_out)

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.transport.is_closing():
            return
        if self._head_started:
            self.transport.write(_TIMED_OUT)
        self.transport.close()


def protocol_factory(header_timeout: float) -> functools.partial[HeadDeadlineProtocol]:
    """What uvicorn's ``http`` takes: a callable that makes the protocol (a partial
    of a module-level class, so it travels to ``--workers`` processes)."""
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
        deadline = anyio.current_time() + self.seconds
        complete = False

        async def timed() -> Message:
            nonlocal complete
            if complete:  # the body is in: reads now wait for a disconnect (long polls)
                return await receive()
            with anyio.move_on_after(max(0.0, deadline - anyio.current_time())) as waiting:
                message = await receive()
            if waiting.cancelled_caught:
                raise StarletteHTTPException(
                    408, f"the request body did not come in full within {self.seconds:g} s",
                    headers={"Connection": "close"})
            if message["type"] != "http.request" or not message.get("more_body", False):
                complete = True
            return message

        await self.app(scope, timed, send)
