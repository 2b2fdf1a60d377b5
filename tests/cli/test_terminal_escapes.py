"""What the CLI prints from a message, a queue, the spool
or an error never reaches a terminal as a control sequence; the machine
formats (--json, --prometheus into a file or a pipe, a body into a pipe)
stay exact."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess

import pytest
from click.testing import CliRunner

import vsqs
from tests.conftest import vsqs_command
from vsqs._cli import main
from vsqs._cli.text import terminal_text

# what an attacker used: set the window title, clear the screen, the 8-bit CSI
# (colour), and a right-to-left override that reorders what follows
HOSTILE = "\x1b]0;pwned\x07\x1b[2J\x9b31m\u202etxt.exe"
SHOWN = "\\x1b]0;pwned\\x07\\x1b[2J\\x9b31m\\u202etxt.exe"
# the bytes a terminal acts on: ESC, BEL, the C1 CSI and RLO as UTF-8
CONTROL_BYTES = (b"\x1b", b"\x07", b"\xc2\x9b", b"\xe2\x80\xae")


def assert_harmless(output: bytes) -> None:
    found = [seq for seq in CONTROL_BYTES if seq in output]
    assert not found, f"{found} reached the terminal in {output!r}"


@pytest.fixture
def run():
    runner = CliRunner()

    def invoke(*args, input=None):
        return runner.invoke(main, [str(a) for a in args], input=input, catch_exceptions=False)

    return invoke


def plant_group_name(queue: vsqs.Queue, group: object) -> None:
    """Rewrite the envelope of the one message of a flat queue with another
    group name, as someone who can write the spool could."""
    (name,) = [n for n in os.listdir(queue.path) if not n.startswith(".")]
    path = os.path.join(queue.path, name)
    with open(path, "rb") as f:
        header, _, body = f.read().partition(b"\n")
    with open(path, "wb") as f:
        f.write(json.dumps({**json.loads(header), "group": group}).encode() + b"\n" + body)


# -- the helper ---------------------------------------------------------------


@pytest.mark.parametrize(("text", "shown"), [
    ("\x1b[2J", "\\x1b[2J"),  # C0
    ("a\x7fb", "a\\x7fb"),  # DEL
    ("\x9b31m\x85", "\\x9b31m\\x85"),  # C1: the 8-bit CSI, NEL
    ("\u202e\u202a\u2066\u2069\u200f\u061c", "\\u202e\\u202a\\u2066\\u2069\\u200f\\u061c"),  # bidi controls
    ("one\ntwo\tthree\r", "one\\ntwo\\tthree\\r"),  # a name stays on its line
    ("a\u2028b", "a\\u2028b"),
    ("path-\udcff", "path-\\xff"),  # an undecodable byte of a file name (surrogateescape)
    ("lone \ud800", "lone \\ud800"),
    (b"\xff\xfe\x1b", "\\xff\\xfe\\x1b"),  # invalid UTF-8
    ("tenant-é ✓ 日本 \\x", "tenant-é ✓ 日本 \\x"),  # printable text, a backslash: as is
])
def test_terminal_text_shows_what_a_terminal_would_act_on(text, shown):
    assert terminal_text(text) == shown


def test_terminal_text_keeps_the_lines_of_a_body():
    assert terminal_text(b"line 1\n\tline 2\x1b[A\r\n", multiline=True) == "line 1\n\tline 2\\x1b[A\\r\n"


# -- each output ----------------------------------------------------------------


@pytest.mark.parametrize("watch", [False, True])
def test_stats_groups_escapes_a_group_name(run, queue, monkeypatch, watch):
    """The reproduction: a group name that set the title and cleared the screen."""
    import vsqs._cli.ops as ops

    def interrupt(seconds):
        raise KeyboardInterrupt

    monkeypatch.setattr(ops.time, "sleep", interrupt)
    queue.publish(b"x", group=HOSTILE)
    result = run("stats", queue.path, "--groups", *(["--watch"] if watch else []))
    assert_harmless(result.stdout_bytes)
    assert f"group {SHOWN}: ready 1, in_flight 0, delayed 0" in result.stdout.splitlines()
    doc = json.loads(run("stats", queue.path, "--groups", "--json").stdout)
    assert doc["groups"] == {HOSTILE: {"ready": 1, "in_flight": 0, "delayed": 0}}  # exact


def test_stats_group_name_that_is_not_unicode(run, flat_queue):
    """A planted group name with a lone surrogate: shown escaped, not a traceback."""
    flat_queue.publish(b"x", group="g")
    plant_group_name(flat_queue, "a\udcff\nb")
    assert "group a\\xff\\nb: ready 1, in_flight 0, delayed 0" in run("stats", flat_queue.path, "--groups").stdout
    prom = run("stats", flat_queue.path, "--groups", "--prometheus").stdout
    assert 'group="a\ufffd\\nb",state="ready"} 1' in prom  # UTF-8, as the exposition format wants
    assert json.loads(run("stats", flat_queue.path, "--groups", "--json").stdout)["groups"] == {
        "a\udcff\nb": {"ready": 1, "in_flight": 0, "delayed": 0}
    }


def test_prometheus_into_a_pipe_is_the_exposition_format(run, queue):
    """Into a file or a pipe the labels are exact, escaped only as the format says."""
    queue.publish(b"x", group='\x1b[2J"\\\n')
    prom = run("stats", queue.path, "--groups", "--prometheus").stdout
    assert 'group="\x1b[2J\\"\\\\\\n",state="ready"} 1' in prom


def test_config_escapes_a_setting_read_from_the_spool(run, queue):
    queue.configure(dead_letter="/srv/" + HOSTILE)  # an absolute path: any characters but NUL
    result = run("config", queue.path)
    assert_harmless(result.stdout_bytes)
    assert f"dead_letter         /srv/{SHOWN}" in result.stdout.splitlines()
    assert json.loads(run("config", queue.path, "--json").stdout)["dead_letter"] == "/srv/" + HOSTILE


def test_error_line_escapes_the_path_it_quotes(run, tmp_path):
    missing = tmp_path / (HOSTILE + "-\udcff")
    result = run("stats", missing)
    assert result.exit_code == 1
    assert_harmless(result.stderr_bytes)
    assert result.stderr == f"vsqs: error: no queue at {tmp_path}/{SHOWN}-\\xff (create it first)\n"


def test_usage_error_escapes_the_argument(run, tmp_path):
    """click quotes some arguments raw (here an extra one): arguments can come from data."""
    result = run("stats", tmp_path, HOSTILE)
    assert result.exit_code == 2
    assert_harmless(result.stderr_bytes)
    assert f"Error: Got unexpected extra argument ({SHOWN})" in result.stderr


def test_receive_into_a_pipe_is_the_body_as_is(run, queue):
    body = b"\x1b]0;pwned\x07\xff\xc2\x9b\n"
    queue.publish(body)
    assert run("receive", queue.path).stdout_bytes == body


def test_library_warning_is_escaped(tmp_path):
    """What the library logs (here: a missing shard, with the queue's path)
    goes to stderr escaped, through the CLI's handler of last resort."""
    queue = vsqs.Queue(tmp_path / HOSTILE, create=True, shards=4)
    os.rmdir(os.path.join(queue.path, "shards", "00"))
    result = subprocess.run(vsqs_command() + ["stats", queue.path], capture_output=True, timeout=120)
    assert result.returncode == 0 and result.stdout.startswith(b"ready ")
    assert_harmless(result.stderr)
    assert f"queue {tmp_path}/{SHOWN}: shard directory shards/00 is missing".encode() in result.stderr


# -- on a real terminal -----------------------------------------------------------


def _util_linux_script() -> str | None:
    script = shutil.which("script")
    if script is None:
        return None
    version = subprocess.run([script, "--version"], capture_output=True, text=True, timeout=60)
    return script if "util-linux" in version.stdout else None


@pytest.mark.skipif(_util_linux_script() is None, reason="needs script(1) from util-linux")
def test_on_a_real_terminal_no_control_sequence_arrives(tmp_path):
    """The commands run on a pseudo-terminal (script(1)); the raw bytes the
    terminal received hold none of the hostile sequences."""
    queue = vsqs.Queue(tmp_path / "q", create=True)
    queue.publish(HOSTILE.encode() + b"\xff", group=HOSTILE)
    cli = shlex.join(vsqs_command())
    commands = "; ".join([
        f"{cli} stats --groups {queue.path}",
        f"{cli} stats --groups --prometheus {queue.path}",
        f"{cli} receive --visibility-timeout 0 {queue.path}",
        f"{cli} stats {shlex.quote(str(tmp_path / HOSTILE))}",
    ])
    result = subprocess.run([_util_linux_script(), "-q", "-e", "-c", commands, "/dev/null"],
                            stdin=subprocess.DEVNULL, capture_output=True, timeout=300)
    assert_harmless(result.stdout)
    shown = SHOWN.encode()
    assert b"group " + shown + b": ready 1" in result.stdout  # stats
    assert b'group="' + shown + b'",state="ready"} 1' in result.stdout  # prometheus
    assert shown + b"\\xff" in result.stdout  # the body
    assert b"vsqs: error: no queue at " + str(tmp_path).encode() + b"/" + shown + b" (create" in result.stdout
