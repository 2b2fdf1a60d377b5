"""docs/FORMAT.md's shell example ("Doing it from a shell"), run as written
against queues the library made: it must interoperate with the library."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

import vsqs
from vsqs._core import format as _format

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="the example is for bash")


def example() -> str:
    text = (ROOT / "docs" / "FORMAT.md").read_text()
    section = text[text.index("## Doing it from a shell"):]
    return re.search(r"```sh\n(.*?)```", section, re.S)[1]


def run(queue: vsqs.Queue) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-c", example()], env={**os.environ, "Q": queue.path},
                          capture_output=True, text=True, timeout=60)


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


def test_a_message_it_claims_first_is_marked_received_as_the_library_marks_it(tmp_path):
    queue = vsqs.Queue(tmp_path / "q", create=True)
    queue.publish(b"older")  # claimed by the example, which leaves its own publish behind
    assert run(queue).stdout == "older"
    [hello] = queue.receive_batch(10, visibility_timeout=0)
    assert hello.first_received_at is not None


def test_an_entry_that_is_no_message_is_left_alone_and_never_blocks_it(tmp_path):
    queue = vsqs.Queue(tmp_path / "q", create=True)
    os.mkfifo(os.path.join(queue.path, f"9-{'0' * 16}-{'0' * 16}"))  # the oldest name: tried first
    queue.publish(b"after the fifo")
    done = run(queue)
    assert done.returncode == 0 and done.stdout == "after the fifo"


def test_a_grouped_message_is_not_taken_without_its_lease(tmp_path):
    queue = vsqs.Queue(tmp_path / "q", create=True)
    queue.publish(b"grouped", group="g")
    assert run(queue).stdout == "hello"  # its own publish, newer: the grouped one is passed over
    assert [m.body for m in queue.receive_batch(10)] == [b"grouped"]


@pytest.mark.parametrize("shards", [4])
def test_a_sharded_queue_is_refused_with_the_reason(tmp_path, shards):
    queue = vsqs.Queue(tmp_path / "q", create=True, shards=shards)
    done = run(queue)
    assert done.returncode == 1 and "sharded" in done.stderr
    assert _format.METADATA_NAME in os.listdir(queue.path) and queue.stats().total == 0
