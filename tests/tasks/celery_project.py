"""A Celery project in a temporary directory, for tests with real workers: its
app (broker ``vsqs://`` on a spool), tasks that record each run, workers as
processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import vsqs

APP = """
import os, signal, time
import vsqs.kombu  # noqa: F401  (registers vsqs://)
from celery import Celery

HERE = os.path.dirname(os.path.abspath(__file__))
app = Celery("proj", broker="vsqs://" + os.environ.get("VSQS_SPOOL", os.path.join(HERE, "spool")))
app.conf.update(
    task_acks_late=True,
    task_acks_on_failure_or_timeout=False,
    worker_prefetch_multiplier={prefetch},
    broker_connection_retry_on_startup=True,
    broker_transport_options={{"visibility_timeout": {visibility_timeout}, "queue_settings": {{"max_receives": 2}}}},
    worker_hijack_root_logger=False,
)


def record(*what):
    with open(os.path.join(HERE, "runs.log"), "a") as log:
        log.write(" ".join(map(str, what)) + " %f\\n" % time.time())


@app.task
def note(n):
    record("note", n, os.getpid())


@app.task
def slow(n, seconds):
    record("start", n)
    time.sleep(seconds)
    record("done", n)


@app.task(bind=True)
def flaky(self, n):
    record("try", n)
    if self.request.retries == 0:
        raise self.retry(countdown=1)


@app.task
def fails(n):
    record("fail", n)
    raise ValueError("this task fails for good")


@app.task
def kills_its_worker(n):
    record("kill", n)
    os.kill(os.getpid(), signal.SIGKILL)
"""


class Project:
    """A Celery project in a directory: its app, its spool, the runs its tasks record."""

    def __init__(self, path: Path, prefetch: int = 1, visibility_timeout: float = 30, spool: str | None = None) -> None:
        self.path = path
        self.spool = spool or str(path / "spool")
        (path / "proj.py").write_text(APP.format(prefetch=prefetch, visibility_timeout=visibility_timeout))
        self.workers: list[subprocess.Popen] = []
        self.env = dict(os.environ, VSQS_SPOOL=self.spool,
                        PYTHONPATH=str(path) + os.pathsep + os.environ.get("PYTHONPATH", ""))

    def send(self, code: str) -> None:
        """Run ``code`` in a client process that imports the app (``from proj import *``)."""
        subprocess.run([sys.executable, "-c", "from proj import *\n" + textwrap.dedent(code)],
                       cwd=self.path, env=self.env, check=True, timeout=60)

    def worker(self, pool: str = "solo", concurrency: int = 1, spool: str | None = None) -> subprocess.Popen:
        """A worker (``spool``: the spool through another path, e.g. another mount)."""
        env = dict(self.env, VSQS_SPOOL=spool or self.spool)
        with open(self.path / f"worker{len(self.workers)}.log", "w") as log:
            process = self._start(pool, concurrency, log, env)
        self.workers.append(process)
        return process

    def _start(self, pool: str, concurrency: int, log, env: dict[str, str]) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "proj", "worker", "-P", pool, "-c", str(concurrency),
             "-l", "info", "--without-gossip", "--without-mingle", "--without-heartbeat"],
            cwd=self.path, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )

    def runs(self, kind: str | None = None) -> list[list[str]]:
        try:
            lines = (self.path / "runs.log").read_text().splitlines()
        except FileNotFoundError:
            return []
        rows = [line.split() for line in lines]
        return [row for row in rows if kind is None or row[0] == kind]

    def wait_for(self, condition, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline:
                logs = "\n".join(p.read_text()[-3000:] for p in self.path.glob("worker*.log"))
                pytest.fail(f"timed out; runs: {self.runs()}\n{logs}")
            time.sleep(0.05)

    def queue(self, name: str = "celery") -> vsqs.Queue:
        return vsqs.Spool(self.spool).queue(name)

    def stop(self) -> None:
        for process in self.workers:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(30)
