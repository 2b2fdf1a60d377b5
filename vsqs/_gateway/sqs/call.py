"""One SQS request being answered: what an action needs beyond its parameters."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from starlette.requests import Request

from vsqs import Queue
from vsqs._gateway import sigv4 as _sigv4
from vsqs._gateway.regions import is_region
from vsqs._gateway.sqs.parameters import queue_name_of_url, queue_url_region
from vsqs._gateway.sqs.protocol import REGION_PATH_PREFIX, no_such_queue
from vsqs._gateway.sqs.receipts import ReceiptAliases
from vsqs._gateway.state import Gateway

T = TypeVar("T")


@dataclass
class Call:
    """One SQS request being answered: ``gateway`` is its region's (:func:`region_of`),
    ``home`` the home region's, which knows the others."""

    gateway: Gateway
    request: Request
    params: dict[str, Any]
    aliases: ReceiptAliases
    home: Gateway
    queue_name: str | None = None
    outcome: str = "ok"

    @classmethod
    def of(cls, home: Gateway, request: Request, params: dict[str, Any], aliases: ReceiptAliases) -> Call:
        """The call of a request, in its region's spool (QueueDoesNotExist for a
        QueueUrl naming a region this gateway has no spool for)."""
        gateway = home.in_region(region_of(home, request.scope, params))
        assert gateway is not None  # (region_of names a region that has a spool)
        return cls(gateway, request, params, aliases, home)

    @property
    def region(self) -> str:
        """The request's region: its ARNs', its queue URLs', its spool's."""
        return self.gateway.region

    def in_region(self, region: str) -> Gateway | None:
        """The gateway of ``region`` (an ARN's); None if it has no spool. With no
        ``--region-spool`` every region is the home one, as it always was."""
        return self.home.in_region(region) if self.home.multi_region else self.gateway

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
        """``BASE/ACCOUNT/NAME`` in the home region, ``BASE/queue/REGION/ACCOUNT/NAME``
        in another (LocalStack's path form): BASE is ``--public-url``, else the request's
        scheme and ``Host`` (one the gateway serves: :class:`~vsqs._gateway.auth.BrowserGuard`)."""
        config = self.gateway.config
        host = self.request.headers.get("host") or self.request.url.netloc
        base = config.public_url or f"{self.request.url.scheme}://{host}"
        if self.region != config.region:
            base = f"{base}/{REGION_PATH_PREFIX}/{self.region}"
        return f"{base}/{config.account_id}/{name}"

    def arn_of(self, name: str, region: str | None = None) -> str:
        """The ARN of queue ``name`` of ``region``, by default the request's."""
        return f"arn:aws:sqs:{region or self.region}:{self.gateway.config.account_id}:{name}"

    async def settings(self, queue: Queue) -> dict[str, Any]:
        """The queue's settings (read on the thread pool: they may come from disk)."""
        return await self.run(lambda: dict(queue.settings))

    @staticmethod
    def settings_now(queue: Queue) -> dict[str, Any]:
        """The queue's settings, on the thread already (they may come from disk)."""
        return dict(queue.settings)

    def message_limit(self, settings: Mapping[str, Any]) -> int:
        return int(settings["max_message_bytes"] or self.gateway.config.max_body_bytes)


def region_of(home: Gateway, scope: Mapping[str, Any], params: Mapping[str, Any]) -> str:
    """The region a request is for, among those with a spool: the one its QueueUrl's
    path names (``/queue/REGION/ACCOUNT/NAME``; a region without a spool, or not a
    region name, is QueueDoesNotExist), else the region of its signature's credential
    scope if that region has a spool, else the home region. With no ``--region-spool``:
    the home region, whatever the request names (docs/gateway.md, Regions)."""
    if not home.multi_region:
        return home.region
    url = params.get("QueueUrl")
    named = queue_url_region(url) if isinstance(url, str) else None
    if named is not None:
        if home.in_region(named) is None:
            raise no_such_queue()
        return named
    signed = _sigv4.scope_region(_header(scope, b"authorization"), scope.get("query_string", b"").decode("latin-1"))
    if signed is not None and is_region(signed) and home.in_region(signed) is not None:
        return signed
    return home.region


def _header(scope: Mapping[str, Any], name: bytes) -> str | None:
    return next((value.decode("latin-1") for key, value in scope["headers"] if key == name), None)
