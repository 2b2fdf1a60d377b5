"""De-duplication ids."""

from __future__ import annotations

import multiprocessing
import os
import time

import pytest

import vsqs
from tests.conftest import message_path
from vsqs._core import dedup as _dedup


def test_same_dedup_id_stores_once(queue):
    first = queue.publish(b"a", dedup_id="order-1")
    again = queue.publish(b"a again", dedup_id="order-1")
    other = queue.publish(b"b", dedup_id="order-2")
    assert again == first != other
    assert sorted(m.body for m in queue.receive_batch(10)) == [b"a", b"b"]


def test_content_dedup(queue):
    first = queue.publish(b"same", dedup="content")
    assert queue.publish(b"same", dedup="content") == first
    assert queue.publish(b"different", dedup="content") != first
    ids = queue.publish_batch([b"same", b"new", b"new"], dedup="content")
    assert ids[0] == first and ids[1] == ids[2]
    assert queue.stats().ready == 3


def test_dedup_is_per_group(queue):
    a = queue.publish(b"x", group="a", dedup_id="1")
    b = queue.publish(b"x", group="b", dedup_id="1")
    assert a != b and queue.publish(b"x", group="a", dedup_id="1") == a


def test_dedup_id_is_free_again_after_delete_without_window(queue):
    first = queue.publish(b"a", dedup_id="x")
    queue.receive().delete()
    assert queue.publish(b"a", dedup_id="x") != first
    assert queue.stats().ready == 1


def test_in_flight_message_still_holds_its_id(queue):
    first = queue.publish(b"a", dedup_id="x")
    queue.receive()
    assert queue.publish(b"a", dedup_id="x") == first
    assert queue.stats().total == 1


def test_window_keeps_the_id_after_delete(queue):
    queue.configure(dedup_window=0.4)
    first = queue.publish(b"a", dedup_id="x")
    queue.receive().delete()
    assert queue.publish(b"a", dedup_id="x") == first  # within the window: nothing stored
    assert queue.stats().total == 0
    time.sleep(0.45)
    assert queue.publish(b"a", dedup_id="x") != first
    assert queue.stats().ready == 1


def test_crashed_publisher_does_not_reserve_forever(queue):
    digest = _dedup.dedup_hash("x", None)
    os.makedirs(os.path.join(queue.path, ".dedup"))
    with open(os.path.join(queue.path, ".dedup", f"{digest}.1"), "w") as f:
        f.write("9-1795305501723584-892190c0ba724662\n")  # reserved; its publisher died
    message_id = queue.publish(b"a", dedup_id="x")
    assert message_id != "9-1795305501723584-892190c0ba724662"
    assert queue.receive().body == b"a"


def test_publisher_at_work_is_waited_for(queue, monkeypatch):
    monkeypatch.setattr(_dedup, "WRITE_GRACE", 0.3)
    digest = _dedup.dedup_hash("x", None)
    key = "9-1795305501723584-892190c0ba724662"
    os.makedirs(os.path.join(queue.path, ".dedup"))
    with open(os.path.join(queue.path, ".dedup", f"{digest}.1"), "w") as f:
        f.write(key + "\n")
    with open(message_path(queue, key + ".new"), "w") as f:
        f.write("half")  # its publisher is (apparently) still writing
    started = time.monotonic()
    message_id = queue.publish(b"a", dedup_id="x")
    assert time.monotonic() - started >= 0.2  # waited for the .new to finish or go stale
    assert message_id != key


@pytest.mark.parametrize("dedup_id", ["", "x" * 129, 5, "a\x00b"])
def test_bad_dedup_ids(queue, dedup_id):
    with pytest.raises(vsqs.InvalidArgument, match="dedup_id"):
        queue.publish(b"a", dedup_id=dedup_id)


def test_dedup_arguments(queue):
    with pytest.raises(vsqs.InvalidArgument, match="dedup must be"):
        queue.publish(b"a", dedup="body")
    with pytest.raises(vsqs.InvalidArgument, match="not both"):
        queue.publish(b"a", dedup="content", dedup_id="x")


def test_gc_sweeps_dead_reservations(queue):
    queue.publish(b"a", dedup_id="gone")
    queue.publish(b"b", dedup_id="kept")
    for m in queue.receive_batch(2):
        m.delete() if m.body == b"a" else m.release()
    directory = os.path.join(queue.path, ".dedup")
    old = time.time() - 3600
    for name in os.listdir(directory):
        os.utime(os.path.join(directory, name), (old, old))
    assert queue.collect_garbage() == 2  # the gone id's chain: pending, then published
    kept = _dedup.dedup_hash("kept", None)
    assert sorted(os.listdir(directory)) == [f"{kept}.1", f"{kept}.2"]


def _publish_same(path: str, barrier, out) -> None:
    q = vsqs.Queue(path)
    barrier.wait()
    out.put([q.publish(b"x", dedup_id=f"id-{i}") for i in range(30)])


def test_racing_publishers_store_each_id_once(tmp_path):
    q = vsqs.Queue(tmp_path / "q", create=True)
    ctx = multiprocessing.get_context("spawn")
    barrier, out = ctx.Barrier(4), ctx.Queue()
    procs = [ctx.Process(target=_publish_same, args=(q.path, barrier, out)) for _ in range(4)]
    for p in procs:
        p.start()
    results = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(60)
    for i in range(30):
        assert len({r[i] for r in results}) == 1  # all four were told the same id
    assert q.stats().ready == 30


def test_failed_batch_leaves_the_id_free(queue, monkeypatch):
    from vsqs._core import fs as _fs

    queue.configure(dedup_window=60)
    real_rename = _fs.rename

    def no_rename(src, dst):
        raise vsqs.StorageError(5, "I/O error", src)

    monkeypatch.setattr(_fs, "rename", no_rename)
    with pytest.raises(vsqs.StorageError):
        queue.publish(b"a", dedup_id="x")
    monkeypatch.setattr(_fs, "rename", real_rename)
    queue.collect_garbage(grace=0)  # the failed publisher's .new
    again = queue.publish(b"a", dedup_id="x")  # never published, so not held by the window
    assert [m.id for m in queue.receive_batch(5)] == [again]


def test_ambiguous_reservation_create_is_recognised_as_ours(queue, monkeypatch):
    from vsqs._core import fs as _fs

    real_create = _fs.create_exclusive
    calls = []

    def reports_eio_after_success(path, data, *, durable, mode=None):
        created = real_create(path, data, durable=durable, mode=mode)
        if "/.dedup/" in path and not calls:
            calls.append(path)
            return False  # as if EIO made it look lost (the file exists: it is ours)
        return created

    monkeypatch.setattr(_fs, "create_exclusive", reports_eio_after_success)
    message_id = queue.publish(b"a", dedup_id="x")
    assert calls and [m.id for m in queue.receive_batch(5)] == [message_id]


def test_gc_never_shortens_the_window(queue):
    queue.configure(dedup_window=3600)
    first = queue.publish(b"a", dedup_id="x")
    directory = os.path.join(queue.path, ".dedup")
    old = time.time() - 7200
    for name in os.listdir(directory):
        os.utime(os.path.join(directory, name), (old, old))  # published long ago...
    queue.receive().delete()  # ...and deleted just now
    queue.collect_garbage()
    assert queue.publish(b"a", dedup_id="x") == first  # still within the window
    assert queue.stats().total == 0


def test_purge_forgets_the_ids_of_the_messages_it_removes(queue):
    queue.configure(dedup_window=3600)
    first = queue.publish(b"a", dedup_id="x")
    queue.publish(b"b", dedup_id="y", group="g")
    queue.receive_batch(10)  # in flight too
    gone = queue.publish(b"c", dedup_id="z")
    queue.receive().delete()  # z's message left before the purge: its window holds
    assert queue.purge() == 2
    again = queue.publish(b"a again", dedup_id="x")
    assert again != first
    assert queue.publish(b"b again", dedup_id="y", group="g") not in (first, again)
    assert queue.publish(b"c again", dedup_id="z") == gone  # not removed by the purge: still held
    assert sorted(m.body for m in queue.receive_batch(10)) == [b"a again", b"b again"]


def test_purge_of_ids_forgets_only_theirs(queue):
    queue.configure(dedup_window=3600)
    purged = queue.publish(b"a", dedup_id="x")
    kept = queue.publish(b"b", dedup_id="y")
    assert queue.purge(ids=[purged]) == 1
    assert queue.publish(b"b again", dedup_id="y") == kept  # its message is still here
    assert queue.publish(b"a again", dedup_id="x") != purged
    assert sorted(m.body for m in queue.receive_batch(10)) == [b"a again", b"b"]


def test_purge_leaves_an_id_a_publisher_took_over_meanwhile(queue):
    queue.configure(dedup_window=3600)
    purged = queue.publish(b"a", dedup_id="x")
    digest = _dedup.dedup_hash("x", None)
    directory = os.path.join(queue.path, ".dedup")
    newest = max(int(name.rpartition(".")[2]) for name in os.listdir(directory))
    taken = "9-1795305501723584-892190c0ba724662"  # a publisher moved on: the chain names its key
    with open(os.path.join(directory, f"{digest}.{newest + 1}"), "w") as f:
        f.write(f"pending {taken}\n")
    assert _dedup.Reservations(queue.path).forget({purged}) == 0
    assert sorted(os.listdir(directory))[-1] == f"{digest}.{newest + 1}"
    with open(os.path.join(directory, f"{digest}.{newest + 1}")) as f:
        assert f.read() == f"pending {taken}\n"


def test_an_id_forgotten_by_a_purge_is_swept_by_gc(queue):
    queue.configure(dedup_window=3600)
    queue.publish(b"a", dedup_id="x")
    queue.purge()
    directory = os.path.join(queue.path, ".dedup")
    old = time.time() - 7200
    for name in os.listdir(directory):
        os.utime(os.path.join(directory, name), (old, old))
    queue.collect_garbage()
    assert os.listdir(directory) == []


def test_purging_one_message_does_not_stat_every_dedup_chain(queue, monkeypatch):
    """Queue.purge(ids=[one]) (the console's delete of a message, kombu's purge) frees the ids
    of what it removed with one listing of .dedup/ and one read a chain: no galloping stats
    for each chain's newest generation (the listing names it)."""
    queue.configure(dedup_window=3600)
    chains = 200
    ids = queue.publish_batch([vsqs.Outgoing(b"x", dedup_id=f"d{i}") for i in range(chains)])
    calls = {"n": 0}
    for name in ("exists", "read_control", "mtime"):
        real = getattr(_dedup._fs, name)

        def counted(*args, _real=real, **kwargs):
            calls["n"] += 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(_dedup._fs, name, counted)
    forget = _dedup.Reservations.forget
    seen = {}

    def measured(self, keys):
        before = calls["n"]
        freed = forget(self, keys)
        seen["calls"], seen["freed"] = calls["n"] - before, freed
        return freed

    monkeypatch.setattr(_dedup.Reservations, "forget", measured)
    assert queue.purge(ids=[ids[7]]) == 1
    assert seen["freed"] == 1
    assert seen["calls"] <= chains + 10, f"{seen['calls']} stats and reads for {chains} chains"
