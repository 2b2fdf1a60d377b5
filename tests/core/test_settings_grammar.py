"""The grammar of a stored settings version (FORMAT.md, Settings): the reader
takes each value only in the form vsqs writes, and a version holding any
other form is skipped as a whole (the newest version that parses wins)."""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import vsqs
from vsqs._core import settings as _settings
from vsqs._core import settings_store as _settings_store
from vsqs._core.errors import IncompatibleFormat, InvalidArgument
from vsqs._core.format import SETTINGS_FORMAT
from vsqs._core.settings_store import SettingsStore

BASE = {"visibility_timeout": 7.0}  # what the older, valid version holds


def versions(directory: str, *documents: bytes) -> SettingsStore:
    """A store over ``directory`` holding ``documents`` as versions 1, 2, ..."""
    os.makedirs(directory, exist_ok=True)
    for number, data in enumerate(documents, 1):
        with open(os.path.join(directory, _settings.version_name(number)), "wb") as file:
            file.write(data)
    return SettingsStore(directory, lambda settings: None)


def stored(settings: str, format_field: str = f'"format": {SETTINGS_FORMAT}, ') -> bytes:
    """A version document with ``settings`` (JSON text of the settings object) written as given."""
    return ("{" + format_field + '"settings": ' + settings + "}").encode()


BASE_VERSION = _settings.encode({**_settings.DEFAULTS, **BASE}, SETTINGS_FORMAT)


def settings_read(tmp_path, document: bytes) -> dict:
    """The settings a reader takes from a valid version 1 followed by ``document`` as version 2."""
    version, settings = versions(str(tmp_path / ".settings"), BASE_VERSION, document).newest()
    assert version == 2
    return settings


OUTSIDE_THE_GRAMMAR = [
    # the forms an independent reader of FORMAT.md refuses
    ('{"suspended": "receive"}', "an operation list as a string"),
    ('{"visibility_timeout": "1_0"}', "seconds as a string (Python's float syntax)"),
    ('{"content_dedup": "yes"}', "a flag as a word"),
    ('{"throttle": "2/60"}', "a throttle as text"),
    ('{"file_mode": "0o660"}', "a mode with Python's prefix"),
    # more of the same kinds
    ('{"visibility_timeout": "10"}', "seconds as a numeric string"),
    ('{"delay": true}', "seconds as a boolean"),
    ('{"delay": "none"}', "the word none for the default"),
    ('{"dead_letter": ""}', "an empty string for the default"),
    ('{"max_receives": "5"}', "a count as a string"),
    ('{"max_receives": 5.0}', "a count with a fraction"),
    ('{"delay": 1' + "0" * 400 + "}", "seconds beyond any float"),
    ('{"max_receives": 5e0}', "a count with an exponent"),
    ('{"max_receives": true}', "a count as a boolean"),
    ('{"kms_data_key_reuse_period": 300.0}', "a period with a fraction"),
    ('{"throttle": [2.0, 60]}', "a throttle's receives with a fraction"),
    ('{"throttle": [2, "60"]}', "a throttle's window as a string"),
    ('{"throttle": {"0": 2, "1": 60}}', "a throttle as an object"),
    ('{"file_mode": "660"}', "a mode of three digits"),
    ('{"file_mode": 432}', "a mode as a number"),
    ('{"file_mode": "0660 "}', "a mode with a space"),
    ('{"file_mode": "1660"}', "a mode with the sticky bit"),
    ('{"file_mode": "4660"}', "a mode with the setuid bit"),
    ('{"file_mode": "0460"}', "a mode the owner cannot write"),
    ('{"content_dedup": "true"}', "a flag as a string"),
    ('{"sqs_managed_sse": 1}', "a flag as a number"),
    ('{"dedup_scope": "Queue"}', "an enum in another case"),
    ('{"dedup_scope": " queue"}', "an enum with a space"),
    ('{"throughput_limit": "GROUP"}', "an enum in capitals"),
    ('{"suspended": ["Receive"]}', "an operation in another case"),
    ('{"suspended": "receive,publish"}', "operations as a comma list"),
    ('{"suspended": {"receive": true}}', "operations as an object"),
    ('{"tags": "{\\"team\\": \\"a\\"}"}', "tags as JSON text"),
    ('{"policy": {"Version": "2012-10-17"}}', "a policy as an object, not its text"),
    ('{"policy": "[]"}', "a policy that is not a JSON object's text"),
    ('{"policy": "{\\"a\\": NaN}"}', "a policy holding NaN"),
    ('{"dead_letter": "none"}', "the word none for a dead-letter queue"),
    ('{"kms_master_key_id": " None "}', "the word none for a key id"),
    ('{"kms_master_key_id": "  "}', "a blank key id"),
    ('{"delay": NaN}', "NaN, which JSON has not"),
    ('{"retention": Infinity}', "Infinity, which JSON has not"),
    ('{"suspended": ["receive"], "suspended": []}', "a key given twice"),
]


@pytest.mark.parametrize("settings, what", OUTSIDE_THE_GRAMMAR, ids=[what for _, what in OUTSIDE_THE_GRAMMAR])
def test_a_version_with_a_value_outside_the_grammar_is_skipped(tmp_path, settings, what):
    assert settings_read(tmp_path, stored(settings)) == {**_settings.DEFAULTS, **BASE}


@pytest.mark.parametrize(
    "format_field",
    ["", '"format": "2", ', '"format": 2.0, ', '"format": true, ', '"format": 0, ', '"format": null, '],
    ids=["missing", "string", "fraction", "boolean", "zero", "null"],
)
def test_a_version_without_an_integer_format_of_at_least_1_is_skipped(tmp_path, format_field):
    assert settings_read(tmp_path, stored('{"delay": 5}', format_field)) == {**_settings.DEFAULTS, **BASE}


@pytest.mark.parametrize(
    "document",
    [
        b'{"format": 2, "settings": {"delay": 5}, "settings": {"delay": 6}}',
        '{"format": 2, "settings": {"delay": 5}}'.encode("utf-16"),
        b'\xef\xbb\xbf{"format": 2, "settings": {"delay": 5}}',
        b'{"format": 2, "settings": {"delay": 5}, "note": NaN}',
    ],
    ids=["a repeated key", "UTF-16", "a byte order mark", "NaN beside the settings"],
)
def test_a_document_that_is_not_strict_json_in_utf8_is_skipped(tmp_path, document):
    assert settings_read(tmp_path, document) == {**_settings.DEFAULTS, **BASE}


def skipped_version(tmp_path) -> SettingsStore:
    """A store whose version 2 is outside the grammar and old enough not to be being written."""
    store = versions(str(tmp_path / ".settings"), BASE_VERSION, stored('{"suspended": "receive"}'))
    path = os.path.join(store.directory, _settings.version_name(2))
    os.utime(path, (os.path.getmtime(path) - 10,) * 2)
    return store


def test_a_skipped_version_is_reported_once_per_process_whichever_handle_reads_it(tmp_path, caplog):
    store = skipped_version(tmp_path)
    with caplog.at_level("WARNING", logger="vsqs"):
        for _ in range(3):
            store.newest()
            SettingsStore(store.directory, lambda settings: None).newest()  # as dead_letters makes one per call
    assert [r.getMessage() for r in caplog.records] == [
        f"queue settings {store.directory}: version 2 skipped: "
        "suspended must be a list of publish, receive, delete, not 'receive'"
    ]


def test_the_process_forgets_the_oldest_version_it_reported_past_its_bound(tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(_settings_store, "_REPORTED_MAX", 2)
    monkeypatch.setattr(_settings_store, "_reported", {})
    first, second, third = (skipped_version(tmp_path / name) for name in ("a", "b", "c"))
    with caplog.at_level("WARNING", logger="vsqs"):
        for store in (first, second, first, third, second, first):
            store.newest()
    reported = [r.getMessage().split(":")[0].removeprefix("queue settings ") for r in caplog.records]
    assert reported == [first.directory, second.directory, third.directory, first.directory]


def test_a_version_being_written_is_skipped_unreported(tmp_path, caplog):
    store = versions(str(tmp_path / ".settings"), BASE_VERSION, b'{"format": 2, "sett')
    with caplog.at_level("WARNING", logger="vsqs"):
        assert store.newest() == (2, {**_settings.DEFAULTS, **BASE})
    assert caplog.records == []


CANONICAL = [
    ('{"visibility_timeout": 12.5}', {"visibility_timeout": 12.5}),
    ('{"visibility_timeout": 12}', {"visibility_timeout": 12.0}),  # a JSON integer is a number of seconds
    ('{"delay": 1e1}', {"delay": 10.0}),
    ('{"delay": 0.0, "retention": 316224000.0}', {"retention": 316224000.0}),
    ('{"max_receives": 5, "max_messages": 1000000000000}', {"max_receives": 5, "max_messages": 10**12}),
    ('{"throttle": [2, 60.0]}', {"throttle": [2, 60.0]}),
    ('{"throttle": [2, 60]}', {"throttle": [2, 60.0]}),
    ('{"throttle": [1, 0.001]}', {"throttle": [1, 0.001]}),
    ('{"file_mode": "0660"}', {"file_mode": "0660"}),
    ('{"file_mode": "0600"}', {"file_mode": "0600"}),
    ('{"file_mode": "0777"}', {"file_mode": "0777"}),
    ('{"content_dedup": true, "sqs_managed_sse": false}', {"content_dedup": True, "sqs_managed_sse": False}),
    ('{"dedup_scope": "queue", "throughput_limit": "group"}', {"dedup_scope": "queue", "throughput_limit": "group"}),
    ('{"suspended": ["receive"]}', {"suspended": ["receive"]}),
    ('{"suspended": ["receive", "delete", "receive"]}', {"suspended": ["delete", "receive"]}),  # a set
    ('{"suspended": []}', {"suspended": []}),
    ('{"dead_letter": "jobs.dlq"}', {"dead_letter": "jobs.dlq"}),
    ('{"dead_letter": "/spool/dead"}', {"dead_letter": "/spool/dead"}),
    ('{"tags": {"b": "", "a": "x"}}', {"tags": {"a": "x", "b": ""}}),
    ('{"policy": "{\\"Version\\": \\"2012-10-17\\"}"}', {"policy": '{"Version": "2012-10-17"}'}),
    ('{"kms_master_key_id": "alias/k", "kms_data_key_reuse_period": 300}',
     {"kms_master_key_id": "alias/k", "kms_data_key_reuse_period": 300}),
    ('{"max_receives": null, "dead_letter": null, "suspended": null}', {}),  # null: the default
    ('{"future_knob": "anything", "delay": 3}', {"delay": 3.0}),  # unknown keys: ignored
]


@pytest.mark.parametrize("settings, taken", CANONICAL, ids=[s for s, _ in CANONICAL])
def test_values_in_the_grammar_are_read(tmp_path, settings, taken):
    assert settings_read(tmp_path, stored(settings)) == {**_settings.DEFAULTS, **taken}


def test_settings_format_1_is_read(tmp_path):
    assert settings_read(tmp_path, stored('{"delay": 3}', '"format": 1, ')) == {**_settings.DEFAULTS, "delay": 3.0}


def test_a_newer_settings_format_refuses_the_queue_whatever_its_settings(tmp_path):
    store = versions(str(tmp_path / ".settings"), BASE_VERSION, stored('{"delay": "soon"}', '"format": 3, '))
    with pytest.raises(IncompatibleFormat, match="format 3"):
        store.newest()


def test_a_newer_settings_format_under_a_torn_version_refuses_the_queue(tmp_path):
    store = versions(str(tmp_path / ".settings"), BASE_VERSION, stored("{}", '"format": 3, '), b'{"form')
    with pytest.raises(IncompatibleFormat):
        store.newest()


def test_a_newer_settings_format_under_a_version_that_parses_is_not_read(tmp_path):
    store = versions(str(tmp_path / ".settings"), stored("{}", '"format": 3, '), BASE_VERSION)
    assert store.newest() == (2, {**_settings.DEFAULTS, **BASE})


def test_a_queue_suspended_in_a_form_outside_the_grammar_is_not_suspended(tmp_path):
    q = vsqs.Queue(tmp_path / "q", create=True)
    q.configure(visibility_timeout=7)
    q.publish(b"job")
    with open(os.path.join(q.path, _settings.SETTINGS_DIR, _settings.version_name(2)), "wb") as file:
        file.write(stored('{"suspended": "receive"}'))
    other = vsqs.Queue(q.path)
    assert other.settings["suspended"] == [] and other.settings["visibility_timeout"] == 7.0
    assert other.receive().body == b"job"  # as a reader that follows FORMAT.md sees it


# -- what the writer writes, the reader takes back unchanged --

SECONDS = {
    "visibility_timeout": 43200, "delay": 31622400, "dedup_window": 31622400, "receive_wait": 20,
}
COUNTS = {
    "max_messages": (1, 10**12), "max_message_bytes": (1, 2**40), "max_receives": (1, 10**6),
    "group_concurrency": (1, 10**6), "kms_data_key_reuse_period": (60, 86400),
}


def _finite(low: float, high: float) -> st.SearchStrategy:
    return st.floats(low, high, allow_nan=False, allow_infinity=False)


def _seconds(maximum: float, positive: bool = False) -> st.SearchStrategy:
    number = st.one_of(_finite(0, maximum), st.integers(0, int(maximum)))
    number = number.filter(lambda v: v > 0) if positive else number
    return st.one_of(number, number.map(str))  # the API takes "12.5" too


_MODES = st.integers(0, 0o777).filter(lambda mode: mode & 0o600 == 0o600)
_TEXT = st.text(max_size=40)

INPUTS: dict[str, st.SearchStrategy] = {
    **{key: _seconds(maximum) for key, maximum in SECONDS.items()},
    "retention": _seconds(316224000, positive=True),
    **{key: st.one_of(st.integers(low, high), st.integers(low, high).map(str)) for key, (low, high) in COUNTS.items()},
    "throttle": st.one_of(
        st.tuples(st.integers(1, 10**9), _finite(0.001, 86400)),
        st.builds(lambda n, w: f"{n}/{w}", st.integers(1, 10**9), st.integers(1, 86400)),
    ),
    "file_mode": st.one_of(_MODES, _MODES.map(lambda m: f"{m:o}"), _MODES.map(lambda m: f"0o{m:o}")),
    "content_dedup": st.one_of(st.booleans(), st.sampled_from(["yes", "no", "on", "off", "TRUE", "0"])),
    "sqs_managed_sse": st.booleans(),
    "dedup_scope": st.sampled_from(["group", "queue", " Queue "]),
    "throughput_limit": st.sampled_from(["group", "queue", "GROUP"]),
    "suspended": st.one_of(
        st.lists(st.sampled_from(_settings.OPERATIONS)),
        st.lists(st.sampled_from(_settings.OPERATIONS)).map(",".join),
    ),
    "dead_letter": st.one_of(
        st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,20}", fullmatch=True).filter(lambda n: ".." not in n),
        st.lists(st.from_regex(r"[a-z0-9_]{1,8}", fullmatch=True), min_size=1, max_size=4).map(
            lambda parts: "/" + "/".join(parts)
        ),
    ),
    "tags": st.dictionaries(st.text(min_size=1, max_size=20), _TEXT, max_size=5),
    "policy": st.dictionaries(st.text(max_size=10), st.one_of(_TEXT, st.integers(), st.booleans()), max_size=4),
    "kms_master_key_id": st.text(min_size=1, max_size=60).filter(lambda k: k.strip() and "\x00" not in k),
}


def test_every_setting_has_an_input_strategy():
    assert set(INPUTS) == set(_settings.SCHEMA)


@settings(deadline=None)
@given(st.fixed_dictionaries({}, optional={key: st.one_of(st.none(), value) for key, value in INPUTS.items()}))
def test_what_the_writer_writes_the_reader_reads_back(changes):
    written = {**_settings.defaults(), **_settings.validate(changes)}
    data = _settings.encode(written, SETTINGS_FORMAT)
    assert _settings.decode(data, SETTINGS_FORMAT) == written
    assert json.loads(data)["settings"] == written  # what is written is the value itself


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**64), 2**64) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12) | st.sampled_from(["receive", "queue", "group", "0660", "0600", "1/2", "yes", "5"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6,
)


@settings(deadline=None)
@given(st.sampled_from(sorted(_settings.SCHEMA)), JSON_VALUES)
@example("content_dedup", "yes")
@example("suspended", "receive")
@example("file_mode", "660")
@example("throttle", [2.0, 60])
@example("max_receives", 5.0)
@example("policy", {})
@example("tags", '{"a": "b"}')
def test_the_reader_takes_a_value_as_it_is_or_not_at_all(key, value):
    """No conversion on reading: a value taken is the value written (a number
    of seconds as a float, a set of operations sorted), and it is written back
    as it was taken."""
    data = json.dumps({"format": SETTINGS_FORMAT, "settings": {key: value}}).encode()
    try:
        read = _settings.decode(data, SETTINGS_FORMAT)
    except InvalidArgument:
        return
    if value is None:
        assert read == _settings.DEFAULTS
        return
    taken = read[key]
    if key in SECONDS or key == "retention":
        assert isinstance(value, (int, float)) and not isinstance(value, bool) and taken == value
    elif key == "suspended":
        assert taken == sorted(set(value))
    elif key == "throttle":
        assert taken == value and isinstance(value[0], int) and not isinstance(value[0], bool)
    else:
        assert taken == value and type(taken) is type(value)
    assert _settings.decode(_settings.encode(read, SETTINGS_FORMAT), SETTINGS_FORMAT) == read
    assert not (isinstance(taken, float) and math.isnan(taken))


# -- the grammar as FORMAT.md writes it --

FORMAT_MD = Path(__file__).resolve().parents[2] / "docs" / "FORMAT.md"


def test_the_grammar_table_of_format_md_names_every_setting_once():
    text = FORMAT_MD.read_text()
    table = text[text.index("| kind | the JSON value |"):]
    table = table[: table.index("\n\n")]
    named = [name for row in table.splitlines()[2:] for name in re.findall(r"`([a-z_]+)`", row.split(" | ")[-1])]
    assert sorted(named) == sorted(_settings.SCHEMA)


BOUNDS = {  # as FORMAT.md's grammar table gives them: (lowest, highest)
    "visibility_timeout": (0, 43200), "delay": (0, 31622400), "dedup_window": (0, 31622400),
    "receive_wait": (0, 20), "max_messages": (1, 10**12), "max_message_bytes": (1, 2**40),
    "max_receives": (1, 10**6), "group_concurrency": (1, 10**6), "kms_data_key_reuse_period": (60, 86400),
}


def taken(key: str, value: object) -> bool:
    """Whether a version holding ``value`` for ``key`` parses."""
    try:
        _settings.decode(json.dumps({"format": 2, "settings": {key: value}}).encode(), SETTINGS_FORMAT)
    except InvalidArgument:
        return False
    return True


def policy_of(size: int, letter: str) -> str:
    """The text of a JSON object of ``size`` UTF-8 bytes, made of ``letter`` (of 1 or 2 bytes)."""
    room = size - len('{"p":""}')
    return '{"p":"' + letter * (room // len(letter.encode())) + '"}'


@pytest.mark.parametrize("key", BOUNDS)
def test_a_bounded_value_is_read_from_its_lowest_to_its_highest(key):
    low, high = BOUNDS[key]
    assert taken(key, low) and taken(key, high)
    assert not taken(key, low - 1) and not taken(key, high + 1)
    if key in SECONDS:
        assert taken(key, float(high)) and not taken(key, high + 0.001)


def test_the_bounds_of_the_other_kinds():
    assert taken("retention", 1e-9) and taken("retention", 316224000) and not taken("retention", 0)
    assert not taken("retention", 316224000.5)
    assert taken("throttle", [1, 0.001]) and taken("throttle", [10**9, 86400])
    for throttle in ([0, 1], [10**9 + 1, 1], [1, 0.0009], [1, 86400.5], [1], [1, 1, 1]):
        assert not taken("throttle", throttle), throttle
    assert taken("tags", {f"k{i}": "" for i in range(50)}) and not taken("tags", {f"k{i}": "" for i in range(51)})
    assert taken("tags", {"k" * 128: "v" * 256}) and not taken("tags", {"k" * 129: ""})
    assert not taken("tags", {"k": "v" * 257}) and not taken("tags", {"": "v"}) and not taken("tags", {"k": 1})
    assert taken("policy", policy_of(20480, "p")) and not taken("policy", policy_of(20481, "p"))
    assert taken("policy", policy_of(20480, "é")) and not taken("policy", policy_of(20482, "é"))
    assert taken("policy", "{}") and not taken("policy", "[]") and not taken("policy", "p")
    assert taken("kms_master_key_id", "k" * 2048) and not taken("kms_master_key_id", "k" * 2049)
    assert not taken("kms_master_key_id", "") and not taken("kms_master_key_id", "a\x00b")
    assert taken("dead_letter", "/" + "d" * 4095) and not taken("dead_letter", "/" + "d" * 4096)
    for ref in ("a/b", "../x", "/a/../b", "relative", ".hidden", "/a\x00"):
        assert taken("dead_letter", ref) == (ref == "relative"), ref
    for mode in ("0600", "0644", "0660", "0700", "0777"):
        assert taken("file_mode", mode), mode
    for mode in ("0500", "0000", "0060", "2660", "0o660", "660", "00660", "0668", "0660\n"):
        assert not taken("file_mode", mode), mode
