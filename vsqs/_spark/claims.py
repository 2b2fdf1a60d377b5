"""The executors' side of the streaming read: claim (or re-read), read, delete.

A partition of micro-batch N claims its messages chunk by chunk with
``Queue.receive_batch`` and records each chunk's receipts in its manifest
before it returns a row of them; a later attempt of the partition re-reads
the manifest (extending the messages' visibility) instead of claiming. It
deletes the messages of the committed batches it was given to settle, then
removes their manifests: before its claims, or in threads alongside them
where each delete waits on the filesystem (``Settler``).
"""

from __future__ import annotations

import contextlib
import logging
import resource
import signal
import threading
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pyspark.sql.datasource import InputPartition
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

from vsqs import InvalidReceipt, Message, Queue, StaleReceipt
from vsqs._core.limits import MAX_SHARES
from vsqs._spark import manifest as manifests
from vsqs._spark.options import Options
from vsqs._spark.schema import row, timestamp, wants_content

log = logging.getLogger("vsqs.spark")

CLAIM_FIRST = 50  # messages claimed (and recorded in one manifest file) by a partition's first chunk ...
CLAIM_CHUNK = 1000  # ... doubling up to this many: the first rows come soon, later chunks cost little
SETTLE_THREADS = 4  # threads deleting a committed batch alongside the claims, where deletes wait (Settler)
SETTLE_SLICE = 250  # receipts per deleting job
SETTLE_PROBE = 50  # receipts deleted first in the task's thread, timed: does each delete wait on the filesystem?
SLOW_DELETE = 0.0005  # seconds a delete waits beyond its CPU for the deletes to go to threads
MAX_FOLLOWED = 100  # stale receipts followed to their message's current name, per attempt (a listing each)


class StreamPartition(InputPartition):
    """Partition ``index`` of micro-batch ``seq`` of query ``query``: claim up
    to ``each`` messages (its share of the batch); delete the messages of
    ``settle`` ((batch, partition) pairs). ``replay``: the batch was planned
    by an earlier run of the query (a restart replays it from its offset log).
    ``parts``: the batch's partitions; each claims the messages of its own
    share first (``Queue.prefer_share``), so that they race less."""

    def __init__(self, query: str, seq: int, index: int, each: int, settle: list[tuple[int, int]],
                 replay: bool = False, parts: int = 1) -> None:
        self.query = query
        self.seq = seq
        self.index = index
        self.each = each
        self.settle = settle
        self.replay = replay
        self.parts = parts  # the batch's partitions: this one claims its share of the queue first


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
    no per-row conversion in PySpark); deletes its settle list first (or
    meanwhile, where deletes wait on the filesystem: ``Settler``)."""
    # (imported here: pyarrow costs each process that imports it 0.1-0.2 s of CPU, and
    # the driver's processes, which import this module, never build a record batch)
    from vsqs._spark.record_batches import record_batches

    queue = options.queue()
    parts = getattr(partition, "parts", 1)  # (a partition pickled by vsqs before shares has none)
    if 1 < parts <= MAX_SHARES and 0 <= partition.index < parts:
        queue.prefer_share(partition.index, parts)
    settler = Settler(queue, partition)
    try:
        settler.start()
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


class Settler:
    """Deletes the messages of the committed batches a partition was given to
    settle (``start``), then removes their manifests; ``finish`` waits for
    it (the task ends after it). A failed delete only delays: the messages
    come back after their lease, and a later batch settles the batch again.

    Where each delete is a quick system call (a local filesystem), they run
    in the task's own thread before its claims: threads would contend for
    the GIL at every system call, which cost as much CPU again as the
    deletes themselves. Where each waits on the filesystem (a network round
    trip), threads overlap the waits and the claims. The first deletes,
    made here and timed, tell which (``waits_on_filesystem``); ``in_threads``
    decides it instead."""

    def __init__(self, queue: Queue, partition: StreamPartition, in_threads: bool | None = None) -> None:
        self._queue = queue
        self._partition = partition
        self._in_threads = in_threads
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Settle here, or, once the filesystem is seen to wait, start the
        threads that settle the rest and return."""
        work = _SettleWork(self._queue, self._partition)
        try:
            if self._in_threads is None:
                self._in_threads = work.timed_probe()
            if self._in_threads:
                with _recording():  # the deleting threads inherit the mask: signals go to the task's thread
                    thread = threading.Thread(target=self._run, args=(work,), name="vsqs-settle", daemon=True)
                    try:
                        thread.start()
                        self._thread = thread
                        return
                    except RuntimeError:  # no thread to be had: settled here instead
                        pass
            work.run(None)
        except Exception:  # noqa: BLE001 - a failed delete only delays (see above)
            log.exception("deleting the messages of a committed micro-batch failed")

    @staticmethod
    def _run(work: _SettleWork) -> None:
        try:
            with ThreadPoolExecutor(SETTLE_THREADS, thread_name_prefix="vsqs-delete") as pool:
                work.run(pool)
        except Exception:  # noqa: BLE001 - a failed delete only delays (see above)
            log.exception("deleting the messages of a committed micro-batch failed")

    def finish(self) -> None:
        if self._thread is not None:
            self._thread.join()


def waits_on_filesystem(deletes: int, wall: float, cpu: float, sleeps: int | None) -> bool:
    """Whether ``deletes`` deletes that took ``wall`` seconds, ``cpu`` of
    them this thread's CPU, waited on the filesystem: beyond SLOW_DELETE
    each, and, where it is known, with the thread put to sleep (``sleeps``
    voluntary context switches) for at least half of them: a thread that
    only waited for a CPU (a busy machine) was preempted, not put to sleep."""
    if deletes <= 0 or (wall - cpu) / deletes <= SLOW_DELETE:
        return False
    return sleeps is None or 2 * sleeps >= deletes


def _sleeps() -> int | None:
    """This thread's voluntary context switches so far (None where not known)."""
    if _RUSAGE_THREAD is None:
        return None
    return resource.getrusage(_RUSAGE_THREAD).ru_nvcsw


_RUSAGE_THREAD: int | None = getattr(resource, "RUSAGE_THREAD", None)  # (Linux)


class _SettleWork:
    """What a partition has left to settle: its manifests, one after the
    other, each's receipts deleted slice by slice; then the manifest removed."""

    def __init__(self, queue: Queue, partition: StreamPartition) -> None:
        self._queue = queue
        self._partition = partition
        self._entries = iter(partition.settle)
        self._current: tuple[manifests.Place, list[str], int, int] | None = None  # place, left, stale, total

    def timed_probe(self) -> bool:
        """Delete up to SETTLE_PROBE messages here, manifest after manifest,
        timed: whether the filesystem made them wait (``waits_on_filesystem``)."""
        deleted = 0
        wall, cpu, sleeps = time.monotonic(), time.thread_time(), _sleeps()
        while deleted < SETTLE_PROBE and (self._current is not None or self._next()):
            if self._current is None:
                continue
            place, receipts, stale, total = self._current
            probe, rest = receipts[: SETTLE_PROBE - deleted], receipts[SETTLE_PROBE - deleted :]
            stale += settle_receipts(self._queue, probe)
            deleted += len(probe)
            self._current = (place, rest, stale, total)
            if not rest:
                self._done()
        wall, cpu = time.monotonic() - wall, time.thread_time() - cpu
        after = _sleeps()
        return waits_on_filesystem(deleted, wall, cpu, None if sleeps is None or after is None else after - sleeps)

    def run(self, pool: ThreadPoolExecutor | None) -> None:
        """Settle everything left: the deletes in ``pool``'s threads, else here."""
        while self._current is not None or self._next():
            if self._current is None:
                continue
            place, receipts, stale, total = self._current
            slices = [receipts[i : i + SETTLE_SLICE] for i in range(0, len(receipts), SETTLE_SLICE)]
            if pool is None:
                stale += sum(settle_receipts(self._queue, part) for part in slices)
            else:
                stale += sum(pool.map(lambda part: settle_receipts(self._queue, part), slices))
            self._current = (place, [], stale, total)
            self._done()

    def _done(self) -> None:
        """The current manifest's receipts are all deleted: say how many were
        no longer held, and remove the manifest."""
        assert self._current is not None
        place, _, stale, total = self._current
        if stale:
            log.info(
                "batch %d: %d of %d messages were no longer held by their receipt "
                "(deleted already, or re-delivered after the visibility timeout)",
                place.batch, stale, total,
            )
        manifests.remove_partition(place)
        self._current = None

    def _next(self) -> bool:
        """Open the next manifest: a sealed one becomes the current work; an
        unsealed one (no attempt delivered it) is given back and removed here.
        False once there is none left."""
        entry = next(self._entries, None)
        if entry is None:
            return False
        batch, index = entry
        place = manifests.Place(self._queue, self._partition.query, batch, index)
        manifest = manifests.read_manifest(place)
        if manifest.sealed:
            receipts = manifest.receipts()
            self._current = (place, receipts, 0, len(receipts))
        else:
            for receipt in manifest.receipts():
                _release(self._queue, receipt)
            manifests.remove_partition(place)
        return True


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
