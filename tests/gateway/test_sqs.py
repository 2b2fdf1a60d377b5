"""The SQS face of `vsqs serve`: boto3 and the aws CLI against a real server on loopback.

Two servers per module: one with an access key configured (most tests, and
the auth refusals) and one with none (accepts any signature; raw malformed
requests). Every test works on queues of its own.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import struct
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import botocore
import botocore.config
import httpx
import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from botocore.exceptions import ClientError

import vsqs
from tests.gateway.server import Server, refused_status, running_gateway, tree_around
from vsqs._gateway.sqs import attributes as _attributes
from vsqs._gateway.sqs import protocol as _protocol

KEY, SECRET = "AKIDVSQSTEST", "vsqs-test-secret"
REGION = "us-east-1"
AWS_CLI = str(Path(sys.executable).with_name("aws"))


# -- fixtures ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    spool = tmp_path_factory.mktemp("sqs") / "spool"  # one level down: escapes to .. show
    spool.mkdir()
    logs = tmp_path_factory.mktemp("sqs-logs")
    env = {"VSQS_AWS_ACCESS_KEY_ID": KEY, "VSQS_AWS_SECRET_ACCESS_KEY": SECRET}
    with running_gateway(str(spool), env=env, log_dir=str(logs)) as running:
        yield running
        assert "Traceback" not in running.log(), running.log()


@pytest.fixture(scope="module")
def open_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    spool = tmp_path_factory.mktemp("sqs-open") / "spool"
    spool.mkdir()
    logs = tmp_path_factory.mktemp("sqs-open-logs")
    with running_gateway(str(spool), log_dir=str(logs)) as running:
        yield running
        assert "Traceback" not in running.log(), running.log()


def make_client(server: Server, key: str = KEY, secret: str = SECRET, **config: Any) -> Any:
    return boto3.client(
        "sqs", endpoint_url=server.url, region_name=REGION, aws_access_key_id=key, aws_secret_access_key=secret,
        config=botocore.config.Config(retries={"max_attempts": 1}, **config),
    )


@pytest.fixture(scope="module")
def sqs(server: Server) -> Any:
    return make_client(server)


def new_name(prefix: str = "q") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def library_queue(server: Server, name: str) -> vsqs.Queue:
    return vsqs.Spool(server.spool).queue(name)


def spool_entries(server: Server) -> list[str]:
    return tree_around(server.spool)


def error_of(caught: pytest.ExceptionInfo[ClientError]) -> tuple[str, int]:
    response = caught.value.response
    return response["Error"]["Code"], response["ResponseMetadata"]["HTTPStatusCode"]


def md5_of_attributes(attributes: dict[str, dict[str, Any]]) -> str:
    """SQS's MD5OfMessageAttributes, written out independently of vsqs._gateway.sqs.attributes."""
    data = b""
    for name in sorted(attributes):
        value = attributes[name]
        data += len(name.encode()).to_bytes(4, "big") + name.encode()
        data += len(value["DataType"].encode()).to_bytes(4, "big") + value["DataType"].encode()
        if "BinaryValue" in value:
            raw = value["BinaryValue"]
            data += b"\x02" + len(raw).to_bytes(4, "big") + raw
        else:
            text = value["StringValue"].encode()
            data += b"\x01" + len(text).to_bytes(4, "big") + text
    return hashlib.md5(data).hexdigest()


def md5(text: str) -> str:
    return hashlib.md5(text.encode()).hexdigest()


def signed_post(server: Server, target: str, body: bytes, key: str = KEY, secret: str = SECRET,
                path: str = "/") -> httpx.Response:
    """A raw POST (to ``path``) signed as botocore signs, for bodies boto3 would never send."""
    headers = {"Content-Type": "application/x-amz-json-1.0", "X-Amz-Target": target}
    request = AWSRequest(method="POST", url=server.url + path, data=body, headers=headers)
    SigV4Auth(Credentials(key, secret), "sqs", REGION).add_auth(request)
    return httpx.post(server.url + path, content=body, headers=dict(request.headers.items()), timeout=30)


def raw_error(response: httpx.Response) -> tuple[int, str, str]:
    """(status, __type's name, the x-amzn-query-error code) of an error answer."""
    assert response.headers["content-type"] == "application/x-amz-json-1.0"
    assert response.headers["x-amzn-requestid"]
    return (response.status_code, response.json()["__type"].rsplit("#", 1)[1],
            response.headers["x-amzn-query-error"].split(";")[0])


# -- queues -----------------------------------------------------------------------


def test_create_get_list_and_delete_queues(sqs: Any, server: Server) -> None:
    name = new_name("life")
    url = sqs.create_queue(QueueName=name, Attributes={"VisibilityTimeout": "45"})["QueueUrl"]
    assert url == f"{server.url}/000000000000/{name}"
    assert library_queue(server, name).settings["visibility_timeout"] == 45
    assert sqs.create_queue(QueueName=name, Attributes={"VisibilityTimeout": "45"})["QueueUrl"] == url  # idempotent
    with pytest.raises(sqs.exceptions.QueueNameExists) as caught:
        sqs.create_queue(QueueName=name, Attributes={"VisibilityTimeout": "46"})
    assert error_of(caught) == ("QueueAlreadyExists", 400)
    assert sqs.get_queue_url(QueueName=name)["QueueUrl"] == url
    assert sqs.list_queues(QueueNamePrefix=name)["QueueUrls"] == [url]
    sqs.delete_queue(QueueUrl=url)
    assert name not in vsqs.Spool(server.spool).queues()
    assert "QueueUrls" not in sqs.list_queues(QueueNamePrefix=name)
    with pytest.raises(sqs.exceptions.QueueDoesNotExist) as caught:
        sqs.get_queue_url(QueueName=name)
    assert error_of(caught) == ("AWS.SimpleQueueService.NonExistentQueue", 400)
    for call in (lambda: sqs.delete_queue(QueueUrl=url), lambda: sqs.send_message(QueueUrl=url, MessageBody="x")):
        with pytest.raises(sqs.exceptions.QueueDoesNotExist) as caught:
            call()
        assert server.spool not in str(caught.value)  # no server paths in answers


def test_list_queues_pages_with_next_token(sqs: Any) -> None:
    prefix = new_name("page")
    names = [f"{prefix}-{i}" for i in range(5)]
    for name in names:
        sqs.create_queue(QueueName=name)
    seen: list[str] = []
    kwargs: dict[str, Any] = {"QueueNamePrefix": prefix, "MaxResults": 2}
    while True:
        page = sqs.list_queues(**kwargs)
        assert len(page["QueueUrls"]) <= 2
        seen += [url.rsplit("/", 1)[1] for url in page["QueueUrls"]]
        if "NextToken" not in page:
            break
        kwargs["NextToken"] = page["NextToken"]
    assert seen == names
    paginated = [url for page in sqs.get_paginator("list_queues").paginate(QueueNamePrefix=prefix,
                                                                          PaginationConfig={"PageSize": 3})
                 for url in page.get("QueueUrls", [])]
    assert len(paginated) == 5


def test_a_library_queue_with_a_vsqs_name_is_reachable(sqs: Any, server: Server) -> None:
    name = new_name("lib") + ".dlq"  # a dot: not an SQS name, but a vsqs one
    vsqs.Spool(server.spool).create_queue(name).publish(b"from the library")
    url = sqs.get_queue_url(QueueName=name)["QueueUrl"]
    assert url in sqs.list_queues(QueueNamePrefix=name)["QueueUrls"]
    assert sqs.receive_message(QueueUrl=url)["Messages"][0]["Body"] == "from the library"


def test_queue_attributes_map_to_settings(sqs: Any, server: Server) -> None:
    name = new_name("attrs")
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    sqs.set_queue_attributes(QueueUrl=url, Attributes={
        "VisibilityTimeout": "120", "DelaySeconds": "3", "MessageRetentionPeriod": "86400",
        "MaximumMessageSize": "2048", "ReceiveMessageWaitTimeSeconds": "7",
    })
    settings = library_queue(server, name).settings
    assert (settings["visibility_timeout"], settings["delay"], settings["retention"],
            settings["max_message_bytes"], settings["receive_wait"]) == (120, 3, 86400, 2048, 7)
    attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    created, modified = int(attributes.pop("CreatedTimestamp")), int(attributes.pop("LastModifiedTimestamp"))
    assert created <= modified
    assert attributes == {
        "VisibilityTimeout": "120", "DelaySeconds": "3", "MessageRetentionPeriod": "86400",
        "MaximumMessageSize": "2048", "ReceiveMessageWaitTimeSeconds": "7",
        "QueueArn": f"arn:aws:sqs:us-east-1:000000000000:{name}",
        "ApproximateNumberOfMessages": "0", "ApproximateNumberOfMessagesNotVisible": "0",
        "ApproximateNumberOfMessagesDelayed": "0",
        "SqsManagedSseEnabled": "true",  # Amazon's default (see test_sqs_management.py)
    }
    only = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["VisibilityTimeout", "Policy"])["Attributes"]
    assert only == {"VisibilityTimeout": "120"}
    assert "Attributes" not in sqs.get_queue_attributes(QueueUrl=url)


def test_defaults_are_reported_with_amazons_retention(sqs: Any) -> None:
    url = sqs.create_queue(QueueName=new_name("defaults"))["QueueUrl"]
    attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert attributes["VisibilityTimeout"] == "30"
    assert attributes["MaximumMessageSize"] == str(1024 * 1024)  # the gateway's limit
    assert attributes["MessageRetentionPeriod"] == "345600"  # Amazon's default, though none is set
    assert "FifoQueue" not in attributes


def test_message_counts_by_state(sqs: Any) -> None:
    url = sqs.create_queue(QueueName=new_name("counts"))["QueueUrl"]
    for body in ("a", "b", "c"):
        sqs.send_message(QueueUrl=url, MessageBody=body)
    sqs.send_message(QueueUrl=url, MessageBody="later", DelaySeconds=600)
    sqs.receive_message(QueueUrl=url, VisibilityTimeout=600)
    attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=[
        "ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible", "ApproximateNumberOfMessagesDelayed",
    ])["Attributes"]
    assert attributes == {"ApproximateNumberOfMessages": "2", "ApproximateNumberOfMessagesNotVisible": "1",
                          "ApproximateNumberOfMessagesDelayed": "1"}


@pytest.mark.parametrize(("attributes", "exception", "code"), [
    ({"Colour": "blue"}, "InvalidAttributeName", "InvalidAttributeName"),
    ({"QueueArn": "arn:aws:sqs:x:y:z"}, "InvalidAttributeName", "InvalidAttributeName"),
    ({"Policy": "not json"}, "InvalidAttributeValue", "InvalidAttributeValue"),
    ({"ContentBasedDeduplication": "true"}, "InvalidAttributeName", "InvalidAttributeName"),  # not FIFO
    ({"VisibilityTimeout": "43201"}, "InvalidAttributeValue", "InvalidAttributeValue"),
    ({"VisibilityTimeout": "ten"}, "InvalidAttributeValue", "InvalidAttributeValue"),
    ({"DelaySeconds": "-1"}, "InvalidAttributeValue", "InvalidAttributeValue"),
    ({"MaximumMessageSize": "1023"}, "InvalidAttributeValue", "InvalidAttributeValue"),
    ({"MessageRetentionPeriod": "59"}, "InvalidAttributeValue", "InvalidAttributeValue"),
    ({"ReceiveMessageWaitTimeSeconds": "21"}, "InvalidAttributeValue", "InvalidAttributeValue"),
    ({"RedrivePolicy": "not json"}, "ClientError", "InvalidParameterValue"),
])
def test_bad_queue_attributes_are_refused(sqs: Any, server: Server, attributes: dict[str, str], exception: str,
                                          code: str) -> None:
    name = new_name("badattr")
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    before = dict(library_queue(server, name).settings)
    with pytest.raises(getattr(sqs.exceptions, exception)) as caught:
        sqs.set_queue_attributes(QueueUrl=url, Attributes=attributes)
    assert error_of(caught) == (code, 400)
    assert dict(library_queue(server, name).settings) == before
    entries = spool_entries(server)
    with pytest.raises(getattr(sqs.exceptions, exception)):
        sqs.create_queue(QueueName=new_name("badattr"), Attributes=attributes)
    assert spool_entries(server) == entries


def test_get_queue_attributes_refuses_unknown_names(sqs: Any) -> None:
    url = sqs.create_queue(QueueName=new_name("unknown"))["QueueUrl"]
    with pytest.raises(sqs.exceptions.InvalidAttributeName):
        sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["Colour"])


# -- messages ---------------------------------------------------------------------


def test_a_nested_policy_is_refused_not_a_server_error(sqs: Any, server: Server) -> None:
    url = sqs.create_queue(QueueName=new_name("policy"))["QueueUrl"]
    with pytest.raises(sqs.exceptions.InvalidAttributeValue):
        sqs.set_queue_attributes(QueueUrl=url, Attributes={"Policy": "[" * 5000 + "]" * 5000})


def test_a_message_whose_attribute_types_are_hostile_is_delivered_with_its_batch(sqs: Any, server: Server) -> None:
    """Attribute types planted by another program (sqs.types nested thousands deep): the message's
    attributes are answered as Strings, and its batch mates are delivered with it."""
    name = new_name("poison")
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="before")
    library_queue(server, name).publish(b"poison", attributes={"sqs.types": "[" * 5000 + "]" * 5000, "a": "b"})
    sqs.send_message(QueueUrl=url, MessageBody="after")
    got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, MessageAttributeNames=["All"],
                              VisibilityTimeout=60)["Messages"]
    assert sorted(m["Body"] for m in got) == ["after", "before", "poison"]
    [poison] = [m for m in got if m["Body"] == "poison"]
    assert poison["MessageAttributes"] == {"a": {"DataType": "String", "StringValue": "b"}}


def test_send_receive_delete_with_attributes_and_digests(sqs: Any, server: Server) -> None:
    name = new_name("msg")
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    attributes = {
        "colour": {"DataType": "String", "StringValue": "blau ü"},
        "count": {"DataType": "Number", "StringValue": "-12.5e3"},
        "blob": {"DataType": "Binary", "BinaryValue": b"\x00\xffbin"},
        "trace.id": {"DataType": "String.uuid", "StringValue": "abc"},
        "trace.span": {"DataType": "Number.int", "StringValue": "7"},
    }
    before = time.time()
    sent = sqs.send_message(QueueUrl=url, MessageBody="héllo wörld", MessageAttributes=attributes)
    assert sent["MD5OfMessageBody"] == md5("héllo wörld")
    assert sent["MD5OfMessageAttributes"] == md5_of_attributes(attributes)
    got = sqs.receive_message(QueueUrl=url, MessageAttributeNames=["All"], MessageSystemAttributeNames=["All"],
                              VisibilityTimeout=60)["Messages"]
    assert len(got) == 1
    message = got[0]
    assert message["MessageId"] == sent["MessageId"]
    assert message["Body"] == "héllo wörld" and message["MD5OfBody"] == md5("héllo wörld")
    assert message["MessageAttributes"] == attributes
    assert message["MD5OfMessageAttributes"] == md5_of_attributes(attributes)
    system = message["Attributes"]
    assert system["ApproximateReceiveCount"] == "1" and system["SenderId"]
    assert before - 1 <= int(system["SentTimestamp"]) / 1000 <= time.time() + 1
    assert "MessageGroupId" not in system
    # names and prefixes select attributes; the digest covers what is returned
    again = sqs.receive_message(QueueUrl=url, VisibilityTimeout=0)
    assert "Messages" not in again  # hidden for 60 s
    sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"], VisibilityTimeout=0)
    some = sqs.receive_message(QueueUrl=url, MessageAttributeNames=["colour", "trace.*"],
                               AttributeNames=["ApproximateReceiveCount"])["Messages"][0]
    assert set(some["MessageAttributes"]) == {"colour", "trace.id", "trace.span"}
    assert some["MD5OfMessageAttributes"] == md5_of_attributes(some["MessageAttributes"])
    assert some["Attributes"] == {"ApproximateReceiveCount": "2"}
    plain = some
    sqs.delete_message(QueueUrl=url, ReceiptHandle=plain["ReceiptHandle"])
    assert library_queue(server, name).stats().total == 0


def test_a_message_with_no_attributes_asked_has_none(sqs: Any) -> None:
    url = sqs.create_queue(QueueName=new_name("plain"))["QueueUrl"]
    sent = sqs.send_message(QueueUrl=url, MessageBody="x", MessageAttributes={
        "a": {"DataType": "String", "StringValue": "1"}})
    message = sqs.receive_message(QueueUrl=url)["Messages"][0]
    assert "MessageAttributes" not in message and "Attributes" not in message
    assert "MD5OfMessageAttributes" not in message and sent["MD5OfMessageAttributes"]


def test_delay_seconds_hides_a_message(sqs: Any) -> None:
    url = sqs.create_queue(QueueName=new_name("delay"))["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="later", DelaySeconds=1)
    assert "Messages" not in sqs.receive_message(QueueUrl=url)
    got = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=5)
    assert got["Messages"][0]["Body"] == "later"


def test_visibility_timeout_returns_a_message_with_its_receive_count(sqs: Any) -> None:
    url = sqs.create_queue(QueueName=new_name("vis"))["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="again")
    first = sqs.receive_message(QueueUrl=url, VisibilityTimeout=1)["Messages"][0]
    second = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=5, AttributeNames=["ApproximateReceiveCount"])
    message = second["Messages"][0]
    assert message["MessageId"] == first["MessageId"] and message["Attributes"]["ApproximateReceiveCount"] == "2"
    assert message["ReceiptHandle"] != first["ReceiptHandle"]


def test_a_handle_still_deletes_after_its_visibility_changed(sqs: Any, server: Server) -> None:
    name = new_name("extend")
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="long job")
    handle = sqs.receive_message(QueueUrl=url, VisibilityTimeout=30)["Messages"][0]["ReceiptHandle"]
    sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=handle, VisibilityTimeout=60)
    sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=handle, VisibilityTimeout=90)
    assert library_queue(server, name).stats().in_flight == 1
    sqs.delete_message(QueueUrl=url, ReceiptHandle=handle)
    assert library_queue(server, name).stats().total == 0


def test_a_handle_follows_its_message_moved_by_another_process(sqs: Any, server: Server) -> None:
    """Behind a load balancer the extend may reach another gateway: the delete still works."""
    name = new_name("extend-elsewhere")
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="long job")
    handle = sqs.receive_message(QueueUrl=url, VisibilityTimeout=30)["Messages"][0]["ReceiptHandle"]
    elsewhere = library_queue(server, name)  # another process's handle moves the message
    elsewhere.change_visibility(elsewhere.change_visibility(handle, 60), 90)
    sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=handle, VisibilityTimeout=120)
    elsewhere.change_visibility(elsewhere.current_receipt(handle), 150)
    sqs.delete_message(QueueUrl=url, ReceiptHandle=handle)
    assert library_queue(server, name).stats().total == 0


def test_an_old_handle_never_reaches_a_later_receive(sqs: Any, server: Server) -> None:
    """A redrive resets the receive count: the old handle must still not match B's receive."""
    name, dlq = new_name("redriven"), new_name("redriven-dlq")
    dlq_url = sqs.create_queue(QueueName=dlq)["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=dlq_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    url = sqs.create_queue(QueueName=name, Attributes={
        "RedrivePolicy": json.dumps({"deadLetterTargetArn": arn, "maxReceiveCount": 1})})["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="once")
    old = sqs.receive_message(QueueUrl=url, VisibilityTimeout=1)["Messages"][0]["ReceiptHandle"]
    time.sleep(1.1)
    assert "Messages" not in sqs.receive_message(QueueUrl=url)  # over maxReceiveCount: dead-lettered
    assert library_queue(server, dlq).redrive() == 1
    current = sqs.receive_message(QueueUrl=url, VisibilityTimeout=60)["Messages"][0]["ReceiptHandle"]
    sqs.delete_message(QueueUrl=url, ReceiptHandle=old)  # stale: deletes nothing
    sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=old, VisibilityTimeout=0)  # stale: changes nothing
    assert library_queue(server, name).stats().in_flight == 1
    sqs.delete_message(QueueUrl=url, ReceiptHandle=current)
    assert library_queue(server, name).stats().total == 0


def test_stale_and_invalid_receipts(sqs: Any, server: Server) -> None:
    name = new_name("stale")
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="x")
    old = sqs.receive_message(QueueUrl=url, VisibilityTimeout=0)["Messages"][0]["ReceiptHandle"]
    current = sqs.receive_message(QueueUrl=url, VisibilityTimeout=60)["Messages"][0]["ReceiptHandle"]
    sqs.delete_message(QueueUrl=url, ReceiptHandle=old)  # SQS: succeeds, deletes nothing
    assert library_queue(server, name).stats().in_flight == 1
    sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=old, VisibilityTimeout=0)  # SQS: succeeds, no change
    assert library_queue(server, name).stats().in_flight == 1
    for bad in ("garbage", "../../etc/passwd", old.replace(old.split(":")[0], "00000000")):
        with pytest.raises(sqs.exceptions.ReceiptHandleIsInvalid) as caught:
            sqs.delete_message(QueueUrl=url, ReceiptHandle=bad)
        assert error_of(caught) == ("ReceiptHandleIsInvalid", 400)
        with pytest.raises(sqs.exceptions.ReceiptHandleIsInvalid):
            sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=bad, VisibilityTimeout=10)
    other = sqs.create_queue(QueueName=new_name("stale-other"))["QueueUrl"]
    with pytest.raises(sqs.exceptions.ReceiptHandleIsInvalid):  # a receipt of another queue
        sqs.delete_message(QueueUrl=other, ReceiptHandle=current)
    sqs.delete_message(QueueUrl=url, ReceiptHandle=current)
    assert library_queue(server, name).stats().total == 0


@pytest.mark.parametrize(("kwargs", "exception"), [
    ({"MaxNumberOfMessages": 11}, None),
    ({"MaxNumberOfMessages": 0}, None),
    ({"WaitTimeSeconds": 21}, None),
    ({"VisibilityTimeout": 43201}, None),
    ({"VisibilityTimeout": -1}, None),
])
def test_bad_receive_parameters(sqs: Any, kwargs: dict[str, Any], exception: str | None) -> None:
    url = sqs.create_queue(QueueName=new_name("badrecv"))["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="stays")
    with pytest.raises(getattr(sqs.exceptions, exception) if exception else ClientError) as caught:
        sqs.receive_message(QueueUrl=url, **kwargs)
    assert error_of(caught) == (exception or "InvalidParameterValue", 400)
    assert sqs.receive_message(QueueUrl=url)["Messages"][0]["Body"] == "stays"  # nothing was claimed


@pytest.mark.parametrize(("kwargs", "code"), [
    ({"MessageBody": ""}, "MissingParameter"),
    ({"MessageBody": "nul \x00 inside"}, "InvalidMessageContents"),
    ({"MessageBody": "x", "DelaySeconds": 901}, "InvalidParameterValue"),
    ({"MessageBody": "x", "MessageDeduplicationId": "d"}, "InvalidParameterValue"),  # FIFO only
    ({"MessageBody": "x", "MessageAttributes": {"sqs.types": {"DataType": "String", "StringValue": "{}"}}},
     "InvalidParameterValue"),
    ({"MessageBody": "x", "MessageAttributes": {"AWS.x": {"DataType": "String", "StringValue": "v"}}},
     "InvalidParameterValue"),
    ({"MessageBody": "x", "MessageAttributes": {"a": {"DataType": "Number", "StringValue": "twelve"}}},
     "InvalidParameterValue"),
    ({"MessageBody": "x", "MessageAttributes": {"a": {"DataType": "Date", "StringValue": "2020"}}},
     "InvalidParameterValue"),
    ({"MessageBody": "x", "MessageAttributes": {"a": {"DataType": "String"}}}, "InvalidParameterValue"),
    ({"MessageBody": "x", "MessageAttributes": {f"a{i}": {"DataType": "String", "StringValue": "v"}
                                                 for i in range(11)}}, "InvalidParameterValue"),
    ({"MessageBody": "x", "MessageAttributes": {"a": {"DataType": "String", "StringValue": "\x01"}}},
     "InvalidParameterValue"),
])
def test_bad_messages_are_refused_and_nothing_is_written(sqs: Any, server: Server, kwargs: dict[str, Any],
                                                         code: str) -> None:
    name = new_name("badmsg")
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    exception = getattr(sqs.exceptions, code, ClientError)
    with pytest.raises(exception) as caught:
        sqs.send_message(QueueUrl=url, **kwargs)
    assert error_of(caught) == (code, 400)
    assert sorted(os.listdir(library_queue(server, name).path)) == [".vsqs.json"]


def test_message_size_limits(sqs: Any, server: Server) -> None:
    name = new_name("size")
    url = sqs.create_queue(QueueName=name, Attributes={"MaximumMessageSize": "1024"})["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="x" * 1024)
    with pytest.raises(ClientError) as caught:
        sqs.send_message(QueueUrl=url, MessageBody="x" * 1025)
    assert error_of(caught) == ("InvalidParameterValue", 400)
    assert "Message must be shorter than 1024 bytes" in caught.value.response["Error"]["Message"]
    with pytest.raises(ClientError):  # attributes count towards the size, as in SQS
        sqs.send_message(QueueUrl=url, MessageBody="x" * 1000,
                         MessageAttributes={"pad": {"DataType": "String", "StringValue": "y" * 30}})
    assert library_queue(server, name).stats().total == 1
    big = sqs.create_queue(QueueName=new_name("size"))["QueueUrl"]
    with pytest.raises(ClientError) as caught:  # the gateway's own limit: 1 MiB
        sqs.send_message(QueueUrl=big, MessageBody="x" * (1024 * 1024 + 1))
    assert error_of(caught) == ("InvalidParameterValue", 400)


def test_purge_queue(sqs: Any, server: Server) -> None:
    name = new_name("purge")
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    sqs.send_message_batch(QueueUrl=url, Entries=[{"Id": str(i), "MessageBody": str(i)} for i in range(5)])
    sqs.receive_message(QueueUrl=url, VisibilityTimeout=60)
    sqs.purge_queue(QueueUrl=url)
    assert library_queue(server, name).stats().total == 0
    with pytest.raises(sqs.exceptions.QueueDoesNotExist):
        sqs.purge_queue(QueueUrl=url.replace(name, new_name("purge")))


# -- batches ------------------------------------------------------------------------


def test_send_message_batch_with_a_failing_entry(sqs: Any, server: Server) -> None:
    name = new_name("batch")
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    attributes = {"k": {"DataType": "String", "StringValue": "v"}}
    result = sqs.send_message_batch(QueueUrl=url, Entries=[
        {"Id": "good-1", "MessageBody": "one", "MessageAttributes": attributes},
        {"Id": "bad", "MessageBody": "two", "DelaySeconds": 9999},
        {"Id": "good_2", "MessageBody": "three", "DelaySeconds": 0},
    ])
    assert [entry["Id"] for entry in result["Successful"]] == ["good-1", "good_2"]
    assert result["Successful"][0]["MD5OfMessageBody"] == md5("one")
    assert result["Successful"][0]["MD5OfMessageAttributes"] == md5_of_attributes(attributes)
    assert "MD5OfMessageAttributes" not in result["Successful"][1]
    assert result["Failed"] == [{"Id": "bad", "SenderFault": True, "Code": "InvalidParameterValue",
                                 "Message": result["Failed"][0]["Message"]}]
    bodies = sorted(m.body for m in library_queue(server, name).receive_batch(10))
    assert bodies == [b"one", b"three"]


def test_delete_and_change_visibility_batches_with_failing_entries(sqs: Any, server: Server) -> None:
    name = new_name("batch2")
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    sqs.send_message_batch(QueueUrl=url, Entries=[{"Id": f"m{i}", "MessageBody": str(i)} for i in range(3)])
    handles = [m["ReceiptHandle"] for m in sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10,
                                                               VisibilityTimeout=60)["Messages"]]
    assert len(handles) == 3
    changed = sqs.change_message_visibility_batch(QueueUrl=url, Entries=[
        {"Id": "a", "ReceiptHandle": handles[0], "VisibilityTimeout": 120},
        {"Id": "b", "ReceiptHandle": "not-a-receipt", "VisibilityTimeout": 120},
        {"Id": "c", "ReceiptHandle": handles[1], "VisibilityTimeout": 0},
    ])
    assert [e["Id"] for e in changed["Successful"]] == ["a", "c"]
    assert [(e["Id"], e["Code"], e["SenderFault"]) for e in changed["Failed"]] == [
        ("b", "ReceiptHandleIsInvalid", True)]
    deleted = sqs.delete_message_batch(QueueUrl=url, Entries=[
        {"Id": "a", "ReceiptHandle": handles[0]},  # changed before: its handle still works
        {"Id": "b", "ReceiptHandle": "not-a-receipt"},
        {"Id": "c", "ReceiptHandle": handles[2]},
    ])
    assert [e["Id"] for e in deleted["Successful"]] == ["a", "c"]
    assert [(e["Id"], e["Code"]) for e in deleted["Failed"]] == [("b", "ReceiptHandleIsInvalid")]
    assert library_queue(server, name).stats().total == 1
    remaining = library_queue(server, name).receive_batch(10)
    assert [m.body for m in remaining] == [b"1"]  # made visible again by the 0 timeout


@pytest.mark.parametrize("action", ["send_message_batch", "delete_message_batch", "change_message_visibility_batch"])
@pytest.mark.parametrize(("entries", "exception", "code"), [
    ([], "EmptyBatchRequest", "AWS.SimpleQueueService.EmptyBatchRequest"),
    ([{"Id": str(i)} for i in range(11)], "TooManyEntriesInBatchRequest",
     "AWS.SimpleQueueService.TooManyEntriesInBatchRequest"),
    ([{"Id": "same"}, {"Id": "same"}], "BatchEntryIdsNotDistinct", "AWS.SimpleQueueService.BatchEntryIdsNotDistinct"),
    ([{"Id": "bad id!"}], "InvalidBatchEntryId", "AWS.SimpleQueueService.InvalidBatchEntryId"),
    ([{"Id": "x" * 81}], "InvalidBatchEntryId", "AWS.SimpleQueueService.InvalidBatchEntryId"),
])
def test_bad_batches_are_refused(sqs: Any, server: Server, action: str, entries: list[dict[str, Any]],
                                 exception: str, code: str) -> None:
    name = new_name("badbatch")
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    fill = {"send_message_batch": {"MessageBody": "x"}, "delete_message_batch": {"ReceiptHandle": "r"},
            "change_message_visibility_batch": {"ReceiptHandle": "r", "VisibilityTimeout": 1}}[action]
    with pytest.raises(getattr(sqs.exceptions, exception)) as caught:
        getattr(sqs, action)(QueueUrl=url, Entries=[{**fill, **entry} for entry in entries])
    assert error_of(caught) == (code, 400)
    assert library_queue(server, name).stats().total == 0


def test_a_batch_over_the_size_limit_is_refused(sqs: Any, server: Server) -> None:
    name = new_name("toolong")
    url = sqs.create_queue(QueueName=name, Attributes={"MaximumMessageSize": "1024"})["QueueUrl"]
    # as SQS: MaximumMessageSize limits each message; the batch may hold as much as the largest message allowed
    fits = sqs.send_message_batch(QueueUrl=url, Entries=[{"Id": str(i), "MessageBody": "x" * 600} for i in range(10)])
    assert len(fits["Successful"]) == 10
    with pytest.raises(sqs.exceptions.BatchRequestTooLong) as caught:
        sqs.send_message_batch(QueueUrl=url, Entries=[
            {"Id": str(i), "MessageBody": "x" * (200 * 1024)} for i in range(10)])  # each over 1024, too
    assert error_of(caught) == ("AWS.SimpleQueueService.BatchRequestTooLong", 400)
    assert library_queue(server, name).stats().total == 10


# -- FIFO --------------------------------------------------------------------------


def test_fifo_queues_keep_group_order(sqs: Any, server: Server) -> None:
    name = new_name("order") + ".fifo"
    url = sqs.create_queue(QueueName=name, Attributes={"FifoQueue": "true"})["QueueUrl"]
    settings = library_queue(server, name).settings
    assert (settings["dedup_window"], settings["group_concurrency"]) == (300, 1)
    for i in range(3):
        for group in ("g1", "g2"):
            sqs.send_message(QueueUrl=url, MessageBody=f"{group}-{i}", MessageGroupId=group,
                             MessageDeduplicationId=f"{group}-{i}")
    delivered: list[str] = []
    while True:
        got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, AttributeNames=["All"])
        if "Messages" not in got:
            break
        assert len(got["Messages"]) == 6  # as Amazon: each group's next messages, all in one receive
        for message in got["Messages"]:
            assert message["Attributes"]["MessageDeduplicationId"] == message["Body"]
            delivered.append(message["Body"])
            sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
    assert [b for b in delivered if b.startswith("g1")] == ["g1-0", "g1-1", "g1-2"]
    assert [b for b in delivered if b.startswith("g2")] == ["g2-0", "g2-1", "g2-2"]
    attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert attributes["FifoQueue"] == "true" and attributes["ContentBasedDeduplication"] == "false"
    assert attributes["DeduplicationScope"] == "queue" and attributes["FifoThroughputLimit"] == "perQueue"


def test_fifo_deduplication(sqs: Any, server: Server) -> None:
    name = new_name("dedup") + ".fifo"
    url = sqs.create_queue(QueueName=name, Attributes={"FifoQueue": "true"})["QueueUrl"]
    first = sqs.send_message(QueueUrl=url, MessageBody="a", MessageGroupId="g", MessageDeduplicationId="d1")
    again = sqs.send_message(QueueUrl=url, MessageBody="b", MessageGroupId="g", MessageDeduplicationId="d1")
    assert again["MessageId"] == first["MessageId"]
    assert library_queue(server, name).stats().total == 1
    with pytest.raises(ClientError) as caught:  # no dedup id and no content-based de-duplication
        sqs.send_message(QueueUrl=url, MessageBody="c", MessageGroupId="g")
    assert error_of(caught) == ("InvalidParameterValue", 400)
    sqs.set_queue_attributes(QueueUrl=url, Attributes={"ContentBasedDeduplication": "true"})
    assert library_queue(server, name).settings["content_dedup"] is True
    one = sqs.send_message(QueueUrl=url, MessageBody="same body", MessageGroupId="g")
    two = sqs.send_message(QueueUrl=url, MessageBody="same body", MessageGroupId="g")
    assert one["MessageId"] == two["MessageId"]
    assert library_queue(server, name).stats().total == 2
    batch = sqs.send_message_batch(QueueUrl=url, Entries=[
        {"Id": "x", "MessageBody": "batch", "MessageGroupId": "g"},
        {"Id": "y", "MessageBody": "batch", "MessageGroupId": "g"},
    ])
    assert batch["Successful"][0]["MessageId"] == batch["Successful"][1]["MessageId"]
    sqs.receive_message(QueueUrl=url)  # "a": its dedup id as sent
    second = sqs.receive_message(QueueUrl=url, VisibilityTimeout=0)  # g is held by "a": nothing
    assert "Messages" not in second


def test_fifo_content_dedup_id_is_reported(sqs: Any) -> None:
    url = sqs.create_queue(QueueName=new_name("cbd") + ".fifo",
                           Attributes={"FifoQueue": "true", "ContentBasedDeduplication": "true"})["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="body", MessageGroupId="g")
    message = sqs.receive_message(QueueUrl=url, MessageSystemAttributeNames=["MessageDeduplicationId"])["Messages"][0]
    assert message["Attributes"] == {"MessageDeduplicationId": hashlib.sha256(b"body").hexdigest()}


@pytest.mark.parametrize(("kwargs", "code"), [
    ({"MessageBody": "x", "MessageDeduplicationId": "d"}, "MissingParameter"),  # no group
    ({"MessageBody": "x", "MessageDeduplicationId": "d", "MessageGroupId": "g", "DelaySeconds": 5},
     "InvalidParameterValue"),
    ({"MessageBody": "x", "MessageDeduplicationId": "d", "MessageGroupId": "with space"}, "InvalidParameterValue"),
    ({"MessageBody": "x", "MessageDeduplicationId": "d" * 129, "MessageGroupId": "g"}, "InvalidParameterValue"),
])
def test_bad_fifo_sends(sqs: Any, server: Server, kwargs: dict[str, Any], code: str) -> None:
    name = new_name("badfifo") + ".fifo"
    url = sqs.create_queue(QueueName=name, Attributes={"FifoQueue": "true"})["QueueUrl"]
    with pytest.raises(ClientError) as caught:
        sqs.send_message(QueueUrl=url, **kwargs)
    assert error_of(caught) == (code, 400)
    assert library_queue(server, name).stats().total == 0


@pytest.mark.parametrize(("name_suffix", "attributes", "exception", "code"), [
    (".fifo", {}, None, "InvalidParameterValue"),
    ("", {"FifoQueue": "true"}, None, "InvalidParameterValue"),
    (".fifo", {"FifoQueue": "false"}, None, "InvalidParameterValue"),
    (".fifo", {"FifoQueue": "true", "DeduplicationScope": "everywhere"}, "InvalidAttributeValue",
     "InvalidAttributeValue"),
    (".fifo", {"FifoQueue": "true", "FifoThroughputLimit": "perGroup"}, "InvalidAttributeValue",
     "InvalidAttributeValue"),
    (".fifo", {"FifoQueue": "true", "ContentBasedDeduplication": "maybe"}, "InvalidAttributeValue",
     "InvalidAttributeValue"),
])
def test_bad_fifo_queue_creations(sqs: Any, server: Server, name_suffix: str, attributes: dict[str, str],
                                  exception: str | None, code: str) -> None:
    entries = spool_entries(server)
    with pytest.raises(getattr(sqs.exceptions, exception) if exception else ClientError) as caught:
        sqs.create_queue(QueueName=new_name("fifo") + name_suffix, Attributes=attributes)
    assert error_of(caught) == (code, 400)
    assert spool_entries(server) == entries


def test_a_group_on_a_standard_queue_is_a_vsqs_group(sqs: Any, server: Server) -> None:
    name = new_name("fair")
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="t1", MessageGroupId="tenant-1")
    message = library_queue(server, name).receive()
    assert message is not None and message.group == "tenant-1"


# -- dead letters ----------------------------------------------------------------------


def test_redrive_policy_moves_a_message_to_the_dead_letter_queue(sqs: Any, server: Server) -> None:
    dlq_name, name = new_name("dead"), new_name("work")
    dlq_url = sqs.create_queue(QueueName=dlq_name)["QueueUrl"]
    dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    policy = json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": 2})
    url = sqs.create_queue(QueueName=name, Attributes={"RedrivePolicy": policy})["QueueUrl"]
    settings = library_queue(server, name).settings
    assert (settings["dead_letter"], settings["max_receives"]) == (dlq_name, 2)
    reported = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["RedrivePolicy"])["Attributes"]
    assert json.loads(reported["RedrivePolicy"]) == {"deadLetterTargetArn": dlq_arn, "maxReceiveCount": 2}
    sqs.send_message(QueueUrl=url, MessageBody="poison")
    for _ in range(2):
        assert sqs.receive_message(QueueUrl=url, VisibilityTimeout=0)["Messages"][0]["Body"] == "poison"
    assert "Messages" not in sqs.receive_message(QueueUrl=url)  # received twice: dead-lettered
    dead = sqs.receive_message(QueueUrl=dlq_url, AttributeNames=["ApproximateReceiveCount"])["Messages"][0]
    assert dead["Body"] == "poison"
    sqs.set_queue_attributes(QueueUrl=url, Attributes={"RedrivePolicy": ""})
    assert library_queue(server, name).settings["max_receives"] is None


@pytest.mark.parametrize("policy", [
    {"deadLetterTargetArn": "arn:aws:sqs:us-east-1:000000000000:does-not-exist", "maxReceiveCount": 3},
    {"deadLetterTargetArn": "arn:aws:sqs:us-east-1:000000000000:../etc", "maxReceiveCount": 3},
    {"deadLetterTargetArn": "not an arn", "maxReceiveCount": 3},
    {"deadLetterTargetArn": "arn:aws:sqs:us-east-1:000000000000:DLQ", "maxReceiveCount": 0},
    {"deadLetterTargetArn": "arn:aws:sqs:us-east-1:000000000000:DLQ"},
])
def test_bad_redrive_policies(sqs: Any, server: Server, policy: dict[str, Any]) -> None:
    dlq, name = new_name("dlq"), new_name("src")
    sqs.create_queue(QueueName=dlq)
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    text = json.dumps(policy).replace("SELF", name).replace("DLQ", dlq)
    with pytest.raises(ClientError) as caught:
        sqs.set_queue_attributes(QueueUrl=url, Attributes={"RedrivePolicy": text})
    assert error_of(caught) == ("InvalidParameterValue", 400)
    assert caught.value.response["Error"]["Message"].startswith(f"Value {text} for parameter RedrivePolicy is invalid.")
    assert library_queue(server, name).settings["max_receives"] is None
    assert not os.path.exists(os.path.join(server.spool, "does-not-exist"))


def test_a_redrive_policy_naming_the_queue_itself_is_taken_and_moves_nothing(sqs: Any, server: Server) -> None:
    """Amazon takes it; a message would move to the queue it is in, so vsqs dead-letters nothing."""
    name = new_name("self")
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    sqs.set_queue_attributes(QueueUrl=url, Attributes={"RedrivePolicy": json.dumps(
        {"deadLetterTargetArn": arn, "maxReceiveCount": 1})})
    sqs.send_message(QueueUrl=url, MessageBody="stays")
    counts = [sqs.receive_message(QueueUrl=url, VisibilityTimeout=0, AttributeNames=["ApproximateReceiveCount"])
              ["Messages"][0]["Attributes"]["ApproximateReceiveCount"] for _ in range(3)]
    assert counts == ["1", "2", "3"]
    assert library_queue(server, name).settings["max_receives"] is None
    assert not os.path.exists(os.path.join(server.spool, f"{name}.dlq"))  # (vsqs's default dead-letter queue)


# -- long polling ---------------------------------------------------------------------


def test_a_long_poll_returns_as_soon_as_a_message_is_sent(server: Server, sqs: Any) -> None:
    url = sqs.create_queue(QueueName=new_name("poll"))["QueueUrl"]
    sender = make_client(server)
    timer = threading.Timer(0.5, lambda: sender.send_message(QueueUrl=url, MessageBody="wake up"))
    started = time.monotonic()
    timer.start()
    try:
        got = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=5)
    finally:
        timer.join()
    assert got["Messages"][0]["Body"] == "wake up"
    assert time.monotonic() - started < 4  # well within the wait


def test_a_long_poll_sees_a_library_publish_and_waits_out_an_empty_queue(server: Server, sqs: Any) -> None:
    name = new_name("poll-lib")
    url = sqs.create_queue(QueueName=name, Attributes={"ReceiveMessageWaitTimeSeconds": "1"})["QueueUrl"]
    started = time.monotonic()
    assert "Messages" not in sqs.receive_message(QueueUrl=url)  # the queue's default wait: 1 s
    assert time.monotonic() - started >= 0.9
    queue = library_queue(server, name)
    timer = threading.Timer(0.5, lambda: queue.publish(b"from elsewhere"))
    timer.start()
    try:
        got = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=5)
    finally:
        timer.join()
    assert got["Messages"][0]["Body"] == "from elsewhere"


# -- interoperation ----------------------------------------------------------------------


def test_boto3_to_the_library_and_the_cli(sqs: Any, server: Server) -> None:
    name = new_name("interop")
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    sent = sqs.send_message(QueueUrl=url, MessageBody="to the library", MessageAttributes={
        "trace": {"DataType": "String", "StringValue": "abc"},
        "size": {"DataType": "Number", "StringValue": "3"}})
    message = library_queue(server, name).receive()
    assert message is not None and message.uuid == sent["MessageId"]  # the SQS face shows the id as a UUID
    assert message.body == b"to the library" and message.md5 == sent["MD5OfMessageBody"]
    assert message.attributes["trace"] == "abc" and message.attributes["size"] == "3"
    message.delete()
    sqs.send_message(QueueUrl=url, MessageBody="to the cli")
    path = os.path.join(server.spool, name)
    done = subprocess.run([sys.executable, "-m", "vsqs", "receive", path, "--json", "--delete"],
                          capture_output=True, timeout=60, check=True)
    assert json.loads(done.stdout)["body"] == "to the cli"
    assert library_queue(server, name).stats().total == 0


def test_the_library_to_boto3(sqs: Any, server: Server) -> None:
    name = new_name("interop-back")
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    queue = library_queue(server, name)
    message_id = queue.publish(b"caf\xc3\xa9 \xff!", attributes={"origin": "library", "n.1": "x"})
    message = sqs.receive_message(QueueUrl=url, MessageAttributeNames=["All"])["Messages"][0]
    assert message["MessageId"] == vsqs.Message.uuid_of(message_id)
    assert message["Body"] == "café \ufffd!"  # not UTF-8: replaced, and the digest is of what was sent
    assert message["MD5OfBody"] == md5("café \ufffd!")
    expected = {"origin": {"DataType": "String", "StringValue": "library"},
                "n.1": {"DataType": "String", "StringValue": "x"}}
    assert message["MessageAttributes"] == expected
    assert message["MD5OfMessageAttributes"] == md5_of_attributes(expected)
    sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
    assert queue.stats().total == 0


def run_aws(server: Server, *args: str) -> Any:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_ACCESS_KEY_ID=KEY, AWS_SECRET_ACCESS_KEY=SECRET, AWS_DEFAULT_REGION=REGION,
               AWS_CONFIG_FILE="/dev/null", AWS_SHARED_CREDENTIALS_FILE="/dev/null", AWS_PAGER="")
    done = subprocess.run([sys.executable, AWS_CLI, "sqs", *args, "--endpoint-url", server.url, "--output", "json"],
                          capture_output=True, timeout=60, env=env, text=True, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout) if done.stdout.strip() else None


def test_the_aws_command_line(server: Server) -> None:
    name = new_name("awscli")
    url = run_aws(server, "create-queue", "--queue-name", name)["QueueUrl"]
    assert url.endswith(f"/{name}")
    sent = run_aws(server, "send-message", "--queue-url", url, "--message-body", "from the aws cli",
                   "--message-attributes", '{"k": {"DataType": "String", "StringValue": "v"}}')
    assert sent["MD5OfMessageBody"] == md5("from the aws cli")
    got = run_aws(server, "receive-message", "--queue-url", url, "--message-attribute-names", "All",
                  "--attribute-names", "All")["Messages"][0]
    assert got["Body"] == "from the aws cli" and got["MessageAttributes"]["k"]["StringValue"] == "v"
    run_aws(server, "delete-message", "--queue-url", url, "--receipt-handle", got["ReceiptHandle"])
    assert library_queue(server, name).stats().total == 0


# -- errors: operations, vsqs states ---------------------------------------------------------


def test_unsupported_and_unknown_operations(sqs: Any, server: Server) -> None:
    response = signed_post(server, "AmazonSQS.FlyToTheMoon", b"{}")
    assert raw_error(response) == (400, "UnknownOperationException", "UnknownOperationException")
    response = signed_post(server, "Other.SendMessage", b"{}")
    assert raw_error(response)[1] == "UnknownOperationException"


def test_a_full_queue_is_over_limit(sqs: Any, server: Server) -> None:
    name = new_name("full")
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    library_queue(server, name).configure(max_messages=1)
    sqs.send_message(QueueUrl=url, MessageBody="fits")
    with pytest.raises(sqs.exceptions.OverLimit) as caught:
        sqs.send_message(QueueUrl=url, MessageBody="does not")
    assert error_of(caught) == ("OverLimit", 400)
    assert library_queue(server, name).stats().total == 1


def test_a_suspended_queue_is_unavailable(sqs: Any, server: Server) -> None:
    name = new_name("suspended")
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    library_queue(server, name).suspend("publish")
    time.sleep(1.1)  # the gateway's handle re-reads settings every second
    with pytest.raises(ClientError) as caught:
        sqs.send_message(QueueUrl=url, MessageBody="not now")
    assert error_of(caught) == ("ServiceUnavailable", 503)
    assert library_queue(server, name).stats().total == 0


def test_vsqs_errors_translate_to_sqs_errors() -> None:
    cases = [
        (vsqs.QueueNotFound("no queue at /spool/x"), "QueueDoesNotExist", 400),
        (vsqs.InvalidReceipt("bad"), "ReceiptHandleIsInvalid", 400),
        (vsqs.StaleReceipt("gone"), "MessageNotInflight", 400),
        (vsqs.MessageTooLarge("big"), "InvalidParameterValue", 400),
        (vsqs.QueueFull("full"), "OverLimit", 400),
        (vsqs.QueueSuspended("paused"), "ServiceUnavailable", 503),
        (vsqs.InvalidArgument("wrong"), "InvalidParameterValue", 400),
        (vsqs.IncompatibleFormat("v9"), "UnsupportedOperation", 400),
        (vsqs.StorageError(28, "No space left on device", "/spool/x/f"), "InternalError", 500),
        (vsqs.StorageError(5, "Input/output error", "/spool/x/f"), "ServiceUnavailable", 503),
    ]
    for exc, name, status in cases:
        error = _protocol.sqs_error_of(exc, "/spool")
        assert (error.name, error.status) == (name, status), exc
        assert "/spool/" not in error.message
        response = _protocol.error_response(error)
        assert response.headers["x-amzn-query-error"] == f"{error.query_code};{error.fault}"


def test_attribute_digest_matches_a_known_vector() -> None:
    # computed by hand from SQS's algorithm: name "a", type "String", value "b"
    data = (struct.pack(">I", 1) + b"a" + struct.pack(">I", 6) + b"String" + b"\x01" + struct.pack(">I", 1) + b"b")
    assert (_attributes.md5_of_attributes({"a": {"DataType": "String", "StringValue": "b"}})
            == hashlib.md5(data).hexdigest())
    binary = {"x": {"DataType": "Binary", "BinaryValue": base64.b64encode(b"\x00\x01").decode()}}
    assert _attributes.md5_of_attributes(binary) == md5_of_attributes({"x": {"DataType": "Binary",
                                                                             "BinaryValue": b"\x00\x01"}})


def test_metrics_count_sqs_actions_by_outcome(sqs: Any, server: Server) -> None:
    url = sqs.create_queue(QueueName=new_name("metrics"))["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="m")
    old = sqs.receive_message(QueueUrl=url, VisibilityTimeout=0)["Messages"][0]["ReceiptHandle"]
    sqs.receive_message(QueueUrl=url, VisibilityTimeout=60)
    sqs.delete_message(QueueUrl=url, ReceiptHandle=old)
    with pytest.raises(sqs.exceptions.QueueDoesNotExist):
        sqs.get_queue_url(QueueName=new_name("absent"))
    text = httpx.get(server.url + "/metrics", timeout=10).text
    assert 'vsqs_gateway_requests_total{operation="sqs.SendMessage",outcome="ok"}' in text
    assert 'vsqs_gateway_requests_total{operation="sqs.DeleteMessage",outcome="stale"}' in text
    assert 'vsqs_gateway_requests_total{operation="sqs.GetQueueUrl",outcome="QueueDoesNotExist"}' in text


# -- bad input: names, bodies, JSON ----------------------------------------------------------


@pytest.mark.parametrize("name", ["../x", "/etc", "a/b", "a\x00b", "x" * 81, "x" * 200, "", "dot.ted", ".fifo",
                                  "..", "%2e%2e"])
def test_bad_queue_names_touch_no_file(sqs: Any, server: Server, name: str) -> None:
    entries = spool_entries(server)
    with pytest.raises(ClientError) as caught:
        sqs.create_queue(QueueName=name)
    assert error_of(caught) == ("InvalidParameterValue", 400)
    if name != "dot.ted":  # a vsqs name, though not an SQS one: simply absent
        with pytest.raises(ClientError) as caught:
            sqs.get_queue_url(QueueName=name)
        assert error_of(caught) == ("InvalidParameterValue", 400)
    assert spool_entries(server) == entries


@pytest.mark.parametrize("url_tail", ["/000000000000/..", "/000000000000/../x", "/../etc", "/000000000000/a%2Fb",
                                      "/000000000000/%2e%2e", "/x", "/000000000000/a\x00b", "", "/a/b/c"])
def test_bad_queue_urls_touch_no_file(sqs: Any, server: Server, url_tail: str) -> None:
    entries = spool_entries(server)
    with pytest.raises(sqs.exceptions.QueueDoesNotExist) as caught:
        sqs.send_message(QueueUrl=server.url + url_tail, MessageBody="x")
    assert error_of(caught) == ("AWS.SimpleQueueService.NonExistentQueue", 400)
    with pytest.raises(sqs.exceptions.QueueDoesNotExist):
        sqs.delete_queue(QueueUrl=server.url + url_tail)
    with pytest.raises(sqs.exceptions.QueueDoesNotExist):
        sqs.send_message(QueueUrl="/etc/passwd", MessageBody="x")
    assert spool_entries(server) == entries


@pytest.mark.parametrize(("body", "kind", "code"), [
    (b"{not json", "SerializationException", "SerializationException"),
    (b"[1, 2]", "SerializationException", "SerializationException"),
    (b"\xff\xfe", "SerializationException", "SerializationException"),
    (b'{"QueueName": 5}', "InvalidParameterValueException", "InvalidParameterValue"),
    (b'{"QueueName": "x", "Attributes": {"VisibilityTimeout": 5}}', "InvalidParameterValueException",
     "InvalidParameterValue"),
    (b'{}', "MissingRequiredParameterException", "MissingParameter"),
])
def test_malformed_requests(server: Server, body: bytes, kind: str, code: str) -> None:
    entries = spool_entries(server)
    assert raw_error(signed_post(server, "AmazonSQS.CreateQueue", body)) == (400, kind, code)
    assert spool_entries(server) == entries


def test_missing_parameters(sqs: Any, server: Server) -> None:
    for target in ("SendMessage", "ReceiveMessage", "DeleteQueue", "PurgeQueue", "GetQueueAttributes",
                   "CreateQueue", "GetQueueUrl"):
        assert raw_error(signed_post(server, f"AmazonSQS.{target}", b"{}")) == (
            400, "MissingRequiredParameterException", "MissingParameter")
    url = sqs.create_queue(QueueName=new_name("missing"))["QueueUrl"]
    for target in ("SendMessage", "DeleteMessage", "ChangeMessageVisibility", "SendMessageBatch",
                   "SetQueueAttributes"):
        response = signed_post(server, f"AmazonSQS.{target}", json.dumps({"QueueUrl": url}).encode())
        assert raw_error(response) == (400, "MissingRequiredParameterException", "MissingParameter"), target


def test_a_request_over_the_size_cap_writes_nothing(sqs: Any, server: Server) -> None:
    name = new_name("huge")
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    # over the SQS face's cap (3 MiB + 64 KiB at the default 1 MiB per message), far under the native one
    body = json.dumps({"QueueUrl": url, "MessageBody": "x" * (4 * 1024 * 1024)}).encode()
    response = signed_post(server, "AmazonSQS.SendMessage", body)
    assert (response.status_code, response.json()["__type"]) == (
        413, "com.amazonaws.sqs#InvalidParameterValueException")
    unsigned = refused_status(lambda: httpx.post(server.url, content=body,
                                                 headers={"X-Amz-Target": "AmazonSQS.SendMessage"}))
    assert unsigned in (413, None)  # refused before the body is read or the signature checked
    assert sorted(os.listdir(library_queue(server, name).path)) == [".vsqs.json"]


# -- auth --------------------------------------------------------------------------------------


def test_wrong_credentials_are_refused_and_write_nothing(server: Server) -> None:
    entries = spool_entries(server)
    cases = [
        (make_client(server, secret="wrong-secret"), "SignatureDoesNotMatch"),
        (make_client(server, key="AKIDUNKNOWN"), "InvalidClientTokenId"),
        (make_client(server, signature_version=botocore.UNSIGNED), "MissingAuthenticationToken"),
    ]
    for client, code in cases:
        with pytest.raises(ClientError) as caught:
            client.create_queue(QueueName=new_name("intruder"))
        assert error_of(caught) == (code, 403)
        with pytest.raises(ClientError):
            client.list_queues()
    assert spool_entries(server) == entries


def test_a_tampered_body_is_refused(server: Server) -> None:
    entries = spool_entries(server)
    body = json.dumps({"QueueName": new_name("tamper")}).encode()
    headers = {"Content-Type": "application/x-amz-json-1.0", "X-Amz-Target": "AmazonSQS.CreateQueue"}
    request = AWSRequest(method="POST", url=server.url + "/", data=body, headers=headers)
    SigV4Auth(Credentials(KEY, SECRET), "sqs", REGION).add_auth(request)
    other = json.dumps({"QueueName": new_name("tamper")}).encode()
    response = httpx.post(server.url + "/", content=other, headers=dict(request.headers.items()), timeout=10)
    assert raw_error(response) == (403, "SignatureDoesNotMatch", "SignatureDoesNotMatch")
    assert spool_entries(server) == entries


def test_without_credentials_any_signature_is_accepted(open_server: Server) -> None:
    for client in (make_client(open_server, key="anything", secret="whatever"),
                   make_client(open_server, signature_version=botocore.UNSIGNED)):
        name = new_name("open")
        url = client.create_queue(QueueName=name)["QueueUrl"]
        client.send_message(QueueUrl=url, MessageBody="hi")
        assert client.receive_message(QueueUrl=url)["Messages"][0]["Body"] == "hi"
    response = httpx.post(open_server.url + "/", content=b"{oops",
                          headers={"X-Amz-Target": "AmazonSQS.ListQueues"}, timeout=10)
    assert raw_error(response)[1] == "SerializationException"
