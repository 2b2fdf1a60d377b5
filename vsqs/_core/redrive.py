"""A queue's dead-letter queue and redrive: a base of :class:`vsqs.Queue`.

Cold paths over the queue's :class:`~vsqs._core.dead_letters.DeadLetters` part
and its redrive tasks (:mod:`vsqs._core.move_tasks`), kept out of the queue's
own module with the hot paths.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from vsqs._core import format as _format
from vsqs._core.administration import Administration
from vsqs._core.dead_letters import DeadLetters
from vsqs._core.metadata import open_store
from vsqs._core.move_tasks import MoveTasks

if TYPE_CHECKING:
    from vsqs._core.queue import Queue


class Redrive(Administration):
    """The dead-letter queue of a queue, and moving its messages back."""

    _skew_us: int
    _dead_letters: DeadLetters[Queue]

    def dead_letter_queue(self, *, create: bool = True) -> Queue | None:
        """The queue's dead-letter queue, made on demand; ``None`` without ``max_receives``.

        The ``dead_letter`` setting names a sibling queue (same parent
        directory) or a path; unset, it is the sibling ``<name>.dlq``.
        """
        self._open_parts()
        return self._dead_letters.queue(create)

    def dead_letter_sources(self) -> list[str]:
        """Paths of the queues whose dead-letter queue this queue is now: those
        recorded in its ``.sources`` whose settings still name it."""
        self._open_parts()
        return self._dead_letters.live_sources()

    def redrive(self, to: Queue | str | os.PathLike[str] | None = None, *, max_messages: int | None = None) -> int:
        """Move visible messages of this (dead-letter) queue back, with their
        receive count reset: to ``to``, or each to the queue it came from.
        Messages with no known home (and no ``to``) stay. Returns how many moved."""
        self._open_parts()
        target = _target_path(to)
        return self._dead_letters.redrive(target, max_messages, _format.now_us(), self._skew_us)

    def start_redrive(
        self, to: Queue | str | os.PathLike[str] | None = None, *, per_second: int | None = None
    ) -> dict[str, Any]:
        """Start :meth:`redrive` as a task in a background thread of this process, in
        steps (about ``per_second`` messages a second, 1..500); returns its state. One
        active task per queue: :class:`InvalidArgument` while another runs."""
        target = _target_path(to)
        if target is not None:
            open_store(target)  # QueueNotFound now, not in the task
        return self._move_tasks().start(target, per_second)

    def redrive_tasks(self) -> list[dict[str, Any]]:
        """The queue's redrive tasks, newest first, as every process sees them
        (dicts: docs/FORMAT.md, Redrive tasks; status CANCELLING while a cancel waits)."""
        return self._move_tasks().list()

    def cancel_redrive(self, task_id: str) -> dict[str, Any] | None:
        """Ask a running redrive task to stop, whichever process runs it; its state, ``None``
        if there is no such task, :class:`InvalidArgument` if it is no longer running."""
        return self._move_tasks().cancel(task_id)

    def _move_tasks(self) -> MoveTasks:
        return MoveTasks(self._open_parts().layout.path, self._dead_letters, self._skew_us, lambda: self.stats().ready,
                         self._settings.current_mode)


def _target_path(to: Queue | str | os.PathLike[str] | None) -> str | None:
    if to is None:
        return None
    if isinstance(to, Redrive):  # a Queue (Redrive is one of its bases)
        return to.path
    return os.path.abspath(os.fspath(to))  # TypeError for what is no path
