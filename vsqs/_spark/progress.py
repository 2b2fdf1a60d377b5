"""Running counts of :func:`process_queue`'s task attempts, sent to the driver.

A task attempt's result reaches the driver only if the attempt finishes: an
attempt whose Python worker dies, whose executor is lost, or that loses a
speculative race takes its counts with it, although the messages it handled
are deleted and their results published. So each attempt also reports its
counts to a :class:`ProgressServer` on the driver over TCP, one line after
every message it settles (a ``send`` of a few bytes; what was sent before a
process died still arrives), and a last line when it returns. The driver
then counts every attempt: the finished ones from their results, the others
from their last report.

The channel is best effort: an attempt that cannot reach the driver (a
firewall) works as before and only its finished result counts. Lines carry
a random token, so a stray connection cannot add counts.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import selectors
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger("vsqs.spark")

FIELDS = ("processed", "failed", "redelivered", "lost", "published")
_CONNECT_TIMEOUT = 5.0
_MAX_LINE = 256  # a report is a few numbers: a longer line is not one of ours
_MAX_DIGITS = 20  # a count has at most this many digits
_MAX_UNKNOWN = 64  # connections kept that have not shown the token yet


@dataclass(frozen=True)
class Address:
    """Where a task reports (pickled into the task)."""

    host: str
    port: int
    token: str


@dataclass
class AttemptReport:
    """The last counts one task attempt reported, and whether it returned."""

    counts: dict[str, int]
    finished: bool = False


class ProgressServer:
    """On the driver: accepts the attempts' reports until :meth:`close`.
    ``on_died(attempt, counts)`` is called (in the server's thread) when an
    attempt's connection ends without its last line: the attempt died.

    Anyone on the network can connect: a line that is not ours drops its
    connection (never the server's thread), at most _MAX_UNKNOWN connections
    that have not yet shown the token are kept (the oldest goes first), and
    once :meth:`close` is called no new connection is taken."""

    def __init__(self, host: str, on_died: Callable[[str, dict[str, int]], None] | None = None) -> None:
        self.reports: dict[str, AttemptReport] = {}
        self._on_died = on_died
        self._lock = threading.Lock()
        self._listener: socket.socket | None = socket.create_server((host, 0))
        self._listener.setblocking(False)
        self.address = Address(host, self._listener.getsockname()[1], secrets.token_hex(16))
        self._token = self.address.token.encode("ascii")
        self._unknown: dict[socket.socket, None] = {}  # connected, token not yet shown: oldest first
        self._accepts_left = _MAX_UNKNOWN + 1  # once stopping: connections still taken
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ, None)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="vsqs-progress", daemon=True)
        self._thread.start()

    def snapshot(self) -> dict[str, AttemptReport]:
        with self._lock:
            return {key: AttemptReport(dict(r.counts), r.finished) for key, r in self.reports.items()}

    def close_and_report(self) -> dict[str, AttemptReport]:
        """Stop serving (once nothing more arrives) and return every attempt's last report."""
        self.close()
        return self.snapshot()

    def close(self) -> None:
        """Stop serving: the connections already made are read to their end,
        no new one is taken."""
        self._stop.set()
        self._thread.join()
        for key in list(self._selector.get_map().values()):
            with contextlib.suppress(OSError):
                key.fileobj.close()  # type: ignore[union-attr]
        self._selector.close()

    def _serve(self) -> None:
        while True:
            events = self._selector.select(timeout=0.1)
            for key, _ in events:
                if key.data is None:
                    self._accept()
                else:
                    try:
                        self._read(key.fileobj, key.data)  # type: ignore[arg-type]
                    except Exception:  # one connection's fault: the server goes on
                        log.exception("progress channel: dropped a connection")
                        self._hang_up(key.fileobj)  # type: ignore[arg-type]
            if self._stop.is_set() and not events:
                return  # nothing left to read: every attempt's last line is in

    def _accept(self) -> None:
        """Take one waiting connection. Once stopping, only those already
        waiting (the job's last attempts may be among them), at most
        _MAX_UNKNOWN more: a stream of new connections cannot keep
        :meth:`close` waiting."""
        assert self._listener is not None
        try:
            connection, _ = self._listener.accept()
        except BlockingIOError:
            connection = None
        except OSError:  # no descriptor left: make room (else the listener stays ready: a busy loop)
            connection = None
            if self._unknown:
                self._hang_up(next(iter(self._unknown)))
        if self._stop.is_set():
            self._accepts_left = min(self._accepts_left, _MAX_UNKNOWN) - 1
            if connection is None or self._accepts_left <= 0:
                self._selector.unregister(self._listener)
                self._listener.close()
                self._listener = None
        if connection is None:
            return
        connection.setblocking(False)
        if len(self._unknown) >= _MAX_UNKNOWN:
            self._hang_up(next(iter(self._unknown)))
        self._unknown[connection] = None
        self._selector.register(connection, selectors.EVENT_READ, {"buffer": b"", "attempt": None})

    def _hang_up(self, connection: socket.socket) -> None:
        self._unknown.pop(connection, None)
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(connection)
        with contextlib.suppress(OSError):
            connection.close()

    def _read(self, connection: socket.socket, state: dict) -> None:
        try:
            data = connection.recv(65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if data:
            state["buffer"] += data
            *lines, state["buffer"] = state["buffer"].split(b"\n")
            if (
                all(len(line) <= _MAX_LINE and self._line(state, line) for line in lines)
                and len(state["buffer"]) <= _MAX_LINE
                and (state["attempt"] is not None or not self._stop.is_set())
            ):
                if state["attempt"] is not None:
                    self._unknown.pop(connection, None)
                return
        self._hang_up(connection)
        attempt = state["attempt"]
        if attempt is not None and data == b"":
            with self._lock:
                report = self.reports[attempt]
                died = not report.finished
                counts = dict(report.counts)
            if died and self._on_died is not None:
                self._on_died(attempt, counts)

    def _line(self, state: dict, line: bytes) -> bool:
        """Take one line (bytes: compared as they came); False if it is not
        ours (the connection is dropped)."""
        words = line.split()
        if state["attempt"] is None:  # the first line: token and attempt
            if len(words) != 2 or not secrets.compare_digest(words[0], self._token):
                return False
            attempt = words[1][:64].decode("ascii", "replace")
            state["attempt"] = attempt
            with self._lock:
                self.reports.setdefault(attempt, AttemptReport(dict.fromkeys(FIELDS, 0)))
            return True
        with self._lock:
            report = self.reports[state["attempt"]]
            if words == [b"end"]:
                report.finished = True
                return True
            if len(words) != len(FIELDS) or not all(w.isdigit() and len(w) <= _MAX_DIGITS for w in words):
                return False
            report.counts = dict(zip(FIELDS, map(int, words), strict=True))
        return True


class ProgressReporter:
    """In a task attempt: sends its counts to the driver after each change."""

    def __init__(self, address: Address | None, attempt: str) -> None:
        self._socket: socket.socket | None = None
        self._lock = threading.Lock()
        if address is None:
            return
        try:
            self._socket = socket.create_connection((address.host, address.port), timeout=_CONNECT_TIMEOUT)
            self._socket.sendall(f"{address.token} {attempt}\n".encode())
        except OSError as exc:
            log.warning("cannot report progress to the driver at %s:%d (%s): "
                        "only this attempt's final counts will count", address.host, address.port, exc)
            self._drop()

    def report(self, counts: dict[str, int]) -> None:
        self._send(" ".join(str(counts[name]) for name in FIELDS) + "\n")

    def finish(self) -> None:
        """The attempt returns: its result carries the same counts."""
        self._send("end\n")
        self.close()

    def close(self) -> None:
        """Hang up (without the last line, the driver takes the attempt for dead)."""
        with self._lock:
            self._drop()

    def _send(self, line: str) -> None:
        with self._lock:
            if self._socket is None:
                return
            try:
                self._socket.sendall(line.encode())
            except OSError:
                self._drop()

    def _drop(self) -> None:
        if self._socket is not None:
            with contextlib.suppress(OSError):
                self._socket.close()
            self._socket = None
