"""Shared fixtures: a fresh queue on a real directory, and a crash injector."""

from __future__ import annotations

import os
import sys
from collections import Counter
from pathlib import Path

import pytest

import vsqs
from vsqs import _format

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def queue(tmp_path: Path) -> vsqs.Queue:
    return vsqs.Queue(tmp_path / "q", create=True)


def message_files(path: str | os.PathLike[str]) -> Counter[str]:
    """How many message files (any state but .new) each key has in a directory."""
    counts: Counter[str] = Counter()
    for name in os.listdir(path):
        parsed = _format.parse_name(name)
        if parsed is not None and parsed.state is not _format.State.WRITING:
            counts[parsed.key] += 1
    return counts


def vsqs_command() -> list[str]:
    """The CLI as a subprocess, run by this interpreter."""
    return [sys.executable, "-m", "vsqs"]
