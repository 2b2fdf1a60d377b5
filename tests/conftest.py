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
