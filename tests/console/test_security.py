"""Who may use the console and what a hostile queue can do to its pages:
sign-in, sessions, CSRF tokens, origins and hosts, escaping, the CSP. Each
test fails if the check it is about is taken away."""

from __future__ import annotations

import os
import re

import pytest

pytest.importorskip("fastapi", reason="the gateway needs the server extra: pip install 'vsqs[server]'")
pytest.importorskip("jinja2", reason="the console needs the server extra: pip install 'vsqs[server]'")

import httpx

import vsqs
from tests.console.helpers import ConsoleClient
from tests.gateway.server import running_gateway
from vsqs._gateway.console.session import SESSION_SECONDS, Sessions

KEY = "console-test-key-0123456789"
HOSTILE = "<script>alert(1)</script>\x1b[2J\u202egnp.exe<img src=x onerror=alert(2)>"


@pytest.fixture(scope="module")
def open_server(tmp_path_factory):
    spool = str(tmp_path_factory.mktemp("console-open") / "spool")
    os.mkdir(spool)
    with running_gateway(spool) as server:
        yield server


@pytest.fixture(scope="module")
def keyed_server(tmp_path_factory):
    spool = str(tmp_path_factory.mktemp("console-keyed") / "spool")
    os.mkdir(spool)
    with running_gateway(spool, env={"VSQS_API_KEY": KEY}) as server:
        yield server


@pytest.fixture
def console(open_server):
    client = ConsoleClient(open_server.url)
    yield client
    client.close()


@pytest.fixture
def name(request, open_server):
    queue = request.node.name.replace("[", "-").replace("]", "")[:60].strip("-_.")
    vsqs.Spool(open_server.spool).create_queue(queue)
    yield queue
    vsqs.Spool(open_server.spool).delete_queue(queue)


def suspended(server, queue: str) -> list[str]:
    return list(vsqs.Spool(server.spool).queue(queue).settings["suspended"])


# -- CSRF, origins, hosts --------------------------------------------------------


def test_an_action_without_its_token_is_refused(open_server, console, name):
    good = console.token(f"/ui/queues/{name}")  # the visitor has a session
    for token in (None, "", "0" * 64, good + "0", good[:-1]):
        fields = {"confirm": "x"} if token is None else {"csrf": token}
        answer = console.post(f"/ui/queues/{name}/suspend", fields)
        assert answer.status_code == 403 and 'id="refused"' in answer.text, token
    assert suspended(open_server, name) == []
    assert console.act(name, "suspend").status_code == 303  # with it: done
    assert suspended(open_server, name) != []


def test_a_token_of_another_session_is_refused(open_server, console, name):
    other = ConsoleClient(open_server.url)
    try:
        stolen = other.token(f"/ui/queues/{name}")
        console.token(f"/ui/queues/{name}")
        assert console.post(f"/ui/queues/{name}/suspend", {"csrf": stolen}).status_code == 403
        assert suspended(open_server, name) == []
    finally:
        other.close()


@pytest.mark.parametrize("headers", [{"Origin": "http://evil.example"}, {"Sec-Fetch-Site": "cross-site"},
                                     {"Origin": "null"}, {"Sec-Fetch-Site": "same-site"}])
def test_no_action_from_another_origin(open_server, console, name, headers):
    token = console.token(f"/ui/queues/{name}")  # even with a good session and token
    answer = console.post(f"/ui/queues/{name}/suspend", {"csrf": token}, origin=None, headers=headers)
    assert answer.status_code == 403
    assert suspended(open_server, name) == []


def test_a_host_the_server_was_not_started_for_is_refused(open_server, console):
    assert console.get("/ui", headers={"Host": "rebound.example"}).status_code == 421


def test_the_form_must_be_a_form(open_server, console, name):
    token = console.token(f"/ui/queues/{name}")
    answer = console.http.post(f"/ui/queues/{name}/suspend", json={"csrf": token},
                               headers={"Origin": open_server.url})
    assert answer.status_code == 415 and suspended(open_server, name) == []


# -- escaping and the CSP ----------------------------------------------------------


def test_a_hostile_message_is_shown_inert(open_server, console, name):
    queue = vsqs.Spool(open_server.spool).queue(name)
    queue.publish(HOSTILE, attributes={"x": HOSTILE}, group=HOSTILE[:100], durable=False)
    queue.publish(b"\xff\xfe<script>alert(3)</script>", durable=False)
    for path in (f"/ui/queues/{name}", f"/ui/queues/{name}?groups=1", f"/ui/queues/{name}?hex=1", "/ui"):
        page = console.get(path).text
        assert "<script>alert" not in page and "<img" not in page, path
        assert "\x1b" not in page and "\u202e" not in page, path
        assert not re.search(r"<script(?![^>]*\bsrc=\"/ui/static/console\.js\")", page), path
    page = console.get(f"/ui/queues/{name}").text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert '<span class="ctl">\\x1b</span>' in page and '<span class="ctl">\\u202e</span>' in page
    assert 'data-body="hex">ff fe 3c 73' in page  # not UTF-8: hex


def test_console_pages_carry_a_csp_without_inline_script(open_server, console, name):
    for path in ("/ui", f"/ui/queues/{name}", "/ui/queues/none-such", "/ui/api/overview"):
        answer = console.get(path)
        policy = answer.headers["content-security-policy"]
        assert "script-src 'self'" in policy and "unsafe-inline" not in policy and "default-src 'none'" in policy
        assert answer.headers["x-frame-options"] == "DENY"
        assert " style=" not in answer.text  # no inline style either
        assert not re.search(r"<[a-z]+[^>]*\son[a-z]+=", answer.text), path  # no inline handlers
    assert console.get("/ui/static/console.js").headers["content-type"].startswith("text/javascript")
    assert console.get("/ui/static/nothing.js").status_code == 404
    assert console.get("/ui/static/..%2fsession.py").status_code == 404


def test_every_console_answer_carries_the_csp_errors_too(open_server, console, name):
    """Not only the pages: the router's 404, 405 and 422, the guard's refusals, static files."""
    answers = [console.get("/ui/static/console.css"), console.get("/ui/static/nothing.js"),
               console.get("/ui/no-such-page"), console.get(f"/ui/queues/{name}/purge"),
               console.get(f"/ui/queues/{name}?limit=many"),
               console.get("/ui", headers={"Sec-Fetch-Site": "cross-site"}),
               console.post(f"/ui/queues/{name}/suspend", {}, origin="https://evil.example")]
    assert [a.status_code for a in answers] == [200, 404, 404, 405, 422, 403, 403]
    for answer in answers:
        assert "default-src 'none'" in answer.headers.get("content-security-policy", ""), answer.request.url
        assert answer.headers["x-frame-options"] == "DENY" and answer.headers["x-content-type-options"] == "nosniff"
    assert answers[1].headers["cache-control"] == "no-store"
    assert console.get("/ui/static/console.css").headers["cache-control"] == "max-age=300"
    assert "content-security-policy" not in console.get("/healthz").headers  # the API's own answers as they were


# -- with an API key: sign-in and sessions -------------------------------------------


def test_with_a_key_the_console_asks_for_it(keyed_server):
    client = ConsoleClient(keyed_server.url)
    try:
        first = client.get("/ui/queues/x?limit=5")
        assert first.status_code == 303 and first.headers["location"].startswith("/ui/login?next=")
        assert client.get("/ui/api/overview").status_code == 401
        assert client.get("/queues").status_code == 401  # the API still wants the key itself
        token = client.token("/ui/login")
        wrong = client.post("/ui/login", {"csrf": token, "key": KEY + "x", "next": "/ui"})
        assert wrong.status_code == 401 and 'id="login-error"' in wrong.text
        assert client.get("/ui").status_code == 303
        assert client.post("/ui/login", {"key": KEY, "next": "/ui"}).status_code == 403  # no token: no sign-in
        right = client.post("/ui/login", {"csrf": client.token("/ui/login"), "key": KEY, "next": "//evil.example"})
        assert right.status_code == 303 and right.headers["location"] == "/ui"
        cookie = right.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie.replace("Strict", "strict")
        assert "Path=/ui" in cookie and "Max-Age=" in cookie
        assert client.get("/ui").status_code == 200
        assert client.get("/ui/api/overview").status_code == 200
    finally:
        client.close()


def test_an_anonymous_session_cannot_act_when_a_key_is_set(keyed_server):
    vsqs.Spool(keyed_server.spool).create_queue("guarded")
    client = ConsoleClient(keyed_server.url)
    try:
        token = client.token("/ui/login")  # an anonymous session's own, valid token
        answer = client.post("/ui/queues/guarded/suspend", {"csrf": token})
        assert answer.status_code == 401
        assert vsqs.Spool(keyed_server.spool).queue("guarded").settings["suspended"] == []
    finally:
        client.close()


def test_a_forged_or_tampered_cookie_is_no_session(keyed_server):
    client = ConsoleClient(keyed_server.url)
    try:
        right = client.post("/ui/login", {"csrf": client.token("/ui/login"), "key": KEY, "next": "/ui"})
        value = re.search(r"vsqs_console=([^;]+)", right.headers["set-cookie"])[1]
        assert client.get("/ui").status_code == 200
        _kind, expires, nonce, signature = value.split(".")
        for forged in (f"k.{int(expires) + 9999}.{nonce}.{signature}", f"k.{expires}.{nonce}.{'0' * 64}",
                       f"k.{expires}.{'f' * 32}.{signature}", "k.1.2.3", "x" * 300):
            client.http.cookies.clear()
            client.http.cookies.set("vsqs_console", forged, path="/ui")
            assert client.get("/ui").status_code == 303, forged
    finally:
        client.close()


def test_sessions_expire_and_signing_in_gives_a_new_nonce():
    sessions = Sessions("key", "secret")
    anonymous, cookie = sessions.new(signed_in=False, now=1000.0)
    assert sessions.read(cookie, now=1000.0 + SESSION_SECONDS - 1) == anonymous
    assert sessions.read(cookie, now=1000.0 + SESSION_SECONDS) is None
    assert not sessions.may_act(anonymous)
    signed, signed_cookie = sessions.new(signed_in=True, now=1000.0)
    assert signed.nonce != anonymous.nonce and sessions.may_act(sessions.read(signed_cookie, now=1001.0))
    assert Sessions("other key", "secret").read(signed_cookie, now=1001.0) is None  # a new key signs out
    assert Sessions("key", "another start").read(signed_cookie, now=1001.0) is None  # so does a restart
    assert sessions.csrf_ok(signed, sessions.csrf_token(signed))
    assert not sessions.csrf_ok(signed, sessions.csrf_token(anonymous))
    assert Sessions(None, "s").may_act(Sessions(None, "s").new(signed_in=False)[0])  # no key: anyone local


def test_a_session_holds_across_workers(tmp_path):
    """With --workers 2 every worker accepts the session another signed: they
    share the signing secret (drawn at start, passed in the private config)."""
    spool = tmp_path / "spool"
    spool.mkdir()
    with running_gateway(str(spool), "--workers", "2", env={"VSQS_API_KEY": KEY}) as server:
        client = ConsoleClient(server.url)
        try:
            right = client.post("/ui/login", {"csrf": client.token("/ui/login"), "key": KEY, "next": "/ui"})
            assert right.status_code == 303
            cookie = re.search(r"vsqs_console=([^;]+)", right.headers["set-cookie"])[1]
            for _ in range(20):  # a new connection each time: the kernel hands them to either worker
                with httpx.Client(base_url=server.url, headers={"Connection": "close"}) as fresh:
                    fresh.cookies.set("vsqs_console", cookie, path="/ui")
                    assert fresh.get("/ui", follow_redirects=False).status_code == 200
        finally:
            client.close()
