"""The Prometheus gauges of a queue's state: the one source of their names,
help texts and labels, for ``vsqs stats --prometheus`` and the gateway's
``/metrics``. Pure data and one function; no prometheus_client needed.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

from vsqs._core.message import QueueStats

QUEUE_LABELS = ("queue",)  # every queue gauge has these first: the queue's name, never its path
STATES = ("ready", "in_flight", "delayed")


class Gauge(NamedTuple):
    name: str
    help: str
    labels: tuple[str, ...]  # after QUEUE_LABELS


MESSAGES = Gauge("vsqs_messages", "Messages in the queue, by state.", ("state",))
DEAD_LETTERED = Gauge("vsqs_dead_lettered_messages", "Messages of this queue now in its dead-letter queue.", ())
OLDEST_AGE = Gauge("vsqs_oldest_message_age_seconds", "Seconds since the oldest visible message was sent.", ())
GROUP_MESSAGES = Gauge("vsqs_group_messages", "Messages of each message group, by state.", ("group", "state"))

QUEUE_GAUGES = (MESSAGES, DEAD_LETTERED, OLDEST_AGE)  # from QueueStats without groups


class Sample(NamedTuple):
    gauge: Gauge
    labels: tuple[str, ...]  # values of gauge.labels, in order
    value: float


def queue_label_values(name: str) -> tuple[str, ...]:
    """The values of QUEUE_LABELS for the queue ``name``. No path: a scrape of
    the gateway's ``/metrics`` must not tell clients where the spool lives,
    and ``vsqs stats --prometheus`` labels alike."""
    return (name,)


def queue_samples(stats: QueueStats) -> Iterator[Sample]:
    """The samples of one queue's gauges (its group gauges too if ``stats``
    counted groups), without the QUEUE_LABELS values, which the caller adds."""
    for state in STATES:
        yield Sample(MESSAGES, (state,), getattr(stats, state))
    yield Sample(DEAD_LETTERED, (), stats.dead_lettered)
    yield Sample(OLDEST_AGE, (), stats.oldest_ready_age)
    for group, tally in sorted((stats.groups or {}).items()):
        for state, count in tally.items():
            yield Sample(GROUP_MESSAGES, (group, state), count)
