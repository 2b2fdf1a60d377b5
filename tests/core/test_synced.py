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


FORK_WHILE_ANOTHER_THREAD_HOLDS = """
import os, resource, signal, sys, threading
import vsqs
from vsqs._core import synced
resource.setrlimit(resource.RLIMIT_NOFILE, (64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
queue = vsqs.Queue(sys.argv[1], create=True)
holding, forked = threading.Event(), threading.Event()

def hold():  # files of a publish: every descriptor of the budget open, until the fork is done
    with synced.SyncedFiles() as files:
        for i in range(synced._Descriptors.budget()):
            assert files.create(os.path.join(sys.argv[2], f"{i}.new"), b"p")
        holding.set()
        forked.wait()
        files.wait()

thread = threading.Thread(target=hold)
thread.start()
holding.wait()
pid = os.fork()
if pid == 0:
    signal.alarm(60)  # only ends a child that hangs (the failure): it is done in well under a second
    queue.publish_staged([b"c"], stage="child")  # the holding thread does not exist here
    os._exit(0)
forked.set()
thread.join()
_, status = os.waitpid(pid, 0)
print(os.waitstatus_to_exitcode(status), queue.commit_stage("child"))
"""


def test_a_forked_child_does_not_wait_for_descriptors_of_its_parents_threads(tmp_path):
    # A child forked while another thread of its parent held files of a
    # staged publish open counted them as held: that thread does not exist
    # in the child, nothing ever closed them, and the child's first staged
    # publish waited for them forever.
    done = subprocess.run(
        [sys.executable, "-c", FORK_WHILE_ANOTHER_THREAD_HOLDS, str(tmp_path / "q"), str(tmp_path)],
        capture_output=True, text=True, check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["0", "1"]


PUBLISH_WHILE_WRITTEN = """
import resource, sys
import vsqs
from vsqs._core import synced
resource.setrlimit(resource.RLIMIT_NOFILE, (64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
queue = vsqs.Queue(sys.argv[1], create=True)
inner = []
outer = queue.publish_staged([b"o"] * synced._Descriptors.budget(), stage="outer",
                             written=lambda: inner.extend(queue.publish_staged([b"i"], stage="inner")))
print(len(outer), len(inner))
"""


def test_written_may_publish_while_its_files_are_open(tmp_path):
    # written() runs while the publish's files are written and not yet
    # synced: they held the whole budget, a publish (or any wait for one)
    # inside written() waited for them to close, and only that thread would
    # ever close them. They are handed to the fsync threads first.
    done = subprocess.run(
        [sys.executable, "-c", PUBLISH_WHILE_WRITTEN, str(tmp_path / "q")],
        capture_output=True, text=True, check=False, timeout=60,  # only ends a hang (the failure)
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["32", "1"]


NO_FSYNC_THREAD = """
import os, resource, sys, threading
import vsqs
from vsqs._core import synced
resource.setrlimit(resource.RLIMIT_NOFILE, (64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
queue = vsqs.Queue(sys.argv[1], create=True)
open_before = len(os.listdir("/proc/self/fd"))
start = threading.Thread.start

def refused(thread):
    if thread.name.startswith("vsqs-fsync"):
        raise RuntimeError("can't start new thread")  # a pids limit, say
    start(thread)

threading.Thread.start = refused
try:
    queue.publish_staged([b"a"] * synced._Descriptors.budget(), stage="a")
except RuntimeError as exc:
    print(exc.args[0].replace(" ", "_"))
threading.Thread.start = start
print(len(os.listdir("/proc/self/fd")) - open_before, len(queue.publish_staged([b"b"] * 40, stage="b")))
"""


def test_files_no_thread_took_are_closed_by_the_writer(tmp_path):
    # When the fsync threads could not start, the files handed to them
    # stayed open and counted as held: with the whole budget of them, every
    # later staged publish of the process waited for them forever.
    done = subprocess.run(
        [sys.executable, "-c", NO_FSYNC_THREAD, str(tmp_path / "q")],
        capture_output=True, text=True, check=False, timeout=60,  # only ends a hang (the failure)
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["can't_start_new_thread", "0", "40"]
