"""``settings_store``: the versioned settings files of a queue and one
handle's cached copy, constructed directly on a real directory. Time is a
fake monotonic clock (``time.monotonic`` patched), never a wait."""

from __future__ import annotations

import os
import stat
import time

import pytest

from vsqs._core import fs as _fs
from vsqs._core import settings as _settings
from vsqs._core import settings_store as _store
from vsqs._core.errors import IncompatibleFormat, StorageError
from vsqs._core.format import SETTINGS_FORMAT
from vsqs._core.settings_store import TTL, SettingsStore


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(time, "monotonic", clock)
    return clock


@pytest.fixture
def directory(tmp_path) -> str:
    return str(tmp_path / _settings.SETTINGS_DIR)


def store(directory: str, changes: list | None = None) -> SettingsStore:
    """A store whose ``on_change`` calls go into ``changes``."""
    return SettingsStore(directory, (changes if changes is not None else []).append)


def version(directory: str, number: int, data: bytes) -> None:
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, _settings.version_name(number)), "wb") as file:
        file.write(data)


def encoded(**changes) -> bytes:
    return _settings.encode({**_settings.DEFAULTS, **_settings.validate(changes)}, SETTINGS_FORMAT)


def test_a_fresh_store_holds_the_defaults_without_reading(directory, clock):
    s = store(directory)
    assert s.values == _settings.DEFAULTS and s.values is not _settings.DEFAULTS
    assert s.mode is None
    assert s.lease_us == 30_000_000
    assert s.read_at == -float("inf")


def test_no_settings_directory_means_the_defaults(directory, clock):
    changes = []
    s = store(directory, changes)
    assert s.newest() == (0, _settings.DEFAULTS)
    assert s.current() == _settings.DEFAULTS
    assert changes == [_settings.DEFAULTS] and s.read_at == clock.now
    assert not os.path.exists(directory)  # reading makes nothing


def test_write_makes_version_after_version_each_merged_over_the_newest(directory, clock):
    s = store(directory)
    first = s.write(_settings.validate({"visibility_timeout": 5}), None)
    second = s.write(_settings.validate({"max_receives": 3}), None)
    assert first == {**_settings.DEFAULTS, "visibility_timeout": 5.0}
    assert second == {**first, "max_receives": 3}
    assert sorted(os.listdir(directory)) == [_settings.version_name(1), _settings.version_name(2)]
    assert store(directory).newest() == (2, second)
    with open(os.path.join(directory, _settings.version_name(1)), "rb") as file:
        assert _settings.decode(file.read(), SETTINGS_FORMAT) == first  # never rewritten


def test_write_merges_over_what_another_handle_wrote(directory, clock):
    mine, theirs = store(directory), store(directory)
    mine.current()
    theirs.write(_settings.validate({"delay": 7}), None)
    merged = mine.write(_settings.validate({"max_receives": 2}), None)  # its cached copy is not the base
    assert merged["delay"] == 7.0 and merged["max_receives"] == 2
    assert mine.values == merged


def test_the_newest_version_that_parses_wins(directory, clock):
    version(directory, 1, encoded(delay=1))
    version(directory, 2, encoded(delay=2))
    version(directory, 3, b'{"format": 2, "settings": ')  # torn, or still being written
    version(directory, 4, b"")
    assert store(directory).newest() == (4, {**_settings.DEFAULTS, "delay": 2.0})
    written = store(directory).write(_settings.validate({"max_receives": 9}), None)
    assert written["delay"] == 2.0 and written["max_receives"] == 9
    assert os.path.exists(os.path.join(directory, _settings.version_name(5)))  # after the newest number


def test_versions_that_do_not_parse_at_all_mean_the_defaults(directory, clock):
    version(directory, 1, b"garbage")
    version(directory, 2, b'{"format": 2, "settings": []}')
    assert store(directory).newest() == (2, _settings.DEFAULTS)


def test_the_newest_is_by_number_not_by_listing_order(directory, clock):
    version(directory, 10, encoded(delay=10))
    version(directory, 9, encoded(delay=9))
    for junk in ("99.json", "000000011.json.tmp", "000000012.JSON", "notes"):
        version(directory, 0, b"")
        os.rename(os.path.join(directory, _settings.version_name(0)), os.path.join(directory, junk))
    assert store(directory).newest() == (10, {**_settings.DEFAULTS, "delay": 10.0})


def test_unknown_and_invalid_stored_settings_are_dropped(directory, clock):
    version(directory, 1, b'{"format": 2, "settings": {"delay": 4, "future_knob": 1}}')
    assert store(directory).newest() == (1, {**_settings.DEFAULTS, "delay": 4.0})
    version(directory, 2, b'{"format": 2, "settings": {"delay": -4}}')  # invalid: the version is unreadable
    assert store(directory).newest() == (2, {**_settings.DEFAULTS, "delay": 4.0})


def test_settings_of_a_newer_format_are_refused(directory, clock):
    version(directory, 1, encoded(delay=1))
    version(directory, 2, b'{"format": 99, "settings": {}}')
    with pytest.raises(IncompatibleFormat, match="format 99"):
        store(directory).current()


def test_a_symlinked_settings_directory_is_not_followed(tmp_path, directory, clock):
    elsewhere = str(tmp_path / "elsewhere")
    version(elsewhere, 1, encoded(delay=3))
    os.symlink(elsewhere, directory)
    assert store(directory).newest() == (0, _settings.DEFAULTS)


def test_current_is_cached_for_the_ttl(directory, clock):
    changes = []
    mine, theirs = store(directory, changes), store(directory)
    assert mine.current()["delay"] == 0.0
    read_at = clock.now
    theirs.write(_settings.validate({"delay": 5}), None)
    clock.now = read_at + TTL * 0.99
    assert mine.current()["delay"] == 0.0  # its copy, not yet old
    assert len(changes) == 1
    clock.now = read_at + TTL
    assert mine.current()["delay"] == 5.0
    assert len(changes) == 2 and changes[-1]["delay"] == 5.0


def test_the_ttl_counts_from_the_last_read(directory, clock):
    mine = store(directory)
    mine.current()
    store(directory).write(_settings.validate({"delay": 5}), None)
    clock.now += TTL
    read_at = clock.now
    assert mine.current()["delay"] == 5.0
    store(directory).write(_settings.validate({"delay": 6}), None)
    clock.now += TTL / 2
    assert mine.current()["delay"] == 5.0 and mine.read_at == read_at


def test_a_write_counts_as_a_read(directory, clock):
    changes = []
    s = store(directory, changes)
    s.write(_settings.validate({"delay": 2}), None)
    assert changes == [s.values] and s.read_at == clock.now
    store(directory).write(_settings.validate({"delay": 3}), None)
    assert s.current()["delay"] == 2.0  # within the TTL of its own write
    assert len(changes) == 1


def test_mode_and_lease_follow_the_settings(directory, clock):
    changes = []
    s = store(directory, changes)
    s.write(_settings.validate({"file_mode": "640", "visibility_timeout": 2.5}), None)
    assert s.mode == 0o640 and s.lease_us == 2_500_000
    assert changes[-1]["file_mode"] == "0640"
    store(directory).write(_settings.validate({"file_mode": None, "visibility_timeout": 60}), None)
    clock.now += TTL
    s.current()
    assert s.mode is None and s.lease_us == 60_000_000
    assert changes[-1] is s.values  # on_change sees what the handle now holds


def test_write_makes_the_directory_and_the_files_with_the_mode(directory, clock):
    store(directory).write(_settings.validate({"delay": 1}), 0o640)
    assert stat.S_IMODE(os.stat(directory).st_mode) == 0o750
    assert stat.S_IMODE(os.stat(os.path.join(directory, _settings.version_name(1))).st_mode) == 0o640


def test_a_write_that_loses_a_race_writes_the_next_version(directory, clock, monkeypatch):
    real = _fs.create_exclusive
    lost = []

    def create_exclusive(path, data, **kwargs):
        if not lost:  # another handle takes this version number first
            lost.append(path)
            assert real(path, encoded(delay=8), durable=False)
            return False
        return real(path, data, **kwargs)

    monkeypatch.setattr(_fs, "create_exclusive", create_exclusive)
    merged = store(directory).write(_settings.validate({"max_receives": 4}), None)
    assert lost == [os.path.join(directory, _settings.version_name(1))]
    assert merged == {**_settings.DEFAULTS, "delay": 8.0, "max_receives": 4}  # merged over the winner's
    assert store(directory).newest() == (2, merged)


def test_a_write_that_always_loses_gives_up(directory, clock, monkeypatch):
    tries = []
    monkeypatch.setattr(_fs, "create_exclusive", lambda path, data, **kw: tries.append(path) and False)
    s = store(directory)
    with pytest.raises(StorageError, match="changed by others 50 times"):
        s.write(_settings.validate({"delay": 1}), None)
    assert len(tries) == 50
    assert s.values == _settings.DEFAULTS  # nothing adopted


def test_the_ttl_is_a_second():
    assert _store.TTL == 1.0  # documented: other processes' changes are seen within a second
