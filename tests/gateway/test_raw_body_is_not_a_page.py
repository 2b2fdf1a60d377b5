"""A raw body answered with the Content-Type it was published with is data,
never a page of the gateway's origin.

Anyone who can publish chooses that type. Served as ``text/html`` and
rendered, a body's script would run in the gateway's origin, where its
requests are same-origin (past any Origin check) and, with no API key, fully
authorised. So the raw GET forbids sniffing and sandboxes any document."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("fastapi", reason="the gateway needs the server extra: pip install 'vsqs[server]'")
import httpx

from tests.gateway.server import running_gateway

PAGE = b"<script>fetch('/queues/jobs/purge', {method: 'POST'})</script>"


def test_a_raw_body_is_never_a_page(tmp_path):
    spool = str(tmp_path / "spool")
    os.mkdir(spool)
    with running_gateway(spool) as server, httpx.Client(base_url=server.url, timeout=30) as http:
        assert http.put("/queues/jobs").status_code == 201
        for content_type in ("text/html", "image/svg+xml", "application/octet-stream"):
            sent = http.post("/queues/jobs/messages", content=PAGE, headers={"Content-Type": content_type})
            assert sent.status_code == 201
            got = http.get("/queues/jobs/messages")
            assert got.status_code == 200 and got.content == PAGE  # as published, its type too
            assert got.headers["Content-Type"].split(";")[0] == content_type
            assert got.headers.get("X-Content-Type-Options") == "nosniff"
            policy = [part.strip() for part in got.headers.get("Content-Security-Policy", "").split(";")]
            assert "sandbox" in policy and "default-src 'none'" in policy
