"""The static checks, run as part of the suite (and so in CI): ruff over the
repository, mypy over the package (``[tool.mypy]`` in pyproject.toml), and
``mypy --strict`` over the engine, whose types the package ships (py.typed).
By hand: ``ruff check`` and ``mypy`` (and ``mypy --strict vsqs/_core``) in
the checkout."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.timeout(300)


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, check=False)


def test_ruff_finds_nothing():
    result = _run("ruff", "check", "--no-cache", "vsqs", "pyspark_vsqs.py", "tests", "scripts")
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_finds_nothing_in_the_package_and_nothing_strict_in_the_engine(tmp_path):
    cache = str(tmp_path / "mypy-cache")  # one per run: two workers never share a cache
    package = _run("mypy", "--cache-dir", cache)
    assert package.returncode == 0, package.stdout + package.stderr
    engine = _run("mypy", "--strict", "--cache-dir", cache, "vsqs/_core")
    assert engine.returncode == 0, engine.stdout + engine.stderr
