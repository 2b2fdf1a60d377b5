"""The instruction budget: receive+delete and publish may not cost more than
scripts/instruction_budget.json allows, by more than its tolerance (3%).

Counted by ``scripts/bench_instructions.py --check`` with valgrind's callgrind,
which counts the same instructions for the same code whatever else the
machine is doing: a check of cost, never of time. Skips where valgrind is
missing, unless INSTRUCTIONS_REQUIRED=1 (.ci/run sets it; scripts/test then
installs valgrind). A change that must cost more raises the budget in its
own commit and says why."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BUDGET = ROOT / "scripts" / "instruction_budget.json"

pytestmark = pytest.mark.timeout(1200)  # callgrind runs Python about 50 times slower


def test_receive_delete_and_publish_stay_within_the_instruction_budget(tmp_path):
    if shutil.which("valgrind") is None:
        if os.environ.get("INSTRUCTIONS_REQUIRED") == "1":
            pytest.fail("INSTRUCTIONS_REQUIRED=1 but valgrind is not on PATH (scripts/test installs it as root)")
        pytest.skip("valgrind is not installed (apt-get install valgrind)")
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench_instructions.py"), "--check", str(BUDGET),
         "--python", sys.executable, "--dir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
