"""The instruction budget's counted runs leave nothing behind that changes the next run's count.

Each figure is (a run that fills and then consumes) minus (a run that only fills),
so whatever one run leaves for the next is counted in one run and not the other.
A worker that writes bytecode (Python's default; PYTHONDONTWRITEBYTECODE=1 was set
where the budget was measured) leaves the next run the measured package
precompiled: where vsqs has no ``__pycache__`` yet (a fresh clone, or ``--repo``
another checkout, before anything imported it), the first "fill" compiles the
engine and the consume run after it does not, so receive+delete comes out lower
by that compilation divided by the messages. In the suite the collection has
usually imported vsqs first, which hides it. No valgrind here: a stand-in runs
the worker as valgrind would and reports a fixed total."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

FAKE_VALGRIND = """#!{python}
import subprocess, sys
args = sys.argv[1:]
if args == ["--version"]:
    print("valgrind-3.19.0 (a stand-in)")
    sys.exit(0)
first = next(i for i, a in enumerate(args) if not a.startswith("--"))  # the command, after valgrind's options
out = next(a.split("=", 1)[1] for a in args[:first] if a.startswith("--callgrind-out-file="))
code = subprocess.run(args[first:]).returncode
with open(out, "w") as f:
    f.write("totals: 1000\\n")
sys.exit(code)
"""


def test_the_counted_runs_write_no_bytecode(tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(ROOT / "vsqs", repo / "vsqs", ignore=shutil.ignore_patterns("__pycache__"))
    (repo / "scripts").mkdir()
    for name in ("bench_instructions.py", "_report.py", "instruction_budget.json"):
        shutil.copy2(ROOT / "scripts" / name, repo / "scripts" / name)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "valgrind"
    fake.write_text(FAKE_VALGRIND.replace("{python}", sys.executable))
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}  # Python's default
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    result = subprocess.run(
        [sys.executable, str(repo / "scripts" / "bench_instructions.py"), "--check",
         str(repo / "scripts" / "instruction_budget.json"), "--python", sys.executable,
         "--repo", str(repo), "--dir", str(tmp_path / "runs")],
        cwd=repo, env=env, capture_output=True, text=True, check=False, timeout=300,
    )
    assert "budget receive+delete" in result.stdout, result.stdout + result.stderr
    left = sorted(str(p.relative_to(repo)) for p in (repo / "vsqs").rglob("__pycache__"))
    assert left == [], f"the counted runs left the measured package compiled for the runs after them: {left}"
