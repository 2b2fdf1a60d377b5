"""The main job (scripts/demo.py) as a newcomer runs it: small, on the
master one would type, with its injected executor crash."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.conftest import ROOT

pytest.importorskip("pyspark", reason="the demo needs pyspark: pip install 'vsqs[spark]'")
pytestmark = pytest.mark.timeout(1200)  # two runs of the demo, each starting its own Spark


def _figure(output: str, name: str) -> int:
    match = re.search(rf"^  {name} +([\d,]+) ", output, re.MULTILINE)
    assert match, f"no {name!r} figure in:\n{output}"
    return int(match.group(1).replace(",", ""))


def _demo(spool, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "demo.py"), "--spool", str(spool), "--orders", "300", *args],
        capture_output=True, text=True, timeout=900, check=False, cwd=ROOT,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    return done.stdout


def test_demo_on_local_2_with_its_crash_then_kept(tmp_path):
    output = _demo(tmp_path / "spool", "--master", "local[2]")
    # local[2] gives a failed task no retry: the demo says so in one line and adds retries
    assert "--master local[2] would not retry" in output and "running on local[2,4]" in output
    assert re.search(r"^   ! task \d+ \(attempt 0\) died after processing \d+", output, re.MULTILINE)
    # what the killed attempt did is counted: every order with a result, once
    # (or twice, if the kill fell between a result's publish and its order's delete)
    distinct = int(re.search(r"messages for ([\d,]+) distinct orders", output).group(1).replace(",", ""))
    assert distinct <= _figure(output, "processed") <= _figure(output, "out")
    assert "OK: every order of this run" in output
    # a second run on the kept spool checks its own orders, not the first run's
    again = _demo(tmp_path / "spool", "--keep", "--no-crash")
    assert "OK: every order of this run" in again
    assert "died" not in again and "killed" not in again  # --no-crash: no word of a kill
