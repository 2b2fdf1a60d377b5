"""``dead_letters``: where a queue's dead letters go, burying one, counting
them, and redriving a dead-letter queue's messages home through
``.sources``; ``DeadLetters`` constructed directly on real queue
directories, with fake callables for the queue's id, settings, mode and
handle factory."""

from __future__ import annotations

import errno
import os
import shutil

import pytest

from vsqs._core import envelope as _envelope
from vsqs._core import format as _format
from vsqs._core import fs as _fs
from vsqs._core import settings as _settings
from vsqs._core.dead_letters import DeadLetters, register_source
from vsqs._core.errors import InvalidArgument, QueueNotFound, StorageError
from vsqs._core.format import State
from vsqs._core.metadata import Store, open_store

NOW_US = 1_700_000_000_000_000
SECOND = 1_000_000


class FakeSettings:
    """The settings store a part is given: what it reads of it (its owner's settings and mode)."""

    def __init__(self, owner) -> None:
        self._owner = owner

    def current(self) -> dict:
        return self._owner.settings

    @property
    def mode(self) -> int | None:
        return self._owner.mode


class Source:
    """A queue as its DeadLetters sees it: id, settings, mode, and a handle factory that records."""

    def __init__(self, store: Store, **settings) -> None:
        self.store = store
        self.settings = {**_settings.DEFAULTS, **_settings.validate(settings)}
        self.mode: int | None = None
        self.opened: list[tuple[str, bool, int | None]] = []
        self.dead = DeadLetters(store.layout, store.id, FakeSettings(self), self.open_queue)  # type: ignore[arg-type]

    def open_queue(self, path: str, create: bool, mode: int | None) -> str:
        self.opened.append((path, create, mode))
        return f"handle of {path}"

    def put(self, count: int, body: bytes = b"body", group: str = "", until_us: int = 0) -> _format.Name:
        """A message received ``count`` times (hidden until ``until_us``, or ready)."""
        stem = _format.make_stem(_format.new_key(), group_hash=group, envelope=bool(group))
        name = _format.hidden_name(stem, until_us, count) if until_us else _format.ready_name(stem, count)
        content = _envelope.encode_envelope({"group": "g"}, body) if group else body
        with open(self.store.layout.message_file(name), "wb") as file:
            file.write(content)
        parsed = _format.parse_name(name)
        assert parsed is not None
        return parsed


def queue(tmp_path, name: str, shards: int = 1) -> Store:
    return open_store(str(tmp_path / name), create=True, shards=shards)


def names(store: Store) -> list[_format.Name]:
    return sorted(store.layout.names(), key=str)


def read(store: Store, name: _format.Name) -> bytes:
    return _fs.read(store.layout.message_file(str(name))) or b""


@pytest.fixture(params=[1, 4], ids=["flat", "shards4"])
def source(request, tmp_path) -> Source:
    return Source(queue(tmp_path, "q", request.param), max_receives=3)


# -- where dead letters go -----------------------------------------------------------------


def test_no_dead_letter_queue_without_the_settings(tmp_path):
    source = Source(queue(tmp_path, "q"))
    assert source.dead.path() is None
    assert source.dead.queue() is None
    assert source.dead.count() == 0
    assert source.opened == [] and sorted(os.listdir(tmp_path)) == ["q"]


def test_the_dead_letter_queue_path(tmp_path):
    source = Source(queue(tmp_path, "q"), max_receives=2)
    assert source.dead.path() == str(tmp_path / "q.dlq")
    source.settings["dead_letter"] = "graveyard"
    assert source.dead.path() == str(tmp_path / "graveyard")
    source.settings["dead_letter"] = str(tmp_path / "elsewhere" / "dlq")
    assert source.dead.path() == str(tmp_path / "elsewhere" / "dlq")
    assert source.dead.path({**source.settings, "dead_letter": "given"}) == str(tmp_path / "given")
    source.settings.update(max_receives=None, dead_letter="only-named")
    assert source.dead.path() == str(tmp_path / "only-named")


@pytest.mark.parametrize("target", ["q", ".", "..", "/"])
def test_a_dead_letter_queue_cannot_be_the_queue_or_above_it(tmp_path, target):
    source = Source(queue(tmp_path, "q"), max_receives=2)
    source.settings["dead_letter"] = target if target != "/" else str(tmp_path)
    with pytest.raises(InvalidArgument, match="this queue or a directory above it"):
        source.dead.path()


def test_the_dead_letter_queue_is_made_once_and_knows_its_source(source, tmp_path):
    source.mode = 0o640
    dlq = str(tmp_path / "q.dlq")
    assert source.dead.queue() == f"handle of {dlq}"
    assert source.dead.queue() == f"handle of {dlq}"
    assert source.opened == [(dlq, True, 0o640)]
    assert open_store(dlq).id != source.store.id
    with open(os.path.join(dlq, _format.SOURCES_DIR, source.store.id)) as file:
        assert file.read() == source.store.layout.shown


def test_a_new_dead_letter_setting_is_followed(source, tmp_path):
    source.dead.queue()
    source.settings["dead_letter"] = "other"
    assert source.dead.queue() == f"handle of {tmp_path / 'other'}"
    assert [path for path, _, _ in source.opened] == [str(tmp_path / "q.dlq"), str(tmp_path / "other")]


def test_without_create_a_missing_dead_letter_queue_is_not_made(source, tmp_path):
    with pytest.raises(QueueNotFound):
        source.dead.queue(create=False)
    assert not os.path.exists(tmp_path / "q.dlq")


# -- bury --------------------------------------------------------------------------------------


@pytest.mark.parametrize("dlq_shards", [1, 8])
def test_bury_keeps_id_body_and_count_and_marks_the_origin(source, tmp_path, dlq_shards):
    dlq = queue(tmp_path, "q.dlq", dlq_shards)
    name = source.put(3, b"payload", until_us=NOW_US)
    assert source.dead.bury(name) == 1
    assert names(source.store) == []
    (dead,) = names(dlq)
    assert (dead.key, dead.receive_count, dead.state, dead.origin) == (name.key, 3, State.READY, source.store.id)
    assert dead.sent_us == name.sent_us
    assert read(dlq, dead) == b"payload"
    gone = _format.parse_name(_format.ready_name(_format.new_key(), 3))
    assert source.dead.bury(gone) == 0  # not there (taken by another consumer): a lost race


def test_bury_keeps_a_groups_envelope(source, tmp_path):
    name = source.put(5, b"in order", group=_format.group_hash("g"))
    source.dead.bury(name)
    dlq = open_store(str(tmp_path / "q.dlq"))
    (dead,) = names(dlq)
    assert dead.group_hash == name.group_hash and dead.envelope and dead.receive_count == 5
    assert _envelope.decode_content(dead, read(dlq, dead), "") == (b"in order", {"group": "g"})


def test_bury_across_filesystems_says_so(source, monkeypatch):
    name = source.put(3)
    source.dead.queue()

    def rename(src, dst):
        raise StorageError(errno.EXDEV, "cannot rename message file", src)

    monkeypatch.setattr(_fs, "rename", rename)
    with pytest.raises(StorageError, match="must be on the same filesystem") as caught:
        source.dead.bury(name)
    assert caught.value.errno == errno.EXDEV


def test_bury_into_a_dead_letter_queue_deleted_since_makes_it_again(source, tmp_path):
    name = source.put(3)
    source.dead.queue()
    shutil.rmtree(tmp_path / "q.dlq")
    assert source.dead.bury(name) == 1
    assert names(source.store) == [] and len(names(open_store(str(tmp_path / "q.dlq")))) == 1


# -- count ---------------------------------------------------------------------------------------


def test_count_is_this_queues_dead_letters_only(source, tmp_path):
    assert source.dead.count() == 0  # no dead-letter queue yet
    other = Source(queue(tmp_path, "other"), max_receives=1, dead_letter="q.dlq")
    for _ in range(2):
        source.dead.bury(source.put(3))
    other.dead.bury(other.put(1))
    assert source.dead.count() == 2 and other.dead.count() == 1


def test_count_of_a_directory_that_is_not_a_queue_is_zero(source, tmp_path):
    (tmp_path / "q.dlq").mkdir()
    assert source.dead.count() == 0


# -- sources and redrive ---------------------------------------------------------------------------


@pytest.fixture
def graveyard(tmp_path) -> Source:
    """A dead-letter queue (its own DeadLetters: no dead-letter queue of its own)."""
    return Source(queue(tmp_path, "dlq", 4))


def bury_from(tmp_path, graveyard: Source, name: str, count: int = 2, shards: int = 1) -> Source:
    source = Source(queue(tmp_path, name, shards), max_receives=count, dead_letter=graveyard.store.layout.shown)
    source.dead.bury(source.put(count, body=name.encode()))
    return source


def test_sources_maps_origin_ids_to_paths(graveyard, tmp_path):
    a = bury_from(tmp_path, graveyard, "a")
    b = bury_from(tmp_path, graveyard, "b", shards=2)
    directory = graveyard.store.layout.file(_format.SOURCES_DIR)
    for junk, data in (("not-an-id", b"/x"), ("0badcafe", b"")):
        with open(os.path.join(directory, junk), "wb") as file:
            file.write(data)
    assert graveyard.dead.sources() == {a.store.id: a.store.layout.shown, b.store.id: b.store.layout.shown}


def test_register_source_never_rewrites_an_entry(graveyard):
    register_source(graveyard.store.layout, "0badcafe", "/first", None)
    register_source(graveyard.store.layout, "0badcafe", "/second", None)
    assert graveyard.dead.sources() == {"0badcafe": "/first"}


def test_no_sources_without_the_directory(graveyard):
    assert graveyard.dead.sources() == {}


def test_redrive_sends_each_message_home_as_new(graveyard, tmp_path):
    a = bury_from(tmp_path, graveyard, "a", count=3)
    b = bury_from(tmp_path, graveyard, "b", shards=2)
    assert graveyard.dead.redrive(None, None, NOW_US, 0) == 2
    assert names(graveyard.store) == []
    for home in (a, b):
        (back,) = names(home.store)
        assert (back.state, back.receive_count, back.origin) == (State.READY, 0, "")
        assert read(home.store, back) == os.path.basename(home.store.layout.shown).encode()


def test_redrive_leaves_messages_with_no_home(graveyard, tmp_path):
    gone = bury_from(tmp_path, graveyard, "gone")
    shutil.rmtree(gone.store.layout.shown)
    stranger = graveyard.put(1)  # not a dead letter at all: no origin
    assert graveyard.dead.redrive(None, None, NOW_US, 0) == 0
    assert len(names(graveyard.store)) == 2 and stranger in names(graveyard.store)


def test_redrive_to_a_given_queue(graveyard, tmp_path):
    bury_from(tmp_path, graveyard, "a")
    bury_from(tmp_path, graveyard, "b")
    graveyard.put(1)
    target = queue(tmp_path, "target", 2)
    assert graveyard.dead.redrive(target.layout.path, None, NOW_US, 0) == 3
    assert [(name.receive_count, name.origin) for name in names(target)] == [(0, "")] * 3


def test_redrive_to_a_missing_queue_is_not_found(graveyard, tmp_path):
    with pytest.raises(QueueNotFound):
        graveyard.dead.redrive(str(tmp_path / "nowhere"), None, NOW_US, 0)


def test_redrive_moves_at_most_max_messages_in_order(graveyard, tmp_path):
    target = queue(tmp_path, "target")
    first, second, third = (graveyard.put(1) for _ in range(3))
    assert graveyard.dead.redrive(target.layout.path, 2, NOW_US, 0) == 2
    assert [name.key for name in names(target)] == [first.key, second.key]
    assert [name.key for name in names(graveyard.store)] == [third.key]
    assert graveyard.dead.redrive(target.layout.path, 0, NOW_US, 0) == 0


@pytest.mark.parametrize("bad", [-1, True, 1.5, "2"])
def test_redrive_refuses_a_bad_max_messages(graveyard, bad):
    with pytest.raises(InvalidArgument, match="max_messages"):
        graveyard.dead.redrive(None, bad, NOW_US, 0)


def test_redrive_skips_what_is_in_flight_or_being_written(graveyard, tmp_path):
    target = queue(tmp_path, "target")
    in_flight = graveyard.put(1, until_us=NOW_US + SECOND)
    expired = graveyard.put(1, until_us=NOW_US - SECOND)
    skewed = graveyard.put(1, until_us=NOW_US - SECOND // 2)  # expired, but within the clock skew
    writing = _format.writing_name(_format.new_key())
    with open(graveyard.store.layout.message_file(writing), "wb"):
        pass
    assert graveyard.dead.redrive(target.layout.path, None, NOW_US, SECOND) == 1
    assert [name.key for name in names(target)] == [expired.key]
    left = {name.key for name in names(graveyard.store)}
    assert left == {in_flight.key, skewed.key, writing[: _format.KEY_LENGTH]}
