"""The executors' side of the streaming read: claim (or re-read), read, delete.

A partition of micro-batch N claims its messages chunk by chunk with
``Queue.receive_batch`` and records each chunk's receipts in its manifest
before it returns a row of them; a later attempt of the partition re-reads
the manifest (extending the messages' visibility) instead of claiming. In
parallel threads it deletes the messages of the committed batches it was
given to settle, then removes their manifests.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pyspark.sql.datasource import InputPartition
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

from vsqs import InvalidReceipt, Message, Queue, StaleReceipt
from vsqs._spark import manifest as manifests
from vsqs._spark.options import Options
from vsqs._spark.record_batches import record_batches
from vsqs._spark.schema import row, timestamp, wants_content

log = logging.getLogger("vsqs.spark")

CLAIM_FIRST = 50  # messages claimed (and recorded in one manifest file) by a partition's first chunk ...
CLAIM_CHUNK = 1000  # ... doubling up to this many: the first rows come soon, later chunks cost little
SETTLE_THREADS = 4  # threads deleting a committed batch, alongside the claims
SETTLE_SLICE = 250  # receipts per deleting job
MAX_FOLLOWED = 100  # stale receipts followed to their message's current name, per attempt (a listing each)


class StreamPartition(InputPartition):
    """Partition ``index`` of micro-batch ``seq`` of query ``query``: claim up
    to ``each`` messages (its share of the batch); delete the messages of
    ``settle`` ((batch, partition) pairs). ``replay``: the batch was planned
    by an earlier run of the query (a restart replays it from its offset log)."""

    def __init__(self, query: str, seq: int, index: int, each: int, settle: list[tuple[int, int]],
                 replay: bool = False) -> None:
        self.query = query
        self.seq = seq
        self.index = index
        self.each = each
        self.settle = settle
        self.replay = replay


class LegacyPartition(InputPartition):
    """Receipts of a batch planned by vsqs < 0.2, replayed after an upgrade."""

    def __init__(self, receipts: list[str]) -> None:
        self.receipts = receipts


# Signals that end a Python worker when its executor or driver goes away
# (PySpark's daemon sends SIGHUP to its workers when the JVM exits): held off
# while a chunk is claimed and recorded, so that every claim reaches the manifest.
_DEFERRED_SIGNALS = {signal.SIGHUP, signal.SIGTERM, signal.SIGINT}


@contextlib.contextmanager
def _recording() -> Iterator[None]:
    """Defer the signals above in this thread (a claim and its record are one step)."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, _DEFERRED_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def read_partition(options: Options, schema: StructType, partition: StreamPartition) -> Iterator[Any]:
    """The rows of one partition, as Arrow record batches (one per chunk:
    no per-row conversion in PySpark); deletes its settle list meanwhile."""
    queue = options.queue()
    with _recording():  # the deleting threads inherit the mask: signals go to this thread
        settler = _Settler(queue, partition)
    try:
        arrow = to_arrow_schema(schema, timezone="UTC")  # exactly what PySpark checks a batch against
        content = wants_content(schema.fieldNames())
        for messages in _claimed(queue, options, partition, content):
            if messages:
                yield from record_batches(messages, arrow, content)
    finally:
        settler.finish()


def _claimed(queue: Queue, options: Options, partition: StreamPartition, content: bool) -> Iterator[list[Message]]:
    """Re-read what earlier attempts recorded; the first attempt claims (see below)."""
    if not partition.each:  # a batch that only deletes: no manifest (which would need deleting in turn)
        return
    manifest = manifests.read_manifest(manifests.Place(queue, partition.query, partition.seq, partition.index))
    if partition.replay and manifest.generation < 0:
        # A replay with no manifest: the earlier run claimed nothing here (it died
        # first), or it did and gc removed the manifest after the query was gone for
        # longer than its grace (docs/spark.md). Claim nothing: the replayed batch may
        # already be in an idempotent sink, which would skip new messages given under
        # its id (and the next batch would delete them). The next batch claims them.
        return
    generation = manifest.generation + 1
    timeout = options.visibility_timeout
    last = manifest.sealed_chunks if manifest.sealed_chunks is not None else (max(manifest.chunks, default=-1) + 1)
    count = 0
    followed = [MAX_FOLLOWED]
    for chunk in range(last):
        receipts = manifest.chunks.get(chunk, [])
        if not receipts:
            continue
        with _recording():
            renewed = _extend(queue, receipts, timeout, followed)
            manifest.write_chunk(generation, chunk, renewed)  # (lost to a concurrent attempt: its receipts are as good)
        count += len(receipts)
        again = []
        for receipt in renewed:
            try:
                again.append(queue.read_message(receipt))
            except StaleReceipt:  # taken from us since the extension: theirs now
                continue
        yield again
    if manifest.sealed or partition.replay or manifest.generation >= 0:
        # A later attempt of a partition an earlier one recorded (a task retry, a
        # speculative copy) re-reads what is recorded and claims nothing new: its
        # claims would be chunks of a newer generation, which outrank the chunks of
        # the same numbers that the earlier attempt, if still running (a copy),
        # records meanwhile under its own generation; were the earlier attempt's
        # rows the ones Spark commits, the next batch would delete this attempt's
        # messages, delivered by no committed batch: lost. What is not claimed
        # here, the next batch claims.
        # A replay re-reads what is recorded and claims nothing new: an unsealed
        # manifest may be a sealed one read half (gc renamed the tree away between
        # the listing and the reads, a stale NFS listing, a torn seal), and the
        # batch may be in an idempotent sink already, which would skip new messages
        # under its id (the next batch would delete them: lost). The next batch
        # claims the rest; what this one re-read, it seals.
        if not manifest.sealed:
            manifest.seal(generation, last, count)
        return
    chunk = last
    size = CLAIM_FIRST
    while count < partition.each:
        with _recording():
            got = queue.receive_batch(
                min(partition.each - count, size), visibility_timeout=timeout, read_bodies=content
            )
            recorded = not got or manifest.write_chunk(generation, chunk, [m.receipt for m in got])
        size = min(2 * size, CLAIM_CHUNK)
        if not got:
            break
        if not recorded:
            # another attempt of this partition claims at the same time (a
            # speculative copy): give these back, keep what is recorded
            for message in got:
                _release(queue, message.receipt)
            break
        chunk += 1
        count += len(got)
        yield got
    manifest.seal(generation, chunk, count)


def _extend(queue: Queue, receipts: list[str], timeout: float, followed: list[int]) -> list[str]:
    """Extend the visibility of recorded messages; their new receipts (those
    still held by this query: a message taken by another consumer after the
    lease ran out is theirs, and left out)."""
    renewed = []
    outcomes = queue.change_visibility_batch([(receipt, timeout) for receipt in receipts])
    for receipt, outcome in zip(receipts, outcomes, strict=True):
        if isinstance(outcome, str):
            renewed.append(outcome)
            continue
        if isinstance(outcome, StaleReceipt) and followed[0] > 0:
            # perhaps extended already by an attempt that died before recording it
            followed[0] -= 1
            try:
                renewed.append(queue.change_visibility(queue.current_receipt(receipt), timeout))
            except (StaleReceipt, InvalidReceipt):
                pass
    return renewed


def _release(queue: Queue, receipt: str) -> None:
    try:
        queue.release(receipt)
    except (StaleReceipt, InvalidReceipt):
        pass


def _row(message: Message, columns: list[str], content: bool) -> tuple[Any, ...]:
    values = {
        "id": message.id,
        "body": message.body if content else None,
        "state": "in_flight",
        "receive_count": message.receive_count,
        "sent_at": timestamp(message.sent_at),
        "priority": message.priority,
        "group": message.group if content else None,
        "attributes": message.attributes if content else None,
    }
    return row(values, columns)


class _Settler:
    """Deletes the messages of committed batches in background threads while
    the partition claims; ``finish`` waits for it (the task ends after it)."""

    def __init__(self, queue: Queue, partition: StreamPartition) -> None:
        self._queue = queue
        self._partition = partition
        self._thread: threading.Thread | None = None
        if partition.settle:
            self._thread = threading.Thread(target=self._run, name="vsqs-settle", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        queue, partition = self._queue, self._partition
        try:
            with ThreadPoolExecutor(SETTLE_THREADS, thread_name_prefix="vsqs-delete") as pool:
                for batch, index in partition.settle:
                    place = manifests.Place(queue, partition.query, batch, index)
                    manifest = manifests.read_manifest(place)
                    if manifest.sealed:
                        receipts = manifest.receipts()
                        slices = [receipts[i : i + SETTLE_SLICE] for i in range(0, len(receipts), SETTLE_SLICE)]
                        stale = sum(pool.map(lambda part: settle_receipts(queue, part), slices))
                        if stale:
                            log.info(
                                "batch %d: %d of %d messages were no longer held by their receipt "
                                "(deleted already, or re-delivered after the visibility timeout)",
                                batch, stale, len(receipts),
                            )
                    else:  # never sealed: no attempt delivered it; give it back
                        for receipt in manifest.receipts():
                            _release(queue, receipt)
                    manifests.remove_partition(place)
        except Exception:  # a failed delete only delays: the messages come back after their lease
            log.exception("deleting the messages of a committed micro-batch failed")

    def finish(self) -> None:
        if self._thread is not None:
            self._thread.join()


def settle_receipts(queue: Queue, receipts: Iterable[str]) -> int:
    """Delete the messages of ``receipts``; how many were no longer held."""
    return sum(1 for outcome in queue.delete_batch(receipts) if outcome is not None)


def read_legacy(options: Options, columns: list[str], partition: LegacyPartition) -> Iterator[tuple[Any, ...]]:
    """Rows of a batch planned by vsqs < 0.2: its messages read by their receipts."""
    queue = options.queue()
    content = wants_content(columns)
    for receipt in partition.receipts:
        try:
            message = queue.read_message(receipt)
        except (StaleReceipt, InvalidReceipt):
            continue
        yield _row(message, columns, content)
