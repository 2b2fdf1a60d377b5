"""docs/FORMAT.md promises a shell script can publish and consume: run its example."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

FORMAT_MD = Path(__file__).resolve().parents[2] / "docs" / "FORMAT.md"


def shell_example() -> str:
    [block] = re.findall(r"```sh\n(.*?)```", FORMAT_MD.read_text(), re.S)
    return block


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_shell_example_interoperates(flat_queue):
    queue = flat_queue  # one delivery order across the queue: no shards
    queue.publish(b"from python")
    script = shell_example().replace("Q=/spool/jobs", f"Q={queue.path}")
    result = subprocess.run(["bash", "-c", script], capture_output=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout == b"from python"  # the shell received the older message, and deleted it
    m = queue.receive()
    assert m.body == b"hello" and m.receive_count == 1  # the library receives the shell's
    m.delete()
    assert queue.stats().total == 0


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
