"""What the vsqs:// transport decides without touching a queue: the spool a URL
names, a Celery ETA, how a held message is settled, its defaults and limits."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime
from typing import Any, NamedTuple, cast
from urllib.parse import unquote, urlparse

from vsqs import InvalidArgument, Message
from vsqs._core.limits import MAX_DELAY

log = logging.getLogger("vsqs.kombu")

SCHEME = "vsqs"
DEFAULT_VISIBILITY_TIMEOUT = 30.0
DEFAULT_WAIT = 1.0
# The settings of the queues the transport makes, under ``queue_settings``: a dead-letter
# queue (``NAME.dlq``) for rejects, and a bound on how often a task that kills its worker
# is tried (RabbitMQ's quorum queues stop at 20 deliveries too).
DEFAULT_QUEUE_SETTINGS: dict[str, Any] = {"max_receives": 20}
BATCH = 10  # messages claimed at once when the consumer sets no prefetch limit
PAUSE = 0.2  # seconds between looks at a queue that cannot be read now (suspended, gone)

NO_CROSS_PROCESS = (
    "the vsqs:// transport has no {kind} exchanges across processes (exchange {name!r}): "
    "kombu keeps bindings in each process's memory, so celery inspect/control, broadcast queues "
    "and event monitors (celery events, Flower) cannot work through it; see docs/tasks.md"
)


def spool_path(url: str | None, options: dict[str, Any]) -> str:
    """The spool directory a ``vsqs:///absolute/path`` URL (or the ``spool`` option) names."""
    if options.get("spool"):
        return str(options["spool"])
    parts = urlparse(url or "")
    if parts.scheme != SCHEME or parts.netloc not in ("", "localhost") or not parts.path.startswith("/"):
        raise InvalidArgument(f"a vsqs broker URL is vsqs:///absolute/path/to/spool, not {url!r}")
    return unquote(parts.path)


def eta_of(headers: dict[str, Any] | None) -> float | None:
    """A Celery message's ETA (protocol 2 ``eta`` header) in epoch seconds, if it names its
    time zone: a naive one is local time to Celery's worker, which this transport leaves to it."""
    eta = (headers or {}).get("eta")
    if not isinstance(eta, str):
        return None
    try:
        when = datetime.fromisoformat(eta)
        return None if when.tzinfo is None else when.timestamp()
    except (ValueError, OverflowError, OSError):
        return None


def eta_delay(headers: dict[str, Any] | None, now: float) -> float | None:
    """Seconds until a Celery message's ETA (see :func:`eta_of`), if it is in the future."""
    eta = eta_of(headers)
    if eta is None or eta <= now:
        return None
    return min(eta - now, MAX_DELAY)


class Claimed(NamedTuple):
    """A message claimed for a consumer: its queue, its kombu payload, its delivery tag."""

    queue: str
    payload: dict[str, Any]
    tag: str


def settlement(message: Message, how: str) -> Callable[[], object]:
    """The call that settles ``message``: its delete, release, or move to the dead-letter
    queue (a delete where the queue has none: a reject without requeue drops it, as in AMQP)."""
    if how != "dead_letter":
        return cast(Callable[[], object], getattr(message, how))

    def dead_letter() -> None:
        try:
            message.dead_letter()
        except InvalidArgument:
            message.delete()

    return dead_letter
