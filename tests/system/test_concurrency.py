"""Real processes racing on one queue, released together by a start barrier."""

from __future__ import annotations

import multiprocessing
import os
import time
from collections import defaultdict

import vsqs
from tests.conftest import message_files
from tests.racing import Race, run_race


def test_four_producers_four_consumers(tmp_path):
    q = vsqs.Queue(tmp_path / "q", create=True)
    race = Race(messages=20_000, lease=1.0, abandon=0.005)
    redelivered = run_race(race, [q.path] * 4, [q.path] * 4, tmp_path)
    assert redelivered > 0  # the abandoned ones came back (so the window check ran)
    assert q.stats().total == 0 and message_files(q.path) == {}


def _create(path: str, barrier, out) -> None:
    barrier.wait()
    out.put(vsqs.Queue(path, create=True).id)


def test_racing_creators_agree_on_one_queue(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    for attempt in range(3):
        path = str(tmp_path / f"q{attempt}")
        barrier, out = ctx.Barrier(4), ctx.Queue()
        procs = [ctx.Process(target=_create, args=(path, barrier, out)) for _ in range(4)]
        for p in procs:
            p.start()
        ids = {out.get(timeout=60) for _ in procs}
        for p in procs:
            p.join(60)
        assert len(ids) == 1 and ids == {vsqs.Queue(path).id}
        assert [n for n in os.listdir(tmp_path) if "creating" in n] == []


THROTTLE = (5, 0.5)


def _throttled_receiver(path: str, barrier, out) -> None:
    q = vsqs.Queue(path)
    barrier.wait()
    log = []
    deadline = time.time() + 2.2
    while time.time() < deadline:
        before = time.time()
        m = q.receive(visibility_timeout=60)
        after = time.time()
        if m is not None:
            log.append((before, after))
        else:
            time.sleep(0.01)
    out.put(log)


def test_throttle_holds_across_four_processes(tmp_path):
    q = vsqs.Queue(tmp_path / "q", create=True)
    q.configure(throttle=THROTTLE)
    q.publish_batch([b"x"] * 200, durable=False)
    ctx = multiprocessing.get_context("spawn")
    barrier, out = ctx.Barrier(4), ctx.Queue()
    procs = [ctx.Process(target=_throttled_receiver, args=(q.path, barrier, out)) for _ in range(4)]
    for p in procs:
        p.start()
    logs = [out.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(60)
    per_window = defaultdict(int)
    received = 0
    for log in logs:
        for before, after in log:
            received += 1
            window = int(before // THROTTLE[1])
            if window == int(after // THROTTLE[1]):
                per_window[window] += 1
    assert received > THROTTLE[0]  # it did let receives through, window after window
    assert max(per_window.values()) <= THROTTLE[0], dict(per_window)


def test_four_consumers_take_runs_of_groups(tmp_path):
    from tests.racing import run_group_race

    q = vsqs.Queue(tmp_path / "q", create=True)
    for g in range(6):
        q.publish_batch([f"{g}:{n}" for n in range(40)], group=f"g{g}", durable=False)
    longer = run_group_race([q.path] * 4, tmp_path, groups=6, per_group=40)
    assert longer > 0  # runs of several messages were taken (so the checks saw them)
    assert q.stats().total == 0 and message_files(q.path) == {}
