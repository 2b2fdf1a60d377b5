"""Prometheus metrics of a gateway process: request counters and latency
histograms per operation and outcome, gauges of saturation, the queues' own
gauges read from the spool at each scrape, and the middleware that counts.

With ``--workers N`` every worker writes its counters to a shared directory
(prometheus_client's multiprocess mode) and a scrape of any worker sums them.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.multiprocess import MultiProcessCollector

from vsqs import Spool, VsqsError
from vsqs._core.metrics import (
    DEAD_LETTERED,
    MESSAGES,
    OLDEST_AGE,
    QUEUE_LABELS,
    queue_label_values,
    queue_samples,
)
from vsqs._gateway.asgi import ASGIApp, Message, Receive, Scope, Send

disable_created_metrics()  # the _created series only double what a scrape stores

_QUEUE_GAUGES = (MESSAGES, DEAD_LETTERED, OLDEST_AGE)


class GatewayMetrics:
    """The gateway's collectors, and the exposition a scrape answers."""

    def __init__(self, spool: Spool) -> None:
        self._spool = spool
        self.multiprocess = bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "vsqs_gateway_requests", "Requests answered, by operation and outcome.",
            ["operation", "outcome"], registry=self.registry,
        )
        self.latency = Histogram(
            "vsqs_gateway_request_seconds", "Seconds to answer a request, by operation and outcome.",
            ["operation", "outcome"], registry=self.registry,
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25),
        )
        self.in_progress = Gauge(
            "vsqs_gateway_requests_in_progress", "Requests being answered now (saturation).",
            registry=self.registry, multiprocess_mode="livesum",
        )
        self.long_polls = Gauge(
            "vsqs_gateway_long_polls_waiting", "Receives waiting in a long poll now.",
            registry=self.registry, multiprocess_mode="livesum",
        )
        self.gc_runs = Counter(
            "vsqs_gateway_gc_runs", "Housekeeping sweeps of the spool this gateway ran.", registry=self.registry,
        )
        self.gc_removed = Counter(
            "vsqs_gateway_gc_removed", "Files the housekeeping sweeps removed.", registry=self.registry,
        )
        self.gc_errors = Counter(
            "vsqs_gateway_gc_errors", "Queues (or whole sweeps) the housekeeping failed on.", registry=self.registry,
        )
        self.gc_last_run = Gauge(
            "vsqs_gateway_gc_last_run_timestamp_seconds", "When this gateway last finished a housekeeping sweep.",
            registry=self.registry, multiprocess_mode="max",
        )

    def observe(self, operation: str, outcome: str, seconds: float) -> None:
        self.requests.labels(operation, outcome).inc()
        self.latency.labels(operation, outcome).observe(seconds)

    def exposition(self) -> bytes:
        """The text a scrape answers (blocking: the queue gauges list every queue)."""
        if self.multiprocess:
            registry = CollectorRegistry()
            MultiProcessCollector(registry)
        else:
            registry = self.registry
        queues = _QueueCollector(self._spool)
        return generate_latest(registry) + generate_latest(_Single(queues))


class _Single:
    """A registry-like wrapper so one collector can be rendered on its own."""

    def __init__(self, collector: Any) -> None:
        self._collector = collector

    def collect(self) -> Iterable[Any]:
        return self._collector.collect()


class _QueueCollector:
    """The queue gauges, with the names and labels of ``vsqs stats --prometheus``
    (both from :mod:`vsqs._core.metrics`)."""

    def __init__(self, spool: Spool) -> None:
        self._spool = spool

    def collect(self) -> Iterable[GaugeMetricFamily]:
        families = {gauge: GaugeMetricFamily(gauge.name, gauge.help, labels=[*QUEUE_LABELS, *gauge.labels])
                    for gauge in _QUEUE_GAUGES}
        for name in self._spool.queues():
            try:
                queue = self._spool.queue(name)
                stats = queue.stats()
            except VsqsError:
                continue  # deleted between the listing and the stats
            for sample in queue_samples(stats):
                family = families.get(sample.gauge)
                if family is not None:
                    family.add_metric([*queue_label_values(name), *sample.labels], sample.value)
        return list(families.values())


class RequestMetrics:
    """Outermost middleware: counts every request, refused ones included, by
    operation (the route's name, or what the handler put in ``vsqs.operation``)
    and outcome (``ok``, the status, or the handler's ``vsqs.outcome``)."""

    def __init__(self, app: ASGIApp, metrics: GatewayMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        self.metrics.in_progress.inc()
        try:
            await self.app(scope, receive, sending)
        finally:
            self.metrics.in_progress.dec()
            operation = scope.get("vsqs.operation") or _route_name(scope)
            self.metrics.observe(operation, scope.get("vsqs.outcome") or _outcome(status),
                                 time.perf_counter() - started)


def _route_name(scope: Scope) -> str:
    route = scope.get("route")
    return getattr(route, "name", None) or "unrouted"


def _outcome(status: int) -> str:
    return "ok" if status < 400 else str(status)
