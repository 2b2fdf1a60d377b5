"""process_queue's cases, run on a classic session (test_spark.py) and over
Spark Connect (test_connect.py): the same calls, the same counts."""

from __future__ import annotations

import os
import time
from collections import Counter

import pytest

import vsqs
import vsqs.spark


def drain(queue: vsqs.Queue) -> list[vsqs.Message]:
    got = []
    while batch := queue.receive_batch(1000, visibility_timeout=300):
        got.extend(batch)
    return got


def reports_left(queue: vsqs.Queue) -> list[str]:
    """The runs whose attempts' reports are still in the queue's directory."""
    area = os.path.join(queue.path, ".spark", "process")
    return os.listdir(area) if os.path.isdir(area) else []


def leaves_exactly_the_failed_messages(spark, queue: vsqs.Queue, tmp_path) -> None:
    bodies = [b"p%d" % i for i in range(60)]
    ids = dict(zip(queue.publish_batch(bodies), bodies, strict=True))
    bad = {b"p3", b"p17", b"p18", b"p42", b"p59"}

    def fn(body):
        if body in bad:
            raise ValueError(f"cannot handle {body!r}")
        return body.upper()

    output = str(tmp_path / "out")
    result = vsqs.spark.process_queue(spark, queue.path, fn, output=output, parallelism=2, wait=0.2)

    assert result == vsqs.spark.ProcessResult(processed=55, failed=5, redelivered=0, lost=0, published=55, tasks=2)
    left = list(queue.messages())
    assert {ids[info.id] for info in left} == bad
    assert {(info.state, info.receive_count) for info in left} == {("in_flight", 1)}  # kept for retry
    assert Counter(m.body for m in drain(vsqs.Queue(output))) == Counter(b.upper() for b in bodies if b not in bad)
    assert reports_left(queue) == []


def batch_function(spark, queue: vsqs.Queue, tmp_path) -> None:
    bodies = [b"b%d" % i for i in range(50)]
    queue.publish_batch(bodies)
    calls = tmp_path / "sizes"
    calls.mkdir()

    def fn(batch):
        (calls / f"{os.getpid()}-{time.monotonic_ns()}").write_text(str(len(batch)))
        if b"b7" in batch:
            raise ValueError("a bad batch")
        return [[body, body + b"!"] for body in batch]  # two results per message

    output = str(tmp_path / "out")
    result = vsqs.spark.process_queue(spark, queue.path, fn, output=output, batch_size=8, parallelism=2, wait=0.2)
    sizes = [int(p.read_text()) for p in calls.iterdir()]
    assert max(sizes) <= 8 and sum(sizes) == 50  # every message tried once
    left = {info.body for info in queue.messages(bodies=True)}
    assert b"b7" in left and len(left) == result.failed
    assert result.processed + result.failed == 50
    assert result.published == 2 * result.processed
    published = Counter(m.body for m in drain(vsqs.Queue(output)))
    done = [b for b in bodies if b not in left]
    assert published == Counter(done + [b + b"!" for b in done])


def task_that_dies_redelivers_its_message(spark, queue: vsqs.Queue, tmp_path) -> None:
    """The Python worker dies in the middle of a message; Spark retries the
    task. The message comes back after its visibility timeout: nothing lost;
    the dead attempt's counts come from its report in the queue's directory."""
    bodies = [b"d%d" % i for i in range(20)]
    queue.publish_batch(bodies)
    marker = tmp_path / "died"

    def fn(body):
        if body == b"d5" and not marker.exists():
            marker.write_text("x")
            os._exit(1)  # the executor's Python worker dies holding the message
        return body

    output = str(tmp_path / "out")
    result = vsqs.spark.process_queue(spark, queue.path, fn, output=output, parallelism=1, wait=0.2,
                                      visibility_timeout=1)
    assert marker.exists()
    if queue.stats().total:  # the retried task finished before the lease of d5 ran out
        deadline = time.monotonic() + 60
        while queue.stats().in_flight and time.monotonic() < deadline:
            time.sleep(0.1)
        result += vsqs.spark.process_queue(spark, queue.path, fn, output=output, parallelism=1, wait=0.2)
    # the counts include what the dead attempt did before it died (d0..d4)
    assert result.died == 1 and result.tasks >= 2
    assert (result.processed, result.published) == (20, 20)
    assert result.redelivered == 1 and result.lost == 0 and result.failed == 0
    assert queue.stats().total == 0
    assert Counter(m.body for m in drain(vsqs.Queue(output))) == Counter(bodies)
    assert reports_left(queue) == []


def default_parallelism(spark, queue: vsqs.Queue, tmp_path) -> None:
    """Without parallelism=, as many tasks as the session's default (local[2,2]: 2)."""
    queue.publish_batch([b"x%d" % i for i in range(10)])
    result = vsqs.spark.process_queue(spark, queue.path, bytes.upper, output=str(tmp_path / "out"), wait=0.2)
    assert (result.processed, result.tasks) == (10, 2)


def refuses_bad_arguments(spark, queue: vsqs.Queue, tmp_path) -> None:
    with pytest.raises(vsqs.InvalidArgument, match="visibility_timeout must be > 0"):
        vsqs.spark.process_queue(spark, queue.path, len, visibility_timeout=-1)
    with pytest.raises(vsqs.InvalidArgument, match="parallelism must be an int >= 1"):
        vsqs.spark.process_queue(spark, queue.path, len, parallelism=0)
    with pytest.raises(vsqs.QueueNotFound):
        vsqs.spark.process_queue(spark, tmp_path / "missing", len)


def reports_out_of_reach_still_give_the_counts(spark, queue: vsqs.Queue, tmp_path) -> None:
    """The attempts cannot keep their reports (``.spark/process`` is a symbolic
    link, never followed): the work is done and counted from the returned rows."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.makedirs(os.path.join(queue.path, ".spark"))
    os.symlink(elsewhere, os.path.join(queue.path, ".spark", "process"))
    queue.publish_batch([b"r%d" % i for i in range(10)])
    result = vsqs.spark.process_queue(spark, queue.path, bytes.upper, output=str(tmp_path / "out"), parallelism=2,
                                      wait=0.2)
    assert (result.processed, result.published, result.tasks, result.died) == (10, 10, 2, 0)
    assert queue.stats().total == 0
    assert os.listdir(elsewhere) == []  # nothing written through the link


CASES = [leaves_exactly_the_failed_messages, batch_function, task_that_dies_redelivers_its_message,
         default_parallelism, refuses_bad_arguments, reports_out_of_reach_still_give_the_counts]
