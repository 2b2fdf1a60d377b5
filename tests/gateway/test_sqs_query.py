"""The SQS face in the Query protocol (form requests, XML answers), against a
real `vsqs serve`: through a real Query client (botocore 1.34.89, run in a
subprocess: tests/gateway/query_client.py) and through raw HTTP for what no
client sends."""

from __future__ import annotations

import hashlib
import json
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Iterator

import httpx
import pytest

import vsqs
from tests.gateway.query_client import from_bytes, run_client, run_js
from tests.gateway.server import Server, running_gateway

API_KEY = "query-api-key"
NS = "{http://queue.amazonaws.com/doc/2012-11-05/}"
FORM = {"Content-Type": "application/x-www-form-urlencoded; charset=utf-8"}
# a SigV4 Authorization header, as boto 2 signs its GETs (a gateway with no keys checks none)
SIGNED_IN_HEADERS = {"Authorization": "AWS4-HMAC-SHA256 Credential=AKID/20260101/us-east-1/sqs/aws4_request, "
                                      "SignedHeaders=host;x-amz-date, Signature=" + "0" * 64}
# the first test to run installs the Query clients (pip, npm): minutes on a loaded machine
pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A gateway with no keys: every request is accepted, signed or not."""
    spool = tmp_path_factory.mktemp("query") / "spool"
    spool.mkdir()
    with running_gateway(str(spool), log_dir=str(tmp_path_factory.mktemp("query-logs"))) as running:
        yield running
        assert "Traceback" not in running.log(), running.log()


@pytest.fixture(scope="module")
def keyed_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A gateway with an API key: SQS requests must be signed with it as the secret."""
    spool = tmp_path_factory.mktemp("query-keyed") / "spool"
    spool.mkdir()
    with running_gateway(str(spool), env={"VSQS_API_KEY": API_KEY},
                         log_dir=str(tmp_path_factory.mktemp("query-keyed-logs"))) as running:
        yield running
        assert "Traceback" not in running.log(), running.log()


def new_name(prefix: str = "q") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def post(server: Server, form: bytes | dict[str, str], path: str = "/") -> httpx.Response:
    return httpx.post(server.url + path, content=form if isinstance(form, bytes) else None,
                      data=form if isinstance(form, dict) else None, headers=FORM, timeout=30)


def xml_error(response: httpx.Response) -> tuple[int, str, str, str]:
    """(status, Type, Code, Message) of a Query error answer."""
    assert response.headers["content-type"].startswith("text/xml")
    root = ET.fromstring(response.content)
    assert root.tag == f"{NS}ErrorResponse" and root.findtext(f"{NS}RequestId")
    error = root.find(f"{NS}Error")
    assert error is not None
    return (response.status_code, error.findtext(f"{NS}Type") or "", error.findtext(f"{NS}Code") or "",
            error.findtext(f"{NS}Message") or "")


def xml_result(response: httpx.Response, action: str) -> ET.Element:
    assert response.status_code == 200, response.text
    root = ET.fromstring(response.content)
    assert root.tag == f"{NS}{action}Response" and root.findtext(f"{NS}ResponseMetadata/{NS}RequestId")
    result = root.find(f"{NS}{action}Result")
    assert result is not None
    return result


# -- through a real Query client -----------------------------------------------


def test_queues_created_found_listed_and_deleted(server: Server) -> None:
    prefix = new_name("listed")
    got = run_client(server.url, f"""
        urls = [sqs.create_queue(QueueName="{prefix}-" + str(i), Attributes={{"VisibilityTimeout": "7"}},
                                 tags={{"team": "a"}})["QueueUrl"] for i in range(3)]
        again = sqs.create_queue(QueueName="{prefix}-0", Attributes={{"VisibilityTimeout": "7"}})["QueueUrl"]
        clash = error(sqs.create_queue, QueueName="{prefix}-0", Attributes={{"VisibilityTimeout": "8"}})
        found = sqs.get_queue_url(QueueName="{prefix}-1")["QueueUrl"]
        first = sqs.list_queues(QueueNamePrefix="{prefix}", MaxResults=2)
        rest = sqs.list_queues(QueueNamePrefix="{prefix}", MaxResults=2, NextToken=first["NextToken"])
        sqs.delete_queue(QueueUrl=urls[2])
        result = {{"urls": urls, "again": again, "clash": clash, "found": found, "first": first["QueueUrls"],
                   "rest": rest["QueueUrls"], "after": plain(sqs.list_queues(QueueNamePrefix="{prefix}")),
                   "gone": error(sqs.get_queue_url, QueueName="{prefix}-2")}}
    """)
    urls = got["urls"]
    assert urls == [f"{server.url}/000000000000/{prefix}-{i}" for i in range(3)]
    assert got["again"] == urls[0] and got["found"] == urls[1]
    assert got["clash"] == ["QueueAlreadyExists", "QueueNameExists"]
    assert got["first"] == urls[:2] and got["rest"] == urls[2:]
    assert got["after"] == {"QueueUrls": urls[:2]}
    assert got["gone"] == ["AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist"]
    assert vsqs.Spool(server.spool).queue(f"{prefix}-0").settings["tags"] == {"team": "a"}


def test_send_receive_delete_with_attributes_and_digests(server: Server) -> None:
    """The client checks MD5OfMessageBody and MD5OfMessageAttributes of sends and
    receives itself: a body or attribute that came back changed would fail it."""
    name = new_name("messages")
    body = "<b>&amp; ]]> \"quoted\" 'x'\r\n\ttab é 😀 \U0010fffd"
    got = run_client(server.url, f"""
        url = sqs.create_queue(QueueName="{name}")["QueueUrl"]
        attributes = {{"text": {{"DataType": "String", "StringValue": "a<b>&c]]>\\r\\n"}},
                       "n": {{"DataType": "Number.int", "StringValue": "-12.5e3"}},
                       "raw": {{"DataType": "Binary", "BinaryValue": bytes(range(256))}}}}
        sent = sqs.send_message(QueueUrl=url, MessageBody={body!r}, MessageAttributes=attributes,
                                MessageSystemAttributes={{"AWSTraceHeader": {{"DataType": "String",
                                                                              "StringValue": "Root=1-a-b"}}}})
        received = sqs.receive_message(QueueUrl=url, AttributeNames=["All"], MessageAttributeNames=["All"],
                                       MaxNumberOfMessages=10)["Messages"]
        sqs.delete_message(QueueUrl=url, ReceiptHandle=received[0]["ReceiptHandle"])
        stale = plain(sqs.delete_message(QueueUrl=url, ReceiptHandle=received[0]["ReceiptHandle"]))
        result = {{"sent": plain(sent), "received": plain(received), "stale": stale,
                   "empty": plain(sqs.receive_message(QueueUrl=url))}}
    """)
    sent, (message,) = got["sent"], got["received"]
    assert message["MessageId"] == sent["MessageId"] and message["Body"] == body
    assert message["MD5OfBody"] == sent["MD5OfMessageBody"] == hashlib.md5(body.encode()).hexdigest()
    assert message["MD5OfMessageAttributes"] == sent["MD5OfMessageAttributes"]
    assert "MD5OfMessageSystemAttributes" in sent
    attributes = message["MessageAttributes"]
    assert attributes["text"] == {"DataType": "String", "StringValue": "a<b>&c]]>\r\n"}
    assert attributes["n"] == {"DataType": "Number.int", "StringValue": "-12.5e3"}
    assert from_bytes(attributes["raw"]["BinaryValue"]) == bytes(range(256))
    system = message["Attributes"]
    assert system["ApproximateReceiveCount"] == "1" and system["AWSTraceHeader"] == "Root=1-a-b"
    assert system["SenderId"] and int(system["SentTimestamp"]) > 0
    assert got["stale"] == {} and got["empty"] == {}
    assert vsqs.Spool(server.spool).queue(name).stats().total == 0


def test_batches(server: Server) -> None:
    name = new_name("batches")
    got = run_client(server.url, f"""
        url = sqs.create_queue(QueueName="{name}")["QueueUrl"]
        entries = [{{"Id": f"m{{i}}", "MessageBody": f"body {{i}}",
                     "MessageAttributes": {{"i": {{"DataType": "Number", "StringValue": str(i)}}}}}}
                   for i in range(9)]
        entries.append({{"Id": "late", "MessageBody": "x", "DelaySeconds": 901}})
        sent = sqs.send_message_batch(QueueUrl=url, Entries=entries)
        received = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=600,
                                       MessageAttributeNames=["All"])["Messages"]
        handles = [{{"Id": f"d{{i}}", "ReceiptHandle": m["ReceiptHandle"]}} for i, m in enumerate(received)]
        changed = sqs.change_message_visibility_batch(QueueUrl=url, Entries=[
            {{"Id": "c0", "ReceiptHandle": received[0]["ReceiptHandle"], "VisibilityTimeout": 900}},
            {{"Id": "bad", "ReceiptHandle": "not-a-receipt", "VisibilityTimeout": 5}}])
        deleted = sqs.delete_message_batch(QueueUrl=url, Entries=handles + [{{"Id": "bad", "ReceiptHandle": "x"}}])
        result = {{"sent": plain(sent), "received": plain(received), "changed": plain(changed),
                   "deleted": plain(deleted),
                   "too_many": error(sqs.send_message_batch, QueueUrl=url,
                                     Entries=[{{"Id": str(i), "MessageBody": "x"}} for i in range(11)]),
                   "same_ids": error(sqs.delete_message_batch, QueueUrl=url,
                                     Entries=[{{"Id": "a", "ReceiptHandle": "x"}},
                                              {{"Id": "a", "ReceiptHandle": "y"}}]),
                   "empty": error(sqs.send_message_batch, QueueUrl=url, Entries=[])}}
    """)
    sent = got["sent"]
    assert sorted(entry["Id"] for entry in sent["Successful"]) == sorted(f"m{i}" for i in range(9))
    (failed,) = sent["Failed"]
    assert failed["Id"] == "late" and failed["Code"] == "InvalidParameterValue" and failed["SenderFault"] is True
    received = got["received"]
    assert sorted(m["Body"] for m in received) == sorted(f"body {i}" for i in range(9))
    assert all(m["MessageAttributes"]["i"]["StringValue"] == m["Body"].split()[1] for m in received)
    assert [e["Id"] for e in got["changed"]["Successful"]] == ["c0"]
    assert [(e["Id"], e["Code"]) for e in got["changed"]["Failed"]] == [("bad", "ReceiptHandleIsInvalid")]
    assert sorted(e["Id"] for e in got["deleted"]["Successful"]) == sorted(f"d{i}" for i in range(9))
    assert [(e["Id"], e["Code"]) for e in got["deleted"]["Failed"]] == [("bad", "ReceiptHandleIsInvalid")]
    assert got["too_many"] == ["AWS.SimpleQueueService.TooManyEntriesInBatchRequest", "TooManyEntriesInBatchRequest"]
    assert got["same_ids"] == ["AWS.SimpleQueueService.BatchEntryIdsNotDistinct", "BatchEntryIdsNotDistinct"]
    assert got["empty"] == ["AWS.SimpleQueueService.EmptyBatchRequest", "EmptyBatchRequest"]
    assert vsqs.Spool(server.spool).queue(name).stats().total == 0


def test_visibility(server: Server) -> None:
    """A message made visible again (timeout 0) is received again, its count
    up; its first handle still deletes it after the change (SQS keeps handles)."""
    name = new_name("visibility")
    got = run_client(server.url, f"""
        url = sqs.create_queue(QueueName="{name}")["QueueUrl"]
        sqs.send_message(QueueUrl=url, MessageBody="again")
        first = sqs.receive_message(QueueUrl=url, VisibilityTimeout=600)["Messages"][0]
        hidden = plain(sqs.receive_message(QueueUrl=url))
        sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=first["ReceiptHandle"], VisibilityTimeout=0)
        second = sqs.receive_message(QueueUrl=url, VisibilityTimeout=600, AttributeNames=["All"])["Messages"][0]
        sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=second["ReceiptHandle"], VisibilityTimeout=900)
        sqs.delete_message(QueueUrl=url, ReceiptHandle=second["ReceiptHandle"])
        result = {{"hidden": hidden, "count": second["Attributes"]["ApproximateReceiveCount"],
                   "same": first["MessageId"] == second["MessageId"],
                   "bad": error(sqs.change_message_visibility, QueueUrl=url, ReceiptHandle="nope",
                                VisibilityTimeout=1),
                   "too_long": error(sqs.change_message_visibility, QueueUrl=url,
                                     ReceiptHandle=second["ReceiptHandle"], VisibilityTimeout=43201)}}
    """)
    assert got["hidden"] == {} and got["count"] == "2" and got["same"] is True
    assert got["bad"] == ["ReceiptHandleIsInvalid", "ReceiptHandleIsInvalid"]
    assert got["too_long"] == ["InvalidParameterValue", "ClientError"]
    assert vsqs.Spool(server.spool).queue(name).stats().total == 0


def test_fifo_send_with_group_and_dedup(server: Server) -> None:
    name = new_name("fifo") + ".fifo"
    got = run_client(server.url, f"""
        url = sqs.create_queue(QueueName="{name}", Attributes={{"FifoQueue": "true"}})["QueueUrl"]
        sent = [sqs.send_message(QueueUrl=url, MessageBody=f"m{{i}}", MessageGroupId="g",
                                 MessageDeduplicationId=f"d{{i}}") for i in range(3)]
        duplicate = sqs.send_message(QueueUrl=url, MessageBody="m0 again", MessageGroupId="g",
                                     MessageDeduplicationId="d0")
        batch = sqs.send_message_batch(QueueUrl=url, Entries=[
            {{"Id": "b", "MessageBody": "m3", "MessageGroupId": "g", "MessageDeduplicationId": "d3"}}])
        received = []
        for _ in range(4):  # one at a time: the group's next is held until the one before is deleted
            received += sqs.receive_message(QueueUrl=url, AttributeNames=["All"])["Messages"]
            sqs.delete_message(QueueUrl=url, ReceiptHandle=received[-1]["ReceiptHandle"])
        result = {{"sent": plain(sent), "batch": plain(batch), "received": plain(received),
                   "no_group": error(sqs.send_message, QueueUrl=url, MessageBody="x", MessageDeduplicationId="z"),
                   "no_dedup": error(sqs.send_message, QueueUrl=url, MessageBody="x", MessageGroupId="g"),
                   "duplicate_id": duplicate["MessageId"],
                   "attributes": sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]}}
    """)
    sent = got["sent"]
    numbers = [int(s["SequenceNumber"]) for s in sent] + [int(got["batch"]["Successful"][0]["SequenceNumber"])]
    assert numbers == sorted(numbers) and len(set(numbers)) == 4
    assert got["duplicate_id"] == sent[0]["MessageId"]  # de-duplicated: the first send's id
    received = got["received"]
    assert [m["Body"] for m in received] == ["m0", "m1", "m2", "m3"]
    assert [m["Attributes"]["MessageDeduplicationId"] for m in received] == ["d0", "d1", "d2", "d3"]
    assert all(m["Attributes"]["MessageGroupId"] == "g" for m in received)
    assert [m["Attributes"]["SequenceNumber"] for m in received] == [str(n) for n in numbers]
    assert got["no_group"] == ["MissingParameter", "ClientError"]
    assert got["no_dedup"] == ["InvalidParameterValue", "ClientError"]
    attributes = got["attributes"]
    assert attributes["FifoQueue"] == "true" and attributes["DeduplicationScope"] == "queue"


def test_queue_attributes_get_and_set(server: Server) -> None:
    name, dead = new_name("attrs"), new_name("attrs-dlq")
    got = run_client(server.url, f"""
        url = sqs.create_queue(QueueName="{name}")["QueueUrl"]
        dlq = sqs.create_queue(QueueName="{dead}")["QueueUrl"]
        redrive = '{{"deadLetterTargetArn":"arn:aws:sqs:us-east-1:000000000000:{dead}","maxReceiveCount":4}}'
        sqs.set_queue_attributes(QueueUrl=url, Attributes={{
            "VisibilityTimeout": "45", "DelaySeconds": "3", "MaximumMessageSize": "2048", "RedrivePolicy": redrive}})
        some = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["VisibilityTimeout", "RedrivePolicy",
                                                                       "QueueArn"])["Attributes"]
        every = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
        result = {{"some": some, "every": every,
                   "unknown": error(sqs.get_queue_attributes, QueueUrl=url, AttributeNames=["Colour"]),
                   "bad_value": error(sqs.set_queue_attributes, QueueUrl=url,
                                      Attributes={{"VisibilityTimeout": "forever"}}),
                   "sources": sqs.list_dead_letter_source_queues(QueueUrl=dlq)["queueUrls"]}}
    """)
    assert got["some"] == {"VisibilityTimeout": "45", "QueueArn": f"arn:aws:sqs:us-east-1:000000000000:{name}",
                           "RedrivePolicy": '{"deadLetterTargetArn":"arn:aws:sqs:us-east-1:000000000000:'
                                            f'{dead}","maxReceiveCount":4}}'}
    assert got["every"]["DelaySeconds"] == "3" and got["every"]["MaximumMessageSize"] == "2048"
    assert got["unknown"] == ["InvalidAttributeName", "InvalidAttributeName"]
    assert got["bad_value"] == ["InvalidAttributeValue", "ClientError"]
    assert got["sources"] == [f"{server.url}/000000000000/{name}"]
    settings = vsqs.Spool(server.spool).queue(name).settings
    assert (settings["visibility_timeout"], settings["max_receives"], settings["dead_letter"]) == (45, 4, dead)


def test_tags_permissions_and_purge(server: Server) -> None:
    name = new_name("tags")
    got = run_client(server.url, f"""
        url = sqs.create_queue(QueueName="{name}")["QueueUrl"]
        sqs.tag_queue(QueueUrl=url, Tags={{"a": "1", "b": "<2>"}})
        tagged = sqs.list_queue_tags(QueueUrl=url)["Tags"]
        sqs.untag_queue(QueueUrl=url, TagKeys=["a"])
        untagged = sqs.list_queue_tags(QueueUrl=url)["Tags"]
        sqs.add_permission(QueueUrl=url, Label="p1", AWSAccountIds=["111122223333"], Actions=["SendMessage"])
        policy = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["Policy"])["Attributes"]["Policy"]
        sqs.remove_permission(QueueUrl=url, Label="p1")
        for i in range(3):
            sqs.send_message(QueueUrl=url, MessageBody=str(i))
        sqs.purge_queue(QueueUrl=url)
        result = {{"tagged": tagged, "untagged": untagged, "policy": policy,
                   "after_purge": plain(sqs.receive_message(QueueUrl=url)),
                   "count": sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"])}}
    """)
    assert got["tagged"] == {"a": "1", "b": "<2>"} and got["untagged"] == {"b": "<2>"}
    assert '"Sid":"p1"' in got["policy"] and "111122223333" in got["policy"]
    assert got["after_purge"] == {}
    assert got["count"]["Attributes"] == {"ApproximateNumberOfMessages": "0"}


def test_errors_as_the_client_sees_them(server: Server) -> None:
    name = new_name("errors")
    got = run_client(server.url, f"""
        missing = f"{{sqs.meta.endpoint_url}}/000000000000/no-such-queue"
        result = {{
            "send": error(sqs.send_message, QueueUrl=missing, MessageBody="x"),
            "receive": error(sqs.receive_message, QueueUrl=missing),
            "bad_name": error(sqs.create_queue, QueueName="no spaces"),
            "max_messages": error(sqs.receive_message, QueueUrl=missing, MaxNumberOfMessages=11),
            "empty_body": error(sqs.send_message, QueueUrl=sqs.create_queue(QueueName="{name}")["QueueUrl"],
                                MessageBody=""),
        }}
    """)
    assert got["send"] == ["AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist"]
    assert got["receive"] == ["AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist"]
    assert got["bad_name"] == ["InvalidParameterValue", "ClientError"]
    assert got["max_messages"] == ["InvalidParameterValue", "ClientError"]
    assert got["empty_body"] == ["MissingParameter", "ClientError"]


def test_signatures_with_an_api_key(keyed_server: Server) -> None:
    """With an API key, a Query request must be signed with it as the secret
    (any access key id); the signature covers the form."""
    name = new_name("signed")
    got = run_client(keyed_server.url, f"""
        url = sqs.create_queue(QueueName="{name}")["QueueUrl"]
        wrong = client(secret="not-the-key")
        unsigned = client(signed=False)
        presigned = sqs.generate_presigned_url("get_queue_url", Params={{"QueueName": "{name}"}}, HttpMethod="GET")
        result = {{"url": url, "listed": sqs.list_queues(QueueNamePrefix="{name}")["QueueUrls"],
                   "wrong": error(wrong.list_queues), "unsigned": error(unsigned.list_queues),
                   "wrong_send": error(wrong.send_message, QueueUrl=url, MessageBody="x"),
                   "presigned": presigned}}
    """, key="any-key-id", secret=API_KEY)
    assert got["listed"] == [got["url"]]
    assert got["wrong"] == ["SignatureDoesNotMatch", "ClientError"]
    assert got["wrong_send"] == ["SignatureDoesNotMatch", "ClientError"]
    assert got["unsigned"] == ["MissingAuthenticationToken", "ClientError"]
    assert vsqs.Spool(keyed_server.spool).queue(name).stats().total == 0
    # a presigned GET (the signature in the query string) works, and only for the form it was made for
    response = httpx.get(got["presigned"], timeout=30)
    assert xml_result(response, "GetQueueUrl").findtext(f"{NS}QueueUrl") == got["url"]
    tampered = got["presigned"].replace(f"QueueName={name}", "QueueName=other")
    assert xml_error(httpx.get(tampered, timeout=30))[:3] == (403, "Sender", "SignatureDoesNotMatch")


def test_a_body_xml_cannot_carry_arrives_with_digests_that_match(server: Server) -> None:
    """A body published by the library with characters XML 1.0 cannot carry is
    delivered with U+FFFD for each, and its MD5 is that of what is delivered
    (the client checks it: a mismatch fails the receive)."""
    name = new_name("control")
    queue = vsqs.Spool(server.spool).create_queue(name)
    queue.publish(b"a\x00b\x1bc\xef\xbf\xbe", attributes={"k": "v\x01"})
    got = run_client(server.url, f"""
        url = sqs.get_queue_url(QueueName="{name}")["QueueUrl"]
        result = plain(sqs.receive_message(QueueUrl=url, MessageAttributeNames=["All"])["Messages"])
    """)
    (message,) = got
    assert message["Body"] == "a\ufffdb\ufffdc\ufffd"
    assert message["MD5OfBody"] == hashlib.md5(message["Body"].encode()).hexdigest()
    assert message["MessageAttributes"]["k"]["StringValue"] == "v\ufffd"


def test_the_javascript_sdk_v2(server: Server) -> None:
    """The JavaScript SDK v2, a Query client of another hand: it checks the MD5
    of bodies it sends and receives itself."""
    name, fifo = new_name("js"), new_name("js") + ".fifo"
    body = "<b>&amp; ]]>\r\n😀"
    got = run_js(server.url, f"""
        const url = (await sqs.createQueue({{QueueName: "{name}", tags: {{team: "js"}}}}).promise()).QueueUrl;
        const sent = await sqs.sendMessage({{QueueUrl: url, MessageBody: {json.dumps(body)}, MessageAttributes: {{
            s: {{DataType: "String", StringValue: "<v>"}},
            b: {{DataType: "Binary", BinaryValue: Buffer.from([0, 1, 255])}}}}}}).promise();
        const batch = await sqs.sendMessageBatch({{QueueUrl: url, Entries: [{{Id: "one", MessageBody: "1"}},
                                                                          {{Id: "two", MessageBody: "2"}}]}}).promise();
        const received = (await sqs.receiveMessage({{
            QueueUrl: url, MaxNumberOfMessages: 10, VisibilityTimeout: 600, MessageAttributeNames: ["All"],
            AttributeNames: ["All"]}}).promise()).Messages;
        const first = received.find((m) => m.MessageId === sent.MessageId);
        await sqs.changeMessageVisibility({{QueueUrl: url, ReceiptHandle: first.ReceiptHandle,
                                           VisibilityTimeout: 900}}).promise();
        const entries = received.map((m, i) => ({{Id: "d" + i, ReceiptHandle: m.ReceiptHandle}}));
        const deleted = await sqs.deleteMessageBatch({{QueueUrl: url, Entries: entries}}).promise();
        const furl = (await sqs.createQueue({{QueueName: "{fifo}", Attributes: {{
            FifoQueue: "true", ContentBasedDeduplication: "true"}}}}).promise()).QueueUrl;
        const fsent = await sqs.sendMessage({{QueueUrl: furl, MessageBody: "f", MessageGroupId: "g"}}).promise();
        return {{url, body: first.Body, md5: first.MD5OfBody === sent.MD5OfMessageBody, count: received.length,
                 s: first.MessageAttributes.s.StringValue, b: [...first.MessageAttributes.b.BinaryValue],
                 batch: batch.Successful.map((e) => e.Id).sort(), deleted: deleted.Successful.length,
                 failed: deleted.Failed.length, sequence: fsent.SequenceNumber,
                 tags: (await sqs.listQueueTags({{QueueUrl: url}}).promise()).Tags,
                 missing: await error(sqs.getQueueUrl({{QueueName: "no-such-queue"}})),
                 empty: await error(sqs.sendMessage({{QueueUrl: url, MessageBody: ""}})),
                 gone: await error(sqs.receiveMessage({{QueueUrl: url + "-gone"}}))}};
    """)
    assert got["url"] == f"{server.url}/000000000000/{name}"
    assert got["body"] == body and got["md5"] is True and got["count"] == 3
    assert got["s"] == "<v>" and got["b"] == [0, 1, 255]
    assert got["batch"] == ["one", "two"] and (got["deleted"], got["failed"]) == (3, 0)
    assert got["sequence"] and got["tags"] == {"team": "js"}
    assert got["missing"] == got["gone"] == "AWS.SimpleQueueService.NonExistentQueue"
    assert got["empty"] == "MissingParameter"
    assert vsqs.Spool(server.spool).queue(name).stats().total == 0


# -- raw HTTP: what the protocol allows and no client sends ---------------------


def test_get_requests_and_requests_to_a_queue_url(server: Server) -> None:
    name = new_name("paths")
    created = xml_result(post(server, {"Action": "CreateQueue", "QueueName": name, "Version": "2012-11-05"}),
                         "CreateQueue")
    url = created.findtext(f"{NS}QueueUrl")
    assert url == f"{server.url}/000000000000/{name}"
    found = httpx.get(server.url + "/", params={"Action": "GetQueueUrl", "QueueName": name}, timeout=30)
    assert xml_result(found, "GetQueueUrl").findtext(f"{NS}QueueUrl") == url
    # the Java SDK v1 sends a queue's actions to the queue's URL, without a QueueUrl; boto 2 with one
    sent = post(server, {"Action": "SendMessage", "MessageBody": "to the path"}, path=f"/000000000000/{name}")
    assert xml_result(sent, "SendMessage").findtext(f"{NS}MessageId")
    got = httpx.get(f"{url}?Action=ReceiveMessage&QueueUrl={url}", headers=SIGNED_IN_HEADERS, timeout=30)
    assert xml_result(got, "ReceiveMessage").findtext(f"{NS}Message/{NS}Body") == "to the path"
    # a path that is no queue URL, or a request that is neither protocol: as without the Query routes
    assert httpx.get(server.url + "/").status_code == 405
    assert httpx.post(server.url + "/x/y", content=b"{}").status_code == 404


def test_a_get_a_page_could_make_a_browser_send_changes_nothing_without_keys(server: Server) -> None:
    """With no keys, a GET that changes the spool must be signed in its headers:
    any page can make a browser send a GET (a link, an image), and a browser
    too old for Sec-Fetch-Site, or a link opened from another application
    (Sec-Fetch-Site: none), passes the browser guard. A presigned-looking
    query proves nothing (no signature is checked); a GET that only reads,
    a POST, or a GET signed in its headers are taken."""
    name = new_name("csrf")
    post(server, {"Action": "CreateQueue", "QueueName": name})
    post(server, {"Action": "SendMessage", "QueueUrl": name, "MessageBody": "kept"})
    fake_presigned = ("&X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKID%2F20260101%2Fus-east-1%2Fsqs"
                      "%2Faws4_request&X-Amz-Date=20260101T000000Z&X-Amz-Expires=300&X-Amz-SignedHeaders=host"
                      "&X-Amz-Signature=" + "0" * 64)
    for query, headers in [(f"Action=PurgeQueue&QueueUrl={name}", {}),
                           (f"Action=DeleteQueue&QueueUrl={name}", {"Sec-Fetch-Site": "none"}),
                           (f"Action=SendMessage&QueueUrl={name}&MessageBody=forged", {}),
                           (f"Action=ReceiveMessage&QueueUrl={name}&VisibilityTimeout=600", {}),
                           (f"Action=PurgeQueue&QueueUrl={name}" + fake_presigned, {}),
                           (f"Action=DeleteQueue&QueueUrl={name}", {"Authorization": "Basic dXNlcjpwYXNz"})]:
        refused = httpx.get(f"{server.url}/?{query}", headers=headers, timeout=30)
        assert xml_error(refused)[:3] == (403, "Sender", "AccessDenied"), query
    queue = vsqs.Spool(server.spool).queue(name)
    assert (queue.stats().total, queue.stats().ready) == (1, 1)  # nothing deleted, sent, purged or hidden
    read = httpx.get(f"{server.url}/?Action=GetQueueAttributes&QueueUrl={name}&AttributeName.1=All", timeout=30)
    assert xml_result(read, "GetQueueAttributes").findtext(f"{NS}Attribute/{NS}Name")
    signed = httpx.get(f"{server.url}/?Action=PurgeQueue&QueueUrl={name}", headers=SIGNED_IN_HEADERS, timeout=30)
    assert signed.status_code == 200 and ET.fromstring(signed.content).tag == f"{NS}PurgeQueueResponse"
    assert queue.stats().total == 0


def test_unindexed_names_of_older_clients(server: Server) -> None:
    name = new_name("old")
    post(server, {"Action": "CreateQueue", "QueueName": name})
    answer = post(server, {"Action": "SetQueueAttributes", "QueueUrl": name, "Attribute.Name": "DelaySeconds",
                           "Attribute.Value": "4"})
    assert answer.status_code == 200, answer.text
    result = xml_result(post(server, {"Action": "GetQueueAttributes", "QueueUrl": name,
                                      "AttributeName": "DelaySeconds"}), "GetQueueAttributes")
    assert result.findtext(f"{NS}Attribute/{NS}Name") == "DelaySeconds"
    assert result.findtext(f"{NS}Attribute/{NS}Value") == "4"


def test_hostile_forms_are_refused_at_bounded_cost(server: Server) -> None:
    name = new_name("hostile")
    post(server, {"Action": "CreateQueue", "QueueName": name})
    base = f"Action=SendMessageBatch&QueueUrl={name}&".encode()
    huge_index = post(server, base + b"SendMessageBatchRequestEntry.99999999.Id=a"
                      b"&SendMessageBatchRequestEntry.99999999.MessageBody=x")
    assert xml_error(huge_index)[:3] == (400, "Sender", "InvalidParameterValue")
    leading_zero = post(server, base + b"SendMessageBatchRequestEntry.01.Id=a")
    assert xml_error(leading_zero)[2] == "InvalidParameterValue"
    many = post(server, b"Action=ListQueues&" + b"&".join(b"x%d=1" % i for i in range(5000)))
    assert xml_error(many)[:3] == (413, "Sender", "InvalidParameterValue")
    twice = post(server, f"Action=SendMessage&QueueUrl={name}&MessageBody=a&MessageBody=b".encode())
    assert "more than once" in xml_error(twice)[3]
    same_item = post(server, f"Action=GetQueueAttributes&QueueUrl={name}&AttributeName=All"
                             f"&AttributeName.1=QueueArn".encode())
    assert xml_error(same_item)[2] == "InvalidParameterValue"
    same_key = post(server, f"Action=SetQueueAttributes&QueueUrl={name}&Attribute.1.Name=DelaySeconds"
                            f"&Attribute.1.Value=1&Attribute.2.Name=DelaySeconds&Attribute.2.Value=2".encode())
    assert xml_error(same_key)[2] == "InvalidParameterValue"
    not_utf8 = post(server, f"Action=SendMessage&QueueUrl={name}&MessageBody=%FF%FE".encode())
    assert xml_error(not_utf8)[2] == "InvalidMessageContents"
    control = post(server, f"Action=SendMessage&QueueUrl={name}&MessageBody=a%00b".encode())
    assert xml_error(control)[2] == "InvalidMessageContents"
    not_a_number = post(server, f"Action=ReceiveMessage&QueueUrl={name}&MaxNumberOfMessages=1e3".encode())
    assert xml_error(not_a_number)[2] == "InvalidParameterValue"
    unknown = post(server, b"Action=FlyToTheMoon")
    assert xml_error(unknown)[:3] == (400, "Sender", "InvalidAction")
    assert xml_error(post(server, b"Version=2012-11-05"))[2] == "MissingAction"
    assert vsqs.Spool(server.spool).queue(name).stats().total == 0


def test_size_caps(server: Server) -> None:
    name = new_name("sizes")
    post(server, {"Action": "CreateQueue", "QueueName": name})
    over_the_face = post(server, f"Action=SendMessage&QueueUrl={name}&MessageBody=".encode() + b"x" * (4 << 20))
    assert xml_error(over_the_face)[:3] == (413, "Sender", "InvalidParameterValue")
    # an action that carries no message takes a small form
    small_cap = post(server, f"Action=TagQueue&QueueUrl={name}&Tag.1.Key=k&Tag.1.Value=".encode() + b"v" * 200_000)
    assert xml_error(small_cap)[:3] == (413, "Sender", "InvalidParameterValue")
    too_large = post(server, f"Action=SendMessage&QueueUrl={name}&MessageBody=".encode() + b"x" * (1024 * 1024 + 1))
    assert xml_error(too_large)[2] == "InvalidParameterValue"
    assert vsqs.Spool(server.spool).queue(name).stats().total == 0


def test_refusals_before_the_endpoint_are_in_xml(server: Server) -> None:
    """The browser guard's answers to a Query request are Query errors."""
    other_origin = httpx.post(server.url + "/", content=b"Action=ListQueues",
                              headers={**FORM, "Origin": "http://elsewhere.example"})
    assert xml_error(other_origin)[:3] == (403, "Sender", "AccessDenied")
    cross_site = httpx.get(server.url + "/?Action=ListQueues", headers={"Sec-Fetch-Site": "cross-site"})
    assert xml_error(cross_site)[:3] == (403, "Sender", "AccessDenied")


def test_a_form_without_its_content_type_is_told_what_is_missing(server: Server) -> None:
    response = httpx.post(server.url, content=b"Action=ListQueues&Version=2012-11-05")
    assert response.status_code == 400 and "x-www-form-urlencoded" in response.json()["message"]


def test_answers_escape_what_xml_would_read_as_markup(server: Server) -> None:
    name = new_name("escape")
    post(server, {"Action": "CreateQueue", "QueueName": name})
    body = "]]><x>&amp;</x>\r"
    post(server, {"Action": "SendMessage", "QueueUrl": name, "MessageBody": body})
    answer = post(server, {"Action": "ReceiveMessage", "QueueUrl": name})
    assert b"<x>" not in answer.content and b"]]>" not in answer.content and b"\r" not in answer.content
    assert xml_result(answer, "ReceiveMessage").findtext(f"{NS}Message/{NS}Body") == body


# -- Amazon's answers at a queue's URL, in its words, in JSON when asked ---------


def test_a_queue_that_is_not_there_in_the_query_protocols_words(server: Server) -> None:
    gone = post(server, {"Action": "GetQueueAttributes", "QueueUrl": f"{server.url}/000000000000/never-made",
                         "AttributeName.1": "All"})
    assert xml_error(gone) == (400, "Sender", "AWS.SimpleQueueService.NonExistentQueue",
                               "The specified queue does not exist for this wsdl version.")
    unknown = httpx.get(server.url + "/", params={"Action": "FooBar", "Version": "2012-11-05"}, timeout=30)
    assert xml_error(unknown) == (400, "Sender", "InvalidAction", "The action FooBar is not valid for this endpoint.")


def test_queueless_actions_at_a_queue_url_are_invalid_actions(server: Server) -> None:
    name = new_name("queueless")
    xml_result(post(server, {"Action": "CreateQueue", "QueueName": name}), "CreateQueue")
    for action, extra in (("CreateQueue", {"QueueName": new_name("other")}), ("ListQueues", {})):
        answer = httpx.get(f"{server.url}/000000000000/{name}", params={"Action": action, **extra},
                           headers=SIGNED_IN_HEADERS, timeout=30)
        assert xml_error(answer) == (400, "Sender", "InvalidAction",
                                     f"The action {action} is not valid for this endpoint.")
    assert len(vsqs.Spool(server.spool).queues()) == len(set(vsqs.Spool(server.spool).queues()))
    found = httpx.get(f"{server.url}/000000000000/{name}", params={"Action": "GetQueueUrl", "QueueName": name},
                      timeout=30)
    assert xml_result(found, "GetQueueUrl").findtext(f"{NS}QueueUrl") == f"{server.url}/000000000000/{name}"


def test_a_get_of_a_queue_url_naming_no_action_is_an_unknown_operation(server: Server) -> None:
    name = new_name("bare")
    xml_result(post(server, {"Action": "CreateQueue", "QueueName": name}), "CreateQueue")
    for headers in ({}, {"Accept": "application/json"}):
        answer = httpx.get(f"{server.url}/000000000000/{name}", headers=headers, timeout=30)
        assert answer.status_code == 404 and answer.headers["content-type"].startswith("text/xml")
        assert ET.fromstring(answer.content).tag == "UnknownOperationException"


def test_a_query_request_that_accepts_json_is_answered_in_json(server: Server) -> None:
    name = new_name("json")
    url = xml_result(post(server, {"Action": "CreateQueue", "QueueName": name}), "CreateQueue").findtext(
        f"{NS}QueueUrl")
    accept = {"Accept": "application/json"}
    answer = httpx.get(url, params={"Action": "GetQueueAttributes", "AttributeName.1": "All"}, headers=accept,
                       timeout=30)
    assert answer.status_code == 200 and answer.headers["content-type"].startswith("application/json")
    document = answer.json()["GetQueueAttributesResponse"]
    assert document["ResponseMetadata"]["RequestId"]
    attributes = {a["Name"]: a["Value"] for a in document["GetQueueAttributesResult"]["Attributes"]}
    assert attributes["QueueArn"].endswith(f":{name}") and attributes["VisibilityTimeout"] == "30"
    refused = httpx.get(url, params={"Action": "ListQueues"}, headers={**accept, **SIGNED_IN_HEADERS}, timeout=30)
    assert refused.status_code == 400
    assert refused.json()["Error"] == {"Type": "Sender", "Code": "InvalidAction",
                                       "Message": "The action ListQueues is not valid for this endpoint."}
    sent = httpx.post(url, data={"Action": "SendMessage", "MessageBody": "hello"}, headers={**FORM, **accept},
                      timeout=30).json()["SendMessageResponse"]["SendMessageResult"]
    assert sent["MD5OfMessageBody"] == hashlib.md5(b"hello").hexdigest() and sent["MessageId"]


def test_a_json_request_to_a_queue_url_is_served(server: Server) -> None:
    """The PHP SDK sends its JSON 1.0 requests to the queue's URL."""
    name = new_name("jsonpath")
    url = xml_result(post(server, {"Action": "CreateQueue", "QueueName": name}), "CreateQueue").findtext(
        f"{NS}QueueUrl")
    headers = {"Content-Type": "application/x-amz-json-1.0", "X-Amz-Target": "AmazonSQS.SendMessage"}
    sent = httpx.post(url, content=json.dumps({"QueueUrl": url, "MessageBody": "php"}), headers=headers, timeout=30)
    assert sent.status_code == 200 and sent.json()["MD5OfMessageBody"] == hashlib.md5(b"php").hexdigest()
    headers["X-Amz-Target"] = "AmazonSQS.ReceiveMessage"
    got = httpx.post(url, content=json.dumps({"QueueUrl": url}), headers=headers, timeout=30).json()
    assert [m["Body"] for m in got["Messages"]] == ["php"]
