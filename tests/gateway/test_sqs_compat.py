"""The SQS face behaves as Amazon's where clients notice (issue 12): ``All`` in
any case and unknown names in ReceiveMessage, bare queue names and unknown
queue URLs, Amazon's error codes and texts, the queue's timestamps and
default retention. boto3 and the aws CLI against a real `vsqs serve`."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from botocore.exceptions import ClientError

import vsqs
from tests.gateway.server import Server, running_gateway
from tests.gateway.test_sqs import (
    KEY,
    SECRET,
    error_of,
    library_queue,
    make_client,
    new_name,
    raw_error,
    run_aws,
    signed_post,
    spool_entries,
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    spool = tmp_path_factory.mktemp("sqs-compat") / "spool"
    spool.mkdir()
    logs = tmp_path_factory.mktemp("sqs-compat-logs")
    env = {"VSQS_AWS_ACCESS_KEY_ID": KEY, "VSQS_AWS_SECRET_ACCESS_KEY": SECRET}
    with running_gateway(str(spool), env=env, log_dir=str(logs)) as running:
        yield running
        assert "Traceback" not in running.log(), running.log()


@pytest.fixture(scope="module")
def sqs(server: Server) -> Any:
    return make_client(server)


NO_SUCH_QUEUE = "The specified queue does not exist."


def message(error: pytest.ExceptionInfo[ClientError]) -> str:
    return error.value.response["Error"]["Message"]


# -- All in any case, unknown names ---------------------------------------------------


@pytest.mark.parametrize("all_name", ["ALL", "all", "All"])
def test_all_is_taken_in_any_case_on_receive(sqs: Any, all_name: str) -> None:
    """kombu (Celery's SQS transport) sends "ALL"."""
    url = sqs.create_queue(QueueName=new_name("allcase"))["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="b", MessageAttributes={
        "colour": {"DataType": "String", "StringValue": "blue"}})
    got = sqs.receive_message(QueueUrl=url, AttributeNames=[all_name], MessageSystemAttributeNames=[all_name],
                              MessageAttributeNames=[all_name])["Messages"][0]
    assert {"SenderId", "SentTimestamp", "ApproximateReceiveCount"} <= set(got["Attributes"])
    assert got["MessageAttributes"] == {"colour": {"DataType": "String", "StringValue": "blue"}}


def test_message_attribute_names_take_prefixes(sqs: Any) -> None:
    url = sqs.create_queue(QueueName=new_name("prefix"))["QueueUrl"]
    attributes = {name: {"DataType": "String", "StringValue": name}
                  for name in ("foo.a", "foo.b", "food", "bar")}
    for _ in range(3):
        sqs.send_message(QueueUrl=url, MessageBody="b", MessageAttributes=attributes)
    shown = [set(sqs.receive_message(QueueUrl=url, MessageAttributeNames=names, VisibilityTimeout=60)
                 ["Messages"][0].get("MessageAttributes", {}))
             for names in (["foo.*"], [".*"], ["bar", "nothing.*"])]
    assert shown == [{"foo.a", "foo.b", "food"}, {"foo.a", "foo.b", "food", "bar"}, {"bar"}]  # foo.*: prefix "foo"


def test_unknown_names_on_receive_are_ignored(sqs: Any) -> None:
    url = sqs.create_queue(QueueName=new_name("unknownnames"))["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="still delivered")
    got = sqs.receive_message(QueueUrl=url, AttributeNames=["Colour", "SentTimestamp"],
                              MessageSystemAttributeNames=["NoSuchThing"],
                              MessageAttributeNames=["absent"])["Messages"][0]
    assert got["Body"] == "still delivered"
    assert set(got["Attributes"]) == {"SentTimestamp"}
    assert "MessageAttributes" not in got


def test_get_queue_attributes_takes_all_in_any_case_and_refuses_unknown_names(sqs: Any) -> None:
    url = sqs.create_queue(QueueName=new_name("gqa"))["QueueUrl"]
    for all_name in ("ALL", "all"):
        attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=[all_name])["Attributes"]
        assert attributes["VisibilityTimeout"] == "30" and "QueueArn" in attributes
    with pytest.raises(sqs.exceptions.InvalidAttributeName) as caught:  # Amazon refuses them here
        sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["VisibilityTimeout", "Colour"])
    assert message(caught) == "Unknown Attribute Colour."


# -- queue URLs --------------------------------------------------------------------------


def test_a_bare_queue_name_is_a_queue_url(sqs: Any, server: Server) -> None:
    name = new_name("bare")
    sqs.create_queue(QueueName=name)
    sqs.send_message(QueueUrl=name, MessageBody="by name")
    got = sqs.receive_message(QueueUrl=name)["Messages"][0]
    assert got["Body"] == "by name"
    sqs.delete_message(QueueUrl=name, ReceiptHandle=got["ReceiptHandle"])
    assert sqs.get_queue_attributes(QueueUrl=name, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"].endswith(
        f":{name}")
    sqs.delete_queue(QueueUrl=name)
    assert name not in vsqs.Spool(server.spool).queues()


@pytest.mark.parametrize("url", ["absent-queue", "http://elsewhere.example/123456789012/absent-queue",
                                 "https://sqs.eu-west-1.amazonaws.com/000000000000/absent-queue"])
def test_an_unknown_queue_is_queue_does_not_exist(sqs: Any, server: Server, url: str) -> None:
    with pytest.raises(sqs.exceptions.QueueDoesNotExist) as caught:
        sqs.send_message(QueueUrl=url, MessageBody="x")
    assert error_of(caught) == ("AWS.SimpleQueueService.NonExistentQueue", 400)
    assert message(caught) == NO_SUCH_QUEUE


def test_queue_does_not_exist_on_the_wire(server: Server) -> None:
    for target, body in (("AmazonSQS.GetQueueUrl", {"QueueName": "never-made"}),
                         ("AmazonSQS.ReceiveMessage", {"QueueUrl": "http://x/000000000000/never-made"}),
                         ("AmazonSQS.SendMessage", {"QueueUrl": "not a url/../", "MessageBody": "x"})):
        response = signed_post(server, target, json.dumps(body).encode())
        assert raw_error(response) == (400, "QueueDoesNotExist", "AWS.SimpleQueueService.NonExistentQueue")
        assert response.json()["message"] == NO_SUCH_QUEUE
        assert response.headers["x-amzn-query-error"] == "AWS.SimpleQueueService.NonExistentQueue;Sender"


def test_the_aws_cli_takes_all_in_capitals_and_a_bare_name(server: Server) -> None:
    name = new_name("cli")
    run_aws(server, "create-queue", "--queue-name", name)
    run_aws(server, "send-message", "--queue-url", name, "--message-body", "cli",
            "--message-attributes", '{"k": {"DataType": "String", "StringValue": "v"}}')
    got = run_aws(server, "receive-message", "--queue-url", name, "--attribute-names", "ALL",
                  "--message-attribute-names", "ALL")["Messages"][0]
    assert got["Body"] == "cli" and "SentTimestamp" in got["Attributes"]
    assert got["MessageAttributes"] == {"k": {"DataType": "String", "StringValue": "v"}}


# -- visibility changes and receipt handles ------------------------------------------------


def test_changing_the_visibility_of_a_deleted_message_is_invalid_parameter_value(sqs: Any) -> None:
    url = sqs.create_queue(QueueName=new_name("cmvdeleted"))["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="x")
    handle = sqs.receive_message(QueueUrl=url, VisibilityTimeout=60)["Messages"][0]["ReceiptHandle"]
    sqs.delete_message(QueueUrl=url, ReceiptHandle=handle)
    with pytest.raises(ClientError) as caught:
        sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=handle, VisibilityTimeout=10)
    assert error_of(caught) == ("InvalidParameterValue", 400)
    assert message(caught) == (f"Value {handle} for parameter ReceiptHandle is invalid. Reason: Message does not "
                               "exist or is not available for visibility timeout change.")
    changed = sqs.change_message_visibility_batch(QueueUrl=url, Entries=[
        {"Id": "gone", "ReceiptHandle": handle, "VisibilityTimeout": 10}])
    assert [(e["Id"], e["Code"], e["SenderFault"]) for e in changed["Failed"]] == [
        ("gone", "InvalidParameterValue", True)]


def test_a_superseded_handle_changes_nothing_and_succeeds(sqs: Any, server: Server) -> None:
    """Its lease ran out and the message was received again: success, and the new receiver keeps it."""
    name = new_name("cmvstale")
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="x")
    old = sqs.receive_message(QueueUrl=url, VisibilityTimeout=0)["Messages"][0]["ReceiptHandle"]
    current = sqs.receive_message(QueueUrl=url, VisibilityTimeout=60)["Messages"][0]["ReceiptHandle"]
    sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=old, VisibilityTimeout=0)
    changed = sqs.change_message_visibility_batch(QueueUrl=url, Entries=[
        {"Id": "old", "ReceiptHandle": old, "VisibilityTimeout": 0}])
    assert [e["Id"] for e in changed["Successful"]] == ["old"] and "Failed" not in changed
    assert library_queue(server, name).stats().in_flight == 1  # still held by the second receive
    assert "Messages" not in sqs.receive_message(QueueUrl=url)
    sqs.delete_message(QueueUrl=url, ReceiptHandle=current)
    assert library_queue(server, name).stats().total == 0


def test_an_expired_handle_not_received_again_still_changes_visibility(sqs: Any, server: Server) -> None:
    name = new_name("cmvexpired")
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="x")
    handle = sqs.receive_message(QueueUrl=url, VisibilityTimeout=0)["Messages"][0]["ReceiptHandle"]
    sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=handle, VisibilityTimeout=60)  # succeeds
    sqs.delete_message(QueueUrl=url, ReceiptHandle=handle)
    assert library_queue(server, name).stats().total == 0


def test_an_invalid_handle_in_amazons_words(sqs: Any) -> None:
    url = sqs.create_queue(QueueName=new_name("badhandle"))["QueueUrl"]
    for call in (lambda: sqs.delete_message(QueueUrl=url, ReceiptHandle="garbage"),
                 lambda: sqs.change_message_visibility(QueueUrl=url, ReceiptHandle="garbage", VisibilityTimeout=1)):
        with pytest.raises(sqs.exceptions.ReceiptHandleIsInvalid) as caught:
            call()
        assert message(caught) == 'The input receipt handle "garbage" is not a valid receipt handle.'
    deleted = sqs.delete_message_batch(QueueUrl=url, Entries=[{"Id": "a", "ReceiptHandle": "garbage"}])
    assert [(e["Code"], e["Message"]) for e in deleted["Failed"]] == [
        ("ReceiptHandleIsInvalid", 'The input receipt handle "garbage" is not a valid receipt handle.')]


# -- queue creation, timestamps, retention ------------------------------------------------


@pytest.mark.parametrize(("suffix", "attributes", "text"), [
    ("", {"FifoQueue": "true"}, "The name of a FIFO queue can only include alphanumeric characters, hyphens, "
                                "or underscores, must end with .fifo suffix and be 1 to 80 in length."),
    (".fifo", {}, "Can only include alphanumeric characters, hyphens, or underscores. 1 to 80 in length"),
    (".fifo", {"FifoQueue": "false"}, "Can only include alphanumeric characters, hyphens, or underscores. "
                                      "1 to 80 in length"),
])
def test_fifo_names_and_flags_in_amazons_words(sqs: Any, server: Server, suffix: str, attributes: dict[str, str],
                                               text: str) -> None:
    entries = spool_entries(server)
    with pytest.raises(ClientError) as caught:
        sqs.create_queue(QueueName=new_name("fifoname") + suffix, Attributes=attributes)
    assert error_of(caught) == ("InvalidParameterValue", 400)
    assert message(caught) == text
    assert spool_entries(server) == entries


def test_fifo_queue_false_on_a_standard_name_is_an_unknown_attribute(sqs: Any, server: Server) -> None:
    """Amazon refuses it, though its reference lists false (LocalStack checked it against AWS)."""
    entries = spool_entries(server)
    with pytest.raises(sqs.exceptions.InvalidAttributeName) as caught:
        sqs.create_queue(QueueName=new_name("notfifo"), Attributes={"FifoQueue": "false"})
    assert message(caught) == "Unknown Attribute FifoQueue."
    assert spool_entries(server) == entries


def test_queue_timestamps(sqs: Any, server: Server) -> None:
    name = new_name("times")
    before = int(time.time())
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    after = int(time.time()) + 1
    attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    queue = library_queue(server, name)
    created = int(attributes["CreatedTimestamp"])
    assert before - 1 <= created <= after and created == int(queue.created_at)
    assert attributes["LastModifiedTimestamp"] == attributes["CreatedTimestamp"]  # never configured
    sqs.set_queue_attributes(QueueUrl=url, Attributes={"VisibilityTimeout": "45"})
    modified = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["LastModifiedTimestamp", "CreatedTimestamp"])
    assert modified["Attributes"] == {"CreatedTimestamp": str(created),
                                      "LastModifiedTimestamp": str(int(queue.settings_changed_at))}
    assert int(modified["Attributes"]["LastModifiedTimestamp"]) >= created
    with pytest.raises(sqs.exceptions.InvalidAttributeName):  # read-only
        sqs.set_queue_attributes(QueueUrl=url, Attributes={"CreatedTimestamp": "1"})


def test_retention_is_reported_with_amazons_default_and_creating_with_it_is_the_same_queue(sqs: Any,
                                                                                            server: Server) -> None:
    name = new_name("retention")
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    got = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["MessageRetentionPeriod"])["Attributes"]
    assert got == {"MessageRetentionPeriod": "345600"}
    assert library_queue(server, name).settings["retention"] is None  # reported, not stored
    assert sqs.create_queue(QueueName=name, Attributes={"MessageRetentionPeriod": "345600"})["QueueUrl"] == url
    with pytest.raises(sqs.exceptions.QueueNameExists):
        sqs.create_queue(QueueName=name, Attributes={"MessageRetentionPeriod": "3600"})


# -- error texts ------------------------------------------------------------------------------


DUMMY_REDRIVE = json.dumps({"deadLetterTargetArn": "dummy", "maxReceiveCount": 42})


def test_error_texts_are_amazons(sqs: Any) -> None:
    url = sqs.create_queue(QueueName=new_name("texts"))["QueueUrl"]
    fifo_url = sqs.create_queue(QueueName=new_name("texts") + ".fifo", Attributes={"FifoQueue": "true"})["QueueUrl"]
    cases: list[tuple[Any, str, str]] = [
        (lambda: sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=11), "InvalidParameterValue",
         "Value 11 for parameter MaxNumberOfMessages is invalid. Reason: Must be between 1 and 10, if provided."),
        (lambda: sqs.send_message_batch(QueueUrl=url, Entries=[]), "AWS.SimpleQueueService.EmptyBatchRequest",
         "There should be at least one SendMessageBatchRequestEntry in the request."),
        (lambda: sqs.delete_message_batch(QueueUrl=url, Entries=[]), "AWS.SimpleQueueService.EmptyBatchRequest",
         "There should be at least one DeleteMessageBatchRequestEntry in the request."),
        (lambda: sqs.send_message_batch(QueueUrl=url, Entries=[{"Id": "a", "MessageBody": "x"}] * 2),
         "AWS.SimpleQueueService.BatchEntryIdsNotDistinct", "Id a repeated."),
        (lambda: sqs.send_message_batch(QueueUrl=url, Entries=[{"Id": "a b", "MessageBody": "x"}]),
         "AWS.SimpleQueueService.InvalidBatchEntryId", "A batch entry id can only contain alphanumeric "
         "characters, hyphens and underscores. It can be at most 80 letters long."),
        (lambda: sqs.send_message(QueueUrl=url, MessageBody="x", MessageDeduplicationId="d"),
         "InvalidParameterValue", "Value d for parameter MessageDeduplicationId is invalid. Reason: The request "
         "include parameter that is not valid for this queue type."),
        (lambda: sqs.create_queue(QueueName="bad name"), "InvalidParameterValue",
         "Can only include alphanumeric characters, hyphens, or underscores. 1 to 80 in length"),
        (lambda: sqs.set_queue_attributes(QueueUrl=url, Attributes={"Colour": "blue"}), "InvalidAttributeName",
         "Unknown Attribute Colour."),
        (lambda: sqs.get_queue_url(QueueName="never-made-here"), "AWS.SimpleQueueService.NonExistentQueue",
         NO_SUCH_QUEUE),
        (lambda: sqs.create_queue(QueueName=url.rsplit("/", 1)[1], Attributes={"VisibilityTimeout": "7"}),
         "QueueAlreadyExists", "A queue already exists with the same name and a different value for attribute "
         "VisibilityTimeout"),
        (lambda: sqs.send_message(QueueUrl=url, MessageBody="x", MessageAttributes={
            "n": {"DataType": "Number", "StringValue": "many"}}), "InvalidParameterValue",
         "Can't cast the value of message (user) attribute 'n' to a number."),
        (lambda: sqs.send_message(QueueUrl=url, MessageBody="x", MessageAttributes={
            "s": {"DataType": "String", "StringValue": ""}}), "InvalidParameterValue",
         "Message (user) attribute 's' must contain a non-empty value of type 'String'."),
        (lambda: sqs.send_message(QueueUrl=url, MessageBody="x", MessageAttributes={
            "t": {"DataType": "Text", "StringValue": "v"}}), "InvalidParameterValue",
         "The message attribute 't' has an invalid message attribute type, the set of supported type prefixes "
         "is Binary, Number, and String."),
        (lambda: sqs.send_message(QueueUrl=url, MessageBody="x", MessageGroupId="a b"), "InvalidParameterValue",
         "Value a b for parameter MessageGroupId is invalid. Reason: MessageGroupId can only include alphanumeric "
         "and punctuation characters. 1 to 128 in length."),
        (lambda: sqs.change_message_visibility_batch(QueueUrl=url, Entries=[]),
         "AWS.SimpleQueueService.EmptyBatchRequest",
         "There should be at least one ChangeMessageVisibilityBatchRequestEntry in the request."),
        (lambda: sqs.send_message(QueueUrl=url, MessageBody="x", MessageAttributes={
            "s": {"DataType": "String", "StringValue": "bell \x08"}}), "InvalidParameterValue",
         "Invalid characters found. Valid unicode characters are #x9 | #xA | #xD | #x20 to #xD7FF | #xE000 to "
         "#xFFFD | #x10000 to #x10FFFF"),
        (lambda: sqs.set_queue_attributes(QueueUrl=url, Attributes={"RedrivePolicy": DUMMY_REDRIVE}),
         "InvalidParameterValue", f"Value {DUMMY_REDRIVE} for parameter RedrivePolicy is invalid. Reason: Invalid "
         "value for deadLetterTargetArn."),
        (lambda: sqs.set_queue_attributes(QueueUrl=url, Attributes={"KmsMasterKeyId": "testKeyId",
                                                                    "SqsManagedSseEnabled": "true"}),
         "InvalidAttributeName", "You can use one type of server-side encryption (SSE) at one time. You can "
         "either enable KMS SSE or SQS SSE."),
        (lambda: sqs.set_queue_attributes(QueueUrl=url, Attributes={"VisibilityTimeout": "43201"}),
         "InvalidAttributeValue", "Invalid value for the parameter VisibilityTimeout."),
        (lambda: sqs.set_queue_attributes(QueueUrl=fifo_url, Attributes={"FifoQueue": "false"}),
         "InvalidAttributeValue", "Invalid value for the parameter FifoQueue. Reason: Modifying queue type is not "
         "supported."),
        (lambda: sqs.send_message(QueueUrl=fifo_url, MessageBody="x", MessageGroupId="g"), "InvalidParameterValue",
         "The queue should either have ContentBasedDeduplication enabled or MessageDeduplicationId provided "
         "explicitly"),
        (lambda: sqs.send_message(QueueUrl=fifo_url, MessageBody="x", MessageDeduplicationId="d"),
         "MissingParameter", "The request must contain the parameter MessageGroupId."),
    ]
    for call, code, text in cases:
        with pytest.raises(ClientError) as caught:
            call()
        assert (error_of(caught)[0], message(caught)) == (code, text)


# -- error shapes, batches, attribute names ------------------------------------------


def test_generic_errors_carry_amazons_json_types(sqs: Any, server: Server) -> None:
    """Amazon's JSON answers name the two generic errors ...Exception in __type,
    and their query codes (what clients see as the code) in x-amzn-query-error."""
    url = sqs.create_queue(QueueName=new_name("types"))["QueueUrl"]
    invalid = signed_post(server, "AmazonSQS.ReceiveMessage",
                          json.dumps({"QueueUrl": url, "MaxNumberOfMessages": 11}).encode())
    assert invalid.json()["__type"] == "com.amazonaws.sqs#InvalidParameterValueException"
    assert invalid.headers["x-amzn-query-error"] == "InvalidParameterValue;Sender"
    missing = signed_post(server, "AmazonSQS.SendMessage", json.dumps({"QueueUrl": url}).encode())
    assert missing.json()["__type"] == "com.amazonaws.sqs#MissingRequiredParameterException"
    assert missing.headers["x-amzn-query-error"] == "MissingParameter;Sender"
    with pytest.raises(ClientError) as caught:
        sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=11)
    assert caught.value.response["Error"] == {
        "Code": "InvalidParameterValue", "QueryErrorCode": "InvalidParameterValueException", "Type": "Sender",
        "Message": "Value 11 for parameter MaxNumberOfMessages is invalid. Reason: Must be between 1 and 10, if "
                   "provided."}


@pytest.mark.parametrize(("entry", "text"), [
    ({"MessageDeduplicationId": "d2"}, "The request must contain the parameter MessageGroupId."),
    ({"MessageGroupId": "g"}, "The queue should either have ContentBasedDeduplication enabled or "
                              "MessageDeduplicationId provided explicitly"),
])
def test_a_fifo_batch_with_an_entry_missing_an_id_fails_whole(sqs: Any, server: Server, entry: dict[str, str],
                                                               text: str) -> None:
    name = new_name("fifobatch") + ".fifo"
    url = sqs.create_queue(QueueName=name, Attributes={"FifoQueue": "true"})["QueueUrl"]
    entries = [{"Id": "good", "MessageBody": "a", "MessageGroupId": "g", "MessageDeduplicationId": "d1"},
               {"Id": "bad", "MessageBody": "b", **entry}]
    with pytest.raises(ClientError) as caught:
        sqs.send_message_batch(QueueUrl=url, Entries=entries)
    assert (error_of(caught), message(caught)) == (("InvalidParameterValue", 400), text)
    assert library_queue(server, name).stats().total == 0  # the good entry is not sent either


def test_a_batch_with_nothing_failed_has_no_failed_member(sqs: Any, server: Server) -> None:
    url = sqs.create_queue(QueueName=new_name("nofailed"))["QueueUrl"]
    sent = signed_post(server, "AmazonSQS.SendMessageBatch", json.dumps({"QueueUrl": url, "Entries": [
        {"Id": "a", "MessageBody": "x"}, {"Id": "b", "MessageBody": "y"}]}).encode()).json()
    assert set(sent) == {"Successful"}
    got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)["Messages"]
    handles = [{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(got)]
    changed = sqs.change_message_visibility_batch(QueueUrl=url, Entries=[{**h, "VisibilityTimeout": 60}
                                                                         for h in handles])
    deleted = sqs.delete_message_batch(QueueUrl=url, Entries=handles)
    assert "Failed" not in changed and "Failed" not in deleted and len(deleted["Successful"]) == len(got)
    failing = sqs.delete_message_batch(QueueUrl=url, Entries=[{"Id": "x", "ReceiptHandle": "garbage"}])
    assert "Successful" not in failing and [e["Id"] for e in failing["Failed"]] == ["x"]


@pytest.mark.parametrize(("names", "shown"), [
    (["*"], {"Help.Me", "Hello", "General"}),
    (["All"], {"Help.Me", "Hello", "General"}),
    ([".*"], {"Help.Me", "Hello", "General"}),
    (["Hel.*"], {"Help.Me", "Hello"}),
    (["Foo", "Hello"], {"Hello"}),
    (["AWS."], set()),
])
def test_message_attribute_names_as_amazon_reads_them(sqs: Any, names: list[str], shown: set[str]) -> None:
    url = sqs.create_queue(QueueName=new_name("attrnames"))["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="msg", MessageAttributes={
        name: {"DataType": "String", "StringValue": value}
        for name, value in (("Help.Me", "Me"), ("Hello", "There"), ("General", "Kenobi"))})
    got = sqs.receive_message(QueueUrl=url, MessageAttributeNames=names)["Messages"][0]
    assert set(got.get("MessageAttributes", {})) == shown


# -- AWSTraceHeader ---------------------------------------------------------------------

TRACE = "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1"


def test_the_x_ray_header_becomes_the_aws_trace_header(server: Server) -> None:
    """X-Ray's X-Amzn-Trace-Id header on a send is its messages' AWSTraceHeader;
    MessageSystemAttributes.AWSTraceHeader overrides it, as Amazon documents."""
    traced = make_client(server)

    def add_header(request: Any, **_: Any) -> None:
        request.headers["X-Amzn-Trace-Id"] = TRACE

    for operation in ("SendMessage", "SendMessageBatch"):
        traced.meta.events.register(f"before-sign.sqs.{operation}", add_header)
    url = traced.create_queue(QueueName=new_name("trace"))["QueueUrl"]
    traced.send_message(QueueUrl=url, MessageBody="one")
    traced.send_message_batch(QueueUrl=url, Entries=[{"Id": "a", "MessageBody": "two"}])
    own = "Root=1-00000000-000000000000000000000000"
    traced.send_message(QueueUrl=url, MessageBody="three", MessageSystemAttributes={
        "AWSTraceHeader": {"DataType": "String", "StringValue": own}})
    seen: dict[str, str | None] = {}
    for names in (["AWSTraceHeader"], ["All"], ["SenderId"]):
        for m in traced.receive_message(QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=0,
                                        MessageSystemAttributeNames=names)["Messages"]:
            seen[f"{m['Body']} {names[0]}"] = m.get("Attributes", {}).get("AWSTraceHeader")
    assert seen == {"one AWSTraceHeader": TRACE, "two AWSTraceHeader": TRACE, "three AWSTraceHeader": own,
                    "one All": TRACE, "two All": TRACE, "three All": own,
                    "one SenderId": None, "two SenderId": None, "three SenderId": None}


def test_attribute_names_with_latin_letters_are_taken(sqs: Any, server: Server) -> None:
    """Amazon takes Latin letters beyond ASCII in attribute names, though its reference lists ASCII only."""
    url = sqs.create_queue(QueueName=new_name("latin"))["QueueUrl"]
    attributes = {"attr.1øßä": {"DataType": "String", "StringValue": "Valida"}}
    sent = sqs.send_message(QueueUrl=url, MessageBody="test", MessageAttributes=attributes)
    got = sqs.receive_message(QueueUrl=url, MessageAttributeNames=["All"])["Messages"][0]
    assert got["MessageAttributes"] == attributes
    assert got["MD5OfMessageAttributes"] == sent["MD5OfMessageAttributes"]
    for bad in ("Invalid-§-attr", "Invalid-×-attr", "Invalid-!-attr", "L" * 257):
        with pytest.raises(ClientError) as caught:
            sqs.send_message(QueueUrl=url, MessageBody="test", MessageAttributes={
                bad: {"DataType": "String", "StringValue": "Valid"}})
        assert error_of(caught) == ("InvalidParameterValue", 400), bad
