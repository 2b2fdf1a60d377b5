"""The stream's deletes of committed batches (``claims.Settler``), without a
Spark session: every message of a sealed manifest deleted and its manifest
removed, an unsealed one given back; in the task's thread where deletes are
quick, in threads alongside the claims where each waits on the filesystem."""

from __future__ import annotations

import collections
import errno
import logging
import signal
import threading
import time

import pytest

import vsqs
from vsqs._core import fs as _fs
from vsqs._spark import claims
from vsqs._spark import manifest as manifests
from vsqs._spark.claims import Settler, StreamPartition, waits_on_filesystem

QUERY = "0123456789abcdef"


def _claim(queue: vsqs.Queue, batch: int, index: int, count: int, seal: bool = True) -> list[str]:
    """Publish ``count`` messages, claim them as partition ``index`` of ``batch`` would."""
    queue.publish_batch([f"b{batch}p{index}m{i}".encode() for i in range(count)])
    got = queue.receive_batch(count, visibility_timeout=300)
    assert len(got) == count
    receipts = [m.receipt for m in got]
    manifest = manifests.Manifest(manifests.Place(queue, QUERY, batch, index))
    assert manifest.write_chunk(0, 0, receipts)
    if seal:
        manifest.seal(0, 1, count)
    return receipts


def _settle(queue: vsqs.Queue, entries: list[tuple[int, int]], in_threads: bool | None) -> Settler:
    settler = Settler(queue, StreamPartition(QUERY, 9, 0, 0, entries), in_threads=in_threads)
    settler.start()
    settler.finish()
    return settler


@pytest.mark.parametrize("in_threads", [False, True, None], ids=["here", "threads", "probed"])
def test_sealed_batches_are_deleted_and_unsealed_ones_given_back(flat_queue, in_threads):
    _claim(flat_queue, 1, 0, 700)  # more than a probe and two slices
    _claim(flat_queue, 1, 1, 3)
    _claim(flat_queue, 2, 0, 5, seal=False)  # no attempt delivered it
    _settle(flat_queue, [(1, 0), (1, 1), (2, 0)], in_threads)
    assert flat_queue.stats().total == 5
    assert sorted(m.body for m in flat_queue.receive_batch(10)) == [b"b2p0m%d" % i for i in range(5)]
    assert manifests.pending_batches(flat_queue, QUERY, 5) == []


@pytest.mark.parametrize("in_threads", [False, True], ids=["here", "threads"])
def test_messages_no_longer_held_are_counted_and_logged(flat_queue, in_threads, caplog):
    receipts = _claim(flat_queue, 1, 0, 120)
    flat_queue.delete_batch(receipts[40:100])  # deleted already (an earlier settle that died)
    with caplog.at_level(logging.INFO, logger="vsqs.spark"):
        _settle(flat_queue, [(1, 0)], in_threads)
    assert flat_queue.stats().total == 0
    assert "batch 1: 60 of 120 messages were no longer held" in caplog.text


def test_deletes_that_wait_go_to_threads_and_the_claims_start_meanwhile(flat_queue, monkeypatch):
    """Each delete past the probe waits for ``release``: ``start`` returns
    (the claims may begin) while they wait; ``finish`` waits for them."""
    _claim(flat_queue, 1, 0, claims.SETTLE_PROBE + 30)
    release = threading.Event()
    probed = []
    unlink = _fs.unlink
    task = threading.get_ident()

    def waiting_unlink(path):
        if len(probed) < claims.SETTLE_PROBE:
            probed.append(path)
            time.sleep(2 * claims.SLOW_DELETE)  # a round trip: the thread waits, using no CPU
        elif threading.get_ident() != task:  # (in the task's thread, the assertion below fails at once)
            release.wait(30)
        return unlink(path)

    monkeypatch.setattr(_fs, "unlink", waiting_unlink)
    settler = Settler(flat_queue, StreamPartition(QUERY, 9, 0, 0, [(1, 0)]))
    settler.start()
    assert flat_queue.stats().in_flight == 30  # start returned with the deletes still waiting
    release.set()
    settler.finish()
    assert flat_queue.stats().total == 0
    assert manifests.pending_batches(flat_queue, QUERY, 5) == []


def test_deletes_in_the_tasks_thread_are_done_when_start_returns(flat_queue, monkeypatch):
    _claim(flat_queue, 1, 0, 80)
    threads = []
    unlink = _fs.unlink

    def noting_unlink(path):
        threads.append(threading.get_ident())
        return unlink(path)

    monkeypatch.setattr(_fs, "unlink", noting_unlink)
    settler = Settler(flat_queue, StreamPartition(QUERY, 9, 0, 0, [(1, 0)]), in_threads=False)
    settler.start()
    assert flat_queue.stats().total == 0
    assert set(threads) == {threading.get_ident()}
    settler.finish()


def test_a_failed_settle_is_logged_and_leaves_the_manifest(flat_queue, monkeypatch, caplog):
    _claim(flat_queue, 1, 0, 10)

    def refused(path):
        raise vsqs.StorageError(errno.EACCES, "Permission denied", path)

    monkeypatch.setattr(_fs, "unlink", refused)
    with caplog.at_level(logging.ERROR, logger="vsqs.spark"):
        _settle(flat_queue, [(1, 0)], in_threads=None)
    assert "deleting the messages of a committed micro-batch failed" in caplog.text
    assert manifests.pending_batches(flat_queue, QUERY, 5) == [(1, 1)]  # a later batch settles it again


@pytest.mark.parametrize(
    ("deletes", "wall", "cpu", "sleeps", "waits"),
    [
        (50, 0.002, 0.0015, 0, False),  # a local filesystem: about the CPU
        (50, 0.05, 0.001, 50, True),  # a round trip of about 1 ms each, asleep meanwhile
        (50, 0.05, 0.001, None, True),  # (where sleeps are not known: by the times alone)
        (50, 0.05, 0.001, 3, False),  # as long, but preempted (a busy machine), not asleep
        (50, 40 * claims.SLOW_DELETE, 0.0, 50, False),  # under the bound
        (0, 1.0, 0.0, 0, False),  # nothing deleted: nothing learnt
    ],
)
def test_deletes_wait_on_the_filesystem_when_asleep_beyond_their_cpu(deletes, wall, cpu, sleeps, waits):
    assert waits_on_filesystem(deletes, wall, cpu, sleeps) is waits


@pytest.mark.parametrize("slow", [False, True], ids=["probed-quick", "probed-waiting"])
def test_the_probe_counts_what_was_no_longer_held_and_deletes_each_message_once(flat_queue, monkeypatch, caplog, slow):
    receipts = _claim(flat_queue, 1, 0, 120)
    flat_queue.delete_batch(receipts[10:30])  # no longer held, among the probe's
    calls: collections.Counter[str] = collections.Counter()
    elsewhere = []  # deletes made outside the task's thread
    unlink = _fs.unlink
    task = threading.get_ident()

    def counting_unlink(path):
        calls[path] += 1
        if threading.get_ident() != task:
            elsewhere.append(path)
        return unlink(path)

    monkeypatch.setattr(claims, "waits_on_filesystem", lambda *figures: slow)
    monkeypatch.setattr(_fs, "unlink", counting_unlink)
    with caplog.at_level(logging.INFO, logger="vsqs.spark"):
        _settle(flat_queue, [(1, 0)], None)
    assert flat_queue.stats().total == 0
    assert len(calls) == 120 and max(calls.values()) == 1  # (those no longer held: tried, found gone)
    assert len(elsewhere) == (120 - claims.SETTLE_PROBE if slow else 0)
    assert "batch 1: 20 of 120 messages were no longer held" in caplog.text


def test_the_probe_goes_on_past_manifests_with_no_message(flat_queue, monkeypatch):
    """Partitions that claimed nothing (the end of a queue) seal empty: the
    probe times the deletes of the next manifests, not none."""
    for index in range(3):
        manifest = manifests.Manifest(manifests.Place(flat_queue, QUERY, 1, index))
        manifest.write_chunk(0, 0, [])
        manifest.seal(0, 1, 0)
    _claim(flat_queue, 1, 3, 20)
    _claim(flat_queue, 1, 4, claims.SETTLE_PROBE)
    timed = []
    monkeypatch.setattr(claims, "waits_on_filesystem", lambda deletes, *times: timed.append(deletes) or False)
    _settle(flat_queue, [(1, index) for index in range(5)], None)
    assert timed == [claims.SETTLE_PROBE]
    assert flat_queue.stats().total == 0
    assert manifests.pending_batches(flat_queue, QUERY, 5) == []


def test_the_deleting_threads_defer_the_signals_to_the_tasks_thread(flat_queue, monkeypatch):
    _claim(flat_queue, 1, 0, 600)
    masks = set()
    unlink = _fs.unlink
    task = threading.get_ident()

    def noting_unlink(path):
        if threading.get_ident() != task:
            masks.add(frozenset(signal.pthread_sigmask(signal.SIG_BLOCK, [])))
        return unlink(path)

    monkeypatch.setattr(_fs, "unlink", noting_unlink)
    _settle(flat_queue, [(1, 0)], True)
    assert masks and all(set(claims._DEFERRED_SIGNALS) <= mask for mask in masks)


@pytest.mark.parametrize("in_threads", [False, True], ids=["here", "threads"])
def test_a_failure_in_a_later_slice_leaves_the_manifest(flat_queue, monkeypatch, in_threads):
    _claim(flat_queue, 1, 0, 600)
    unlink = _fs.unlink
    seen = [0]
    lock = threading.Lock()

    def failing_late(path):
        with lock:
            seen[0] += 1
            late = seen[0] > 400
        if late:
            raise vsqs.StorageError(errno.EIO, "Input/output error", path)
        return unlink(path)

    monkeypatch.setattr(_fs, "unlink", failing_late)
    _settle(flat_queue, [(1, 0)], in_threads)
    assert manifests.pending_batches(flat_queue, QUERY, 5) == [(1, 1)]  # a later batch settles it again


def test_settles_here_when_no_thread_can_start(flat_queue, monkeypatch):
    _claim(flat_queue, 1, 0, 80)

    def refused(self):
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", refused)
    _settle(flat_queue, [(1, 0)], True)
    assert flat_queue.stats().total == 0
