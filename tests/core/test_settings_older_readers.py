"""The settings reader beside the reader of vsqs before FORMAT.md wrote the
grammar down (FORMAT.md, This grammar and older readers): for each stored
value, this reader either skips the version or takes what the older one
took, so it never takes a version the older one skipped, nor reads a value
the older one read otherwise.

``OLDER`` holds the older reader's verdict on each value: ``SKIP``, or the
value its ``decode`` returned for the key. The verdicts were taken by running
``decode`` of ``vsqs/_core/settings.py`` at commit 3f0c6a5 on each row's
document; they are constants here so that the suite needs no older vsqs."""

from __future__ import annotations

import json

import pytest

from vsqs._core import settings as _settings
from vsqs._core.errors import InvalidArgument
from vsqs._core.format import SETTINGS_FORMAT

SKIP = "skip"  # the reader skipped the version holding the value
DEEP_POLICY = '{"a": ' * 40 + "1" + "}" * 40  # nested 40 deep: over the JSON depth limit

OLDER = [  # (setting, stored value, the older reader's verdict)
    ("dead_letter", "none", None),
    ("dead_letter", "None", None),
    ("dead_letter", "NONE", None),
    ("dead_letter", " none ", None),
    ("dead_letter", "", None),
    ("dead_letter", "jobs.dlq", "jobs.dlq"),
    ("dead_letter", "/spool/none", "/spool/none"),
    ("dead_letter", "a/b", SKIP),
    ("kms_master_key_id", "none", None),
    ("kms_master_key_id", "nOnE", None),
    ("kms_master_key_id", " none\t", None),
    ("kms_master_key_id", "", None),
    ("kms_master_key_id", "   ", None),
    ("kms_master_key_id", "\n", None),
    ("kms_master_key_id", "alias/k", "alias/k"),
    ("kms_master_key_id", " alias/k ", " alias/k "),
    ("kms_master_key_id", "a\x00b", SKIP),
    ("policy", "none", None),
    ("policy", "", None),
    ("policy", " ", None),
    ("policy", "[]", SKIP),
    ("policy", "null", SKIP),
    ("policy", "1", SKIP),
    ('policy', '"text"', SKIP),
    ("policy", "not json", SKIP),
    ("policy", '{"Version": "2012-10-17"', SKIP),
    ("policy", DEEP_POLICY, SKIP),
    ("policy", '{"Version": "2012-10-17"}', '{"Version": "2012-10-17"}'),
    ("policy", ' {"a": 1} ', ' {"a": 1} '),
    ("policy", '{"a": NaN}', '{"a": NaN}'),
    ("policy", '{"a": 1, "a": 2}', '{"a": 1, "a": 2}'),
    ("policy", {"Version": "2012-10-17"}, '{"Version":"2012-10-17"}'),
    ("visibility_timeout", "none", 30.0),
    ("visibility_timeout", "10", 10.0),
    ("visibility_timeout", "soon", SKIP),
    ("visibility_timeout", 12, 12.0),
    ("max_receives", 5.0, 5),
    ("max_receives", 5.5, SKIP),
    ("max_receives", "5", 5),
    ("content_dedup", "yes", True),
    ("content_dedup", "maybe", SKIP),
    ("dedup_scope", " Queue ", "queue"),
    ("dedup_scope", "both", SKIP),
    ("throughput_limit", "none", None),
    ("file_mode", "0o660", "0660"),
    ("file_mode", "0660", "0660"),
    ("file_mode", "0460", SKIP),
    ("throttle", "2/60", [2, 60.0]),
    ("throttle", [2, 0], SKIP),
    ("suspended", "receive", ["receive"]),
    ("suspended", ["pause"], SKIP),
    ("tags", '{"a": "b"}', {"a": "b"}),
    ("tags", "[]", SKIP),
    ("tags", "none", {}),
]


def verdict(key: str, value: object) -> object:
    """This reader's verdict on a version whose settings hold ``value`` for ``key``."""
    data = json.dumps({"format": SETTINGS_FORMAT, "settings": {key: value}}).encode()
    try:
        return _settings.decode(data, SETTINGS_FORMAT)[key]
    except InvalidArgument:
        return SKIP


@pytest.mark.parametrize("key, value, older", OLDER, ids=[f"{key}={value!r}"[:60] for key, value, _ in OLDER])
def test_the_reader_skips_a_value_or_takes_it_as_the_older_reader_did(key, value, older):
    assert verdict(key, value) in (SKIP, older)


def test_the_table_holds_values_the_older_reader_skipped_and_values_it_took_as_unset():
    """Both kinds of row are there, for each setting a string may name."""
    for key in ("dead_letter", "kms_master_key_id", "policy"):
        verdicts = [older for k, _, older in OLDER if k == key]
        assert SKIP in verdicts and None in verdicts, key


@pytest.mark.parametrize("key", ["dead_letter", "kms_master_key_id"])
@pytest.mark.parametrize("word", ["none", "None", "NONE", " none ", "", "  ", "\t"])
def test_a_word_that_unsets_on_input_is_not_read_as_a_name(key, word):
    assert verdict(key, word) == SKIP
    assert _settings.validate({key: word}) == {key: None}  # as input, it unsets the setting
