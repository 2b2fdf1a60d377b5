"""The web console at ``/ui`` of ``vsqs serve``: server-rendered pages of the
spool's queues, their history, their messages, and the operator's actions.

Templates (Jinja2, autoescaped) and the static CSS and script ship in the
package: the console needs no network and no build step. docs/console.md
describes it; docs/ARCHITECTURE.md maps its modules.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio.to_thread

from vsqs import VsqsError
from vsqs._gateway.asgi import ASGIApp, Message, Receive, Scope, Send
from vsqs._gateway.console.routes import PREFIX, SECURITY_HEADERS, Console, router

__all__ = ["PREFIX", "Console", "SecurityHeaders", "router", "sampling"]

log = logging.getLogger("vsqs.gateway.console")


async def _sample_periodically(console: Console) -> None:
    """Until cancelled: at the start of each period, one sampling attempt and a catch-up, on a thread."""
    period = console.history.period
    while True:
        await asyncio.sleep(period - time.time() % period + 0.05)  # just past the start of the next period
        try:
            await anyio.to_thread.run_sync(console.sample)
        except (VsqsError, OSError) as exc:
            log.warning("console: sampling failed: %s", exc)
        except Exception:  # a bug must not end the sampling: logged whole, tried next period
            log.exception("console: sampling failed")


def sampling(console: Console) -> Callable[[Any], Any]:
    """A lifespan that samples the spool for the console's history while the app is up."""

    @contextlib.asynccontextmanager
    async def _lifespan(app: Any) -> AsyncIterator[None]:
        task = asyncio.create_task(_sample_periodically(console)) if console.sampling else None
        try:
            yield
        finally:
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    return _lifespan


class SecurityHeaders:
    """Every answer under ``/ui`` carries the console's security headers (CSP,
    X-Frame-Options, ...), the errors too: a 404, 405 or 422 of the router,
    a refusal of the BrowserGuard, a static file. This adds those an answer
    lacks (a static file keeps its own Cache-Control)."""

    _ADDED = tuple((name.lower().encode(), value.encode()) for name, value in SECURITY_HEADERS.items())

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if path != PREFIX and not path.startswith(PREFIX + "/"):
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                present = {name.lower() for name, _ in headers}
                headers += [(name, value) for name, value in self._ADDED if name not in present]
                message["headers"] = headers
            await send(message)

        await self.app(scope, receive, send_with_headers)
