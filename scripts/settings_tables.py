"""The tables of queue settings in the docs, made from their declarations
(``vsqs._core.settings.SCHEMA``): each table under a line
``<!-- regenerate: .venv/bin/python scripts/settings_tables.py --write -->``.

    .venv/bin/python scripts/settings_tables.py          # exit 1, with a diff, if a table drifted
    .venv/bin/python scripts/settings_tables.py --write  # rewrite the tables

Two tables are made: the settings (``| setting | default | meaning |``, every
row) and the grammar of their stored values (``| kind | the JSON value |
settings, with their bounds |``: the last column of each kind's row; the
first two, the form of the kind, are the document's own).
``tests/test_docs_settings.py`` fails when a document differs.
"""

from __future__ import annotations

import argparse
import difflib
import math
import sys
from pathlib import Path
from typing import Any

from vsqs._core.settings import SCHEMA, Setting, number_text

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "docs" / "FORMAT.md"]
MARKER = "<!-- regenerate: .venv/bin/python scripts/settings_tables.py --write -->"
SETTINGS_HEADER = "| setting | default | meaning |"
GRAMMAR_HEADER = "| kind | the JSON value | settings, with their bounds |"


def _number(value: float) -> str:
    """30, 43200, 10^6, 2^40: a bound or a default as the docs write it, a power
    of ten or of two as one from a million up (64 stays 64)."""
    if float(value).is_integer() and value >= 10**6:
        whole = int(value)
        for base in (10, 2):
            power = round(math.log(whole, base))
            if base**power == whole:
                return f"{base}^{power}"
    return number_text(value)


def _default(setting: Setting) -> str:
    default = setting.default
    if default is None:
        return "none"
    if isinstance(default, bool):
        return str(default).lower()
    if isinstance(default, (int, float)):
        return _number(default)
    if isinstance(default, str):
        return f'`"{default}"`'
    return "`[]`" if isinstance(default, list) else "`{}`"


def settings_table() -> list[str]:
    rows = [SETTINGS_HEADER, "|---|---|---|"]
    rows += [f"| `{name}` | {_default(setting)} | {setting.doc} |" for name, setting in SCHEMA.items()]
    return rows


def _bounds(setting: Setting) -> str:
    if setting.bounds is None:
        return " or ".join(f'`"{choice}"`' for choice in setting.choices)
    low, high = (_number(bound) for bound in setting.bounds)
    return f"above {low} up to {high}" if setting.positive else f"{low}..{high}"


def settings_of_kind(kind: str) -> str:
    """The grammar table's last column for ``kind``: its settings, those with
    the same bounds together, in their declared order."""
    groups: dict[str, list[str]] = {}
    for name, setting in SCHEMA.items():
        if setting.kind == kind:
            groups.setdefault(_bounds(setting), []).append(f"`{name}`")
    if list(groups) == [""]:
        return ", ".join(groups[""])
    return ("; " if kind == "choice" else ", ").join(
        f"{' and '.join(names)} {bounds}" for bounds, names in groups.items())


def _grammar_row(row: str) -> str:
    cells = row.split(" | ")
    kind = cells[0].removeprefix("| ")
    return " | ".join([*cells[:-1], settings_of_kind(kind) + " |"])


def render(text: str) -> str:
    """``text`` with each table under the marker made again."""
    lines = text.split("\n")
    out: list[str] = []
    at = 0
    while at < len(lines):
        line = lines[at]
        out.append(line)
        at += 1
        if line != MARKER:
            continue
        while at < len(lines) and not lines[at].startswith("|"):
            out.append(lines[at])
            at += 1
        end = at
        while end < len(lines) and lines[end].startswith("|"):
            end += 1
        table = lines[at:end]
        if table and table[0] == SETTINGS_HEADER:
            out += settings_table()
        elif table and table[0] == GRAMMAR_HEADER:
            out += table[:2] + [_grammar_row(row) for row in table[2:]]
        else:
            raise ValueError(f"no table of settings under {MARKER}: {table[:1]}")
        at = end
    return "\n".join(out)


def drift(path: Path) -> str:
    """A unified diff from ``path`` to its tables made again ("" if none)."""
    text = path.read_text()
    made = render(text)
    return "".join(difflib.unified_diff(text.splitlines(True), made.splitlines(True),
                                        str(path.relative_to(ROOT)), "made from the declarations"))


def main(argv: Any = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="rewrite the tables instead of checking them")
    args = parser.parse_args(argv)
    drifted = False
    for path in DOCUMENTS:
        if args.write:
            path.write_text(render(path.read_text()))
        elif diff := drift(path):
            sys.stdout.write(diff)
            drifted = True
    return 1 if drifted else 0


if __name__ == "__main__":
    sys.exit(main())
