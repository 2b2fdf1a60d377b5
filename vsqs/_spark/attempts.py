"""Running counts of :func:`process_queue`'s task attempts, kept in the queue's directory.

A task attempt's result reaches the client only if the attempt returns: one
whose Python worker dies, whose executor is lost, or that loses a
speculative race takes its counts with it, although the messages it handled
are deleted and their results published. So each attempt also keeps its
running counts in a file of the queue's directory, which the executors and
the client both reach (the client may be on another host than the driver, as
over Spark Connect: no socket to it is needed)::

    .spark/process/RUN/ATTEMPT

RUN is one call of process_queue, ATTEMPT one task attempt. The file is two
slots of :data:`SLOT` bytes; each change writes the next slot in place (one
``pwrite``: the file never grows), so a write torn by a death spoils at most
one slot and the other still holds the counts before it. A slot is one line:
sequence number, the counts (:data:`FIELDS`), 1 if the attempt returned,
and a CRC-32 of what precedes it. The reader takes the valid slot with the
highest sequence number. The client removes RUN after the job; gc removes a
RUN whose client died, by the area's generic rule (docs/FORMAT.md).

The channel is best effort: an attempt that cannot write its file works as
before and only its returned row counts. What an attempt wrote before its
process died reaches the file (the kernel keeps it), not what it wrote
before its host died; on a network filesystem a change is flushed to the
server with the next change at least :data:`SYNC_EVERY` seconds after the
last flush, and when the attempt returns (in between, the kernel's
writeback flushes it).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import threading
import time
import zlib
from collections.abc import Mapping
from dataclasses import dataclass

from vsqs import Queue, VsqsError
from vsqs._spark import area

KIND = "process"  # .spark/process/RUN/ATTEMPT
FIELDS = ("processed", "failed", "redelivered", "lost", "published")
SLOT = 128  # bytes of one slot: the sequence number, 5 counts and a flag need at most 125
SYNC_EVERY = 1.0  # seconds at least between two flushes of an attempt's file to the server
_MAX_FILE = 2 * SLOT
# a new file only (an attempt's name is unique: anything already there, a FIFO or a
# hard link to a file elsewhere included, is not ours), never waiting on a FIFO
_WRITE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_ATTEMPT = re.compile(r"(0|[1-9][0-9]{0,8})\.(0|[1-9][0-9]{0,8})\.(0|[1-9][0-9]{0,18})")  # PARTITION.NUMBER.ID
MAX_ATTEMPTS_A_TASK = 64  # reports read per task of the run at most (retries and speculative copies)


@dataclass
class AttemptReport:
    """The last counts one task attempt wrote, and whether it returned."""

    counts: dict[str, int]
    finished: bool = False


def encode_slot(sequence: int, counts: Mapping[str, int], finished: bool) -> bytes | None:
    """One slot's bytes (None if the numbers do not fit in a slot)."""
    text = " ".join([str(sequence), *(str(counts[name]) for name in FIELDS), "1" if finished else "0"])
    line = f"{text} {zlib.crc32(text.encode()):08x}"
    if len(line) >= SLOT:
        return None
    return line.encode().ljust(SLOT - 1) + b"\n"


def decode_slot(data: bytes) -> tuple[int, AttemptReport] | None:
    """A slot's sequence number and report; None if it is empty, torn or not one of ours."""
    words = data.split()
    if len(words) != len(FIELDS) + 3 or not all(w.isdigit() for w in words[:-1]) or len(words[-1]) != 8:
        return None
    text = b" ".join(words[:-1])
    if f"{zlib.crc32(text):08x}".encode() != words[-1] or words[-2] not in (b"0", b"1"):
        return None
    numbers = [int(w) for w in words[1:-2]]
    return int(words[0]), AttemptReport(dict(zip(FIELDS, numbers, strict=True)), words[-2] == b"1")


class AttemptReporter:
    """In a task attempt: writes its running counts to its file in the
    queue's ``.spark/process/RUN/`` after each change."""

    def __init__(self, queue: Queue, run: str, attempt: str) -> None:
        self._lock = threading.Lock()
        self._sequence = 0
        self._counts = dict.fromkeys(FIELDS, 0)
        self._synced = time.monotonic()
        self._fd: int | None = None
        try:
            with area.opened(queue, [KIND, run], create=True) as directory:
                if directory is not None:
                    self._fd = os.open(attempt, _WRITE_FLAGS, 0o644, dir_fd=directory)
        except (OSError, VsqsError):
            self._fd = None  # counted from its returned row only
        with self._lock:  # counts of nothing yet: an attempt that dies at its first message is still one
            self._write(finished=False)

    def report(self, counts: Mapping[str, int]) -> None:
        """Write the attempt's counts so far."""
        with self._lock:
            self._counts = {name: counts[name] for name in FIELDS}
            self._write(finished=False)

    def finish(self, counts: Mapping[str, int]) -> None:
        """Write the attempt's final counts, marked as returned (as its row has them)."""
        with self._lock:
            self._counts = {name: counts[name] for name in FIELDS}
            self._write(finished=True)

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                with contextlib.suppress(OSError):
                    os.close(self._fd)
                self._fd = None

    def _write(self, *, finished: bool) -> None:
        if self._fd is None:
            return
        self._sequence += 1
        data = encode_slot(self._sequence, self._counts, finished)
        if data is None:
            return
        try:
            os.pwrite(self._fd, data, (self._sequence % 2) * SLOT)
            now = time.monotonic()
            if finished or now - self._synced >= SYNC_EVERY:
                os.fdatasync(self._fd)
                self._synced = now
        except OSError:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None


def read_reports(queue: Queue, run: str, tasks: int) -> dict[str, AttemptReport]:
    """Each attempt's last counts in RUN, a run of ``tasks`` tasks. Only names
    of attempts of those tasks are read, at most MAX_ATTEMPTS_A_TASK a task;
    attempts with no valid slot are left out."""
    reports: dict[str, AttemptReport] = {}
    with area.opened(queue, [KIND, run]) as directory:
        if directory is None:
            return reports
        for name in area.names(directory):
            matched = _ATTEMPT.fullmatch(name)
            if matched is None or int(matched[1]) >= tasks:
                continue  # not an attempt of this run's tasks
            if len(reports) >= tasks * MAX_ATTEMPTS_A_TASK:
                break
            data = area.read_file(directory, name, _MAX_FILE) or b""
            slots = [decode_slot(data[i:i + SLOT]) for i in range(0, len(data), SLOT)]
            valid = [slot for slot in slots if slot is not None]
            if valid:
                reports[name] = max(valid, key=lambda slot: slot[0])[1]
    return reports


def remove_run(queue: Queue, run: str) -> None:
    """Remove RUN and its files (best effort: gc removes what is left)."""
    with contextlib.suppress(OSError, VsqsError), area.opened(queue, [KIND]) as parent:
        if parent is None:
            return
        with area.subdirectory(parent, run) as directory:
            if directory is not None:
                for name in area.names(directory):
                    with contextlib.suppress(OSError):
                        os.unlink(name, dir_fd=directory)
        try:
            os.rmdir(run, dir_fd=parent)
        except OSError as exc:
            if exc.errno not in (errno.ENOTEMPTY, errno.ENOENT):  # a straggler still writing
                raise
