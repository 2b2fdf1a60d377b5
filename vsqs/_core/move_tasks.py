"""Redrive tasks: a dead-letter queue's redrive run in the background of the
process that starts it, in bounded steps, with its state in the queue's
directory so that every process sees it and any process can cancel it.

``.moves/ID.json`` is the task's state, written only by the thread running
it (each version made with an exclusive create under a fresh name, then
renamed over the last: a reader sees one whole version). ``.moves/ID.cancel``
is a cancel request, made by anyone with an exclusive create; the runner
obeys it before its next step. ``ID`` is ``MILLISECONDS-8HEX`` (the start
time first, so names sort by age). A task left ``RUNNING`` whose state has
not been written for ``STALE_AFTER`` seconds lost its process: it is
reported ``FAILED``. The names are made here, not in ``format``, like the
settings' version names: nothing else reads them.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import secrets
import threading
import time
from collections.abc import Callable
from typing import Any

from vsqs._core import format as _format
from vsqs._core import fs as _fs
from vsqs._core.dead_letters import DeadLetters
from vsqs._core.errors import InvalidArgument, QueueNotFound, VsqsError
from vsqs._core.rules import load_json

log = logging.getLogger("vsqs")

MOVES_DIR = ".moves"
STEP = 1000  # messages moved per step without a rate
HEARTBEAT = 5.0  # seconds: the runner writes its state at least this often
STALE_AFTER = 60.0  # seconds without a state write: the runner's process is gone
MAX_PER_SECOND = 500  # Amazon's limit on MaxNumberOfMessagesPerSecond
KEEP = 10  # finished tasks kept per queue (older ones are removed at the next start)
ACTIVE = ("RUNNING", "CANCELLING")
_ID_RE = re.compile(r"[0-9]{13}-[0-9a-f]{8}")
_PATH_RE = re.compile(r"(?<![\w.])/[\w.]")  # an absolute path in a text (not the / of "input/output")


class MoveTasks:
    """The redrive tasks of one (dead-letter) queue whose directory is ``directory``.

    ``dead_letters`` moves its messages; ``backlog()`` counts the visible
    messages (the task's approximate number to move)."""

    def __init__(
        self,
        directory: str,
        dead_letters: DeadLetters[Any],
        skew_us: int,
        backlog: Callable[[], int],
        mode: Callable[[], int | None],
    ) -> None:
        self._dir = os.path.join(directory, MOVES_DIR)
        self._redrive: Callable[[str | None, int | None], int] = (
            lambda to, count: dead_letters.redrive(to, count, _format.now_us(), skew_us)
        )
        self._backlog = backlog
        self._mode = mode

    def start(self, to: str | None, per_second: int | None) -> dict[str, Any]:
        """Start a task in a daemon thread of this process; its first state.
        :class:`InvalidArgument` if a task of this queue is still active."""
        if per_second is not None and (
            isinstance(per_second, bool) or not isinstance(per_second, int)
            or not 1 <= per_second <= MAX_PER_SECOND
        ):
            raise InvalidArgument(f"per_second must be a whole number 1..{MAX_PER_SECOND} or None, not {per_second!r}")
        tasks = self.list()
        active = [task for task in tasks if task["status"] in ACTIVE]
        if active:
            raise InvalidArgument(f"a redrive task is already active on this queue ({active[0]['id']}): "
                                  "only one at a time")
        for old in tasks[KEEP - 1:]:
            self._remove(old["id"])
        _fs.make_dirs(self._dir, self._mode())
        now = time.time()
        task_id = f"{int(now * 1000):013d}-{secrets.token_hex(4)}"
        task = {"id": task_id, "status": "RUNNING",
                "destination": to, "per_second": per_second, "moved": 0, "to_move": self._backlog(),
                "started": now, "updated": now, "failure": None}
        data = json.dumps(task).encode()
        if not _fs.create_exclusive(self._file(task_id, ".json"), data, durable=True, mode=self._mode()):
            raise InvalidArgument("two redrive tasks started in the same millisecond; try again")
        older = [other for other in self.list() if other["status"] in ACTIVE and other["id"] < task_id]
        if older:  # another process started one between our listing and our create: the older one runs
            self._remove(task_id)
            raise InvalidArgument(f"a redrive task is already active on this queue ({older[0]['id']}): "
                                  "only one at a time")
        threading.Thread(target=self._run, args=(dict(task),), name=f"vsqs-redrive-{task['id']}",
                         daemon=True).start()
        return task

    def list(self) -> list[dict[str, Any]]:
        """Every task kept, newest first, as every process sees it."""
        if not _fs.is_private_dir(self._dir):  # (none yet; a symbolic link is never followed)
            return []
        names = _fs.list_names(self._dir)
        cancelled = {name[:-7] for name in names if name.endswith(".cancel")}
        tasks = []
        for name in sorted(names, reverse=True):
            if name.endswith(".json") and _ID_RE.fullmatch(name[:-5]):
                task = self._read(name[:-5], name[:-5] in cancelled)
                if task is not None:
                    tasks.append(task)
        return tasks

    def get(self, task_id: str) -> dict[str, Any] | None:
        if not _ID_RE.fullmatch(task_id) or not _fs.is_private_dir(self._dir):
            return None
        return self._read(task_id, _fs.exists(self._file(task_id, ".cancel")))

    def cancel(self, task_id: str) -> dict[str, Any] | None:
        """Ask the task to stop (whichever process runs it); its state then,
        ``None`` if there is no such task; :class:`InvalidArgument` if it is not running."""
        task = self.get(task_id)
        if task is None:
            return None
        if task["status"] != "RUNNING":
            raise InvalidArgument(f"redrive task {task_id} is {task['status']}, not RUNNING")
        _fs.create_exclusive(self._file(task_id, ".cancel"), b"", durable=True, mode=self._mode())
        return {**task, "status": "CANCELLING"}

    # -- the runner ---------------------------------------------------------

    def _run(self, task: dict[str, Any]) -> None:
        """The task's thread: its steps, then its last state. If the queue is deleted meanwhile,
        the task fails, and with its state file gone it is logged instead (one line)."""
        try:
            self._steps(task)
        except Exception as exc:  # noqa: BLE001 - any failure ends the task, reported as Amazon does
            task["status"], task["failure"] = "FAILED", self._failure(exc)
        try:
            self._write(task)
        except VsqsError as exc:
            task["status"], task["failure"] = "FAILED", self._failure(exc)
            log.warning("redrive task %s failed after moving %d message(s): %s; its state could not be recorded",
                        task["id"], task["moved"], task["failure"])

    def _failure(self, exc: Exception) -> str:
        """Why the task failed; a queue not found is the task's own if its directory is gone."""
        if isinstance(exc, QueueNotFound):
            try:
                here = _fs.is_private_dir(self._dir)
            except QueueNotFound:  # (a held directory that was removed)
                here = False
            if not here:
                return "QueueNotFound: the queue being redriven was deleted"
        return failure_reason(exc)

    def _steps(self, task: dict[str, Any]) -> None:
        while True:
            if _fs.exists(self._file(task["id"], ".cancel")):
                task["status"] = "CANCELLED"
                return
            began = time.monotonic()
            step = task["per_second"] or STEP
            moved = self._redrive(task["destination"], step)
            task["moved"] += moved
            if moved < step:
                task["status"] = "COMPLETED"
                return
            self._write(task)
            if task["per_second"]:
                time.sleep(max(0.0, 1.0 - (time.monotonic() - began)))

    def _write(self, task: dict[str, Any]) -> None:
        task["updated"] = time.time()
        final = self._file(task["id"], ".json")
        temporary = f"{final}.{secrets.token_hex(4)}.tmp"
        if _fs.create_exclusive(temporary, json.dumps(task).encode(), durable=True, mode=self._mode()):
            _fs.rename(temporary, final)
            _fs.fsync_dir(self._dir)

    # -- reading --------------------------------------------------------------

    def _read(self, task_id: str, cancel_asked: bool) -> dict[str, Any] | None:
        data = _fs.read(self._file(task_id, ".json"))
        try:
            task = load_json(data) if data else None
        except ValueError:
            return None
        if not isinstance(task, dict) or task.get("id") != task_id:
            return None
        if task.get("status") == "RUNNING":
            if time.time() - float(task.get("updated") or 0) > STALE_AFTER + HEARTBEAT:
                task["status"], task["failure"] = "FAILED", "the process running the task stopped"
            elif cancel_asked:
                task["status"] = "CANCELLING"
        return task

    def _remove(self, task_id: str) -> None:
        _fs.unlink(self._file(task_id, ".json"))
        _fs.unlink(self._file(task_id, ".cancel"))

    def _file(self, task_id: str, suffix: str) -> str:
        return os.path.join(self._dir, task_id + suffix)


def failure_reason(exc: Exception) -> str:
    """Why a task failed, in words that name no path of the spool (a client reads
    them). A directory that went away under the move (ENOENT, ENOTDIR) is a queue
    of the move that was deleted: QueueNotFound, as when the move finds it gone."""
    if isinstance(exc, QueueNotFound) or (isinstance(exc, OSError) and exc.errno in (errno.ENOENT, errno.ENOTDIR)):
        return "QueueNotFound: a queue of the move does not exist"
    text = (exc.strerror or "input/output error") if isinstance(exc, OSError) else str(exc)
    return type(exc).__name__ if _PATH_RE.search(text) else f"{type(exc).__name__}: {text}"
