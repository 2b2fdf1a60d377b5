"""FIFO queues through the SQS face as Amazon has them (issue 12): purge
frees groups, DeduplicationScope and FifoThroughputLimit, SequenceNumber.
boto3 against a real `vsqs serve` (the servers of test_sqs.py)."""

from __future__ import annotations

from typing import Any

from tests.gateway.server import Server
from tests.gateway import test_sqs as _base
from tests.gateway.test_sqs import library_queue, new_name

# the servers and client of test_sqs.py (fixtures, found by name)
server, sqs = _base.server, _base.sqs


def fifo_queue(sqs: Any, **attributes: str) -> tuple[str, str]:
    name = new_name("fifo") + ".fifo"
    url = sqs.create_queue(QueueName=name, Attributes={"FifoQueue": "true", **attributes})["QueueUrl"]
    return name, url


def test_purge_frees_a_group_in_flight(sqs: Any) -> None:
    _, url = fifo_queue(sqs)
    sqs.send_message(QueueUrl=url, MessageBody="a0", MessageGroupId="g", MessageDeduplicationId="0")
    held = sqs.receive_message(QueueUrl=url, VisibilityTimeout=3600)["Messages"]
    assert [m["Body"] for m in held] == ["a0"]
    sqs.purge_queue(QueueUrl=url)
    sqs.send_message(QueueUrl=url, MessageBody="a1", MessageGroupId="g", MessageDeduplicationId="1")
    got = sqs.receive_message(QueueUrl=url)
    assert [m["Body"] for m in got.get("Messages", [])] == ["a1"]


def test_dedup_scope_is_the_queue_by_default(sqs: Any, server: Server) -> None:
    name, url = fifo_queue(sqs)
    attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert (attributes["DeduplicationScope"], attributes["FifoThroughputLimit"]) == ("queue", "perQueue")
    first = sqs.send_message(QueueUrl=url, MessageBody="x", MessageGroupId="a", MessageDeduplicationId="d")
    other = sqs.send_message(QueueUrl=url, MessageBody="x", MessageGroupId="b", MessageDeduplicationId="d")
    assert other["MessageId"] == first["MessageId"]
    assert library_queue(server, name).stats().total == 1


def test_dedup_scope_message_group_and_throughput_per_group(sqs: Any, server: Server) -> None:
    name, url = fifo_queue(sqs, DeduplicationScope="messageGroup", FifoThroughputLimit="perMessageGroupId")
    attributes = sqs.get_queue_attributes(
        QueueUrl=url, AttributeNames=["DeduplicationScope", "FifoThroughputLimit"])["Attributes"]
    assert attributes == {"DeduplicationScope": "messageGroup", "FifoThroughputLimit": "perMessageGroupId"}
    first = sqs.send_message(QueueUrl=url, MessageBody="x", MessageGroupId="a", MessageDeduplicationId="d")
    other = sqs.send_message(QueueUrl=url, MessageBody="x", MessageGroupId="b", MessageDeduplicationId="d")
    assert other["MessageId"] != first["MessageId"]
    assert library_queue(server, name).stats().total == 2
    sqs.set_queue_attributes(QueueUrl=url, Attributes={"DeduplicationScope": "queue",
                                                       "FifoThroughputLimit": "perQueue"})
    settings = library_queue(server, name).settings
    assert (settings["dedup_scope"], settings["throughput_limit"]) == ("queue", "queue")


def test_sequence_numbers_on_send_and_receive(sqs: Any) -> None:
    _, url = fifo_queue(sqs, ContentBasedDeduplication="true")
    sent = [sqs.send_message(QueueUrl=url, MessageBody=f"m{i}", MessageGroupId="g")["SequenceNumber"]
            for i in range(2)]
    batch = sqs.send_message_batch(QueueUrl=url, Entries=[
        {"Id": str(i), "MessageBody": f"b{i}", "MessageGroupId": "g"} for i in range(3)])
    sent += [entry["SequenceNumber"] for entry in sorted(batch["Successful"], key=lambda e: int(e["Id"]))]
    assert all(n.isdigit() and len(n) >= 20 for n in sent)
    assert [int(n) for n in sent] == sorted(int(n) for n in sent) and len(set(sent)) == 5
    received = []
    while True:
        got = sqs.receive_message(QueueUrl=url, MessageSystemAttributeNames=["SequenceNumber"])
        if "Messages" not in got:
            break
        for message in got["Messages"]:
            received.append(message["Attributes"]["SequenceNumber"])
            sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
    assert received == sent


def test_no_sequence_number_on_a_standard_queue(sqs: Any) -> None:
    url = sqs.create_queue(QueueName=new_name("std"))["QueueUrl"]
    assert "SequenceNumber" not in sqs.send_message(QueueUrl=url, MessageBody="x")
    message = sqs.receive_message(QueueUrl=url, AttributeNames=["All"])["Messages"][0]
    assert "SequenceNumber" not in message["Attributes"]
