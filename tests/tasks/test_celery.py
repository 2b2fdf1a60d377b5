"""Celery on a vsqs spool with real workers (``solo`` and ``prefork``) in real
processes: each task runs once, a worker killed mid-task loses nothing, a warm
shutdown gives back what it prefetched, retries, dead letters, and the parts of
Celery that need a broker's fanout are refused with the reason."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

pytest.importorskip("celery")

from tests.tasks.celery_project import Project  # noqa: E402

pytestmark = pytest.mark.timeout(120)

@pytest.fixture
def project(tmp_path):
    made: list[Project] = []

    def make(**options) -> Project:
        made.append(Project(tmp_path, **options))
        return made[-1]

    yield make
    for each in made:
        each.stop()


@pytest.mark.parametrize("pool", ["solo", "prefork"])
def test_each_task_runs_once(project, pool):
    p = project(prefetch=4)
    p.send("for n in range(40): note.delay(n)")
    p.worker(pool, concurrency=2)
    p.worker(pool, concurrency=2)
    p.wait_for(lambda: len(p.runs("note")) >= 40)
    p.wait_for(lambda: p.queue().stats().total == 0)
    assert sorted(int(row[1]) for row in p.runs("note")) == list(range(40))


def test_a_worker_killed_during_a_task_loses_nothing(project):
    p = project(visibility_timeout=3)
    p.send("for n in range(3): slow.delay(n, 1)")
    first = p.worker()
    p.wait_for(lambda: any(row[1] == "1" for row in p.runs("start")))
    os.killpg(first.pid, signal.SIGKILL)  # during task 1: its ack-late promise was only in that worker
    first.wait(30)
    p.worker()
    p.wait_for(lambda: {row[1] for row in p.runs("done")} == {"0", "1", "2"})
    assert [row[1] for row in p.runs("start")].count("1") == 2  # task 1 ran again, after its lease ran out
    p.wait_for(lambda: p.queue().stats().total == 0)


def test_a_warm_shutdown_gives_back_what_the_worker_prefetched(project):
    p = project(prefetch=4, visibility_timeout=600)
    p.send("for n in range(4): slow.delay(n, 1)")
    worker = p.worker()
    p.wait_for(lambda: len(p.runs("start")) == 1)
    os.killpg(worker.pid, signal.SIGTERM)  # warm: finish the task at hand, give back the rest
    assert worker.wait(60) == 0
    done = len(p.runs("done"))
    assert done in (1, 2)  # (Celery's solo loop runs one more turn after the signal)
    stats = p.queue().stats()
    assert (stats.ready, stats.in_flight) == (4 - done, 0)  # given back now, not after the 600 s lease
    p.worker()
    p.wait_for(lambda: len(p.runs("done")) == 4)
    assert sorted(row[1] for row in p.runs("done")) == ["0", "1", "2", "3"]


def test_a_retry_with_a_countdown_runs_again_after_it(project):
    p = project()
    p.send("flaky.delay(7)")
    p.worker()
    p.wait_for(lambda: len(p.runs("try")) == 2)
    first, second = (float(row[-1]) for row in p.runs("try"))
    assert second - first >= 0.9
    p.wait_for(lambda: p.queue().stats().total == 0)


def test_a_task_that_fails_for_good_is_a_dead_letter(project):
    p = project()
    p.send("fails.delay(1); note.delay(2)")
    p.worker()
    p.wait_for(lambda: p.runs("note"))
    p.wait_for(lambda: p.queue().dead_letter_queue().stats().total == 1)
    assert len(p.runs("fail")) == 1
    assert p.queue().stats().total == 0


def test_a_task_that_kills_its_worker_is_a_dead_letter_after_max_receives(project):
    p = project(visibility_timeout=1)
    p.send("kills_its_worker.delay(1); note.delay(2)")
    for _ in range(2):  # max_receives 2: each receive kills the worker that took it
        worker = p.worker()
        assert worker.wait(60) == -signal.SIGKILL
    p.worker()
    p.wait_for(lambda: p.runs("note"))
    p.wait_for(lambda: p.queue().dead_letter_queue().stats().total == 1)
    assert len(p.runs("kill")) == 2


def test_remote_control_is_refused_with_the_reason(project):
    p = project()
    result = subprocess.run([sys.executable, "-m", "celery", "-A", "proj", "inspect", "ping", "-t", "1"],
                            cwd=p.path, env=p.env, capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "no fanout exchanges across processes" in result.stdout + result.stderr
