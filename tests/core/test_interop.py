"""docs/FORMAT.md promises a shell script can publish and consume: its example
("Doing it from a shell"), run as written against queues the library made."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

import vsqs
from vsqs._core import format as _format

FORMAT_MD = Path(__file__).resolve().parents[2] / "docs" / "FORMAT.md"


def shell_example() -> str:
    [block] = re.findall(r"```sh\n(.*?)```", FORMAT_MD.read_text(), re.S)
    return block


needs_bash = pytest.mark.skipif(shutil.which("bash") is None, reason="the example is for bash")


def run(queue: vsqs.Queue) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-c", shell_example()], env={**os.environ, "Q": queue.path},
                          capture_output=True, text=True, timeout=60)


@needs_bash
def test_it_consumes_a_message_the_library_received_once_and_publishes_one_it_reads(tmp_path):
    queue = vsqs.Queue(tmp_path / "q", create=True)
    queue.publish(b"from the library")
    queue.receive().release()  # received once: its name carries -rFIRST and a count
    done = run(queue)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "from the library"  # the oldest ready message, claimed and deleted
    [published] = queue.receive_batch(10)  # the example's own publish, read by the library
    assert published.body == b"hello" and published.receive_count == 1
    published.delete()
    assert queue.stats().total == 0


@needs_bash
def test_a_message_it_claims_first_is_marked_received_as_the_library_marks_it(tmp_path):
    queue = vsqs.Queue(tmp_path / "q", create=True)
    queue.publish(b"older")  # claimed by the example, which leaves its own publish behind
    assert run(queue).stdout == "older"
    [hello] = queue.receive_batch(10, visibility_timeout=0)
    assert hello.first_received_at is not None


@needs_bash
def test_an_entry_that_is_no_message_is_left_alone_and_never_blocks_it(tmp_path):
    queue = vsqs.Queue(tmp_path / "q", create=True)
    os.mkfifo(os.path.join(queue.path, f"9-{'0' * 16}-{'0' * 16}"))  # the oldest name: tried first
    queue.publish(b"after the fifo")
    done = run(queue)
    assert done.returncode == 0 and done.stdout == "after the fifo"


@needs_bash
def test_a_grouped_message_is_not_taken_without_its_lease(tmp_path):
    queue = vsqs.Queue(tmp_path / "q", create=True)
    queue.publish(b"grouped", group="g")
    assert run(queue).stdout == "hello"  # its own publish, newer: the grouped one is passed over
    assert [m.body for m in queue.receive_batch(10)] == [b"grouped"]


@pytest.mark.parametrize("shards", [4])
@needs_bash
def test_a_sharded_queue_is_refused_with_the_reason(tmp_path, shards):
    queue = vsqs.Queue(tmp_path / "q", create=True, shards=shards)
    done = run(queue)
    assert done.returncode == 1 and "sharded" in done.stderr
    assert _format.METADATA_NAME in os.listdir(queue.path) and queue.stats().total == 0


def test_documented_regex_is_the_code(flat_queue):
    queue = flat_queue  # one delivery order across the queue: no shards
    text = FORMAT_MD.read_text()
    [pattern] = re.findall(r"```\n(\(\?P<stem>.*?)```", text, re.S)
    regex = re.compile("".join(line.strip() for line in pattern.splitlines()))
    queue.publish(b"a")
    queue.publish(b"b", delay=60)
    m = queue.receive()
    queue.publish(b"c")
    queue.receive(visibility_timeout=0).release()
    import os

    names = [n for n in os.listdir(queue.path) if n != ".vsqs.json"]
    assert len(names) == 3 and all(regex.fullmatch(n) for n in names)
    assert not regex.fullmatch(m.receipt)  # a receipt is QUEUE_ID ":" name, not a name
    assert regex.fullmatch(m.receipt.split(":", 1)[1])
