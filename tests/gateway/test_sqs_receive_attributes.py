"""ReceiveMessage's ApproximateFirstReceiveTimestamp and DeadLetterQueueSourceArn,
against a real `vsqs serve`: with boto3 (JSON 1.0) and with a raw Query
request (form in, XML out)."""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from typing import Any

import boto3
import botocore.config
import httpx
import pytest

import vsqs
from tests.conftest import message_path
from tests.gateway.server import Server, running_gateway
from vsqs._core import format as _format

NS = "{http://queue.amazonaws.com/doc/2012-11-05/}"
FIRST, SOURCE = "ApproximateFirstReceiveTimestamp", "DeadLetterQueueSourceArn"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A gateway with no keys: boto3's signature and a bare form are both accepted."""
    spool = tmp_path_factory.mktemp("receive-attributes") / "spool"
    spool.mkdir()
    with running_gateway(str(spool), log_dir=str(tmp_path_factory.mktemp("receive-attributes-logs"))) as running:
        yield running
        assert "Traceback" not in running.log(), running.log()


@pytest.fixture(scope="module")
def sqs(server: Server) -> Any:
    return boto3.client("sqs", endpoint_url=server.url, region_name="us-east-1", aws_access_key_id="AKID",
                        aws_secret_access_key="secret", config=botocore.config.Config(retries={"max_attempts": 1}))


def new_name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def arn_of(sqs: Any, url: str) -> str:
    return sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]


def dead_letter_pair(sqs: Any, server: Server) -> tuple[str, str, str]:
    """A queue whose messages die at their second receive, and its dead-letter queue: (url, name, dlq url)."""
    dlq_url = sqs.create_queue(QueueName=new_name("dlq"))["QueueUrl"]
    policy = json.dumps({"deadLetterTargetArn": arn_of(sqs, dlq_url), "maxReceiveCount": 2})
    name = new_name("work")
    url = sqs.create_queue(QueueName=name, Attributes={"RedrivePolicy": policy})["QueueUrl"]
    return url, name, dlq_url


def test_the_first_receive_is_reported_and_kept(sqs: Any) -> None:
    url = sqs.create_queue(QueueName=new_name("first"))["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="hello")
    before = now_ms()
    first = sqs.receive_message(QueueUrl=url, VisibilityTimeout=0, WaitTimeSeconds=10,
                                MessageSystemAttributeNames=[FIRST])["Messages"][0]
    after = now_ms()
    assert set(first["Attributes"]) == {FIRST}
    stamp = int(first["Attributes"][FIRST])
    assert before <= stamp <= after
    # the second receive reports the first one's time; "ALL" in any case asks for it too
    again = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=10, AttributeNames=["ALL"])["Messages"][0]
    assert again["Attributes"]["ApproximateReceiveCount"] == "2"
    assert again["Attributes"][FIRST] == str(stamp)
    assert SOURCE not in again["Attributes"]  # no dead letter


def test_a_message_first_received_by_an_older_vsqs_has_no_first_receive(sqs: Any, server: Server) -> None:
    name = new_name("older")
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    queue = vsqs.Spool(server.spool).queue(name)
    key = _format.new_key()
    with open(message_path(queue, _format.ready_name(key, 3)), "wb") as file:  # a name without -r (an older vsqs)
        file.write(b"from before")
    got = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=10, AttributeNames=["All"])["Messages"][0]
    assert (got["MessageId"], got["Body"]) == (vsqs.Message.uuid_of(key), "from before")
    assert got["Attributes"]["ApproximateReceiveCount"] == "4"
    assert FIRST not in got["Attributes"]  # unknown: left out, not guessed


def test_a_dead_letter_reports_its_source_queue(sqs: Any, server: Server) -> None:
    url, name, dlq_url = dead_letter_pair(sqs, server)
    sqs.send_message(QueueUrl=url, MessageBody="poison")
    first = sqs.receive_message(QueueUrl=url, VisibilityTimeout=0, WaitTimeSeconds=10,
                                AttributeNames=[FIRST])["Messages"][0]
    assert sqs.receive_message(QueueUrl=url, VisibilityTimeout=0, WaitTimeSeconds=10)["Messages"]
    vsqs.Spool(server.spool).queue(name).requeue_expired()  # received twice: into the dead-letter queue
    dead = sqs.receive_message(QueueUrl=dlq_url, WaitTimeSeconds=10,
                               MessageSystemAttributeNames=[SOURCE, FIRST])["Messages"][0]
    assert dead["Body"] == "poison"
    assert dead["Attributes"] == {SOURCE: arn_of(sqs, url), FIRST: first["Attributes"][FIRST]}


def test_a_query_receive_reports_both(sqs: Any, server: Server) -> None:
    url, name, dlq_url = dead_letter_pair(sqs, server)
    sqs.send_message(QueueUrl=url, MessageBody="by form")
    for _ in range(2):
        assert sqs.receive_message(QueueUrl=url, VisibilityTimeout=0, WaitTimeSeconds=10)["Messages"]
    vsqs.Spool(server.spool).queue(name).requeue_expired()
    answer = httpx.post(server.url + "/", timeout=30, data={
        "Action": "ReceiveMessage", "QueueUrl": dlq_url, "Version": "2012-11-05", "WaitTimeSeconds": "10",
        "AttributeName.1": "All"})
    assert answer.status_code == 200, answer.text
    message = ET.fromstring(answer.content).find(f"{NS}ReceiveMessageResult/{NS}Message")
    assert message is not None and message.findtext(f"{NS}Body") == "by form"
    attributes = {a.findtext(f"{NS}Name"): a.findtext(f"{NS}Value") for a in message.findall(f"{NS}Attribute")}
    assert attributes[SOURCE] == arn_of(sqs, url)
    assert int(attributes[FIRST]) <= now_ms() and attributes["ApproximateReceiveCount"] == "3"


@pytest.mark.parametrize("entry", ["recorded", "missing"])
@pytest.mark.parametrize("long_poll", [True, False], ids=["long_poll", "first_attempt"])
def test_dead_letter_sources_are_looked_up_off_the_event_loop(tmp_path: Any, monkeypatch: pytest.MonkeyPatch,
                                                             entry: str, long_poll: bool) -> None:
    """The ``.sources`` entry of a dead letter that a receive found (by its
    first attempt or by a long poll) is read in the worker thread, never on the
    event loop: on a network filesystem that read would stall every other
    request. A missing entry too (nothing remembered: it is not read again)."""
    from tests.gateway.test_fast_paths import call, sqs_headers
    from vsqs._core import dead_letters as _dead_letters
    from vsqs._gateway.app import create_app
    from vsqs._gateway.config import GatewayConfig

    spool = vsqs.Spool(tmp_path / "spool", create=True)
    jobs = spool.create_queue("jobs", max_receives=1, dead_letter="jobs-dlq")
    spool.create_queue("jobs-dlq")
    jobs.publish(b"poison")
    assert jobs.receive(visibility_timeout=0) is not None
    jobs.requeue_expired()  # received max_receives times: into the dead-letter queue
    _dead_letters._SOURCE_NAMES.clear()  # not looked up yet in this process
    if entry == "missing":
        os.unlink(os.path.join(spool.queue("jobs-dlq").path, _format.SOURCES_DIR, jobs.id))
    reads: list[bool] = []  # for each read of an entry: whether it ran on an event loop
    real_read = _dead_letters._fs.read_control

    def read_control(path: str) -> bytes | None:
        try:
            asyncio.get_running_loop()
            reads.append(True)
        except RuntimeError:
            reads.append(False)
        return real_read(path)

    monkeypatch.setattr(_dead_letters._fs, "read_control", read_control)
    real_receive = vsqs.Queue.receive_batch
    attempts: list[int] = []

    def receive_batch(self: vsqs.Queue, *args: Any, **kwargs: Any) -> list[vsqs.Message]:
        attempts.append(1)
        if long_poll and len(attempts) == 1:
            return []  # the first attempt finds nothing: the long poll's finds it
        return real_receive(self, *args, **kwargs)

    monkeypatch.setattr(vsqs.Queue, "receive_batch", receive_batch)
    request = json.dumps({"QueueUrl": "jobs-dlq", "WaitTimeSeconds": 20, "AttributeNames": ["All"]}).encode()
    status, _, body = call(create_app(GatewayConfig(spool=str(tmp_path / "spool"))), "POST", "/",
                           sqs_headers("ReceiveMessage"), [request])
    assert status == 200, body
    (message,) = json.loads(body)["Messages"]
    assert message["Attributes"].get(SOURCE, ":missing").endswith(":jobs" if entry == "recorded" else ":missing")
    assert len(attempts) == 1  # (with long_poll, found by the long poll's own attempts: areceive_batch)
    assert reads and not any(reads)
