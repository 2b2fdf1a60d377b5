"""The lease keeper: keeps messages hidden while they are being handled.

A consumer that works on a message longer than its visibility timeout must
extend the lease, or the message is handed to a second consumer. A
:class:`LeaseKeeper` does it for every message it holds, from one thread:
each message is extended by a whole ``visibility_timeout`` once half of it
has passed, until the message is settled (deleted or given back) through
:meth:`LeaseKeeper.settle`.

An extension that fails with a :class:`StorageError` (a passing I/O error)
keeps the message: it is still ours, and the next round may succeed. Any
other :class:`VsqsError` (the receipt is stale: the lease ran out and the
message was re-delivered, or it was deleted) drops it; the final settle then
reports the lease as lost. Used by :class:`vsqs.Worker` and by the Spark
helpers (``vsqs.spark.process_queue``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Protocol

from vsqs._core.errors import InvalidArgument, StaleReceipt, StorageError, VsqsError

log = logging.getLogger("vsqs.worker")

_MIN_PERIOD = 0.05  # seconds between rounds, at the least
# The shortest visibility timeout an adapter that keeps leases for long tasks accepts:
# a keeper extends at half of it, and a round may come late on a loaded machine.
MIN_KEPT_VISIBILITY = 1.0


class Leased(Protocol):
    """What the keeper needs of a message (a :class:`vsqs.Message` is one)."""

    id: str

    def change_visibility(self, seconds: float) -> object: ...


class LeaseKeeper:
    """Extends the leases of the messages it holds, until they are settled.

    ``hold(message)`` after a receive, ``settle(message, message.delete)``
    (or ``message.release``, ...) when done. Run it as a context
    (``with LeaseKeeper(30) as keeper: ...``) or with :meth:`start` and
    :meth:`stop`. Thread-safe: any number of consumers may share one keeper.
    """

    def __init__(self, visibility_timeout: float) -> None:
        if not visibility_timeout > 0:
            raise InvalidArgument(f"visibility_timeout must be > 0, not {visibility_timeout!r}")
        self.visibility_timeout = float(visibility_timeout)
        self._held: dict[int, tuple[Leased, float]] = {}  # id(message) -> (message, renew at)
        self._lock = threading.Lock()  # guards every change of a held message's receipt
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def hold(self, message: Leased) -> None:
        """Keep ``message`` (just received) hidden until it is settled."""
        with self._lock:
            self._held[id(message)] = (message, time.monotonic() + self.visibility_timeout / 2)

    def __contains__(self, message: object) -> bool:
        """Whether ``message`` is held (not settled, and its lease not lost)."""
        with self._lock:
            return id(message) in self._held

    def settle(self, message: Leased, action: Callable[[], object]) -> bool:
        """Stop holding ``message`` and run ``action`` (its delete, release, ...);
        False if the lease was lost (:class:`StaleReceipt`). No extension runs
        at the same time, so ``action`` sees the message's current receipt."""
        with self._lock:
            self._held.pop(id(message), None)
            try:
                action()
            except StaleReceipt:
                return False
            return True

    def extend_due(self, now: float | None = None) -> None:
        """One round: extend every held lease that is due at ``now`` (monotonic
        seconds; default: now). The keeper's thread calls it every period."""
        when = time.monotonic() if now is None else now
        with self._lock:
            for key, (message, renew_at) in list(self._held.items()):
                if when < renew_at:
                    continue
                try:
                    message.change_visibility(self.visibility_timeout)
                    self._held[key] = (message, when + self.visibility_timeout / 2)
                except StorageError as exc:  # passing trouble: try again next round
                    log.warning("cannot extend lease of %s yet: %s", message.id, exc)
                except VsqsError as exc:  # the lease is lost: the final settle will say so
                    log.warning("cannot extend lease of %s: %s", message.id, exc)
                    self._held.pop(key)

    def start(self) -> LeaseKeeper:
        """Start the keeper's thread (a daemon); returns the keeper."""
        if self._thread is not None:
            raise RuntimeError("a lease keeper starts once")
        self._thread = threading.Thread(target=self._run, name="vsqs-lease-keeper", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop extending leases and wait for the thread. Messages still held
        keep the lease they have: it runs out on its own."""
        self._stopping.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()

    def __enter__(self) -> LeaseKeeper:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def _run(self) -> None:
        period = max(_MIN_PERIOD, self.visibility_timeout / 6)
        while not self._stopping.wait(period):
            try:
                self.extend_due()
            except Exception:  # a keeper that dies would let every lease run out
                log.exception("lease keeper round failed")
