"""The console's history (sampled by one process, shared through the spool's
records, in memory from each process's start), its charts, its numbers for
people, and what refreshing the overview costs the spool."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the gateway needs the server extra: pip install 'vsqs[server]'")
pytest.importorskip("jinja2", reason="the console needs the server extra: pip install 'vsqs[server]'")

import vsqs
from vsqs._gateway.console import charts, history, humane
from vsqs._gateway.console.history import History

T0 = 1_800_000_000.0  # a period boundary for 5 s periods


def _stats_of(spool: vsqs.Spool):
    return lambda name: spool.queue(name).stats()


def test_one_process_samples_and_every_process_reads_the_same_series(tmp_path: Path) -> None:
    spool = vsqs.Spool(tmp_path, create=True)
    queue = spool.create_queue("jobs")
    workers = [History(vsqs.Spool(tmp_path), now=T0) for _ in range(3)]
    for step in range(4):
        queue.publish_batch([b"x"] * 10, durable=False)
        now = T0 + 5 * step + 0.1
        sampled = [worker.sample(_stats_of(spool), now=now) for worker in workers]
        assert sampled.count(True) == 1  # one sampler per period, whoever wins
        for worker in workers:
            worker.catch_up(now=now + 0.1)
    series = [worker.series("jobs") for worker in workers]
    assert series[0] == series[1] == series[2]
    assert [values[0] for _, values in series[0]] == [10, 20, 30, 40]
    assert workers[0].depth_rate("jobs") == pytest.approx(30 / 15, rel=0.01)


def test_a_restarted_process_starts_empty(tmp_path: Path) -> None:
    spool = vsqs.Spool(tmp_path, create=True)
    spool.create_queue("jobs")
    first = History(spool, now=T0)
    for step in range(3):
        first.sample(_stats_of(spool), now=T0 + 5 * step)
    first.catch_up(now=T0 + 11)
    assert len(first) == 3
    restarted = History(spool, now=T0 + 12)
    restarted.catch_up(now=T0 + 12)
    assert len(restarted) == 0 and restarted.series("jobs") == [] and restarted.depth_rate("jobs") is None


def test_a_record_being_written_is_read_again_later(tmp_path: Path) -> None:
    spool = vsqs.Spool(tmp_path, create=True)
    reader = History(spool, now=T0)
    period = int(T0 // 5)
    (tmp_path / ".records").mkdir()
    (tmp_path / ".records" / f"console.{period}").write_bytes(b"")  # created, not yet written
    reader.catch_up(now=T0 + 1)
    assert len(reader) == 0
    (tmp_path / ".records" / f"console.{period}").write_bytes(history.encode(T0, {}))
    reader.catch_up(now=T0 + 6)
    assert len(reader) == 1


def test_the_series_is_bounded(tmp_path: Path) -> None:
    spool = vsqs.Spool(tmp_path, create=True)
    spool.create_queue("jobs")
    small = History(spool, keep=4, now=T0)
    for step in range(10):
        small.sample(_stats_of(spool), now=T0 + 5 * step)
        small.catch_up(now=T0 + 5 * step + 1)
    assert len(small) == 4


@pytest.mark.parametrize("data", [b"not json", b"[]", b'{"t": "x", "queues": {}}', b'{"t": 1}',
                                  b'{"t": 1, "queues": {"q": [1, 2]}}', b'{"t": 1e999, "queues": {}}'])
def test_a_hostile_record_is_skipped(data: bytes) -> None:
    sample = history.decode(data)
    assert sample is None or sample.queues == {}


def test_a_record_nested_thousands_deep_is_skipped() -> None:
    """json.loads raises RecursionError, no ValueError, on it: every page would fail."""
    assert history.decode(b'{"t": 1, "queues": ' + b"[" * 100_000) is None


def test_a_record_holds_queue_names_only() -> None:
    """A hostile record of 1 MiB of long names, one a period, must not hold an hour of them in memory."""
    names = {"jobs": [1, 2, 3, 4, 5], "x" * 100_000: [1, 2, 3, 4, 5], "../up": [1, 2, 3, 4, 5]}
    sample = history.decode(json.dumps({"t": 1, "queues": names}).encode())
    assert sample is not None and list(sample.queues) == ["jobs"]


def test_a_count_past_a_floats_range_is_no_error() -> None:
    """The queue page shows its notice's count from the query (?notice=purged&n=...): any int."""
    assert humane.count(10**400) == "–" and humane.count(-(10**400)) == "–"


def test_charts_are_numbers_only() -> None:
    series = [(T0 + 5 * i, (float(i), 1.0, 0.0, 2.0, 0.0)) for i in range(10)]
    spark = charts.sparkline(series, T0 + 50)
    assert spark and set(spark) <= set("0123456789., ")
    chart = charts.depth_chart(series, T0 + 50)
    assert not chart.empty and [state for state, _ in chart.lines] == ["ready", "in_flight", "delayed",
                                                                        "dead_lettered"]
    assert charts.sparkline(series[:1], T0 + 50) == "" and charts.depth_chart([], T0).empty


def test_a_short_history_spans_the_whole_sparkline() -> None:
    """After a restart, 45 s of samples fill the box from its left edge, not the
    last 45/3600 of it (a sliver that looked like no chart at all)."""
    series = [(T0 + 5 * i, (float(i), 0.0, 0.0, 0.0, 0.0)) for i in range(10)]
    xs = [float(point.split(",")[0]) for point in charts.sparkline(series, T0 + 45).split()]
    assert xs[0] == 0.0 and xs[-1] == float(charts.SPARK_WIDTH)


def test_numbers_for_people() -> None:
    assert [humane.count(n) for n in (0, 950, 1200, 35_000, 1_234_567, None)] == ["0", "950", "1.2k", "35k",
                                                                                   "1.2M", "–"]
    assert humane.duration(180) == "3 min" and humane.ago(T0 - 180, now=T0) == "3 min ago"
    assert humane.ago(T0 + 20, now=T0) == "in 20 s" and humane.size(1229) == "1.2 KiB"
    assert humane.rate(0.5) == "+30/min" and humane.rate(-12) == "-12/s" and humane.rate(None) == "–"
    assert humane.plain("a\x1b[0m\u202eb\nc") == "a\\x1b[0m\\u202eb\\nc"
    assert humane.body_view(b"\xff\x00")[0] == "hex"
    assert humane.body_view("é".encode()[:1])[0] == "hex"
    assert humane.body_view(b"ok " + "é".encode()[:1], cut=True) == ("text", [("text", "ok ")])  # cut mid-character


def test_refreshing_the_overview_costs_one_stats_per_queue(tmp_path: Path, monkeypatch) -> None:
    import asyncio

    import httpx

    from vsqs._gateway.app import create_app
    from vsqs._gateway.config import GatewayConfig

    spool = vsqs.Spool(tmp_path, create=True)
    for i in range(5):
        spool.create_queue(f"q{i}").publish_batch([b"x"] * 20, durable=False)
    calls: list[str] = []
    real = vsqs.Queue.stats
    monkeypatch.setattr(vsqs.Queue, "stats", lambda self, **kw: calls.append(self.path) or real(self, **kw))
    from vsqs._gateway.console import views

    monkeypatch.setattr(views.StatsCache.__init__, "__defaults__", (3600.0,))  # no time passes for the cache
    app = create_app(GatewayConfig(spool=str(tmp_path), gc_interval=0))

    async def refresh() -> None:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://127.0.0.1") as client:
            assert (await client.get("/ui")).status_code == 200
            assert len(calls) == 5
            for _ in range(3):  # more refreshes within the cache's time: no more listings
                assert (await client.get("/ui/api/overview")).status_code == 200
                assert (await client.get("/ui")).status_code == 200
            assert len(calls) == 5

    asyncio.run(refresh())


def test_the_page_says_when_there_is_no_history(tmp_path: Path) -> None:
    import asyncio

    import httpx

    from vsqs._gateway.app import create_app
    from vsqs._gateway.config import GatewayConfig

    vsqs.Spool(tmp_path, create=True).create_queue("jobs")

    async def note(interval: float) -> str:
        app = create_app(GatewayConfig(spool=str(tmp_path), gc_interval=0, console_interval=interval))
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://127.0.0.1") as client:
            page = (await client.get("/ui/queues/jobs")).text
        return page[page.index('id="history-note"'):][:300]

    assert "No history yet" in asyncio.run(note(5.0)) and "starts empty after" in asyncio.run(note(5.0))
    assert "--console-interval 0" in asyncio.run(note(0.0))


def test_pages_read_counts_from_a_fresh_sample_and_fresh_stats_after_an_action(tmp_path: Path, monkeypatch) -> None:
    import time

    from vsqs._gateway.config import GatewayConfig
    from vsqs._gateway.console import views
    from vsqs._gateway.state import Gateway

    spool = vsqs.Spool(tmp_path, create=True)
    queue = spool.create_queue("jobs")
    queue.publish_batch([b"x"] * 7, durable=False)
    gateway = Gateway(GatewayConfig(spool=str(tmp_path), gc_interval=0))
    now = time.time()
    sampler = History(spool, now=now - 1)
    assert sampler.sample(_stats_of(spool), now=now)
    sampler.catch_up(now=now)
    queue.publish_batch([b"x"] * 3, durable=False)  # after the sample
    calls: list[str] = []
    real = vsqs.Queue.stats
    monkeypatch.setattr(vsqs.Queue, "stats", lambda self, **kw: calls.append(self.path) or real(self, **kw))
    cache = views.StatsCache(gateway, sampler, ttl=0.0)
    assert cache.get("jobs")[0].ready == 7 and calls == []  # the sample: no listing
    assert cache.get("jobs", fresh=True)[0].ready == 10 and len(calls) == 1  # the sampler's own: a listing
    cache.forget("jobs")  # an action: its result shows at once
    assert cache.get("jobs")[0].ready == 10 and len(calls) == 2
    stale = views.StatsCache(gateway, History(spool, period=0.001, now=now - 1), ttl=0.0)
    assert stale.get("jobs")[0].ready == 10  # no sample at hand: stats()


def test_a_missing_record_does_not_hold_back_a_later_one(tmp_path: Path) -> None:
    spool = vsqs.Spool(tmp_path, create=True)
    spool.create_queue("jobs")
    reader = History(spool, now=T0)
    reader.catch_up(now=T0 + 6)  # period 0: no record (nobody sampled); period 1: none yet
    assert History(spool, now=T0).sample(_stats_of(spool), now=T0 + 6.5)  # period 1's, written late
    reader.catch_up(now=T0 + 7)
    assert len(reader) == 1


def test_slow_sampling_spaces_itself_out(tmp_path: Path) -> None:
    spool = vsqs.Spool(tmp_path, create=True)
    reader = History(spool, now=T0)
    period = int(T0 // 5)
    (tmp_path / ".records").mkdir()
    slow = history.encode(T0 + 1, {}, took=12.0)  # a sampling that took more than two periods
    (tmp_path / ".records" / f"console.{period}").write_bytes(slow)
    reader.catch_up(now=T0 + 2)
    assert len(reader) == 1 and list(reader)[0].took == 12.0
    tries = [reader.sample(_stats_of(spool), now=T0 + 5 * step + 0.1) for step in range(1, 7)]
    assert tries == [period_ % 3 == 0 for period_ in range(period + 1, period + 7)]  # one period in three
