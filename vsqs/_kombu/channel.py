"""The vsqs:// transport's channel: publish, claim and deliver, settle."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Iterable
from queue import Empty
from typing import TYPE_CHECKING, Any

from kombu.transport import virtual
from kombu.utils.json import dumps, loads

from vsqs import InvalidArgument, Message, Queue, QueueNotFound, QueueSuspended, StorageError, VsqsError
from vsqs._core.limits import MAX_VISIBILITY_TIMEOUT
from vsqs._core.rules import check_queue_name
from vsqs._kombu.rules import BATCH, NO_CROSS_PROCESS, PAUSE, Claimed, eta_delay, eta_of, log, settlement

if TYPE_CHECKING:
    from vsqs._kombu.transport import Transport


class QoS(virtual.QoS):
    """Prefetch as kombu counts it; a requeue is a release of the message, in place."""

    def reject(self, delivery_tag: str, requeue: bool = False) -> None:
        if requeue:
            self.channel._give_back(delivery_tag)
        self._quick_ack(delivery_tag)


class Channel(virtual.Channel):
    """One kombu channel over the transport's spool."""

    QoS = QoS
    do_restore = True
    supports_fanout = False
    connection: Transport

    def __init__(self, connection: Transport, **kwargs: Any) -> None:
        super().__init__(connection, **kwargs)
        self._transport = connection  # (kept after close: a late ack still settles its message)
        self._held: dict[str, Message] = {}  # delivery tag -> the vsqs message it names
        self._unsettled: list[tuple[str, str]] = []  # (delivery tag, how): settles to try again
        self._held_lock = threading.Lock()
        self._noack_queues: set[str] = set()
        self._turn = 0  # where the next wait over several queues starts
        self._loop: asyncio.AbstractEventLoop | None = None
        self._claimed: deque[Claimed] = deque()  # claimed, held, not yet delivered

    # -- queues ---------------------------------------------------------------

    def _queue(self, name: str) -> Queue:
        return self._transport.queue(name)

    def _new_queue(self, queue: str, **kwargs: Any) -> None:
        self._transport.queue(queue)

    def _has_queue(self, queue: str, **kwargs: Any) -> bool:
        return self._transport.find_queue(queue) is not None

    def _size(self, queue: str) -> int:
        return self._queue(queue).stats().ready

    def _purge(self, queue: str) -> int:
        """Delete the queue's waiting messages (ready or delayed); those being worked on stay."""
        handle = self._queue(queue)
        return handle.purge([info.id for info in handle.messages() if info.state != "in_flight"])

    def _delete(self, queue: str, *args: Any, **kwargs: Any) -> None:
        self._transport.delete_queue(queue)

    def exchange_declare(self, exchange: Any = None, type: Any = "direct", *args: Any, **kwargs: Any) -> Any:
        if type == "fanout":
            raise NotImplementedError(NO_CROSS_PROCESS.format(kind=type, name=exchange))
        return super().exchange_declare(exchange, type, *args, **kwargs)

    def queue_bind(self, queue: Any, exchange: Any = None, routing_key: Any = "", *args: Any, **kwargs: Any) -> Any:
        kind = self.typeof(exchange).type if exchange else "direct"
        if kind != "direct":
            raise NotImplementedError(NO_CROSS_PROCESS.format(kind=kind, name=exchange))
        return super().queue_bind(queue, exchange, routing_key, *args, **kwargs)

    # -- publish --------------------------------------------------------------

    def _lookup(self, exchange: Any, routing_key: Any, default: Any = None) -> Any:
        """The queues a message goes to: kombu's bindings (this process's), else, for a direct
        exchange, the spool's queue named by the routing key (bound by another process)."""
        found = super()._lookup(exchange, routing_key, default)
        if found or not exchange or self.typeof(exchange).type != "direct":
            return found
        try:
            if self._transport.find_queue(routing_key) is not None:
                return [routing_key]
        except InvalidArgument:
            pass
        log.warning("vsqs: no queue is bound to exchange %r with routing key %r: message dropped",
                    exchange, routing_key)
        return found

    def _put(self, queue: str, message: dict[str, Any], **kwargs: Any) -> None:
        delay = None
        if self._transport.native_delays:
            delay = eta_delay(message.get("headers"), time.time())
        self._queue(queue).publish(
            dumps(message).encode(), priority=self._get_message_priority(message), delay=delay,
            durable=self._transport.durable,
        )

    def encode_body(self, body: Any, encoding: str | None = None) -> tuple[Any, str | None]:
        """A text body (JSON, YAML) is stored as it is, readable with ``vsqs peek``; bytes in base64."""
        if isinstance(body, str):
            return body, None
        return super().encode_body(body, encoding)

    # -- consume --------------------------------------------------------------

    def basic_consume(self, queue: str, no_ack: bool, *args: Any, **kwargs: Any) -> Any:
        check_queue_name(queue)
        if no_ack:
            self._noack_queues.add(queue)
        return super().basic_consume(queue, no_ack, *args, **kwargs)

    def basic_cancel(self, consumer_tag: str) -> Any:
        queue = self._tag_to_queue.get(consumer_tag)
        if queue is not None:
            self._noack_queues.discard(queue)
            self._give_back_claimed(queue)
        return super().basic_cancel(consumer_tag)

    def basic_get(self, queue: str, no_ack: bool = False, **kwargs: Any) -> Any:
        """One message of ``queue`` now, or None (a no-ack get deletes it first)."""
        for message in self._receive(queue, 1, 0.0):
            claimed = self._claim(queue, message)
            if claimed is None:
                continue
            delivered = self.Message(claimed.payload, channel=self)
            if no_ack:
                self._settle(claimed.tag, "delete")
            else:
                self.qos.append(delivered, delivered.delivery_tag)
            return delivered
        return None

    def _get_many(self, queues: list[str], timeout: float | None = None) -> None:
        """Deliver one message: one claimed before and not yet delivered, or what a wait on
        ``queues`` claims (up to what prefetch allows, at once if something is ready, else
        as soon as something lands, within ``timeout`` seconds). One a call, so a consumer
        that runs each task as it is delivered (Celery's ``solo`` pool) can stop between two."""
        self._retry_unsettled()
        wait = min(timeout if timeout is not None else self._transport.wait, self._transport.wait)
        while not self._claimed:
            room = self.qos.can_consume_max_estimate()  # (None: no prefetch limit)
            want = max(1, BATCH if room is None else room)
            if len(queues) == 1:
                name, got = queues[0], self._receive(queues[0], want, wait)
            else:
                name, got = self._wait_any(queues, want, wait)
            if not got:
                raise Empty()
            for message in got:
                claimed = self._claim(name, message)
                if claimed is not None:
                    self._claimed.append(claimed)
        claimed = self._claimed.popleft()
        if claimed.queue in self._noack_queues:  # deleted as it is handed over, not before
            self._settle(claimed.tag, "delete")
        self._transport._deliver(claimed.payload, claimed.queue)

    def _receive(self, name: str, want: int, wait: float) -> list[Message]:
        """What one receive of queue ``name`` claims; [] after ``wait`` (or a pause) when the
        queue cannot be read now: suspended, gone (made again next time), a passing I/O error."""
        try:
            got = self._queue(name).receive_batch(want, visibility_timeout=self._transport.visibility_timeout,
                                                  wait=wait)
        except (QueueSuspended, QueueNotFound, StorageError) as exc:
            self._cannot_receive(name, exc, wait)
            return []
        self._transport.trouble.pop(name, None)
        return got

    def _cannot_receive(self, name: str, problem: VsqsError, wait: float) -> None:
        if isinstance(problem, QueueNotFound):
            self._transport.forget_queue(name)
        if self._transport.trouble.get(name) != str(problem):  # once per kind of trouble, not once per look
            self._transport.trouble[name] = str(problem)
            log.warning("vsqs: cannot receive from queue %s now (%s): trying again every %.3g s", name, problem,
                        max(wait, PAUSE))
        time.sleep(max(wait, PAUSE))

    def _wait_any(self, queues: list[str], want: int, wait: float) -> tuple[str, list[Message]]:
        """One wait on several queues (the first with messages wins; turns rotate, for fairness).

        Each queue waits with :meth:`Queue.areceive_batch` on a loop of this
        channel, its attempts run inline and one at a time; once one attempt
        claims, the others claim nothing (and are cancelled), so a wait never
        holds more than ``want`` messages."""
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
        self._turn = (self._turn + 1) % len(queues)
        order = queues[self._turn:] + queues[: self._turn]
        vt = self._transport.visibility_timeout
        winner: list[str] = []
        troubles: list[tuple[str, VsqsError]] = []

        async def wait_on(name: str) -> list[Message]:
            async def attempt(fn: Any) -> list[Message]:
                if winner:
                    return []
                got: list[Message] = fn()
                if got:
                    winner.append(name)
                return got

            try:
                return await self._queue(name).areceive_batch(want, visibility_timeout=vt, wait=wait, offload=attempt)
            except (QueueSuspended, QueueNotFound, StorageError) as exc:
                troubles.append((name, exc))
                return []

        async def first() -> tuple[str, list[Message]]:
            tasks = {asyncio.ensure_future(wait_on(name)): name for name in order}
            try:
                while tasks:
                    done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
                    for task in done:  # (at most one claims: see attempt)
                        name = tasks.pop(task)
                        if task.result():
                            return name, task.result()
                return order[0], []
            finally:
                for task in tasks:
                    task.cancel()
                if tasks:
                    await asyncio.wait(tasks)

        name, got = self._loop.run_until_complete(first())
        if not got and troubles:
            self._cannot_receive(*troubles[0], wait=0.0)
        return name, got

    def _claim(self, queue: str, message: Message) -> Claimed | None:
        """A claimed message made a kombu payload and held (its lease kept); None for a body
        that is not one, which is set aside (see :meth:`_set_aside`)."""
        try:
            payload = loads(message.body)
            properties = payload["properties"]
            if not isinstance(properties, dict) or not isinstance(properties.setdefault("delivery_info", {}), dict):
                raise TypeError("its properties are not a mapping")
            self.decode_body(payload.get("body"), properties.get("body_encoding"))
        except Exception as exc:  # any way a planted body can fail, deep nesting (RecursionError) included
            self._set_aside(queue, message, exc)
            return None
        tag = f"{message.id}.{next(self._transport.deliveries)}"
        properties["delivery_tag"] = tag
        properties["delivery_info"].update(routing_key=queue, vsqs_message_id=message.id)
        if message.receive_count > 1:  # (Celery reads it in delivery_info, kombu at the top)
            payload["redelivered"] = properties["delivery_info"]["redelivered"] = True
        headers = payload.get("headers")
        if self._transport.native_delays and isinstance(headers, dict):
            eta = eta_of(headers)
            if eta is not None and eta <= time.time():  # held until its ETA here: Celery need not hold it again
                headers["eta"] = None
        with self._held_lock:
            self._held[tag] = message
        self._transport.keeper.hold(message)
        return Claimed(queue, payload, tag)

    def _set_aside(self, queue: str, message: Message, problem: Exception) -> None:
        """A message that is not a kombu payload: dead-lettered, or hidden for 12 h where the
        queue has no dead-letter queue (never deleted: it may be someone else's)."""
        try:
            try:
                message.dead_letter()
                where = "moved to the dead-letter queue"
            except InvalidArgument:
                message.change_visibility(MAX_VISIBILITY_TIMEOUT)
                where = "hidden for 12 h (the queue has no dead-letter queue)"
        except VsqsError as exc:  # it comes back with its lease
            where = f"left as it is ({exc})"
        log.error("vsqs queue %s: message %s is not a kombu message (%s: %s): %s",
                  queue, message.id, type(problem).__name__, str(problem)[:200], where)

    # -- settle -----------------------------------------------------------------

    def _take(self, delivery_tag: str) -> Message | None:
        with self._held_lock:
            return self._held.pop(delivery_tag, None)

    def _settle(self, delivery_tag: str, how: str) -> None:
        """Settle the message a delivery tag names: ``delete``, ``release`` or ``dead_letter``.
        One that cannot be settled now (a suspended queue, a passing I/O error) stays held,
        its lease kept, and is settled at the next wait (or when the channel closes)."""
        message = self._take(delivery_tag)
        if message is None:
            return
        keeper = self._transport.keeper
        try:
            if not keeper.settle(message, settlement(message, how)):
                log.warning("vsqs: the lease of message %s was lost before its %s: it may run again",
                            message.id, how)
        except QueueNotFound:
            log.warning("vsqs: the queue of message %s is gone: nothing to %s", message.id, how)
        except (QueueSuspended, StorageError) as exc:
            keeper.hold(message)
            with self._held_lock:
                self._held[delivery_tag] = message
                self._unsettled.append((delivery_tag, how))
            log.warning("vsqs: cannot %s message %s now (%s): trying again", how, message.id, exc)
        finally:
            self._transport.slot_freed()

    def _retry_unsettled(self) -> None:
        with self._held_lock:
            unsettled, self._unsettled = self._unsettled, []
        for delivery_tag, how in unsettled:
            self._settle(delivery_tag, how)

    def _give_back_claimed(self, queue: str | None = None) -> None:
        """Release what was claimed and not delivered (of ``queue``, or all): visible again now."""
        keep = deque(claimed for claimed in self._claimed if queue is not None and claimed.queue != queue)
        gone = [claimed for claimed in self._claimed if claimed not in keep]
        self._claimed = keep
        for claimed in gone:
            self._settle(claimed.tag, "release")

    def basic_ack(self, delivery_tag: str, multiple: bool = False) -> None:
        self._settle(delivery_tag, "delete")
        super().basic_ack(delivery_tag)

    def basic_reject(self, delivery_tag: str, requeue: bool = False) -> None:
        if not requeue:
            self._settle(delivery_tag, "dead_letter")
        super().basic_reject(delivery_tag, requeue=requeue)

    def _give_back(self, delivery_tag: str) -> None:
        self._settle(delivery_tag, "release")

    def _restore(self, message: Any) -> None:
        """Give an unacknowledged message back (a warm shutdown): visible again now, in place."""
        self._give_back(message.delivery_tag)

    def close(self) -> None:
        self._give_back_claimed()  # claimed, never delivered: visible again now
        super().close()  # (kombu gives back what was delivered and not acknowledged: _restore)
        self._retry_unsettled()  # (what still fails comes back with its lease)
        if self._loop is not None:
            self._loop.close()
            self._loop = None


def can_consume(channels: Iterable[Channel]) -> bool:
    """Whether a channel has a consumer with room for another message."""
    return any(channel._consumers and channel.qos.can_consume() for channel in channels)
