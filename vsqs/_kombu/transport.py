"""The vsqs:// transport: one spool, its queues, the lease keeper, the wait."""

from __future__ import annotations

import itertools
import socket
import threading
import time
from queue import Empty
from typing import Any, cast

from kombu.transport import virtual

from vsqs import InvalidArgument, Queue, QueueNotFound, Spool, StorageError, VsqsError
from vsqs._core.leases import MIN_KEPT_VISIBILITY, LeaseKeeper
from vsqs._core.limits import MAX_VISIBILITY_TIMEOUT
from vsqs._core.rules import check_queue_name, check_seconds
from vsqs._kombu.channel import Channel, can_consume
from vsqs._kombu.rules import DEFAULT_QUEUE_SETTINGS, DEFAULT_VISIBILITY_TIMEOUT, DEFAULT_WAIT, SCHEME, spool_path


class Transport(virtual.Transport):
    """kombu's transport for a vsqs spool (``vsqs:///path/to/spool``)."""

    Channel = Channel
    driver_type = driver_name = SCHEME
    can_parse_url = True
    default_port = None
    polling_interval = None  # type: ignore[assignment]  # (its own drain_events waits, never polls)
    connection_errors = (*virtual.Transport.connection_errors, StorageError, QueueNotFound)  # type: ignore[assignment]
    channel_errors = (*virtual.Transport.channel_errors, VsqsError)  # type: ignore[assignment]
    implements = virtual.Transport.implements.extend(
        asynchronous=False, exchange_type=frozenset(["direct"]), heartbeats=False
    )

    def __init__(self, client: Any, **kwargs: Any) -> None:
        super().__init__(client, **kwargs)
        options = client.transport_options
        self.spool = Spool(spool_path(client.hostname, options), create=True)
        self.visibility_timeout = check_seconds(
            options.get("visibility_timeout", DEFAULT_VISIBILITY_TIMEOUT), "visibility_timeout", MAX_VISIBILITY_TIMEOUT
        )
        if self.visibility_timeout < MIN_KEPT_VISIBILITY:
            raise InvalidArgument(
                f"visibility_timeout must be >= {MIN_KEPT_VISIBILITY:g} s: a worker keeps the leases of the "
                "messages it holds, and a shorter one could run out between two of its rounds"
            )
        self.wait = check_seconds(options.get("wait", DEFAULT_WAIT), "wait", 60)
        self.native_delays = bool(options.get("native_delays", True))
        self.durable = bool(options.get("durable", True))
        self.queue_settings: dict[str, Any] = {**DEFAULT_QUEUE_SETTINGS, **(options.get("queue_settings") or {})}
        self.deliveries = itertools.count(1)
        self._queues: dict[str, Queue] = {}
        self._queues_lock = threading.Lock()
        self._keeper: LeaseKeeper | None = None
        self._slot_freed = threading.Event()
        self.trouble: dict[str, str] = {}  # queue -> why it cannot be read now (logged once)

    @property
    def keeper(self) -> LeaseKeeper:
        """The lease keeper of this connection's delivered messages (started on first use)."""
        if self._keeper is None:
            with self._queues_lock:
                if self._keeper is None:
                    self._keeper = LeaseKeeper(self.visibility_timeout).start()
        return self._keeper

    def queue(self, name: str) -> Queue:
        """The vsqs queue ``name`` of the spool, made (with ``queue_settings``) if missing."""
        handle = self._queues.get(name) or self.find_queue(name)
        if handle is None:
            handle = self.spool.create_queue(name, **self.queue_settings)
        with self._queues_lock:
            return self._queues.setdefault(name, handle)

    def find_queue(self, name: str) -> Queue | None:
        """The vsqs queue ``name`` of the spool, or None if there is none."""
        handle = self._queues.get(name)
        if handle is not None:
            return handle
        try:
            return self.spool.queue(check_queue_name(name))
        except QueueNotFound:
            return None

    def forget_queue(self, name: str) -> None:
        """Drop the cached handle of ``name`` (gone: the next use makes it again)."""
        with self._queues_lock:
            self._queues.pop(name, None)

    def delete_queue(self, name: str) -> None:
        self.forget_queue(name)
        self.spool.delete_queue(check_queue_name(name))

    def slot_freed(self) -> None:
        self._slot_freed.set()

    def drain_events(self, connection: Any, timeout: float | None = None, **kwargs: Any) -> None:
        """Deliver what one wait claims; :class:`socket.timeout` after ``timeout`` seconds of
        nothing. A consumer whose prefetch is used up waits for an ack, not for a poll."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:  # (one attempt at least: timeout=0 is a look)
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            self._slot_freed.clear()
            try:
                cast(Any, self.cycle).get(self._deliver, timeout=remaining)
                return
            except Empty:
                if deadline is not None and time.monotonic() >= deadline:
                    raise socket.timeout() from None
                if not can_consume(cast(list[Channel], self.channels)):
                    self._slot_freed.wait(self.wait if remaining is None else min(remaining, self.wait))

    def _collect(self, connection: Any) -> None:
        """kombu drops a connection it takes for lost (Celery's reconnect) without closing it:
        only what was claimed and not delivered goes back. A task being run keeps its message,
        its lease kept: its late ack, through the old channel, still deletes it, and no other
        worker runs it meanwhile."""
        for channel in list(cast(list[Channel], self.channels)):
            channel._give_back_claimed()

    def close_connection(self, connection: Any) -> None:
        super().close_connection(connection)
        if self._keeper is not None:
            self._keeper.stop()

    @property
    def default_connection_params(self) -> dict[str, Any]:
        return {"port": None, "hostname": ""}
