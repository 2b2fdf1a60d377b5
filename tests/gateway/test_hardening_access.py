"""Who can drive a gateway, and what it gives away,
against real `vsqs serve` processes on loopback.

* item 2: a web page must not drive a gateway that has no key: requests another
  origin sent, a ``Host`` the server was not started for (DNS rebinding), and
  bodies in content types a route does not document are refused; loopback
  names and real clients (boto3, the AWS CLI) keep working;
* item 6: a receipt handle made up from what is public deletes nothing;
* item 7: no secret in the workers' environment, no spool path in ``/metrics``,
  queue URLs from ``--public-url``.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi", reason="the gateway needs the server extra: pip install 'vsqs[server]'")
import boto3
import botocore
import botocore.config
import httpx

import vsqs
from tests.gateway.server import Server, running_gateway, tree_around
from tests.mersenne import KEYS_NEEDED, next_tag_after

EVIL = "http://attacker.example"
REBOUND = "rebound.attacker.example"  # a name whose DNS the attacker pointed at 127.0.0.1
PUBLIC = "queues.example.com"  # a proxy's public name
ALSO_PUBLIC = "sqs.example.org"  # given in $VSQS_PUBLIC_HOSTS
AWS_CLI = str(Path(sys.executable).with_name("aws"))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The default set-up: loopback, no API key, no AWS key pair."""
    spool = str(tmp_path_factory.mktemp("access") / "spool")
    os.mkdir(spool)
    with running_gateway(spool) as server:
        yield server


@pytest.fixture(scope="module")
def proxied(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """Behind a proxy: public names and a public URL."""
    spool = str(tmp_path_factory.mktemp("proxied") / "spool")
    os.mkdir(spool)
    with running_gateway(spool, "--public-host", PUBLIC, "--public-url", f"https://{PUBLIC}",
                         env={"VSQS_PUBLIC_HOSTS": f"{ALSO_PUBLIC}, other.example.net"}) as server:
        yield server


@pytest.fixture
def http(server: Server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=30) as client:
        yield client


@pytest.fixture
def queue_name(request: pytest.FixtureRequest, http: httpx.Client) -> Iterator[str]:
    name = request.node.name.replace("[", "-").replace("]", "")[:60].strip("-_.")
    assert http.put(f"/queues/{name}").status_code == 201
    assert http.post(f"/queues/{name}/messages", content=b"seed").status_code == 201
    yield name
    http.delete(f"/queues/{name}")


def port_of(server: Server) -> int:
    return int(server.url.rsplit(":", 1)[1])


def sqs_client(server: Server, endpoint: str | None = None) -> Any:
    return boto3.client("sqs", endpoint_url=endpoint or server.url, region_name="us-east-1",
                        aws_access_key_id="AKIDANY", aws_secret_access_key="any",
                        config=botocore.config.Config(retries={"max_attempts": 1}))


def untouched(server: Server, name: str) -> bool:
    """The queue still holds its one seed message, ready, and is not suspended."""
    queue = vsqs.Spool(server.spool).queue(name)
    stats = queue.stats()
    return (stats.ready, stats.total) == (1, 1) and not queue.settings.get("suspended")


# -- item 2: browsers -------------------------------------------------------------


@pytest.mark.parametrize("headers", [
    {"Origin": EVIL, "Content-Type": "text/plain"},
    {"Origin": EVIL, "Sec-Fetch-Site": "cross-site", "Content-Type": "text/plain"},
    {"Sec-Fetch-Site": "cross-site"},  # an older page's form, or a fetch that sends no Origin
    {"Origin": "null", "Content-Type": "text/plain"},  # a sandboxed frame, a file: page
    {"Origin": f"http://127.0.0.1:{1}", "Sec-Fetch-Site": "same-site"},  # another port of this host
], ids=["origin", "origin+fetch-site", "fetch-site", "null-origin", "same-site"])
def test_a_page_of_another_origin_cannot_drive_a_keyless_gateway(server, http, queue_name, headers):
    entries = tree_around(server.spool)
    attempts = [
        ("POST", f"/queues/{queue_name}/messages", b"from a web page"),  # publish
        ("POST", f"/queues/{queue_name}/purge", b""),
        ("POST", f"/queues/{queue_name}/suspend", b""),
        ("GET", f"/queues/{queue_name}/messages", b""),  # a raw receive, as an <img> would
        ("DELETE", f"/queues/{queue_name}", b""),
        ("PUT", "/queues/planted", b""),
    ]
    for method, path, body in attempts:
        refused = http.request(method, path, content=body, headers=headers)
        assert refused.status_code == 403, (method, path, refused.text)
        assert refused.json()["error"]["code"] == "cross_origin_request"
    sqs_headers = {**headers, "X-Amz-Target": "AmazonSQS.ListQueues", "Content-Type": "application/x-amz-json-1.0"}
    refused = http.post("/", content=b"{}", headers=sqs_headers)
    assert (refused.status_code, refused.json()["__type"]) == (403, "com.amazonaws.sqs#AccessDenied")
    assert untouched(server, queue_name)
    assert tree_around(server.spool) == entries
    for page in ("/docs", "/healthz"):  # they change nothing: a link to them from elsewhere works
        assert http.get(page, headers=headers).status_code == 200


def test_a_rebound_host_is_refused(server, http, queue_name):
    """DNS rebinding: the page's own name now points at the gateway, so its
    requests are same-origin in the browser; the Host still names the page."""
    host = f"{REBOUND}:{port_of(server)}"
    own = {"Host": host, "Origin": f"http://{host}", "Sec-Fetch-Site": "same-origin"}
    for method, path, body in [("GET", "/queues", b""), ("POST", f"/queues/{queue_name}/messages", b"x"),
                               ("POST", f"/queues/{queue_name}/purge", b""), ("GET", "/metrics", b"")]:
        for headers in (own, {"Host": host}):
            refused = http.request(method, path, content=body, headers=headers)
            assert refused.status_code == 421, (method, path, refused.text)
            assert refused.json()["error"]["code"] == "misdirected_request"
    sqs = {"Host": host, "X-Amz-Target": "AmazonSQS.ListQueues", "Content-Type": "application/x-amz-json-1.0"}
    refused = http.post("/", content=b"{}", headers=sqs)
    assert (refused.status_code, refused.json()["__type"]) == (421, "com.amazonaws.sqs#MisdirectedRequest")
    for bad in ("localhost.attacker.example", "127.0.0.1.nip.io", "localhost:80:80", "", "[::1"):
        assert http.get("/queues", headers={"Host": bad}).status_code in (400, 421), bad
    assert untouched(server, queue_name)


def test_loopback_names_and_real_clients_keep_working(server, http, queue_name):
    port = port_of(server)
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}", "localhost", f"LOCALHOST.:{port}"):
        assert http.get("/queues", headers={"Host": host}).status_code == 200, host
    # the gateway's own pages (/docs "try it out"): same origin
    own = {"Origin": server.url, "Sec-Fetch-Site": "same-origin", "Content-Type": "text/plain"}
    assert http.post(f"/queues/{queue_name}/messages", content=b"from /docs", headers=own).status_code == 201
    assert http.get("/healthz", headers={"Sec-Fetch-Site": "none"}).status_code == 200  # a URL typed in
    for endpoint in (server.url, f"http://localhost:{port}"):
        client = sqs_client(server, endpoint)
        url = client.create_queue(QueueName=f"boto-{port}")["QueueUrl"]
        client.send_message(QueueUrl=url, MessageBody="hi")
        assert url.startswith(endpoint + "/")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_ACCESS_KEY_ID="AKIDANY", AWS_SECRET_ACCESS_KEY="any", AWS_DEFAULT_REGION="us-east-1",
               AWS_CONFIG_FILE="/dev/null", AWS_SHARED_CREDENTIALS_FILE="/dev/null", AWS_PAGER="")
    done = subprocess.run([sys.executable, AWS_CLI, "sqs", "list-queues", "--endpoint-url", f"http://localhost:{port}",
                           "--output", "json"], capture_output=True, timeout=60, env=env, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert f"http://localhost:{port}/000000000000/boto-{port}" in json.loads(done.stdout)["QueueUrls"]


def test_each_face_takes_only_its_documented_content_types(server, http, queue_name):
    batch = json.dumps({"messages": [{"body": "x"}]}).encode()
    for content_type in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", None):
        headers = {"Content-Type": content_type} if content_type else {}
        for method, path, body in [("POST", f"/queues/{queue_name}/messages/batch", batch),
                                   ("PUT", "/queues/planted", b"{}"),
                                   ("POST", f"/queues/{queue_name}/suspend", b"{}"),
                                   ("PATCH", f"/queues/{queue_name}", b'{"max_messages": 1}')]:
            refused = http.request(method, path, content=body, headers=headers)
            assert refused.status_code == 415, (content_type, method, path, refused.text)
            assert refused.json()["error"]["code"] == "unsupported_media_type"
        if content_type:
            refused = http.post(f"/queues/{queue_name}/purge", headers=headers)
            assert refused.status_code == 415
            sqs = {"X-Amz-Target": "AmazonSQS.CreateQueue", "Content-Type": content_type}
            refused = http.post("/", content=b'{"QueueName": "planted"}', headers=sqs)
            assert (refused.status_code, refused.json()["__type"]) == (415, "com.amazonaws.sqs#UnsupportedMediaType")
    assert untouched(server, queue_name)
    assert "planted" not in os.listdir(server.spool)
    # what the documentation promises still works
    json_type = {"Content-Type": "application/json; charset=utf-8"}
    assert http.post(f"/queues/{queue_name}/messages/batch", content=batch, headers=json_type).status_code == 201
    assert http.post(f"/queues/{queue_name}/messages", content=b"raw",  # raw publish: any type, kept
                     headers={"Content-Type": "text/plain"}).status_code == 201
    assert http.post(f"/queues/{queue_name}/purge").json() == {"count": 3}  # no body, no type


def test_public_names_and_the_public_url(proxied):
    port = port_of(proxied)
    with httpx.Client(base_url=proxied.url, timeout=30) as http:
        for host in (PUBLIC, f"{PUBLIC}:443", ALSO_PUBLIC, "other.example.net", f"localhost:{port}"):
            assert http.get("/queues", headers={"Host": host}).status_code == 200, host
        assert http.get("/queues", headers={"Host": "elsewhere.example.com"}).status_code == 421
        # a page served under the public name (through the proxy) is the gateway's own
        page = {"Host": f"127.0.0.1:{port}", "Origin": f"https://{PUBLIC}", "Sec-Fetch-Site": "same-origin"}
        assert http.put("/queues/from-page", headers=page).status_code == 201
        assert http.put("/queues/other", headers={**page, "Origin": EVIL}).status_code == 403
    client = sqs_client(proxied)
    url = client.create_queue(QueueName="public")["QueueUrl"]
    assert url == f"https://{PUBLIC}/000000000000/public"
    assert client.get_queue_url(QueueName="public")["QueueUrl"] == url
    assert url in client.list_queues()["QueueUrls"]
    client.send_message(QueueUrl=url, MessageBody="through the proxy")  # the public URL addresses the queue
    assert client.receive_message(QueueUrl=url)["Messages"][0]["Body"] == "through the proxy"


def test_public_host_and_url_are_checked(tmp_path):
    for args in (["--public-host", "*.example.com"], ["--public-host", "a b"], ["--public-url", "ftp://x"],
                 ["--public-url", f"https://{PUBLIC}/prefix"], ["--public-url", "https://user:pw@host"]):
        done = subprocess.run([sys.executable, "-m", "vsqs", "serve", str(tmp_path), *args, "--port", "1"],
                              capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 2 and "Invalid value" in done.stderr, (args, done.stderr)


# -- item 6: forged receipts ------------------------------------------------------


def test_a_receipt_handle_made_from_published_ids_deletes_nothing(server):
    """The attack of the report: the ids of ~400 sends rebuild the generator
    that also made tags; a handle with the predicted tag (or with the first 6
    digits of the real one) deleted another consumer's message."""
    sqs = sqs_client(server)
    url = sqs.create_queue(QueueName="forgery")["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="mine")
    own = sqs.receive_message(QueueUrl=url)["Messages"][0]["ReceiptHandle"]  # the queue id is in any receipt
    sqs.delete_message(QueueUrl=url, ReceiptHandle=own)
    ids: list[str] = []
    while len(ids) < KEYS_NEEDED + 88:
        sent = sqs.send_message_batch(QueueUrl=url, Entries=[{"Id": str(i), "MessageBody": "x"} for i in range(10)])
        entries = sorted(sent["Successful"], key=lambda e: int(e["Id"]))
        ids += [vsqs.Message.id_of_uuid(entry["MessageId"]) for entry in entries]  # a MessageId gives its key back
    predicted = next_tag_after(ids)
    victim = sqs.receive_message(QueueUrl=url, VisibilityTimeout=600)["Messages"][0]
    real_tag = victim["ReceiptHandle"].rsplit(".", 1)[1]
    queue_id = own.split(":", 1)[0]
    for tag in (predicted, real_tag[:6] + ("000000" if real_tag[6:] != "000000" else "ffffff")):
        forged = f"{queue_id}:{vsqs.Message.id_of_uuid(victim['MessageId'])}.1700000000000000.1.{tag}"
        sqs.delete_message(QueueUrl=url, ReceiptHandle=forged)  # SQS: a stale handle deletes nothing, quietly
        sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=victim["ReceiptHandle"], VisibilityTimeout=600)
    stats = vsqs.Spool(server.spool).queue("forgery").stats()
    assert stats.in_flight == 1 and stats.total == len(ids)
    sqs.delete_message(QueueUrl=url, ReceiptHandle=victim["ReceiptHandle"])  # the genuine handle still works
    assert vsqs.Spool(server.spool).queue("forgery").stats().in_flight == 0


# -- item 7: secrets, paths and URLs --------------------------------------------------


def test_metrics_name_queues_not_paths(server, http, queue_name):
    text = http.get("/metrics").text
    assert f'vsqs_messages{{queue="{queue_name}",state="ready"}} 1.0' in text
    assert server.spool not in text and os.path.dirname(server.spool) not in text


def test_queue_urls_follow_the_host_without_a_public_url(server):
    url = sqs_client(server).create_queue(QueueName="hosted")["QueueUrl"]
    assert url == f"{server.url}/000000000000/hosted"


def _descendants(pid: int) -> list[int]:
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as f:
                    parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        children = [child for child, ppid in parents.items() if ppid == parent]
        found += children
        todo += children
    return found


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads /proc")
def test_workers_hold_no_secret_in_their_environment(tmp_path):
    api_key, aws_secret = "api-key-d41d8cd98f00b204", "aws-secret-e9800998ecf8427e"
    key_file = tmp_path / "key"
    key_file.write_text(api_key + "\n")
    private_tmp = tmp_path / "tmp"
    private_tmp.mkdir()
    spool = tmp_path / "spool"
    spool.mkdir()
    env = {"TMPDIR": str(private_tmp), "VSQS_AWS_ACCESS_KEY_ID": "AKIDWORKERS",
           "VSQS_AWS_SECRET_ACCESS_KEY": aws_secret}
    with running_gateway(str(spool), "--workers", "2", "--api-key-file", str(key_file), env=env,
                         log_dir=str(tmp_path)) as server:
        deadline = time.monotonic() + 60
        while True:  # both workers started (the health check answered from one)
            workers = [pid for pid in _descendants(server.process.pid) if _reads(f"/proc/{pid}/cmdline")]
            if len([pid for pid in workers if b"spawn_main" in _reads(f"/proc/{pid}/cmdline")]) >= 2:
                break
            assert time.monotonic() < deadline, "the workers did not start"
            time.sleep(0.1)
        for pid in workers:
            environ = _reads(f"/proc/{pid}/environ")
            assert api_key.encode() not in environ and aws_secret.encode() not in environ, pid
        (private,) = [entry for entry in private_tmp.iterdir() if entry.name.startswith("vsqs-gateway-")]
        assert stat.S_IMODE(private.stat().st_mode) == 0o700
        config_files = [entry for entry in private.iterdir() if entry.is_file()]
        assert config_files and all(stat.S_IMODE(f.stat().st_mode) == 0o600 for f in config_files)
        headers = {"Authorization": f"Bearer {api_key}"}
        assert httpx.get(server.url + "/queues", headers=headers, timeout=30).status_code == 200
        assert httpx.get(server.url + "/queues", timeout=30).status_code == 401
    assert [entry.name for entry in private_tmp.iterdir()] == []  # removed at exit


def _reads(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return b""
