"""The ids the SQS face of `vsqs serve` shows: a message's MessageId and a move
task's id are UUIDs (SDKs parse them: Spring Cloud AWS calls UUID.fromString
on every MessageId), and a message shows the same MessageId on every answer
about it. boto3 against a real gateway."""

from __future__ import annotations

import base64
import json
import os
import re
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import boto3
import botocore.config
import pytest

import vsqs
from tests.gateway.server import Server, running_gateway

UUID_TEXT = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    spool = tmp_path_factory.mktemp("sqs-ids") / "spool"
    spool.mkdir()
    with running_gateway(str(spool), log_dir=str(tmp_path_factory.mktemp("sqs-ids-logs"))) as running:
        yield running
        assert "Traceback" not in running.log(), running.log()


@pytest.fixture(scope="module")
def sqs(server: Server) -> Any:
    return boto3.client("sqs", endpoint_url=server.url, region_name="us-east-1", aws_access_key_id="AKID",
                        aws_secret_access_key="secret", config=botocore.config.Config(retries={"max_attempts": 1}))


def new_name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def arn_of(sqs: Any, url: str) -> str:
    return str(sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"])


def assert_uuid(text: str) -> None:
    """``text`` is a UUID in the canonical lower-case 8-4-4-4-12 form."""
    assert UUID_TEXT.fullmatch(text), text
    assert str(uuid.UUID(text)) == text


def receive_all(sqs: Any, url: str, count: int) -> list[dict[str, Any]]:
    got: list[dict[str, Any]] = []
    while len(got) < count:
        got += sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=10,
                                   VisibilityTimeout=60)["Messages"]
    return got


def wait_for(check: Callable[[], Any], timeout: float = 30) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found or time.monotonic() > deadline:
            assert found, "not reached within the test's deadline"
            return found
        time.sleep(0.05)


def test_sent_and_received_message_ids_are_the_same_distinct_uuids(sqs: Any, server: Server) -> None:
    name = new_name("ids")
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    sent = {"one": sqs.send_message(QueueUrl=url, MessageBody="one")["MessageId"]}
    batch = sqs.send_message_batch(QueueUrl=url, Entries=[{"Id": f"e{i}", "MessageBody": f"b{i}"} for i in range(10)])
    sent.update({f"b{entry['Id'][1:]}": entry["MessageId"] for entry in batch["Successful"]})
    assert len(sent) == 11 and len(set(sent.values())) == 11  # two messages never share an id
    for message_id in sent.values():
        assert_uuid(message_id)
    received = receive_all(sqs, url, 11)
    assert {m["Body"]: m["MessageId"] for m in received} == sent
    # received again (its visibility back to 0): the same id, a new receipt
    first = received[0]
    sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=first["ReceiptHandle"], VisibilityTimeout=0)
    again = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=10, AttributeNames=["ApproximateReceiveCount"])
    [second] = again["Messages"]
    assert (second["MessageId"], second["Attributes"]["ApproximateReceiveCount"]) == (first["MessageId"], "2")
    # the library keeps its own ids; each MessageId maps back to one of them
    library_ids = {info.id for info in vsqs.Spool(server.spool).queue(name).messages()}
    assert {vsqs.Message.id_of_uuid(message_id) for message_id in sent.values()} == library_ids
    assert {vsqs.Message.uuid_of(message_id) for message_id in library_ids} == set(sent.values())


def test_a_message_published_by_the_library_is_received_with_its_uuid(sqs: Any, server: Server) -> None:
    name = new_name("library")
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    message_id = vsqs.Spool(server.spool).queue(name).publish(b"from the library", priority=7)
    [got] = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=10)["Messages"]
    assert_uuid(got["MessageId"])
    assert got["MessageId"] == vsqs.Message.uuid_of(message_id)
    assert vsqs.Message.id_of_uuid(got["MessageId"]) == message_id


def test_a_deduplicated_send_answers_the_first_messages_uuid(sqs: Any, server: Server) -> None:
    url = sqs.create_queue(QueueName=new_name("dedup") + ".fifo", Attributes={"FifoQueue": "true"})["QueueUrl"]
    first = sqs.send_message(QueueUrl=url, MessageBody="a", MessageGroupId="g", MessageDeduplicationId="d1")
    again = sqs.send_message(QueueUrl=url, MessageBody="b", MessageGroupId="g", MessageDeduplicationId="d1")
    batch = sqs.send_message_batch(QueueUrl=url, Entries=[
        {"Id": "x", "MessageBody": "c", "MessageGroupId": "g", "MessageDeduplicationId": "d1"},
        {"Id": "y", "MessageBody": "d", "MessageGroupId": "g", "MessageDeduplicationId": "d2"},
    ])
    assert_uuid(first["MessageId"])
    assert again["MessageId"] == first["MessageId"] == batch["Successful"][0]["MessageId"]
    assert batch["Successful"][1]["MessageId"] != first["MessageId"]
    assert again["SequenceNumber"] == first["SequenceNumber"]  # (still from the vsqs id: unchanged)
    got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=10)["Messages"]
    assert [(m["Body"], m["MessageId"]) for m in got] == [("a", first["MessageId"]),
                                                         ("d", batch["Successful"][1]["MessageId"])]


def test_a_message_keeps_its_id_into_the_dead_letter_queue_and_back(sqs: Any, server: Server) -> None:
    dlq_url = sqs.create_queue(QueueName=new_name("dlq"))["QueueUrl"]
    name = new_name("work")
    policy = json.dumps({"deadLetterTargetArn": arn_of(sqs, dlq_url), "maxReceiveCount": 1})
    url = sqs.create_queue(QueueName=name, Attributes={"RedrivePolicy": policy})["QueueUrl"]
    message_id = sqs.send_message(QueueUrl=url, MessageBody="poison")["MessageId"]
    assert_uuid(message_id)
    [received] = sqs.receive_message(QueueUrl=url, VisibilityTimeout=0, WaitTimeSeconds=10)["Messages"]
    assert received["MessageId"] == message_id
    vsqs.Spool(server.spool).queue(name).requeue_expired()  # received once: into the dead-letter queue
    [dead] = sqs.receive_message(QueueUrl=dlq_url, VisibilityTimeout=0, WaitTimeSeconds=10)["Messages"]
    assert (dead["Body"], dead["MessageId"]) == ("poison", message_id)
    dlq_arn = arn_of(sqs, dlq_url)
    sqs.start_message_move_task(SourceArn=dlq_arn)
    wait_for(lambda: sqs.list_message_move_tasks(SourceArn=dlq_arn)["Results"][0]["Status"] == "COMPLETED")
    [back] = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=10)["Messages"]
    assert (back["Body"], back["MessageId"]) == ("poison", message_id)


def running_task(sqs: Any, server: Server) -> tuple[str, str, str]:
    """A dead-letter queue with a task that another process runs, its state
    written as docs/FORMAT.md (Redrive tasks) gives it: it stays RUNNING (no
    runner here finishes it, and its `updated` never reads as stale in a test).
    (the queue's ARN, its .moves directory, the vsqs task id)"""
    dlq_name = new_name("dlq")
    dlq_url = sqs.create_queue(QueueName=dlq_name)["QueueUrl"]
    task_id = f"{int(time.time() * 1000):013d}-{os.urandom(4).hex()}"
    moves = os.path.join(server.spool, dlq_name, ".moves")
    os.mkdir(moves)
    state = {"id": task_id, "status": "RUNNING", "destination": None, "per_second": 1, "moved": 3,
             "to_move": 10, "started": time.time(), "updated": time.time() + 3600, "failure": None}
    with open(os.path.join(moves, task_id + ".json"), "w", encoding="utf-8") as file:
        json.dump(state, file)
    return arn_of(sqs, dlq_url), moves, task_id


def test_a_move_tasks_handle_carries_a_uuid_task_id_that_cancels_it(sqs: Any, server: Server) -> None:
    dlq_arn, moves, task_id = running_task(sqs, server)
    [running] = sqs.list_message_move_tasks(SourceArn=dlq_arn)["Results"]
    assert running["Status"] == "RUNNING"
    handle = json.loads(base64.urlsafe_b64decode(running["TaskHandle"]))
    assert set(handle) == {"taskId", "sourceArn"} and handle["sourceArn"] == dlq_arn
    assert_uuid(handle["taskId"])
    assert task_id not in running["TaskHandle"] and handle["taskId"] != task_id
    again = sqs.list_message_move_tasks(SourceArn=dlq_arn)["Results"][0]["TaskHandle"]
    assert again == running["TaskHandle"]  # the same task, the same id
    assert sqs.cancel_message_move_task(TaskHandle=running["TaskHandle"])["ApproximateNumberOfMessagesMoved"] == 3
    assert os.path.exists(os.path.join(moves, task_id + ".cancel"))
    assert sqs.list_message_move_tasks(SourceArn=dlq_arn)["Results"][0]["Status"] == "CANCELLING"


def test_a_started_move_tasks_handle_carries_a_uuid_task_id(sqs: Any) -> None:
    dlq_url = sqs.create_queue(QueueName=new_name("dlq"))["QueueUrl"]
    policy = json.dumps({"deadLetterTargetArn": arn_of(sqs, dlq_url), "maxReceiveCount": 1})
    sqs.create_queue(QueueName=new_name("work"), Attributes={"RedrivePolicy": policy})
    started = sqs.start_message_move_task(SourceArn=arn_of(sqs, dlq_url))["TaskHandle"]
    handle = json.loads(base64.urlsafe_b64decode(started))
    assert_uuid(handle["taskId"])


def test_a_handle_that_names_the_vsqs_task_id_cancels_the_task(sqs: Any, server: Server) -> None:
    """The handles of gateways of earlier vsqs releases (mixed versions on one spool) carry the vsqs task id."""
    dlq_arn, moves, task_id = running_task(sqs, server)
    doc = json.dumps({"taskId": task_id, "sourceArn": dlq_arn}, separators=(",", ":"))
    handle = base64.urlsafe_b64encode(doc.encode()).decode("ascii")
    assert sqs.cancel_message_move_task(TaskHandle=handle)["ApproximateNumberOfMessagesMoved"] == 3
    assert os.path.exists(os.path.join(moves, task_id + ".cancel"))
