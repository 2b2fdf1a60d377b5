"""What the handlers of both faces share: :class:`Gateway`.

The gateway keeps no state of its own. Every request turns into calls of the
public Python API on the spool, so any number of gateways on any hosts can
serve one spool beside library and CLI users, and killing one loses nothing.
What it does keep is a cache: one open :class:`vsqs.Queue` handle per queue
(for the handle's listing cache), checked against the disk every few seconds.
Long polls wait with the engine's asyncio receive, which every publish wakes,
from this process or any other.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio.to_thread
from fastapi import Request

from vsqs import InvalidArgument, Message, Queue, Spool
from vsqs._gateway.config import GatewayConfig
from vsqs._gateway.guesses import KeyGuesses
from vsqs._gateway.limits import MAX_WAIT
from vsqs._gateway.metrics import GatewayMetrics

T = TypeVar("T")

_HANDLE_CHECK_SECONDS = 2.0
# handles kept (the least recently used forgotten first): each holds its queue's directory
# and its shards' open (one descriptor each, shared with the other handles of that queue)
MAX_HANDLES = 256


class Gateway:
    """What the handlers share: the spool, the queue handles, the metrics.

    The gateway of the home region (``--region``, the spool SPOOL) is the one the
    native API and the console use; each ``--region-spool`` has a gateway of its
    own (:meth:`in_region`), with its spool and queue handles, sharing the home
    gateway's configuration, metrics and counts of wrong keys.
    """

    def __init__(self, config: GatewayConfig, region: str | None = None, home: Gateway | None = None) -> None:
        self.config = config
        self.region = region or config.region
        self.spool = Spool(config.region_spools[self.region] if home is not None else config.spool)
        self._handles: OrderedDict[str, tuple[Queue, float]] = OrderedDict()
        self._handles_lock = threading.Lock()
        self.metrics: GatewayMetrics = home.metrics if home is not None else GatewayMetrics(self.spool)
        # wrong API keys by address: the API's and the console's sign-in
        self.key_guesses: KeyGuesses = home.key_guesses if home is not None else KeyGuesses()
        self._regions: dict[str, Gateway] = {} if home is not None else {
            region: Gateway(config, region, self) for region in config.region_spools}

    # -- regions --------------------------------------------------------------

    @property
    def multi_region(self) -> bool:
        """Whether regions other than the home one have spools of their own (``--region-spool``)."""
        return bool(self.config.region_spools)

    def in_region(self, region: str) -> Gateway | None:
        """The gateway of ``region``'s spool: this one for the home region, None for a
        region without a spool (a home gateway's question; a region's gateway knows only itself)."""
        if region == self.region:
            return self
        return self._regions.get(region)

    def spools(self) -> list[Spool]:
        """Every spool this gateway serves: the home spool first, then the regions'."""
        return [self.spool, *(gateway.spool for gateway in self._regions.values())]

    # -- queue handles ------------------------------------------------------

    def queue(self, name: str) -> Queue:
        """An open handle on queue ``name`` (QueueNotFound, or InvalidArgument for a bad name).

        Handles are cached; every few seconds a cached one is compared with the
        queue on disk, so a queue deleted and made again elsewhere is noticed.
        """
        now = time.monotonic()
        with self._handles_lock:
            cached = self._handles.get(name)
            if cached is not None:
                self._handles.move_to_end(name)
        if cached is not None and now - cached[1] < _HANDLE_CHECK_SECONDS:
            return cached[0]
        fresh = self.spool.queue(name)
        if cached is not None and cached[0].id == fresh.id:
            fresh = cached[0]
        with self._handles_lock:
            self._handles[name] = (fresh, now)
            self._handles.move_to_end(name)
            while len(self._handles) > MAX_HANDLES:
                self._handles.popitem(last=False)
        return fresh

    async def on(self, name: str, fn: Callable[[Queue], T]) -> T:
        """``fn(queue)`` on the thread pool, the queue opened there too: one hop per request."""
        return await anyio.to_thread.run_sync(lambda: fn(self.queue(name)))

    async def handle(self, name: str) -> Queue:
        """:meth:`queue` from the event loop (opening a queue reads its metadata)."""
        return await self.call(self.queue, name)

    def create_queue(self, name: str, **settings: Any) -> Queue:
        """Create (or open) queue ``name`` with ``settings``; a queue the gateway makes
        gets the operator's ``--file-mode`` (HTTP clients cannot choose modes)."""
        if self.config.file_mode is not None:
            settings = {"file_mode": self.config.file_mode, **settings}
        return self.spool.create_queue(name, **settings)

    def forget(self, name: str) -> None:
        with self._handles_lock:
            self._handles.pop(name, None)

    async def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run a blocking vsqs call on the thread pool (file I/O never blocks the event loop)."""
        return await anyio.to_thread.run_sync(lambda: fn(*args, **kwargs))

    # -- long polling ---------------------------------------------------------

    async def receive(
        self, name: str, max_messages: int, visibility_timeout: float | None, wait: float | None,
        disconnected: Callable[[], Awaitable[bool]] | None = None,
    ) -> list[Message]:
        """Receive with a long poll that holds no thread while it waits; the
        messages come with their bodies read (on the thread pool).

        The first attempt is one hop to the thread pool: the queue opened, its
        ``receive_wait`` read (``wait`` None), one non-blocking ``receive_batch``.
        When it finds nothing and there is a wait, :meth:`long_poll` goes on.
        """
        def first_attempt(queue: Queue) -> tuple[float, list[Message]]:
            waits = float(queue.settings["receive_wait"]) if wait is None else wait
            if not 0 <= waits <= MAX_WAIT:  # before the receive: a refused request takes no message
                raise InvalidArgument(f"wait must be 0..{MAX_WAIT:g} seconds, not {waits!r}")
            return waits, queue.receive_batch(max_messages, visibility_timeout=visibility_timeout, wait=0)

        waits, got = await self.on(name, first_attempt)
        if got or waits <= 0:
            return got
        return await self.long_poll(name, max_messages, visibility_timeout, waits, disconnected)

    async def long_poll(
        self, name: str, max_messages: int, visibility_timeout: float | None, wait: float,
        disconnected: Callable[[], Awaitable[bool]] | None = None, group_runs: bool = False,
        prepare: Callable[[list[Message]], object] | None = None,
    ) -> list[Message]:
        """The rest of a receive whose first attempt found nothing: the engine's
        asyncio receive (:meth:`vsqs.Queue.areceive_batch`), which sleeps on the
        queue's watch, woken when a message may be claimable, whoever published it
        (all the long polls of a queue in this process share one watch; a message
        wakes one of them). Each attempt is a hop to the thread pool; ``prepare`` is
        called there with what it got (whatever reads files for the answer does it
        there, never on the event loop). A client that went away stops its poll
        before the next attempt, so no message is hidden for nobody.
        """
        queue = await self.handle(name)

        async def attempt(claim: Callable[[], list[Message]]) -> list[Message]:
            if disconnected is not None and await disconnected():
                raise _Disconnected
            return await anyio.to_thread.run_sync(lambda: _prepared(claim(), prepare))

        self.metrics.long_polls.inc()
        try:
            return await queue.areceive_batch(
                max_messages, visibility_timeout=visibility_timeout, wait=wait, group_runs=group_runs,
                offload=attempt,
            )
        except _Disconnected:
            return []
        finally:
            self.metrics.long_polls.dec()


class _Disconnected(Exception):
    """The client of a long poll went away: no more attempts."""


def _prepared(got: list[Message], prepare: Callable[[list[Message]], object] | None) -> list[Message]:
    if got and prepare is not None:
        prepare(got)
    return got


def gateway_of(request: Request) -> Gateway:
    gateway: Gateway = request.app.state.gateway
    return gateway
