"""process_queue's attempt reports in the queue's directory (vsqs._spark.attempts), without Spark."""

from __future__ import annotations

import os

import vsqs
from vsqs._spark.attempts import (
    FIELDS,
    KIND,
    SLOT,
    AttemptReport,
    AttemptReporter,
    decode_slot,
    encode_slot,
    read_reports,
    remove_run,
)

COUNTS = {"processed": 7, "failed": 1, "redelivered": 2, "lost": 0, "published": 9}


def _run_path(queue: vsqs.Queue, run: str) -> str:
    return os.path.join(queue.path, ".spark", KIND, run)


def test_a_slot_reads_back_as_written():
    data = encode_slot(12, COUNTS, True)
    assert data is not None and len(data) == SLOT and data.endswith(b"\n")
    assert decode_slot(data) == (12, AttemptReport(COUNTS, True))


def test_a_damaged_or_foreign_slot_is_no_report():
    data = encode_slot(3, COUNTS, False)
    assert data is not None
    assert decode_slot(data.replace(b" 7 ", b" 8 ")) is None  # the CRC no longer matches
    assert decode_slot(data[:18]) is None  # torn in its CRC
    assert decode_slot(b"\0" * SLOT) is None
    assert decode_slot(b"end\n") is None
    assert decode_slot(b"1 2 3 4 5 6 7 zzzzzzzz") is None


def test_numbers_that_do_not_fit_a_slot_are_not_written():
    assert encode_slot(1, dict.fromkeys(FIELDS, 10**30), False) is None


def test_the_reader_takes_the_newest_valid_slot(flat_queue):
    reporter = AttemptReporter(flat_queue, "run1", "0.0.5")
    for processed in range(1, 6):
        reporter.report({**COUNTS, "processed": processed})
    reporter.close()
    assert read_reports(flat_queue, "run1", 1) == {"0.0.5": AttemptReport({**COUNTS, "processed": 5}, False)}
    path = os.path.join(_run_path(flat_queue, "run1"), "0.0.5")
    assert os.path.getsize(path) == 2 * SLOT  # written in place: the file never grows

    # a write torn in the newest slot (sequence 6, the first slot: the reporter wrote its
    # zero counts first) leaves the one before
    with open(path, "r+b") as file:
        file.seek(10)
        file.write(b"\0\0\0")
    assert read_reports(flat_queue, "run1", 1)["0.0.5"].counts["processed"] == 4


def test_an_attempt_that_dies_before_its_first_count_is_reported(flat_queue):
    AttemptReporter(flat_queue, "run0", "0.0.4")  # its process dies at its first message
    assert read_reports(flat_queue, "run0", 1) == {"0.0.4": AttemptReport(dict.fromkeys(FIELDS, 0), False)}


def test_a_finished_attempt_says_so(flat_queue):
    reporter = AttemptReporter(flat_queue, "run2", "1.0.9")
    reporter.report({**COUNTS, "processed": 3})
    reporter.finish(COUNTS)  # the final counts
    reporter.close()
    assert read_reports(flat_queue, "run2", 2) == {"1.0.9": AttemptReport(COUNTS, True)}


def test_entries_that_are_no_report_are_skipped(flat_queue):
    AttemptReporter(flat_queue, "run3", "0.0.1").report(COUNTS)
    run = _run_path(flat_queue, "run3")
    os.mkfifo(os.path.join(run, "fifo"))
    os.symlink("0.0.1", os.path.join(run, "link"))
    os.mkdir(os.path.join(run, "directory"))
    with open(os.path.join(run, "0.1.2"), "wb") as file:  # huge
        file.write(encode_slot(1, COUNTS, False) * 1000)  # type: ignore[operator]
    for name in ("no-attempt", "1.0.3", "0.0.01"):  # not an attempt's name, or of a task the run has not
        with open(os.path.join(run, name), "wb") as file:
            file.write(encode_slot(1, COUNTS, False))  # type: ignore[arg-type]
    assert set(read_reports(flat_queue, "run3", 1)) == {"0.0.1"}


def test_a_reporter_never_writes_where_something_is_already(flat_queue, tmp_path):
    """A FIFO at the attempt's name does not block it; a hard link to a file
    elsewhere is not written through."""
    AttemptReporter(flat_queue, "run6", "0.0.0").close()  # makes the run's directory
    run = _run_path(flat_queue, "run6")
    os.mkfifo(os.path.join(run, "0.0.1"))
    outside = tmp_path / "outside"
    outside.write_bytes(b"keep")
    os.link(outside, os.path.join(run, "0.0.2"))
    for attempt in ("0.0.1", "0.0.2"):
        reporter = AttemptReporter(flat_queue, "run6", attempt)  # (a FIFO: would block for ever)
        reporter.report(COUNTS)
        reporter.close()
    assert outside.read_bytes() == b"keep"
    assert set(read_reports(flat_queue, "run6", 1)) == {"0.0.0"}  # the one that made the directory


def test_reports_read_are_bounded_by_the_tasks_of_the_run(flat_queue):
    from vsqs._spark.attempts import MAX_ATTEMPTS_A_TASK

    for number in range(MAX_ATTEMPTS_A_TASK + 5):
        reporter = AttemptReporter(flat_queue, "run7", f"0.{number}.{number}")
        reporter.report(COUNTS)
        reporter.close()
    assert len(read_reports(flat_queue, "run7", 1)) == MAX_ATTEMPTS_A_TASK


def test_a_run_is_removed_with_its_reports(flat_queue):
    AttemptReporter(flat_queue, "run4", "0.0.1").report(COUNTS)
    remove_run(flat_queue, "run4")
    assert not os.path.exists(_run_path(flat_queue, "run4"))
    assert read_reports(flat_queue, "run4", 1) == {}
    remove_run(flat_queue, "run4")  # nothing there: nothing to do


def test_a_reporter_that_cannot_write_is_silent(flat_queue, tmp_path):
    os.makedirs(os.path.join(flat_queue.path, ".spark"))
    os.symlink(tmp_path, os.path.join(flat_queue.path, ".spark", KIND))  # refused, never followed
    reporter = AttemptReporter(flat_queue, "run5", "0.0.1")
    reporter.report(COUNTS)
    reporter.finish(COUNTS)
    reporter.close()
    assert os.listdir(tmp_path) == [] or "run5" not in os.listdir(tmp_path)
