"""Streaming read: the driver plans, executors claim, read and delete.

The driver does a bounded amount of work per micro-batch: one listing of the
queue (are there messages?), one of the query's manifests (what is left to
delete?) and a small file per partition of the last batch (how many did it
claim?). Its offsets are a few numbers: ``{"v": 1, "query": Q, "seq": N,
"parts": P, "take": M, "settle": [[batch, partitions], ...]}``. The P
partitions of batch N claim up to M messages in all (an even share each) on
the executors; each records the receipts in a manifest (``manifest.py``)
before it returns a row of them, and deletes the messages of the batches
in ``settle``: committed batches (Spark calls ``latestOffset(start)`` only
once the batch ending at ``start`` is in its commit log). A partition run again (a task retry, a replay after a driver
crash) re-reads its manifest instead of claiming: a replayed batch is the
same batch.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterator
from typing import Any

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.types import StructType

from vsqs import InvalidArgument, Queue
from vsqs._spark import manifest as manifests
from vsqs._spark.claims import (
    LegacyPartition,
    StreamPartition,
    read_legacy,
    read_partition,
    settle_receipts,
)
from vsqs._spark.options import MAX_PER_TRIGGER, MESSAGES_PER_PARTITION, Options

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

OFFSET_VERSION = 1
MAX_SETTLE_ENTRIES = 64  # batches settled by one micro-batch (more wait for the next)
MIN_CLAIM_PARTITIONS = 2  # a claiming batch has at least this many partitions (if it wants that many messages)
IDLE_AFTER_FRUITLESS = 1.0  # seconds without claiming batches after two that claimed nothing


class ClaimingStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Plans micro-batches on the driver; executors claim, read and delete.

    ``read`` and the helpers of ``claims.py`` run on the executors; every
    other method runs on the driver and does a bounded amount of work, not
    one operation per message.
    """

    def __init__(self, options: Options, columns: list[str], schema: StructType) -> None:
        self.options = options
        self.columns = columns
        self.schema = schema
        self._budget: int | None = None  # Trigger.AvailableNow: messages left to plan
        self._queue: Queue | None = None  # the driver's handle
        # (query, seq): nothing to settle up to seq (but what a batch tried and failed to)
        self._clean_through: tuple[str, int] | None = None
        self._planned: dict[int, int] = {}  # seq -> messages this run planned for it (AvailableNow)
        self._fruitless = 0  # claiming batches in a row that claimed nothing
        self._last_full = False  # the last batch claimed all it planned: more are likely there
        self._idle_until = 0.0  # after fruitless batches: no claiming batch before this (monotonic)
        self._ready_now: int | None = None  # visible messages counted just before the first batch (AvailableNow)
        self._tried: tuple[str, set[int]] = ("", set())  # (query, batches a batch of this run was given to settle)

    def _driver_queue(self) -> Queue:
        if self._queue is None:
            self._queue = self.options.queue()
        return self._queue

    # -- offsets (driver) --

    def initialOffset(self) -> dict[str, Any]:
        # a new query: a new id for its manifests (carried by every later offset)
        return {"v": OFFSET_VERSION, "query": manifests.new_query_id(), "seq": 0}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.options.max_per_trigger)

    def prepareForTriggerAvailableNow(self) -> None:
        # "what is available now": as many messages as are visible now. The
        # query ends once that many were planned, even if producers keep going.
        self._budget = self._ready_now = self._driver_queue().stats().ready

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        queue = self._driver_queue()
        if "messages" in start:  # an offset of vsqs < 0.2 (receipts in the offset log)
            self._settle_legacy(start)
            start = {"v": OFFSET_VERSION, "query": manifests.new_query_id(), "seq": int(start.get("seq", 0))}
        query, seq = _query_of(start), int(start["seq"])
        pending: list[tuple[int, int]] = []
        retry: list[tuple[int, int]] = []
        if self._clean_through != (query, seq):
            # every batch up to seq is committed: what is left of them is to delete
            pending, retry = self._split_tried(query, manifests.pending_batches(queue, query, seq))
        self._account(queue, query, seq)
        wanted = self._wanted(limit)
        if wanted and not self._last_full:
            # a listing of the queue: at the start, and once claims came up short
            # (while every batch claims all it planned, the partitions find out)
            # (the count prepareForTriggerAvailableNow just made serves the first batch)
            ready = queue.stats().ready if self._ready_now is None else self._ready_now
            wanted = min(wanted, ready)
        self._ready_now = None
        if wanted:  # a claiming batch settles again what an earlier one failed to (after what none tried)
            pending = (pending + retry)[:MAX_SETTLE_ENTRIES]
        elif retry:
            # a batch settled before is still there (its settling failed: logged by the
            # executor): a batch that only deletes would fail again, and again, without
            # end. Left to the claiming batches and to the next run.
            log.warning("query %s: batches %s were not settled; left for a later batch", query,
                        [batch for batch, _ in retry[:10]])
        if not wanted and not pending:
            self._clean_through = (query, seq)
            return start
        self._tried[1].update(batch for batch, _ in pending)
        self._planned[seq + 1] = wanted
        if self._budget is not None:
            self._budget -= wanted
        if wanted:
            parts = self.options.num_partitions or max(
                MIN_CLAIM_PARTITIONS, math.ceil(wanted / MESSAGES_PER_PARTITION)
            )
            parts = min(parts, wanted)
            take = wanted
        else:  # a batch that only deletes (the last one of a run, typically): one task per partition to settle
            parts = max(1, min(self.options.num_partitions or 64, max(p for _, p in pending)))
            take = 0
        return {
            "v": OFFSET_VERSION,
            "query": query,
            "seq": seq + 1,
            "parts": parts,
            "take": take,
            "settle": [list(entry) for entry in pending],
        }

    def _split_tried(self, query: str,
                     found: list[tuple[int, int]]) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        """``found`` split into batches no batch of this run was given to settle
        (at most MAX_SETTLE_ENTRIES) and those one was (its settling failed):
        these come last, so that they never starve the others."""
        tried = self._tried[1] if self._tried[0] == query else set()
        self._tried = (query, {batch for batch, _ in found if batch in tried})  # (bounded by what is left)
        fresh = [entry for entry in found if entry[0] not in tried][:MAX_SETTLE_ENTRIES]
        retry = [entry for entry in found if entry[0] in tried][:MAX_SETTLE_ENTRIES]
        return fresh, retry

    def _account(self, queue: Queue, query: str, seq: int) -> None:
        """Count what batch ``seq`` (just committed) claimed, from its seals:
        give back to the AvailableNow budget what it planned but did not
        claim, and stop planning claims where they find nothing (a message of
        a group whose slot another consumer holds is visible but not claimable)."""
        planned = self._planned.pop(seq, None)
        self._planned.clear()  # (only the batch after seq is planned next)
        claimed = manifests.claimed_in(queue, query, seq)
        self._last_full = planned is not None and planned != 0 and claimed is not None and claimed >= planned
        if claimed is None:  # a batch that only deleted, or one already settled
            return
        if self._budget is not None and planned is not None:
            self._budget += max(0, planned - claimed)
        self._fruitless = 0 if claimed else self._fruitless + 1
        if self._fruitless >= 2:  # claims find nothing twice in a row: visible, but not for us now
            if self._budget is not None:
                self._budget = 0
            self._idle_until = time.monotonic() + IDLE_AFTER_FRUITLESS

    def _wanted(self, limit: ReadLimit) -> int:
        if isinstance(limit, ReadMaxRows):
            wanted = limit.max_rows
        elif isinstance(limit, ReadAllAvailable):
            wanted = MAX_PER_TRIGGER
        else:
            wanted = self.options.max_per_trigger
        if self._budget is not None:
            wanted = min(wanted, self._budget)
        if time.monotonic() < self._idle_until:
            return 0
        return max(0, wanted)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        if "messages" in end:  # replay of a batch planned by vsqs < 0.2
            if int(end.get("seq", 0)) == int(start.get("seq", 0)):
                return []
            return [LegacyPartition(chunk) for chunk in self.options.split([m[1] for m in end["messages"]])]
        if int(end["seq"]) == int(start.get("seq", -1)) and _query_of(end) == start.get("query"):
            return []
        query, seq = _query_of(end), int(end["seq"])
        parts, take = _bounded(end.get("parts"), 1, 100_000), _bounded(end.get("take"), 0, MAX_PER_TRIGGER)
        settle: list[list[tuple[int, int]]] = [[] for _ in range(parts)]
        spread = 0
        for entry in end.get("settle") or []:
            batch, batch_parts = _bounded(entry[0], 0, 1 << 62), _bounded(entry[1], 0, 100_000)
            for index in range(batch_parts):
                settle[spread % parts].append((batch, index))
                spread += 1
        share, extra = divmod(take, parts)  # the batch's messages, split evenly among its partitions
        replay = seq not in self._planned  # planned by an earlier run: a restart replays it (see claims)
        return [
            StreamPartition(query, seq, index, share + (index < extra), settle[index], replay, parts)
            for index in range(parts)
        ]

    def commit(self, end: dict[str, Any]) -> None:
        # Nothing to do here: the next micro-batch deletes this one's messages
        # (in its executors), and Spark never calls commit for a run's last batch.
        pass

    def _settle_legacy(self, offset: dict[str, Any]) -> None:
        """Delete the messages of a committed batch planned by vsqs < 0.2 (once, on upgrade)."""
        receipts = [entry[1] for entry in offset.get("messages") or [] if isinstance(entry, list) and len(entry) > 1]
        stale = settle_receipts(self._driver_queue(), receipts)
        log.info("upgraded a vsqs < 0.2 checkpoint: deleted its last batch (%d stale)", stale)

    # -- reading (executors) --

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        if isinstance(partition, LegacyPartition):
            return read_legacy(self.options, self.columns, partition)
        assert isinstance(partition, StreamPartition)
        return read_partition(self.options, self.schema, partition)

    def stop(self) -> None:
        pass


def _query_of(offset: dict[str, Any]) -> str:
    query = offset.get("query")
    if not manifests.valid_query_id(query):
        raise InvalidArgument(f"not an offset of the vsqs source: {offset!r:.200}")
    return str(query)


def _bounded(value: Any, low: int, high: int) -> int:
    if type(value) is not int or not low <= value <= high:
        raise InvalidArgument(f"not an offset of the vsqs source: {value!r:.100} out of range")
    return value
