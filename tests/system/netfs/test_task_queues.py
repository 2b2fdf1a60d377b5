"""Celery and Dramatiq workers on two hosts (two mounts of one network filesystem) share one spool."""

from __future__ import annotations

import os
import uuid

import pytest

pytest.importorskip("celery")

from tests.tasks.celery_project import Project  # noqa: E402

pytestmark = pytest.mark.timeout(300)


def test_celery_workers_on_two_hosts_share_one_spool(shared_fs, tmp_path):
    name = f"celery-{uuid.uuid4().hex[:8]}"
    spool_a, spool_b = (os.path.join(host, name) for host in (shared_fs.host_a, shared_fs.host_b))
    project = Project(tmp_path, prefetch=2, visibility_timeout=30, spool=spool_a)
    try:
        project.worker(spool=spool_b)  # tasks sent through host A, run on host B
        project.send("for n in range(20): note.delay(n)")
        project.wait_for(lambda: len(project.runs("note")) == 20, timeout=120)
        project.worker(spool=spool_a)  # then both hosts at once
        project.send("for n in range(20, 80): note.delay(n)")
        project.wait_for(lambda: len(project.runs("note")) >= 80, timeout=120)
        project.wait_for(lambda: project.queue().stats().total == 0, timeout=120)
        assert sorted(int(row[1]) for row in project.runs("note")) == list(range(80))  # each once
    finally:
        project.stop()


def test_dramatiq_workers_on_two_hosts_share_one_spool(shared_fs, tmp_path):
    pytest.importorskip("dramatiq")
    from tests.tasks.test_dramatiq import Run

    name = f"dramatiq-{uuid.uuid4().hex[:8]}"
    spool_a, spool_b = (os.path.join(host, name) for host in (shared_fs.host_a, shared_fs.host_b))
    with Run(tmp_path) as run:
        run.spool = spool_a
        actors = run.actors()
        run.worker(VSQS_TEST_SPOOL=spool_b)  # tasks sent through host A, run on host B
        for n in range(20):
            actors.task.send(str(n))
        run.wait_for(lambda: len(run.lines("ran")) == 20, "the first 20 tasks ran on host B")
        run.worker(VSQS_TEST_SPOOL=spool_a)  # then both hosts at once
        for n in range(20, 80):
            actors.task.send(str(n))
        run.wait_for(lambda: len(run.lines("ran")) >= 80, "every task ran")
        run.wait_for(lambda: run.queue().stats().total == 0, "every message deleted")
        assert sorted(int(key) for key, _, _ in run.lines("ran")) == list(range(80))  # each once
