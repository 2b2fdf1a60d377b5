"""The gateway's housekeeping: a periodic garbage collection of the
spool, claimed by one process per period among all gateways on the spool,
counted in /metrics. Real `vsqs serve` processes on loopback; short
intervals through --gc-interval; every wait polls for the outcome with a
bounded deadline (the tests fail only if it never comes)."""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

import vsqs
from tests.gateway.server import running_gateway
from vsqs._core import format as _format

pytestmark = pytest.mark.timeout(180)

_DEADLINE = 90.0  # seconds to wait for an outcome that should come within a few periods
_INTERVAL = "0.2"


def _wait_for(what: str, check: Callable[[], bool]) -> None:
    deadline = time.monotonic() + _DEADLINE
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"never happened: {what}")
        time.sleep(0.05)


def _message_files(queue_dir: Path) -> list[str]:
    return [name for name in os.listdir(queue_dir) if _format.parse_name(name) is not None]


def _metric(url: str, name: str) -> float:
    text = httpx.get(url + "/metrics", timeout=30).text
    found = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
    return float(found[1]) if found else 0.0


def _spool(tmp_path: Path) -> vsqs.Spool:
    return vsqs.Spool(tmp_path / "spool", create=True)


def test_a_message_past_retention_disappears_without_vsqs_gc(tmp_path: Path) -> None:
    spool = _spool(tmp_path)
    queue = spool.create_queue("orders", retention=0.5)
    queue.publish(b"stale")
    queue_dir = Path(spool.path("orders"))
    assert len(_message_files(queue_dir)) == 1
    with running_gateway(spool.root, "--gc-interval", _INTERVAL, log_dir=str(tmp_path)) as server:
        _wait_for("the message past retention removed", lambda: not _message_files(queue_dir))
        _wait_for("the sweep counted in /metrics",
                  lambda: _metric(server.url, "vsqs_gateway_gc_removed_total") >= 1)
        assert _metric(server.url, "vsqs_gateway_gc_runs_total") >= 1
        assert _metric(server.url, "vsqs_gateway_gc_last_run_timestamp_seconds") > 0


def test_workers_sweep_and_their_metrics_add_up(tmp_path: Path) -> None:
    spool = _spool(tmp_path)
    queue = spool.create_queue("orders", retention=0.5)
    queue.publish_batch([b"stale"] * 3)
    queue_dir = Path(spool.path("orders"))
    with running_gateway(spool.root, "--gc-interval", _INTERVAL, "--workers", "2", log_dir=str(tmp_path)) as server:
        _wait_for("the messages past retention removed", lambda: not _message_files(queue_dir))
        _wait_for("the removals counted in /metrics",
                  lambda: _metric(server.url, "vsqs_gateway_gc_removed_total") >= 3)
        assert _metric(server.url, "vsqs_gateway_gc_last_run_timestamp_seconds") > 0


@pytest.mark.parametrize("damage", [b"{not json", b"[" * 5000 + b"]" * 5000], ids=["torn", "nested"])
def test_a_failing_queue_does_not_stop_the_sweep(tmp_path: Path, damage: bytes) -> None:
    spool = _spool(tmp_path)
    spool.create_queue("a-broken")
    (Path(spool.path("a-broken")) / _format.METADATA_NAME).write_bytes(damage)
    with pytest.raises(vsqs.VsqsError):
        spool.queue("a-broken").collect_garbage()
    good = spool.create_queue("b-good", retention=0.5)
    good.publish(b"stale")
    good_dir = Path(spool.path("b-good"))
    with running_gateway(spool.root, "--gc-interval", _INTERVAL, log_dir=str(tmp_path)) as server:
        _wait_for("the good queue collected past the broken one", lambda: not _message_files(good_dir))
        _wait_for("the broken queue counted", lambda: _metric(server.url, "vsqs_gateway_gc_errors_total") >= 1)
        assert "a-broken" in server.log()
        for page in ("/metrics", "/ui", "/ui/queues/b-good"):  # the other queues are shown as ever
            assert httpx.get(server.url + page, timeout=30, follow_redirects=True).status_code == 200, page


def test_two_gateways_on_one_spool_sweep_each_period_once(tmp_path: Path) -> None:
    spool = _spool(tmp_path)
    spool.create_queue("orders")
    args = ("--gc-interval", _INTERVAL, "--console-interval", "0", "--log-level", "info")  # (gc's claims only)
    sweep = re.compile(r"housekeeping: period (\d+) of ")
    with running_gateway(spool.root, *args, log_dir=str(tmp_path)) as one, \
            running_gateway(spool.root, *args, log_dir=str(tmp_path)) as two:

        def periods() -> tuple[list[int], list[int]]:
            return [int(p) for p in sweep.findall(one.log())], [int(p) for p in sweep.findall(two.log())]

        _wait_for("ten periods swept", lambda: len(set(sum(periods(), []))) >= 10)
        first, second = periods()
        assert len(first) == len(set(first)) and len(second) == len(set(second))
        assert not set(first) & set(second), "a period swept by both gateways"
        runs = _metric(one.url, "vsqs_gateway_gc_runs_total") + _metric(two.url, "vsqs_gateway_gc_runs_total")
        after_first, after_second = periods()
        assert len(first) + len(second) <= runs <= len(after_first) + len(after_second)
    claims = os.listdir(Path(spool.root) / _format.CLAIMS_DIR)
    assert len(claims) <= 3, claims  # the winners swept the tokens of old periods


def test_gc_interval_zero_disables_the_sweep(tmp_path: Path) -> None:
    spool = _spool(tmp_path)
    spool.create_queue("orders")
    with running_gateway(spool.root, "--gc-interval", "0", "--console-interval", "0", log_dir=str(tmp_path)) as server:
        assert _metric(server.url, "vsqs_gateway_gc_runs_total") == 0
        assert httpx.get(server.url + "/healthz", timeout=30).status_code == 200
    assert not (Path(spool.root) / _format.CLAIMS_DIR).exists()


# -- the library's primitive ---------------------------------------------------


def test_claim_period_has_exactly_one_winner_per_period(tmp_path: Path) -> None:
    spools = [_spool(tmp_path) for _ in range(8)]
    now = 1_700_000_000.0
    wins: list[bool] = []
    start = threading.Barrier(len(spools))

    def claim(spool: vsqs.Spool) -> None:
        start.wait()
        wins.append(spool.claim_period("gc", 60, now=now))

    threads = [threading.Thread(target=claim, args=(spool,)) for spool in spools]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(wins) == [False] * 7 + [True]
    assert spools[0].claim_period("gc", 60, now=now + 60)  # the next period is free again
    assert spools[0].claim_period("other", 60, now=now)  # tasks do not share periods
    assert spools[0].queues() == []  # the claims are no queue


def test_claim_period_sweeps_old_tokens_and_checks_its_arguments(tmp_path: Path) -> None:
    spool = _spool(tmp_path)
    for k in range(5):
        assert spool.claim_period("gc", 10, now=1000.0 + 10 * k)
    assert sorted(os.listdir(Path(spool.root) / _format.CLAIMS_DIR)) == ["gc.103", "gc.104"]
    for task in ("", "GC", "../x", "gc.1", "x" * 33, 1):
        with pytest.raises(vsqs.InvalidArgument):
            spool.claim_period(task, 10)  # type: ignore[arg-type]
    for seconds in (0, -1, float("inf"), float("nan"), True, "10"):
        with pytest.raises(vsqs.InvalidArgument):
            spool.claim_period("gc", seconds)  # type: ignore[arg-type]


# -- the queue handles a gateway keeps ---------------------------------------------


def test_the_gateway_keeps_a_bounded_number_of_queue_handles(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from vsqs._gateway import state
    from vsqs._gateway.config import GatewayConfig

    monkeypatch.setattr(state, "MAX_HANDLES", 2)
    spool = vsqs.Spool(tmp_path, create=True)
    for name in "abc":
        spool.create_queue(name)
    gateway = state.Gateway(GatewayConfig(spool=str(tmp_path)))
    a = gateway.queue("a")
    assert gateway.queue("a") is a  # kept
    b = gateway.queue("b")
    gateway.queue("a")  # used lately: kept over b
    gateway.queue("c")  # a third: the least lately used, b, is forgotten
    assert gateway.queue("a") is a
    assert gateway.queue("b") is not b  # opened again
