"""Many new files made durable together.

One fsync per file, one after the other, costs a journal commit each (on a
local disk) or a round trip each (an NFS COMMIT): that bounds a durable
write of many messages. :class:`SyncedFiles` writes the files and hands
their fsyncs to a few threads while the next files are written, so the
flushes overlap and share the filesystem's commits; :meth:`SyncedFiles.wait`
returns once every file is on disk. The caller gives the files their
visible names only after that (a rename each), then fsyncs each directory
once: the order of a single durable publish, batched.

All system calls go through :mod:`vsqs._core.fs` (its crash-injection patch point).
"""

from __future__ import annotations

import contextlib
import errno
import os
import resource
import threading
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from types import TracebackType

from vsqs._core import fs as _fs
from vsqs._core.errors import StorageError

SYNC_THREADS = 8  # fsyncs in flight at once
SYNC_BATCH = 128  # files written before their fsyncs are handed to the threads
_RESERVED = 128  # descriptors of the process left to everything but SyncedFiles (see _Descriptors)


class _Descriptors:
    """The descriptors all :class:`SyncedFiles` of the process hold open.

    Together they hold at most a budget: the soft ``ulimit -n`` less 128 for
    everything else (at least half of it), so that a low limit slows a
    staged publish instead of failing it, or failing the other opens of the
    process meanwhile. One that has none left (or meets EMFILE) syncs and
    closes its own, or, holding none, waits for the others' (two chunks of a
    Spark write task stage at once): those are being synced, or held by a
    thread that is writing and will hand them over or sync them in turn."""

    def __init__(self) -> None:
        # a C lock, taken once a file: a Condition's own ``with`` runs Python code
        self.lock = threading.Lock()
        self._changed = threading.Condition(self.lock)
        self.held = 0  # changed under the lock; read without it (a room check, not a promise)
        self.closes = 0  # descriptors closed so far (only grows): a change to wait for

    @staticmethod
    def budget() -> int:
        """How many all SyncedFiles may hold, from the limit now (a process may change it)."""
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        return 1 << 30 if soft == resource.RLIM_INFINITY else max(soft // 2, soft - _RESERVED)

    def closed(self, count: int = 1) -> None:
        with self.lock:
            self.held -= count
            self.closes += count
            self._changed.notify_all()

    def wait_for_one(self, seen: int) -> bool:
        """Wait until a descriptor was closed since ``seen`` (True), unless no
        SyncedFiles holds any (False: the limit is too low for one file)."""
        with self.lock:
            while self.closes == seen:
                if self.held <= 0:
                    return False
                self._changed.wait()
            return True


_DESCRIPTORS = _Descriptors()


def _forget_in_child() -> None:
    """A forked child counts none of its parent's: the threads that held
    (and would close) them are not in it, nor a holder of the lock."""
    global _DESCRIPTORS
    _DESCRIPTORS = _Descriptors()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)


class SyncedFiles:
    """A context manager: :meth:`create` files, :meth:`wait` until all are
    durable. Leaving the block waits for the fsyncs still running (their
    descriptors are closed), whatever happened.

    Files are handed to the threads in batches (each thread fsyncs a slice
    of a batch in turn), not one by one: a hand-over per file cost more
    thread switches than the fsyncs saved. At most two batches hold open
    descriptors at a time."""

    def __init__(self, threads: int | None = None, batch: int | None = None) -> None:
        self._threads = threads or SYNC_THREADS
        self._batch = batch or SYNC_BATCH
        self._pool: ThreadPoolExecutor | None = None
        self._written: list[tuple[int, str]] = []  # created, not yet handed over
        self._pending: deque[list[Future[None]]] = deque()  # the batches being synced
        self._error: BaseException | None = None
        self._budget = _DESCRIPTORS.budget()

    def create(self, path: str, data: bytes, mode: int | None = None) -> bool:
        """Create ``path`` holding ``data`` (as :func:`fs.create_exclusive`);
        its fsync follows in the background. ``False`` if the name was taken.

        If the process has no descriptor left for it (up to three batches
        are open at once; see :class:`_Descriptors`), the files in flight are
        synced and closed first, and the create tried again, after the other
        SyncedFiles of the process closed one of theirs if need be."""
        descriptors = _DESCRIPTORS  # (its attributes read without the lock: once a file, a hot path)
        while True:
            seen = descriptors.closes  # read before the room: a close after it ends the wait below
            refused: StorageError | None = None
            if descriptors.held < self._budget:
                try:
                    fd = _fs.create_open(path, data, mode)
                    break
                except StorageError as exc:
                    if exc.errno not in (errno.EMFILE, errno.ENFILE):
                        raise
                    refused = exc
            if self._written or self._pending:
                self._settle_all()  # their descriptors closed (a failure is kept for wait())
            elif not descriptors.wait_for_one(seen):
                if refused is not None:
                    raise refused
                raise StorageError(errno.EMFILE, "no descriptor left for a message file", path)
        if fd is None:
            return False
        with descriptors.lock:
            descriptors.held += 1
        self._written.append((fd, path))
        if len(self._written) >= self._batch:
            while len(self._pending) >= 2:
                self._settle(self._pending.popleft())
            self._hand_over()
        return True

    def hand_over(self) -> None:
        """Give the files written so far to the fsync threads now: their
        descriptors are closed without this thread (which may then wait for
        another publish: one waiting for descriptors would wait for these)."""
        if self._written:
            self._hand_over()

    def _hand_over(self) -> None:
        """Give the files written so far to the threads, in slices. If the
        pool cannot take one (no thread could start), this thread syncs and
        closes what no thread took, and the pool's error is raised."""
        files, self._written = self._written, []
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self._threads, thread_name_prefix="vsqs-fsync")
        # each slice in a list of its own: whoever pops it syncs it (a refused one may still be queued)
        slices = [[files[i :: self._threads]] for i in range(min(self._threads, len(files)))]
        batch: list[Future[None]] = []
        self._pending.append(batch)
        try:
            for part in slices:
                batch.append(self._pool.submit(_sync_all, part))
        except BaseException:
            for part in slices:
                try:
                    _sync_all(part)
                except BaseException as exc:  # noqa: BLE001 - the pool's error is raised
                    self._error = self._error or exc
            raise

    def _settle_all(self) -> None:
        """Hand over the files written so far and wait for every fsync."""
        if self._written:
            self._hand_over()
        while self._pending:
            self._settle(self._pending.popleft())

    def _settle(self, batch: list[Future[None]]) -> None:
        for future in batch:
            try:
                future.result()
            except BaseException as exc:  # noqa: BLE001 - the first one is raised by wait()
                if self._error is None:
                    self._error = exc

    def wait(self) -> None:
        """Return once every file created so far is durable; raise the first
        failure (the files that failed are removed; the others are not)."""
        if len(self._written) == 1 and not self._pending:  # a lone file: no thread
            fd, path = self._written.pop()
            try:
                _fs.sync_and_close(fd, path)
            except BaseException as exc:  # noqa: BLE001 - raised below
                self._error = self._error or exc
            finally:
                _DESCRIPTORS.closed()
        elif self._written:
            self._hand_over()
        while self._pending:
            self._settle(self._pending.popleft())
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def __enter__(self) -> SyncedFiles:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            if kind is not None:
                with contextlib.suppress(StorageError):
                    self.wait()  # only to close the descriptors: the block's error wins
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True)


def _sync_all(unclaimed: list[list[tuple[int, str]]]) -> None:
    """fsync and close each file of a slice in turn, unless another took the
    slice (a writer whose pool refused it) before this thread; every
    descriptor is closed even after a failure, and the first failure raised."""
    try:
        files = unclaimed.pop()
    except IndexError:
        return
    error: BaseException | None = None
    try:
        for fd, path in files:
            if error is not None:
                with contextlib.suppress(BaseException):
                    _fs.sync_and_close(fd, path)
                continue
            try:
                _fs.sync_and_close(fd, path)
            except BaseException as exc:  # noqa: BLE001 - raised once the slice is closed
                error = exc
    finally:
        _DESCRIPTORS.closed(len(files))  # (once a slice: the threads would contend for the lock a file)
    if error is not None:
        raise error
