"""A console client for the tests: what a browser on the console's own pages
sends (its cookie, the form's CSRF token, Origin and Sec-Fetch-Site)."""

from __future__ import annotations

import html
import re
from typing import Any

import httpx

_CSRF = re.compile(r'name="csrf" value="([^"]*)"')


class ConsoleClient:
    def __init__(self, url: str) -> None:
        self.url = url
        self.http = httpx.Client(base_url=url, timeout=30, follow_redirects=False,
                                 headers={"Sec-Fetch-Site": "same-origin"})

    def close(self) -> None:
        self.http.close()

    def get(self, path: str, **kwargs: Any) -> httpx.Response:
        return self.http.get(path, **kwargs)

    def token(self, path: str = "/ui") -> str:
        page = self.get(path)
        assert page.status_code == 200, page.text
        found = _CSRF.search(page.text)
        assert found, "no CSRF token on the page"
        return html.unescape(found[1])

    def post(self, path: str, fields: dict[str, str], *, origin: str | None = "", **kwargs: Any) -> httpx.Response:
        """A form POST as the console's own page sends it (``origin=None``: no Origin header)."""
        headers = dict(kwargs.pop("headers", {}))
        if origin is not None:
            headers["Origin"] = origin or self.url
        return self.http.post(path, data=fields, headers=headers, **kwargs)

    def act(self, queue: str, action: str, **fields: str) -> httpx.Response:
        """An action from the queue's page, with that page's token."""
        token = self.token(f"/ui/queues/{queue}")
        return self.post(f"/ui/queues/{queue}/{action}", {"csrf": token, **fields})


def unescaped_text(page: str) -> str:
    """The page's text with its tags dropped and entities decoded (for reading numbers)."""
    return html.unescape(re.sub(r"<[^>]+>", " ", page))


def cell(page: str, queue: str, count: str) -> int:
    """The raw value of ``data-count=COUNT`` in the row (or block) of ``queue``."""
    row = re.search(rf'data-queue="{re.escape(queue)}"(.*?)(</tr>|</dl>)', page, re.DOTALL)
    assert row, f"no row of {queue}"
    value = re.search(rf'data-count="{count}" data-value="([^"]*)"', row[1])
    assert value, f"no {count} in the row of {queue}"
    return int(float(value[1]))
