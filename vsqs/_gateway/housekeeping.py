"""The gateway's housekeeping: a periodic garbage collection of the spool.

Messages past their queue's ``retention``, ``.new`` files left by publishers
that died, stale stages, spent group leases, de-duplication reservations and
the leftovers of Spark streaming queries in ``.spark/`` go only when someone runs
:meth:`vsqs.Queue.collect_garbage` (``vsqs gc``).
A gateway does it by itself every ``--gc-interval`` seconds: at the start of
each period every gateway process (``--workers N``, other hosts) tries
:meth:`vsqs.Spool.claim_period`; the one that wins runs the sweep over the
spool's queues on a thread, the others do nothing until the next period.
With nothing to collect, a sweep is a listing of each queue. A gateway with
spools for other regions (``--region-spool``) sweeps each of them the same
way, each claimed in its own spool.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import anyio.to_thread

from vsqs import QueueNotFound, Spool, VsqsError
from vsqs._gateway.metrics import GatewayMetrics

log = logging.getLogger("vsqs.gateway.housekeeping")

GC_TASK = "gc"  # the claim's task name in the spool


def collect_spool(spool: Spool, metrics: GatewayMetrics) -> tuple[int, int]:
    """One sweep: ``collect_garbage()`` on every queue of the spool; a queue
    that fails is logged and counted, and the sweep goes on; the files removed
    and the queues swept. Blocking."""
    removed = 0
    names = spool.queues()
    for name in names:
        try:
            removed += spool.queue(name).collect_garbage()
        except QueueNotFound:
            continue  # deleted since the listing
        except (VsqsError, OSError) as exc:
            metrics.gc_errors.inc()
            log.warning("housekeeping: garbage collection of queue %r failed: %s", name, exc)
    metrics.gc_runs.inc()
    metrics.gc_removed.inc(removed)
    metrics.gc_last_run.set(time.time())
    return removed, len(names)


def sweep_if_claimed(spool: Spool, metrics: GatewayMetrics, interval: float) -> bool:
    """Claim this period's sweep for the spool and run it if the claim is ours. Blocking."""
    now = time.time()
    if not spool.claim_period(GC_TASK, interval, now=now):
        return False
    removed, queues = collect_spool(spool, metrics)
    log.info("housekeeping: period %d of %gs: swept %d queues, removed %d files",
             int(now // interval), interval, queues, removed)
    return True


async def run_periodically(spools: Sequence[Spool], metrics: GatewayMetrics, interval: float) -> None:
    """Until cancelled: at the start of each period, for each of ``spools`` in turn,
    one claim attempt, and the sweep on a worker thread if it was won (the event
    loop never waits on disk); a spool that fails does not keep the next from its sweep."""
    while True:
        await asyncio.sleep(interval - time.time() % interval)  # to the start of the next period
        for spool in spools:
            try:
                await anyio.to_thread.run_sync(sweep_if_claimed, spool, metrics, interval)
            except (VsqsError, OSError) as exc:  # the spool failed (gone, read-only...): one line, tried next period
                metrics.gc_errors.inc()
                log.warning("housekeeping: the sweep of %s failed: %s", spool.root, exc)
            except Exception:  # a bug must not end housekeeping either: logged whole, tried next period
                metrics.gc_errors.inc()
                log.exception("housekeeping: the sweep of %s failed", spool.root)


def lifespan(spools: Sequence[Spool], metrics: GatewayMetrics, interval: float) -> Callable[[Any], Any]:
    """A lifespan for the FastAPI app that sweeps ``spools`` every ``interval``
    seconds while the app is up (0: never)."""

    @contextlib.asynccontextmanager
    async def _lifespan(app: Any) -> AsyncIterator[None]:
        task = asyncio.create_task(run_periodically(spools, metrics, interval)) if interval > 0 else None
        try:
            yield
        finally:
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    return _lifespan
