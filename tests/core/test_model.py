"""The queue behaves as a model of its README says (tests/core/model_machine.py).

The model's clock runs ahead of the real one, and a process's send times never
run back (each message's key comes after the one before): other tests run in
the same process would then publish messages dated hours ahead. So the state
machine runs in a process of its own.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_queue_behaves_as_its_readme_model_in_a_process_of_its_own():
    machine = Path(__file__).with_name("model_machine.py")
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", str(machine)],
        cwd=ROOT, capture_output=True, text=True, timeout=900, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
