"""The command line, through click's CliRunner and as real subprocesses."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner

import vsqs
from tests.conftest import vsqs_command
from vsqs._cli import main


@pytest.fixture
def run():
    runner = CliRunner()

    def invoke(*args, input=None):
        return runner.invoke(main, [str(a) for a in args], input=input, catch_exceptions=False)

    return invoke


def test_create_publish_receive_delete(run, tmp_path):
    path = tmp_path / "q"
    assert run("create", path).exit_code == 0
    result = run("publish", path, "hello")
    assert result.exit_code == 0
    message_id = result.output.strip()
    result = run("receive", path, "--json")
    doc = json.loads(result.output)
    assert doc["id"] == message_id and doc["body"] == "hello" and doc["receive_count"] == 1
    assert doc["body_encoding"] == "utf-8"
    assert run("delete", path, doc["receipt"]).exit_code == 0
    assert vsqs.Queue(path).stats().total == 0


def test_publish_to_missing_queue_is_one_clear_line(run, tmp_path):
    result = run("publish", tmp_path / "nope", "x")
    assert result.exit_code == 1
    assert result.output.strip().splitlines() == [f"vsqs: error: no queue at {tmp_path / 'nope'} (create it first)"]


def test_publish_create_flag(run, tmp_path):
    assert run("publish", "--create", tmp_path / "q", "x").exit_code == 0
    assert vsqs.Queue(tmp_path / "q").stats().ready == 1


def test_publish_stdin_whole_and_lines(run, flat_queue):
    queue = flat_queue  # one delivery order across the queue: no shards
    run("publish", queue.path, input="one message\nstill one\n")
    result = run("publish", queue.path, "--lines", input="a\nb\n\nc")
    assert result.exit_code == 0 and len(result.output.split()) == 4
    bodies = [m.body for m in queue.receive_batch(10)]
    assert bodies == [b"one message\nstill one\n", b"a", b"b", b"", b"c"]


def test_publish_lines_rejects_message_argument(run, queue):
    result = run("publish", queue.path, "x", "--lines")
    assert result.exit_code == 2 and "--lines" in result.output


def test_publish_delay(run, queue):
    run("publish", queue.path, "x", "--delay", "60")
    assert queue.stats().delayed == 1


def test_receive_plain_prints_body_and_receipt(run, queue):
    queue.publish(b"raw body")
    result = run("receive", queue.path)
    assert result.exit_code == 0
    assert result.stdout == "raw body"
    assert result.stderr.startswith("receipt: " + queue.id + ":")


def test_receive_empty_exits_3(run, queue):
    result = run("receive", queue.path)
    assert result.exit_code == 3 and result.output == ""


def test_receive_delete_and_batch(run, flat_queue):
    queue = flat_queue  # one delivery order across the queue: no shards
    queue.publish_batch([b"1", b"2", b"3"])
    result = run("receive", queue.path, "-n", 5, "--delete")
    assert result.stdout == "1\n2\n3\n"
    assert queue.stats().total == 0


def test_receive_binary_json(run, queue):
    queue.publish(b"\xff\x00")
    doc = json.loads(run("receive", queue.path, "--json").output)
    assert doc["body_encoding"] == "base64" and doc["body"] == "/wA="


def test_receive_visibility_timeout(run, queue):
    queue.publish(b"x")
    doc = json.loads(run("receive", queue.path, "--json", "--visibility-timeout", "0.1").output)
    time.sleep(0.15)
    again = queue.receive()
    assert again.id == doc["id"] and again.receive_count == 2


def test_negative_timeout_is_a_usage_error(run, queue):
    result = run("receive", queue.path, "--visibility-timeout", "-1")
    assert result.exit_code == 2 and "visibility-timeout" in result.output


def test_change_visibility_prints_new_receipt(run, queue):
    queue.publish(b"x")
    m = queue.receive()
    result = run("change-visibility", queue.path, m.receipt, "60")
    new = result.output.strip()
    assert result.exit_code == 0 and new != m.receipt
    queue.delete(new)


@pytest.mark.parametrize("receipt", ["garbage", "../../etc/passwd"])
def test_malformed_receipt(run, queue, receipt):
    result = run("delete", queue.path, receipt)
    assert result.exit_code == 1 and "malformed receipt" in result.output


def test_stale_receipt(run, queue):
    queue.publish(b"x")
    m = queue.receive()
    m.delete()
    result = run("delete", queue.path, m.receipt)
    assert result.exit_code == 1 and "stale" in result.output


def test_stats_formats(run, queue):
    queue.publish_batch([b"1", b"2"])
    queue.receive()
    assert "ready             1" in run("stats", queue.path).output
    assert json.loads(run("stats", queue.path, "--json").output)["in_flight"] == 1
    prom = run("stats", queue.path, "--prometheus").output
    assert "# TYPE vsqs_messages gauge" in prom
    assert 'vsqs_messages{queue="q",state="ready"} 1' in prom and queue.path not in prom
    assert "vsqs_oldest_message_age_seconds{" in prom


def test_ls(run, flat_queue):
    queue = flat_queue  # one delivery order across the queue: no shards
    ids = queue.publish_batch([b"1", b"2"])
    queue.receive()
    lines = run("ls", queue.path).output.splitlines()
    assert [line.split()[:3] for line in lines] == [[ids[0], "in_flight", "1"], [ids[1], "ready", "0"]]
    docs = [json.loads(line) for line in run("ls", queue.path, "--json").output.splitlines()]
    assert [d["id"] for d in docs] == ids


def test_purge_asks_unless_yes(run, queue):
    queue.publish_batch([b"1", b"2"])
    result = run("purge", queue.path, input="n\n")
    assert result.exit_code == 1 and queue.stats().ready == 2
    result = run("purge", queue.path, "--yes")
    assert result.output.strip() == "purged 2 messages" and queue.stats().total == 0


def test_gc(run, queue):
    queue.publish(b"x")
    queue.receive(visibility_timeout=0)
    orphan = os.path.join(queue.path, "9-1795305501723584-892190c0ba724662.new")
    open(orphan, "w").close()
    os.utime(orphan, (0, 0))
    result = run("gc", queue.path)
    assert result.output.strip() == (
        "requeued 1 expired messages, removed 1 files (orphans, past retention, abandoned stages and Spark manifests)"
    )
    assert not os.path.exists(orphan)


def test_gc_removes_an_abandoned_spark_query_and_reports_damage(run, queue, caplog):
    """A streaming query's manifests untouched for the stage grace go; a query
    holding a FIFO is reported (a warning: on stderr outside pytest) and left."""
    trees = [os.path.join(queue.path, ".spark", "stream", query) for query in ("0123456789abcdef", "fedcba9876543210")]
    for tree in trees:
        os.makedirs(os.path.join(tree, "7", "p0"))
        for name in ("0.0.json", "0.end.json"):
            with open(os.path.join(tree, "7", "p0", name), "w") as stream:
                stream.write("{}")
    os.mkfifo(os.path.join(trees[1], "7", "p0", "0.1.json"))
    for tree in trees:
        for directory, _, files in os.walk(tree, topdown=False):
            for path in [os.path.join(directory, name) for name in files] + [directory]:
                os.utime(path, (0, 0))
    result = run("gc", queue.path)
    assert "removed 2 files" in result.output
    assert "is a FIFO: skipped, left in place" in caplog.text
    assert not os.path.exists(trees[0])
    assert sorted(os.listdir(os.path.join(trees[1], "7", "p0"))) == ["0.0.json", "0.1.json", "0.end.json"]


def test_work_burst(run, queue, tmp_path):
    queue.publish_batch([b"ok-1", b"fail", b"ok-2"])
    out = tmp_path / "out"
    script = f"b=$(cat); echo \"$b\" >> {out}; [ \"$b\" != fail ]"
    result = run("work", queue.path, "--burst", "--wait", "0.1", "-v", "--", "sh", "-c", script)
    assert result.exit_code == 0
    assert "processed 2, failed 1" in result.stderr
    assert sorted(out.read_text().split()) == ["fail", "ok-1", "ok-2"]
    left = list(queue.messages())
    assert [(i.state, i.receive_count) for i in left] == [("ready", 1)]  # released for retry


def test_work_max_messages_and_retry_delay(run, queue):
    queue.publish_batch([b"1", b"2", b"3"])
    result = run("work", queue.path, "--max-messages", "1", "--retry-delay", "60", "--", "false")
    assert result.exit_code == 0
    assert sorted(i.state for i in queue.messages()) == ["in_flight", "ready", "ready"]


def test_work_missing_command(run, queue):
    queue.publish(b"x")
    result = run("work", queue.path, "--burst", "--wait", "0", "--", "/no/such/program")
    assert result.exit_code == 0
    assert queue.stats().ready == 1  # failed to start: released, not lost


def test_work_needs_a_command(run, queue):
    assert run("work", queue.path).exit_code == 2


# -- real subprocesses ------------------------------------------------------------


def test_subprocess_round_trip(tmp_path):
    path = str(tmp_path / "q")
    cli = vsqs_command()
    subprocess.run(cli + ["create", path], check=True)
    published = subprocess.run(
        cli + ["publish", path, "--lines"], input=b"alpha\nbeta\n", check=True, capture_output=True
    )
    assert len(published.stdout.split()) == 2
    out = tmp_path / "seen"
    worker = subprocess.run(
        cli + ["work", path, "--burst", "--wait", "0.2", "--", sys.executable, "-c",
               f"import sys; open({str(out)!r}, 'ab').write(sys.stdin.buffer.read() + b'\\n')"],
        capture_output=True, timeout=60,
    )
    assert worker.returncode == 0, worker.stderr
    assert sorted(out.read_bytes().split()) == [b"alpha", b"beta"]
    empty = subprocess.run(cli + ["receive", path], capture_output=True)
    assert empty.returncode == 3 and empty.stdout == b""


def test_subprocess_error_is_one_line(tmp_path):
    result = subprocess.run(vsqs_command() + ["stats", str(tmp_path / "nope")], capture_output=True)
    assert result.returncode == 1
    assert result.stderr.decode().splitlines() == [f"vsqs: error: no queue at {tmp_path / 'nope'} (create it first)"]


def test_work_stops_cleanly_on_sigterm(tmp_path):
    q = vsqs.Queue(tmp_path / "q", create=True)
    q.publish_batch([b"slow", b"never"])
    marker = tmp_path / "started"
    child = subprocess.Popen(
        vsqs_command() + ["work", q.path, "--visibility-timeout", "0.6", "--", "sh", "-c",
                          f"touch {marker}; sleep 1.5"],
    )
    deadline = time.monotonic() + 30
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    child.send_signal(signal.SIGTERM)
    assert child.wait(timeout=30) == 0
    # the running command finished (its lease kept alive past 0.6 s) and its message
    # was deleted; the other was never taken
    assert [m.body for m in q.receive_batch(10)] == [b"never"]


def test_work_second_signal_terminates_the_command(tmp_path):
    q = vsqs.Queue(tmp_path / "q", create=True)
    q.publish(b"stuck")
    marker = tmp_path / "started"
    child = subprocess.Popen(
        vsqs_command() + ["work", q.path, "--", "sh", "-c", f"touch {marker}; exec sleep 60"],
    )
    deadline = time.monotonic() + 30
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    child.send_signal(signal.SIGTERM)
    time.sleep(0.2)
    child.send_signal(signal.SIGTERM)
    assert child.wait(timeout=30) == 0
    [info] = q.messages()
    assert (info.state, info.receive_count) == ("ready", 1)  # released, not lost


def test_python_dash_m_and_version():
    result = subprocess.run(vsqs_command() + ["--version"], capture_output=True, text=True)
    assert result.returncode == 0 and vsqs.__version__ in result.stdout


# -- settings and dead letters ------------------------------------------------------


def test_create_with_settings_and_config(run, tmp_path):
    path = tmp_path / "jobs"
    assert run("create", path, "--max-receives", "2", "--visibility-timeout", "5").exit_code == 0
    shown = run("config", path).output
    assert "max_receives        2" in shown and "visibility_timeout  5" in shown
    result = run("config", path, "throttle=10/1", "delay=none", "max-receives=1", "--json")
    doc = json.loads(result.output)
    assert doc["throttle"] == [10, 1.0] and doc["max_receives"] == 1
    assert vsqs.Queue(path).settings["max_receives"] == 1


def test_config_shows_lists_as_it_takes_them(run, queue):
    """The suspended operations (a list of names) once ended in a traceback."""
    assert "suspended           none" in run("config", queue.path).output.splitlines()
    run("config", queue.path, "suspended=receive,publish", "throttle=10/60")
    shown = run("config", queue.path).output.splitlines()
    assert "suspended           publish,receive" in shown and "throttle            10/60" in shown


def test_config_shows_numbers_exactly(run, queue):
    """Whole seconds without a fraction, any other number to its last digit (six
    significant digits once showed 1234567 as 1.23457e+06, taken back as 1234570)."""
    run("config", queue.path, "retention=1209600", "visibility_timeout=0.1234567", "throttle=1000000/60")
    shown = run("config", queue.path).output.splitlines()
    assert "retention           1209600" in shown and "visibility_timeout  0.1234567" in shown
    assert "throttle            1000000/60" in shown
    run("config", queue.path, "retention=1234567")
    assert "retention           1234567" in run("config", queue.path).output.splitlines()
    assert vsqs.Queue(queue.path).settings["retention"] == 1234567.0


def test_config_shows_tags_as_it_takes_them(run, queue):
    """Tags (a mapping, kept for SQS clients) are shown as the JSON config takes."""
    assert "tags                none" in run("config", queue.path).output.splitlines()
    assert run("config", queue.path, 'tags={"team": "a"}').exit_code == 0
    assert 'tags                {"team": "a"}' in run("config", queue.path).output.splitlines()
    assert vsqs.Queue(queue.path).settings["tags"] == {"team": "a"}


def test_bad_settings_on_the_command_line(run, tmp_path):
    result = run("create", tmp_path / "q", "--max-receives", "0")
    assert result.exit_code == 1 and "max_receives must be" in result.output
    assert not (tmp_path / "q").exists()
    run("create", tmp_path / "q")
    result = run("config", tmp_path / "q", "bogus=1")
    assert result.exit_code == 1 and "unknown queue setting 'bogus'" in result.output
    assert run("config", tmp_path / "q", "novalue").exit_code == 2


def test_redrive_command(run, tmp_path):
    q = vsqs.Queue(tmp_path / "jobs", create=True)
    q.configure(max_receives=1)
    q.publish(b"x")
    q.receive(visibility_timeout=0)
    assert q.receive() is None  # moved to jobs.dlq
    result = run("redrive", tmp_path / "jobs.dlq")
    assert result.output.strip() == "redrove 1 messages"
    assert q.receive().body == b"x"


def test_publish_priority_attributes_at(run, flat_queue):
    queue = flat_queue  # priority orders a whole queue only without shards
    run("publish", queue.path, "low")
    run("publish", queue.path, "high", "--priority", "9", "-a", "trace=1", "--attribute", "k=v")
    run("publish", queue.path, "later", "--at", "2999-01-01T00:00")
    m = queue.receive()
    assert (m.body, m.attributes) == (b"high", {"trace": "1", "k": "v"})
    assert queue.stats().delayed == 1
    assert run("publish", queue.path, "x", "-a", "novalue").exit_code == 2


def test_publish_uses_the_queue_default_delay(run, queue):
    queue.configure(delay=60)
    run("publish", queue.path, "x")
    assert queue.stats().delayed == 1


def test_delete_several_and_from_stdin(run, queue):
    queue.publish_batch([b"1", b"2", b"3", b"4"])
    a, b, c, d = queue.receive_batch(4)
    assert run("delete", queue.path, a.receipt, b.receipt).exit_code == 0
    result = run("delete", queue.path, "-", input=f"{c.receipt}\n{a.receipt}\n\n{d.receipt}\n")
    assert result.exit_code == 1
    assert result.stderr.count("vsqs: error:") == 1 and "stale" in result.stderr
    assert queue.stats().total == 0


def test_suspend_resume_and_throttled_receive(run, queue):
    queue.publish_batch([b"1", b"2"])
    assert run("suspend", queue.path, "--receive", "--publish").output.strip() == "suspended: publish, receive"
    result = run("receive", queue.path)
    assert result.exit_code == 1 and "receive is suspended" in result.output
    assert run("resume", queue.path).output.strip() == "suspended: nothing"
    queue.configure(throttle="1/60")
    assert run("receive", queue.path).exit_code == 0
    result = run("receive", queue.path)
    assert result.exit_code == 3 and "throttled" in result.stderr


def test_stats_watch_refreshes_until_interrupted(run, queue, monkeypatch):
    import vsqs._cli.ops as ops

    sleeps = []

    def sleep(seconds):
        sleeps.append(seconds)
        if len(sleeps) == 2:
            raise KeyboardInterrupt
        queue.publish(b"x")

    monkeypatch.setattr(ops.time, "sleep", sleep)
    result = run("stats", queue.path, "--json", "--watch", "--interval", "0.5")
    docs = [json.loads(line) for line in result.output.splitlines()]
    assert [d["ready"] for d in docs] == [0, 1] and sleeps == [0.5, 0.5]


def test_stats_prometheus_dead_lettered(run, tmp_path):
    q = vsqs.Queue(tmp_path / "jobs", create=True)
    q.configure(max_receives=1)
    q.publish(b"x")
    q.receive(visibility_timeout=0)
    q.requeue_expired()
    prom = run("stats", q.path, "--prometheus").output
    assert 'vsqs_dead_lettered_messages{queue="jobs"} 1' in prom


def test_stats_prometheus_exact_text(run, queue):
    queue.publish(b"x", group='te"nant')
    queue.receive()  # in flight: nothing ready, so the oldest ready age is 0.0
    labels = 'queue="q"'  # no path label: the gateway's /metrics labels alike
    assert run("stats", queue.path, "--prometheus", "--groups").output == "\n".join([
        "# HELP vsqs_messages Messages in the queue, by state.",
        "# TYPE vsqs_messages gauge",
        f'vsqs_messages{{{labels},state="ready"}} 0',
        f'vsqs_messages{{{labels},state="in_flight"}} 1',
        f'vsqs_messages{{{labels},state="delayed"}} 0',
        "# HELP vsqs_dead_lettered_messages Messages of this queue now in its dead-letter queue.",
        "# TYPE vsqs_dead_lettered_messages gauge",
        f"vsqs_dead_lettered_messages{{{labels}}} 0",
        "# HELP vsqs_oldest_message_age_seconds Seconds since the oldest visible message was sent.",
        "# TYPE vsqs_oldest_message_age_seconds gauge",
        f"vsqs_oldest_message_age_seconds{{{labels}}} 0.0",
        "# HELP vsqs_group_messages Messages of each message group, by state.",
        "# TYPE vsqs_group_messages gauge",
        f'vsqs_group_messages{{{labels},group="te\\"nant",state="ready"}} 0',
        f'vsqs_group_messages{{{labels},group="te\\"nant",state="in_flight"}} 1',
        f'vsqs_group_messages{{{labels},group="te\\"nant",state="delayed"}} 0',
    ]) + "\n"


def test_publish_group(run, queue):
    run("publish", queue.path, "--lines", "--group", "tenant", input="1\n2\n")
    assert queue.receive().group == "tenant"
    assert queue.receive() is None


def test_publish_dedup(run, queue):
    first = run("publish", queue.path, "x", "--dedup-id", "order-1").output.strip()
    assert run("publish", queue.path, "y", "--dedup-id", "order-1").output.strip() == first
    out = run("publish", queue.path, "--lines", "--dedup-content", input="a\na\nb\n").output.split()
    assert out[0] == out[1] != out[2]
    assert queue.stats().ready == 3
    assert run("publish", queue.path, "--lines", "--dedup-id", "z", input="a\n").exit_code == 2


def test_stats_groups(run, queue):
    queue.publish_batch([b"1", b"2"], group="tenant-a")
    assert "group tenant-a: ready 2, in_flight 0, delayed 0" in run("stats", queue.path, "--groups").output
    assert json.loads(run("stats", queue.path, "--groups", "--json").output)["groups"] == {
        "tenant-a": {"ready": 2, "in_flight": 0, "delayed": 0}
    }
    prom = run("stats", queue.path, "--groups", "--prometheus").output
    assert 'group="tenant-a",state="ready"} 2' in prom


def test_check_fs_on_a_local_directory(run, tmp_path):
    result = run("check-fs", tmp_path, "--rounds", "20", "--processes", "2")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert [line.split()[1] for line in lines] == [
        "exclusive", "rename", "fsync", "clock", "rename", "speed"
    ]
    assert all(line.startswith("ok") for line in lines)
    assert os.listdir(tmp_path) == []  # its scratch directory is gone


def test_check_fs_fails_when_exclusive_create_is_not_exclusive(run, tmp_path, monkeypatch):
    import vsqs._cli.checkfs as checkfs

    monkeypatch.setattr(checkfs, "_EXCL", os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC)  # no O_EXCL
    result = run("check-fs", tmp_path, "--rounds", "20", "--processes", "2")
    assert result.exit_code == 1 and result.output.startswith("FAIL  exclusive create")


def test_create_with_a_file_mode(run, tmp_path):
    assert run("create", tmp_path / "q", "--file-mode", "660").exit_code == 0
    assert os.stat(tmp_path / "q").st_mode & 0o777 == 0o770
    assert os.stat(tmp_path / "q" / ".vsqs.json").st_mode & 0o777 == 0o660
    vsqs.Queue(tmp_path / "q").publish(b"x")
    [name] = [n for n in os.listdir(tmp_path / "q") if not n.startswith(".")]
    assert os.stat(tmp_path / "q" / name).st_mode & 0o777 == 0o660


def test_receive_and_work_use_the_queue_visibility_timeout(run, queue):
    queue.configure(visibility_timeout=600)
    queue.publish(b"x")
    doc = json.loads(run("receive", queue.path, "--json").output)
    until = int(doc["receipt"].split(":")[1].rsplit(".", 3)[1]) / 1e6
    assert until - time.time() > 500  # the queue's 600 s, not the built-in 30 s
