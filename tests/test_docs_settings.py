"""The docs' tables of queue settings are made from the settings'
declarations (``vsqs._core.settings.SCHEMA``) by scripts/settings_tables.py:
a table that drifts from them fails here, showing the difference. The SQS
face's table of queue attributes (docs/gateway.md), prose about Amazon row by
row, is held to the face's map of the settings each attribute sets."""

from __future__ import annotations

import re
import runpy
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TABLES = runpy.run_path(str(ROOT / "scripts" / "settings_tables.py"))
FORMAT_MD = ROOT / "docs" / "FORMAT.md"


@pytest.mark.parametrize("path", TABLES["DOCUMENTS"], ids=lambda path: path.name)
def test_each_table_of_settings_is_as_the_declarations_make_it(path):
    diff = TABLES["drift"](path)
    assert not diff, f"{path.name} drifted from the settings' declarations " \
                     f"(.venv/bin/python scripts/settings_tables.py --write makes it again):\n{diff}"


def test_format_md_has_both_tables_under_the_marker():
    lines = FORMAT_MD.read_text().splitlines()
    under_marker = [lines[at + 1] for at, line in enumerate(lines) if line == TABLES["MARKER"]]
    assert under_marker == [TABLES["GRAMMAR_HEADER"], TABLES["SETTINGS_HEADER"]]


@pytest.mark.parametrize("row, drifted", [
    ("| `delay` | 0 | seconds a published", "| `delay` | 5 | seconds a published"),
    ("| `tags` | `{}` | labels", "| `tags` | none | labels"),
    ("`receive_wait` 0..20", "`receive_wait` 0..30"),
    ("`max_messages` 1..10^12", "`max_messages` 1..10^9"),
    ("| `content_dedup`, `sqs_managed_sse` |", "| `content_dedup` |"),
])
def test_a_drifted_table_is_made_again(row, drifted):
    text = FORMAT_MD.read_text()
    assert text.count(row) == 1
    assert TABLES["render"](text.replace(row, drifted)) == text


@pytest.mark.parametrize("value, written", [
    (0, "0"), (20.0, "20"), (64, "64"), (1024, "1024"), (43200.0, "43200"), (316224000.0, "316224000"),
    (10**6, "10^6"), (10**9, "10^9"), (10**12, "10^12"), (2**40, "2^40"), (0.001, "0.001"),
])
def test_a_bound_is_written_as_a_power_from_a_million(value, written):
    assert TABLES["_number"](value) == written


def test_a_missing_setting_and_a_stray_one_are_made_again():
    text = FORMAT_MD.read_text()
    row = next(line for line in text.splitlines() if line.startswith("| `max_receives` |"))
    assert TABLES["render"](text.replace(row + "\n", "")) == text
    assert TABLES["render"](text.replace(row, row + "\n| `gone` | none | a setting no more |")) == text


def test_a_marker_over_no_table_of_settings_is_an_error():
    with pytest.raises(ValueError, match="no table of settings"):
        TABLES["render"](f"{TABLES['MARKER']}\n| other | table |\n|---|---|\n")


GATEWAY_MD = ROOT / "docs" / "gateway.md"


def test_gateway_md_names_the_settings_each_queue_attribute_sets():
    """Each row of its table of queue attributes names, of the settings, just
    those the SQS face sets with that attribute."""
    pytest.importorskip("fastapi", reason="the gateway needs the server extra: pip install 'vsqs[server]'")
    from vsqs._core.settings import SCHEMA
    from vsqs._gateway.sqs.attributes import SETTINGS_OF_ATTRIBUTE

    text = GATEWAY_MD.read_text()
    table = text[text.index("| attribute | status | vsqs |"):]
    rows = table[: table.index("\n\n")].splitlines()[2:]
    named = {row.split(" | ")[0].removeprefix("| "): {name for name in re.findall(r"`([a-z_]+)`", row)
                                                      if name in SCHEMA} for row in rows}
    assert {attribute: named.get(attribute) for attribute in SETTINGS_OF_ATTRIBUTE} == {
        attribute: set(settings) for attribute, settings in SETTINGS_OF_ATTRIBUTE.items()}
    assert not {attribute: settings for attribute, settings in named.items()
                if settings and attribute not in SETTINGS_OF_ATTRIBUTE}
