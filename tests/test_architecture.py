"""The architecture, checked: the import rule and a guide to module sizes.

The import rule is written as import-linter contracts in setup.cfg
(``[importlinter:contract:...]``) and run here with import-linter itself
(``lint-imports`` gives the same report by hand):

- adapters-independent: the adapters (``vsqs._cli``, ``vsqs._gateway``, the
  Spark adapter ``vsqs._spark`` with its public face ``vsqs.spark``, the
  Celery transport ``vsqs._kombu`` with ``vsqs.kombu``, ``vsqs.dramatiq``)
  never import each other, not even inside a function;
- adapters-use-public-api: they reach the engine only through the package
  ``vsqs`` and the engine's shared modules (errors, limits, rules, settings,
  metrics, leases); every other module of ``vsqs._core``, present or future,
  is forbidden to them;
- engine-knows-no-adapter: nothing in ``vsqs._core`` imports an adapter, even
  indirectly;
- engine-layers: inside ``vsqs._core`` imports point down the layers, and
  every module of the engine is in a layer.
"""

from __future__ import annotations

import configparser
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "setup.cfg"
PACKAGE = ROOT / "vsqs"
ENGINE = PACKAGE / "_core"

CONTRACTS = ["adapters-independent", "adapters-use-public-api", "engine-knows-no-adapter", "engine-layers"]

LINT = "from importlinter.cli import lint_imports_command; lint_imports_command()"


def _lint(root: Path, *contracts: str) -> subprocess.CompletedProcess[str]:
    """import-linter's report on the package under root (lint-imports puts the
    working directory first on sys.path: root's vsqs is the one analysed)."""
    args = [sys.executable, "-c", LINT, "--config", str(root / "setup.cfg"), "--no-cache", "--no-logo"]
    for contract in contracts:
        args += ["--contract", contract]
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    return subprocess.run(args, cwd=root, env=env, capture_output=True, text=True, timeout=120)


def _config() -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None)
    parser.read(CONFIG)
    return parser


def _contract(contract: str) -> configparser.SectionProxy:
    return _config()[f"importlinter:contract:{contract}"]


def _engine_modules() -> set[str]:
    modules = {path.stem for path in ENGINE.glob("*.py")} - {"__init__"}
    return modules | {path.parent.name for path in ENGINE.glob("*/__init__.py")}


def _layers() -> list[str]:
    """The modules named in engine-layers (an optional one, "(name)", without its parentheses)."""
    items = re.split(r"[|:\n]", _contract("engine-layers")["layers"])
    return [item.strip().strip("()") for item in items if item.strip()]


# -- the import rule ---------------------------------------------------------------


def test_the_contracts_are_all_there():
    parser = _config()
    assert parser["importlinter"]["root_package"] == "vsqs"
    prefix = "importlinter:contract:"
    assert sorted(s[len(prefix):] for s in parser.sections() if s.startswith(prefix)) == CONTRACTS


@pytest.mark.parametrize("contract", CONTRACTS)
def test_contract_is_kept(contract):
    result = _lint(ROOT, contract)
    if result.returncode != 0:
        pytest.fail(f"import-linter: {contract} is broken\n{result.stdout}{result.stderr}", pytrace=False)


def test_every_engine_module_is_in_a_layer():
    missing = sorted(_engine_modules() - set(_layers()))
    if missing:
        pytest.fail("modules of vsqs/_core in no layer of setup.cfg's engine-layers contract: "
                    + ", ".join(f"vsqs._core.{name}" for name in missing)
                    + ".\nAdd each to the layer it belongs to (a collaborator of the queue: "
                    "append ' : name' to the middle line).", pytrace=False)


def test_the_contracts_name_only_existing_modules():
    modules = _engine_modules()
    problems = []
    for name in _layers():
        if name not in modules:
            problems.append(f"engine-layers names vsqs._core.{name}, which does not exist: remove it "
                            "(or write its new name)")
    for contract in CONTRACTS:
        for name in sorted(set(re.findall(r"\bvsqs\._core\.(\w+)", str(dict(_contract(contract)))))):
            if name not in modules:
                problems.append(f"{contract} names vsqs._core.{name}, which does not exist")
    if problems:
        pytest.fail("setup.cfg's import contracts:\n" + "\n".join(problems), pytrace=False)


def test_the_contracts_catch_what_they_forbid(tmp_path):
    """Each contract breaks on a wrong import planted in a copy of the package."""
    shutil.copy(CONFIG, tmp_path / "setup.cfg")
    shutil.copytree(PACKAGE, tmp_path / "vsqs", ignore=shutil.ignore_patterns("__pycache__"))

    def plant(path: str, code: str) -> None:
        with open(tmp_path / path, "a") as file:
            file.write("\n" + code + "\n")

    plant("vsqs/_spark/__init__.py", "def _wrong():\n    import vsqs._cli  # noqa: F401")
    plant("vsqs/_gateway/__init__.py", "import vsqs.spark  # noqa: F401")
    plant("vsqs/spark.py", "from vsqs._core import fs as _wrong  # noqa: F401")
    plant("vsqs/spark.py", "from vsqs._core import limits as _right  # noqa: F401")
    plant("vsqs/_core/fs.py", "def _wrong():\n    from vsqs._gateway import app  # noqa: F401")
    plant("vsqs/_core/errors.py", "def _wrong():\n    from vsqs._core import queue  # noqa: F401")
    (tmp_path / "vsqs/_core/unlisted.py").write_text('"""In no layer."""\n')

    result = _lint(tmp_path)
    report = result.stdout + result.stderr
    assert result.returncode == 1, report
    for contract in CONTRACTS:
        assert f"{_contract(contract)['name']} BROKEN" in report
    assert "vsqs._spark -> vsqs._cli (l." in report
    assert "vsqs._gateway -> vsqs.spark (l." in report
    assert "vsqs.spark -> vsqs._core.fs (l." in report
    assert "vsqs.spark -> vsqs._core.limits" not in report  # a shared module
    assert "vsqs.spark -> vsqs._spark" not in report  # one adapter
    assert "vsqs._core.fs -> vsqs._gateway" in report
    assert "vsqs._core.errors -> vsqs._core.queue (l." in report
    assert "- vsqs._core.unlisted" in report


# -- module sizes --------------------------------------------------------------------

MAX_LINES = 500
MAX_LINES_OF = {"vsqs/_core/queue.py": 650}  # the Queue facade and its hot paths
SIZE_EXCEPTIONS: dict[str, str] = {  # {path: "one-line reason"}
    "vsqs/_core/format.py": "every name of the on-disk format in one module, as docs/FORMAT.md describes it",
    "vsqs/_core/fs.py": "every system call in one module: the one patch point of the crash tests, errnos settled once",
}


def _sizes() -> dict[str, tuple[int, int]]:
    """{path: (lines, limit)} of every module of the package."""
    sizes = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = path.relative_to(ROOT).as_posix()
        sizes[name] = (len(path.read_text().splitlines()), MAX_LINES_OF.get(name, MAX_LINES))
    return sizes


def test_modules_stay_small():
    over = [f"{name}: {lines} lines (limit {limit})"
            for name, (lines, limit) in _sizes().items()
            if lines > limit and name not in SIZE_EXCEPTIONS]
    if over:
        pytest.fail("modules over their size limit (split them, or add {path: 'one-line reason'} "
                    "to SIZE_EXCEPTIONS in tests/test_architecture.py):\n" + "\n".join(over),
                    pytrace=False)


def test_size_exceptions_are_still_needed():
    sizes = _sizes()
    for name, reason in SIZE_EXCEPTIONS.items():
        assert reason.strip() and "\n" not in reason, f"{name}: give one line of reason"
        assert name in sizes, f"{name} is in SIZE_EXCEPTIONS but does not exist"
        lines, limit = sizes[name]
        assert lines > limit, f"{name} ({lines} lines) is within {limit}: remove it from SIZE_EXCEPTIONS"


# -- the settings the engine keeps and does not obey -------------------------------


def _engine_modules_naming(setting: str) -> list[str]:
    """The engine's modules, but the schema's own, that name ``setting`` in a string."""
    quoted = re.compile(rf"[\"']{setting}[\"']")
    return sorted(path.name for path in ENGINE.glob("*.py")
                  if path.name != "settings.py" and quoted.search(path.read_text()))


def test_a_setting_is_obeyed_as_its_declaration_says():
    """A setting declared obeyed is read by some part of the engine; one kept for
    the SQS face (``obeyed=False``) by none: the schema stores and checks it only."""
    from vsqs._core.settings import SCHEMA

    wrong = [f"{name}: declared {'obeyed' if setting.obeyed else 'kept'}, named by {readers or 'no part'}"
             for name, setting in SCHEMA.items()
             if bool(readers := _engine_modules_naming(name)) != setting.obeyed]
    assert not wrong, "\n".join(wrong)
