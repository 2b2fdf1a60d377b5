"""The console driven in a real headless Chromium against a real ``vsqs serve``
(no API key: the loopback default): the overview and its live numbers, a
queue's page, peeking, and the actions, each checked on the spool through
the library afterwards. The hooks (ids, data attributes) are those
docs/console.md keeps stable. Every page a test looks at is saved as a
screenshot (tests/console/conftest.py says where).

Waits are on what the page must come to show (Playwright's ``expect``, with
a generous deadline), never a sleep: the live numbers are polled by the
page every few seconds, however slow the machine.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

import vsqs
from tests.gateway.server import Server

try:
    from playwright.sync_api import expect
except ImportError:  # the browser fixture skips (or, with BROWSER_REQUIRED=1, fails) every test
    expect = None


def spool(gateway: Server) -> vsqs.Spool:
    return vsqs.Spool(gateway.spool)


def fresh(gateway: Server, name: str, **settings: Any) -> vsqs.Queue:
    """A new, empty queue ``name`` on the gateway's spool."""
    assert name not in spool(gateway), f"{name} exists: each test takes names of its own"
    return spool(gateway).create_queue(name, **settings)


def reopened(gateway: Server, name: str) -> vsqs.Queue:
    """A new handle on queue ``name``: it reads the settings the console just
    wrote, where an older handle may keep its cached ones for a second."""
    return spool(gateway).queue(name)


def row(page: Any, name: str) -> Any:
    return page.locator(f'#queues tr[data-queue="{name}"]')


def count(scope: Any, key: str) -> Any:
    return scope.locator(f'[data-count="{key}"]')


def kill_once(queue: vsqs.Queue) -> None:
    """Receive one message and let it go back unacknowledged, so that a
    queue with ``max_receives=1`` dead-letters it at the next receive."""
    received = queue.receive(visibility_timeout=0)
    assert received is not None


def dead_letter(queue: vsqs.Queue, bodies: list[bytes]) -> None:
    """Publish ``bodies`` to ``queue`` (``max_receives=1``) and let each die."""
    for body in bodies:
        queue.publish(body)
    for _ in bodies:
        kill_once(queue)
    assert queue.receive(visibility_timeout=0) is None  # the next receive moved them to the DLQ


def test_the_overview_lists_the_queues_and_follows_publishes_live(page: Any, gateway: Server, shoot: Any) -> None:
    orders = fresh(gateway, "orders")
    fresh(gateway, "emails").publish(b"hello")
    page.goto("/ui")
    expect(page.locator("body")).to_have_attribute("data-page", "overview")
    expect(count(row(page, "orders"), "ready")).to_have_text("0")
    expect(count(row(page, "emails"), "ready")).to_have_text("1")
    shoot(page, "overview")
    page.evaluate("window.__same_page = true")  # gone if the page reloads: the update must be live
    for _ in range(3):
        orders.publish(b"order")
    expect(count(row(page, "orders"), "ready")).to_have_text("3")
    expect(count(row(page, "orders"), "ready")).to_have_attribute("data-value", "3")
    assert page.evaluate("window.__same_page") is True
    expect(page.locator("[data-live-status]")).to_contain_text("updated")
    shoot(page, "overview-after-publishes")


def test_open_a_queue_and_peek_its_messages_without_changing_them(page: Any, gateway: Server, shoot: Any) -> None:
    queue = fresh(gateway, "peeked")
    ids = [queue.publish(f"message {n}".encode(), attributes={"n": str(n)}) for n in range(3)]
    page.goto("/ui")
    page.locator('a[data-queue-link="peeked"]').click()
    expect(page.locator("body")).to_have_attribute("data-queue-page", "peeked")
    messages = page.locator("#messages tr[data-message]")
    expect(messages).to_have_count(3)
    assert [messages.nth(n).get_attribute("data-message") for n in range(3)] == ids  # in delivery order
    expect(messages.first).to_have_attribute("data-state", "ready")
    expect(messages.first.locator('[data-body="text"]')).to_have_text("message 0")
    expect(messages.first.locator("[data-attributes]")).to_contain_text("n=0")
    shoot(page, "queue-page")
    page.reload()  # peeking twice
    expect(messages).to_have_count(3)
    stats = queue.stats()
    assert (stats.ready, stats.in_flight) == (3, 0)  # nothing was received
    assert [m.id for m in queue.receive_batch(10, visibility_timeout=60)] == ids  # nor moved nor reordered


def test_page_through_messages_and_delete_one(page: Any, gateway: Server, shoot: Any) -> None:
    queue = fresh(gateway, "paged")
    ids = queue.publish_batch([b"m%d" % n for n in range(55)])
    page.goto("/ui/queues/paged")
    rows = page.locator("#messages tr[data-message]")
    expect(rows).to_have_count(50)
    page.locator("#next-page").click()
    expect(rows).to_have_count(5)
    assert [rows.nth(n).get_attribute("data-message") for n in range(5)] == ids[50:]
    expect(page.locator("#next-page")).to_have_count(0)
    shoot(page, "second-page")
    page.locator(f'tr[data-message="{ids[52]}"] .delete-form button').click()
    expect(page.locator("#notice")).to_be_visible()
    expect(page.locator(f'tr[data-message="{ids[52]}"]')).to_have_count(0)
    assert [m.id for m in queue.messages()] == ids[:52] + ids[53:]  # that one gone, the others as they were


def test_redrive_a_dead_letter_queue(page: Any, gateway: Server, shoot: Any) -> None:
    dlq = fresh(gateway, "jobs-dead")
    jobs = fresh(gateway, "jobs", dead_letter="jobs-dead", max_receives=1)
    dead_letter(jobs, [b"a", b"b", b"c"])
    assert (jobs.stats().ready, dlq.stats().ready) == (0, 3)
    page.goto("/ui")
    expect(count(row(page, "jobs"), "dead_lettered")).to_have_text("3")
    page.locator('a[data-dlq="jobs-dead"]').click()
    expect(page.locator("body")).to_have_attribute("data-queue-page", "jobs-dead")
    expect(page.locator("#dlq-tag")).to_contain_text("jobs")
    expect(page.locator("#messages tr[data-message]")).to_have_count(3)
    page.locator("#redrive-max").fill("2")  # up to N first...
    page.locator("#redrive-form button").click()
    expect(page.locator("#notice")).to_be_visible()
    shoot(page, "after-redrive-of-2")
    assert (jobs.stats().ready, dlq.stats().ready) == (2, 1)
    expect(page.locator("#messages tr[data-message]")).to_have_count(1)
    page.locator("#redrive-form button").click()  # ...then all
    expect(page.locator("#no-messages")).to_be_visible()
    assert (jobs.stats().ready, dlq.stats().ready) == (3, 0)
    assert sorted(m.body for m in jobs.receive_batch(10)) == [b"a", b"b", b"c"]


def test_purge_needs_the_queue_name_typed(page: Any, gateway: Server, shoot: Any) -> None:
    queue = fresh(gateway, "to-purge")
    for n in range(5):
        queue.publish(b"x%d" % n)
    page.goto("/ui/queues/to-purge")
    purge = page.locator("#purge-form button")
    expect(purge).to_be_disabled()
    page.locator("#purge-confirm").fill("to-purg")  # not quite
    expect(purge).to_be_disabled()
    page.locator("#purge-confirm").fill("to-purge")
    expect(purge).to_be_enabled()
    shoot(page, "purge-confirmed")
    purge.click()
    expect(page.locator("#notice")).to_be_visible()
    expect(page.locator("#no-messages")).to_be_visible()
    assert queue.stats().ready == 0


def test_purge_with_a_wrong_name_is_refused_by_the_server(page: Any, gateway: Server, shoot: Any) -> None:
    """The disabled button is a convenience: with it forced, the server still
    refuses a purge whose typed name is not the queue's."""
    queue = fresh(gateway, "kept")
    queue.publish(b"keep me")
    page.goto("/ui/queues/kept")
    page.locator("#purge-confirm").fill("nope")
    page.eval_on_selector("#purge-form button", "button => { button.disabled = false; }")
    page.locator("#purge-form button").click()
    expect(page.locator("#error")).to_be_visible()
    shoot(page, "purge-refused")
    assert queue.stats().ready == 1


def test_suspend_and_resume(page: Any, gateway: Server, shoot: Any) -> None:
    queue = fresh(gateway, "pausable")
    page.goto("/ui/queues/pausable")
    page.locator("#suspend-form button").click()
    expect(page.locator("#suspended-tag")).to_be_visible()
    expect(page.locator("#resume-form")).to_be_visible()
    shoot(page, "suspended")
    with pytest.raises(vsqs.QueueSuspended):
        reopened(gateway, "pausable").publish(b"while suspended")
    page.goto("/ui")
    expect(count(row(page, "pausable"), "suspended")).to_contain_text("publish")
    expect(row(page, "pausable")).to_have_class(re.compile(r"\bsuspended\b"))
    page.goto("/ui/queues/pausable")
    page.locator("#resume-form button").click()
    expect(page.locator("#suspend-form")).to_be_visible()
    expect(page.locator("#suspended-tag")).to_have_count(0)
    reopened(gateway, "pausable").publish(b"after resume")
    assert queue.stats().ready == 1


HOSTILE = ("<script>window.__pwned = 'script'</script>"
           "<img src=x onerror=\"window.__pwned = 'img'\">"
           "<svg onload=\"window.__pwned = 'svg'\"></svg>")


def test_a_hostile_body_is_shown_as_text_and_runs_nothing(page: Any, gateway: Server, shoot: Any) -> None:
    queue = fresh(gateway, "hostile")
    queue.publish(HOSTILE.encode(), group="<b>group</b>", attributes={"note": "<i>it</i><script>1</script>"})
    page.goto("/ui/queues/hostile")
    message = page.locator("#messages tr[data-message]")
    expect(message).to_have_count(1)
    expect(message.locator('[data-body="text"]')).to_have_text(HOSTILE)  # shown, as text
    expect(message.locator("[data-group]")).to_have_text("<b>group</b>")
    expect(message.locator("[data-attributes]")).to_contain_text("note=<i>it</i><script>1</script>")
    assert message.locator("script, img, svg, b, i").count() == 0  # no element came from the message
    assert page.evaluate("window.__pwned") is None  # and nothing of it ran
    shoot(page, "hostile-body")


def test_keyboard_alone_reaches_and_uses_the_actions(page: Any, gateway: Server) -> None:
    """From the top of a queue's page, Tab reaches every action's button, and
    a button pressed with the keyboard acts."""
    queue = fresh(gateway, "by-keyboard")
    page.goto("/ui/queues/by-keyboard")
    expect(page.locator("#suspend-form button")).to_be_visible()
    wanted = {"#suspend-form button", "#purge-confirm", "#publish-body", "#publish-form button"}
    reached: set[str] = set()
    for _ in range(60):  # a bound on the walk, not a timing
        page.keyboard.press("Tab")
        for selector in wanted - reached:
            if page.locator(selector).evaluate("el => el === document.activeElement"):
                reached.add(selector)
        if reached == wanted:
            break
    assert reached == wanted, f"Tab never reached {sorted(wanted - reached)}"
    page.locator("#publish-body").focus()
    page.keyboard.type("typed, not clicked")
    page.locator("#publish-form button").focus()
    page.keyboard.press("Enter")
    expect(page.locator("#messages tr[data-message]")).to_have_count(1)
    assert [m.body for m in queue.receive_batch(10, visibility_timeout=60)] == [b"typed, not clicked"]


def test_the_slash_key_focuses_the_filter(page: Any, gateway: Server) -> None:
    fresh(gateway, "filter-me")
    page.goto("/ui")
    expect(row(page, "filter-me")).to_be_visible()
    page.keyboard.press("/")
    expect(page.locator("#filter")).to_be_focused()
    page.keyboard.type("no-queue-has-this")
    expect(row(page, "filter-me")).to_be_hidden()


def no_page_wide_scroll(page: Any) -> bool:
    """True when the page itself is no wider than the screen (wide tables
    may scroll within their own box)."""
    return bool(page.evaluate("document.documentElement.scrollWidth <= window.innerWidth + 1"))


def test_readable_on_a_narrow_screen(narrow_page: Any, gateway: Server, shoot: Any) -> None:
    queue = fresh(gateway, "a-queue-with-a-rather-long-name-for-a-phone")
    queue.publish(b"x" * 300)
    narrow_page.goto("/ui")
    expect(row(narrow_page, "a-queue-with-a-rather-long-name-for-a-phone")).to_be_attached()
    shoot(narrow_page, "overview-narrow")
    assert no_page_wide_scroll(narrow_page)
    narrow_page.goto("/ui/queues/a-queue-with-a-rather-long-name-for-a-phone")
    expect(narrow_page.locator("#messages tr[data-message]")).to_have_count(1)
    shoot(narrow_page, "queue-narrow")
    assert no_page_wide_scroll(narrow_page)
    message = narrow_page.locator("#messages tr[data-message]")
    id_lines = message.locator("code.id").evaluate("el => el.getClientRects().length")
    assert id_lines <= 2, f"a message id is broken over {id_lines} lines: the table is squeezed, not scrolled"
    body_width = message.locator('[data-body="text"]').evaluate("el => el.getBoundingClientRect().width")
    assert body_width >= 100, f"the body preview is {body_width}px wide: the table is squeezed, not scrolled"
    delete = message.locator(".delete-form button")
    delete.scroll_into_view_if_needed()  # the table scrolls within its box to its last column
    expect(delete).to_be_in_viewport()
    font = narrow_page.eval_on_selector("body", "el => parseFloat(getComputedStyle(el).fontSize)")
    assert font >= 14, f"body text of {font}px is too small to read on a phone"
