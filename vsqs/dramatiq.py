"""A Dramatiq broker over vsqs: each Dramatiq queue is a vsqs queue in a spool.

    import dramatiq
    from vsqs.dramatiq import VsqsBroker

    dramatiq.set_broker(VsqsBroker("/spool/tasks", visibility_timeout=60))

    @dramatiq.actor(max_retries=3)
    def resize(name: str) -> None: ...

Run workers with ``dramatiq my_actors``: any number of processes, on any
hosts sharing the spool. What each operation maps to:

- ``enqueue``: one durable publish of the encoded message; with a delay, a
  native vsqs delay (see :meth:`VsqsBroker.enqueue`);
- ``consume``: blocking receives that wake when a message lands, at most
  ``prefetch`` messages held at once, their leases extended while held;
- ack: delete; nack: the vsqs dead-letter queue (``Message.dead_letter``);
  requeue (a worker's warm shutdown): release, visible again at once;
- ``flush``: purge; ``join``: wait for no ready, delayed or in-flight message.

A worker killed outright loses nothing: its messages are visible again once
their visibility timeout runs out. Needs ``pip install vsqs[dramatiq]``;
``docs/tasks.md`` has the details.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import dramatiq
from dramatiq.broker import Consumer, MessageProxy
from dramatiq.common import current_millis, q_name
from dramatiq.errors import ConnectionClosed, DecodeError, QueueJoinTimeout
from dramatiq.errors import QueueNotFound as DramatiqQueueNotFound
from dramatiq.middleware import Middleware

import vsqs
from vsqs import InvalidArgument, QueueNotFound, QueueSuspended, StorageError, VsqsError
from vsqs._core import settings as _settings
from vsqs._core.leases import MIN_KEPT_VISIBILITY, LeaseKeeper
from vsqs._core.limits import MAX_BATCH, MAX_DELAY, MAX_VISIBILITY_TIMEOUT
from vsqs._core.rules import check_seconds, is_queue_name

__all__ = ["DEFAULT_QUEUE_SETTINGS", "VsqsBroker"]

log = logging.getLogger("vsqs.dramatiq")

_PAUSE = 0.2  # seconds between looks at a queue that cannot be read now (suspended, gone)

#: Settings of the queues the broker creates. ``max_receives`` gives each a
#: dead-letter queue (``<name>.dlq``) for nack, and bounds how often a message
#: that kills its worker outright is tried (RabbitMQ's quorum queues also
#: stop at 20 deliveries).
DEFAULT_QUEUE_SETTINGS: Mapping[str, Any] = {"max_receives": 20}


class VsqsBroker(dramatiq.Broker):
    """A Dramatiq broker whose queues are vsqs queues in the spool at ``spool_path``.

    ``visibility_timeout`` (seconds): how long a received message stays hidden
    without its lease being extended; the broker extends the leases of the
    messages it holds, so this is how soon the messages of a worker that died
    are delivered again. ``queue_settings`` are applied to the queues the
    broker creates (not to existing ones), over :data:`DEFAULT_QUEUE_SETTINGS`;
    ``{"max_receives": None}`` leaves them without a dead-letter queue, and a
    nack then deletes the message with an error in the log.

    Dramatiq queue names must be vsqs queue names (1-80 characters of A-Z a-z
    0-9 _ . -, starting with a letter or digit, no ``..``) and not end in
    Dramatiq's own ``.DQ`` or ``.XQ``; others are refused with
    :class:`vsqs.InvalidArgument` when declared, rather than mapped to a name
    another Dramatiq queue could also map to.
    """

    def __init__(
        self,
        spool_path: str | os.PathLike[str],
        *,
        middleware: list[Middleware] | None = None,
        visibility_timeout: float = 30.0,
        queue_settings: Mapping[str, Any] | None = None,
        poll_interval: float | None = None,
    ) -> None:
        super().__init__(middleware=middleware)
        self.visibility_timeout = check_seconds(visibility_timeout, "visibility_timeout", MAX_VISIBILITY_TIMEOUT)
        if self.visibility_timeout < MIN_KEPT_VISIBILITY:
            raise InvalidArgument(
                f"visibility_timeout must be >= {MIN_KEPT_VISIBILITY:g} s: the broker keeps the leases of the "
                "messages it holds, and a shorter one could run out between two of its rounds"
            )
        settings = {**DEFAULT_QUEUE_SETTINGS, **(queue_settings or {})}
        _settings.validate(settings)  # a bad setting fails here, not at the first declare
        self.queue_settings: Mapping[str, Any] = settings
        self.spool = vsqs.Spool(spool_path, create=True)
        self.poll_interval = poll_interval
        self.queues: dict[str, vsqs.Queue] = {}
        self._lock = threading.Lock()
        self._keeper: LeaseKeeper | None = None
        self._processing = threading.local()  # the message a worker thread is processing, if any
        self._kept_for_retry: set[str] = set()  # ids of messages whose follow-up publish failed
        self.middleware.insert(0, _FollowUps(self))  # (first: its after-hooks run last)

    # -- queues ------------------------------------------------------------

    def declare_queue(self, queue_name: str) -> None:
        """Open the vsqs queue ``queue_name``, creating it with :attr:`queue_settings`
        if missing. No delay queue is declared: delays are native (see :meth:`enqueue`)."""
        if queue_name in self.queues:
            return
        if not is_queue_name(queue_name):
            raise InvalidArgument(
                f"Dramatiq queue name {queue_name!r} is not a vsqs queue name: use 1-80 characters of "
                "A-Z a-z 0-9 _ . -, starting with a letter or digit, without '..'"
            )
        if q_name(queue_name) != queue_name:
            raise InvalidArgument(f"Dramatiq queue name {queue_name!r}: the endings .DQ and .XQ are Dramatiq's own")
        self.emit_before("declare_queue", queue_name)
        path = self.spool.path(queue_name)
        try:
            queue = vsqs.Queue(path, poll_interval=self.poll_interval)
        except QueueNotFound:
            self.spool.create_queue(queue_name, **self.queue_settings)
            queue = vsqs.Queue(path, poll_interval=self.poll_interval)
        if not _has_dead_letter_queue(queue):
            log.warning("queue %s has no dead-letter queue: a nacked message there is deleted", path)
        with self._lock:
            self.queues.setdefault(queue_name, queue)
        self.emit_after("declare_queue", queue_name)

    def get_declared_queues(self) -> set[str]:
        return set(self.queues)

    def get_declared_delay_queues(self) -> set[str]:
        """Always empty: a delayed message waits in its own queue, hidden until its time."""
        return set()

    def redeclare(self, queue_name: str) -> vsqs.Queue:
        """The vsqs queue of ``queue_name`` made again (its directory was removed)."""
        with self._lock:
            self.queues.pop(queue_name, None)
        self.declare_queue(queue_name)
        return self.queues[queue_name]

    def queue(self, queue_name: str) -> vsqs.Queue:
        """The vsqs queue behind the declared Dramatiq queue ``queue_name`` (or its delay queue)."""
        try:
            return self.queues[q_name(queue_name)]
        except KeyError:
            raise DramatiqQueueNotFound(queue_name) from None

    # -- publish -----------------------------------------------------------

    def enqueue(self, message: dramatiq.Message[Any], *, delay: int | None = None) -> dramatiq.Message[Any]:
        """Publish ``message``; ``delay`` in milliseconds (at most 366 days).

        A delayed message is published into its queue itself, hidden by vsqs until
        its time, rather than into Dramatiq's delay queue, whose messages a worker
        holds in memory until their ``eta``: here no worker holds a delayed message,
        so a crash or a restart loses or re-delivers nothing, and a message delayed
        for a month costs no worker anything meanwhile. A message carrying an
        ``eta`` (from a broker that keeps delays in memory) gets the time left as
        a native delay and loses the ``eta``, so no worker delays it twice.
        """
        queue_name = q_name(message.queue_name)
        if queue_name not in self.queues:
            self.declare_queue(queue_name)
        message = message.copy(queue_name=queue_name)  # a plain Message, also when given a proxy
        eta = message.options.pop("eta", None)
        if delay is None and isinstance(eta, (int, float)):
            delay = int(eta - current_millis())
        seconds = check_seconds(delay / 1000, "delay", MAX_DELAY) if delay is not None and delay > 0 else None
        self.emit_before("enqueue", message, delay)
        try:
            self.queues[queue_name].publish(message.encode(), delay=seconds)
        except VsqsError:
            self._follow_up_failed()
            raise
        self.emit_after("enqueue", message, delay)
        return message

    def _follow_up_failed(self) -> None:
        """A publish made while a message is processed (a retry, a pipeline's next step, a
        callback) failed, and Dramatiq only logs what its middleware raises: that message is
        not deleted when it is acked but made visible again, so its work is done again."""
        processing = getattr(self._processing, "message_id", None)
        if processing is not None:
            self._follow_up_failed_for(processing)
            log.error("a message published while %s was processed could not be: %s will be delivered again",
                      processing, processing)

    def _follow_up_failed_for(self, message_id: str) -> None:
        with self._lock:
            self._kept_for_retry.add(message_id)

    def _must_keep(self, message_id: str) -> bool:
        with self._lock:
            if message_id in self._kept_for_retry:
                self._kept_for_retry.discard(message_id)
                return True
            return False

    # -- consume -----------------------------------------------------------

    def consume(self, queue_name: str, prefetch: int = 1, timeout: int = 5000) -> Consumer:
        """A consumer of ``queue_name`` holding at most ``prefetch`` messages not yet
        acked, nacked or requeued; ``__next__`` waits up to ``timeout`` ms."""
        if prefetch < 1:
            raise InvalidArgument(f"prefetch must be >= 1, not {prefetch!r}")
        return _VsqsConsumer(self, self.queue(queue_name), q_name(queue_name), prefetch, timeout / 1000)

    def lease_keeper(self) -> LeaseKeeper:
        """The one thread that extends the leases of every message the broker's consumers hold."""
        with self._lock:
            if self._keeper is None:
                self._keeper = LeaseKeeper(self.visibility_timeout).start()
            return self._keeper

    def close(self) -> None:
        """Stop extending leases: messages still held keep theirs until it runs out."""
        with self._lock:
            keeper, self._keeper = self._keeper, None
        if keeper is not None:
            keeper.stop()

    # -- maintenance ---------------------------------------------------------

    def flush(self, queue_name: str) -> None:
        """Delete every message of the queue, delayed and in flight included."""
        self.queue(queue_name).purge()

    def flush_all(self) -> None:
        for queue_name in list(self.queues):
            self.flush(queue_name)

    def join(self, queue_name: str, *, interval: int = 100, timeout: int | None = None) -> None:
        """Wait until ``queue_name`` holds no ready, delayed or in-flight message,
        looking every ``interval`` ms; :class:`dramatiq.errors.QueueJoinTimeout`
        after ``timeout`` ms. Meant for tests, as Dramatiq's own."""
        queue = self.queue(queue_name)
        deadline = None if timeout is None else time.monotonic() + timeout / 1000
        while queue.stats().total:
            if deadline is not None and time.monotonic() >= deadline:
                raise QueueJoinTimeout(queue_name)
            time.sleep(interval / 1000)


class _VsqsMessageProxy(MessageProxy):
    """A Dramatiq message with the vsqs message (and its receipt) it came in."""

    def __init__(self, message: dramatiq.Message[Any], received: vsqs.Message) -> None:
        super().__init__(message)
        self.received = received


class _FollowUps(Middleware):
    """Tells the broker which message each worker thread is processing (see
    :meth:`VsqsBroker._follow_up_failed`)."""

    def __init__(self, broker: VsqsBroker) -> None:
        self.broker = broker

    def before_process_message(self, broker: dramatiq.Broker, message: MessageProxy) -> None:
        self.broker._processing.message_id = message.message_id

    def after_process_message(self, broker: dramatiq.Broker, message: MessageProxy, *,
                              result: Any = None, exception: BaseException | None = None) -> None:
        self.broker._processing.message_id = None

    def after_skip_message(self, broker: dramatiq.Broker, message: MessageProxy) -> None:
        self.broker._processing.message_id = None


class _VsqsConsumer(Consumer):
    """Receives from one vsqs queue for a Dramatiq consumer thread.

    ``__next__`` runs on the consumer thread; ack, nack and requeue come from the
    worker threads. ``prefetch`` bounds the messages received and not yet settled:
    those handed out plus those received in the same batch and not yet handed out.
    """

    def __init__(self, broker: VsqsBroker, queue: vsqs.Queue, name: str, prefetch: int, timeout: float) -> None:
        self.broker = broker
        self.queue = queue
        self.queue_name = name
        self.prefetch = prefetch
        self.timeout = timeout
        self._buffer: deque[vsqs.Message] = deque()  # received, not yet handed out
        self._handed: dict[int, vsqs.Message] = {}  # handed out, not yet settled
        self._room = threading.Condition()  # notified when a handed-out message is settled
        self._closed = threading.Event()
        self._trouble: str | None = None  # why the queue cannot be read now (said once)

    @property
    def keeper(self) -> LeaseKeeper:
        """The broker's lease keeper now (a new one after :meth:`VsqsBroker.close`)."""
        return self.broker.lease_keeper()

    @property
    def outstanding(self) -> int:
        """How many messages this consumer holds: handed out or waiting in its buffer."""
        with self._room:
            return len(self._handed) + len(self._buffer)

    def __next__(self) -> MessageProxy | None:
        deadline = time.monotonic() + self.timeout
        while True:
            if not self._buffer:
                with self._room:
                    while len(self._handed) >= self.prefetch:  # full: wait for a settle
                        remaining = deadline - time.monotonic()
                        if remaining <= 0:
                            return None
                        self._room.wait(remaining)
                    room = self.prefetch - len(self._handed)
                received = self._receive(min(room, MAX_BATCH), max(0.0, deadline - time.monotonic()))
                if not received:
                    return None
                self._buffer.extend(received)
            message = self._buffer.popleft()
            decoded = self._decoded(message)
            if decoded is None:
                continue
            with self._room:
                self._handed[id(message)] = message
            return _VsqsMessageProxy(decoded, message)

    def _decoded(self, message: vsqs.Message) -> dramatiq.Message[Any] | None:
        """The Dramatiq message a claimed one holds; None for one set aside (a body that is no
        Dramatiq message, dead-lettered) or published again (one carrying an ``eta``)."""
        try:
            decoded = dramatiq.Message.decode(message.body)
            problem = _shape_problem(decoded)
        except DecodeError as exc:
            decoded, problem = None, str(exc.__cause__ or exc)
        if decoded is None or problem is not None:
            log.error("message %s of %s is not a Dramatiq message (%s): %r", message.id, self.queue.path,
                      problem, message.body[:120])
            self._settle_quietly(message, _set_aside)
            return None
        if decoded.queue_name != self.queue_name:  # moved here by hand, or by redrive elsewhere
            decoded = decoded.copy(queue_name=self.queue_name)
        if "eta" in decoded.options:  # (from a broker that delays in memory): delayed here instead
            def publish_delayed(held: vsqs.Message) -> None:
                self.broker.enqueue(decoded)
                held.delete()

            self._settle_quietly(message, publish_delayed)
            return None
        return decoded

    def _settle_quietly(self, message: vsqs.Message, action: Callable[[vsqs.Message], None]) -> None:
        """Settle a message never handed out; a failure leaves it to come back with its lease."""
        try:
            self.keeper.settle(message, lambda: action(message))
        except VsqsError as exc:
            log.warning("message %s of %s: %s; it comes back when its lease runs out", message.id,
                        self.queue.path, exc)

    def _receive(self, count: int, wait: float) -> list[vsqs.Message]:
        try:
            received = self.queue.receive_batch(count, visibility_timeout=self.broker.visibility_timeout, wait=wait)
        except (QueueSuspended, QueueNotFound) as exc:  # nothing to take meanwhile; close() ends the wait
            if self._trouble != str(exc):
                self._trouble = str(exc)
                log.warning("cannot receive from %s now (%s): waiting", self.queue.path, exc)
            if isinstance(exc, QueueNotFound):
                self.queue = self.broker.redeclare(self.queue_name)
            self._closed.wait(max(wait, _PAUSE))
            return []
        except StorageError as exc:  # Dramatiq restarts the consumer after a pause
            raise ConnectionClosed(exc) from exc
        self._trouble = None
        keeper = self.keeper
        for message in received:
            keeper.hold(message)
        return received

    def _settled(self, proxy: MessageProxy) -> vsqs.Message:
        """Stop counting ``proxy`` against this consumer's prefetch; its vsqs message."""
        received: vsqs.Message = proxy.received
        with self._room:
            if self._handed.pop(id(received), None) is not None:
                self._room.notify()
        return received

    def _not_now(self, received: vsqs.Message, exc: VsqsError) -> ConnectionClosed:
        """A settle that cannot be done now (a passing I/O error, a suspended queue): the message
        stays held, its lease extended at once, and Dramatiq tries the settle again later."""
        try:
            received.change_visibility(self.broker.visibility_timeout)
        except VsqsError:
            pass  # (the next round of the keeper tries again)
        self.keeper.hold(received)
        return ConnectionClosed(exc)

    def ack(self, message: MessageProxy) -> None:
        """Delete the message (or, if a publish made while it was processed failed, make it
        visible again, so that its work is done again). A lost lease is logged."""
        received = self._settled(message)
        keep = self.broker._must_keep(message.message_id)
        try:
            if not self.keeper.settle(received, received.release if keep else received.delete):
                log.warning("message %s (%s) of %s was done, but its lease had run out: it is delivered again",
                            received.id, message.message_id, self.queue.path)
        except (StorageError, QueueSuspended) as exc:
            if keep:
                self.broker._follow_up_failed_for(message.message_id)
            raise self._not_now(received, exc) from exc
        except VsqsError as exc:
            log.error("cannot delete message %s of %s (%s): it is delivered again", received.id, self.queue.path, exc)

    def nack(self, message: MessageProxy) -> None:
        """Move the message to the queue's dead-letter queue (deleted if it has none)."""
        received = self._settled(message)
        try:
            _reject(self.keeper, received, self.queue)
        except (StorageError, QueueSuspended) as exc:
            raise self._not_now(received, exc) from exc
        except VsqsError as exc:
            log.error("cannot dead-letter message %s of %s (%s)", received.id, self.queue.path, exc)

    def requeue(self, messages: Iterable[MessageProxy]) -> None:
        """Make ``messages`` visible again now (a warm shutdown hands back those not started)."""
        for message in messages:
            _release(self.keeper, self._settled(message))

    def close(self) -> None:
        """Release the messages received and not handed out; those handed out stay held."""
        self._closed.set()
        while self._buffer:
            _release(self.keeper, self._buffer.popleft())


def _shape_problem(message: dramatiq.Message[Any]) -> str | None:
    """What is wrong with the fields of a decoded message (a body planted in the spool
    may be JSON of Dramatiq's keys with any values), or None."""
    for field, kinds in (("queue_name", str), ("actor_name", str), ("message_id", str), ("args", (list, tuple)),
                         ("kwargs", dict), ("options", dict), ("message_timestamp", int)):
        value = getattr(message, field, None)
        if not isinstance(value, kinds) or isinstance(value, bool):
            return f"its {field} is {type(value).__name__}"
    return None


def _set_aside(message: vsqs.Message) -> None:
    """A body that is no Dramatiq message: dead-lettered, or hidden for 12 h where the queue has
    no dead-letter queue (never deleted: it may be another program's)."""
    try:
        message.dead_letter()
    except InvalidArgument:
        message.change_visibility(MAX_VISIBILITY_TIMEOUT)


def _has_dead_letter_queue(queue: vsqs.Queue) -> bool:
    settings = queue.settings
    return settings["max_receives"] is not None or bool(settings["dead_letter"])


def _reject(keeper: LeaseKeeper, message: vsqs.Message, queue: vsqs.Queue) -> None:
    """Dead-letter a held message, or delete it, loudly, if its queue has no dead-letter queue."""
    try:
        settled = keeper.settle(message, message.dead_letter)
    except InvalidArgument:  # no dead-letter queue: settle() has already stopped holding it
        log.error("queue %s has no dead-letter queue: deleting failed message %s", queue.path, message.id)
        settled = keeper.settle(message, message.delete)
    if not settled:
        log.warning("message %s of %s failed, but its lease had run out: it is delivered again",
                    message.id, queue.path)


def _release(keeper: LeaseKeeper, message: vsqs.Message) -> None:
    try:
        keeper.settle(message, message.release)  # a lost lease: it is visible again anyway
    except VsqsError as exc:
        log.warning("cannot release message %s (%s): it is visible again when its lease runs out", message.id, exc)
