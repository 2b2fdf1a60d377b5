"""``maintenance``: inspection (messages, stats, state_of) and upkeep (purge,
requeue_expired, collect_garbage) of one queue; ``Maintenance``
constructed directly on a real queue directory, with fakes for the
collaborators it only delegates to (dead letters, stages, group leases,
reservations) so that what it decides itself is what is checked."""

from __future__ import annotations

import os
import threading
import time

import pytest

from vsqs._core import envelope as _envelope
from vsqs._core import format as _format
from vsqs._core import fs as _fs
from vsqs._core import settings as _settings
from vsqs._core.errors import InvalidArgument
from vsqs._core.layout import Layout
from vsqs._core.maintenance import Maintenance
from vsqs._core.metadata import open_store

SECOND = 1_000_000


class FakeDeadLetters:
    def __init__(self) -> None:
        self.buried: list[_format.Name] = []
        self.dead = 0

    def count(self) -> int:
        return self.dead

    def bury(self, name: _format.Name) -> int:
        self.buried.append(name)
        return 1


class FakeStages:
    def __init__(self) -> None:
        self.aborted: list[str] = []

    def abort(self, stage: str) -> int:
        self.aborted.append(stage)
        return 2

    def count(self) -> int:
        return 0


class FakeGroups:
    def sweep(self) -> int:
        return 3


class FakeReservations:
    def __init__(self) -> None:
        self.asked: list[tuple[float, set[str]]] = []
        self.forgotten: list[set[str]] = []

    def sweep(self, window: float, present: set[str]) -> int:
        self.asked.append((window, set(present)))
        return 5

    def forget(self, keys: set[str]) -> int:
        self.forgotten.append(set(keys))
        return len(keys)


class FakeSettings:
    """The settings store a part is given: what it reads of it (its owner's settings and mode)."""

    def __init__(self, owner) -> None:
        self._owner = owner

    def current(self) -> dict:
        return self._owner.settings

    @property
    def mode(self) -> int | None:
        return self._owner.mode


class Queue:
    def __init__(self, layout: Layout, skew_us: int = 0) -> None:
        self.layout = layout
        self.settings = dict(_settings.DEFAULTS)
        self.mode: int | None = None
        self.dead_letters = FakeDeadLetters()
        self.stages = FakeStages()
        self.reservations = FakeReservations()
        self.maintenance = Maintenance(
            layout, skew_us, FakeSettings(self), self.dead_letters,  # type: ignore[arg-type]
            self.stages, FakeGroups(), self.reservations, threading.Lock(),  # type: ignore[arg-type]
        )

    def put(self, name: str, content: bytes = b"", seconds_ago: float = 0.0) -> str:
        path = self.layout.message_file(name)
        with open(path, "wb") as file:
            file.write(content)
        if seconds_ago:
            then = time.time() - seconds_ago
            os.utime(path, (then, then))
        return name

    def names(self) -> list[str]:
        return sorted(str(name) for name in self.layout.names())


@pytest.fixture(params=[1, 4], ids=["flat", "shards4"])
def queue(request, tmp_path) -> Queue:
    return Queue(open_store(str(tmp_path / "q"), create=True, shards=request.param).layout)


def key(sent_us: int | None = None, priority: int = 0, n: int = 0) -> str:
    sent = _format.now_us() if sent_us is None else sent_us
    return f"{_format.MAX_PRIORITY - priority}-{sent:016d}-{n:016x}"


def later(seconds: float) -> int:
    return _format.now_us() + int(seconds * SECOND)


# -- state_of --------------------------------------------------------------------------------


def test_state_of(tmp_path):
    queue = Queue(open_store(str(tmp_path / "q"), create=True).layout, skew_us=SECOND)
    now = 1_700_000_000_000_000
    stem = key(now)

    def state(name: str) -> str:
        parsed = _format.parse_name(name)
        assert parsed is not None
        return queue.maintenance.state_of(parsed, now)

    assert state(stem) == "ready" and state(_format.ready_name(stem, 4)) == "ready"
    assert state(_format.hidden_name(stem, now + 1, 0)) == "delayed"
    assert state(_format.hidden_name(stem, now + 1, 2)) == "in_flight"
    assert state(_format.hidden_name(stem, now - SECOND + 1, 2)) == "in_flight"  # within the clock skew
    assert state(_format.hidden_name(stem, now - SECOND, 2)) == "ready"


# -- messages and stats ----------------------------------------------------------------------------


def test_messages_in_delivery_order_with_their_facts(queue):
    low = queue.put(key(n=1), b"low")
    high = queue.put(key(priority=7, n=2), b"high")
    until = later(60)
    flight = queue.put(_format.hidden_name(key(n=3), until, 2), b"flight")
    queue.put(_format.writing_name(key(n=4)), b"half")
    infos = list(queue.maintenance.messages(bodies=False, ids=None))
    assert [info.id for info in infos] == [high, low, flight[: _format.KEY_LENGTH]]
    assert [info.state for info in infos] == ["ready", "ready", "in_flight"]
    assert [info.priority for info in infos] == [7, 0, 0]
    assert infos[2].receive_count == 2 and infos[2].visible_at == until / 1e6
    assert infos[0].sent_at == infos[0].visible_at == _format.sent_us_of(high) / 1e6
    assert all(info.body is None for info in infos)


def test_messages_with_bodies_read_the_envelope(queue):
    stem = _format.make_stem(key(), group_hash=_format.group_hash("g"), envelope=True)
    queue.put(stem, _envelope.encode_envelope({"group": "g", "attributes": {"k": "v"}}, b"payload"))
    queue.put(key(n=9), b"bare")
    by_body = {info.body: info for info in queue.maintenance.messages(bodies=True, ids=None)}
    assert by_body[b"payload"].attributes == {"k": "v"} and by_body[b"payload"].group == "g"
    assert by_body[b"bare"].attributes == {} and by_body[b"bare"].group is None


def test_messages_of_some_ids(queue):
    wanted = [queue.put(key(n=n)) for n in range(3)]
    got = [info.id for info in queue.maintenance.messages(bodies=False, ids=iter(wanted[1:] + ["nope"]))]
    assert got == wanted[1:]


def test_a_message_that_moves_while_it_is_read_is_looked_up_again(queue, monkeypatch):
    name = queue.put(key(n=1), b"moving")
    queue.put(key(n=2), b"still")
    real = _fs.read
    moved = _format.hidden_name(name, later(30), 1)

    def read(path: str):
        if path == queue.layout.message_file(name):
            os.rename(path, queue.layout.message_file(moved))  # received by someone else just now
        return real(path)

    monkeypatch.setattr(_fs, "read", read)
    infos = list(queue.maintenance.messages(bodies=True, ids=None))
    assert [(info.body, info.state) for info in infos] == [(b"still", "ready"), (b"moving", "in_flight")]


def test_stats_count_by_state(queue, monkeypatch):
    now = 1_700_000_000_000_000
    monkeypatch.setattr(_format, "now_us", lambda: now)
    queue.put(key(now - 5 * SECOND, n=1))
    queue.put(key(now - 2 * SECOND, n=2))
    queue.put(_format.hidden_name(key(now - 9 * SECOND, n=3), now + SECOND, 1))  # in flight: not "oldest"
    queue.put(_format.hidden_name(key(now, n=4), now + SECOND, 0))
    queue.put(_format.hidden_name(key(now - 7 * SECOND, n=5), now - 1, 3))  # expired: ready
    queue.put(_format.writing_name(key(n=6)))
    queue.dead_letters.dead = 4
    stats = queue.maintenance.stats(groups=False)
    assert (stats.ready, stats.in_flight, stats.delayed, stats.writing) == (3, 1, 1, 1)
    assert stats.oldest_ready_age == 7.0 and stats.dead_lettered == 4 and stats.groups is None


def test_stats_of_an_empty_queue(queue):
    stats = queue.maintenance.stats(groups=True)
    assert (stats.total, stats.oldest_ready_age, stats.groups) == (0, 0.0, {})


def test_stats_per_group_by_the_groups_name(queue):
    for n, group in enumerate(["a", "a", "b"]):
        stem = _format.make_stem(key(n=n), group_hash=_format.group_hash(group), envelope=True)
        name = stem if n else _format.hidden_name(stem, later(60), 1)
        queue.put(name, _envelope.encode_envelope({"group": group}, b""))
    broken = _format.make_stem(key(n=9), group_hash=_format.group_hash("c"), envelope=True)
    queue.put(broken, b"no header line")
    queue.put(key(n=10))
    stats = queue.maintenance.stats(groups=True)
    assert stats.groups == {
        "a": {"ready": 1, "in_flight": 1, "delayed": 0},
        "b": {"ready": 1, "in_flight": 0, "delayed": 0},
        _format.group_hash("c"): {"ready": 1, "in_flight": 0, "delayed": 0},  # unreadable: its hash
    }


# -- purge and requeue_expired --------------------------------------------------------------------


def test_purge_removes_every_message_but_new_files(queue):
    keys = [key(n=n) for n in (1, 2, 3)]
    queue.put(keys[0])
    queue.put(_format.hidden_name(keys[1], later(60), 1))
    queue.put(_format.hidden_name(keys[2], later(60), 0))
    writing = queue.put(_format.writing_name(key(n=4)))
    assert queue.maintenance.purge() == 3
    assert queue.names() == [writing]
    assert queue.reservations.forgotten == [set(keys)]  # the ids they held are freed


def test_requeue_expired_makes_expired_messages_ready(queue):
    ready = queue.put(key(n=1))
    stem = key(n=2)
    queue.put(_format.hidden_name(stem, later(-1), 2))
    in_flight = queue.put(_format.hidden_name(key(n=3), later(60), 1))
    delayed = queue.put(_format.hidden_name(key(n=4), later(60), 0))
    assert queue.maintenance.requeue_expired() == 1
    assert queue.names() == sorted([ready, _format.ready_name(stem, 2), in_flight, delayed])
    assert queue.dead_letters.buried == []


def test_requeue_expired_buries_what_used_up_its_receives(queue):
    queue.settings["max_receives"] = 3
    spent = queue.put(_format.hidden_name(key(n=1), later(-1), 3))
    spent_ready = queue.put(_format.ready_name(key(n=2), 4))
    queue.put(_format.hidden_name(key(n=3), later(-1), 2))
    queue.put(_format.hidden_name(key(n=4), later(60), 3))  # still in flight: its holder may delete it
    assert queue.maintenance.requeue_expired() == 3
    assert sorted(str(name) for name in queue.dead_letters.buried) == sorted([spent, spent_ready])


# -- collect_garbage ---------------------------------------------------------------------------------


def test_gc_removes_new_files_older_than_the_grace(queue):
    old = queue.put(_format.writing_name(key(n=1)), seconds_ago=100)
    young = queue.put(_format.writing_name(key(n=2)), seconds_ago=10)
    message = queue.put(key(n=3), seconds_ago=1000)
    assert queue.maintenance.collect_garbage(grace=50) == 1 + 3 + 5  # + group leases + reservations
    assert queue.names() == sorted([young, message])
    assert old not in queue.names()


def test_gc_with_an_infinite_grace_keeps_every_new_file(queue):
    queue.put(_format.writing_name(key(n=1)), seconds_ago=10**6)
    assert queue.maintenance.collect_garbage(grace=float("inf")) == 8
    assert len(queue.names()) == 1


@pytest.mark.parametrize("argument", ["grace", "stage_grace"])
@pytest.mark.parametrize("bad", [-1, float("nan"), "60"])
def test_gc_refuses_a_bad_grace(queue, argument, bad):
    with pytest.raises(InvalidArgument, match=argument):
        queue.maintenance.collect_garbage(**{argument: bad})


def test_gc_aborts_stages_untouched_for_the_stage_grace(queue, tmp_path):
    for stage, age in (("old", 100), ("young", 10)):
        directory = queue.layout.file(_format.stage_dir_name(stage))
        os.mkdir(directory)
        then = time.time() - age
        os.utime(directory, (then, then))
    os.mkdir(tmp_path / "elsewhere")
    os.symlink(tmp_path / "elsewhere", queue.layout.file(_format.stage_dir_name("link")))
    os.utime(queue.layout.file(_format.stage_dir_name("link")), (0, 0), follow_symlinks=False)
    assert queue.maintenance.collect_garbage(stage_grace=50) == 2 + 3 + 5
    assert queue.stages.aborted == ["old"]


def test_gc_removes_messages_past_the_retention(queue):
    now = _format.now_us()
    queue.put(_format.hidden_name(key(now - 100 * SECOND, n=1), later(60), 1))  # in flight or not
    queue.put(key(now - 100 * SECOND, n=2))
    recent = queue.put(key(now - 10 * SECOND, n=3))
    assert queue.maintenance.collect_garbage() == 8  # no retention: nothing
    queue.settings["retention"] = 50.0
    assert queue.maintenance.collect_garbage() == 2 + 8
    assert queue.names() == [recent]


def test_gc_tells_the_reservations_which_messages_are_present(queue):
    queue.settings.update(retention=50.0, dedup_window=30.0)
    now = _format.now_us()
    kept = queue.put(key(now, n=1))
    writing = queue.put(_format.writing_name(key(now, n=2)))
    queue.put(key(now - 100 * SECOND, n=3))  # past the retention: not present any more
    queue.maintenance.collect_garbage()
    assert queue.reservations.asked == [(30.0, {kept, writing[: _format.KEY_LENGTH]})]


def test_gc_moves_strays_home_first(tmp_path):
    queue = Queue(open_store(str(tmp_path / "q"), create=True, shards=4).layout)
    stray = key(n=1)
    with open(queue.layout.file(stray), "wb"):
        pass
    queue.maintenance.collect_garbage()
    assert queue.names() == [stray] and os.path.exists(queue.layout.message_file(stray))
    assert queue.reservations.asked[0][1] == {stray}
