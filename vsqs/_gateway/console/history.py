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

Records are checked as :mod:`.records` says; a damaged one is left out,
counted (:attr:`History.damaged`, which the pages show) and logged, at most
once a minute. So is the record of a period this process claimed but found
written already, by someone who is not of this gateway (the record is not
signed with its key): only the claim's holder writes a period's record. One
signed by another worker of this gateway is a sample: that worker held the
claim too, after it was removed under this one (a gateway with another
``--console-interval`` on the spool does that), which is logged as such.
"""

from __future__ import annotations

import logging
import math
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator

from vsqs import QueueNotFound, QueueStats, Spool, VsqsError
from vsqs._gateway.console.records import FIELDS, MAX_QUEUES, TASK, DamagedRecord, Sample, decode, encode, key_of

__all__ = ["FIELDS", "KEEP", "MAX_QUEUES", "PERIOD", "TASK", "History", "Sample"]

log = logging.getLogger("vsqs.gateway.console")

PERIOD = 5.0  # seconds between samples
KEEP = 720  # samples kept: an hour
_LOG_EVERY = 60.0  # seconds between warnings of damaged records


class History:
    """This process's series, fed from the spool's records."""

    def __init__(self, spool: Spool, period: float = PERIOD, keep: int = KEEP, secret: str | bytes | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        """``secret``: shared by the workers of one gateway, so that each takes the
        others' records for its own (:mod:`.records`); else one of this series' own.
        ``clock``: the time (epoch seconds) the series starts at, samples and reads by."""
        self.spool = spool
        self.period = period
        self._clock = clock
        self.started = clock()
        self.damaged = 0  # records left out as damaged since the start
        self._key = key_of(secrets.token_bytes(32) if secret is None else secret)
        self._samples: deque[Sample] = deque(maxlen=keep)
        self._next = int(self.started // period)  # the first period whose record is still to read
        self._planted: set[int] = set()  # periods this process claimed whose record someone else wrote
        self._warned = -math.inf  # when damaged records were last logged
        self.claimed_twice = 0  # periods this process claimed and another worker of this gateway sampled too
        self._warned_twice = -math.inf
        self._lock = threading.Lock()

    def sample(self, stats_of: Callable[[str], QueueStats]) -> bool:
        """If this period's sampling is ours (one process per period), take the
        stats of every queue (up to MAX_QUEUES) and store them as the
        period's record. Blocking; True if it sampled.

        When the last sampling of this gateway (a signed sample: another's
        record says nothing of what sampling costs it) took longer than a
        period (a deep spool on a slow disk), sampling goes on only every so
        many periods, as many as it took, so that samplings never pile up in
        several processes.

        If the period's record is found written, it is read back: the same
        bytes are this process's own (an exclusive create sent again over
        NFS can answer EEXIST after it made the file); other bytes were
        written by another, judged when read (:meth:`catch_up`)."""
        started = self._clock()
        period = int(started // self.period)
        last = next((sample for sample in reversed(self._samples) if sample.signed), None)
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
        ended = max(started, self._clock())  # (a clock set back: 0 s)
        record = encode(ended, stats, ended - started, period=period, key=self._key)
        if not self.spool.put_record(TASK, period, record, keep=self._samples.maxlen or KEEP) \
                and self.spool.record(TASK, period) != record:
            with self._lock:
                self._planted.add(period)  # the claim is ours, the record another's
        return True

    def catch_up(self) -> None:
        """Read the records written since the last call. A missing record, or
        one that does not parse yet, is waited for (looked at again next time:
        it may still be being written) only if it is of the current or the
        last period and no later one exists; otherwise that period had no
        sample (and a record that never parsed was damaged)."""
        now = self._clock()
        current = int(now // self.period)
        with self._lock:
            first = max(self._next, current - (self._samples.maxlen or 1))
            waiting = None  # the first recent period whose record may come yet
            unparsed: list[int] = []  # periods passed over whose record did not parse
            for period in range(first, current + 1):
                data = self.spool.record(TASK, period)
                try:
                    sample = decode(data, period, self.period, now, self._key) if data else None
                except DamagedRecord as exc:
                    self._damage(period, str(exc), now)
                    waiting = None
                    continue
                if sample is None:
                    if data:
                        unparsed.append(period)
                    if period >= current - 1 and waiting is None:
                        waiting = period
                    continue
                waiting = None  # a later record came: the earlier ones never will
                if period in self._planted:
                    if not sample.signed:
                        self._damage(period, "it was written before this process, which claimed its period", now)
                        continue
                    self._claimed_twice(period, now)
                if sample.at >= self.started:  # none taken before this process started
                    self._samples.append(sample)
            for passed in unparsed:
                if waiting is None or passed < waiting:  # (not to be read again)
                    self._damage(passed, "it does not parse", now)
            self._next = current + 1 if waiting is None else waiting
            self._planted = {period for period in self._planted if period >= self._next}

    def _damage(self, period: int, why: str, now: float) -> None:
        """Count (and now and then log) a damaged record, left out of the series."""
        self.damaged += 1
        if now - self._warned >= _LOG_EVERY:
            self._warned = now
            log.warning("console: the record of period %d (.records/%s.%d) is damaged (%s): left out of the "
                        "history (%d since this process started)", period, TASK, period, why, self.damaged)

    def _claimed_twice(self, period: int, now: float) -> None:
        """Log (now and then) that another worker of this gateway sampled a period this one claimed."""
        self.claimed_twice += 1
        if now - self._warned_twice >= _LOG_EVERY:
            self._warned_twice = now
            log.warning("console: period %d was sampled by two workers of this gateway (%d times since this "
                        "process started): the claim .claims/%s.%d was removed while it was held, as a gateway "
                        "on this spool with a shorter --console-interval does (its periods are numbered "
                        "otherwise: it takes this one's claims and records for old and removes them), or one "
                        "whose clock is periods ahead; give every gateway on a spool the same --console-interval",
                        period, self.claimed_twice, TASK, period)

    def __len__(self) -> int:
        return len(self._samples)

    def __iter__(self) -> Iterator[Sample]:
        return iter(list(self._samples))

    def series(self, name: str) -> list[tuple[float, tuple[float, ...]]]:
        """(time, FIELDS) of queue ``name``, oldest first (samples without it left out)."""
        return [(s.at, s.queues[name]) for s in list(self._samples) if name in s.queues]

    def latest(self, name: str) -> tuple[float, tuple[float, ...], float] | None:
        """(time, FIELDS, seconds the sampling took) of the newest sample holding queue
        ``name`` if a worker of this gateway wrote it (signed: no planted record), else None."""
        for sample in reversed(list(self._samples)):
            if name in sample.queues:
                return (sample.at, sample.queues[name], sample.took) if sample.signed else None
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
