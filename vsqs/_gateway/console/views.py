"""What the console's pages show, gathered from the public API: each
queue's stats for the overview (from :class:`StatsCache`: the history's
latest sample, or ``stats()``, so any number of open pages refreshing cost
the spool at most one listing of each queue per period), a queue's
settings, counts, groups and a page of its messages. Blocking: the routes
run these on the thread pool."""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from vsqs import MessageInfo, QueueNotFound, QueueStats, VsqsError
from vsqs._gateway.console import charts, forms, humane, records
from vsqs._gateway.console.history import History
from vsqs._gateway.state import Gateway

STATS_TTL = 2.0  # seconds a queue's stats are reused by the overview and the live numbers
PAGE_DEFAULT, PAGE_MAX = 50, 200  # messages on a page of the queue page
MAX_GROUPS = 200  # groups listed on a queue's page, the largest backlog first
PREVIEW_BYTES = 1024  # bytes of each body a page reads
SORTS = ("name", "ready", "in_flight", "delayed", "dead_lettered", "oldest_ready_age", "rate")


class StatsCache:
    """Each queue's stats and settings for the pages, at the least cost:

    * stats this process took less than ``ttl`` seconds ago;
    * else the latest sample of the history (:mod:`.history`: one process
      takes ``stats()`` of every queue each period), if a worker of this
      gateway wrote it (signed: a record planted in the spool never stands in
      for live counts, :mod:`.records`), it is less than a period (plus
      ``ttl``) old and newer than the last action on the queue: then a
      refresh costs the spool only the queue's settings;
    * else ``Queue.stats()``, one listing of the queue.

    So pages are at most a period and a bit behind, and an action's result
    shows at once."""

    def __init__(self, gateway: Gateway, history: History | None = None, ttl: float = STATS_TTL) -> None:
        self._gateway = gateway
        self._history = history
        self._ttl = ttl
        self._cached: dict[str, tuple[float, QueueStats, dict[str, Any], bool]] = {}  # at, stats, settings, taken
        self._acted: dict[str, float] = {}  # queue -> when an action last changed it (epoch)
        self._lock = threading.Lock()

    def get(self, name: str, fresh: bool = False) -> tuple[QueueStats, dict[str, Any]]:
        """(stats, settings) of queue ``name``; QueueNotFound if it is gone.
        ``fresh``: stats this process took (the sampler's own), never a sample."""
        now = time.monotonic()
        with self._lock:
            hit = self._cached.get(name)
        if hit is not None and now - hit[0] < self._ttl and (hit[3] or not fresh):
            return hit[1], hit[2]
        queue = self._gateway.queue(name)
        sampled = None if fresh else self._sampled(name)
        stats = queue.stats() if sampled is None else sampled
        settings = dict(queue.settings)
        with self._lock:
            self._cached[name] = (now, stats, settings, sampled is None)
        return stats, settings

    def _sampled(self, name: str) -> QueueStats | None:
        if self._history is None:
            return None
        latest = self._history.latest(name)
        if latest is None:
            return None
        at, values, took = latest
        with self._lock:
            acted = self._acted.get(name, -math.inf)
        period = self._history.period
        fresh_for = period * (1 + math.ceil(took / period)) + self._ttl  # until the next sample (see History.sample)
        if at <= acted or time.time() - at >= fresh_for:
            return None
        return records.stats_of(values)

    def forget(self, name: str) -> None:
        """After an action on ``name``: the next look takes fresh stats."""
        with self._lock:
            self._cached.pop(name, None)
            self._acted[name] = time.time()

    def keep_only(self, names: set[str]) -> None:
        with self._lock:
            for gone in set(self._cached) - names:
                del self._cached[gone]
            for gone in set(self._acted) - names:
                del self._acted[gone]


def dead_letter_name(name: str, settings: dict[str, Any]) -> str | None:
    """The name of the queue's dead-letter queue, if it has one (None without max_receives)."""
    if settings.get("max_receives") is None:
        return None
    target = settings.get("dead_letter")
    return str(target) if target else f"{name}.dlq"


_COUNTS = ("ready", "in_flight", "delayed", "dead_lettered", "oldest_ready_age")


@dataclass
class Row:
    """One queue of the overview."""

    name: str
    stats: QueueStats | None
    settings: dict[str, Any]
    dead_letter: str | None
    rate: float | None
    spark: str
    error: str | None = None
    serves: list[str] = field(default_factory=list)  # the queues whose dead-letter queue this is

    def numbers(self) -> dict[str, Any]:
        """What the live refresh updates: raw numbers and their text."""
        s = self.stats
        if s is None:  # a queue that cannot be read: its row says so, its counts are blank
            raw: dict[str, Any] = dict.fromkeys(_COUNTS)
            text = dict.fromkeys(_COUNTS, "–")
        else:
            raw = {key: getattr(s, key) for key in _COUNTS}
            text = {key: humane.count(value) for key, value in raw.items()}
            text["oldest_ready_age"] = humane.duration(s.oldest_ready_age) if s.ready else "–"
        text["rate"] = humane.rate(self.rate)
        text["suspended"] = ", ".join(self.settings.get("suspended") or []) or "no"
        return {"name": self.name, "raw": {**raw, "rate": self.rate}, "text": text, "spark": self.spark,
                "suspended": bool(self.settings.get("suspended")), "error": self.error}


def overview(gateway: Gateway, cache: StatsCache, history: History, sort: str = "name",
             descending: bool = False, needle: str = "") -> list[Row]:
    """Every queue of the spool (those whose name holds ``needle``), sorted."""
    history.catch_up()
    now = time.time()
    names = gateway.spool.queues()
    cache.keep_only(set(names))
    rows = []
    for name in names:
        try:
            stats, settings = cache.get(name)
            error = None
        except QueueNotFound:
            continue
        except (VsqsError, OSError) as exc:
            stats, settings, error = None, {}, f"cannot read this queue: {type(exc).__name__}"
        series = history.series(name)
        rows.append(Row(name, stats, settings, dead_letter_name(name, settings), history.depth_rate(name),
                        charts.sparkline(series, now), error))
    by_name = {row.name: row for row in rows}
    for row in rows:
        if row.dead_letter in by_name:
            by_name[row.dead_letter].serves.append(row.name)
    if needle:
        rows = [row for row in rows if needle.lower() in row.name.lower()]
    return sort_rows(rows, sort, descending)


def sort_rows(rows: list[Row], sort: str, descending: bool) -> list[Row]:
    if sort not in SORTS or sort == "name":
        return sorted(rows, key=lambda row: row.name, reverse=descending)

    def key(row: Row) -> tuple[bool, float, str]:
        value = row.rate if sort == "rate" else getattr(row.stats, sort, None) if row.stats else None
        return (value is None, -(value or 0) if descending else (value or 0), row.name)

    return sorted(rows, key=key)


@dataclass
class QueuePage:
    """What a queue's page shows."""

    name: str
    stats: QueueStats
    settings: dict[str, Any]
    shards: int
    dead_letter: str | None
    serves: list[str]
    messages: list[MessageInfo]
    after: str | None
    next_after: str | None
    limit: int
    groups: list[tuple[str, dict[str, int]]] | None  # the MAX_GROUPS with the largest backlog
    chart: charts.Chart
    settings_text: dict[str, str]
    rate: float | None  # the depth's change per second (history), None without two samples


def queue_page(gateway: Gateway, cache: StatsCache, history: History, name: str, after: str | None,
               limit: int, groups: bool) -> QueuePage:
    """A queue's page: fresh stats (with groups if asked: one read per group),
    settings, and one page of messages after the id ``after``."""
    history.catch_up()
    queue = gateway.queue(name)
    stats = queue.stats(groups=True) if groups else cache.get(name)[0]  # (the overview's, if fresh)
    settings = dict(queue.settings)
    messages = list(queue.messages(after=after, limit=limit + 1, preview=PREVIEW_BYTES))
    more = len(messages) > limit
    messages = messages[:limit]
    serves = []
    for other in gateway.spool.queues():
        if other != name:
            try:
                if dead_letter_name(other, dict(gateway.queue(other).settings)) == name:
                    serves.append(other)
            except (VsqsError, OSError):
                continue
    return QueuePage(
        name=name, stats=stats, settings=settings, shards=queue.shards,
        dead_letter=dead_letter_name(name, settings), serves=serves, messages=messages, after=after,
        next_after=messages[-1].id if more and messages else None, limit=limit,
        groups=None if stats.groups is None else sorted(
            stats.groups.items(), key=lambda item: (-item[1]["ready"], -item[1]["in_flight"], item[0]))[:MAX_GROUPS],
        chart=charts.depth_chart(history.series(name), time.time()),
        settings_text={field.name: forms.setting_text(field.name, settings.get(field.name)) for field in forms.FIELDS},
        rate=history.depth_rate(name),
    )
