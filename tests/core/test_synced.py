"""SyncedFiles: many new files written, then made durable together."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import threading

import pytest

import vsqs
from vsqs._core import fs as _fs
from vsqs._core import synced as _synced
from vsqs._core.errors import StorageError


class FailingFsync:
    """Stands in for ``os`` in vsqs._core.fs: the ``nth`` fsync fails with EIO."""

    def __init__(self, nth: int) -> None:
        self.nth = nth
        self.fsyncs = 0
        self.lock = threading.Lock()
        self.open_fds: set[int] = set()

    def __getattr__(self, name: str):
        return getattr(os, name)

    def open(self, *args, **kwargs):
        fd = os.open(*args, **kwargs)
        with self.lock:
            self.open_fds.add(fd)
        return fd

    def close(self, fd: int) -> None:
        with self.lock:
            self.open_fds.discard(fd)
        os.close(fd)

    def fsync(self, fd: int) -> None:
        with self.lock:
            self.fsyncs += 1
            fail = self.fsyncs == self.nth
        if fail:
            raise OSError(errno.EIO, "injected")
        os.fsync(fd)


@pytest.mark.parametrize("count", [1, 2, 7, 40])
def test_every_file_is_whole_and_every_descriptor_closed(tmp_path, count):
    with _synced.SyncedFiles(threads=3, batch=4) as files:
        for i in range(count):
            assert files.create(str(tmp_path / f"{i}.new"), b"x" * i)
        assert not files.create(str(tmp_path / "0.new"), b"taken")  # the name is taken: False
        files.wait()
    assert sorted(os.listdir(tmp_path)) == sorted(f"{i}.new" for i in range(count))
    assert all((tmp_path / f"{i}.new").read_bytes() == b"x" * i for i in range(count))


@pytest.mark.parametrize("nth", [1, 3, 9])
def test_a_failed_fsync_is_raised_and_its_file_removed(tmp_path, monkeypatch, nth):
    failing = FailingFsync(nth)
    monkeypatch.setattr(_fs, "os", failing)
    with pytest.raises(StorageError, match="injected"), _synced.SyncedFiles(threads=2, batch=4) as files:
        for i in range(10):
            files.create(str(tmp_path / f"{i}.new"), b"body")
        files.wait()
    monkeypatch.setattr(_fs, "os", os)
    assert len(os.listdir(tmp_path)) == 9  # the one whose fsync failed is gone
    assert failing.open_fds == set()  # and no descriptor leaked


def test_a_failed_staged_publish_leaves_nothing_in_its_stage(tmp_path, monkeypatch):
    queue = vsqs.Queue(tmp_path / "q", create=True)
    monkeypatch.setattr(_synced, "SYNC_BATCH", 4)
    monkeypatch.setattr(_fs, "os", FailingFsync(6))
    with pytest.raises(StorageError):
        queue.publish_staged([b"m"] * 10, stage="s")
    monkeypatch.setattr(_fs, "os", os)
    assert queue.commit_stage("s") == 0  # not one of the ten was staged
    assert queue.stats().total == 0


LOW_FD_LIMIT = """
import resource, sys
import vsqs
resource.setrlimit(resource.RLIMIT_NOFILE, (64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
queue = vsqs.Queue(sys.argv[1], create=True)
assert len(queue.publish_batch([b"m"] * 600)) == 600
assert len(queue.publish_staged([b"s"] * 600, stage="s")) == 600
assert queue.commit_stage("s") == 600
print(queue.stats().ready)
"""


def test_a_low_descriptor_limit_only_slows_a_batch(tmp_path):
    # up to three batches of open files, more than ulimit -n 64: once, the
    # batch failed with EMFILE although one file at a time would do
    done = subprocess.run(
        [sys.executable, "-c", LOW_FD_LIMIT, str(tmp_path / "q")], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1200"]


LOW_FD_LIMIT_THREADS = """
import resource, sys, threading
import vsqs
resource.setrlimit(resource.RLIMIT_NOFILE, (48, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
queue = vsqs.Queue(sys.argv[1], create=True)
failures = []

def stage(name):
    try:
        for _ in range(3):
            queue.publish_staged([b"s"] * 400, stage=name)
    except Exception as exc:
        failures.append(repr(exc))

threads = [threading.Thread(target=stage, args=(f"s{i}",)) for i in range(3)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
print(failures or queue.stats().staged)
"""


def test_staged_publishes_in_threads_share_a_low_descriptor_limit(tmp_path):
    # A Spark write task stages two chunks at once. Each publish used to
    # hold up to three batches of open files and, out of descriptors, only
    # synced its own: with another holding the rest, it (or any other open
    # of the process meanwhile: a directory's fsync) failed with EMFILE.
    # Now they hold together at most the limit less a reserve for the rest.
    done = subprocess.run(
        [sys.executable, "-c", LOW_FD_LIMIT_THREADS, str(tmp_path / "q")],
        capture_output=True, text=True, check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["3600"]
