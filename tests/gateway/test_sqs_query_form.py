"""Query forms read into the JSON protocol's parameters (vsqs._gateway.sqs.query),
without a server: the shapes the actions are given, and the refusals."""

from __future__ import annotations

from urllib.parse import urlencode

import pytest

from vsqs._gateway.limits import MAX_QUERY_FIELDS
from vsqs._gateway.sqs.protocol import SqsError
from vsqs._gateway.sqs.query import is_query_request, params_of, split_form


def params(action: str, fields: dict[str, str], path: str = "/") -> dict[str, object]:
    form = split_form(urlencode({"Action": action, "Version": "2012-11-05", **fields}).encode())
    return params_of(action, form, path)


def refusal(action: str, form: bytes) -> SqsError:
    with pytest.raises(SqsError) as caught:
        params_of(action, split_form(form))
    return caught.value


def test_a_batch_with_attributes_reads_as_its_json() -> None:
    got = params("SendMessageBatch", {
        "QueueUrl": "q",
        "SendMessageBatchRequestEntry.2.Id": "b", "SendMessageBatchRequestEntry.2.MessageBody": "two",
        "SendMessageBatchRequestEntry.1.Id": "a", "SendMessageBatchRequestEntry.1.MessageBody": "one",
        "SendMessageBatchRequestEntry.1.DelaySeconds": "-3",
        "SendMessageBatchRequestEntry.1.MessageAttribute.1.Name": "n.1",
        "SendMessageBatchRequestEntry.1.MessageAttribute.1.Value.DataType": "Number",
        "SendMessageBatchRequestEntry.1.MessageAttribute.1.Value.StringValue": "5",
        "SendMessageBatchRequestEntry.1.MessageAttribute.2.Name": "raw",
        "SendMessageBatchRequestEntry.1.MessageAttribute.2.Value.DataType": "Binary",
        "SendMessageBatchRequestEntry.1.MessageAttribute.2.Value.BinaryValue": "AAE=",
        "SendMessageBatchRequestEntry.2.MessageSystemAttribute.1.Name": "AWSTraceHeader",
        "SendMessageBatchRequestEntry.2.MessageSystemAttribute.1.Value.DataType": "String",
        "SendMessageBatchRequestEntry.2.MessageSystemAttribute.1.Value.StringValue": "Root=1",
        "SendMessageBatchRequestEntry.7.Id": "gap",  # a gap is skipped: items keep their order
        "SendMessageBatchRequestEntry.2.Colour": "ignored", "Signature": "ignored",
    })
    assert got == {"QueueUrl": "q", "Entries": [
        {"Id": "a", "MessageBody": "one", "DelaySeconds": -3, "MessageAttributes": {
            "n.1": {"DataType": "Number", "StringValue": "5"},
            "raw": {"DataType": "Binary", "BinaryValue": "AAE="}}},
        {"Id": "b", "MessageBody": "two", "MessageSystemAttributes": {
            "AWSTraceHeader": {"DataType": "String", "StringValue": "Root=1"}}},
        {"Id": "gap"},
    ]}


def test_lists_and_maps() -> None:
    assert params("ReceiveMessage", {"QueueUrl": "q", "AttributeName.2": "SentTimestamp", "AttributeName.1": "All",
                                     "MessageAttributeName.1": "a.*", "MaxNumberOfMessages": "10"}) == {
        "QueueUrl": "q", "AttributeNames": ["All", "SentTimestamp"], "MessageAttributeNames": ["a.*"],
        "MaxNumberOfMessages": 10}
    assert params("CreateQueue", {"QueueName": "q", "Attribute.1.Name": "DelaySeconds", "Attribute.1.Value": "",
                                  "Tag.1.Key": "k", "Tag.1.Value": "v"}) == {
        "QueueName": "q", "Attributes": {"DelaySeconds": ""}, "tags": {"k": "v"}}
    assert params("UntagQueue", {"QueueUrl": "q", "TagKey.1": "a", "TagKey.2": "b"})["TagKeys"] == ["a", "b"]
    assert params("DeleteMessageBatch", {"QueueUrl": "q", "Entries": ""})["Entries"] == []  # botocore's empty list


def test_older_clients_unindexed_names_are_item_one() -> None:
    assert params("GetQueueAttributes", {"QueueUrl": "q", "AttributeName": "All"})["AttributeNames"] == ["All"]
    got = params("SetQueueAttributes", {"QueueUrl": "q", "Attribute.Name": "DelaySeconds", "Attribute.Value": "1"})
    assert got["Attributes"] == {"DelaySeconds": "1"}


def test_a_request_to_a_queue_url_is_about_that_queue() -> None:
    assert params("SendMessage", {"MessageBody": "x"}, "/000000000000/jobs")["QueueUrl"] == "/000000000000/jobs"
    assert params("SendMessage", {"MessageBody": "x", "QueueUrl": "other"}, "/000000000000/jobs")["QueueUrl"] == \
        "other"
    assert "QueueUrl" not in params("ListQueues", {}, "/000000000000/jobs")


@pytest.mark.parametrize(("action", "form", "code", "status"), [
    ("ListQueues", b"&".join([b"x=1"] * (MAX_QUERY_FIELDS + 1)), "InvalidParameterValue", 413),
    ("SendMessage", b"MessageBody=a&MessageBody=b", "InvalidParameterValue", 400),
    ("GetQueueAttributes", b"AttributeName=All&AttributeName.1=QueueArn", "InvalidParameterValue", 400),
    ("SendMessageBatch", b"SendMessageBatchRequestEntry.99999999.Id=a", "InvalidParameterValue", 400),
    ("SendMessageBatch", b"SendMessageBatchRequestEntry.0.Id=a", "InvalidParameterValue", 400),
    ("SendMessageBatch", b"SendMessageBatchRequestEntry.01.Id=a", "InvalidParameterValue", 400),
    ("SendMessageBatch", b"SendMessageBatchRequestEntry.x.Id=a", "InvalidParameterValue", 400),
    ("SetQueueAttributes", b"Attribute.1.Name=A&Attribute.1.Value=1&Attribute.2.Name=A&Attribute.2.Value=2",
     "InvalidParameterValue", 400),
    ("SetQueueAttributes", b"Attribute.1.Name=A", "MissingParameter", 400),
    ("SetQueueAttributes", b"Attribute.1.Value=1", "MissingParameter", 400),
    ("ReceiveMessage", b"WaitTimeSeconds=1.5", "InvalidParameterValue", 400),
    ("ReceiveMessage", b"WaitTimeSeconds=9999999999999", "InvalidParameterValue", 400),
    ("SendMessage", b"MessageBody=%C3%28", "InvalidMessageContents", 400),
    ("SendMessage", b"MessageAttribute.1.Value.StringValue=%FF", "InvalidMessageContents", 400),
    ("SendMessage", b"QueueUrl=%FF", "InvalidParameterValue", 400),
    ("SendMessage", b"%FF=1", "InvalidParameterValue", 400),
])
def test_refused_forms(action: str, form: bytes, code: str, status: int) -> None:
    error = refusal(action, form)
    assert (error.query_code, error.status) == (code, status)


def test_which_requests_speak_query() -> None:
    def scope(method: str, path: str, headers: list[tuple[bytes, bytes]], query: bytes = b"") -> dict[str, object]:
        return {"method": method, "path": path, "headers": headers, "query_string": query}

    form = [(b"content-type", b"application/x-www-form-urlencoded; charset=utf-8")]
    assert is_query_request(scope("POST", "/", form))
    assert is_query_request(scope("POST", "/000000000000/jobs", form))
    assert is_query_request(scope("GET", "/", [], b"Action=ListQueues"))
    assert is_query_request(scope("GET", "/000000000000/jobs", [], b"Version=1&Action=ReceiveMessage"))
    assert not is_query_request(scope("POST", "/", [*form, (b"x-amz-target", b"AmazonSQS.ListQueues")]))
    assert not is_query_request(scope("POST", "/", [(b"content-type", b"application/x-amz-json-1.0")]))
    assert not is_query_request(scope("GET", "/", [], b"NoAction=1"))
    assert not is_query_request(scope("POST", "/queues/jobs", form))
    assert not is_query_request(scope("POST", "/000000000000/jobs/x", form))
    assert not is_query_request(scope("PUT", "/", form))
