"""The consume loop behind `vsqs work` and the Spark helpers."""

from __future__ import annotations

import threading
import time

import pytest

import vsqs


def test_burst_processes_everything_once(queue):
    queue.publish_batch([b"%d" % i for i in range(30)])
    seen = []
    lock = threading.Lock()

    def handler(m):
        with lock:
            seen.append(m.body)

    stats = vsqs.Worker(queue, handler, burst=True, wait=0.05, concurrency=3).work()
    assert stats == vsqs.WorkerStats(processed=30)
    assert sorted(seen) == sorted(b"%d" % i for i in range(30))
    assert queue.stats().total == 0


def test_burst_tries_a_failing_message_once_and_gives_it_back(flat_queue):
    queue = flat_queue  # one delivery order across the queue: no shards
    queue.publish_batch([b"bad", b"good"])
    calls = []

    def handler(m):
        calls.append(m.body)
        if m.body == b"bad":
            raise ValueError("cannot handle")

    stats = vsqs.Worker(queue, handler, burst=True, wait=0.05).work()
    assert (stats.processed, stats.failed) == (1, 1)
    assert calls == [b"bad", b"good"]
    [info] = queue.messages()
    assert (info.state, info.receive_count) == ("ready", 1)


def test_retry_delay_hides_the_failed_message(queue):
    queue.publish(b"bad")

    def handler(m):
        raise RuntimeError("no")

    vsqs.Worker(queue, handler, max_messages=1, wait=0.05, retry_delay=60).work()
    [info] = queue.messages()
    assert info.state == "in_flight" and info.visible_at > time.time() + 50


def test_long_handler_keeps_its_lease(queue):
    queue.publish(b"slow")
    other = vsqs.Queue(queue.path)
    stolen = []

    def handler(m):
        deadline = time.monotonic() + 1.0  # well past the 0.3 s lease
        while time.monotonic() < deadline:
            got = other.receive()
            if got is not None:
                stolen.append(got)
            time.sleep(0.05)

    stats = vsqs.Worker(queue, handler, visibility_timeout=0.3, max_messages=1, wait=0).work()
    assert stolen == [] and stats.processed == 1
    assert queue.stats().total == 0


def test_lost_lease_is_counted_not_hidden(queue):
    queue.publish(b"x")

    def handler(m):
        queue.delete(m.receipt)  # someone else settles it behind the worker's back

    stats = vsqs.Worker(queue, handler, max_messages=1, wait=0).work()
    assert stats == vsqs.WorkerStats(lost=1)


def test_max_messages_bounds_work(queue):
    queue.publish_batch([b"%d" % i for i in range(10)])
    stats = vsqs.Worker(queue, lambda m: None, max_messages=4, concurrency=2, wait=0.05).work()
    assert stats.processed == 4 and queue.stats().ready == 6


def test_stop_is_warm(flat_queue):
    queue = flat_queue  # one delivery order across the queue: no shards
    queue.publish_batch([b"1", b"2", b"3"])
    worker = None
    done = []

    def handler(m):
        worker.stop()
        time.sleep(0.1)
        done.append(m.body)

    worker = vsqs.Worker(queue, handler, wait=0.05)
    stats = worker.work()
    assert done == [b"1"] and stats.processed == 1
    assert queue.stats().ready == 2


def test_worker_without_burst_waits_for_new_messages(queue):
    seen = []
    worker = vsqs.Worker(queue, lambda m: seen.append(m.body) or worker.stop(), wait=5)
    threading.Timer(0.2, lambda: queue.publish(b"late")).start()
    worker.work()
    assert seen == [b"late"]


def test_storage_errors_surface_from_work(tmp_path):
    q = vsqs.Queue(tmp_path / "q", create=True)
    import os
    os.unlink(os.path.join(q.path, ".vsqs.json"))
    os.rmdir(q.path)
    with pytest.raises(vsqs.QueueNotFound):
        vsqs.Worker(q, lambda m: None, burst=True, wait=0).work()


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"concurrency": 0}, "concurrency"),
        ({"visibility_timeout": 0}, "visibility_timeout"),
        ({"max_messages": -1}, "max_messages"),
        ({"retry_delay": -1}, "retry_delay"),
        ({"wait": -1}, "wait"),
    ],
)
def test_bad_worker_arguments(queue, kwargs, match):
    with pytest.raises(vsqs.InvalidArgument, match=match):
        vsqs.Worker(queue, lambda m: None, **kwargs)
