"""Celery and kombu on a vsqs spool, with no broker: the ``vsqs://`` transport.

``import vsqs.kombu`` registers the scheme, then::

    app = Celery("proj", broker="vsqs:///srv/spool")

(or, without the import, ``broker_url="vsqs:///srv/spool"`` with
``broker_transport="vsqs.kombu:Transport"``). Each kombu queue is a vsqs queue
of the spool, made on demand. A delivered message stays in its queue, hidden,
until it is acknowledged: an ack deletes it; a requeue (a reject with requeue,
a warm shutdown giving back what it prefetched) makes it visible again now; a
reject without requeue moves it to the queue's dead-letter queue (or deletes
it where the queue has none, as AMQP drops it). A worker that dies holding a
message loses nothing: it comes back when its visibility timeout runs out,
and while a worker is alive its leases are extended, however long a task (or
an ETA it waits for) runs.

Transport options (``broker_transport_options``):

- ``visibility_timeout`` (seconds, default 30): how long a message delivered
  to a worker that then dies stays hidden;
- ``queue_settings``: vsqs settings for the queues this transport makes, over
  ``{"max_receives": 20}`` (a dead-letter queue for rejects; a task that kills
  its worker is tried 20 times); ``{"max_receives": None}`` for none;
- ``native_delays`` (default True): a Celery task with an ETA or countdown is
  published delayed until then (a vsqs delay), so no worker holds it in
  memory meanwhile; False leaves it to Celery, as with other brokers;
- ``wait`` (seconds, default 1): the longest single wait of a consumer;
- ``durable`` (default True): each publish fsyncs its file and directory
  before it returns; False skips both (a host crash may lose a task just
  sent, as with kombu's filesystem transport, which never fsyncs).

Priorities 0-9 are vsqs priorities (higher first, as in AMQP). What kombu's
virtual transports cannot give here is refused, not silently broken: a
fanout exchange (``celery inspect``, ``celery control``, broadcast queues)
and a queue bound to a topic exchange (``celery events``, Flower) raise
:class:`NotImplementedError` naming docs/tasks.md, because bindings live in
each process's memory and never reach other processes.
"""

from __future__ import annotations

from kombu.transport import TRANSPORT_ALIASES

from vsqs._kombu.channel import Channel
from vsqs._kombu.rules import SCHEME, eta_delay, eta_of, spool_path
from vsqs._kombu.transport import Transport

__all__ = ["Channel", "Transport", "eta_delay", "eta_of", "spool_path"]

TRANSPORT_ALIASES.setdefault(SCHEME, "vsqs.kombu:Transport")
