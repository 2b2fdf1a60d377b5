"""One SQS request being answered: what an action needs beyond its parameters."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from starlette.requests import Request

from vsqs import Queue
from vsqs._gateway.sqs.parameters import queue_name_of_url
from vsqs._gateway.sqs.receipts import ReceiptAliases
from vsqs._gateway.state import Gateway

T = TypeVar("T")


@dataclass
class Call:
    """One SQS request being answered."""

    gateway: Gateway
    request: Request
    params: dict[str, Any]
    aliases: ReceiptAliases
    queue_name: str | None = None
    outcome: str = "ok"

    async def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return await self.gateway.call(fn, *args, **kwargs)

    async def on_queue(self, fn: Callable[[Queue], T]) -> T:
        """``fn(queue)`` for the queue named by QueueUrl, in one hop to the thread pool
        that opens the queue too: an action's whole storage work in one hop."""
        name = self.queue_name or queue_name_of_url(self.params)
        self.queue_name = name
        return await self.gateway.on(name, fn)

    async def queue(self) -> Queue:
        """The queue named by QueueUrl (the handle is opened on the thread pool)."""
        name = self.queue_name or queue_name_of_url(self.params)
        self.queue_name = name
        return await self.run(self.gateway.queue, name)

    @property
    def trace_header(self) -> str | None:
        """The request's ``X-Amzn-Trace-Id`` (X-Ray's header): the AWSTraceHeader of the messages it sends."""
        return self.request.headers.get("x-amzn-trace-id") or None

    def url_of(self, name: str) -> str:
        """``BASE/ACCOUNT/NAME``: BASE is ``--public-url``, else the request's scheme
        and ``Host`` (one the gateway serves: :class:`~vsqs._gateway.auth.BrowserGuard`)."""
        config = self.gateway.config
        host = self.request.headers.get("host") or self.request.url.netloc
        base = config.public_url or f"{self.request.url.scheme}://{host}"
        return f"{base}/{config.account_id}/{name}"

    def arn_of(self, name: str) -> str:
        config = self.gateway.config
        return f"arn:aws:sqs:{config.region}:{config.account_id}:{name}"

    async def settings(self, queue: Queue) -> dict[str, Any]:
        """The queue's settings (read on the thread pool: they may come from disk)."""
        return await self.run(lambda: dict(queue.settings))

    @staticmethod
    def settings_now(queue: Queue) -> dict[str, Any]:
        """The queue's settings, on the thread already (they may come from disk)."""
        return dict(queue.settings)

    def message_limit(self, settings: Mapping[str, Any]) -> int:
        return int(settings["max_message_bytes"] or self.gateway.config.max_body_bytes)
