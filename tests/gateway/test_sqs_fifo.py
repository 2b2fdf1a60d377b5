"""FIFO queues through the SQS face as Amazon has them (issue 12): purge
frees groups, DeduplicationScope and FifoThroughputLimit, SequenceNumber.
boto3 against a real `vsqs serve` (the servers of test_sqs.py)."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.gateway import test_sqs as _base
from tests.gateway.server import Server
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


def _bodies(got: dict[str, Any]) -> list[str]:
    return [m["Body"] for m in got.get("Messages", [])]


def _send(sqs: Any, url: str, group: str, *bodies: str) -> None:
    for body in bodies:
        sqs.send_message(QueueUrl=url, MessageBody=body, MessageGroupId=group, MessageDeduplicationId=body)


def test_one_receive_takes_a_groups_next_messages_in_order(sqs: Any) -> None:
    _, url = fifo_queue(sqs)
    _send(sqs, url, "g", *(f"g{i}" for i in range(5)))
    got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=3600)
    assert _bodies(got) == [f"g{i}" for i in range(5)]  # as Amazon: the whole group, in order


def test_a_run_holds_its_group_until_each_message_is_deleted(sqs: Any) -> None:
    _, url = fifo_queue(sqs)
    _send(sqs, url, "g", *(f"g{i}" for i in range(5)))
    _send(sqs, url, "h", "h0")
    run = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=3, VisibilityTimeout=3600)["Messages"]
    assert [m["Body"] for m in run] == ["g0", "g1", "g2"]
    assert _bodies(sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)) == ["h0"]  # g is held
    for message in run[:2]:
        sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
        assert _bodies(sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)) == []  # still held by g2
    sqs.delete_message(QueueUrl=url, ReceiptHandle=run[2]["ReceiptHandle"])
    assert _bodies(sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)) == ["g3", "g4"]


def test_a_member_made_visible_comes_back_before_the_rest_of_its_group(sqs: Any) -> None:
    _, url = fifo_queue(sqs)
    _send(sqs, url, "g", *(f"g{i}" for i in range(5)))
    run = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=4, VisibilityTimeout=3600)["Messages"]
    assert [m["Body"] for m in run] == ["g0", "g1", "g2", "g3"]
    sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=run[1]["ReceiptHandle"], VisibilityTimeout=0)
    assert _bodies(sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)) == []  # g0, g2, g3 in flight
    extended = sqs.change_message_visibility_batch(QueueUrl=url, Entries=[
        {"Id": str(i), "ReceiptHandle": run[i]["ReceiptHandle"], "VisibilityTimeout": 7200} for i in (0, 2)])
    assert len(extended["Successful"]) == 2
    for i in (0, 2, 3):
        sqs.delete_message(QueueUrl=url, ReceiptHandle=run[i]["ReceiptHandle"])
    again = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, AttributeNames=["ApproximateReceiveCount"])
    assert _bodies(again) == ["g1", "g4"]  # g1 first, then the rest of the group
    assert [m["Attributes"]["ApproximateReceiveCount"] for m in again["Messages"]] == ["2", "1"]


def test_a_run_dead_letters_after_max_receive_count(sqs: Any) -> None:
    _, dlq_url = fifo_queue(sqs)
    arn = sqs.get_queue_attributes(QueueUrl=dlq_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    policy = json.dumps({"deadLetterTargetArn": arn, "maxReceiveCount": "2"})
    _, url = fifo_queue(sqs, RedrivePolicy=policy)
    _send(sqs, url, "g", "g0", "g1", "g2")
    run = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)["Messages"]
    assert [m["Body"] for m in run] == ["g0", "g1", "g2"]
    sqs.change_message_visibility_batch(QueueUrl=url, Entries=[
        {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"], "VisibilityTimeout": 0} for i, m in enumerate(run)])
    # back in order (the gateway may hand them out alone until it lists the queue again: its own moves)
    again: list[str] = []
    while got := sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10).get("Messages"):
        again += [m["Body"] for m in got]
        sqs.change_message_visibility_batch(QueueUrl=url, Entries=[
            {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"], "VisibilityTimeout": 0} for i, m in enumerate(got)])
    assert again == ["g0", "g1", "g2"]  # the second receive of each; the third dead-letters them
    assert _bodies(sqs.receive_message(QueueUrl=dlq_url, MaxNumberOfMessages=10)) == ["g0", "g1", "g2"]


def test_a_fifo_send_with_delay_seconds_0_takes_the_queues_delay(sqs: Any, server: Server) -> None:
    name, url = fifo_queue(sqs, DelaySeconds="900")
    sqs.send_message(QueueUrl=url, MessageBody="a", MessageGroupId="g", MessageDeduplicationId="a", DelaySeconds=0)
    sqs.send_message_batch(QueueUrl=url, Entries=[
        {"Id": "b", "MessageBody": "b", "MessageGroupId": "g", "MessageDeduplicationId": "b", "DelaySeconds": 0}])
    assert _bodies(sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)) == []
    assert library_queue(server, name).stats().delayed == 2


def test_a_standard_send_with_delay_seconds_0_overrides_the_queues_delay(sqs: Any) -> None:
    url = sqs.create_queue(QueueName=new_name("std"), Attributes={"DelaySeconds": "900"})["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="now", DelaySeconds=0)
    assert _bodies(sqs.receive_message(QueueUrl=url)) == ["now"]  # Amazon: the message's own delay wins


def _expired_text(handle: str) -> str:
    return f"Value {handle} for parameter ReceiptHandle is invalid. Reason: The receipt handle has expired."


def test_a_fifo_delete_with_a_handle_whose_timeout_ran_out_is_refused(sqs: Any, server: Server) -> None:
    name, url = fifo_queue(sqs)
    _send(sqs, url, "g", "a")
    handle = sqs.receive_message(QueueUrl=url, VisibilityTimeout=0)["Messages"][0]["ReceiptHandle"]
    with pytest.raises(ClientError) as caught:
        sqs.delete_message(QueueUrl=url, ReceiptHandle=handle)
    error = caught.value.response["Error"]
    assert (error["Code"], error["Message"]) == ("InvalidParameterValue", _expired_text(handle))
    assert caught.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400
    assert library_queue(server, name).stats().total == 1  # nothing deleted: the message comes back
    batch = sqs.delete_message_batch(QueueUrl=url, Entries=[{"Id": "0", "ReceiptHandle": handle}])
    assert batch["Failed"] == [{"Id": "0", "SenderFault": True, "Code": "InvalidParameterValue",
                                "Message": _expired_text(handle)}]
    again = sqs.receive_message(QueueUrl=url, VisibilityTimeout=3600)["Messages"][0]  # received again
    with pytest.raises(ClientError) as caught:
        sqs.delete_message(QueueUrl=url, ReceiptHandle=handle)
    assert caught.value.response["Error"]["Message"] == _expired_text(handle)
    sqs.delete_message(QueueUrl=url, ReceiptHandle=again["ReceiptHandle"])
    assert library_queue(server, name).stats().total == 0


def test_a_fifo_delete_after_an_extension_uses_the_extended_timeout(sqs: Any, server: Server) -> None:
    name, url = fifo_queue(sqs, VisibilityTimeout="0")
    _send(sqs, url, "g", "a")
    handle = sqs.receive_message(QueueUrl=url, VisibilityTimeout=3600)["Messages"][0]["ReceiptHandle"]
    sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=handle, VisibilityTimeout=7200)
    sqs.delete_message(QueueUrl=url, ReceiptHandle=handle)
    assert library_queue(server, name).stats().total == 0


def test_a_standard_delete_with_a_handle_whose_timeout_ran_out_still_deletes(sqs: Any, server: Server) -> None:
    name = new_name("std")
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="a")
    handle = sqs.receive_message(QueueUrl=url, VisibilityTimeout=0)["Messages"][0]["ReceiptHandle"]
    sqs.delete_message(QueueUrl=url, ReceiptHandle=handle)  # not received again since: it still holds it
    assert library_queue(server, name).stats().total == 0


def test_purge_forgets_the_deduplication_ids_of_what_it_removed(sqs: Any) -> None:
    _, url = fifo_queue(sqs)
    first = sqs.send_message(QueueUrl=url, MessageBody="a", MessageGroupId="g", MessageDeduplicationId="d")
    sqs.purge_queue(QueueUrl=url)
    again = sqs.send_message(QueueUrl=url, MessageBody="b", MessageGroupId="g", MessageDeduplicationId="d")
    assert again["MessageId"] != first["MessageId"]
    assert _bodies(sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)) == ["b"]


def test_fifo_delete_is_refused_when_another_gateway_shortened_the_timeout(sqs: Any, server: Server) -> None:
    """The handle's lease was lowered through another gateway (here: the library, as that gateway
    does) and has run out: as Amazon, "The receipt handle has expired", and the message stays (it
    comes back), though the handle this gateway knows has an hour to run."""
    name, url = fifo_queue(sqs)
    _send(sqs, url, "g", "a")
    handle = sqs.receive_message(QueueUrl=url, VisibilityTimeout=3600)["Messages"][0]["ReceiptHandle"]
    library_queue(server, name).change_visibility(handle, 1)  # ChangeMessageVisibility(1) on another gateway
    time.sleep(1.5)
    try:
        sqs.delete_message(QueueUrl=url, ReceiptHandle=handle)
        answered = "200"
    except ClientError as exc:
        answered = exc.response["Error"]["Code"]
    remaining = library_queue(server, name).stats().total
    assert (answered, remaining) == ("InvalidParameterValue", 1)
