"""The HTTP gateway's native face (`vsqs serve`), through a real server on loopback."""

from __future__ import annotations

import hashlib
import os
import re
import signal
import threading
import time

import pytest

pytest.importorskip("fastapi", reason="the gateway needs the server extra: pip install 'vsqs[server]'")
import httpx

import vsqs
from tests.gateway.server import refused_status, running_gateway, tree_around

MAX_MESSAGE = 4096  # the module's gateway takes bodies up to this size


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    spool = str(tmp_path_factory.mktemp("gateway") / "spool")
    os.mkdir(spool)
    with running_gateway(spool, "--max-body-bytes", str(MAX_MESSAGE)) as server:
        yield server


@pytest.fixture
def http(server):
    with httpx.Client(base_url=server.url, timeout=30) as client:
        yield client


@pytest.fixture
def queue_name(request, http):
    """A fresh queue for each test, named after it."""
    name = request.node.name.replace("[", "-").replace("]", "")[:60].strip("-_.")
    assert http.put(f"/queues/{name}").status_code == 201
    yield name
    http.delete(f"/queues/{name}")


def spool_entries(server) -> list[str]:
    return tree_around(server.spool)


# -- operations ----------------------------------------------------------------


def test_healthz_and_openapi(http):
    health = http.get("/healthz").json()
    assert health == {"status": "ok", "version": vsqs.__version__, "spool_reachable": True}
    paths = http.get("/openapi.json").json()["paths"]
    for path in ("/queues", "/queues/{queue}", "/queues/{queue}/messages", "/queues/{queue}/messages/batch",
                 "/queues/{queue}/messages/receive", "/queues/{queue}/messages/{receipt}",
                 "/queues/{queue}/messages/delete", "/queues/{queue}/messages/visibility",
                 "/queues/{queue}/redrive", "/queues/{queue}/purge", "/queues/{queue}/stats"):
        assert path in paths, path


def test_the_settings_body_is_made_of_the_editable_settings(http):
    """Its fields, in their declared order (tests/core/test_settings.py's ORDER), each
    with its declaration's doc (without Markdown's code marks) and bounds."""
    from vsqs._core.settings import SCHEMA

    model = http.get("/openapi.json").json()["components"]["schemas"]["QueueSettings"]
    editable = [name for name, setting in SCHEMA.items() if setting.editable]
    assert list(model["properties"]) == editable and model["additionalProperties"] is False
    assert model["properties"]["throttle"]["description"] == "[N, seconds]: at most N receives per window"
    for name in editable:
        field, setting = model["properties"][name], SCHEMA[name]
        assert field["description"] and "`" not in field["description"], name  # plain text, as ever
        if setting.bounds is not None:
            low = field.get("exclusiveMinimum" if setting.positive else "minimum")
            assert (low, field["maximum"]) == setting.bounds, name


EDITED = {  # a value of each setting the native API edits, as a client sends it, and as it is kept
    "visibility_timeout": (45, 45.0), "delay": (1.5, 1.5), "receive_wait": (2, 2.0), "retention": (3600, 3600.0),
    "max_messages": (100, 100), "max_message_bytes": (4096, 4096), "max_receives": (3, 3),
    "dead_letter": ("other", "other"), "group_concurrency": (2, 2), "dedup_window": (60, 60.0),
    "content_dedup": (True, True), "throttle": ([10, 1], [10, 1.0]), "suspended": (["publish"], ["publish"]),
}


def test_of_two_bad_settings_the_first_in_their_order_is_named(http, queue_name):
    """Whatever the order of the request's fields: retention comes before receive_wait."""
    for body in ({"receive_wait": 99, "retention": 0}, {"retention": 0, "receive_wait": 99}):
        refused = http.patch(f"/queues/{queue_name}", json=body)
        assert refused.status_code == 422 and "retention" in refused.json()["error"]["message"], refused.text
        assert "receive_wait" not in refused.json()["error"]["message"]
    settings = http.get(f"/queues/{queue_name}").json()["settings"]
    assert list(settings)[:3] == ["visibility_timeout", "delay", "retention"]


def test_the_api_edits_each_editable_setting(http, server, queue_name):
    from vsqs._core.settings import SCHEMA

    assert sorted(EDITED) == sorted(name for name, setting in SCHEMA.items() if setting.editable)
    for name, (sent, kept) in EDITED.items():
        answer = http.patch(f"/queues/{queue_name}", json={name: sent})
        assert answer.status_code == 200, answer.text
        assert answer.json()["settings"][name] == kept == vsqs.Spool(server.spool).queue(queue_name).settings[name]
        unset = http.patch(f"/queues/{queue_name}", json={name: None}).json()["settings"][name]
        assert unset == SCHEMA[name].default, name


def test_metrics_count_requests_by_operation_and_outcome(http, queue_name):
    http.post(f"/queues/{queue_name}/messages", content=b"x")
    http.get("/queues/no-such-queue")
    text = http.get("/metrics").text
    assert 'vsqs_gateway_requests_total{operation="publish_raw",outcome="ok"}' in text
    assert 'vsqs_gateway_requests_total{operation="get_queue",outcome="404"}' in text
    assert 'vsqs_gateway_request_seconds_bucket{le="0.005",operation="publish_raw",outcome="ok"}' in text
    assert "vsqs_gateway_requests_in_progress" in text and "vsqs_gateway_long_polls_waiting" in text
    assert re.search(rf'vsqs_messages{{[^}}]*queue="{queue_name}"[^}}]*state="ready"}} 1', text)


# -- queues ----------------------------------------------------------------------


def test_queue_lifecycle(http, server):
    assert http.put("/queues/life", json={"visibility_timeout": 7, "max_receives": 3}).status_code == 201
    again = http.put("/queues/life", json={"visibility_timeout": 7})
    assert again.status_code == 200  # idempotent with the same settings
    conflict = http.put("/queues/life", json={"visibility_timeout": 8})
    assert conflict.status_code == 409 and conflict.json()["error"]["code"] == "queue_exists"
    assert "life" in http.get("/queues").json()["queues"]
    got = http.get("/queues/life").json()
    assert got["settings"]["visibility_timeout"] == 7.0 and got["settings"]["max_receives"] == 3
    assert got["stats"]["ready"] == 0
    patched = http.patch("/queues/life", json={"max_receives": None, "receive_wait": 2}).json()
    assert patched["settings"]["max_receives"] is None and patched["settings"]["receive_wait"] == 2.0
    assert vsqs.Spool(server.spool).queue("life").settings["receive_wait"] == 2.0  # the spool is the truth
    http.post("/queues/life/messages", content=b"a")
    assert http.delete("/queues/life").json() == {"count": 1}
    gone = http.delete("/queues/life")
    assert gone.status_code == 404 and server.spool not in gone.text  # no server paths in answers
    missing = http.get("/queues/life")
    assert missing.status_code == 404
    assert missing.json()["error"] == {"code": "queue_not_found", "message": "no queue 'life'", "parameter": "queue"}


def test_a_sharded_queue_over_http(http, server):
    made = http.put("/queues/deep", params={"shards": 8}, json={})
    assert made.status_code == 201 and made.json()["shards"] == 8
    assert vsqs.Spool(server.spool).queue("deep").shards == 8
    assert http.put("/queues/deep", params={"shards": 8}, json={}).status_code == 200
    assert http.put("/queues/deep", json={}).json()["shards"] == 8  # not saying is not asking for 1
    conflict = http.put("/queues/deep", params={"shards": 16}, json={})
    assert conflict.status_code == 409 and conflict.json()["error"]["parameter"] == "shards"
    bad = http.put("/queues/odd", params={"shards": 3}, json={})
    assert bad.status_code == 422 and bad.json()["error"]["parameter"] == "shards"
    assert "odd" not in http.get("/queues").json()["queues"]
    for i in range(20):
        http.post("/queues/deep/messages", content=b"%d" % i)
    assert http.get("/queues/deep").json()["stats"]["ready"] == 20
    got = http.post("/queues/deep/messages/receive", params={"max_messages": 10}).json()
    assert len(got["messages"]) == 10


@pytest.mark.parametrize("name", ["..", ".hidden", "a" * 81, "a..b", "-x", "a%00b", "%2E%2E", "..%2F..%2Fetc"])
def test_escaping_queue_names_touch_nothing(http, server, name):
    before = spool_entries(server)
    answer = http.put(f"/queues/{name}", json={})
    assert answer.status_code in (404, 405, 422), answer.text  # 405: the client resolved ".." itself
    assert "error" in answer.json()
    assert spool_entries(server) == before


@pytest.mark.parametrize(
    "settings, parameter",
    [
        ({"visibility_timeout": -1}, "visibility_timeout"),
        ({"visibility_timeout": "soon"}, "visibility_timeout"),
        ({"max_receives": 0}, "max_receives"),
        ({"dead_letter": "/etc"}, "dead_letter"),
        ({"dead_letter": "../other"}, "dead_letter"),
        ({"file_mode": "0666"}, "file_mode"),  # the operator's decision, not a client's
        ({"no_such_setting": 1}, "no_such_setting"),
    ],
)
def test_bad_settings_name_the_parameter_and_create_nothing(http, server, settings, parameter):
    before = spool_entries(server)
    answer = http.put("/queues/badsettings", json=settings)
    assert answer.status_code == 422, answer.text
    assert answer.json()["error"]["parameter"] == parameter
    assert spool_entries(server) == before


# -- raw mode ------------------------------------------------------------------------


def test_raw_round_trip_keeps_body_and_content_type(http, queue_name):
    body = bytes(range(256)) * 3
    sent = http.post(f"/queues/{queue_name}/messages", content=body, headers={"Content-Type": "image/x-test"})
    assert sent.status_code == 201
    assert sent.headers["Message-Md5"] == hashlib.md5(body).hexdigest()
    assert sent.headers["Message-Timestamp"].endswith("Z")
    got = http.get(f"/queues/{queue_name}/messages")
    assert got.status_code == 200 and got.content == body
    assert got.headers["Content-Type"] == "image/x-test"
    assert got.headers["Message-Id"] == sent.headers["Message-Id"]
    assert got.headers["Message-Receive-Count"] == "1"
    assert got.headers["Message-Md5"] == sent.headers["Message-Md5"]
    assert got.headers["Message-Timestamp"][:16] == sent.headers["Message-Timestamp"][:16]
    receipt = got.headers["Message-Receipt"]
    assert http.delete(f"/queues/{queue_name}/messages/{receipt}").status_code == 204
    assert http.get(f"/queues/{queue_name}/messages").status_code == 204  # empty


def test_raw_publish_options(http, queue_name):
    http.post(f"/queues/{queue_name}/messages", content=b"low", params={"priority": 1})
    http.post(f"/queues/{queue_name}/messages", content=b"high", params={"priority": 9})
    http.post(f"/queues/{queue_name}/messages", content=b"later", params={"delay": 60})
    assert http.get(f"/queues/{queue_name}/messages").content == b"high"
    assert http.get(f"/queues/{queue_name}/messages").content == b"low"
    assert http.get(f"/queues/{queue_name}/messages").status_code == 204
    assert http.get(f"/queues/{queue_name}/stats").json()["delayed"] == 1
    bad = http.post(f"/queues/{queue_name}/messages", content=b"x", params={"priority": 12})
    assert bad.status_code == 422 and bad.json()["error"]["parameter"] == "priority"


def test_raw_publishes_take_the_default_priority_and_groups(http, queue_name):
    http.post(f"/queues/{queue_name}/messages/batch", json={"messages": [{"body": "json first"}]})
    assert http.post(f"/queues/{queue_name}/messages", content=b"raw second").status_code == 201
    got = http.post(f"/queues/{queue_name}/messages/receive", json={"max_messages": 10}).json()["messages"]
    assert [m["body"] for m in got] == ["json first", "raw second"]  # in order: the same priority
    for body in (b"g1", b"g2"):
        assert http.post(f"/queues/{queue_name}/messages", content=body, params={"group": "g"}).status_code == 201
    first = http.get(f"/queues/{queue_name}/messages")
    assert first.content == b"g1" and http.get(f"/queues/{queue_name}/messages").status_code == 204  # one at a time


def test_a_content_type_is_echoed_only_when_well_formed(http, server, queue_name):
    bad = http.post(f"/queues/{queue_name}/messages", content=b"x", headers={"Content-Type": "no slash"})
    assert bad.status_code == 422 and bad.json()["error"]["parameter"] == "Content-Type"
    q = vsqs.Spool(server.spool).queue(queue_name)  # other faces may store anything there
    q.publish(b"snow", attributes={"content-type": "text/\u2603"})
    q.publish(b"split", attributes={"content-type": "text/plain\r\nX-Evil: 1"})
    for body in (b"snow", b"split"):
        got = http.get(f"/queues/{queue_name}/messages")
        assert got.status_code == 200 and got.content == body
        assert got.headers["Content-Type"] == "application/octet-stream" and "X-Evil" not in got.headers


def test_long_poll_returns_when_a_message_arrives(http, server, queue_name):
    def publish_later(via_library: bool) -> None:
        time.sleep(0.5)
        if via_library:
            vsqs.Spool(server.spool).queue(queue_name).publish(b"from the library")
        else:
            httpx.post(f"{server.url}/queues/{queue_name}/messages", content=b"through the gateway")

    for via_library in (False, True):
        thread = threading.Thread(target=publish_later, args=(via_library,))
        started = time.monotonic()
        thread.start()
        got = http.get(f"/queues/{queue_name}/messages", params={"wait": 15})
        thread.join()
        assert got.status_code == 200
        assert time.monotonic() - started < 10  # well within the wait
        http.delete(f"/queues/{queue_name}/messages/{got.headers['Message-Receipt']}")


def test_a_long_poll_whose_client_left_claims_nothing(http, server, queue_name):
    import socket

    port = int(server.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port)) as client:
        client.sendall(f"GET /queues/{queue_name}/messages?wait=15&visibility_timeout=600 HTTP/1.1\r\n"
                       "Host: test\r\n\r\n".encode())
        time.sleep(0.5)
    time.sleep(0.5)  # gone; its poll is still asleep
    vsqs.Spool(server.spool).queue(queue_name).publish(b"for someone who is there")
    time.sleep(1.5)
    stats = http.get(f"/queues/{queue_name}/stats").json()
    assert (stats["ready"], stats["in_flight"]) == (1, 0)  # not hidden for nobody


def _long_polls_waiting(http) -> float:
    """The gateway's own count of receives waiting in a long poll now (/metrics)."""
    for line in http.get("/metrics").text.splitlines():
        if line.startswith("vsqs_gateway_long_polls_waiting"):
            return float(line.split()[-1])
    raise AssertionError("vsqs_gateway_long_polls_waiting is not in /metrics")


def test_long_polls_hold_no_thread(http, server, queue_name):
    """More waiting clients than the thread pool has threads (40): all wait at
    once (the gateway counts them), the server still answers, and each gets a
    message. No step rests on timing: the publish waits until every poll is
    waiting, and a poll whose wait ran out on a slow machine polls again."""
    results: list[int] = []

    def wait_for_one() -> None:
        while True:
            status = httpx.get(f"{server.url}/queues/{queue_name}/messages", params={"wait": 20},
                               timeout=60).status_code
            if status != 204:  # 204: the wait ran out with nothing visible
                results.append(status)
                return

    threads = [threading.Thread(target=wait_for_one) for _ in range(60)]
    for thread in threads:
        thread.start()
    while _long_polls_waiting(http) < 60:  # 60 waiting at once: none holds one of the 40 threads
        time.sleep(0.05)
    assert http.get("/healthz").status_code == 200  # the server still answers
    http.post(f"/queues/{queue_name}/messages/batch", json={"messages": [{"body": str(i)} for i in range(60)]})
    for thread in threads:
        thread.join()
    assert sorted(results) == [200] * 60


# -- JSON mode ---------------------------------------------------------------------------


def test_json_publish_receive_delete_and_visibility(http, queue_name):
    published = http.post(f"/queues/{queue_name}/messages/batch", json={"messages": [
        {"body": "text", "attributes": {"kind": "a"}},
        {"body_base64": "/wA=", "group": "g1"},
    ]})
    assert published.status_code == 201
    ids = [m["id"] for m in published.json()["messages"]]
    got = http.post(f"/queues/{queue_name}/messages/receive", json={"max_messages": 10, "visibility_timeout": 30})
    messages = {m["id"]: m for m in got.json()["messages"]}
    assert set(messages) == set(ids)
    text, binary = messages[ids[0]], messages[ids[1]]
    assert text["body"] == "text" and "body_base64" not in text and text["attributes"] == {"kind": "a"}
    assert binary["body_base64"] == "/wA=" and "body" not in binary and binary["group"] == "g1"
    assert text["md5"] == hashlib.md5(b"text").hexdigest() and text["receive_count"] == 1

    moved = http.put(f"/queues/{queue_name}/messages/{text['receipt']}/visibility", json={"timeout": 0})
    assert moved.status_code == 200
    stale = http.delete(f"/queues/{queue_name}/messages/{text['receipt']}")
    assert stale.status_code == 409 and stale.json()["error"]["code"] == "stale_receipt"

    again = http.post(f"/queues/{queue_name}/messages/receive", json={}).json()["messages"]
    assert [m["id"] for m in again] == [ids[0]] and again[0]["receive_count"] == 2
    outcome = http.post(f"/queues/{queue_name}/messages/delete",
                        json={"receipts": [again[0]["receipt"], binary["receipt"], again[0]["receipt"], "junk"]})
    codes = [(r["error"] or {}).get("code") for r in outcome.json()["results"]]
    assert codes == [None, None, "stale_receipt", "invalid_receipt"]
    assert http.get(f"/queues/{queue_name}/stats").json()["in_flight"] == 0


def test_visibility_batch_per_entry_outcomes(http, queue_name):
    http.post(f"/queues/{queue_name}/messages/batch", json={"messages": [{"body": "a"}, {"body": "b"}]})
    got = http.post(f"/queues/{queue_name}/messages/receive", json={"max_messages": 2}).json()["messages"]
    entries = [{"receipt": got[0]["receipt"], "timeout": 100}, {"receipt": "zz:bad", "timeout": 5},
               {"receipt": got[1]["receipt"], "timeout": 0}]
    results = http.post(f"/queues/{queue_name}/messages/visibility", json={"entries": entries}).json()["results"]
    assert results[0]["new_receipt"] and results[0]["error"] is None
    assert results[1]["error"]["code"] == "invalid_receipt"
    assert results[2]["new_receipt"]
    assert [m["body"] for m in http.post(f"/queues/{queue_name}/messages/receive", json={}).json()["messages"]] == ["b"]


def test_foreign_receipt_is_refused(http, queue_name, server):
    other = vsqs.Spool(server.spool).create_queue(queue_name + "-other")
    other.publish(b"x")
    foreign = other.receive().receipt
    answer = http.delete(f"/queues/{queue_name}/messages/{foreign}")
    assert answer.status_code == 400 and answer.json()["error"]["code"] == "invalid_receipt"
    assert other.stats().in_flight == 1  # untouched
    vsqs.Spool(server.spool).delete_queue(queue_name + "-other")


def test_bad_requests_name_the_parameter(http, queue_name):
    cases = [
        (f"/queues/{queue_name}/messages/receive", {"max_messages": 0}, 422, "max_messages"),
        (f"/queues/{queue_name}/messages/receive", {"wait": 21}, 422, "wait"),
        (f"/queues/{queue_name}/messages/receive", {"visibility_timeout": -1}, 422, "visibility_timeout"),
        (f"/queues/{queue_name}/messages/batch", {"messages": []}, 422, "messages"),
        (f"/queues/{queue_name}/messages/batch", {"messages": [{"body": "a", "body_base64": "YQ=="}]}, 422,
         "messages.0.body"),
        (f"/queues/{queue_name}/messages/batch", {"messages": [{"body_base64": "***"}]}, 422,
         "messages.0.body_base64"),
        (f"/queues/{queue_name}/messages/batch", {"messages": [{"body": "a", "attributes": {"bad name!": "x"}}]},
         422, "messages.0.attributes"),
        (f"/queues/{queue_name}/messages/batch", {"messages": [{"body": "a", "group": "g", "priority": 9}]},
         422, "priority"),
    ]
    for path, doc, status, parameter in cases:
        answer = http.post(path, json=doc)
        assert answer.status_code == status, (doc, answer.text)
        assert answer.json()["error"]["parameter"] == parameter, (doc, answer.text)
    malformed = http.post(f"/queues/{queue_name}/messages/receive", content=b"{nope",
                          headers={"Content-Type": "application/json"})
    assert malformed.status_code == 400 and malformed.json()["error"]["code"] == "malformed_json"
    assert http.get(f"/queues/{queue_name}/stats").json()["ready"] == 0  # nothing was published


# -- limits and states -----------------------------------------------------------------------


def test_bodies_over_the_limits_are_refused_and_nothing_is_written(http, queue_name, server):
    path = os.path.join(server.spool, queue_name)

    def message_files() -> list[str]:
        return [name for name in os.listdir(path) if not name.startswith(".")]

    over_gateway = http.post(f"/queues/{queue_name}/messages", content=b"x" * (MAX_MESSAGE + 1))
    assert over_gateway.status_code == 413 and over_gateway.json()["error"]["parameter"] == "body"
    huge = refused_status(lambda: http.post(f"/queues/{queue_name}/messages", content=b"x" * 1_000_000))
    assert huge in (413, None)  # over the request cap (None: reset while sending, see refused_status)

    def chunks():  # no Content-Length: the cap applies while streaming
        for _ in range(200):
            yield b"y" * 10_000

    assert refused_status(lambda: http.post(f"/queues/{queue_name}/messages", content=chunks())) in (413, None)
    assert http.patch(f"/queues/{queue_name}", json={"max_message_bytes": 10}).status_code == 200
    over_queue = http.post(f"/queues/{queue_name}/messages/batch", json={"messages": [{"body": "y" * 11}]})
    assert over_queue.status_code == 413 and over_queue.json()["error"]["code"] == "message_too_large"
    assert message_files() == []


def test_full_throttled_and_suspended_queues(http, queue_name):
    http.patch(f"/queues/{queue_name}", json={"max_messages": 1})
    assert http.post(f"/queues/{queue_name}/messages", content=b"1").status_code == 201
    full = http.post(f"/queues/{queue_name}/messages", content=b"2")
    assert full.status_code == 429 and full.json()["error"]["code"] == "queue_full" and full.headers["Retry-After"]

    http.patch(f"/queues/{queue_name}", json={"throttle": [1, 60]})
    assert http.get(f"/queues/{queue_name}/messages").status_code == 200  # the window's one receive
    throttled = http.get(f"/queues/{queue_name}/messages")
    assert throttled.status_code == 429 and throttled.json()["error"]["code"] == "throttled"

    suspended = http.post(f"/queues/{queue_name}/suspend", json={"operations": ["publish"]})
    assert suspended.json()["settings"]["suspended"] == ["publish"]
    refused = http.post(f"/queues/{queue_name}/messages", content=b"3")
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "queue_suspended"
    http.post(f"/queues/{queue_name}/resume", json={})
    http.patch(f"/queues/{queue_name}", json={"max_messages": None})
    assert http.post(f"/queues/{queue_name}/messages", content=b"3").status_code == 201


def test_dead_letters_redrive_and_purge(http, queue_name):
    dlq = queue_name + ".dlq"
    http.patch(f"/queues/{queue_name}", json={"max_receives": 1, "dead_letter": dlq})
    http.post(f"/queues/{queue_name}/messages", content=b"poison")
    first = http.post(f"/queues/{queue_name}/messages/receive", json={"visibility_timeout": 0}).json()["messages"]
    assert len(first) == 1
    assert http.post(f"/queues/{queue_name}/messages/receive", json={}).json()["messages"] == []
    assert http.get(f"/queues/{dlq}/stats").json()["ready"] == 1
    assert http.post(f"/queues/{dlq}/redrive", json={}).json() == {"count": 1}
    assert http.get(f"/queues/{queue_name}/stats").json()["ready"] == 1
    bad = http.post(f"/queues/{dlq}/redrive", json={"to": "/etc"})
    assert bad.status_code == 422 and bad.json()["error"]["parameter"] == "to"
    missing = http.post(f"/queues/{dlq}/redrive", json={"to": "no-such-queue"})
    assert missing.status_code == 404 and missing.json()["error"]["parameter"] == "to"
    assert http.post(f"/queues/{queue_name}/purge").json() == {"count": 1}
    http.delete(f"/queues/{dlq}")


# -- the spool is the truth -----------------------------------------------------------------------


def test_library_and_gateway_see_the_same_messages(http, server, queue_name):
    q = vsqs.Spool(server.spool).queue(queue_name)
    q.publish(b"from library", attributes={"origin": "lib"})
    got = http.post(f"/queues/{queue_name}/messages/receive", json={}).json()["messages"][0]
    assert got["body"] == "from library" and got["attributes"] == {"origin": "lib"}
    q.delete(got["receipt"])  # a receipt from the gateway works in the library
    http.post(f"/queues/{queue_name}/messages/batch", json={"messages": [{"body": "from http", "priority": 8}]})
    m = q.receive()
    assert m.body == b"from http" and m.priority == 8
    assert http.delete(f"/queues/{queue_name}/messages/{m.receipt}").status_code == 204


def test_a_killed_gateway_loses_nothing(tmp_path):
    spool = str(tmp_path)
    vsqs.Spool(spool).create_queue("q", visibility_timeout=1)
    with running_gateway(spool) as server:
        http = httpx.Client(base_url=server.url)
        http.post("/queues/q/messages/batch", json={"messages": [{"body": "a"}, {"body": "b"}]})
        assert http.get("/queues/q/messages").status_code == 200  # one in flight
        os.kill(server.process.pid, signal.SIGKILL)
        server.process.wait()
        http.close()
    q = vsqs.Queue(os.path.join(spool, "q"))
    # held for a minute here (not the queue's 1 s): a slow second call must not see them again
    bodies = sorted(m.body for m in q.receive_batch(10, wait=5, visibility_timeout=60))
    assert bodies in ([b"a", b"b"], [b"a"], [b"b"])  # the in-flight one may not be back yet
    if len(bodies) < 2:  # it comes back once its lease of 1 s ran out
        bodies += [m.body for m in q.receive_batch(10, wait=30, visibility_timeout=60)]
    assert sorted(bodies) == [b"a", b"b"]


# -- authentication and workers --------------------------------------------------------------------


def _queue_dirs(spool) -> list[str]:
    """What requests made in the spool: its entries but the gateway's own
    (the housekeeping sweep, at each period, keeps records in dot-directories)."""
    return sorted(name for name in os.listdir(spool) if not name.startswith("."))


def test_api_key(tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_CONFIG_FILE", "/dev/null")  # boto3 reads no real configuration
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
    key_file = tmp_path / "key"
    key_file.write_text("s3cret\n")
    spool = tmp_path / "spool"
    spool.mkdir()
    with (
        running_gateway(str(spool), "--api-key-file", str(key_file)) as server,
        httpx.Client(base_url=server.url) as http,
    ):
        assert http.get("/healthz").status_code == 200  # open: load balancers probe it
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"X-Api-Key": "s3cre"}):
            refused = http.put("/queues/q", headers=headers)
            assert refused.status_code == 401 and refused.json()["error"]["code"] == "unauthorized"
        assert http.get("/metrics").status_code == 401
        assert _queue_dirs(spool) == []
        assert http.put("/queues/q", headers={"Authorization": "Bearer s3cret"}).status_code == 201
        assert http.get("/queues", headers={"X-Api-Key": "s3cret"}).json() == {"queues": ["q"]}

        # the key closes the SQS face too: SigV4 with the API key as the secret, any key id
        boto3 = pytest.importorskip("boto3")
        import botocore.config
        import botocore.exceptions

        def sqs(secret):
            return boto3.client("sqs", endpoint_url=server.url, region_name="us-east-1",
                                aws_access_key_id="anyone", aws_secret_access_key=secret,
                                config=botocore.config.Config(retries={"max_attempts": 1}))

        with pytest.raises(botocore.exceptions.ClientError) as refused:
            sqs("made-up").create_queue(QueueName="intruder")
        assert refused.value.response["Error"]["Code"] == "SignatureDoesNotMatch"
        assert _queue_dirs(spool) == ["q"]
        assert sqs("s3cret").get_queue_url(QueueName="q")["QueueUrl"].endswith("/q")




def test_queues_made_by_the_gateway_get_its_file_mode(tmp_path):
    with running_gateway(str(tmp_path), "--file-mode", "640") as server, httpx.Client(base_url=server.url) as http:
        assert http.put("/queues/native").status_code == 201
        sqs = {"X-Amz-Target": "AmazonSQS.CreateQueue", "Content-Type": "application/x-amz-json-1.0"}
        assert http.post("/", json={"QueueName": "viasqs"}, headers=sqs).status_code == 200
        for name in ("native", "viasqs"):
            assert vsqs.Spool(str(tmp_path)).queue(name).settings["file_mode"] == "0640"
            http.post(f"/queues/{name}/messages", content=b"x")
            files = [f for f in os.listdir(tmp_path / name) if not f.startswith(".")]
            assert [os.stat(tmp_path / name / f).st_mode & 0o777 for f in files] == [0o640]


def test_workers_share_the_spool_and_the_metrics(tmp_path):
    with running_gateway(str(tmp_path), "--workers", "2") as server, httpx.Client(base_url=server.url) as http:
        http.put("/queues/q")
        for i in range(20):
            assert http.post("/queues/q/messages", content=str(i).encode()).status_code == 201
        text = http.get("/metrics").text
        assert 'vsqs_gateway_requests_total{operation="publish_raw",outcome="ok"} 20.0' in text
        assert re.search(r'vsqs_messages{[^}]*queue="q"[^}]*state="ready"} 20', text)


def test_no_file_io_on_the_event_loop(tmp_path, monkeypatch):
    """Every system call vsqs makes while the gateway answers runs on the thread
    pool: the gateway in-process, with each function of vsqs._core.fs checking where
    it runs."""
    import asyncio
    import inspect

    import uvicorn

    from tests.gateway.server import free_port
    from vsqs._core import fs as _fs
    from vsqs._gateway.app import create_app
    from vsqs._gateway.config import GatewayConfig

    on_the_loop: list[str] = []

    def watched(name, fn):
        def call(*args, **kwargs):
            try:
                asyncio.get_running_loop()
                on_the_loop.append(name)
            except RuntimeError:  # no loop in this thread: a pool thread
                pass
            return fn(*args, **kwargs)

        return call

    for name, fn in inspect.getmembers(_fs, inspect.isfunction):
        # (_unpin: a held directory let go of when the garbage collector frees its last
        # handle, on whatever thread that is: the close of a directory descriptor)
        if fn.__module__ == _fs.__name__ and name != "_unpin":
            monkeypatch.setattr(_fs, name, watched(name, fn))
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(GatewayConfig(spool=str(tmp_path))), port=port,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run)
    thread.start()
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}") as http:
            deadline = time.monotonic() + 20
            while not server.started and time.monotonic() < deadline:
                time.sleep(0.05)
            assert http.put("/queues/q", json={"visibility_timeout": 30}).status_code == 201
            assert http.put("/queues/q").status_code == 200
            http.patch("/queues/q", json={"receive_wait": 1})
            http.post("/queues/q/messages", content=b"raw")
            http.post("/queues/q/messages/batch", json={"messages": [{"body": "a"}, {"body": "b"}]})
            raw = http.get("/queues/q/messages")
            http.delete(f"/queues/q/messages/{raw.headers['Message-Receipt']}")
            got = http.post("/queues/q/messages/receive", json={"max_messages": 2}).json()["messages"]
            moved = http.put(f"/queues/q/messages/{got[0]['receipt']}/visibility", json={"timeout": 5}).json()
            http.post("/queues/q/messages/delete", json={"receipts": [moved["receipt"], got[1]["receipt"]]})
            assert http.get("/queues/q/messages").status_code == 204  # a long poll: receive_wait
            for path in ("/queues", "/queues/q", "/queues/q/stats", "/metrics", "/healthz"):
                assert http.get(path).status_code == 200, path
            http.post("/queues/q/suspend", json={}), http.post("/queues/q/resume", json={})
            http.post("/queues/q/purge"), http.post("/queues/q/redrive", json={})
            sqs = {"X-Amz-Target": "AmazonSQS.SendMessage", "Content-Type": "application/x-amz-json-1.0"}
            url = f"http://127.0.0.1:{port}/000000000000/q"
            assert http.post("/", json={"QueueUrl": url, "MessageBody": "s"}, headers=sqs).status_code == 200
            sqs["X-Amz-Target"] = "AmazonSQS.ReceiveMessage"
            handle = http.post("/", json={"QueueUrl": url}, headers=sqs).json()["Messages"][0]["ReceiptHandle"]
            sqs["X-Amz-Target"] = "AmazonSQS.DeleteMessage"
            assert http.post("/", json={"QueueUrl": url, "ReceiptHandle": handle}, headers=sqs).status_code == 200
            assert http.delete("/queues/q").status_code == 200
    finally:
        server.should_exit = True
        thread.join(10)
    assert on_the_loop == []
