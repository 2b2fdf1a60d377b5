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
from vsqs._gateway.console import charts, humane, records
from vsqs._gateway.console.history import History
from vsqs._gateway.console.records import DamagedRecord

T0 = 1_800_000_000.0  # a period boundary for 5 s periods


class Clock:
    """The time a History goes by, set by the test."""

    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _stats_of(spool: vsqs.Spool):
    return lambda name: spool.queue(name).stats()


def test_one_process_samples_and_every_process_reads_the_same_series(tmp_path: Path) -> None:
    spool = vsqs.Spool(tmp_path, create=True)
    queue = spool.create_queue("jobs")
    clock = Clock()
    workers = [History(vsqs.Spool(tmp_path), clock=clock) for _ in range(3)]
    for step in range(4):
        queue.publish_batch([b"x"] * 10, durable=False)
        clock.now = T0 + 5 * step + 0.1
        sampled = [worker.sample(_stats_of(spool)) for worker in workers]
        assert sampled.count(True) == 1  # one sampler per period, whoever wins
        clock.now += 0.1
        for worker in workers:
            worker.catch_up()
    series = [worker.series("jobs") for worker in workers]
    assert series[0] == series[1] == series[2]
    assert [values[0] for _, values in series[0]] == [10, 20, 30, 40]
    assert workers[0].depth_rate("jobs") == pytest.approx(30 / 15, rel=0.01)


def test_a_restarted_process_starts_empty(tmp_path: Path) -> None:
    spool = vsqs.Spool(tmp_path, create=True)
    spool.create_queue("jobs")
    clock = Clock()
    first = History(spool, clock=clock)
    for step in range(3):
        clock.now = T0 + 5 * step
        first.sample(_stats_of(spool))
    clock.now = T0 + 11
    first.catch_up()
    assert len(first) == 3
    clock.now = T0 + 12
    restarted = History(spool, clock=clock)
    restarted.catch_up()
    assert len(restarted) == 0 and restarted.series("jobs") == [] and restarted.depth_rate("jobs") is None


def test_a_record_being_written_is_read_again_later(tmp_path: Path) -> None:
    spool = vsqs.Spool(tmp_path, create=True)
    clock = Clock()
    reader = History(spool, clock=clock)
    period = int(T0 // 5)
    (tmp_path / ".records").mkdir()
    (tmp_path / ".records" / f"console.{period}").write_bytes(b"")  # created, not yet written
    clock.now = T0 + 1
    reader.catch_up()
    assert len(reader) == 0
    (tmp_path / ".records" / f"console.{period}").write_bytes(records.encode(T0, {}))
    clock.now = T0 + 6
    reader.catch_up()
    assert len(reader) == 1


def test_the_series_is_bounded(tmp_path: Path) -> None:
    spool = vsqs.Spool(tmp_path, create=True)
    spool.create_queue("jobs")
    clock = Clock()
    small = History(spool, keep=4, clock=clock)
    for step in range(10):
        clock.now = T0 + 5 * step
        small.sample(_stats_of(spool))
        clock.now += 1
        small.catch_up()
    assert len(small) == 4


P0 = int(T0 // 5)  # the period of T0


@pytest.mark.parametrize("data", [b"not json", b'{"t": 1, "queues": ' + b"[" * 100_000])
def test_a_record_that_does_not_parse_is_none(data: bytes) -> None:
    """(Being written, perhaps.) json.loads raises RecursionError, no ValueError, on the
    nested one: every page would fail."""
    assert records.decode(data, P0, 5, T0) is None


def _record(values: object = (1, 2, 3, 4, 5.5), at: object = T0 + 1, took: object = 0.5, name: str = "jobs") -> bytes:
    return json.dumps({"t": at, "d": took, "queues": {name: values}}).encode()


@pytest.mark.parametrize("data", [
    b"[]", b'{"t": 1}', b'{"t": "x", "queues": {}}', b'{"t": 1e999, "queues": {}}', b'{"t": NaN, "queues": {}}',
    _record(at=T0 - 100),  # its time is another period's
    _record(at=T0 + 1, took=12.0),  # its sampling started in an earlier period
    _record(at=T0 + 6, took=0),  # in the next period
    _record(took=-1), _record(took=True), _record(at=True),
    _record([1, 2]), _record([1, 2, 3, 4, 5, 6]), _record({"ready": 1}),
    _record([-1, 0, 0, 0, 0]), _record([1.5, 0, 0, 0, 0]), _record([True, 0, 0, 0, 0]),
    _record([2**63, 0, 0, 0, 0]), _record([1e308, 0, 0, 0, 0]), _record([0, 0, 0, "5", 0]),
    _record([0, 0, 0, None, 0]), _record([0, 0, 0, 0, -1]), _record([0, 0, 0, 0, 1e300]),
    _record(name="../up"), _record(name="x" * 100_000),
    json.dumps({"t": T0 + 1, "queues": {"jobs": [1, 2, 3, 4, 5.5]}}).encode(),  # no "d"
])
def test_a_record_that_does_not_hold_together_is_damaged(data: bytes) -> None:
    """Its time must lie in its period, its counts be integers 0 <= n < 2**63, its age a
    finite number: a record of 1 MiB of long names holds nothing, one count of 1e308 is no sample."""
    with pytest.raises(DamagedRecord):
        records.decode(data, P0, 5, T0 + 10)


def test_a_record_from_a_time_to_come_is_damaged() -> None:
    data = records.encode(T0 + 1, {})
    assert records.decode(data, P0, 5, T0 + 1 - records.SKEW) is not None  # (hosts' clocks differ a little)
    with pytest.raises(DamagedRecord, match="not come yet"):
        records.decode(data, P0, 5, T0 - records.SKEW)


def test_a_record_that_holds_together_is_a_sample() -> None:
    sample = records.decode(_record(), P0, 5, T0 + 10)
    assert sample is not None and sample.queues == {"jobs": (1, 2, 3, 4, 5.5)} and sample.took == 0.5
    assert not sample.signed


def test_only_a_record_signed_for_its_period_with_the_gateways_key_is_its_own() -> None:
    ours, theirs = records.key_of("our workers' secret"), records.key_of("another gateway's")
    stats = {"jobs": vsqs.QueueStats(5, 1, 0, 2.0, dead_lettered=0)}
    data = records.encode(T0 + 1, stats, 0.5, period=P0, key=ours)
    assert records.decode(data, P0, 5, T0 + 10, ours).signed
    assert records.decode(data, P0, 5, T0 + 10).queues["jobs"] == (5, 1, 0, 0, 2.0)  # anyone may read it
    assert not records.decode(data, P0, 5, T0 + 10, theirs).signed
    moved = records.encode(T0 + 6, stats, 0.5, period=P0, key=ours)  # last period's, planted as the next one's
    assert not records.decode(moved, P0 + 1, 5, T0 + 10, ours).signed
    changed = data.replace(b"[5,", b"[0,")
    assert records.decode(changed, P0, 5, T0 + 10, ours).queues["jobs"][0] == 0
    assert not records.decode(changed, P0, 5, T0 + 10, ours).signed


def test_a_record_planted_before_its_sampler_wrote_it_is_left_out(tmp_path: Path) -> None:
    """Only the holder of a period's claim writes its record: the holder that finds one
    there already knows it was planted."""
    spool = vsqs.Spool(tmp_path, create=True)
    spool.create_queue("jobs")
    (tmp_path / ".records").mkdir()
    (tmp_path / ".records" / f"console.{P0 + 1}").write_bytes(_record([0, 0, 0, 0, 0], at=T0 + 6))
    clock = Clock()
    sampler = History(spool, clock=clock)
    clock.now = T0 + 5.1
    assert sampler.sample(_stats_of(spool))  # its claim
    clock.now = T0 + 5.2
    sampler.catch_up()
    assert len(sampler) == 0 and sampler.damaged == 1
    assert sampler.latest("jobs") is None


def test_damaged_records_are_counted_and_logged_now_and_then(tmp_path: Path, caplog) -> None:
    spool = vsqs.Spool(tmp_path, create=True)
    (tmp_path / ".records").mkdir()
    for step in range(4):
        (tmp_path / ".records" / f"console.{P0 + step}").write_bytes(_record([-1, 0, 0, 0, 0], at=T0 + 5 * step))
    (tmp_path / ".records" / f"console.{P0 + 4}").write_bytes(b'{"t": ')  # never finished
    (tmp_path / ".records" / f"console.{P0 + 5}").write_bytes(records.encode(T0 + 25, {}))
    clock = Clock()
    reader = History(spool, clock=clock)
    clock.now = T0 + 26
    with caplog.at_level("WARNING", logger="vsqs.gateway.console"):
        reader.catch_up()
    assert len(reader) == 1 and reader.damaged == 5
    assert len(caplog.records) == 1 and "damaged" in caplog.records[0].getMessage()


def test_the_latest_sample_gives_live_counts_only_if_this_gateway_signed_it(tmp_path: Path) -> None:
    spool = vsqs.Spool(tmp_path, create=True)
    spool.create_queue("jobs")
    clock = Clock()
    workers = [History(spool, secret="shared", clock=clock) for _ in range(2)]
    stranger = History(spool, secret="another gateway's", clock=clock)
    clock.now = T0 + 0.1
    assert workers[0].sample(_stats_of(spool))
    clock.now = T0 + 0.2
    for reader in (*workers, stranger):
        reader.catch_up()
    assert workers[0].latest("jobs") is not None and workers[1].latest("jobs") is not None
    assert len(stranger) == 1 and stranger.latest("jobs") is None  # drawn in its charts, not its live counts


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
    clock = Clock(now - 1)
    sampler = History(spool, clock=clock)
    clock.now = now
    assert sampler.sample(_stats_of(spool))
    sampler.catch_up()
    queue.publish_batch([b"x"] * 3, durable=False)  # after the sample
    calls: list[str] = []
    real = vsqs.Queue.stats
    monkeypatch.setattr(vsqs.Queue, "stats", lambda self, **kw: calls.append(self.path) or real(self, **kw))
    cache = views.StatsCache(gateway, sampler, ttl=0.0)
    assert cache.get("jobs")[0].ready == 7 and calls == []  # the sample: no listing
    assert cache.get("jobs", fresh=True)[0].ready == 10 and len(calls) == 1  # the sampler's own: a listing
    cache.forget("jobs")  # an action: its result shows at once
    assert cache.get("jobs")[0].ready == 10 and len(calls) == 2
    stale = views.StatsCache(gateway, History(spool, period=0.001, clock=Clock(now - 1)), ttl=0.0)
    assert stale.get("jobs")[0].ready == 10  # no sample at hand: stats()


def test_a_missing_record_does_not_hold_back_a_later_one(tmp_path: Path) -> None:
    spool = vsqs.Spool(tmp_path, create=True)
    spool.create_queue("jobs")
    clock = Clock()
    reader = History(spool, clock=clock)
    clock.now = T0 + 6
    reader.catch_up()  # period 0: no record (nobody sampled); period 1: none yet
    clock.now = T0 + 6.5
    assert History(spool, clock=clock).sample(_stats_of(spool))  # period 1's, written late
    clock.now = T0 + 7
    reader.catch_up()
    assert len(reader) == 1


def test_slow_sampling_spaces_itself_out(tmp_path: Path) -> None:
    spool = vsqs.Spool(tmp_path, create=True)
    clock = Clock()
    reader = History(spool, secret="shared", clock=clock)
    period = int(T0 // 5)
    (tmp_path / ".records").mkdir()
    slow = records.encode(T0 + 12.5, {}, took=12.0, period=period, key=records.key_of("shared"))  # over 2 periods
    (tmp_path / ".records" / f"console.{period}").write_bytes(slow)
    clock.now = T0 + 13
    reader.catch_up()
    assert len(reader) == 1 and list(reader)[0].took == 12.0
    tries = []
    for step in range(1, 7):
        clock.now = T0 + 5 * step + 0.1
        tries.append(reader.sample(_stats_of(spool)))
    assert tries == [period_ % 3 == 0 for period_ in range(period + 1, period + 7)]  # one period in three



def test_a_planted_record_of_a_slow_sampling_does_not_space_the_sampling_out(tmp_path: Path) -> None:
    """A record that holds together but was not signed by this gateway, of a sampling that
    'took' 65 s: the gateway still samples every period (else one in 13)."""
    spool = vsqs.Spool(tmp_path, create=True)
    clock = Clock()
    sampler = History(spool, clock=clock)
    (tmp_path / ".records").mkdir()
    (tmp_path / ".records" / f"console.{P0}").write_bytes(records.encode(T0 + 65, {}, took=65.0))
    clock.now = T0 + 5.1
    sampler.catch_up()
    assert len(sampler) == 1 and not list(sampler)[0].signed
    tries = []
    for step in range(1, 7):
        clock.now = T0 + 5 * step + 0.1
        tries.append(sampler.sample(_stats_of(spool)))
    assert tries == [True] * 6


def test_a_record_the_exclusive_create_made_though_it_answered_exists_is_the_samplers_own(tmp_path: Path,
                                                                                         monkeypatch) -> None:
    """On NFS a retransmitted O_EXCL create can answer EEXIST after the first one made the
    file: the sampler reads the record back before it calls it planted."""
    spool = vsqs.Spool(tmp_path, create=True)
    spool.create_queue("jobs")
    real = vsqs.Spool.put_record
    monkeypatch.setattr(vsqs.Spool, "put_record", lambda self, *args, **kw: real(self, *args, **kw) and False)
    clock = Clock()
    sampler = History(spool, clock=clock)
    clock.now = T0 + 0.1
    assert sampler.sample(_stats_of(spool))
    sampler.catch_up()
    assert len(sampler) == 1 and sampler.damaged == 0 and sampler.latest("jobs") is not None


def test_gateways_sampling_at_other_intervals_on_one_spool_lose_no_sample_and_the_log_says_why(
        tmp_path: Path, caplog) -> None:
    """A gateway sampling every 5 s removes the claims of one sampling every 10 s (its
    periods are numbered otherwise), so a second worker of the latter claims a period its
    first has sampled already: the record is theirs (signed with their key), not planted."""
    spool = vsqs.Spool(tmp_path, create=True)
    spool.create_queue("jobs")
    clock = Clock()
    fast = History(vsqs.Spool(tmp_path), 5, secret="fast", clock=clock)
    slow = [History(vsqs.Spool(tmp_path), 10, secret="slow", clock=clock) for _ in range(2)]
    with caplog.at_level("WARNING", logger="vsqs.gateway.console"):
        for step in range(1, 13):
            clock.now = T0 + 5 * step + 0.05
            if step % 2 == 0:
                assert slow[0].sample(_stats_of(spool))
            clock.now += 0.001
            fast.sample(_stats_of(spool))
            clock.now += 0.001
            if step % 2 == 0:
                assert slow[1].sample(_stats_of(spool))  # its claim: the first one's was removed
            clock.now += 0.01
            for history in (fast, *slow):
                history.catch_up()
    assert [history.damaged for history in (fast, *slow)] == [0, 0, 0]
    assert len(fast) == 12 and len(slow[0]) == len(slow[1]) == 6
    assert "--console-interval" in caplog.records[0].getMessage() and len(caplog.records) == 1


def _planted_app(tmp_path: Path, values: list, at_of, monkeypatch, periods_ago: int = 0):
    """A gateway app on a spool whose queue 'jobs' holds 5 ready messages, with records
    planted by a spool writer from ``periods_ago`` on and for the coming hour; its
    console's history started ``periods_ago`` periods ago."""
    import functools
    import time

    from vsqs._gateway.app import create_app
    from vsqs._gateway.config import GatewayConfig
    from vsqs._gateway.console import routes

    spool = vsqs.Spool(tmp_path, create=True)
    spool.create_queue("jobs").publish_batch([b"x"] * 5, durable=False)
    (tmp_path / ".records").mkdir(exist_ok=True)
    current = int(time.time() // 5)
    for period in range(current - periods_ago, current + 720):
        record = {"t": at_of(period), "d": 0, "queues": {"jobs": values}}
        (tmp_path / ".records" / f"console.{period}").write_text(json.dumps(record))
    clock = Clock((current - periods_ago) * 5)  # when the console's history starts
    monkeypatch.setattr(routes, "History", functools.partial(History, clock=clock))
    app = create_app(GatewayConfig(spool=str(tmp_path), gc_interval=0))
    clock.now = time.time()
    return app


def _get(app, *paths: str) -> list:
    import asyncio

    import httpx

    async def get() -> list:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://127.0.0.1") as client:
            return [await client.get(path) for path in paths]

    return asyncio.run(get())


@pytest.mark.parametrize("at_of", [lambda period: 1e10, lambda period: period * 5 + 4.9],
                         ids=["from-the-future", "in-its-period"])
def test_planted_records_never_give_the_live_counts(tmp_path: Path, at_of, monkeypatch) -> None:
    """Records planted ahead for the coming periods (0 ready: the first writer of a
    period's record wins) never stand in for the counts the queue itself gives."""
    app = _planted_app(tmp_path, [0, 0, 0, 0, 0], at_of, monkeypatch)
    overview, numbers = _get(app, "/ui/api/overview", "/ui/api/queues/jobs")
    assert overview.status_code == numbers.status_code == 200
    assert overview.json()["queues"][0]["raw"]["ready"] == 5
    assert numbers.json()["queues"][0]["raw"]["ready"] == 5


def test_a_record_out_of_bounds_is_shown_as_damaged(tmp_path: Path, monkeypatch) -> None:
    """A count of 1e308, planted in two records (so that the depth has a rate), is no
    error of the live refresh: the records are left out, and the page says so."""
    app = _planted_app(tmp_path, [1e308, 1e308, 0, 0, 0], lambda period: period * 5 + 4.9, monkeypatch,
                       periods_ago=1)
    overview, page = _get(app, "/ui/api/overview", "/ui")
    assert overview.status_code == 200, overview.text
    assert overview.json()["queues"][0]["raw"]["ready"] == 5
    assert overview.json()["queues"][0]["raw"]["rate"] is None  # nothing drawn from the damaged records
    assert overview.json()["history"] == 0 and overview.json()["damaged"] >= 2
    assert page.status_code == 200 and "unreadable" in page.text
