"""The web console at ``/ui`` of ``vsqs serve``: server-rendered pages of the
spool's queues, their history, their messages, and the operator's actions.

Modules: :mod:`.routes` (the routes and :class:`~.routes.Console`, what they
share), :mod:`.views` (what a page shows, from the public API),
:mod:`.session` (signed session cookies, CSRF tokens), :mod:`.history` (the
sampled series, shared by the workers through the spool), :mod:`.charts`
(SVG geometry), :mod:`.forms` (form bodies, the settings form),
:mod:`.humane` (numbers for people, safe text). Templates (Jinja2,
autoescaped) and the static CSS and script ship in the package: the
console needs no network and no build step. docs/console.md describes it.
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
from vsqs._gateway.console.routes import PREFIX, Console, router

__all__ = ["PREFIX", "Console", "router", "sampling"]

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
