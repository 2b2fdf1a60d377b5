"""A small consume loop: the engine behind ``vsqs work`` and the Spark helpers.

A :class:`Worker` runs ``handler(message)`` for each message: a normal return
deletes the message, an exception makes it visible again (after
``retry_delay``). While a handler runs, a lease keeper extends the message's
visibility (:mod:`vsqs._core.leases`) so a long job is not handed to a
second consumer. ``burst=True`` drains the queue and returns, like rq's
burst worker.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from vsqs._core.errors import InvalidArgument, StorageError
from vsqs._core.leases import LeaseKeeper
from vsqs._core.limits import MAX_VISIBILITY_TIMEOUT
from vsqs._core.message import Message
from vsqs._core.queue import Queue
from vsqs._core.rules import check_seconds

log = logging.getLogger("vsqs.worker")

_ERROR_PAUSE = 1.0  # after a failed receive


@dataclass
class WorkerStats:
    """What a worker did."""

    processed: int = 0  # handler succeeded, message deleted
    failed: int = 0  # handler raised, message made visible again
    lost: int = 0  # lease lost before settling: another consumer may get it again


class Worker:
    """Consume a queue with ``concurrency`` threads, calling ``handler`` per message.

    ``max_messages`` bounds how many messages are taken in all; ``burst``
    returns once a receive (waiting ``wait`` seconds) finds the queue empty;
    otherwise the worker runs until :meth:`stop`.
    """

    def __init__(
        self,
        queue: Queue,
        handler: Callable[[Message], object],
        *,
        visibility_timeout: float | None = None,
        wait: float = 1,
        concurrency: int = 1,
        max_messages: int | None = None,
        burst: bool = False,
        retry_delay: float = 0,
    ) -> None:
        self.queue = queue
        self.handler = handler
        if visibility_timeout is None:  # the queue's setting
            visibility_timeout = queue.settings["visibility_timeout"]
        self.visibility_timeout = check_seconds(
            visibility_timeout, "visibility_timeout", MAX_VISIBILITY_TIMEOUT
        )
        if self.visibility_timeout <= 0:
            raise InvalidArgument("visibility_timeout must be > 0 for a worker")
        self.wait = check_seconds(wait, "wait", MAX_VISIBILITY_TIMEOUT)
        self.retry_delay = check_seconds(retry_delay, "retry_delay", MAX_VISIBILITY_TIMEOUT)
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise InvalidArgument(f"concurrency must be an int >= 1, not {concurrency!r}")
        if max_messages is not None and (
            isinstance(max_messages, bool) or not isinstance(max_messages, int) or max_messages < 0
        ):
            raise InvalidArgument(f"max_messages must be an int >= 0 or None, not {max_messages!r}")
        self.concurrency = concurrency
        self.max_messages = max_messages
        self.burst = burst
        self.stats = WorkerStats()
        self._taken = 0
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._parked: list[Message] = []  # burst mode: failed, given back at the end

    def stop(self) -> None:
        """Take no new message; handlers already running finish (warm shutdown)."""
        self._stopping.set()
        self.queue._interrupt_waits()  # its receives waiting now return

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def work(self) -> WorkerStats:
        """Run until stopped, drained (burst) or ``max_messages`` taken; return the counts."""
        errors: list[BaseException] = []
        with LeaseKeeper(self.visibility_timeout) as keeper:

            def loop() -> None:
                try:
                    self._loop(keeper)
                except BaseException as exc:  # surfaced to the caller of work()
                    errors.append(exc)
                    self.stop()  # the other threads' waits return too

            threads = [
                threading.Thread(target=loop, name=f"vsqs-worker-{i}", daemon=True)
                for i in range(self.concurrency)
            ]
            for thread in threads:
                thread.start()
            try:
                for thread in threads:
                    while thread.is_alive():
                        thread.join(1.0)  # (a signal interrupts the wait at once; a timeout too, to be sure)
            finally:
                for message in self._parked:
                    self._give_back(message, keeper)
                self._parked.clear()
        if errors:
            raise errors[0]
        return self.stats

    def _reserve(self) -> bool:
        with self._lock:
            if self.max_messages is not None and self._taken >= self.max_messages:
                return False
            self._taken += 1
            return True

    def _unreserve(self) -> None:
        with self._lock:
            self._taken -= 1

    def _receive(self) -> Message | None:
        """Receive, long-polling; a stop request wakes the wait (see :meth:`stop`)."""
        if self._stopping.is_set():
            return None
        return self.queue._receive_unless(self._stopping.is_set, self.visibility_timeout, self.wait)

    def _loop(self, keeper: LeaseKeeper) -> None:
        while not self._stopping.is_set():
            if not self._reserve():
                return
            try:
                message = self._receive()
            except StorageError as exc:  # a bad file or a passing I/O error: not the end
                self._unreserve()
                log.warning("receive failed: %s", exc)
                self._stopping.wait(_ERROR_PAUSE)
                continue
            if message is None:
                self._unreserve()
                if self.burst:
                    return
                continue
            keeper.hold(message)
            self._handle(message, keeper)

    def _handle(self, message: Message, keeper: LeaseKeeper) -> None:
        try:
            self.handler(message)
        except Exception as exc:
            log.info("handler failed on %s: %s", message.id, exc)
            if self.burst:
                # a burst tries each message once: the failed one stays hidden
                # (lease kept) until the burst ends, or it would come straight back
                with self._lock:
                    self._parked.append(message)
                return
            self._give_back(message, keeper)
            return
        settled = keeper.settle(message, message.delete)
        with self._lock:
            if settled:
                self.stats.processed += 1
            else:
                self.stats.lost += 1

    def _give_back(self, message: Message, keeper: LeaseKeeper) -> None:
        """Make a failed message visible again, now or after ``retry_delay``."""
        def hide_for_retry_delay() -> object:
            return message.change_visibility(self.retry_delay)

        settled = keeper.settle(message, hide_for_retry_delay if self.retry_delay else message.release)
        with self._lock:
            if settled:
                self.stats.failed += 1
            else:
                self.stats.lost += 1
