"""The console's history: depth by state of every queue, sampled every few
seconds, kept for an hour in memory.

One process samples: at the start of each period every gateway process
(``--workers N``, other hosts on the spool) tries
:meth:`vsqs.Spool.claim_period` for the task ``console``, as housekeeping
does; the winner takes ``stats()`` of each queue and stores the sample as
the spool's record of that period (:meth:`vsqs.Spool.put_record`,
``.records/console.PERIOD``, docs/FORMAT.md). Every process then reads that
record into its own series, so whichever worker answers a page draws the
same chart, and the spool pays for one sampling per period, not one per
worker. (Each worker sampling on its own would cost N times as much and
give each worker a slightly different chart.)

The series is in memory: a process starts with an empty one and reads no
sample taken before its own start, so after a restart the charts start
empty, as the page says. It holds at most :data:`KEEP` samples of at most
:data:`MAX_QUEUES` queues.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from vsqs import QueueNotFound, QueueStats, Spool, VsqsError
from vsqs._core.rules import is_queue_name, load_json

log = logging.getLogger("vsqs.gateway.console")

TASK = "console"
PERIOD = 5.0  # seconds between samples
KEEP = 720  # samples kept: an hour
MAX_QUEUES = 500  # queues a sample holds (the first by name): bounds a record and the memory
FIELDS = ("ready", "in_flight", "delayed", "dead_lettered", "oldest_ready_age")


@dataclass(frozen=True)
class Sample:
    at: float  # epoch seconds: when the sampling ended
    queues: dict[str, tuple[float, ...]]  # name -> the FIELDS
    took: float = 0.0  # seconds the sampling took


def encode(at: float, stats: dict[str, QueueStats], took: float = 0.0) -> bytes:
    queues = {name: [s.ready, s.in_flight, s.delayed, s.dead_lettered, round(s.oldest_ready_age, 3)]
              for name, s in stats.items()}
    return json.dumps({"t": at, "d": round(took, 3), "queues": queues}, separators=(",", ":")).encode()


def decode(data: bytes) -> Sample | None:
    """A record's sample; None if it does not parse (being written, or not ours).
    Entries that are not a queue name and five finite numbers are left out
    (so a hostile record of 1 MiB costs no more memory than a true one)."""
    try:
        doc = load_json(data)
    except ValueError:
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("queues"), dict):
        return None
    at = doc.get("t")
    if isinstance(at, bool) or not isinstance(at, (int, float)) or not math.isfinite(at):
        return None
    queues: dict[str, tuple[float, ...]] = {}
    for name, values in list(doc["queues"].items())[:MAX_QUEUES]:
        if (is_queue_name(name) and isinstance(values, list) and len(values) == len(FIELDS)
                and all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                        for v in values)):
            queues[name] = tuple(values)
    took = doc.get("d", 0.0)
    took = float(took) if isinstance(took, (int, float)) and not isinstance(took, bool) and 0 <= took < 1e6 else 0.0
    return Sample(float(at), queues, took)


class History:
    """This process's series, fed from the spool's records."""

    def __init__(self, spool: Spool, period: float = PERIOD, keep: int = KEEP, now: float | None = None) -> None:
        self.spool = spool
        self.period = period
        self.started = time.time() if now is None else now
        self._samples: deque[Sample] = deque(maxlen=keep)
        self._next = int(self.started // period)  # the first period whose record is still to read
        self._lock = threading.Lock()

    def sample(self, stats_of: Callable[[str], QueueStats], now: float | None = None) -> bool:
        """If this period's sampling is ours (one process per period), take the
        stats of every queue (up to MAX_QUEUES) and store them as the
        period's record. Blocking; True if it sampled.

        When the last sampling took longer than a period (a deep spool on a
        slow disk), sampling goes on only every so many periods, as many as
        it took, so that samplings never pile up in several processes."""
        started = time.time() if now is None else now
        period = int(started // self.period)
        last = self._samples[-1] if self._samples else None
        stride = max(1, math.ceil(last.took / self.period)) if last is not None else 1
        if period % stride or not self.spool.claim_period(TASK, self.period, now=started):
            return False
        stats: dict[str, QueueStats] = {}
        for name in self.spool.queues()[:MAX_QUEUES]:
            try:
                stats[name] = stats_of(name)
            except QueueNotFound:
                continue
            except (VsqsError, OSError) as exc:
                log.warning("console: sampling queue %r failed: %s", name, exc)
        ended = time.time() if now is None else now  # (tests give the time)
        self.spool.put_record(TASK, period, encode(ended, stats, ended - started), keep=self._samples.maxlen or KEEP)
        return True

    def catch_up(self, now: float | None = None) -> None:
        """Read the records written since the last call. A missing record is
        waited for (looked at again next time: it may still be being
        written) only if it is of the current or the last period and no later
        one exists; otherwise that period had no sample."""
        now = time.time() if now is None else now
        current = int(now // self.period)
        with self._lock:
            waiting = None  # the first recent period whose record may come yet
            for period in range(max(self._next, current - (self._samples.maxlen or 1)), current + 1):
                data = self.spool.record(TASK, period)
                sample = decode(data) if data else None
                if sample is None:
                    if period >= current - 1 and waiting is None:
                        waiting = period
                    continue
                waiting = None  # a later record came: the earlier one never will
                if sample.at >= self.started:  # none taken before this process started
                    self._samples.append(sample)
            self._next = current + 1 if waiting is None else waiting

    def __len__(self) -> int:
        return len(self._samples)

    def __iter__(self) -> Iterator[Sample]:
        return iter(list(self._samples))

    def series(self, name: str) -> list[tuple[float, tuple[float, ...]]]:
        """(time, FIELDS) of queue ``name``, oldest first (samples without it left out)."""
        return [(s.at, s.queues[name]) for s in list(self._samples) if name in s.queues]

    def latest(self, name: str) -> tuple[float, tuple[float, ...], float] | None:
        """(time, FIELDS, seconds the sampling took) of the newest sample holding queue ``name``, or None."""
        for sample in reversed(list(self._samples)):
            if name in sample.queues:
                return sample.at, sample.queues[name], sample.took
        return None

    def depth_rate(self, name: str, window: float = 60.0) -> float | None:
        """Messages per second the depth (ready + in flight + delayed) grew by over
        about the last ``window`` seconds; None with fewer than two samples."""
        points = self.series(name)
        if len(points) < 2:
            return None
        last_at, last = points[-1]
        first_at, first = points[0]
        for at, values in reversed(points):
            if last_at - at >= window:
                first_at, first = at, values
                break
        if last_at <= first_at:
            return None
        return (sum(last[:3]) - sum(first[:3])) / (last_at - first_at)
