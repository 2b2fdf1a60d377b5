"""Receive throttling across every process and host, with no broker and no lock.

Time is cut into windows of W seconds. Each receive first claims a token
``.throttle/WINDOW.K`` (K = 0..N-1) with an exclusive create: exactly one
process gets each token, so at most N receives happen per window wherever
they run. The process that takes token 0 of a window sweeps away the tokens
of windows before the previous one.
"""

from __future__ import annotations

import os

from vsqs._core import format as _format
from vsqs._core import fs as _fs


class Throttle:
    """One handle's view of a queue's receive tokens."""

    def __init__(self, queue_path: str) -> None:
        self.mode: int | None = None  # the queue's file_mode, set by the queue
        self._dir = os.path.join(queue_path, _format.THROTTLE_DIR)
        self._ready = False
        self._window = -1
        self._next = 0  # tokens below this are known taken in this window

    def take(self, count: int, seconds: float, now: float) -> bool:
        """Claim one of this window's ``count`` tokens; False if all are taken."""
        window = int(now // seconds)
        if window != self._window:
            self._window, self._next = window, 0
        if not self._ready:
            _fs.make_dirs(self._dir, self.mode)
            self._ready = True
        while self._next < count:
            index = self._next
            self._next += 1
            token = os.path.join(self._dir, _format.throttle_token(window, index))
            if _fs.create_exclusive(token, b"", durable=False, mode=self.mode):
                if index == 0:
                    self._sweep(window)
                return True
        return False

    def exhausted(self, count: int, seconds: float, now: float) -> bool:
        """Whether every token of the current window is taken (no I/O beyond one stat)."""
        window = int(now // seconds)
        return _fs.exists(os.path.join(self._dir, _format.throttle_token(window, count - 1)))

    def _sweep(self, window: int) -> None:
        if not _fs.is_private_dir(self._dir):
            return
        for name in _fs.list_names(self._dir):
            parsed = _format.parse_throttle_token(name)
            if parsed is not None and parsed < window - 1:
                _fs.unlink(os.path.join(self._dir, name))
