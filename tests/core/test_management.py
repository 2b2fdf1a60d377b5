"""Queue management kept for SQS clients: tags, policy and KMS settings,
atomic updates of one setting, dead-letter sources, and redrive tasks."""

from __future__ import annotations

import errno
import json
import os
import threading
import time
from pathlib import Path

import pytest

import vsqs
from vsqs._core import move_tasks
from vsqs._core.dead_letters import DeadLetters


def wait_for(predicate, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)


# -- settings -------------------------------------------------------------------


def test_tags_policy_and_kms_are_settings_every_handle_sees(tmp_path: Path):
    queue = vsqs.Queue(tmp_path / "q", create=True)
    assert queue.settings["tags"] == {}
    queue.configure(tags={"team": "a", "env": ""}, policy='{"Version": "2012-10-17"}',
                    kms_master_key_id="alias/aws/sqs", kms_data_key_reuse_period=300, sqs_managed_sse=False)
    other = vsqs.Queue(tmp_path / "q")
    assert other.settings["tags"] == {"env": "", "team": "a"}
    assert json.loads(other.settings["policy"]) == {"Version": "2012-10-17"}
    assert other.settings["kms_master_key_id"] == "alias/aws/sqs"
    assert other.settings["kms_data_key_reuse_period"] == 300
    assert other.settings["sqs_managed_sse"] is False
    queue.configure(tags=None, policy=None)
    assert vsqs.Queue(tmp_path / "q").settings["tags"] == {}


@pytest.mark.parametrize("changes", [
    {"tags": {str(n): "" for n in range(51)}},
    {"tags": {"": "x"}},
    {"tags": {"k" * 129: "x"}},
    {"tags": {"k": "v" * 257}},
    {"tags": {"k": 1}},
    {"policy": "not json"},
    {"policy": "[1, 2]"},
    {"policy": json.dumps({"x": "y" * 21000})},
    {"kms_master_key_id": "k" * 2049},
    {"kms_data_key_reuse_period": 59},
    {"kms_data_key_reuse_period": 86401},
    {"sqs_managed_sse": "maybe"},
])
def test_management_settings_are_validated(tmp_path: Path, changes):
    queue = vsqs.Queue(tmp_path / "q", create=True)
    with pytest.raises(vsqs.InvalidArgument):
        queue.configure(**changes)


def test_tag_limits_are_amazons(tmp_path: Path):
    queue = vsqs.Queue(tmp_path / "q", create=True)
    tags = {f"{n:03d}" + "k" * 125: "v" * 256 for n in range(50)}
    assert queue.configure(tags=tags)["tags"] == tags


def test_update_setting_loses_no_concurrent_change(tmp_path: Path):
    """Tags added by many writers at once are all kept (each is a read-modify-write)."""
    path = tmp_path / "q"
    vsqs.Queue(path, create=True)

    def add(n: int) -> None:
        vsqs.Queue(path).update_setting("tags", lambda tags: {**tags, f"t{n}": str(n)})

    threads = [threading.Thread(target=add, args=(n,)) for n in range(24)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert vsqs.Queue(path).settings["tags"] == {f"t{n}": str(n) for n in range(24)}


def test_update_setting_validates_and_refuses_what_needs_configure(tmp_path: Path):
    queue = vsqs.Queue(tmp_path / "q", create=True)
    with pytest.raises(vsqs.InvalidArgument):
        queue.update_setting("tags", lambda tags: {**tags, "": "x"})
    with pytest.raises(vsqs.InvalidArgument):
        queue.update_setting("dead_letter", lambda value: "other")
    with pytest.raises(vsqs.InvalidArgument):
        queue.update_setting("nonsense", lambda value: 1)


# -- dead-letter sources ------------------------------------------------------------


def test_dead_letter_sources_are_the_queues_that_name_it_now(tmp_path: Path):
    spool = vsqs.Spool(tmp_path / "spool", create=True)
    dlq = spool.create_queue("dlq")
    a = spool.create_queue("a", max_receives=2, dead_letter="dlq")  # registered at once, before any dead letter
    spool.create_queue("b", max_receives=2, dead_letter="dlq")
    spool.create_queue("c")
    assert [os.path.basename(p) for p in dlq.dead_letter_sources()] == ["a", "b"]
    a.configure(max_receives=None, dead_letter=None)  # no longer a source
    spool.delete_queue("b")
    assert dlq.dead_letter_sources() == []
    assert spool.queue("c").dead_letter_sources() == []


# -- redrive tasks --------------------------------------------------------------------


def dead_letters(tmp_path: Path, count: int) -> tuple[vsqs.Queue, vsqs.Queue]:
    """A source queue and its dead-letter queue holding ``count`` of its messages."""
    spool = vsqs.Spool(tmp_path / "spool", create=True)
    dlq = spool.create_queue("dlq")
    source = spool.create_queue("src", max_receives=1, dead_letter="dlq", visibility_timeout=0)
    source.publish_batch([f"m{n}".encode() for n in range(count)])
    while source.receive_batch(10):  # received once, expired at once, then buried at the next receive
        pass
    wait_for(lambda: dlq.stats().ready == count)
    return source, dlq


def test_redrive_task_moves_everything_back_and_reports_it(tmp_path: Path):
    source, dlq = dead_letters(tmp_path, 25)
    task = dlq.start_redrive()
    assert task["status"] == "RUNNING" and task["to_move"] == 25 and task["destination"] is None
    wait_for(lambda: dlq.redrive_tasks()[0]["status"] == "COMPLETED")
    done = vsqs.Queue(dlq.path).redrive_tasks()[0]  # any handle, any process: the state is on disk
    assert done["id"] == task["id"] and done["moved"] == 25
    assert source.stats().ready == 25 and dlq.stats().ready == 0


def test_redrive_task_to_a_chosen_queue_at_a_rate(tmp_path: Path):
    _, dlq = dead_letters(tmp_path, 3)
    other = vsqs.Queue(tmp_path / "spool" / "other", create=True)
    task = dlq.start_redrive(other, per_second=2)
    assert task["per_second"] == 2 and task["destination"] == other.path
    wait_for(lambda: dlq.redrive_tasks()[0]["status"] == "COMPLETED")
    assert other.stats().ready == 3


def test_one_active_redrive_task_at_a_time_and_cancel_from_another_handle(tmp_path: Path):
    _, dlq = dead_letters(tmp_path, 5)
    task = dlq.start_redrive(per_second=1)  # one message a second: still running when cancelled
    with pytest.raises(vsqs.InvalidArgument, match="already active"):
        dlq.start_redrive()
    cancelled = vsqs.Queue(dlq.path).cancel_redrive(task["id"])
    assert cancelled is not None and cancelled["status"] == "CANCELLING"
    wait_for(lambda: dlq.redrive_tasks()[0]["status"] == "CANCELLED")
    assert dlq.redrive_tasks()[0]["moved"] < 5
    with pytest.raises(vsqs.InvalidArgument, match="not RUNNING"):
        dlq.cancel_redrive(task["id"])
    assert dlq.cancel_redrive("0000000000000-00000000") is None
    assert dlq.cancel_redrive("../x") is None


def test_a_task_whose_process_died_is_failed(tmp_path: Path):
    queue = vsqs.Queue(tmp_path / "q", create=True)
    directory = tmp_path / "q" / move_tasks.MOVES_DIR
    directory.mkdir()
    old = time.time() - move_tasks.STALE_AFTER - move_tasks.HEARTBEAT - 1
    task = {"id": "0000000000001-0000abcd", "status": "RUNNING", "destination": None, "per_second": None,
            "moved": 1, "to_move": 9, "started": old, "updated": old, "failure": None}
    (directory / "0000000000001-0000abcd.json").write_text(json.dumps(task))
    (directory / "junk.json").write_text("{")
    [seen] = queue.redrive_tasks()
    assert seen["status"] == "FAILED" and seen["failure"]
    queue.start_redrive()  # a dead task does not block a new one


def test_start_redrive_checks_its_arguments(tmp_path: Path):
    queue = vsqs.Queue(tmp_path / "q", create=True)
    for rate in (0, 501, 1.5, True):
        with pytest.raises(vsqs.InvalidArgument):
            queue.start_redrive(per_second=rate)
    with pytest.raises(vsqs.QueueNotFound):
        queue.start_redrive(tmp_path / "missing")


def test_of_two_starts_that_race_the_older_task_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A start that listed no active task before another process's start landed
    sees it after its own create, and withdraws (the older one runs)."""
    queue = vsqs.Queue(tmp_path / "q", create=True)
    directory = tmp_path / "q" / move_tasks.MOVES_DIR
    directory.mkdir()
    now = time.time()
    task = {"id": "0000000000001-0000abcd", "status": "RUNNING", "destination": None, "per_second": None,
            "moved": 0, "to_move": 0, "started": now, "updated": now, "failure": None}
    (directory / "0000000000001-0000abcd.json").write_text(json.dumps(task))
    real_list = move_tasks.MoveTasks.list
    calls = []

    def first_sees_nothing(self: move_tasks.MoveTasks) -> list:
        calls.append(1)
        return [] if len(calls) == 1 else real_list(self)

    monkeypatch.setattr(move_tasks.MoveTasks, "list", first_sees_nothing)
    with pytest.raises(vsqs.InvalidArgument, match="already active"):
        queue.start_redrive()
    assert sorted(os.listdir(directory)) == ["0000000000001-0000abcd.json"]


def test_a_moves_directory_swapped_for_a_link_is_never_followed(tmp_path: Path):
    _, dlq = dead_letters(tmp_path, 2)
    _, theirs = dead_letters(tmp_path / "other", 3)  # another spool's dead-letter queue
    their_task = theirs.start_redrive(per_second=1)
    moves = os.path.join(dlq.path, ".moves")
    assert not os.path.exists(moves)
    os.symlink(os.path.join(theirs.path, ".moves"), moves)
    assert dlq.redrive_tasks() == []  # another spool's tasks are not ours to list...
    assert dlq.cancel_redrive(their_task["id"]) is None  # ...nor to cancel
    with pytest.raises(vsqs.StorageError, match="not followed"):
        dlq.start_redrive()  # nor a place to keep ours (or to prune theirs)
    assert [t["id"] for t in theirs.redrive_tasks()] == [their_task["id"]]
    assert not os.path.exists(os.path.join(theirs.path, ".moves", their_task["id"] + ".cancel"))


def test_a_failed_task_names_no_path_of_the_spool(tmp_path: Path):
    from vsqs._core.move_tasks import failure_reason

    for error in (vsqs.QueueNotFound(f"queue directory is gone: {tmp_path}/spool/gone"),
                  vsqs.StorageError(5, "cannot rename", f"{tmp_path}/spool/q/x"),
                  RuntimeError(f"failed at {tmp_path}/spool")):
        assert str(tmp_path) not in failure_reason(error)
    assert failure_reason(vsqs.QueueNotFound("x")).startswith("QueueNotFound")
    assert failure_reason(ValueError("plain words")) == "ValueError: plain words"


def test_a_task_whose_queue_is_deleted_mid_task_fails_without_a_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
):
    source, dlq = dead_letters(tmp_path, 3)
    spool = vsqs.Spool(tmp_path / "spool")
    real_redrive = DeadLetters.redrive

    def redrive_then_delete_the_queue(self, to, max_messages, now, skew_us):  # noqa: ANN001
        moved = real_redrive(self, to, max_messages, now, skew_us)
        spool.delete_queue("dlq")  # mid-task: the task's state goes with the queue
        return moved

    monkeypatch.setattr(DeadLetters, "redrive", redrive_then_delete_the_queue)
    uncaught: list[BaseException | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: uncaught.append(args.exc_value))
    task = dlq.start_redrive(per_second=1)  # a full step of one: the task goes on to record it
    [runner] = [t for t in threading.enumerate() if t.name == f"vsqs-redrive-{task['id']}"]
    runner.join(60)
    assert not runner.is_alive() and uncaught == []
    [warning] = [r for r in caplog.records if "redrive task" in r.getMessage()]
    assert warning.getMessage() == (f"redrive task {task['id']} failed after moving 1 message(s): QueueNotFound: "
                                    "the queue being redriven was deleted; its state could not be recorded")
    assert warning.exc_info is None and source.stats().ready == 1


def test_a_move_tasks_failure_names_no_path() -> None:
    """A client reads a task's failure: a directory gone under the move is a queue
    that was deleted (QueueNotFound), and no other reason names a path."""
    from vsqs._core.move_tasks import failure_reason

    gone = [vsqs.StorageError(errno.ENOTDIR, "not a directory: /srv/spool/dest", "/srv/spool/dest"),
            vsqs.StorageError(errno.ENOENT, "open: No such file or directory", "/srv/spool/dest/x"),
            vsqs.QueueNotFound("no queue at /srv/spool/dest")]
    assert {failure_reason(exc) for exc in gone} == {"QueueNotFound: a queue of the move does not exist"}
    others = [vsqs.StorageError(errno.EIO, "read failed in /srv/spool/dest", "/srv/spool/dest"),
              vsqs.InvalidArgument("bad '/srv/spool/x'"), vsqs.StorageError(errno.EIO, "Input/output error", "/srv")]
    reasons = [failure_reason(exc) for exc in others]
    assert reasons == ["StorageError", "InvalidArgument", "StorageError: Input/output error"]
