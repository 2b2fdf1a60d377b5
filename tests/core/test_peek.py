"""Looking at a queue a page at a time (``messages(after=, limit=, preview=)``),
deleting chosen messages (``purge(ids)``), and the spool's records: what the
gateway's console is built on."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import vsqs
from tests.conftest import message_dirs


def _all_pages(queue: vsqs.Queue, limit: int) -> list[vsqs.MessageInfo]:
    seen: list[vsqs.MessageInfo] = []
    after = None
    while True:
        page = list(queue.messages(after=after, limit=limit))
        seen += page
        if len(page) < limit:
            return seen
        after = page[-1].id


def test_pages_walk_every_message_in_delivery_order(queue: vsqs.Queue) -> None:
    for i in range(23):
        queue.publish(f"m{i}", priority=i % 3, durable=False)
    queue.publish("grouped", group="g", attributes={"k": "v"}, durable=False)
    queue.receive(visibility_timeout=60)  # one in flight: still listed, in its place
    everything = [m.id for m in queue.messages()]
    for limit in (1, 5, 24, 100):
        assert [m.id for m in _all_pages(queue, limit)] == everything


def test_a_page_previews_the_body_and_tells_its_size(queue: vsqs.Queue) -> None:
    queue.publish(b"x" * 5000, attributes={"a": "1"}, group="g1", durable=False)
    (info,) = queue.messages(limit=10, preview=16)
    assert info.body == b"x" * 16 and info.size == 5000
    assert info.attributes == {"a": "1"} and info.group == "g1"
    (plain,) = queue.messages(limit=10)
    assert plain.body is None and plain.size is None


def test_a_page_reads_only_its_own_bodies(queue: vsqs.Queue, monkeypatch: pytest.MonkeyPatch) -> None:
    for i in range(50):
        queue.publish(f"m{i}", durable=False)
    from vsqs._core import fs as _fs

    reads: list[str] = []
    real = _fs.read_head
    monkeypatch.setattr(_fs, "read_head", lambda path, limit: reads.append(path) or real(path, limit))
    page = list(queue.messages(limit=7, preview=10))
    assert len(page) == 7 and len(reads) == 7


def test_peeking_changes_nothing(queue: vsqs.Queue) -> None:
    queue.publish("a", durable=False)
    queue.publish("b", delay=60, durable=False)
    before = sorted(name for place in message_dirs(queue.path) for name in os.listdir(place))
    states = [m.state for m in queue.messages(limit=10, preview=100)]
    after = sorted(name for place in message_dirs(queue.path) for name in os.listdir(place))
    assert before == after and sorted(states) == ["delayed", "ready"]
    assert queue.receive().body == b"a"


def test_a_page_skips_what_is_no_message(flat_queue: vsqs.Queue) -> None:
    first = flat_queue.publish("a", durable=False)
    Path(flat_queue.path, first[:30] + "zzzzz").write_text("junk")  # sorts among the messages
    os.mkdir(os.path.join(flat_queue.path, flat_queue.publish("b", durable=False) + ".0000000000000001.1.aaaaaaaaaaaa"))
    flat_queue.publish("c", durable=False)
    assert [m.body for m in flat_queue.messages(limit=10, preview=5)] == [b"a", b"b", b"c"]


def test_a_header_nested_thousands_deep_is_a_corrupt_envelope(flat_queue: vsqs.Queue) -> None:
    """json.loads raises RecursionError (no ValueError) on such a header: the
    page, the group count and receive must skip it as any corrupt envelope."""
    flat_queue.publish("a", durable=False)
    flat_queue.publish("hostile", group="g", durable=False)
    flat_queue.publish("c", durable=False)
    (hostile,) = [n for place in message_dirs(flat_queue.path) for n in os.listdir(place) if n.endswith("-e")]
    Path(message_dirs(flat_queue.path)[0], hostile).write_bytes(b"[" * 100_000 + b"\nbody")
    assert [m.body for m in flat_queue.messages(limit=10, preview=5)] == [b"a", b"c"]
    assert flat_queue.stats(groups=True).groups is not None
    received = [flat_queue.receive(visibility_timeout=60) for _ in range(3)]
    assert [m.body if m else None for m in received] == [b"a", b"c", None]


def test_counting_groups_reads_headers_only_and_skips_what_is_no_message(flat_queue: vsqs.Queue,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The console's "Count the groups" (stats(groups=True)) reads one message
    of each group: its header, never a body of up to 256 MiB, and a FIFO or a
    huge sparse file planted there must not fail the count."""
    for group in ("big", "fifo", "huge", "fine"):
        flat_queue.publish(b"x" * 100_000 if group == "big" else b"x", group=group, durable=False)
    flat_queue.publish(b"x", group="long", attributes={"a": "y" * 6000}, durable=False)  # a header past 4 KiB
    place = message_dirs(flat_queue.path)[0]
    by_group = {m.group: m.id for m in flat_queue.messages(bodies=True)}
    files = {group: next(n for n in os.listdir(place) if n.startswith(by_group[group])) for group in by_group}
    os.unlink(os.path.join(place, files["fifo"]))
    os.mkfifo(os.path.join(place, files["fifo"]))
    with open(os.path.join(place, files["huge"]), "r+b") as f:
        f.truncate(10 << 30)  # sparse: over what a message file may hold
    from vsqs._core import fs as _fs

    monkeypatch.setattr(_fs, "read", lambda *args, **kwargs: pytest.fail("a whole message was read"))
    read_bytes: list[int] = []

    def read_head(path: str, limit: int) -> tuple[bytes, int] | None:
        found = real(path, limit)
        read_bytes.append(len(found[0]) if found else 0)
        return found

    real = _fs.read_head
    monkeypatch.setattr(_fs, "read_head", read_head)
    groups = flat_queue.stats(groups=True).groups
    assert groups is not None and {"big", "fine", "huge", "long"} <= set(groups)
    assert read_bytes and max(read_bytes) < 100_000


def test_a_run_of_entries_that_are_no_messages_costs_a_few_passes(flat_queue: vsqs.Queue,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Thousands of names of no message (distinct ids) before the first message:
    each pass over the listing must take more than a page's worth, or a page
    costs one sort of the whole listing per 66 of them (quadratic)."""
    priority = flat_queue.publish("a", durable=False)[0]
    for i in range(3000):
        Path(flat_queue.path, f"{priority}-{1000 + i:016d}-{i:016x}-zz").touch()  # sorts first, parses as nothing
    import heapq

    passes: list[int] = []
    real = heapq.nsmallest
    monkeypatch.setattr(heapq, "nsmallest", lambda n, iterable: passes.append(n) or real(n, iterable))
    assert [m.body for m in flat_queue.messages(limit=50, preview=5)] == [b"a"]
    assert len(passes) <= 8


@pytest.mark.parametrize("bad", [{"limit": 0}, {"limit": 10_001}, {"limit": True}, {"after": "../x"},
                                 {"preview": -1}, {"preview": "9"}, {"limit": 5, "bodies": True}])
def test_bad_page_arguments_are_refused(queue: vsqs.Queue, bad: dict[str, object]) -> None:
    with pytest.raises(vsqs.InvalidArgument):
        list(queue.messages(**bad))  # type: ignore[arg-type]


def test_purge_of_ids_deletes_those_whatever_their_state(queue: vsqs.Queue) -> None:
    keep = queue.publish("keep", durable=False)
    ready = queue.publish("ready", durable=False)
    delayed = queue.publish("delayed", delay=600, durable=False)
    held = queue.publish("held", group="g", durable=False)
    got = queue.receive_batch(10, visibility_timeout=600)
    assert {m.id for m in got} >= {held}
    assert queue.purge([ready, delayed, held, "0-0000000000000000-0000000000000000"]) == 3
    assert {m.id for m in queue.messages()} == {keep}
    queue.publish("next", group="g", durable=False)
    # a purge of some ids frees no slot (a run's other members may be in flight): the group waits for its lease
    assert queue.receive(visibility_timeout=1) is None


def test_records_are_shared_through_the_spool(tmp_path: Path) -> None:
    spool = vsqs.Spool(tmp_path, create=True)
    assert spool.record("console", 7) is None
    assert spool.put_record("console", 7, b'{"a": 1}', keep=10)
    assert not spool.put_record("console", 7, b"other", keep=10)  # never rewritten
    assert vsqs.Spool(tmp_path).record("console", 7) == b'{"a": 1}'
    assert spool.put_record("console", 128, b"x", keep=10)  # a 64th period: older ones go
    assert spool.record("console", 7) is None and spool.record("console", 128) == b"x"
    assert spool.queues() == []
    with pytest.raises(vsqs.InvalidArgument):
        spool.put_record("../x", 1, b"", keep=1)
    with pytest.raises(vsqs.InvalidArgument):
        spool.record("A", 1)


def test_an_unreadable_record_is_none(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/FORMAT.md: a reader takes an unreadable record for one being written
    (EACCES cannot be made as root, so the read is made to fail as it would)."""
    spool = vsqs.Spool(tmp_path, create=True)
    assert spool.put_record("console", 7, b"x", keep=10)
    from vsqs._core import fs as _fs
    from vsqs._core.errors import StorageError

    def refused(path: str, limit: int) -> bytes:
        raise StorageError(13, "Permission denied", path)

    monkeypatch.setattr(_fs, "read", refused)
    assert spool.record("console", 7) is None
