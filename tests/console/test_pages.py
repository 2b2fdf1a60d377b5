"""The console's pages and actions, through a real `vsqs serve` with no API key
(the loopback default)."""

from __future__ import annotations

import os
import re

import pytest

pytest.importorskip("fastapi", reason="the gateway needs the server extra: pip install 'vsqs[server]'")
pytest.importorskip("jinja2", reason="the console needs the server extra: pip install 'vsqs[server]'")

import vsqs
from tests.conftest import message_dirs
from tests.console.helpers import ConsoleClient, cell
from tests.gateway.server import running_gateway


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    spool = str(tmp_path_factory.mktemp("console") / "spool")
    os.mkdir(spool)
    # no sampling: counts come from stats() at once, never from a sample a few seconds old
    with running_gateway(spool, "--console-interval", "0") as server:
        yield server


@pytest.fixture
def console(server):
    client = ConsoleClient(server.url)
    yield client
    client.close()


@pytest.fixture
def name(request, server):
    """A fresh queue for each test, named after it."""
    queue = request.node.name.replace("[", "-").replace("]", "")[:60].strip("-_.")
    vsqs.Spool(server.spool).create_queue(queue)
    yield queue
    try:
        vsqs.Spool(server.spool).delete_queue(queue)
    except vsqs.QueueNotFound:
        pass


def fresh(server, queue: str) -> vsqs.Queue:
    """A new handle (its settings read from disk now)."""
    return vsqs.Spool(server.spool).queue(queue)


def test_the_overview_shows_every_queue_and_its_counts(server, console, name):
    queue = fresh(server, name)
    for i in range(7):
        queue.publish(f"m{i}", durable=False)
    queue.publish("later", delay=600, durable=False)
    queue.receive(visibility_timeout=600)
    page = console.get("/ui")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert (cell(page.text, name, "ready"), cell(page.text, name, "in_flight"),
            cell(page.text, name, "delayed")) == (6, 1, 1)
    assert f'href="/ui/queues/{name}"' in page.text
    assert 'id="history-note"' in page.text and "--console-interval 0" in page.text


def test_the_live_numbers_follow_publishes(server, console, name):
    def ready() -> int:
        numbers = console.get("/ui/api/overview").json()
        (row,) = [q for q in numbers["queues"] if q["name"] == name]
        return int(row["raw"]["ready"])

    assert ready() == 0
    fresh(server, name).publish_batch([b"x"] * 1500, durable=False)
    # the console keeps stats 2 s: the queue's own JSON is looked at after an action forgets them
    numbers = console.get(f"/ui/api/queues/{name}").json()["queues"][0]
    assert numbers["raw"]["ready"] in (0, 1500)
    console.act(name, "publish", body="one more")
    numbers = console.get(f"/ui/api/queues/{name}").json()["queues"][0]
    assert numbers["raw"]["ready"] == 1501 and numbers["text"]["ready"] == "1.5k"


def test_sorting_and_the_filter(server, console, name):
    other = name[:50] + "-other"
    vsqs.Spool(server.spool).create_queue(other).publish_batch([b"x"] * 3, durable=False)
    try:
        page = console.get("/ui", params={"filter": "-other"}).text
        assert f'data-queue="{other}"' in page and f'data-queue="{name}"' not in page
        page = console.get("/ui", params={"sort": "ready", "desc": 1}).text
        names = re.findall(r'<tr data-queue="([^"]+)"', page)
        readies = [cell(page, queue, "ready") for queue in names]
        assert readies == sorted(readies, reverse=True)
        assert 'aria-sort="descending"' in page
    finally:
        vsqs.Spool(server.spool).delete_queue(other)


def test_a_queue_page_pages_through_messages_in_order_without_changing_them(server, console, name):
    queue = fresh(server, name)
    queue.publish_batch([f"m{i}".encode() for i in range(120)], durable=False)
    queue.receive(visibility_timeout=600)
    before = sorted(entry for place in message_dirs(queue.path) for entry in os.listdir(place))
    seen: list[str] = []
    after = None
    for _ in range(5):
        params = {"limit": 50, **({"after": after} if after else {})}
        page = console.get(f"/ui/queues/{name}", params=params).text
        seen += re.findall(r'<tr data-message="([^"]+)"', page)
        found = re.search(r'href="\?after=([^&"]+)&amp;limit=50[^"]*" id="next-page"', page)
        if not found:
            break
        after = found[1]
    assert seen == [m.id for m in queue.messages()] and len(seen) == 120
    assert 'data-state="in_flight"' in console.get(f"/ui/queues/{name}").text
    after_pages = sorted(entry for place in message_dirs(queue.path) for entry in os.listdir(place))
    assert after_pages == before


def test_a_missing_queue_is_a_404_page(console):
    page = console.get("/ui/queues/no-such-queue")
    assert page.status_code == 404 and 'id="missing"' in page.text


# -- actions ---------------------------------------------------------------------


def test_publish_and_delete_one_message(server, console, name):
    answer = console.act(name, "publish", body="hello", priority="7")
    assert answer.status_code == 303 and answer.headers["location"] == f"/ui/queues/{name}?notice=published"
    refused = console.act(name, "publish", body="x", priority="7", group="g1")  # (no priority in a group)
    assert refused.status_code == 422 and 'id="error"' in refused.text
    assert console.act(name, "publish", body="grouped", group="g1").status_code == 303
    info, grouped = fresh(server, name).messages(limit=10, preview=100)
    assert (info.body, info.priority, grouped.body, grouped.group) == (b"hello", 7, b"grouped", "g1")
    assert console.act(name, "delete", id=grouped.id).status_code == 303
    answer = console.act(name, "delete", id=info.id)
    assert answer.headers["location"].endswith("notice=deleted")
    assert fresh(server, name).stats().total == 0
    assert console.act(name, "delete", id=info.id).headers["location"].endswith("notice=gone")


def test_suspend_and_resume(server, console, name):
    assert console.act(name, "suspend").status_code == 303
    assert fresh(server, name).settings["suspended"] == ["delete", "publish", "receive"]
    page = console.get(f"/ui/queues/{name}").text
    assert 'id="suspended-tag"' in page and 'id="resume-form"' in page
    with pytest.raises(vsqs.QueueSuspended):
        fresh(server, name).publish("x")
    assert console.act(name, "resume").status_code == 303
    assert fresh(server, name).settings["suspended"] == []


def test_purge_needs_the_queue_name_typed(server, console, name):
    fresh(server, name).publish_batch([b"x"] * 5, durable=False)
    refused = console.act(name, "purge", confirm=name.upper() + "x")
    assert refused.status_code == 422 and "type the queue" in refused.text
    assert fresh(server, name).stats().ready == 5
    done = console.act(name, "purge", confirm=name)
    assert done.headers["location"] == f"/ui/queues/{name}?notice=purged&n=5"
    assert fresh(server, name).stats().total == 0
    assert "Purged 5 messages." in console.get(done.headers["location"]).text


def test_redrive_all_or_up_to_n(server, console, name):
    queue = vsqs.Spool(server.spool).create_queue(name, max_receives=1, visibility_timeout=0)
    queue.publish_batch([b"x"] * 5, durable=False)
    for _ in range(5):
        assert queue.receive() is not None
    assert queue.receive() is None  # each was received once: the next look buries them
    dlq = f"{name}.dlq"
    try:
        assert fresh(server, dlq).stats().ready == 5
        page = console.get(f"/ui/queues/{name}").text
        assert 'id="redrive-form"' in page and f'data-dlq="{dlq}"' in page
        assert console.act(dlq, "redrive", max_messages="2").headers["location"].endswith("notice=redriven&n=2")
        assert (fresh(server, name).stats().ready, fresh(server, dlq).stats().ready) == (2, 3)
        assert console.act(dlq, "redrive", max_messages="0").status_code == 422
        assert console.act(dlq, "redrive").headers["location"].endswith("n=3")
        assert (fresh(server, name).stats().ready, fresh(server, dlq).stats().ready) == (5, 0)
    finally:
        vsqs.Spool(server.spool).delete_queue(dlq)


def test_settings_are_validated_as_the_api_validates_them(server, console, name):
    saved = console.act(name, "settings", visibility_timeout="45", throttle="10/1", max_receives="3",
                        dead_letter="")
    assert saved.headers["location"].endswith("notice=saved")
    settings = fresh(server, name).settings
    assert (settings["visibility_timeout"], settings["throttle"], settings["max_receives"]) == (45.0, [10, 1.0], 3)
    for field, bad in (("visibility_timeout", "abc"), ("visibility_timeout", "99999999"),
                       ("dead_letter", "../elsewhere"), ("throttle", "1/2/3"), ("max_receives", "-1")):
        refused = console.act(name, "settings", **{field: bad})
        assert refused.status_code == 422, (field, bad)
        assert 'id="error"' in refused.text
    assert fresh(server, name).settings["visibility_timeout"] == 45.0
    assert console.act(name, "settings", visibility_timeout="45").headers["location"].endswith("notice=unchanged")


def settings_form(page: str) -> list[tuple[str, str, str]]:
    """The settings form's inputs: (type, name, the rest of the tag)."""
    form = page[page.index('id="settings-form"'):]
    form = form[:form.index("</form>")]
    return re.findall(r'<input type="(text|checkbox)" id="setting-([a-z_]+)" name="\2"([^>]*)>', form)


# the console's order of the settings it edits: the three timings a client leaves to the queue first
CONSOLE_ORDER = ["visibility_timeout", "delay", "receive_wait", "retention", "max_messages", "max_message_bytes",
                 "max_receives", "dead_letter", "group_concurrency", "dedup_window", "content_dedup", "throttle"]


def test_the_settings_form_has_a_row_for_each_editable_setting(server, console, name):
    """In the console's order, but suspended (its own buttons); a flag as a checkbox."""
    from vsqs._core.settings import SCHEMA

    fresh(server, name).configure(throttle="5/2", content_dedup=True)
    inputs = settings_form(console.get(f"/ui/queues/{name}").text)
    assert [key for _, key, _ in inputs] == CONSOLE_ORDER
    assert sorted(CONSOLE_ORDER) == sorted(key for key, setting in SCHEMA.items()
                                           if setting.editable and key != "suspended")
    kinds = {key: kind for kind, key, _ in inputs}
    assert {key for key, kind in kinds.items() if kind == "checkbox"} == {"content_dedup"}
    shown = {key: rest for _, key, rest in inputs}
    assert 'value="5/2"' in shown["throttle"] and 'placeholder="N/seconds"' in shown["throttle"]
    assert 'value="30"' in shown["visibility_timeout"] and 'inputmode="decimal"' in shown["visibility_timeout"]
    assert 'value=""' in shown["dead_letter"] and 'inputmode="text"' in shown["dead_letter"]
    assert " checked" in shown["content_dedup"]


def test_saving_the_form_keeps_what_it_shows_exactly(server, console, name):
    """A browser sends back every field as shown: changing only the delay keeps
    the others as they were, to the last digit (six significant digits once
    showed retention 1234567 as 1.23457e+06, and a throttle of 10^6 receives as
    1e+06/60, which the form refused)."""
    kept = {"retention": 1234567.0, "visibility_timeout": 0.1234567, "dedup_window": 1234567.0,
            "throttle": [1000000, 60.0], "max_message_bytes": 2**40}
    fresh(server, name).configure(**kept)
    inputs = settings_form(console.get(f"/ui/queues/{name}").text)
    shown = {key: re.search(r'value="([^"]*)"', rest)[1] for kind, key, rest in inputs if kind == "text"}
    assert (shown["retention"], shown["visibility_timeout"], shown["throttle"]) == ("1234567", "0.1234567",
                                                                                   "1000000/60")
    saved = console.act(name, "settings", **{**shown, "delay": "5"})
    assert saved.status_code == 303 and saved.headers["location"].endswith("notice=saved"), saved.text
    settings = fresh(server, name).settings
    assert {key: settings[key] for key in kept} == kept and settings["delay"] == 5.0
    assert console.act(name, "settings", **{**shown, "delay": "5"}).headers["location"].endswith("notice=unchanged")


def test_an_editable_flag_has_a_default():
    """The console shows a flag as a checkbox, which has no third state: an
    unchecked box saves false, so an editable flag that may be unset (a default
    of None) would be set to false by every save of the form."""
    from vsqs._core.settings import SCHEMA

    unset = [key for key, setting in SCHEMA.items() if setting.editable and setting.kind == "flag"
             and setting.default is None]
    assert not unset, f"{unset}: a checkbox cannot leave a flag unset (make its default true or false)"


def test_groups_on_demand(server, console, name):
    queue = fresh(server, name)
    queue.publish_batch([vsqs.Outgoing(b"x", group="a")] * 3 + [vsqs.Outgoing(b"y", group="b")], durable=False)
    queue.receive(visibility_timeout=600)
    page = console.get(f"/ui/queues/{name}").text
    assert 'id="show-groups"' in page and 'id="groups"' not in page
    page = console.get(f"/ui/queues/{name}", params={"groups": 1}).text
    rows = re.findall(r'<tr data-group="([^"]+)"><th scope="row">[^<]*</th><td class="num">(\d+)</td>'
                      r'<td class="num">(\d+)</td>', page)
    assert rows == [("a", "2", "1"), ("b", "1", "0")]
