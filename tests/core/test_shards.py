"""Sharded queues: messages in shards/00 .. shards/NN, one directory per shard.

Most queue behaviour is covered for sharded queues by the ``queue`` fixture
(every test taking it runs on a flat queue and on a 4-shard one); these are
the properties of sharding itself.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import pickle
import shutil
from collections import defaultdict
from unittest import mock

import pytest

import vsqs
from tests.conftest import message_dirs, message_files, message_path
from tests.racing import Race, run_race
from vsqs._core import format as _format
from vsqs._core import fs as _fs
from vsqs._core import listing as _listing
from vsqs._core.metadata import open_store


@pytest.fixture
def sharded(tmp_path) -> vsqs.Queue:
    return vsqs.Queue(tmp_path / "q", create=True, shards=8)


def _shard(message_id: str, shards: int) -> int:
    return _format.shard_of(message_id, shards)


def test_layout_and_metadata(sharded):
    assert sorted(os.listdir(os.path.join(sharded.path, "shards"))) == [f"{i:02x}" for i in range(8)]
    with open(os.path.join(sharded.path, _format.METADATA_NAME)) as f:
        meta = json.load(f)
    assert (meta["format"], meta["shards"]) == (3, 8)
    ids = sharded.publish_batch([b"%d" % i for i in range(64)])
    for message_id in ids:
        home = os.path.join(sharded.path, _format.shard_dir_name(_shard(message_id, 8)))
        assert message_id in os.listdir(home)
    assert not [n for n in os.listdir(sharded.path) if _format.parse_name(n)]  # none in the root
    assert len({_shard(i, 8) for i in ids}) > 1
    assert vsqs.Queue(sharded.path).shards == 8


def test_a_flat_queue_is_format_3_without_shard_directories(tmp_path):
    q = vsqs.Queue(tmp_path / "q", create=True)
    with open(os.path.join(q.path, _format.METADATA_NAME)) as f:
        assert (json.load(f)["format"], q.shards) == (3, 1)
    assert q.shards == 1 and not os.path.exists(os.path.join(q.path, "shards"))


@pytest.mark.parametrize("bad", [0, 3, 300, -4, True, "8"])
def test_bad_shard_count_creates_nothing(tmp_path, bad):
    with pytest.raises(vsqs.InvalidArgument, match="shards must be a power of two"):
        vsqs.Queue(tmp_path / "q", create=True, shards=bad)
    assert not (tmp_path / "q").exists()


def test_the_shard_count_is_fixed_at_creation(sharded, tmp_path):
    assert vsqs.Queue(sharded.path, create=True, shards=8).id == sharded.id
    with pytest.raises(vsqs.InvalidArgument, match="exists with 8 shard"):
        vsqs.Queue(sharded.path, create=True, shards=16)
    flat = vsqs.Queue(tmp_path / "flat", create=True)
    with pytest.raises(vsqs.InvalidArgument, match="exists with 1 shard"):
        vsqs.Queue(flat.path, shards=4)


def test_adopting_a_directory_makes_its_shards(tmp_path):
    (tmp_path / "q").mkdir()
    q = vsqs.Queue(tmp_path / "q", create=True, shards=4)
    assert len(message_dirs(q.path)) == 4
    q.publish(b"x")
    assert q.receive().body == b"x"


def test_order_holds_within_each_shard(sharded):
    ids = sharded.publish_batch([b"%d" % i for i in range(300)], durable=False)
    ids += [sharded.publish(b"late", priority=9)]
    got = []
    while batch := sharded.receive_batch(25):
        got += [m.id for m in batch]
    assert sorted(got) == sorted(ids)
    by_shard_sent, by_shard_got = defaultdict(list), defaultdict(list)
    for message_id in ids[:-1]:
        by_shard_sent[_shard(message_id, 8)].append(message_id)
    for message_id in got:
        if message_id != ids[-1]:
            by_shard_got[_shard(message_id, 8)].append(message_id)
    assert by_shard_got == by_shard_sent
    late_shard = [m for m in got if _shard(m, 8) == _shard(ids[-1], 8)]
    assert late_shard[0] == ids[-1]  # priority goes first within its shard


@pytest.mark.parametrize("start", range(8))
def test_a_receive_finds_the_one_message_from_any_starting_shard(sharded, start):
    message_id = sharded.publish(b"only")
    handle = _starting_at(sharded, start)
    m = handle.receive()
    assert m is not None and m.id == message_id
    assert handle.receive() is None


def _starting_at(queue, shard):
    """A new handle of ``queue`` whose first receive starts at ``shard``."""
    with mock.patch("vsqs._core.layout.random.randrange", return_value=shard):
        return vsqs.Queue(queue.path)


def test_consumers_start_at_different_shards(sharded):
    starts = {open_store(sharded.path).layout.cursor for _ in range(40)}
    assert len(starts) > 2


def test_shards_emptied_by_other_consumers_do_not_end_a_receive(sharded):
    ids = sharded.publish_batch([b"%d" % i for i in range(200)], durable=False)
    consumer = _starting_at(sharded, 0)
    lost = {os.path.join(sharded.path, _format.shard_dir_name(i)) for i in (0, 1, 2)}
    rename = _fs.rename

    def others_win_in_the_first_shards(src, dst):
        if _fs.shown(os.path.dirname(src)) in lost:
            return False  # another consumer renamed it first
        return rename(src, dst)

    with mock.patch.object(_fs, "rename", others_win_in_the_first_shards):
        m = consumer.receive()
    assert m is not None and _shard(m.id, 8) == 3
    assert m.id == min(i for i in ids if _shard(i, 8) == 3)


def test_groups_stay_in_order_in_one_shard(sharded):
    sharded.publish_batch([b"a%d" % i for i in range(20)], group="a")
    sharded.publish_batch([b"b%d" % i for i in range(20)], group="b")
    homes = {
        directory for directory in message_dirs(sharded.path)
        for name in os.listdir(directory) if _format.parse_name(name)
    }
    assert len(homes) <= 2
    order = defaultdict(list)
    while batch := sharded.receive_batch(10):
        for m in batch:
            order[m.group].append(m.body)
            m.delete()
    assert order == {g: [b"%s%d" % (g.encode(), i) for i in range(20)] for g in "ab"}


def test_durable_publish_fsyncs_the_shards_it_wrote(sharded):
    with mock.patch.object(_fs, "fsync_dir", wraps=_fs.fsync_dir) as fsync_dir:
        ids = sharded.publish_batch([b"%d" % i for i in range(40)])
    touched = {os.path.join(sharded.path, _format.shard_dir_name(_shard(i, 8))) for i in ids}
    assert {_fs.shown(call.args[0]) for call in fsync_dir.call_args_list} == touched
    assert fsync_dir.call_count == len(touched)  # once each
    with mock.patch.object(_fs, "fsync_dir", wraps=_fs.fsync_dir) as fsync_dir:
        message_id = sharded.publish(b"one")
    [call] = fsync_dir.call_args_list
    assert _fs.shown(call.args[0]) == os.path.join(sharded.path, _format.shard_dir_name(_shard(message_id, 8)))


def test_stage_commit_fsyncs_the_shards_it_wrote(sharded):
    ids = sharded.publish_staged([b"%d" % i for i in range(30)], stage="s")
    with mock.patch.object(_fs, "fsync_dir", wraps=_fs.fsync_dir) as fsync_dir:
        assert sharded.commit_stage("s") == 30
    touched = {os.path.join(sharded.path, _format.shard_dir_name(_shard(i, 8))) for i in ids}
    assert {_fs.shown(call.args[0]) for call in fsync_dir.call_args_list} == touched
    assert sorted(m.id for m in sharded.receive_batch(100)) == sorted(ids)


def test_an_unpickled_handle_finds_the_shards(sharded):
    copy = pickle.loads(pickle.dumps(sharded))
    message_id = copy.publish(b"x", durable=False)
    assert message_files(sharded.path) == {message_id: 1}
    assert not [n for n in os.listdir(sharded.path) if _format.parse_name(n)]
    other = pickle.loads(pickle.dumps(sharded))
    m = other.receive()
    assert m.id == message_id
    pickle.loads(pickle.dumps(sharded)).delete(m.receipt)
    assert sharded.stats().total == 0


def test_inspection_and_maintenance_see_every_shard(sharded):
    ids = sharded.publish_batch([b"%d" % i for i in range(50)])
    sharded.publish(b"later", delay=60)
    sharded.receive_batch(5, visibility_timeout=0)
    stats = sharded.stats()
    assert (stats.total, stats.delayed) == (51, 1)
    assert [i.id for i in sharded.messages() if i.state != "delayed"] == sorted(ids)
    assert sharded.requeue_expired() == 5
    assert sharded.purge() == 51
    assert message_files(sharded.path) == {}


def test_dead_letters_and_redrive_between_sharded_and_flat_queues(tmp_path):
    spool = vsqs.Spool(tmp_path)
    source = spool.create_queue("jobs", shards=4, max_receives=1, visibility_timeout=0)
    ids = source.publish_batch([b"%d" % i for i in range(20)], group=None)
    source.receive_batch(20)
    assert source.receive_batch(20) == []  # each one used its one receive: dead-lettered
    dlq = source.dead_letter_queue()
    assert dlq.shards == 1 and sorted(message_files(dlq.path)) == sorted(ids)
    assert source.stats().dead_lettered == 20
    assert dlq.redrive() == 20
    assert sorted(message_files(source.path)) == sorted(ids)
    sharded_dlq = spool.create_queue("other.dlq", shards=2)
    source.configure(dead_letter="other.dlq")
    source.receive_batch(20)
    source.receive_batch(20)
    assert sorted(message_files(sharded_dlq.path)) == sorted(ids)
    assert sharded_dlq.redrive() == 20
    assert sorted(m.id for m in source.receive_batch(20)) == sorted(ids)


def test_a_stray_message_file_is_moved_home_by_gc(sharded):
    ids = sharded.publish_batch([b"a", b"b", b"c"])
    homes = {i: os.path.join(sharded.path, _format.shard_dir_name(_shard(i, 8))) for i in ids}
    wrong = os.path.join(sharded.path, _format.shard_dir_name((_shard(ids[0], 8) + 1) % 8))
    shutil.move(os.path.join(homes[ids[0]], ids[0]), os.path.join(wrong, ids[0]))
    shutil.move(os.path.join(homes[ids[1]], ids[1]), os.path.join(sharded.path, ids[1]))
    got = vsqs.Queue(sharded.path).receive_batch(10)
    assert [m.id for m in got] == [ids[2]]  # strays are not delivered where they lie
    got[0].release()
    assert sharded.stats().total == 1  # strays are not counted until they are home
    sharded.collect_garbage()
    assert sorted(message_files(sharded.path)) == sorted(ids)
    assert sorted(m.body for m in vsqs.Queue(sharded.path).receive_batch(10)) == [b"a", b"b", b"c"]


def test_a_missing_shard_directory_is_a_clear_error_and_costs_nothing(sharded, caplog):
    ids = sharded.publish_batch([b"%d" % i for i in range(64)])
    gone = os.path.join(sharded.path, _format.shard_dir_name(3))
    lost = {i for i in ids if _shard(i, 8) == 3}
    shutil.rmtree(gone)
    published, refused = [], 0
    for i in range(1000):  # until both happened (ids are random: 1 in 8 goes to shard 3)
        try:
            published.append(sharded.publish(b"%d" % i))
        except vsqs.QueueNotFound as exc:
            assert "shards/03" in str(exc)
            refused += 1
        if published and refused:
            break
    assert published and refused
    got = []
    while batch := sharded.receive_batch(10):  # the other shards are still served
        got += [m.id for m in batch]
    assert sorted(got) == sorted(set(ids + published) - lost)
    assert "shards/03 is missing" in caplog.text
    sharded.collect_garbage()
    assert os.path.isdir(gone)
    assert sharded.publish(b"again")


def _create(path: str, shards: int, barrier, out) -> None:
    barrier.wait()
    out.put(vsqs.Queue(path, create=True, shards=shards).id)


def test_racing_creators_agree_on_one_sharded_queue(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    path = str(tmp_path / "q")
    barrier, out = ctx.Barrier(4), ctx.Queue()
    procs = [ctx.Process(target=_create, args=(path, 16, barrier, out)) for _ in range(4)]
    for p in procs:
        p.start()
    ids = {out.get(timeout=60) for _ in procs}
    for p in procs:
        p.join(60)
    assert len(ids) == 1 and vsqs.Queue(path).shards == 16
    assert len(message_dirs(path)) == 16
    assert [n for n in os.listdir(tmp_path) if "creating" in n] == []


def test_four_producers_four_consumers_on_a_sharded_queue(tmp_path):
    q = vsqs.Queue(tmp_path / "q", create=True, shards=16)
    race = Race(messages=8_000, lease=1.0, abandon=0.005)
    redelivered = run_race(race, [q.path] * 4, [q.path] * 4, tmp_path)
    assert redelivered > 0
    assert q.stats().total == 0 and message_files(q.path) == {}


def test_spool_and_cli_create_sharded_queues(tmp_path):
    from click.testing import CliRunner

    from vsqs._cli import main

    result = CliRunner().invoke(main, ["create", str(tmp_path / "c"), "--shards", "32"])
    assert result.exit_code == 0, result.output
    assert vsqs.Queue(tmp_path / "c").shards == 32
    result = CliRunner().invoke(main, ["create", str(tmp_path / "c"), "--shards", "8"])
    assert result.exit_code != 0 and "exists with 32 shard" in result.output
    result = CliRunner().invoke(main, ["create", str(tmp_path / "d"), "--shards", "6"])
    assert result.exit_code != 0 and "power of two" in result.output
    assert not (tmp_path / "d").exists()
    result = CliRunner().invoke(main, ["stats", str(tmp_path / "c"), "--json"])
    assert result.exit_code == 0 and json.loads(result.output)["shards"] == 32


def test_deleting_a_sharded_queue_counts_every_shard(tmp_path):
    spool = vsqs.Spool(tmp_path)
    q = spool.create_queue("q", shards=4)
    q.publish_batch([b"%d" % i for i in range(30)])
    assert spool.delete_queue("q") == 30
    assert os.listdir(tmp_path) == [".deleted"]  # the deletion's record only
    with pytest.raises(vsqs.QueueNotFound):
        q.publish(b"x")
    with pytest.raises(vsqs.QueueNotFound):
        q.receive()


def test_current_receipt_lists_only_the_message_shard(sharded):
    sharded.publish_batch([b"%d" % i for i in range(40)])
    m = sharded.receive()
    moved = sharded.change_visibility(m.receipt, 60)
    with mock.patch.object(_fs, "list_names", wraps=_fs.list_names) as listing:
        assert sharded.current_receipt(m.receipt) == moved
    [call] = listing.call_args_list
    assert _fs.shown(call.args[0]) == os.path.join(sharded.path, _format.shard_dir_name(_shard(m.id, 8)))
    sharded.delete(moved)
    with pytest.raises(vsqs.StaleReceipt):
        sharded.current_receipt(m.receipt)


def test_a_commit_into_a_missing_shard_fails_loudly_and_loses_nothing(sharded):
    ids: list[str] = []
    while not any(_shard(i, 8) == 2 for i in ids):  # (ids are random: 40 miss shard 2 once in 200 runs)
        ids += sharded.publish_staged([b"%d" % i for i in range(len(ids), len(ids) + 40)], stage="job")
    shutil.rmtree(os.path.join(sharded.path, _format.shard_dir_name(2)))
    with pytest.raises(vsqs.QueueNotFound, match="shards/02"):
        sharded.commit_stage("job")
    sharded.collect_garbage()  # remakes the shard; the stage is young: kept
    assert sharded.stages() == ["job"]
    sharded.commit_stage("job")  # resumed: the rest goes in
    got = []
    while batch := sharded.receive_batch(100):
        got += [m.id for m in batch]
    assert sorted(got) == sorted(ids)


def test_dead_letters_into_a_missing_shard_stay_home(tmp_path):
    spool = vsqs.Spool(tmp_path)
    dlq = spool.create_queue("jobs.dlq", shards=2)
    source = spool.create_queue("jobs", max_receives=1, visibility_timeout=0)
    ids = source.publish_batch([b"%d" % i for i in range(20)])
    source.receive_batch(20)
    shutil.rmtree(os.path.join(dlq.path, _format.shard_dir_name(1)))
    with pytest.raises(vsqs.QueueNotFound, match="shards/01"):
        while source.receive_batch(20):
            pass
    assert sorted(list(message_files(source.path)) + list(message_files(dlq.path))) == sorted(ids)  # none lost


def test_a_round_that_stopped_early_goes_on_to_the_other_shards(sharded):
    """A consumer whose listed shard was emptied by others lists the next
    shards before it answers "empty", even when listings are not cheap."""
    from vsqs._core import receiver as _receiver

    ids = sharded.publish_batch([b"%d" % i for i in range(64)], durable=False)
    consumer = _starting_at(sharded, _shard(ids[0], 8))
    with mock.patch.object(_listing, "CHEAP_LISTING", 0.0), \
            mock.patch.object(_listing, "EXHAUSTED_FACTOR", 1e9), \
            mock.patch.object(_receiver, "_SKIPS_PER_CALL", 0):  # as if listings were dear (NFS); no skipping
        first = consumer.receive()  # lists ids[0]'s shard only
        for message_id in ids:  # others take the rest of that shard
            if _shard(message_id, 8) == _shard(first.id, 8) and message_id != first.id:
                os.unlink(message_path(sharded, message_id))
        second = consumer.receive()
    assert second is not None and _shard(second.id, 8) != _shard(first.id, 8)


@pytest.mark.parametrize("junk", ["README", "stray"])
def test_foreign_or_stray_names_cost_one_round_per_receive(sharded, junk):
    name = "README"
    if junk == "stray":
        name = sharded.publish(b"x")
        os.rename(message_path(sharded, name), os.path.join(
            sharded.path, _format.shard_dir_name((_shard(name, 8) + 1) % 8), name))
    else:
        open(os.path.join(sharded.path, _format.shard_dir_name(5), name), "w").close()
    with mock.patch.object(_fs, "list_names", wraps=_fs.list_names) as listing:
        assert sharded.receive() is None
    assert listing.call_count == 8


def test_a_symlinked_shard_is_never_followed(sharded, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    shard = os.path.join(sharded.path, _format.shard_dir_name(4))
    os.rmdir(shard)
    os.symlink(outside, shard)
    with pytest.raises(vsqs.StorageError, match="not a directory of the queue"):
        vsqs.Queue(sharded.path)
    with pytest.raises(vsqs.StorageError, match="not a directory of the queue"):
        while True:
            sharded.receive()
    assert list(outside.iterdir()) == []


def test_forked_handles_start_at_different_shards(sharded):
    layout = open_store(sharded.path).layout  # (a handle's layout, made before the forks)
    out = multiprocessing.get_context("fork").Queue()

    def child():
        for _ in layout.receive_round():  # one whole round, back to where it started
            pass
        out.put(layout.cursor)

    starts = set()
    for _ in range(6):
        p = multiprocessing.get_context("fork").Process(target=child)
        p.start()
        starts.add(out.get(timeout=30))
        p.join(30)
    assert len(starts) > 1


def test_gc_on_a_deleted_sharded_queue_makes_nothing(tmp_path):
    spool = vsqs.Spool(tmp_path)
    q = spool.create_queue("jobs", shards=4)
    spool.delete_queue("jobs")
    with pytest.raises(vsqs.QueueNotFound):
        q.collect_garbage()
    assert os.listdir(tmp_path) == [".deleted"]  # the deletion's record only


def test_a_queue_with_broken_metadata_can_still_be_deleted(tmp_path):
    spool = vsqs.Spool(tmp_path)
    q = spool.create_queue("jobs", shards=4)
    q.publish_batch([b"1", b"2", b"3"])
    meta = os.path.join(q.path, _format.METADATA_NAME)
    os.chmod(meta, 0o644)
    with open(meta, "w") as f:
        f.write('{"format": 99}')
    assert spool.delete_queue("jobs") == 3
    assert os.listdir(tmp_path) == [".deleted"]  # the deletion's record only
