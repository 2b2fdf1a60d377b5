"""process_queue's progress channel: what a task attempt did counts even if it dies."""

from __future__ import annotations

import contextlib
import logging
import socket
import subprocess
import sys
import threading
import time

import pytest

from vsqs._spark import process as _process
from vsqs._spark.process import ProcessResult
from vsqs._spark.progress import (
    _MAX_UNKNOWN,
    Address,
    AttemptReport,
    ProgressReporter,
    ProgressServer,
)

DYING_ATTEMPT = """
import os, sys
from vsqs._spark.progress import Address, ProgressReporter
reporter = ProgressReporter(Address(sys.argv[1], int(sys.argv[2]), sys.argv[3]), "0.0.7")
for done in range(1, 4):
    reporter.report({"processed": done, "failed": 0, "redelivered": 1, "lost": 0, "published": 2 * done})
os._exit(1)  # killed: no last line
"""


def test_an_attempt_that_dies_is_counted_up_to_its_death():
    died: list[tuple[str, dict[str, int]]] = []
    announced = threading.Event()

    def on_died(attempt: str, counts: dict[str, int]) -> None:
        died.append((attempt, counts))
        announced.set()

    server = ProgressServer("127.0.0.1", on_died=on_died)
    address = server.address
    subprocess.run([sys.executable, "-c", DYING_ATTEMPT, address.host, str(address.port), address.token], check=False)
    assert announced.wait(30)  # announced when the connection ends, not at the end of the job
    finished = ProgressReporter(address, "1.0.8")
    finished.report({"processed": 5, "failed": 1, "redelivered": 0, "lost": 0, "published": 5})
    finished.finish()
    reports = server.close_and_report()
    counts = {"processed": 3, "failed": 0, "redelivered": 1, "lost": 0, "published": 6}
    assert died == [("0.0.7", counts)]
    assert reports["0.0.7"] == AttemptReport(counts, finished=False)
    assert reports["1.0.8"].finished


def test_lines_without_the_token_count_nothing():
    server = ProgressServer("127.0.0.1")
    wrong = Address(server.address.host, server.address.port, "0" * 32)
    intruder = ProgressReporter(wrong, "9.0.9")
    intruder.report({"processed": 1000, "failed": 0, "redelivered": 0, "lost": 0, "published": 0})
    intruder.finish()
    assert server.close_and_report() == {}


def test_an_unreachable_driver_only_loses_the_reports(caplog):
    server = ProgressServer("127.0.0.1")
    address = server.address
    server.close()  # nobody listens any more
    with caplog.at_level(logging.WARNING, logger="vsqs.spark"):
        reporter = ProgressReporter(address, "0.0.1")
    reporter.report({"processed": 1, "failed": 0, "redelivered": 0, "lost": 0, "published": 0})
    reporter.finish()
    assert "cannot report progress" in caplog.text


def test_the_total_adds_the_attempts_that_never_returned():
    returned = ProcessResult(processed=10, published=10, tasks=1)
    reports = {
        "0.1.5": AttemptReport({"processed": 10, "failed": 0, "redelivered": 1, "lost": 0, "published": 10}, True),
        "0.0.2": AttemptReport({"processed": 4, "failed": 1, "redelivered": 0, "lost": 0, "published": 4}),
        "1.0.3": AttemptReport({"processed": 2, "failed": 0, "redelivered": 0, "lost": 0, "published": 2}, True),
    }
    total = _process._total([("0.1.5", returned)], reports)
    # 0.1.5 returned: its result counts (not its report, again); 0.0.2 died;
    # 1.0.3 finished, but Spark kept another copy's result (a speculative race)
    assert total == ProcessResult(processed=16, failed=1, published=16, tasks=3, died=1)


def _hung_up(connection: socket.socket) -> bool:
    """Whether the server closed ``connection`` (read to its end; the timeout
    only keeps a broken server from hanging the test)."""
    connection.settimeout(60)
    try:
        while connection.recv(4096):
            pass
    except TimeoutError:
        return False
    finally:
        connection.close()
    return True


def _counted_after(server: ProgressServer) -> dict[str, AttemptReport]:
    """A genuine attempt reports after the intruders: the server still counts it."""
    reporter = ProgressReporter(server.address, "0.0.1")
    reporter.report({"processed": 3, "failed": 0, "redelivered": 0, "lost": 0, "published": 0})
    reporter.finish()
    return server.close_and_report()


@pytest.mark.parametrize("first_line", [b"\xff x\n", "\u00e9".encode() * 16 + b" x\n", b"\x00" * 300 + b"\n"])
def test_a_first_line_of_any_bytes_drops_only_its_connection(first_line):
    server = ProgressServer("127.0.0.1")
    intruder = socket.create_connection((server.address.host, server.address.port))
    intruder.sendall(first_line)
    assert _hung_up(intruder)  # (a non-ASCII token once killed the server's thread)
    assert _counted_after(server)["0.0.1"].counts["processed"] == 3


@pytest.mark.parametrize("line", [b"9" * 5000 + b" 0 0 0 0\n", b"1 2 3 4 5 6\n", b"\n", b"x" * 300 + b"\n"])
def test_a_report_not_ours_drops_its_connection(line):
    server = ProgressServer("127.0.0.1")
    sender = socket.create_connection((server.address.host, server.address.port))
    sender.sendall(f"{server.address.token} 9.0.9\n".encode() + line)
    assert _hung_up(sender)  # (5000 digits once raised in int(): the server's thread died)
    reports = _counted_after(server)
    assert reports["0.0.1"].counts["processed"] == 3
    assert reports["9.0.9"].counts["processed"] == 0


def test_connections_without_the_token_are_bounded():
    server = ProgressServer("127.0.0.1")
    silent = [socket.create_connection((server.address.host, server.address.port)) for _ in range(_MAX_UNKNOWN + 5)]
    assert all(_hung_up(connection) for connection in silent[:5])  # the oldest make room
    assert _counted_after(server)["0.0.1"].finished
    for connection in silent[5:]:
        connection.close()


def test_new_connections_cannot_keep_close_waiting():
    server = ProgressServer("127.0.0.1")
    done = threading.Event()

    def knock() -> None:  # a new connection, a byte, again and again, until close returned
        while not done.is_set():
            with contextlib.suppress(OSError), socket.create_connection(
                (server.address.host, server.address.port), timeout=5
            ) as connection:
                connection.sendall(b"x")

    # the genuine attempt shows its token before the knocking starts: a connection not yet
    # identified may be dropped for a newer one (at most _MAX_UNKNOWN are kept), and under
    # load the knocker could push it out first (best effort, by design): not what this tests
    reporter = ProgressReporter(server.address, "0.0.1")
    while "0.0.1" not in server.snapshot():
        time.sleep(0.01)
    knocker = threading.Thread(target=knock, daemon=True)
    knocker.start()
    try:
        reporter.report({"processed": 3, "failed": 0, "redelivered": 0, "lost": 0, "published": 0})
        reporter.finish()
        reports = server.close_and_report()  # (returns: once hung until the knocking stopped)
        assert reports["0.0.1"].finished and reports["0.0.1"].counts["processed"] == 3
    finally:
        done.set()
        knocker.join()
