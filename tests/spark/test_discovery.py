"""Spark finds the vsqs data source with no registration in every way vsqs is
installed: editable (``pip install -e``), a wheel, ``pip install --target`` on
PYTHONPATH, and a zip of that on PYTHONPATH.

Each mode gets a fresh virtual environment whose other packages (pyspark)
come from this one's site-packages through a path file, and a copy of the
project's sources, so nothing is written into the checkout. The lookup is
Spark's own: ``pyspark.sql.worker.lookup_data_sources``, the function Spark's
first data-source lookup runs in a Python worker, called with in-memory
streams and its answer decoded (no JVM needed)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytest.importorskip("pyspark")

pytestmark = pytest.mark.timeout(300)

SOURCES = ["setup.cfg", "pyproject.toml", "README.md", "pyspark_vsqs.py", "vsqs"]

LOOKUP = """
import io, sys
from pyspark.serializers import UTF8Deserializer, read_int
from pyspark.sql.worker.lookup_data_sources import _main
out = io.BytesIO()
_main(io.BytesIO(), out)
out.seek(0)
names = [UTF8Deserializer().loads(out) for _ in range(read_int(out))]  # each name, then its pickled class
print(names[0] if len(names) == 1 else names)
import vsqs
print(vsqs.__file__)
"""


def _fresh_venv(where: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True)
    python = where / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip()
    # this environment's packages (pyspark, setuptools) after the new one's own
    Path(purelib, "_test_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python


def _pip(python: Path, *args: str) -> None:
    result = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet",
                             "--no-deps", "--no-build-isolation", "--no-index", *args],
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("mode", ["editable", "wheel", "target", "zip"])
def test_spark_finds_the_data_source_without_registration(tmp_path, mode):
    source = tmp_path / "src"
    source.mkdir()
    for name in SOURCES:
        copy = shutil.copytree if (ROOT / name).is_dir() else shutil.copy2
        copy(ROOT / name, source / name)
    python = _fresh_venv(tmp_path / "venv")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    if mode == "editable":
        _pip(python, "--editable", str(source))
    elif mode == "wheel":
        _pip(python, str(source))
    else:
        target = tmp_path / "target"
        _pip(python, "--target", str(target), str(source))
        env["PYTHONPATH"] = str(target)
        if mode == "zip":
            archive = tmp_path / "vsqs.zip"
            with zipfile.ZipFile(archive, "w") as zipped:
                for path in target.rglob("*"):
                    if path.is_file() and "__pycache__" not in path.parts:
                        zipped.write(path, path.relative_to(target))
            env["PYTHONPATH"] = str(archive)

    found = subprocess.run([str(python), "-c", LOOKUP], cwd=tmp_path, env=env,
                           capture_output=True, text=True, check=False)

    assert found.returncode == 0, found.stderr
    name, imported_from = found.stdout.split()
    assert name == "vsqs"
    assert imported_from.startswith(str(tmp_path)), imported_from  # this mode's install, not the checkout's
