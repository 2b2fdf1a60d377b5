"""Answers of the SQS face that must be Amazon's to the letter (code, text,
HTTP status), as LocalStack's AWS-validated tests recorded them from Amazon,
in both protocols: JSON 1.0 through boto3, and Query as a form posted to a
real `vsqs serve` (XML answers)."""

from __future__ import annotations

import uuid
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from botocore.exceptions import ClientError

from tests.gateway.server import Server, running_gateway
from tests.gateway.test_sqs import make_client

NS = "{http://queue.amazonaws.com/doc/2012-11-05/}"
FORM = {"Content-Type": "application/x-www-form-urlencoded"}
PROTOCOLS = ["json", "query"]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    spool = tmp_path_factory.mktemp("amazon-answers") / "spool"
    spool.mkdir()
    with running_gateway(str(spool), log_dir=str(tmp_path_factory.mktemp("amazon-answers-logs"))) as running:
        yield running
        assert "Traceback" not in running.log(), running.log()


@pytest.fixture(scope="module")
def sqs(server: Server) -> Any:
    return make_client(server)


def new_name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def query(server: Server, action: str, **fields: str) -> httpx.Response:
    return httpx.post(server.url + "/", data={"Action": action, "Version": "2012-11-05", **fields}, headers=FORM,
                      timeout=30)


def query_error(response: httpx.Response) -> tuple[int, str, str]:
    """(status, Code, Message) of a Query error answer."""
    error = ET.fromstring(response.content).find(f"{NS}Error")
    assert error is not None, response.text
    return response.status_code, error.findtext(f"{NS}Code") or "", error.findtext(f"{NS}Message") or ""


def json_error(call: Any, **kwargs: Any) -> tuple[int, str, str]:
    """(status, Code, Message) boto3 sees of a JSON call that must fail."""
    with pytest.raises(ClientError) as caught:
        call(**kwargs)
    response = caught.value.response
    return response["ResponseMetadata"]["HTTPStatusCode"], response["Error"]["Code"], response["Error"]["Message"]


def error_of(protocol: str, server: Server, sqs: Any, action: str, boto_kwargs: dict[str, Any],
             form: dict[str, str]) -> tuple[int, str, str]:
    if protocol == "json":
        return json_error(getattr(sqs, action), **boto_kwargs)
    return query_error(query(server, "".join(part.title() for part in action.split("_")), **form))


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize(("attribute", "value", "text"), [
    ("FifoQueue", "false", "Unknown Attribute FifoQueue."),
    ("ContentBasedDeduplication", "false", "Unknown Attribute ContentBasedDeduplication."),
    ("DeduplicationScope", "queue", "You can specify the DeduplicationScope only when FifoQueue is set to true."),
    ("FifoThroughputLimit", "perQueue",
     "You can specify the FifoThroughputLimit only when FifoQueue is set to true."),
])
def test_a_fifo_attribute_on_a_standard_queue(server: Server, sqs: Any, protocol: str, attribute: str, value: str,
                                              text: str) -> None:
    name = new_name("standard")
    got = error_of(protocol, server, sqs, "create_queue", {"QueueName": name, "Attributes": {attribute: value}},
                   {"QueueName": name, "Attribute.1.Name": attribute, "Attribute.1.Value": value})
    assert got == (400, "InvalidAttributeName", text)
    url = sqs.create_queue(QueueName=name)["QueueUrl"]  # nothing was made: the name is free
    got = error_of(protocol, server, sqs, "set_queue_attributes", {"QueueUrl": url, "Attributes": {attribute: value}},
                   {"QueueUrl": url, "Attribute.1.Name": attribute, "Attribute.1.Value": value})
    assert got == (400, "InvalidAttributeName", text)


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("parameter", ["MessageGroupId", "MessageDeduplicationId"])
def test_an_id_too_long_is_quoted_whole(server: Server, sqs: Any, protocol: str, parameter: str) -> None:
    url = sqs.create_queue(QueueName=new_name("ids") + ".fifo", Attributes={"FifoQueue": "true"})["QueueUrl"]
    ids = {"MessageGroupId": "g", "MessageDeduplicationId": "d", parameter: "a" * 129}
    got = error_of(protocol, server, sqs, "send_message", {"QueueUrl": url, "MessageBody": "x", **ids},
                   {"QueueUrl": url, "MessageBody": "x", **ids})
    assert got == (400, "InvalidParameterValue",
                   f"Value {'a' * 129} for parameter {parameter} is invalid. Reason: {parameter} can only include "
                   "alphanumeric and punctuation characters. 1 to 128 in length.")


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_group_id_too_long_on_a_standard_queue(server: Server, sqs: Any, protocol: str) -> None:
    url = sqs.create_queue(QueueName=new_name("std-ids"))["QueueUrl"]
    got = error_of(protocol, server, sqs, "send_message",
                   {"QueueUrl": url, "MessageBody": "x", "MessageGroupId": "a" * 129},
                   {"QueueUrl": url, "MessageBody": "x", "MessageGroupId": "a" * 129})
    assert got == (400, "InvalidParameterValue",
                   f"Value {'a' * 129} for parameter MessageGroupId is invalid. Reason: MessageGroupId can only "
                   "include alphanumeric and punctuation characters. 1 to 128 in length.")


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_message_too_long_in_a_batch_and_alone(server: Server, sqs: Any, protocol: str) -> None:
    url = sqs.create_queue(QueueName=new_name("size"), Attributes={"MaximumMessageSize": "1024"})["QueueUrl"]
    big, small = "x" * 1025, "y" * 10
    if protocol == "json":
        answer = sqs.send_message_batch(QueueUrl=url, Entries=[{"Id": "big", "MessageBody": big},
                                                               {"Id": "small", "MessageBody": small}])
        failed = [{key: entry[key] for key in ("Id", "Code", "Message", "SenderFault")} for entry in answer["Failed"]]
        succeeded = [entry["Id"] for entry in answer["Successful"]]
    else:
        response = query(server, "SendMessageBatch", QueueUrl=url,
                         **{"SendMessageBatchRequestEntry.1.Id": "big",
                            "SendMessageBatchRequestEntry.1.MessageBody": big,
                            "SendMessageBatchRequestEntry.2.Id": "small",
                            "SendMessageBatchRequestEntry.2.MessageBody": small})
        assert response.status_code == 200, response.text
        result = ET.fromstring(response.content).find(f"{NS}SendMessageBatchResult")
        assert result is not None
        failed = [{"Id": entry.findtext(f"{NS}Id"), "Code": entry.findtext(f"{NS}Code"),
                   "Message": entry.findtext(f"{NS}Message"),
                   "SenderFault": entry.findtext(f"{NS}SenderFault") == "true"}
                  for entry in result.findall(f"{NS}BatchResultErrorEntry")]
        succeeded = [entry.findtext(f"{NS}Id") for entry in result.findall(f"{NS}SendMessageBatchResultEntry")]
    assert failed == [{"Id": "big", "Code": "InvalidParameterValue", "SenderFault": True,
                       "Message": "One or more parameters cannot be validated. Reason: Message must be shorter "
                                  "than 1024 bytes."}]
    assert succeeded == ["small"]
    # SendMessage keeps its own words
    got = error_of(protocol, server, sqs, "send_message", {"QueueUrl": url, "MessageBody": big},
                   {"QueueUrl": url, "MessageBody": big})
    assert got == (400, "InvalidParameterValue",
                   "One or more parameters are invalid. Reason: Message must be shorter than 1024 bytes.")


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("wait", [21, -1])
def test_wait_time_seconds_out_of_range(server: Server, sqs: Any, protocol: str, wait: int) -> None:
    url = sqs.create_queue(QueueName=new_name("wait"))["QueueUrl"]
    got = error_of(protocol, server, sqs, "receive_message", {"QueueUrl": url, "WaitTimeSeconds": wait},
                   {"QueueUrl": url, "WaitTimeSeconds": str(wait)})
    assert got == (400, "InvalidParameterValue",
                   f"Value {wait} for parameter WaitTimeSeconds is invalid. Reason: Must be >= 0 and <= 20, "
                   "if provided.")
    # MaxNumberOfMessages keeps Amazon's other wording
    got = error_of(protocol, server, sqs, "receive_message", {"QueueUrl": url, "MaxNumberOfMessages": 11},
                   {"QueueUrl": url, "MaxNumberOfMessages": "11"})
    assert got == (400, "InvalidParameterValue",
                   "Value 11 for parameter MaxNumberOfMessages is invalid. Reason: Must be between 1 and 10, "
                   "if provided.")


def test_an_empty_query_receive_is_one_empty_element(server: Server, sqs: Any) -> None:
    url = sqs.create_queue(QueueName=new_name("empty"))["QueueUrl"]
    response = query(server, "ReceiveMessage", QueueUrl=url)
    assert response.status_code == 200
    assert "<ReceiveMessageResult/>" in response.text
    sqs.send_message(QueueUrl=url, MessageBody="foobar")
    response = query(server, "ReceiveMessage", QueueUrl=url)
    assert "<ReceiveMessageResult><Message>" in response.text and "<Body>foobar</Body>" in response.text
