"""vsqs.dramatiq: the broker under real Dramatiq workers, and its consumer alone.

The worker tests run ``python -m dramatiq`` in a process group of its own
over a spool in tmp_path, with the actors of ACTORS; each task appends a line
"what key pid time" to a log file, from which the tests count runs. Waits are
polls with a deadline; no assertion depends on how fast anything runs.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

dramatiq = pytest.importorskip("dramatiq")

import vsqs  # noqa: E402
from vsqs.dramatiq import VsqsBroker  # noqa: E402

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]
DEADLINE = 30.0  # seconds a poll waits for what must happen

ACTORS = '''
import os, time
import dramatiq
from vsqs.dramatiq import VsqsBroker

OUT = os.environ["VSQS_TEST_OUT"]
broker = VsqsBroker(os.environ["VSQS_TEST_SPOOL"], visibility_timeout=float(os.environ["VSQS_TEST_VT"]))
dramatiq.set_broker(broker)


def record(what, key):
    with open(os.path.join(OUT, "log"), "a") as log:  # one short O_APPEND write a line
        log.write(f"{what} {key} {os.getpid()} {time.time()!r}\\n")


def lines(what, key):
    with open(os.path.join(OUT, "log")) as log:
        return [line for line in log if line.split()[:2] == [what, str(key)]]


@dramatiq.actor
def task(key):
    record("ran", key)


@dramatiq.actor
def slow(key, seconds):
    record("start", key)
    time.sleep(seconds)
    record("ran", key)


@dramatiq.actor(max_retries=5, min_backoff=50, max_backoff=200)
def flaky(key):
    record("try", key)
    if len(lines("try", key)) < 3:
        raise RuntimeError("not yet")
    record("ran", key)


@dramatiq.actor(max_retries=0)
def doomed(key):
    record("try", key)
    raise RuntimeError("always")


@dramatiq.actor
def crash_once(key):
    record("start", key)
    marker = os.path.join(OUT, f"crashed-{key}")
    if not os.path.exists(marker):
        open(marker, "w").close()
        time.sleep(120)  # the test kills the worker meanwhile
    record("ran", key)


@dramatiq.actor
def gate(key):
    record("start", key)
    deadline = time.monotonic() + 60
    while not os.path.exists(os.path.join(OUT, "go")) and time.monotonic() < deadline:
        time.sleep(0.02)
    record("ran", key)
'''


class Run:
    """A spool, the actors module over it, and the Dramatiq workers started on it."""

    def __init__(self, tmp_path: Path) -> None:
        self.saved_environ = dict(os.environ)  # (actors() sets this run's environment)
        self.dir = tmp_path
        self.spool = tmp_path / "spool"
        (tmp_path / "actors.py").write_text(ACTORS)
        (tmp_path / "log").write_text("")
        self.processes: list[subprocess.Popen[bytes]] = []
        self.visibility_timeout = 30.0

    def __enter__(self) -> Run:
        return self

    def __exit__(self, *exc: object) -> None:
        """Kill the workers; forget the actors module, this run's environment and its broker."""
        for process in self.processes:
            self.kill(process)
        sys.modules.pop("actors", None)
        os.environ.clear()
        os.environ.update(self.saved_environ)
        broker = dramatiq.broker.global_broker
        if isinstance(broker, VsqsBroker):
            broker.close()
        dramatiq.broker.global_broker = None

    def actors(self) -> object:
        """The actors module, imported here (to send) with this run's environment."""
        os.environ.update(self.env())
        sys.path.insert(0, str(self.dir))
        try:
            sys.modules.pop("actors", None)
            import actors  # type: ignore[import-not-found]

            return actors
        finally:
            sys.path.remove(str(self.dir))

    def env(self, **extra: str) -> dict[str, str]:
        return {
            "VSQS_TEST_OUT": str(self.dir),
            "VSQS_TEST_SPOOL": str(self.spool),
            "VSQS_TEST_VT": str(self.visibility_timeout),
            **extra,
        }

    def worker(self, threads: int = 2, **env: str) -> subprocess.Popen[bytes]:
        """``dramatiq actors`` with one worker process, in a process group of its own."""
        path = os.pathsep.join([str(self.dir), str(ROOT), os.environ.get("PYTHONPATH", "")])
        stderr = open(self.dir / f"worker-{len(self.processes)}.err", "wb")  # noqa: SIM115
        with stderr:
            process = subprocess.Popen(
                [sys.executable, "-m", "dramatiq", "actors", "--processes", "1", "--threads", str(threads)],
                cwd=self.dir,
                env={**os.environ, **self.env(**env), "PYTHONPATH": path},
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                start_new_session=True,
            )
        self.processes.append(process)
        return process

    def worker_log(self) -> str:
        return "".join(p.read_text(errors="replace") for p in sorted(self.dir.glob("worker-*.err")))

    def kill(self, process: subprocess.Popen[bytes]) -> None:
        """SIGKILL the worker's whole group (its main and worker processes)."""
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait(timeout=DEADLINE)

    def lines(self, what: str) -> list[tuple[str, int, float]]:
        """(key, pid, time) of every logged line ``what``."""
        found = []
        for line in (self.dir / "log").read_text().splitlines():
            kind, key, pid, at = line.split()
            if kind == what:
                found.append((key, int(pid), float(at)))
        return found

    def count(self, what: str) -> Counter[str]:
        return Counter(key for key, _, _ in self.lines(what))

    def queue(self, name: str = "default") -> vsqs.Queue:
        return vsqs.Spool(self.spool).queue(name)

    def wait_for(self, condition: Callable[[], object], what: str) -> None:
        deadline = time.monotonic() + DEADLINE
        while not condition():
            if time.monotonic() > deadline:
                raise AssertionError(f"not within {DEADLINE} s: {what}\n--- worker log ---\n{self.worker_log()}")
            time.sleep(0.05)


@pytest.fixture
def run(tmp_path: Path) -> Iterator[Run]:
    with Run(tmp_path) as run:
        yield run


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[VsqsBroker]:
    """A broker used directly, without a worker."""
    broker = VsqsBroker(str(tmp_path / "spool"), middleware=[])
    broker.declare_queue("q")
    try:
        yield broker
    finally:
        broker.close()


def message(key: object, queue_name: str = "q") -> dramatiq.Message:  # type: ignore[type-arg]
    return dramatiq.Message(queue_name=queue_name, actor_name="a", args=(key,), kwargs={}, options={})


# -- under real workers ------------------------------------------------------------


def test_each_task_runs_exactly_once_also_one_that_outlives_its_lease(run: Run) -> None:
    run.visibility_timeout = 3.0  # the slow task runs 7 s: its lease is extended twice or more
    actors = run.actors()
    for i in range(20):
        actors.task.send(str(i))  # type: ignore[attr-defined]
    actors.slow.send("slow", 7.0)  # type: ignore[attr-defined]
    run.worker(threads=2)  # a thread stays free: a lapsed lease would start the slow task again
    expected = {str(i) for i in range(20)} | {"slow"}
    run.wait_for(lambda: set(run.count("ran")) == expected, "every task ran")
    run.wait_for(lambda: run.queue().stats().total == 0, "every message deleted")
    assert run.count("ran") == Counter({key: 1 for key in expected})
    assert run.count("start") == Counter({"slow": 1})


def test_a_delay_is_native_and_the_task_runs_after_it(run: Run) -> None:
    actors = run.actors()
    sent_at = time.time()
    actors.task.send_with_options(args=("late",), delay=2500)  # type: ignore[attr-defined]
    actors.task.send("now")  # type: ignore[attr-defined]
    queue = run.queue()
    stats = queue.stats()
    assert (stats.ready, stats.delayed) == (1, 1)  # hidden in the queue itself, not in a delay queue
    assert not [name for name in vsqs.Spool(run.spool).queues() if name.endswith(".DQ")]
    bodies = [json.loads(info.body) for info in queue.messages(bodies=True)]
    assert all("eta" not in body["options"] for body in bodies)  # no worker holds it back a second time
    run.worker()
    run.wait_for(lambda: run.count("ran")["late"], "the delayed task ran")
    (late,) = [at for key, _, at in run.lines("ran") if key == "late"]
    assert late >= sent_at + 2.5
    assert run.count("ran") == Counter({"late": 1, "now": 1})


def test_a_task_that_fails_twice_is_retried_and_ends_deleted(run: Run) -> None:
    actors = run.actors()
    actors.flaky.send("f")  # type: ignore[attr-defined]
    run.worker()
    run.wait_for(lambda: run.count("ran")["f"], "the flaky task succeeded")
    run.wait_for(lambda: run.queue().stats().total == 0, "its message deleted")
    assert run.count("try") == Counter({"f": 3})
    assert run.queue().stats().dead_lettered == 0


def test_a_task_that_fails_for_good_is_dead_lettered_and_redrive_brings_it_home(run: Run) -> None:
    actors = run.actors()
    sent = actors.doomed.send("d")  # type: ignore[attr-defined]
    worker = run.worker()
    queue = run.queue()
    run.wait_for(lambda: queue.stats().dead_lettered == 1, "the failed task dead-lettered")
    run.kill(worker)
    assert run.count("try") == Counter({"d": 1})
    assert queue.stats().total == 0
    dead_letters = queue.dead_letter_queue()
    assert dead_letters is not None
    assert dead_letters.redrive() == 1
    (info,) = queue.messages(bodies=True)
    home = dramatiq.Message.decode(info.body)
    assert (home.message_id, home.actor_name, home.args) == (sent.message_id, "doomed", ("d",))


def test_a_task_whose_worker_is_killed_runs_again_in_another_worker(run: Run) -> None:
    run.visibility_timeout = 2.0
    actors = run.actors()
    actors.crash_once.send("k")  # type: ignore[attr-defined]
    first = run.worker()
    run.wait_for(lambda: run.count("start")["k"], "the task started")
    run.kill(first)
    queue = run.queue()
    assert queue.stats().total == 1  # hidden until its lease runs out, not lost
    run.worker()
    run.wait_for(lambda: run.count("ran")["k"], "the task ran to the end in the second worker")
    run.wait_for(lambda: queue.stats().total == 0, "its message deleted")
    assert run.count("start") == Counter({"k": 2})
    assert run.count("ran") == Counter({"k": 1})
    (_, first_pid, _), (_, second_pid, _) = run.lines("start")
    assert first_pid != second_pid


def test_a_warm_shutdown_releases_the_prefetched_messages(run: Run) -> None:
    run.visibility_timeout = 600.0  # only a release can make them visible again within the test
    actors = run.actors()
    actors.gate.send("g")  # type: ignore[attr-defined]
    for key in ("q1", "q2", "q3"):
        actors.task.send(key)  # type: ignore[attr-defined]
    queue = run.queue()
    worker = run.worker(threads=1, dramatiq_queue_prefetch="4")
    run.wait_for(lambda: run.count("start")["g"] and queue.stats().in_flight == 4, "all four held, the gate running")
    worker.send_signal(signal.SIGTERM)  # the main process passes it on to its worker process, once
    run.wait_for(lambda: "Shutting down" in run.worker_log(), "the worker shutting down")
    (run.dir / "go").touch()
    assert worker.wait(timeout=DEADLINE) == 0
    ran_before = run.count("ran")
    stats = queue.stats()
    assert ran_before["g"] == 1
    assert (stats.in_flight, stats.ready) == (0, 3 - sum(ran_before[key] for key in ("q1", "q2", "q3")))
    assert stats.ready > 0, "the shutdown left no prefetched message to hand back"
    run.worker()
    run.wait_for(lambda: set(run.count("ran")) == {"g", "q1", "q2", "q3"}, "the released tasks ran")
    run.wait_for(lambda: queue.stats().total == 0, "every message deleted")
    assert run.count("ran") == Counter({"g": 1, "q1": 1, "q2": 1, "q3": 1})


# -- the broker and its consumer alone ---------------------------------------------


def test_the_consumer_never_holds_more_than_prefetch(broker: VsqsBroker) -> None:
    for i in range(10):
        broker.enqueue(message(i))
    queue = broker.queue("q")
    consumer = broker.consume("q", prefetch=3, timeout=100)
    held = []
    while len(held) < 3:
        got = next(consumer)
        assert got is not None
        held.append(got)
        assert queue.stats().in_flight <= 3
    assert next(consumer) is None  # full: it waits for an ack, then gives up
    assert queue.stats().in_flight == 3
    consumer.ack(held.pop(0))
    seen = [m.args[0] for m in held]
    for _ in range(7):
        got = next(consumer)
        assert got is not None and queue.stats().in_flight <= 3
        seen.append(got.args[0])
        consumer.ack(got)
    for got in held:
        consumer.ack(got)
    assert sorted(seen) == list(range(1, 10))
    assert next(consumer) is None
    assert queue.stats().total == 0
    consumer.close()


def test_a_full_consumer_takes_the_next_message_as_soon_as_one_is_acked(broker: VsqsBroker) -> None:
    for i in range(2):
        broker.enqueue(message(i))
    consumer = broker.consume("q", prefetch=1, timeout=20_000)
    first = next(consumer)
    assert first is not None
    acker = threading.Timer(0.2, consumer.ack, [first])
    acker.start()
    started = time.monotonic()
    second = next(consumer)
    waited = time.monotonic() - started
    acker.join()
    assert second is not None and second.args == (1,)
    assert waited < 10, "the ack did not wake the waiting consumer: it waited out its 20 s"
    consumer.ack(second)


def test_requeue_and_close_make_messages_visible_again_at_once(broker: VsqsBroker) -> None:
    for i in range(3):
        broker.enqueue(message(i))
    consumer = broker.consume("q", prefetch=3, timeout=100)
    first = next(consumer)  # the batch of three came in; two wait in the consumer
    assert first is not None
    queue = broker.queue("q")
    assert queue.stats().in_flight == 3
    consumer.requeue([first])
    consumer.close()  # gives back the two not handed out
    stats = queue.stats()
    assert (stats.ready, stats.in_flight) == (3, 0)


def test_a_body_that_is_not_a_dramatiq_message_is_dead_lettered_and_costs_nothing_else(
    broker: VsqsBroker, caplog: pytest.LogCaptureFixture
) -> None:
    queue = broker.queue("q")
    broker.enqueue(message("before"))
    queue.publish(b"not json")
    queue.publish(b'{"json": "but not a message"}')
    broker.enqueue(message("after"))
    consumer = broker.consume("q", prefetch=2, timeout=100)
    got = []
    with caplog.at_level(logging.ERROR, logger="vsqs.dramatiq"):
        while (proxy := next(consumer)) is not None:
            got.append(proxy.args[0])
            consumer.ack(proxy)
    assert got == ["before", "after"]
    assert sum("is not a Dramatiq message" in r.getMessage() for r in caplog.records) == 2
    dead_letters = queue.dead_letter_queue()
    assert dead_letters is not None
    assert sorted(info.body for info in dead_letters.messages(bodies=True)) == sorted(
        [b"not json", b'{"json": "but not a message"}']
    )
    assert queue.stats().total == 0


def test_nack_without_a_dead_letter_queue_deletes_and_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    broker = VsqsBroker(str(tmp_path / "spool"), middleware=[], queue_settings={"max_receives": None})
    try:
        with caplog.at_level(logging.WARNING, logger="vsqs.dramatiq"):
            broker.declare_queue("bare")
            broker.enqueue(message(1, "bare"))
            consumer = broker.consume("bare", prefetch=1, timeout=100)
            proxy = next(consumer)
            assert proxy is not None
            consumer.nack(proxy)
        assert broker.queue("bare").stats().total == 0
        messages = [r.getMessage() for r in caplog.records]
        assert any("has no dead-letter queue: a nacked message there is deleted" in m for m in messages)
        assert any("deleting failed message" in m for m in messages)
    finally:
        broker.close()


def test_an_ack_after_the_lease_was_lost_is_logged_not_raised(
    broker: VsqsBroker, caplog: pytest.LogCaptureFixture
) -> None:
    broker.enqueue(message(1))
    consumer = broker.consume("q", prefetch=1, timeout=100)
    proxy = next(consumer)
    assert proxy is not None
    queue = broker.queue("q")
    queue.release(proxy.received.receipt)  # as if it ran out: another consumer may have it now
    with caplog.at_level(logging.WARNING, logger="vsqs.dramatiq"):
        consumer.ack(proxy)
    assert any("lease had run out" in r.getMessage() for r in caplog.records)
    assert queue.stats().ready == 1  # still there, for whoever takes it next


def test_queue_names_that_vsqs_cannot_hold_are_refused_clearly(broker: VsqsBroker) -> None:
    for name in ("_private", "a..b", "x" * 81):
        with pytest.raises(vsqs.InvalidArgument, match="is not a vsqs queue name"):
            broker.declare_queue(name)
    with pytest.raises(vsqs.InvalidArgument, match="is not a vsqs queue name"):
        dramatiq.actor(lambda: None, queue_name="_hidden", broker=broker)
    with pytest.raises(vsqs.InvalidArgument, match="are Dramatiq's own"):
        broker.declare_queue("jobs.DQ")
    assert broker.get_declared_queues() == {"q"}


def test_no_delay_queues_and_join_waits_for_an_empty_queue(broker: VsqsBroker) -> None:
    assert broker.get_declared_delay_queues() == set()
    sent = broker.enqueue(message(1), delay=60_000)
    assert "eta" not in sent.options and sent.queue_name == "q"
    with pytest.raises(vsqs.InvalidArgument, match="delay must be at most"):
        broker.enqueue(message(2), delay=367 * 86_400_000)  # past vsqs's 366 days
    assert broker.queue("q").stats().total == 1
    with pytest.raises(dramatiq.errors.QueueJoinTimeout):
        broker.join("q", timeout=200)  # a delayed message is still work to do
    broker.flush("q")
    broker.join("q", timeout=10_000)
    assert broker.queue("q").stats().total == 0


# -- edge cases -----------------------------------------------------------------------


def test_a_message_whose_follow_up_publish_failed_is_not_deleted_by_its_ack(broker: VsqsBroker) -> None:
    """Dramatiq only logs what its middleware raises: a retry (or a pipeline's next step) that could
    not be published must not be lost with the message that the ack would delete."""
    broker.enqueue(message(1))
    consumer = broker.consume("q", prefetch=1, timeout=100)
    proxy = next(consumer)
    assert proxy is not None
    queue = broker.queue("q")
    broker.emit_before("process_message", proxy)
    queue.suspend("publish")
    with pytest.raises(vsqs.QueueSuspended):
        broker.enqueue(proxy.copy())  # the retry, as Retries' after_process_message sends it
    broker.emit_after("process_message", proxy)
    queue.resume("publish")
    consumer.ack(proxy)
    stats = queue.stats()
    assert (stats.ready, stats.in_flight) == (1, 0)  # visible again: its work is done again
    again = next(consumer)
    assert again is not None and again.message_id == proxy.message_id
    consumer.ack(again)  # this time an ack deletes
    assert queue.stats().total == 0


def test_an_ack_that_cannot_delete_now_keeps_the_message_held(broker: VsqsBroker) -> None:
    broker.enqueue(message(1))
    consumer = broker.consume("q", prefetch=1, timeout=100)
    proxy = next(consumer)
    assert proxy is not None
    queue = broker.queue("q")
    queue.suspend("delete")
    with pytest.raises(dramatiq.errors.ConnectionClosed):
        consumer.ack(proxy)  # Dramatiq tries the ack again later
    assert proxy.received in broker.lease_keeper()  # its lease still kept
    assert queue.stats().in_flight == 1
    queue.resume("delete")
    consumer.ack(proxy)
    assert queue.stats().total == 0


def test_a_body_of_dramatiqs_keys_with_wrong_types_is_set_aside(broker: VsqsBroker) -> None:
    queue = broker.queue("q")
    fields = {"queue_name": "q", "actor_name": "a", "args": [], "kwargs": {}, "options": {},
              "message_id": "m", "message_timestamp": 1}
    for wrong in ({"options": 5}, {"actor_name": ["a"]}, {"kwargs": []}, {"message_timestamp": "soon"}):
        queue.publish(json.dumps({**fields, **wrong}).encode())
    broker.enqueue(message("fine"))
    consumer = broker.consume("q", prefetch=5, timeout=100)
    proxy = next(consumer)
    assert proxy is not None and proxy.args == ("fine",)
    consumer.ack(proxy)
    assert next(consumer) is None
    assert queue.stats().total == 0
    assert queue.dead_letter_queue().stats().total == 4


def test_a_message_with_an_eta_is_delayed_in_the_queue_not_in_the_worker(broker: VsqsBroker) -> None:
    late = message("late")
    late.options["eta"] = int(time.time() * 1000) + 30 * 86_400_000  # from a broker that delays in memory
    broker.queue("q").publish(late.encode())
    broker.enqueue(message("now"))
    consumer = broker.consume("q", prefetch=1, timeout=100)
    proxy = next(consumer)
    assert proxy is not None and proxy.args == ("now",)  # the delayed one holds no prefetch slot
    consumer.ack(proxy)
    stats = broker.queue("q").stats()
    assert (stats.ready, stats.in_flight, stats.delayed) == (0, 0, 1)
    [info] = broker.queue("q").messages(bodies=True)
    assert b'"eta"' not in info.body


def test_a_queue_that_cannot_be_read_now_is_waited_out(broker: VsqsBroker, caplog: pytest.LogCaptureFixture) -> None:
    broker.enqueue(message(1))
    queue = broker.queue("q")
    queue.suspend("receive")
    consumer = broker.consume("q", prefetch=1, timeout=300)
    with caplog.at_level(logging.WARNING, logger="vsqs.dramatiq"):
        assert next(consumer) is None
        assert next(consumer) is None
    assert sum("cannot receive from" in r.getMessage() for r in caplog.records) == 1  # said once
    queue.resume("receive")
    proxy = next(consumer)
    assert proxy is not None
    consumer.ack(proxy)


def test_a_removed_queue_directory_is_made_again(broker: VsqsBroker) -> None:
    consumer = broker.consume("q", prefetch=1, timeout=200)
    shutil.rmtree(broker.queue("q").path)
    assert next(consumer) is None  # no exception into Dramatiq's consumer thread
    broker.enqueue(message(1))
    proxy = next(consumer)
    assert proxy is not None and proxy.args == (1,)
    consumer.ack(proxy)


def test_a_visibility_timeout_the_keeper_cannot_keep_is_refused(tmp_path: Path) -> None:
    for short in (0, 0.02, 0.5):
        with pytest.raises(vsqs.InvalidArgument, match="visibility_timeout must be >= 1"):
            VsqsBroker(str(tmp_path / "spool"), visibility_timeout=short)


def test_a_consumer_keeps_leases_after_the_broker_was_closed_and_used_again(tmp_path: Path) -> None:
    broker = VsqsBroker(str(tmp_path / "spool"), middleware=[], visibility_timeout=1.0)
    try:
        broker.declare_queue("q")
        consumer = broker.consume("q", prefetch=1, timeout=100)
        broker.close()  # (a test's tear-down, a worker's restart)
        broker.enqueue(message(1))
        proxy = next(consumer)
        assert proxy is not None and proxy.received in broker.lease_keeper()
        consumer.ack(proxy)
    finally:
        broker.close()
