"""The console's sign-in, session cookie and CSRF checks, in a real browser
against a ``vsqs serve`` that has an API key. What only a browser does is
what these look at: the cookie attributes it stores and sends, the
``Origin`` and ``Sec-Fetch-Site`` it sets, a form another site submits.
Every refusal is checked on the spool too: the queue is still whole.
"""

from __future__ import annotations

from typing import Any

import vsqs
from tests.console.conftest import API_KEY
from tests.gateway.server import Server

try:
    from playwright.sync_api import expect
except ImportError:  # the browser fixture skips (or, with BROWSER_REQUIRED=1, fails) every test
    expect = None

EVIL_ORIGIN = "http://evil.example"  # served by the browser context's router: no network, no DNS


def fresh(gateway: Server, name: str, messages: int) -> vsqs.Queue:
    queue = vsqs.Spool(gateway.spool).create_queue(name)
    for n in range(messages):
        queue.publish(b"m%d" % n)
    return queue


def session_cookie(page: Any) -> dict[str, Any] | None:
    """The console's session cookie the browser holds, if any."""
    found = [cookie for cookie in page.context.cookies() if cookie["name"] == "vsqs_console"]
    assert len(found) <= 1
    return dict(found[0]) if found else None


def sign_in(page: Any, key: str = API_KEY) -> None:
    page.locator("#login-key").fill(key)
    page.locator("#login-form button").click()


def test_the_console_asks_for_the_key_and_keeps_an_httponly_strict_session(
        keyed_page: Any, keyed_gateway: Server, shoot: Any) -> None:
    page = keyed_page
    fresh(keyed_gateway, "behind-key", 1)
    page.goto("/ui/queues/behind-key")
    expect(page.locator("#login-form")).to_be_visible()
    expect(page.locator("#queues, #messages")).to_have_count(0)  # nothing of the spool before signing in
    shoot(page, "sign-in")
    sign_in(page, "not-the-key")
    expect(page.locator("#login-error")).to_be_visible()
    shoot(page, "wrong-key")
    before = session_cookie(page)  # the signed-out session that carries the sign-in form's token
    sign_in(page)
    expect(page.locator("body")).to_have_attribute("data-queue-page", "behind-key")  # back where it was going
    cookie = session_cookie(page)
    assert before is None or cookie["value"] != before["value"]  # a new session at sign-in (no fixation)
    assert cookie["httpOnly"] is True
    assert cookie["sameSite"] == "Strict"
    assert cookie["path"] == "/ui"
    assert API_KEY not in cookie["value"]
    assert "vsqs_console" not in page.evaluate("document.cookie")  # out of any script's reach
    shoot(page, "signed-in")
    page.locator("#logout-form button").click()
    expect(page.locator("#login-form")).to_be_visible()
    page.goto("/ui")
    expect(page.locator("#login-form")).to_be_visible()


def test_the_session_opens_the_console_not_the_api(keyed_page: Any, keyed_gateway: Server) -> None:
    """The cookie is the console's (Path=/ui): the native API still wants the key."""
    page = keyed_page
    page.goto("/ui")
    sign_in(page)
    expect(page.locator("body")).to_have_attribute("data-page", "overview")
    status = page.evaluate("fetch('/queues').then(r => r.status)")
    assert status == 401


def forge(page: Any, path: str, fields: dict[str, str]) -> int:
    """POST ``fields`` as a form from the page's own origin, with its cookie: what a
    script injected into the console could send. Returns the status."""
    return int(page.evaluate(
        """([path, fields]) => fetch(path, {method: 'POST', credentials: 'same-origin', redirect: 'manual',
                                             body: new URLSearchParams(fields)}).then(r => r.status)""",
        [path, fields]))


def test_an_action_without_its_csrf_token_is_refused(keyed_page: Any, keyed_gateway: Server) -> None:
    page = keyed_page
    queue = fresh(keyed_gateway, "forged-at", 3)
    page.goto("/ui/queues/forged-at")
    sign_in(page)
    expect(page.locator("#purge-form")).to_be_visible()
    token = page.locator('#purge-form input[name="csrf"]').input_value()
    assert token
    assert forge(page, "/ui/queues/forged-at/purge", {"confirm": "forged-at"}) == 403
    assert forge(page, "/ui/queues/forged-at/purge", {"confirm": "forged-at", "csrf": "0" * len(token)}) == 403
    assert forge(page, "/ui/queues/forged-at/suspend", {"csrf": token[:-1]}) == 403
    assert queue.stats().ready == 3
    assert not vsqs.Spool(keyed_gateway.spool).queue("forged-at").settings["suspended"]
    # the control: the same request with the page's token is taken
    assert forge(page, "/ui/queues/forged-at/purge", {"confirm": "forged-at", "csrf": token}) in (200, 303, 0)
    assert queue.stats().ready == 0


def test_a_form_another_site_submits_is_refused_even_with_a_valid_token(
        keyed_page: Any, keyed_gateway: Server, shoot: Any) -> None:
    """A signed-in operator visits another site, whose page submits the purge
    form to the console, even with the right token (say it leaked): the
    browser's Origin gives it away, and the queue stays whole."""
    page = keyed_page
    queue = fresh(keyed_gateway, "cross-site", 2)
    page.goto("/ui/queues/cross-site")
    sign_in(page)
    token = page.locator('#purge-form input[name="csrf"]').input_value()
    page.context.route(EVIL_ORIGIN + "/**", lambda route: route.fulfill(status=200, content_type="text/html", body=f"""
        <form id=f method=post action="{keyed_gateway.url}/ui/queues/cross-site/purge">
        <input name=csrf value="{token}"><input name=confirm value=cross-site></form>"""))
    page.goto(EVIL_ORIGIN + "/")
    with page.expect_navigation() as navigation:
        page.eval_on_selector("#f", "form => form.submit()")
    response = navigation.value
    assert response is not None and response.status == 403
    shoot(page, "cross-site-purge-refused")
    assert queue.stats().ready == 2


def test_an_action_before_signing_in_is_refused(keyed_page: Any, keyed_gateway: Server, shoot: Any) -> None:
    """No session, no action, whatever the form carries."""
    page = keyed_page
    queue = fresh(keyed_gateway, "no-session", 1)
    page.goto("/ui/login")
    token = page.locator('#login-form input[name="csrf"]').input_value()
    assert forge(page, "/ui/queues/no-session/purge", {"confirm": "no-session", "csrf": token}) in (401, 403)
    assert queue.stats().ready == 1
