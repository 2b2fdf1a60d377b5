"""The syscall layer: lost races versus real errors, errno by errno.

Network filesystems answer a lost race with ENOENT, ESTALE, EIO, EACCES or
EPERM; the primitives must look before deciding. Errors are injected with
mock.patch.
"""

from __future__ import annotations

import errno
import os
from unittest import mock

import pytest

import vsqs
from vsqs._core import format as _format
from vsqs._core import fs as _fs
from vsqs._core.errors import DamagedEntry

real_rename, real_open, real_unlink = os.rename, os.open, os.unlink


def _fail(code, then=None):
    def call(*args, **kwargs):
        if then is not None:
            then(*args, **kwargs)
        raise OSError(code, os.strerror(code), args[0])

    return call


@pytest.mark.parametrize("code", [errno.ENOENT, errno.ESTALE, errno.EIO])
def test_rename_that_succeeded_but_reported_an_error_was_ours(tmp_path, code):
    src, dst = tmp_path / "a", tmp_path / "b"
    src.write_text("x")
    with mock.patch("os.rename", _fail(code, then=real_rename)):
        assert _fs.rename(str(src), str(dst)) is True
    assert dst.read_text() == "x"


@pytest.mark.parametrize("code", [errno.ENOENT, errno.ESTALE, errno.EIO, errno.EACCES, errno.EPERM])
def test_rename_of_a_vanished_source_is_a_lost_race(tmp_path, code):
    with mock.patch("os.rename", _fail(code)):
        assert _fs.rename(str(tmp_path / "gone"), str(tmp_path / "b")) is False


@pytest.mark.parametrize("code", [errno.EIO, errno.EACCES, errno.EROFS, errno.ENOSPC])
def test_rename_failing_with_source_still_there_is_an_error(tmp_path, code):
    src = tmp_path / "a"
    src.write_text("x")
    with mock.patch("os.rename", _fail(code)):
        with pytest.raises(vsqs.StorageError) as info:
            _fs.rename(str(src), str(tmp_path / "b"))
    assert info.value.errno == code and isinstance(info.value.__cause__, OSError)
    assert src.read_text() == "x"


@pytest.mark.parametrize("code", [errno.EEXIST, errno.EPERM, errno.EIO])
def test_lost_exclusive_create(tmp_path, code):
    # sshfs answers a lost O_EXCL race with EPERM, the HDFS NFS gateway with EIO
    path = tmp_path / "taken"
    path.write_text("theirs")
    with mock.patch("os.open", _fail(code)):
        assert _fs.create_exclusive(str(path), b"mine", durable=True) is False
    assert path.read_text() == "theirs"


def test_exclusive_create_eperm_without_a_file_is_an_error(tmp_path):
    with mock.patch("os.open", _fail(errno.EPERM)):
        with pytest.raises(vsqs.StorageError, match="cannot create"):
            _fs.create_exclusive(str(tmp_path / "x"), b"", durable=False)


def test_lost_exclusive_create_behind_a_stale_negative_cache(tmp_path):
    # sshfs: another host created the name (EPERM from the server) but our client's
    # negative cache still says it does not exist; the directory itself is writable
    real_open = os.open
    calls = []

    def first_fails(path, flags, mode=0o777, *, dir_fd=None):
        if not calls:
            calls.append(path)
            raise OSError(errno.EPERM, "Operation not permitted", path)
        return real_open(path, flags, mode, dir_fd=dir_fd)

    with mock.patch("os.open", first_fails):
        assert _fs.create_exclusive(str(tmp_path / "taken"), b"", durable=False) is False
    assert os.listdir(tmp_path) == []  # the probe was removed


def test_write_failure_removes_the_partial_file(tmp_path):
    with mock.patch("os.write", _fail(errno.ENOSPC)):
        with pytest.raises(vsqs.StorageError) as info:
            _fs.create_exclusive(str(tmp_path / "x.new"), b"data", durable=False)
    assert info.value.errno == errno.ENOSPC
    assert os.listdir(tmp_path) == []


def test_partial_writes_are_completed(tmp_path):
    real_write = os.write
    with mock.patch("os.write", lambda fd, data: real_write(fd, bytes(data[:3]))):
        assert _fs.create_exclusive(str(tmp_path / "x"), b"0123456789", durable=True)
    assert (tmp_path / "x").read_bytes() == b"0123456789"


def test_deferred_error_at_close_is_reported(tmp_path):
    # NFS reports write-back errors at close
    real_close = os.close
    with mock.patch("os.close", _fail(errno.EIO, then=real_close)):
        with pytest.raises(vsqs.StorageError):
            _fs.create_exclusive(str(tmp_path / "x"), b"data", durable=False)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("code", [errno.ENOENT, errno.ESTALE, errno.EACCES, errno.EIO])
def test_unlink_of_a_gone_file_is_a_lost_race(tmp_path, code):
    with mock.patch("os.unlink", _fail(code)):
        assert _fs.unlink(str(tmp_path / "gone")) is False


def test_unlink_that_cannot_remove_is_an_error(tmp_path):
    path = tmp_path / "x"
    path.write_text("x")
    with mock.patch("os.unlink", _fail(errno.EACCES)):
        with pytest.raises(vsqs.StorageError, match="cannot delete"):
            _fs.unlink(str(path))


def test_directory_fsync_unsupported_is_tolerated(tmp_path):
    with mock.patch("os.fsync", _fail(errno.EINVAL)):
        _fs.fsync_dir(str(tmp_path))
    with mock.patch("os.fsync", _fail(errno.EIO)):
        with pytest.raises(vsqs.StorageError):
            _fs.fsync_dir(str(tmp_path))


def test_listing_error_is_not_an_empty_queue(queue):
    # python-dirq swallowed this: a stale NFS handle looked like an empty queue
    queue.publish(b"x")
    # receive lists names only (listdir); stats tells files from the rest (scandir)
    with mock.patch("os.listdir", _fail(errno.ESTALE)), mock.patch("os.scandir", _fail(errno.ESTALE)):
        with pytest.raises(vsqs.StorageError):
            queue.receive()
        with pytest.raises(vsqs.StorageError):
            queue.stats()
    assert queue.receive().body == b"x"


def test_read_does_not_follow_symlinks(tmp_path):
    target = tmp_path / "secret"
    target.write_text("secret")
    os.symlink(target, tmp_path / "link")
    with pytest.raises(vsqs.StorageError):
        _fs.read(str(tmp_path / "link"))


def test_receive_race_lost_with_estale_moves_on(queue):
    queue.publish_batch([b"1", b"2"])
    calls = []

    def rename(src, dst, *, src_dir_fd=None, dst_dir_fd=None):
        if not calls:  # first claim: another host took it, NFS says ESTALE
            calls.append(f"/proc/self/fd/{src_dir_fd}/{src}")  # (the queue's directory is held open: see fs.Pin)
            real_rename(src, src + ".taken-elsewhere", src_dir_fd=src_dir_fd, dst_dir_fd=src_dir_fd)
            raise OSError(errno.ESTALE, "Stale file handle", src)
        return real_rename(src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)

    with mock.patch("os.rename", rename):
        got = queue.receive()
    with open(calls[0] + ".taken-elsewhere", "rb") as taken:  # (a sharded queue may try either first)
        assert got is not None and {got.body, taken.read()} == {b"1", b"2"}


def test_receive_with_ambiguous_success_is_not_lost(queue):
    # a retransmitted rename: it happened, but the client heard ENOENT
    queue.publish(b"x")
    with mock.patch("os.rename", _fail(errno.ENOENT, then=real_rename)):
        m = queue.receive()
    assert m is not None and m.body == b"x"
    m.delete()
    assert queue.stats().total == 0


# -- a full disk and a read-only spool ----------------------------------------------


def _disk_full_past(limit):
    """os.write that fails with ENOSPC for a write of more than ``limit`` bytes."""
    write = os.write

    def full(fd, data):
        if len(data) > limit:
            raise OSError(errno.ENOSPC, "No space left on device")
        return write(fd, data)

    return full


def test_full_disk_on_publish_costs_nothing(tmp_path):
    q = vsqs.Queue(tmp_path / "q", create=True)
    q.publish(b"before")
    with mock.patch("os.write", _disk_full_past(500)):
        with pytest.raises(vsqs.StorageError) as info:
            q.publish(b"x" * 1000)
        assert info.value.errno == errno.ENOSPC
        with pytest.raises(vsqs.StorageError):
            q.publish_batch([b"small", b"y" * 1000])
    assert [n for n in os.listdir(tmp_path / "q") if n.endswith(".new")] == []  # no debris
    assert [m.body for m in q.receive_batch(10)] == [b"before"]  # nothing lost


def test_read_only_queue_on_publish(tmp_path):
    q = vsqs.Queue(tmp_path / "q", create=True)
    q.publish(b"before")
    with mock.patch("os.open", _fail(errno.EROFS)):
        with pytest.raises(vsqs.StorageError, match="cannot create message file"):
            q.publish(b"x")
    assert q.receive().body == b"before"


def test_a_round_trip_names_each_message_by_the_grammar(tmp_path):
    q = vsqs.Queue(tmp_path / "q", create=True)
    ids = q.publish_batch([b"a", b"b"], delay=0)
    assert [m.id for m in q.receive_batch(5, visibility_timeout=60)] == ids
    assert sorted(n.count(".") for n in os.listdir(tmp_path / "q") if n != _format.METADATA_NAME) == [3, 3]


def test_enoent_on_rename_is_a_lost_race_even_if_a_stale_cache_still_shows_the_source(tmp_path):
    # sshfs: the server answered ENOENT, but the client's attribute cache still
    # stats the source as present
    src = tmp_path / "a"
    src.write_text("x")
    with mock.patch("os.rename", _fail(errno.ENOENT)):
        assert _fs.rename(str(src), str(tmp_path / "b")) is False
    with mock.patch("os.unlink", _fail(errno.ENOENT)):
        assert _fs.unlink(str(src)) is False


# -- a hostile spool: what read, create and mkdir never do ---------------


def test_read_of_a_fifo_never_blocks(tmp_path):
    from tests.core.test_hostile_spool import _open_writer, _returns

    fifo = str(tmp_path / "fifo")
    os.mkfifo(fifo)
    with pytest.raises(DamagedEntry, match="FIFO"):
        _returns(lambda: _fs.read(fifo), _open_writer(fifo))


@pytest.mark.parametrize("kind", ["directory", "symlink"])
def test_read_of_what_is_no_regular_file_is_damage(tmp_path, kind):
    path = tmp_path / "entry"
    if kind == "directory":
        path.mkdir()
    else:
        (tmp_path / "target").write_bytes(b"secret")
        os.symlink(tmp_path / "target", path)
    with pytest.raises(DamagedEntry):
        _fs.read(str(path))
    assert _fs.read_control(str(path)) == b""  # what does not parse, to a reader of vsqs's own files


def _counted_reads(monkeypatch) -> list[int]:
    real_read, got = os.read, []

    def counted(fd, n):
        data = real_read(fd, n)
        got.append(len(data))
        return data

    monkeypatch.setattr(os, "read", counted)
    return got


def test_read_refuses_a_file_over_its_limit_holding_no_more_than_its_limit(tmp_path, monkeypatch):
    path = tmp_path / "big"
    path.write_bytes(b"x" * 11)
    got = _counted_reads(monkeypatch)
    with pytest.raises(DamagedEntry) as info:
        _fs.read(str(path), limit=10)
    assert info.value.errno == errno.EFBIG and sum(got) <= 11
    assert _fs.read(str(path), limit=11) == b"x" * 11


def test_a_huge_file_is_refused_by_its_size_after_one_read(tmp_path, monkeypatch):
    path = tmp_path / "sparse"
    with open(path, "wb") as file:
        file.truncate(10 * 2**30)  # 10 GB, sparse
    got = _counted_reads(monkeypatch)
    with pytest.raises(DamagedEntry, match="over the"):
        _fs.read(str(path), limit=2**20 * 4)
    assert got == [2**20]  # one read's worth, then the size said enough


def test_read_holds_no_more_than_its_limit_of_a_file_that_grows(tmp_path, monkeypatch):
    # fstat said 5 bytes (the file grew since, or the filesystem lies): the reads stop at limit + 1
    path = tmp_path / "growing"
    path.write_bytes(b"x" * (2**20 + 1000))
    real_fstat = os.fstat
    monkeypatch.setattr(os, "fstat", lambda fd: os.stat_result((*real_fstat(fd)[:6], 5, *real_fstat(fd)[7:])))
    got = _counted_reads(monkeypatch)
    with pytest.raises(DamagedEntry, match="grew"):
        _fs.read(str(path), limit=2**20 + 50)
    assert sum(got) == 2**20 + 51


def test_read_and_exists_through_a_file_find_nothing(tmp_path):
    plain = tmp_path / "plain"
    plain.write_bytes(b"")
    assert _fs.read(str(plain / _format.METADATA_NAME)) is None
    assert _fs.exists(str(plain / _format.METADATA_NAME)) is False


def test_create_exclusive_never_asks_for_a_bit_beyond_its_mode(tmp_path):
    asked = []

    def watched_open(path, flags, mode=0o777, *, dir_fd=None):
        asked.append(mode)
        return real_open(path, flags, mode, dir_fd=dir_fd)

    old_umask = os.umask(0)
    try:
        with mock.patch("os.open", watched_open):
            assert _fs.create_exclusive(str(tmp_path / "f"), b"x", durable=False, mode=0o640)
    finally:
        os.umask(old_umask)
    assert asked and asked[0] & ~0o640 == 0
    assert os.stat(tmp_path / "f").st_mode & 0o7777 == 0o640


def test_make_dirs_never_asks_for_a_bit_beyond_its_mode(tmp_path):
    asked = []
    real_mkdir = os.mkdir

    def watched_mkdir(path, mode=0o777, *, dir_fd=None):
        if os.path.dirname(path) == str(tmp_path):  # (not makedirs' try of the parent)
            asked.append(mode)
        real_mkdir(path, mode, dir_fd=dir_fd)

    with mock.patch("os.mkdir", watched_mkdir):
        _fs.make_dirs(str(tmp_path / "d"), 0o600)
        _fs.make_dir(str(tmp_path / "e"), 0o640)
    assert asked == [0o700, 0o750]
    assert os.stat(tmp_path / "d").st_mode & 0o777 == 0o700 and os.stat(tmp_path / "e").st_mode & 0o777 == 0o750


def test_make_dirs_never_follows_a_symlink(tmp_path):
    (tmp_path / "d").mkdir()
    os.symlink(tmp_path / "d", tmp_path / "link")
    with pytest.raises(vsqs.StorageError, match="symlink"):
        _fs.make_dirs(str(tmp_path / "link"), 0o600)
    _fs.make_root(str(tmp_path / "link"))  # a spool's root may be a symlink: the operator's choice


def test_read_of_short_reads_goes_on_to_the_end(tmp_path):
    # a network filesystem may answer a read with fewer bytes than the file has
    path = tmp_path / "m"
    path.write_bytes(bytes(range(100)))
    with mock.patch("os.read", lambda fd, n, real=os.read: real(fd, min(n, 7))):
        assert _fs.read(str(path)) == bytes(range(100))
