"""Helpers of the bench scripts: the machine they ran on, and their results as markdown.

``--markdown`` in each bench script prints one line saying where the figures
come from (the command, the commit measured, the date, the machine), then its
table(s) in markdown, ready to paste into docs/benchmarks.md.
"""

from __future__ import annotations

import datetime
import os
import platform
import shlex
import subprocess
import sys
from collections.abc import Sequence


def read_first(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().strip()
    except OSError:
        return None


def _unescape_mount(field_: str) -> str:
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field_ = field_.replace(code, char)
    return field_


def mount_of(path: str) -> dict[str, str]:
    """The /proc/mounts entry with the longest mount point containing ``path``."""
    path = os.path.realpath(path)
    best: dict[str, str] = {}
    text = read_first("/proc/mounts")
    for line in (text or "").splitlines():
        parts = line.split()
        if len(parts) < 4:
            continue
        device, point, fstype, options = (_unescape_mount(p) for p in parts[:4])
        inside = path == point or path.startswith(point.rstrip("/") + "/")
        # ">=": a later mount on the same point shadows an earlier one
        if inside and len(point) >= len(best.get("mount_point", "")):
            best = {"device": device, "mount_point": point, "type": fstype, "options": options}
    if best.get("type") in ("ext3", "ext4") and best["device"].startswith("/dev/"):
        journal = read_first(f"/sys/fs/ext4/{os.path.basename(best['device'])}/journal_task")
        if journal is not None:
            best["journal"] = "no" if journal == "<none>" else "yes"
    return best


def cpu_model() -> str:
    for line in (read_first("/proc/cpuinfo") or "").splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def git_head(path: str) -> str:
    """The short commit of the checkout holding ``path``, marked when vsqs/ has uncommitted changes."""
    try:
        head = subprocess.run(["git", "-C", path, "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", path, "status", "--porcelain", "--", "vsqs"],
                               capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown commit"
    return head + (" + uncommitted changes in vsqs/" if dirty else "")


def machine(directory: str) -> str:
    """The filesystem under ``directory`` and the cores, in one phrase."""
    fs = mount_of(directory)
    if fs:
        opts = [o for o in fs["options"].split(",") if o in ("discard", "sync", "dirsync", "noatime", "relatime")]
        journal = {"no": "no journal", "yes": "journal"}.get(fs.get("journal", ""))
        details = ", ".join(x for x in [journal, *opts] if x)
        where = f"{fs['type']} on {fs['device']}" + (f" ({details})" if details else "")
    else:
        where = "filesystem unknown"
    cores = os.cpu_count() or 0
    return f"{where}, {cores} cores ({cpu_model()}), Python {platform.python_version()}"


def command_line(argv: Sequence[str] | None = None, drop: Sequence[str] = ("--markdown",)) -> str:
    """How this script was started, as a reader would retype it (``--markdown`` left out)."""
    argv = list(sys.argv if argv is None else argv)
    shown: list[str] = []
    skip_value = False
    for arg in argv[1:]:
        if skip_value:
            skip_value = False
            if not arg.startswith("-"):
                continue
        if arg in drop:
            skip_value = True  # an optional value (a path) may follow
            continue
        if any(arg.startswith(d + "=") for d in drop):
            continue
        shown.append(arg)
    python = os.path.relpath(sys.executable)
    python = sys.executable if python.startswith("..") else python
    script = os.path.relpath(os.path.abspath(argv[0])) if argv else "?"
    return shlex.join([python, script, *shown])


def provenance(repo: str, directory: str, extra: str = "", argv: Sequence[str] | None = None) -> str:
    """One line: the command, the commit measured, the date, the machine."""
    today = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d")
    line = f"`{command_line(argv)}` at {git_head(repo)}, {today}; {machine(directory)}"
    return line + (f"; {extra}" if extra else "") + "."


def table(headers: Sequence[str], rows: Sequence[Sequence[object]], right: Sequence[int] = ()) -> str:
    """A markdown table; the columns numbered in ``right`` are right-aligned."""
    def clean(cell: object) -> str:
        return str(cell).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(map(clean, headers)) + " |",
             "|" + "|".join("---:" if i in right else "---" for i in range(len(headers))) + "|"]
    lines += ["| " + " | ".join(map(clean, row)) + " |" for row in rows]
    return "\n".join(lines)


def emit(blocks: Sequence[str], dest: str) -> None:
    """Write the markdown blocks (separated by blank lines) to ``dest``: a path, or "-" for stdout."""
    text = "\n\n".join(b for b in blocks if b) + "\n"
    if dest == "-":
        print()
        print(text, end="")
    else:
        with open(dest, "w", encoding="utf-8") as f:
            f.write(text)


def add_markdown_option(parser: object) -> None:
    """``--markdown [PATH]`` on an argparse parser."""
    parser.add_argument(  # type: ignore[attr-defined]
        "--markdown", nargs="?", const="-", metavar="PATH",
        help="also print the results as markdown tables, with a line naming the command, commit, "
             "date and machine (to PATH, or to stdout after the usual output)")
