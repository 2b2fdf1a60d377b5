"""Streaming read: claim on the driver, read on executors, delete on commit.

Each micro-batch claims messages on the driver; their receipts go into
Spark's offset log, so a batch's contents are fixed and a restarted query
replays it. The messages are deleted once Spark has committed the batch.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition

from vsqs import Message, Queue, StaleReceipt
from vsqs._core.limits import MAX_BATCH
from vsqs._spark.options import MAX_PER_TRIGGER, Options
from vsqs._spark.schema import row, timestamp, wants_content

try:  # pyspark >= 4.2: admission control and Trigger.AvailableNow for Python sources
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable,
        ReadLimit,
        ReadMaxRows,
        SupportsTriggerAvailableNow,
    )

    HAVE_READ_LIMITS = True
except ImportError:  # pragma: no cover - older pyspark
    HAVE_READ_LIMITS = False

    class SupportsTriggerAvailableNow:  # type: ignore[no-redef]
        """Stand-in so the class statement below works on pyspark < 4.2."""


log = logging.getLogger("vsqs.spark")

_CLAIM_CHUNK = MAX_BATCH  # Queue.receive_batch takes at most this many at once
_DELETE_THREADS = 8  # a committed batch is deleted by this many threads ...
_PARALLEL_DELETES_FROM = 64  # ... when it has at least this many messages
_SETTLED_KEPT = 64  # seqs of recently deleted batches remembered


class ClaimedPartition(InputPartition):
    """Claimed messages of one micro-batch: [id, receipt, receive_count, sent_at_us, priority]."""

    def __init__(self, messages: list[list[Any]]) -> None:
        self.messages = messages


class ClaimingStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Each micro-batch claims messages on the driver in ``latestOffset``.

    An offset is ``{"seq": n, "messages": [[id, receipt, receive_count,
    sent_at_us, priority], ...]}``: the batch's messages, so that Spark's
    offset log fixes a batch's contents and a restarted query replays it.
    Executors read each message by its receipt (``Queue.read_message``). A
    batch's messages are deleted once Spark has committed it: in
    ``commit(end)``, and in ``latestOffset(start)``, which Spark calls only
    after the batch ending at ``start`` is in its commit log (it never calls
    ``commit`` for the last batch of a run).
    """

    def __init__(self, options: Options, columns: list[str]) -> None:
        self.options = options
        self.columns = columns
        self._settled: dict[int, None] = {}  # recent seqs whose messages this process deleted
        self._budget: int | None = None  # Trigger.AvailableNow: messages left to claim
        self._queue: Queue | None = None  # the driver's handle (keeps its cached listing)

    def _driver_queue(self) -> Queue:
        if self._queue is None:
            self._queue = self.options.queue()
        return self._queue

    # -- offsets (driver) --

    def initialOffset(self) -> dict[str, Any]:
        return {"seq": 0, "messages": []}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.options.max_per_trigger)

    def prepareForTriggerAvailableNow(self) -> None:
        # "what is available now": as many messages as are visible now. The
        # query ends once that many were claimed, even if producers keep going.
        self._budget = self._driver_queue().stats().ready

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        self._settle(start)  # the batch ending at start is committed: delete it
        if isinstance(limit, ReadMaxRows):
            wanted = limit.max_rows
        elif isinstance(limit, ReadAllAvailable):
            wanted = MAX_PER_TRIGGER
        else:
            wanted = self.options.max_per_trigger
        if self._budget is not None:
            wanted = min(wanted, self._budget)
        claimed = self._claim(wanted)
        if not claimed:
            return start
        if self._budget is not None:
            self._budget -= len(claimed)
        return {"seq": int(start["seq"]) + 1, "messages": claimed}

    def _claim(self, wanted: int) -> list[list[Any]]:
        queue = self._driver_queue()
        got: list[Message] = []
        while len(got) < wanted:
            batch = queue.receive_batch(
                min(wanted - len(got), _CLAIM_CHUNK),
                visibility_timeout=self.options.visibility_timeout,
                read_bodies=False,
            )
            if not batch:
                break
            got.extend(batch)
        return [[m.id, m.receipt, m.receive_count, round(m.sent_at * 1_000_000), m.priority] for m in got]

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        if int(end["seq"]) == int(start["seq"]):
            return []
        messages = end.get("messages") or []
        return [ClaimedPartition(chunk) for chunk in self.options.split(messages)]

    def commit(self, end: dict[str, Any]) -> None:
        self._settle(end)

    def _settle(self, offset: dict[str, Any]) -> None:
        """Delete the messages of a committed batch (idempotent)."""
        seq = int(offset.get("seq", 0))
        messages = offset.get("messages") or []
        if seq in self._settled or not messages:
            return
        queue = self._driver_queue()

        def delete(receipt: str) -> bool:
            try:
                queue.delete(receipt)
                return True
            except StaleReceipt:  # already deleted (replay), or re-received after the lease ran out
                return False

        receipts = [entry[1] for entry in messages]
        if len(receipts) < _PARALLEL_DELETES_FROM:
            stale = sum(1 for receipt in receipts if not delete(receipt))
        else:  # on NFS each unlink is a round trip: overlap them (a local disk gains little)
            with ThreadPoolExecutor(_DELETE_THREADS, thread_name_prefix="vsqs-delete") as pool:
                stale = sum(1 for done in pool.map(delete, receipts) if not done)
        self._settled[seq] = None
        while len(self._settled) > _SETTLED_KEPT:  # forgetting one only costs a repeated, harmless delete
            del self._settled[next(iter(self._settled))]
        if stale:
            log.info(
                "batch %d: %d of %d messages were no longer held by their receipt "
                "(deleted already, or re-delivered after the visibility timeout)",
                seq,
                stale,
                len(messages),
            )

    # -- reading (executors) --

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        assert isinstance(partition, ClaimedPartition)
        queue = self.options.queue()
        content = wants_content(self.columns)
        skipped = 0
        for entry in partition.messages:
            # [id, receipt, receive_count, sent_at_us, priority]: all but the
            # receipt are in the receipt too (and in the message read by it)
            try:
                # reading also proves that the receipt still holds the message
                message = queue.read_message(entry[1])
            except StaleReceipt:
                # The lease ran out and another consumer received the message
                # (or it was deleted): it is theirs now; leave it out.
                skipped += 1
                continue
            values = {
                "id": message.id,
                "body": message.body,
                "state": "in_flight",
                "receive_count": message.receive_count,
                "sent_at": timestamp(message.sent_at),
                "priority": message.priority,
                "group": message.group if content else None,
                "attributes": message.attributes if content else None,
            }
            yield row(values, self.columns)
        if skipped:
            log.warning(
                "%d claimed messages were no longer held by this query (their lease ran out "
                "and another consumer received them); they are left out of this batch",
                skipped,
            )

    def stop(self) -> None:
        pass
