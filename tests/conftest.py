"""Shared fixtures: a fresh queue on a real directory, and a crash injector."""

from __future__ import annotations

import os
import sys
from collections import Counter
from pathlib import Path

import pytest

import vsqs
from vsqs._core import format as _format
from vsqs._core.metadata import open_store

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(params=[1, 4], ids=["flat", "shards4"])
def queue(request: pytest.FixtureRequest, tmp_path: Path) -> vsqs.Queue:
    """A fresh queue; every test that takes it runs on a queue without shards
    and on one whose messages live in 4 shard directories."""
    return vsqs.Queue(tmp_path / "q", create=True, shards=request.param)


@pytest.fixture
def flat_queue(tmp_path: Path) -> vsqs.Queue:
    """A fresh queue without shards, for what only such a queue promises
    (one delivery order across all its messages)."""
    return vsqs.Queue(tmp_path / "q", create=True)


def message_path(queue: vsqs.Queue, name: str) -> str:
    """Where the message file ``name`` lives in ``queue`` (its shard, if sharded)."""
    return open_store(queue.path).layout.message_file(name)


def message_dirs(path: str | os.PathLike[str]) -> list[str]:
    """The directories of a queue that hold message files: itself, or its shards."""
    shards = os.path.join(path, _format.SHARDS_DIR)
    if os.path.isdir(shards):
        return [os.path.join(shards, entry) for entry in sorted(os.listdir(shards))]
    return [os.fspath(path)]


def message_names(path: str | os.PathLike[str]) -> list[str]:
    """Every entry of a queue's message directories (its shards, if it has them)."""
    return [name for directory in message_dirs(path) for name in os.listdir(directory)]


def message_files(path: str | os.PathLike[str]) -> Counter[str]:
    """How many message files (any state but .new) each key has in a queue."""
    counts: Counter[str] = Counter()
    for name in message_names(path):
        parsed = _format.parse_name(name)
        if parsed is not None and parsed.state is not _format.State.WRITING:
            counts[parsed.key] += 1
    return counts


def vsqs_command() -> list[str]:
    """The CLI as a subprocess, run by this interpreter."""
    return [sys.executable, "-m", "vsqs"]


# -- two workers (pytest-xdist), as scripts/test runs the suite: -n 2 --dist loadgroup --

# Tests that must share one worker, whatever their module: the network
# filesystems and the Spark cluster on NFS (root-level mounts, ganesha, sshd,
# JVMs: one set-up at a time), and the console's browser tests (one
# artifacts/console directory, emptied by the session that starts them).
SHARED_WORKER = {
    "tests/system/netfs/": "netfs",
    "tests/spark/test_spark_cluster.py": "netfs",
    "tests/console/": "console",
}

# Groups handed out first, slowest first, so that no long one starts last and
# runs alone at the end (measured with --durations; a wrong guess costs time only).
SLOW_FIRST = (
    "netfs",
    "tests/spark/test_demo.py",
    "tests/spark/test_spark.py",
    "tests/spark/test_spark_stream.py",
    "tests/gateway/test_schema.py",
    "console",
    "tests/gateway/test_sqs_query.py",
    "tests/system/test_crash.py",
)


def _worker_group(item: pytest.Item) -> str:
    """The group of a test under --dist loadgroup: its module (so a module's
    fixtures are set up once, on one worker, and its tests run in file order),
    or the group of SHARED_WORKER its path falls under."""
    path = item.nodeid.split("::", 1)[0]
    for prefix, group in SHARED_WORKER.items():
        if path.startswith(prefix):
            return group
    return path


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under ``--dist loadgroup``: every test in its _worker_group, the slow
    groups first. Without xdist, nothing changes (not even the order)."""
    if config.getoption("dist", default="no") != "loadgroup":
        return
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(_worker_group(item)))

    def rank(item: pytest.Item) -> int:
        mark = item.get_closest_marker("xdist_group")
        name = mark.args[0] if mark and mark.args else mark.kwargs.get("name") if mark else None
        return SLOW_FIRST.index(name) if name in SLOW_FIRST else len(SLOW_FIRST)

    items.sort(key=rank)  # stable: file order within a group, collection order among the rest
