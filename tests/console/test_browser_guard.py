"""What a real browser can be made to send to the gateway, and what it renders.

A page of another site that the operator visits can make their browser
POST to a gateway it can reach (loopback, their network): with no API key,
the native API would do what it is told. The gateway's BrowserGuard refuses
such requests by their ``Origin`` and ``Sec-Fetch-Site``, headers only the
browser sets; this drives real Chromium to send them. And a message body
published as HTML and fetched raw must stay data in the browser.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

import vsqs
from tests.gateway.server import Server

EVIL_ORIGIN = "http://evil.example"  # served by the browser context's router: no network, no DNS


def hostile_site(page: Any, html: str) -> None:
    """Serve ``html`` as the page of another site, and open it."""
    page.context.route(EVIL_ORIGIN + "/**", lambda route: route.fulfill(
        status=200, content_type="text/html", body=html))


@pytest.fixture(scope="module")
def neighbour() -> Iterator[str]:
    """Another origin on this machine (127.0.0.1, another port): a local
    service a hostile page could live on. Its one page is blank."""

    class Blank(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b"<!doctype html><title>neighbour</title>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Blank)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def queue_of(gateway: Server, name: str) -> vsqs.Queue:
    """The queue ``name`` of the gateway's spool, made if missing."""
    return vsqs.Spool(gateway.spool).create_queue(name)


def test_a_form_from_another_site_cannot_publish(page: Any, gateway: Server, shoot: Any) -> None:
    """A cross-site form POST (a 'simple' request: no preflight) reaches the
    gateway and is refused; the queue stays empty."""
    queue = queue_of(gateway, "guarded-form")
    hostile_site(page, f"""<form id=f method=post enctype=text/plain
        action="{gateway.url}/queues/guarded-form/messages"><input name=x value=stolen></form>""")
    page.goto(EVIL_ORIGIN + "/")
    with page.expect_navigation() as navigation:
        page.eval_on_selector("#f", "form => form.submit()")
    response = navigation.value
    assert response is not None and response.status == 403
    assert "cross_origin_request" in response.text()
    shoot(page, "refused")
    assert queue.stats().ready == 0


def test_a_script_from_another_origin_cannot_publish(page: Any, gateway: Server, neighbour: str) -> None:
    """A ``fetch`` in ``no-cors`` mode (the page never reads the answer, but
    the request is sent) from another origin of the same machine is refused
    too. (From a public site, Chromium itself may block a script's request
    to loopback; a neighbour on loopback is not blocked by the browser.)"""
    queue = queue_of(gateway, "guarded-fetch")
    page.goto(neighbour + "/")
    with page.expect_response(lambda r: r.url.startswith(gateway.url)) as answered:
        page.evaluate("""url => fetch(url, {method: 'POST', mode: 'no-cors', body: 'stolen'})""",
                      gateway.url + "/queues/guarded-fetch/messages")
    assert answered.value.status == 403
    assert queue.stats().ready == 0


def test_the_same_request_from_the_gateways_own_origin_is_taken(page: Any, gateway: Server) -> None:
    """The control of the two above: the same fetch from a page of the
    gateway's origin publishes, so their refusal is the origin's doing."""
    queue = queue_of(gateway, "guarded-control")
    page.goto("/healthz")
    status = page.evaluate("""url => fetch(url, {method: 'POST', body: 'welcome'}).then(r => r.status)""",
                           gateway.url + "/queues/guarded-control/messages")
    assert status == 201
    assert queue.stats().ready == 1


SCRIPTED_BODY = "<html><body><p id=shown>a body</p><script>document.body.dataset.ran = 'yes'</script></body></html>"


def test_a_raw_html_body_opened_in_the_browser_runs_no_script(page: Any, gateway: Server, shoot: Any) -> None:
    """A body published as ``text/html`` and opened in the browser is
    sandboxed by the gateway's answer: its script does not run."""
    queue_of(gateway, "raw-html").publish(SCRIPTED_BODY.encode(), attributes={"content-type": "text/html"})
    page.set_content(SCRIPTED_BODY)  # the control: the same markup anywhere else runs its script
    assert page.evaluate("document.body.dataset.ran") == "yes"
    page.goto("/queues/raw-html/messages")
    assert page.text_content("#shown") == "a body"  # rendered...
    assert page.evaluate("document.body.dataset.ran") is None  # ...inert
    shoot(page, "raw-html-body")
