"""``stages``: messages written into a private directory of the queue, then
published together (commit) or dropped (abort); ``Stages`` constructed
directly on a real queue with real reservations and fake callables for the
queue's checks, settings and file mode."""

from __future__ import annotations

import os

import pytest

from vsqs._core import envelope as _envelope
from vsqs._core import format as _format
from vsqs._core import fs as _fs
from vsqs._core import settings as _settings
from vsqs._core.dedup import Reservations
from vsqs._core.errors import InvalidArgument, QueueFull, QueueNotFound, QueueSuspended
from vsqs._core.format import State
from vsqs._core.layout import Layout
from vsqs._core.message import Outgoing
from vsqs._core.metadata import open_store
from vsqs._core.stages import Stages


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
    """What a queue gives its Stages (settings, capacity), with what they were asked."""

    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self.reservations = Reservations(layout.path)
        self.settings = dict(_settings.DEFAULTS)
        self.mode: int | None = None
        self.capacity_asked: list[list[bytes]] = []
        self.refuse: Exception | None = None
        self.stages = Stages(layout, FakeSettings(self), self, self.reservations)  # type: ignore[arg-type]

    def check(self, datas, settings, path) -> None:
        """The capacity check."""
        self.capacity_asked.append(list(datas))
        if self.refuse is not None:
            raise self.refuse


@pytest.fixture(params=[1, 4], ids=["flat", "shards4"])
def queue(request, tmp_path) -> Queue:
    return Queue(open_store(str(tmp_path / "q"), create=True, shards=request.param).layout)


def stage_dir(queue: Queue, stage: str) -> str:
    return queue.layout.file(_format.stage_dir_name(stage))


def live(queue: Queue) -> list[_format.Name]:
    return sorted(queue.layout.names(), key=str)


def bodies(queue: Queue) -> list[bytes]:
    found = []
    for name in live(queue):
        path = queue.layout.message_file(str(name))
        found.append(_envelope.decode_content(name, _fs.read(path) or b"", path)[0])
    return sorted(found)


# -- publish into a stage -----------------------------------------------------------------


def test_publish_writes_into_the_stage_only(queue):
    ids = queue.stages.publish([b"a", "b", Outgoing(b"c", priority=4)], "job-1")
    staged = sorted(os.listdir(stage_dir(queue, "job-1")))
    assert sorted(name[: _format.KEY_LENGTH] for name in staged) == sorted(ids)
    assert all(_format.parse_name(name).state is State.READY for name in staged)
    assert live(queue) == []  # invisible to receivers
    assert queue.capacity_asked == [[b"a", b"b", b"c"]]
    assert queue.stages.names() == ["job-1"]


def test_a_delayed_staged_message_is_hidden_already(queue):
    (key,) = queue.stages.publish([Outgoing(b"x", delay=60)], "s")
    (entry,) = os.listdir(stage_dir(queue, "s"))
    name = _format.parse_name(entry)
    assert name.key == key and name.state is State.HIDDEN and name.receive_count == 0


def test_publish_refused_by_the_checks_writes_nothing(queue):
    queue.settings = {**queue.settings, "suspended": ["publish"]}
    with pytest.raises(QueueSuspended, match="publish is suspended"):
        queue.stages.publish([b"x"], "s")
    assert queue.capacity_asked == [] and queue.stages.names() == []


def test_publish_refused_by_capacity_writes_nothing(queue):
    queue.refuse = QueueFull("full")
    with pytest.raises(QueueFull):
        queue.stages.publish([b"x"], "s")
    assert not os.path.exists(stage_dir(queue, "s"))


def test_a_bad_message_refuses_the_whole_call(queue):
    with pytest.raises(InvalidArgument):
        queue.stages.publish([b"ok", Outgoing(b"bad", priority=99)], "s")
    assert not os.path.exists(stage_dir(queue, "s"))


def test_a_stage_gets_the_queues_file_mode(queue):
    queue.mode = 0o640
    queue.stages.publish([b"x"], "s")
    (entry,) = os.listdir(stage_dir(queue, "s"))
    assert os.stat(os.path.join(stage_dir(queue, "s"), entry)).st_mode & 0o777 == 0o640
    assert os.stat(stage_dir(queue, "s")).st_mode & 0o777 == 0o750


# -- commit ------------------------------------------------------------------------------------


def test_commit_publishes_every_message_where_it_lives_and_removes_the_stage(queue):
    ids = queue.stages.publish([b"a", b"b", Outgoing(b"c", group="g", attributes={"k": "v"})], "s")
    assert queue.stages.commit("s") == 3
    assert sorted(name.key for name in live(queue)) == sorted(ids)  # layout.names: each in its home shard
    for name in live(queue):
        assert os.path.exists(queue.layout.message_file(str(name)))
    assert not os.path.exists(stage_dir(queue, "s")) and queue.stages.names() == []


def test_commit_fsyncs_where_the_messages_went(queue, monkeypatch):
    queue.stages.publish([b"a", b"b", b"c"], "s")
    synced = []
    monkeypatch.setattr(queue.layout, "fsync", lambda names: synced.append(sorted(names)))
    queue.stages.commit("s")
    assert synced == [sorted(str(name) for name in live(queue))]


def test_commit_or_abort_of_an_unknown_stage_is_nothing(queue):
    assert queue.stages.commit("never") == 0
    assert queue.stages.abort("never") == 0


def test_commit_is_resumable(queue):
    queue.stages.publish([b"a", b"b"], "s")
    first = min(os.listdir(stage_dir(queue, "s")))
    os.rename(os.path.join(stage_dir(queue, "s"), first), queue.layout.message_file(first))  # moved before a crash
    assert queue.stages.commit("s") == 1
    assert bodies(queue) == [b"a", b"b"]


def test_commit_leaves_out_new_files_of_a_writer_that_died(queue):
    queue.stages.publish([b"a"], "s")
    with open(os.path.join(stage_dir(queue, "s"), _format.writing_name(_format.new_key())), "wb") as file:
        file.write(b"half")
    assert queue.stages.commit("s") == 1
    assert bodies(queue) == [b"a"] and not os.path.exists(stage_dir(queue, "s"))


def test_commit_publishes_a_dedup_id_once(queue, monkeypatch):
    queue.stages.publish([Outgoing(b"1", dedup_id="x"), Outgoing(b"2", dedup_id="x"), b"3"], "s")
    assert queue.stages.commit("s") == 2
    published = bodies(queue)
    assert published in ([b"1", b"3"], [b"2", b"3"])  # one of the two (the stage has no order)
    queue.stages.publish([Outgoing(b"4", dedup_id="x")], "t")  # held by a live message
    real, moves = _fs.rename, []
    monkeypatch.setattr(_fs, "rename", lambda src, dst: moves.append(dst) or real(src, dst))
    assert queue.stages.commit("t") == 0
    assert moves == []  # a known duplicate never enters the queue, not even for a moment
    assert bodies(queue) == published and queue.stages.names() == []


def test_a_commit_into_a_missing_shard_fails_and_keeps_the_stage(tmp_path):
    queue = Queue(open_store(str(tmp_path / "q"), create=True, shards=4).layout)
    queue.stages.publish([b"a"], "s")
    (entry,) = os.listdir(stage_dir(queue, "s"))
    os.rmdir(_fs.shown(os.path.dirname(queue.layout.message_file(entry))))
    with pytest.raises(QueueNotFound):
        queue.stages.commit("s")
    assert os.listdir(stage_dir(queue, "s")) == [entry]  # nothing lost


# -- abort and names -------------------------------------------------------------------------


def test_abort_drops_the_stage_and_counts_its_messages(queue):
    queue.stages.publish([b"a", b"b"], "s")
    with open(os.path.join(stage_dir(queue, "s"), "junk"), "wb"):
        pass
    assert queue.stages.abort("s") == 2
    assert not os.path.exists(stage_dir(queue, "s")) and live(queue) == []


def test_names_are_the_stage_directories_sorted(queue, tmp_path):
    for stage in ("b", "a", "c-2"):
        queue.stages.publish([b"x"], stage)
    os.mkdir(queue.layout.file(".stage.bad name"))  # not a stage name
    with open(queue.layout.file(_format.stage_dir_name("file")), "wb"):
        pass  # not a directory
    os.mkdir(tmp_path / "elsewhere")
    os.symlink(tmp_path / "elsewhere", queue.layout.file(_format.stage_dir_name("link")))
    assert queue.stages.names() == ["a", "b", "c-2"]
    assert queue.stages.commit("link") == 0 and queue.stages.abort("link") == 0  # never followed
    assert os.path.isdir(tmp_path / "elsewhere")
