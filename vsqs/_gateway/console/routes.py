"""The console's routes under ``/ui``: pages, their live numbers (JSON), the
sign-in, the static files, and the actions (every one a POST with a CSRF
token, answered by a redirect to the queue's page: POST, redirect, GET).

:class:`Console` holds what the routes share (sessions, history, the stats
cache, the templates); :func:`router` makes the routes for one."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from importlib import resources
from typing import Any
from urllib.parse import quote, urlencode

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, RedirectResponse, Response
from jinja2 import Environment, PackageLoader, StrictUndefined

from vsqs import InvalidArgument, Queue, QueueNotFound, VsqsError
from vsqs._core.rules import QUEUE_NAME_RE
from vsqs._gateway.auth import CONSOLE_PREFIX
from vsqs._gateway.console import forms, humane, views
from vsqs._gateway.console.history import PERIOD, History
from vsqs._gateway.console.session import (
    COOKIE,
    COOKIE_PATH,
    SESSION_SECONDS,
    Session,
    Sessions,
)
from vsqs._gateway.errors import ApiError, api_error_of, without_paths
from vsqs._gateway.guesses import client_address
from vsqs._gateway.limits import MAX_GROUP_LENGTH
from vsqs._gateway.state import Gateway

PREFIX = CONSOLE_PREFIX
# no inline script or style, nothing from elsewhere, never framed
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
       "form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
SECURITY_HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff",
                    "X-Frame-Options": "DENY", "Referrer-Policy": "same-origin", "Cache-Control": "no-store"}
_MESSAGE_ID = re.compile(r"[0-9]-[0-9]{16}-[0-9a-f]{16}")
_SAFE_NEXT = re.compile(r"/ui(/[A-Za-z0-9_.\-/]*)?(\?[A-Za-z0-9_.\-=&%]*)?")
_STATIC_TYPES = {".css": "text/css; charset=utf-8", ".js": "text/javascript; charset=utf-8",
                 ".svg": "image/svg+xml"}
# what an action did, by code (the redirect names a code, never free text)
NOTICES = {
    "saved": "Settings saved.", "unchanged": "Nothing changed.", "purged": "Purged {n} messages.",
    "redriven": "Sent {n} dead letters back.", "suspended": "Suspended: publish, receive and delete fail.",
    "resumed": "Resumed.", "deleted": "Message deleted.", "gone": "That message is gone already.",
    "published": "Published a test message.", "signed_out": "Signed out.",
}


class Console:
    """What the console's routes share, one per gateway process."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.sessions = Sessions(gateway.config.api_key, gateway.config.console_secret)
        self.history = History(gateway.spool, gateway.config.console_interval or PERIOD,
                               secret=gateway.config.console_secret)  # (the workers' shared secret signs records)
        self.sampling = gateway.config.console_interval > 0
        self.cache = views.StatsCache(gateway, self.history)
        self.templates = Environment(loader=PackageLoader("vsqs._gateway.console", "templates"),
                                     autoescape=True, undefined=StrictUndefined, trim_blocks=True,
                                     lstrip_blocks=True)
        self.templates.filters.update(count=humane.count, duration=humane.duration, ago=humane.ago,
                                      size=humane.size, rate=humane.rate, plain=humane.plain,
                                      text_parts=humane.text_parts, body_view=humane.body_view,
                                      urlpart=lambda text: quote(str(text), safe=""))
        self.static = _load_static()

    def sample(self) -> bool:
        """One sampling attempt (see :meth:`History.sample`), then this process's catch-up. Blocking."""
        sampled = self.history.sample(lambda name: self.cache.get(name, fresh=True)[0])
        self.history.catch_up()
        return sampled

    # -- answers ---------------------------------------------------------------

    def page(self, request: Request, template: str, status: int = 200, **context: Any) -> Response:
        session = self._session(request)
        context.update(csrf=self.sessions.csrf_token(session), needs_key=self.sessions.needs_key,
                       signed_in=session.signed_in, prefix=PREFIX, history_len=len(self.history),
                       history_started=self.history.started, history_period=self.history.period,
                       history_damaged=self.history.damaged,
                       sampling=self.sampling,
                       now=time.time(), version=_version())
        html = self.templates.get_template(template).render(**context)
        return self._finish(request, Response(html, status, media_type="text/html; charset=utf-8"))

    def json(self, request: Request, content: Any, status: int = 200) -> Response:
        return self._finish(request, JSONResponse(content, status))

    def redirect(self, request: Request, url: str) -> Response:
        return self._finish(request, RedirectResponse(url, 303))

    def _finish(self, response_request: Request, response: Response) -> Response:
        response.headers.update(SECURITY_HEADERS)
        fresh = getattr(response_request.state, "console_cookie", None)
        if fresh is not None:
            response.set_cookie(COOKIE, fresh, max_age=SESSION_SECONDS, path=COOKIE_PATH, httponly=True,
                                samesite="strict", secure=_is_https(response_request, self.gateway))
        return response

    # -- sessions --------------------------------------------------------------

    def _session(self, request: Request) -> Session:
        """The request's session; a new anonymous one (its cookie set on the answer) if it has none."""
        known = getattr(request.state, "console_session", None)
        if known is not None:
            return known
        session = self.sessions.read(request.cookies.get(COOKIE))
        if session is None:
            session, cookie = self.sessions.new(signed_in=False)
            request.state.console_cookie = cookie
        request.state.console_session = session
        return session

    def start_session(self, request: Request, signed_in: bool) -> None:
        session, cookie = self.sessions.new(signed_in)
        request.state.console_session, request.state.console_cookie = session, cookie

    def may_act(self, request: Request) -> bool:
        return self.sessions.may_act(self._session(request))

    def csrf_ok(self, request: Request, form: dict[str, str]) -> bool:
        return self.sessions.csrf_ok(self.sessions.read(request.cookies.get(COOKIE)), form.get("csrf"))

    async def form_of(self, request: Request) -> dict[str, str] | None:
        """A form POST's fields; None, unread, without a session its CSRF token could be of
        (every form of the console carries one: a request without the session cookie is refused
        before its body is parsed)."""
        if self.sessions.read(request.cookies.get(COOKIE)) is None:
            return None
        return await forms.read_form(request)


def _is_https(request: Request, gateway: Gateway) -> bool:
    public = gateway.config.public_url or ""
    return request.url.scheme == "https" or public.startswith("https://")


def _version() -> str:
    from vsqs import __version__

    return __version__


def _load_static() -> dict[str, tuple[bytes, str]]:
    """The shipped static files, read once: name -> (content, media type)."""
    found = {}
    for entry in resources.files("vsqs._gateway.console").joinpath("static").iterdir():
        suffix = "." + entry.name.rsplit(".", 1)[-1]
        if entry.is_file() and suffix in _STATIC_TYPES:
            found[entry.name] = (entry.read_bytes(), _STATIC_TYPES[suffix])
    return found


def _queue_name(name: str) -> str:
    if not QUEUE_NAME_RE.fullmatch(name) or ".." in name:
        raise QueueNotFound(f"no queue {name!r}")
    return name


def _queue_url(name: str, **query: Any) -> str:
    url = f"{PREFIX}/queues/{quote(name, safe='')}"
    given = {key: value for key, value in query.items() if value is not None}
    return url + ("?" + urlencode(given) if given else "")


def router(console: Console) -> APIRouter:
    """The console's routes, bound to ``console``."""
    gateway = console.gateway
    routes = APIRouter(prefix=PREFIX, include_in_schema=False)

    def login_redirect(request: Request) -> Response:
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        return console.redirect(request, f"{PREFIX}/login?" + urlencode({"next": target}))

    @routes.get("")
    async def overview(request: Request, sort: str = "name", desc: int = 0, filter: str = "") -> Response:
        if not console.may_act(request):
            return login_redirect(request)
        needle = filter[:100]
        sort = sort if sort in views.SORTS else "name"
        rows = await gateway.call(views.overview, gateway, console.cache, console.history, sort, bool(desc), needle)
        total = await gateway.call(lambda: len(gateway.spool.queues()))
        return console.page(request, "overview.html", rows=rows, sort=sort, desc=bool(desc), filter=needle,
                            total=total, notice=None)

    @routes.get("/api/overview")
    async def overview_numbers(request: Request) -> Response:
        if not console.may_act(request):
            return console.json(request, {"error": "sign in first"}, 401)
        rows = await gateway.call(views.overview, gateway, console.cache, console.history)
        return console.json(request, {"queues": [row.numbers() for row in rows], "history": len(console.history),
                                      "damaged": console.history.damaged, "at": time.time()})

    @routes.get("/login")
    async def login_page(request: Request, next: str = PREFIX) -> Response:
        if not console.sessions.needs_key:
            return console.redirect(request, PREFIX)
        return console.page(request, "login.html", next=next if _SAFE_NEXT.fullmatch(next) else PREFIX,
                            error=None)

    @routes.post("/login")
    async def login(request: Request) -> Response:
        form = await console.form_of(request)
        target = form.get("next", PREFIX) if form is not None else PREFIX
        target = target if _SAFE_NEXT.fullmatch(target) else PREFIX
        if form is None or not console.csrf_ok(request, form):
            return console.page(request, "login.html", 403, next=target,
                                error="This form is stale or came from elsewhere: please try again.")
        address, guesses = client_address(request.scope), gateway.key_guesses
        wait = guesses.wait(address)
        if wait:  # (the key is not compared: see vsqs._gateway.guesses)
            answer = console.page(request, "login.html", 429, next=target,
                                  error=f"Too many wrong keys from this address: try again in {wait} s.")
            answer.headers["Retry-After"] = str(wait)
            return answer
        if not console.sessions.key_matches(form.get("key", "")):
            if form.get("key"):  # (an empty form is no guess)
                guesses.wrong(address)
            return console.page(request, "login.html", 401, next=target, error="That is not the API key.")
        guesses.right(address)
        console.start_session(request, signed_in=True)
        return console.redirect(request, target)

    @routes.post("/logout")
    async def logout(request: Request) -> Response:
        form = await console.form_of(request)
        if form is None or not console.csrf_ok(request, form):
            return console.page(request, "refused.html", 403, reason="This form is stale: reload the page.")
        console.start_session(request, signed_in=False)
        return console.redirect(request, f"{PREFIX}/login" if console.sessions.needs_key else PREFIX)

    @routes.get("/static/{name}")
    async def static(name: str) -> Response:
        found = console.static.get(name)
        if found is None:
            raise ApiError(404, "not_found", "no such file")
        return Response(found[0], media_type=found[1], headers={
            "Cache-Control": "max-age=300", "X-Content-Type-Options": "nosniff"})

    @routes.get("/queues/{name}")
    async def queue_page(request: Request, name: str, after: str | None = None, limit: int = views.PAGE_DEFAULT,
                         groups: int = 0, notice: str | None = None, n: int = 0, hex: int = 0) -> Response:
        if not console.may_act(request):
            return login_redirect(request)
        limit = max(1, min(limit, views.PAGE_MAX))
        if after is not None and not _MESSAGE_ID.fullmatch(after):
            after = None
        text = NOTICES.get(notice or "", "").format(n=humane.count(n)) or None
        return await render_queue(request, name, after=after, limit=limit, groups=bool(groups), notice=text,
                                  force_hex=bool(hex))

    async def render_queue(request: Request, name: str, *, after: str | None = None,
                           limit: int = views.PAGE_DEFAULT, groups: bool = False, notice: str | None = None,
                           error: str | None = None, status: int = 200, force_hex: bool = False) -> Response:
        try:
            model = await gateway.call(views.queue_page, gateway, console.cache, console.history,
                                       _queue_name(name), after, limit, groups)
        except QueueNotFound:
            if QUEUE_NAME_RE.fullmatch(name):
                gateway.forget(name)  # (a handle of a queue deleted and made again elsewhere)
            return console.page(request, "missing.html", 404, name=name)
        return console.page(request, "queue.html", status, q=model, notice=notice, error=error,
                            force_hex=force_hex, setting_fields=forms.FIELDS, max_group=MAX_GROUP_LENGTH,
                            max_body=forms.MAX_TEST_BODY)

    @routes.get("/api/queues/{name}")
    async def queue_numbers(request: Request, name: str) -> Response:
        if not console.may_act(request):
            return console.json(request, {"error": "sign in first"}, 401)
        try:
            stats, settings = await gateway.call(console.cache.get, _queue_name(name))
        except QueueNotFound:
            return console.json(request, {"error": "no such queue"}, 404)
        row = views.Row(name, stats, settings, views.dead_letter_name(name, settings),
                        console.history.depth_rate(name), "")
        return console.json(request, {"queues": [row.numbers()], "at": time.time()})

    # -- actions ---------------------------------------------------------------

    async def act(request: Request, name: str, action: Callable[[Queue, dict[str, str]], tuple[str, int]]) -> Response:
        """Run ``action(queue, form)`` for a signed-in session whose form holds
        its CSRF token; redirect to the queue's page with the notice it names,
        or show the page again with the error."""
        if not console.may_act(request):  # (before the form is read: an anonymous body is never parsed)
            return console.page(request, "refused.html", 401, reason="Sign in to the console first.")
        form = await console.form_of(request)
        if form is None or not console.csrf_ok(request, form):
            return console.page(request, "refused.html", 403,
                                reason="This form is stale or came from elsewhere (its token does not match): "
                                       "reload the page and try again.")
        try:
            queue = await gateway.handle(_queue_name(name))
            notice, count = await gateway.call(action, queue, form)
        except QueueNotFound:
            return console.page(request, "missing.html", 404, name=name)
        except VsqsError as exc:
            error = api_error_of(exc)
            return await render_queue(request, name, error=without_paths(error.message, gateway.config.spool),
                                      status=error.status)
        finally:
            console.cache.forget(name)
        return console.redirect(request, _queue_url(name, notice=notice, n=count or None))

    def save_settings(queue: Queue, form: dict[str, str]) -> tuple[str, int]:
        changes = forms.settings_changes(form, dict(queue.settings))
        if not changes:
            return "unchanged", 0
        queue.configure(**changes)
        return "saved", 0

    def redrive(queue: Queue, form: dict[str, str]) -> tuple[str, int]:
        text = form.get("max_messages", "").strip()
        if text and (not text.isdigit() or int(text) < 1):
            raise InvalidArgument(f"max_messages must be a whole number above 0, not {text[:20]!r}")
        return "redriven", queue.redrive(max_messages=int(text) if text else None)

    def purge(queue: Queue, form: dict[str, str]) -> tuple[str, int]:
        if form.get("confirm", "") != queue.path.rsplit("/", 1)[-1]:
            raise InvalidArgument("type the queue's name to confirm the purge")
        return "purged", queue.purge()

    def suspend(queue: Queue, form: dict[str, str]) -> tuple[str, int]:
        queue.suspend()
        return "suspended", 0

    def resume(queue: Queue, form: dict[str, str]) -> tuple[str, int]:
        queue.resume()
        return "resumed", 0

    def delete_message(queue: Queue, form: dict[str, str]) -> tuple[str, int]:
        message_id = form.get("id", "")
        if not _MESSAGE_ID.fullmatch(message_id):
            raise InvalidArgument("id must be a message id")
        return ("deleted", 0) if queue.purge([message_id]) else ("gone", 0)

    def publish(queue: Queue, form: dict[str, str]) -> tuple[str, int]:
        body = form.get("body", "")
        if len(body) > forms.MAX_TEST_BODY:
            raise InvalidArgument(f"a test message has at most {forms.MAX_TEST_BODY} characters")
        options: dict[str, Any] = {}
        for field, convert in (("priority", int), ("delay", float)):
            text = form.get(field, "").strip()
            if text:
                try:
                    options[field] = convert(text)
                except ValueError:
                    raise InvalidArgument(f"{field} must be a number, not {text[:20]!r}") from None
        group = form.get("group", "")
        if group:
            options["group"] = group
        queue.publish(body.encode("utf-8"), **options)
        return "published", 0

    for path, action in (("settings", save_settings), ("redrive", redrive), ("purge", purge),
                         ("suspend", suspend), ("resume", resume), ("delete", delete_message),
                         ("publish", publish)):
        async def endpoint(request: Request, name: str, _action: Callable[..., tuple[str, int]] = action) -> Response:
            return await act(request, name, _action)

        routes.add_api_route(f"/queues/{{name}}/{path}", endpoint, methods=["POST"], name=f"console_{path}")

    @routes.get("/")
    async def slash(request: Request) -> Response:
        return console.redirect(request, PREFIX)

    return routes
