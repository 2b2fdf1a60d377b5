"""Claim manifests without a Spark session (docs/FORMAT.md, "Spark claim
manifests", version 2): files are created once under their final name, with
no hard link; a torn or half-written file reads as absent; a replay never
claims past what its manifest records."""

from __future__ import annotations

import errno
import hashlib
import json
import os
from types import SimpleNamespace

import pytest

import vsqs
from vsqs._spark import manifest as manifests


def _place(queue: vsqs.Queue, batch: int = 1, index: int = 0) -> manifests.Place:
    return manifests.Place(queue, "0123456789abcdef", batch, index)


def test_files_are_written_without_hard_links(flat_queue, monkeypatch):
    """DESIGN.md: never depend on hard links (some NFS and HDFS mounts lack them)."""

    def no_links(*args, **kwargs):
        raise OSError(errno.EPERM, "hard links are not supported here")

    monkeypatch.setattr(os, "link", no_links)
    place = _place(flat_queue)
    record = manifests.Manifest(place)
    assert record.write_chunk(0, 0, ["r1", "r2"])
    assert record.seal(0, 1, 2) == 1
    again = manifests.read_manifest(place)
    assert again.sealed_chunks == 1 and again.receipts() == ["r1", "r2"]
    assert sorted(os.listdir(place.path)) == ["0.0.json", "0.end.json"]  # nothing else left behind


def test_a_file_is_never_overwritten(flat_queue):
    place = _place(flat_queue)
    assert manifests.Manifest(place).write_chunk(0, 0, ["first"])
    assert not manifests.Manifest(place).write_chunk(0, 0, ["second"])
    assert manifests.read_manifest(place).receipts() == ["first"]


@pytest.mark.parametrize("cut", [1, 10, -70, -3, -1])
def test_a_torn_file_reads_as_absent_and_its_generation_is_not_reused(flat_queue, cut):
    """A writer died after its exclusive create, ``cut`` bytes into (or short
    of the end of) its file: no chunk, but the next attempt takes generation 1."""
    place = _place(flat_queue)
    assert manifests.Manifest(place).write_chunk(0, 0, ["kept"])
    os.makedirs(place.path, exist_ok=True)
    data = manifests.encode({"receipts": ["torn-a", "torn-b"]})
    with open(os.path.join(place.path, "0.1.json"), "wb") as stream:
        stream.write(data[:cut])
    found = manifests.read_manifest(place)
    assert found.chunks == {0: ["kept"]}
    assert found.generation == 0
    assert not manifests.Manifest(place).write_chunk(0, 1, ["racer"])  # nobody replaces it
    assert manifests.Manifest(place).write_chunk(found.generation + 1, 1, ["next"])
    assert manifests.read_manifest(place).chunks == {0: ["kept"], 1: ["next"]}


def test_a_damaged_byte_fails_the_seal(flat_queue):
    """A torn write on a network filesystem may leave the end in place and a
    hole (zeros) or stale bytes in the middle: the seal catches it."""
    place = _place(flat_queue)
    os.makedirs(place.path)
    data = bytearray(manifests.encode({"receipts": ["abc", "abd"]}))
    data[data.index(b"abd") + 2] = ord("c")  # still valid JSON, different receipt
    with open(os.path.join(place.path, "0.0.json"), "wb") as stream:
        stream.write(bytes(data))
    assert manifests.read_manifest(place).chunks == {}


def test_the_seal_is_a_sha256_of_the_bytes_before_it(flat_queue):
    """Another program can write and check these files (docs/FORMAT.md)."""
    data = manifests.encode({"receipts": ["x"]})
    head, _, tail = data.partition(b',"sum":"')
    assert head == b'{"v":2,"receipts":["x"]'
    assert tail == hashlib.sha256(head).hexdigest().encode() + b'"}'
    assert json.loads(data)["v"] == 2


def test_version_1_files_are_still_read(flat_queue):
    """Written by link (complete by construction) before version 2: no seal."""
    place = _place(flat_queue)
    os.makedirs(place.path)
    with open(os.path.join(place.path, "0.0.json"), "w") as stream:
        stream.write('{"v":1,"receipts":["old"]}')
    with open(os.path.join(place.path, "0.end.json"), "w") as stream:
        stream.write('{"v":1,"chunks":1,"messages":1}')
    found = manifests.read_manifest(place)
    assert found.sealed_chunks == 1 and found.receipts() == ["old"]
    assert manifests.claimed_in(flat_queue, "0123456789abcdef", 1) == 1


def test_an_unsealed_version_2_file_is_incomplete(flat_queue):
    place = _place(flat_queue)
    os.makedirs(place.path)
    with open(os.path.join(place.path, "0.0.json"), "w") as stream:
        stream.write('{"v":2,"receipts":["no-seal"]}')
    assert manifests.read_manifest(place).chunks == {}


def test_a_lost_exclusive_create_reported_as_eio_is_a_loss_not_an_error(flat_queue, monkeypatch):
    """HDFS's NFS gateway reports a lost exclusive create as EIO."""
    place = _place(flat_queue)
    assert manifests.Manifest(place).write_chunk(0, 0, ["first"])
    real_open = os.open
    lost = []

    def hdfs_open(name, flags, *args, **kwargs):  # (the manifest's files are opened relative to their directory)
        if flags & os.O_EXCL and os.path.lexists(os.path.join(place.path, name)):
            lost.append(name)
            raise OSError(errno.EIO, "Input/output error")
        return real_open(name, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", hdfs_open)
    assert not manifests.Manifest(place).write_chunk(0, 0, ["second"])
    assert lost == ["0.0.json"]
    with pytest.raises(OSError):  # an EIO that is no collision is an error
        monkeypatch.setattr(os, "fsync", lambda fd: (_ for _ in ()).throw(OSError(errno.EIO, "disk")))
        manifests.Manifest(place).write_chunk(0, 1, ["third"])
    assert "0.1.json" not in os.listdir(place.path)  # a write that failed takes its name back


def test_a_replay_never_claims_past_its_manifest(flat_queue):
    """A replayed batch whose manifest reads as unsealed (its seal missing from
    the listing: gc renamed the tree away between the listing and the read,
    a stale NFS listing, a torn seal) re-reads what is recorded and claims no
    new message: the sink may hold the batch already and skip it, and the
    next batch would delete what it claimed (lost)."""
    pytest.importorskip("pyspark")
    from vsqs._spark.claims import StreamPartition, _claimed

    queue = flat_queue
    queue.publish_batch([f"m{i}" for i in range(10)])
    held = queue.receive_batch(3, visibility_timeout=300)
    place = _place(queue)
    assert manifests.Manifest(place).write_chunk(0, 0, [m.receipt for m in held])  # its seal unseen
    partition = StreamPartition("0123456789abcdef", 1, 0, 10, [], replay=True)
    options = SimpleNamespace(visibility_timeout=300)
    rows = [m.body for chunk in _claimed(queue, options, partition, True) for m in chunk]
    assert sorted(rows) == sorted(m.body for m in held)
    assert queue.stats().in_flight == 3  # nothing new claimed
    assert manifests.read_manifest(place).receipts() and manifests.read_manifest(place).sealed


def test_a_task_retry_re_reads_and_claims_nothing_new(flat_queue):
    """The same unsealed manifest met by a task retry of this run (no replay):
    it re-reads what the attempt before recorded, and seals that; the rest is
    the next batch's (see the test below: the attempt before may be alive)."""
    pytest.importorskip("pyspark")
    from vsqs._spark.claims import StreamPartition, _claimed

    queue = flat_queue
    queue.publish_batch([f"m{i}" for i in range(10)])
    held = queue.receive_batch(3, visibility_timeout=300)
    place = _place(queue)
    assert manifests.Manifest(place).write_chunk(0, 0, [m.receipt for m in held])
    partition = StreamPartition("0123456789abcdef", 1, 0, 10, [], replay=False)
    rows = [m.body for chunk in _claimed(queue, SimpleNamespace(visibility_timeout=300), partition, True)
            for m in chunk]
    assert sorted(rows) == sorted(m.body for m in held) and queue.stats().in_flight == 3
    manifest = manifests.read_manifest(place)
    assert manifest.sealed and len(manifest.receipts()) == 3


def test_a_directory_gc_removes_between_reaching_it_and_the_create_is_made_again(flat_queue, monkeypatch):
    """gc removes an empty directory past its grace, or renames away the tree
    of a query idle for the stage grace, just as a live query writes there
    again: the write makes the directory again (it used to fail the task, and
    leave the chunk it had claimed held by no manifest until its lease ran out)."""
    place = _place(flat_queue)
    real_open = os.open
    removed = []

    def gc_first(name, flags, *args, **kwargs):
        if flags & os.O_EXCL and not removed:
            removed.append(name)
            os.rmdir(place.path)  # gc, after the writer opened the directory, before its create
        return real_open(name, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", gc_first)
    assert manifests.Manifest(place).write_chunk(0, 0, ["r"])
    assert removed and manifests.read_manifest(place).receipts() == ["r"]


def test_a_torn_seal_does_not_hide_the_seal_that_stands(flat_queue, monkeypatch):
    """claimed_in counts a partition's messages from its first readable seal
    (it stopped at the first seal name, torn or not, and counted 0)."""
    place = _place(flat_queue)
    assert manifests.Manifest(place).seal(1, 2, 7) == 2
    with open(os.path.join(place.path, "0.end.json"), "wb") as stream:  # a seal torn by a dead attempt
        stream.write(manifests.encode({"chunks": 2, "messages": 7})[:20])
    real_listdir = manifests._listdir
    monkeypatch.setattr(manifests, "_listdir", lambda directory: sorted(real_listdir(directory)))
    assert manifests.claimed_in(flat_queue, "0123456789abcdef", 1) == 7


def test_an_empty_batch_directory_is_settled_not_planned_again_and_again(flat_queue):
    # A task killed between the two removals of remove_partition (its
    # partition's directory gone, the batch's not yet) left the batch's
    # directory empty: every later plan listed it as a batch to settle with
    # no partition, planned a batch that deleted nothing, and an
    # availableNow query ran such batches without end (caught by the
    # driver-kill test in CI: 2,962 batches in 8 minutes).
    from pyspark.sql.streaming.datasource import ReadMaxRows

    from vsqs._spark.options import Options
    from vsqs._spark.schema import SCHEMA, read_columns
    from vsqs._spark.stream import ClaimingStreamReader

    query = "0123456789abcdef"
    os.makedirs(os.path.dirname(_place(flat_queue, batch=1).path))  # batch 1: settled but for its directory
    foreign = os.path.dirname(_place(flat_queue, batch=2).path)
    os.makedirs(foreign)
    with open(os.path.join(foreign, "notes.txt"), "w") as stream:  # batch 2: no manifest, a foreign file
        stream.write("x")
    assert manifests.pending_batches(flat_queue, query, 5) == []
    assert not os.path.exists(os.path.dirname(_place(flat_queue, batch=1).path))  # removed
    assert os.path.exists(os.path.join(foreign, "notes.txt"))  # left (gc reports it)
    reader = ClaimingStreamReader(Options.parse({"path": flat_queue.path}), read_columns(SCHEMA), SCHEMA)
    start = {"v": 1, "query": query, "seq": 5}
    assert reader.latestOffset(start, ReadMaxRows(100)) == start  # nothing to claim, nothing to settle: no batch


def test_a_partition_with_a_foreign_entry_is_settled_once(flat_queue):
    # A foreign file in a settled partition's directory kept the directory,
    # and with it the partition: every plan settled it again, without end.
    place = _place(flat_queue, batch=3)
    os.makedirs(place.path)
    with open(os.path.join(place.path, "notes.txt"), "w") as stream:
        stream.write("x")
    manifests.remove_partition(place)
    assert manifests.pending_batches(flat_queue, "0123456789abcdef", 5) == []
    [aside] = os.listdir(os.path.dirname(place.path))
    assert aside.startswith(".left-p0-")
    assert os.listdir(os.path.join(os.path.dirname(place.path), aside)) == ["notes.txt"]  # kept, for gc to report


def _reader(queue: vsqs.Queue):
    from vsqs._spark.options import Options
    from vsqs._spark.schema import SCHEMA, read_columns
    from vsqs._spark.stream import ClaimingStreamReader

    return ClaimingStreamReader(Options.parse({"path": queue.path}), read_columns(SCHEMA), SCHEMA)


def test_a_partition_number_past_the_partition_limit_is_no_partition(flat_queue):
    # A foreign "p100000" (the name pattern allowed six digits; a batch has at
    # most MAX_PARTITIONS) was planned as a batch of 100,001 partitions to
    # settle, which partitions() refuses as no offset of the source: the
    # query failed, and failed again on every restart replaying that offset.
    from pyspark.sql.streaming.datasource import ReadMaxRows

    query = "0123456789abcdef"
    os.makedirs(_place(flat_queue, batch=1, index=100_000).path)
    assert manifests.pending_batches(flat_queue, query, 5) == []
    reader = _reader(flat_queue)
    start = {"v": 1, "query": query, "seq": 5}
    end = reader.latestOffset(start, ReadMaxRows(100))
    assert end == start
    reader.partitions(start, end)  # (raised InvalidArgument)


def test_a_settle_that_fails_every_time_is_not_planned_again_and_again(flat_queue, monkeypatch):
    # A partition whose manifest cannot be removed (EACCES on unlink, a
    # rename refused): the delete-only batch that tried to settle it found
    # it again, planned another, and an availableNow query never ended.
    # A delete-only batch tries each batch once per run; claiming batches
    # (and the next run) try again.
    from pyspark.sql.streaming.datasource import ReadMaxRows

    from vsqs._spark import claims

    query = "0123456789abcdef"
    record = manifests.Manifest(_place(flat_queue, batch=1))
    record.write_chunk(0, 0, [])
    record.seal(0, 1, 0)

    def refused(place):
        raise PermissionError(errno.EACCES, "Permission denied", place.path)

    monkeypatch.setattr(manifests, "remove_partition", refused)
    start = {"v": 1, "query": query, "seq": 5}

    def failed_settle():
        reader = _reader(flat_queue)
        end = reader.latestOffset(start, ReadMaxRows(100))
        assert end["settle"] == [[1, 1]] and end["take"] == 0
        for partition in reader.partitions(start, end):
            settler = claims.Settler(flat_queue, partition)
            settler.start()  # the settle fails (logged)
            settler.finish()
        assert manifests.pending_batches(flat_queue, query, 6) == [(1, 1)]
        return reader, end

    reader, end = failed_settle()
    assert reader.latestOffset(end, ReadMaxRows(100)) == end  # no batch: the query can end
    reader, end = failed_settle()
    flat_queue.publish("m")
    again = reader.latestOffset(end, ReadMaxRows(100))
    assert again["take"] == 1 and again["settle"] == [[1, 1]]  # a claiming batch tries again


def test_batches_that_failed_to_settle_do_not_starve_the_others(flat_queue, monkeypatch):
    # MAX_SETTLE_ENTRIES batches whose settling fails every time were the
    # first MAX_SETTLE_ENTRIES of every plan: later batches were never
    # settled while the query ran, and their messages came back again and again.
    from pyspark.sql.streaming.datasource import ReadMaxRows

    from vsqs._spark import stream

    query = "0123456789abcdef"
    monkeypatch.setattr(stream, "MAX_SETTLE_ENTRIES", 2)
    for batch in (1, 2, 3):
        os.makedirs(_place(flat_queue, batch=batch).path)
    reader = _reader(flat_queue)
    start = {"v": 1, "query": query, "seq": 5}
    end = reader.latestOffset(start, ReadMaxRows(100))
    assert end["settle"] == [[1, 1], [2, 1]]  # (not settled: still there)
    flat_queue.publish("m")  # a claiming batch: it settles what no batch tried yet first
    end2 = reader.latestOffset(end, ReadMaxRows(100))
    assert end2["take"] == 1 and end2["settle"] == [[3, 1], [1, 1]]


def test_a_later_attempt_claims_nothing_beside_an_earlier_one_still_running(flat_queue):
    # Attempt A (generation 0) recorded chunk 0; a speculative copy B started
    # then. B used to re-read chunk 0 (as generation 1) and, the manifest
    # unsealed, claim on as chunk 1 of generation 1, while A recorded its own
    # chunk 1 of generation 0 (another name: no collision) and sealed. The
    # manifest then said chunk 1 was B's, though Spark committed A's rows: the
    # next batch deleted B's messages, delivered by no committed batch (lost).
    pytest.importorskip("pyspark")
    from vsqs._spark.claims import StreamPartition, _claimed

    queue = flat_queue
    queue.publish_batch([f"m{i}" for i in range(10)])
    place = _place(queue)
    a = manifests.Manifest(place)
    first = queue.receive_batch(3, visibility_timeout=300)
    assert a.write_chunk(0, 0, [m.receipt for m in first])
    copy = StreamPartition("0123456789abcdef", 1, 0, 10, [], replay=False)
    rows = [m.id for chunk in _claimed(queue, SimpleNamespace(visibility_timeout=300), copy, True) for m in chunk]
    assert sorted(rows) == sorted(m.id for m in first) and queue.stats().in_flight == 3  # B: nothing new
    more = queue.receive_batch(2, visibility_timeout=300)  # A claims on and records its chunk 1
    assert a.write_chunk(0, 1, [m.receipt for m in more])
    a.seal(0, 2, 5)
    recorded = {queue.message_id(receipt) for receipt in manifests.read_manifest(place).receipts()}
    assert recorded == {m.id for m in first}  # A's chunk 1 comes back (a duplicate), nothing is deleted unseen


def test_a_partition_that_is_a_symbolic_link_is_moved_aside_not_followed(flat_queue, tmp_path):
    # "pP" a symbolic link to a directory elsewhere: settling it unlinked the
    # files there that look like manifest files (outside the queue), then
    # could not remove the link as a directory.
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "0.0.json").write_text("not the queue's")
    place = _place(flat_queue, batch=3)
    os.makedirs(os.path.dirname(place.path))
    os.symlink(outside, place.path)
    manifests.remove_partition(place)
    assert (outside / "0.0.json").exists()  # not followed
    assert manifests.pending_batches(flat_queue, "0123456789abcdef", 5) == []
    [aside] = os.listdir(os.path.dirname(place.path))
    assert aside.startswith(".left-p0-") and os.path.islink(os.path.join(os.path.dirname(place.path), aside))
