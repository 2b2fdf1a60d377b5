"""The SQS management actions of `vsqs serve`: tags, Policy and permissions,
encryption attributes, dead-letter sources and message move tasks; boto3 and
the aws CLI against two real gateways on one spool (what one sets, the other
sees)."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import botocore.config
import pytest
from botocore.exceptions import ClientError

import vsqs
from tests.gateway.server import Server, running_gateway

REGION = "us-east-1"
AWS_CLI = str(Path(sys.executable).with_name("aws"))


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Server]]:
    """Two gateway processes serving one spool."""
    spool = tmp_path_factory.mktemp("sqs-mgmt") / "spool"
    spool.mkdir()
    logs = tmp_path_factory.mktemp("sqs-mgmt-logs")
    with running_gateway(str(spool), log_dir=str(logs)) as one, running_gateway(str(spool), log_dir=str(logs)) as two:
        yield one, two
        for running in (one, two):
            assert "Traceback" not in running.log(), running.log()


def seen(read: Any, expected: Any) -> None:
    """``read()`` comes to equal ``expected``: another gateway process re-reads
    a queue's settings at most a second after they change (as every vsqs handle does)."""
    wait_for(lambda: read() == expected)


def client(server: Server) -> Any:
    return boto3.client("sqs", endpoint_url=server.url, region_name=REGION, aws_access_key_id="k",
                        aws_secret_access_key="s", config=botocore.config.Config(retries={"max_attempts": 1}))


@pytest.fixture(scope="module")
def sqs(servers: tuple[Server, Server]) -> Any:
    return client(servers[0])


@pytest.fixture(scope="module")
def other(servers: tuple[Server, Server]) -> Any:
    return client(servers[1])


def new_name(prefix: str = "q") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def code_of(caught: pytest.ExceptionInfo[ClientError]) -> str:
    return str(caught.value.response["Error"]["Code"])


def arn_of(sqs: Any, url: str) -> str:
    return str(sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"])


def run_aws(server: Server, *args: str) -> Any:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_ACCESS_KEY_ID="k", AWS_SECRET_ACCESS_KEY="s", AWS_DEFAULT_REGION=REGION,
               AWS_CONFIG_FILE="/dev/null", AWS_SHARED_CREDENTIALS_FILE="/dev/null", AWS_PAGER="")
    done = subprocess.run([sys.executable, AWS_CLI, "sqs", *args, "--endpoint-url", server.url, "--output", "json"],
                          capture_output=True, timeout=60, env=env, text=True, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout) if done.stdout.strip() else None


def wait_for(predicate: Any, timeout: float = 120.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        found = predicate()
        if found:
            return found
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.1)


# -- the settings of the SQS face ------------------------------------------------------


def test_each_setting_is_set_by_a_queue_attribute_or_by_none_on_purpose() -> None:
    """A new setting needs a decision here: which attribute sets it, or none."""
    from vsqs._core.settings import SCHEMA
    from vsqs._gateway.sqs.attributes import ATTRIBUTE_OF_SETTING, NO_ATTRIBUTE

    assert not set(ATTRIBUTE_OF_SETTING) & NO_ATTRIBUTE
    assert sorted(set(ATTRIBUTE_OF_SETTING) | NO_ATTRIBUTE) == sorted(SCHEMA)
    kept = {name for name, setting in SCHEMA.items() if not setting.obeyed}
    assert kept <= set(ATTRIBUTE_OF_SETTING) | {"tags"}  # kept for the SQS face: it sets them (TagQueue the tags)


@pytest.mark.parametrize("attribute, first, second", [
    ("KmsMasterKeyId", "alias/a", "alias/b"),
    ("Policy", '{"Version": "2012-10-17"}', '{"Version": "2008-10-17"}'),
    ("MessageRetentionPeriod", "600", "601"),
])
def test_a_queue_made_again_with_another_attribute_is_told_which(sqs: Any, attribute: str, first: str,
                                                                 second: str) -> None:
    name = new_name("again")
    sqs.create_queue(QueueName=name, Attributes={attribute: first})
    with pytest.raises(ClientError) as caught:
        sqs.create_queue(QueueName=name, Attributes={attribute: second})
    assert code_of(caught) in ("QueueAlreadyExists", "QueueNameExists")
    assert caught.value.response["Error"]["Message"].endswith(f"a different value for attribute {attribute}")


# -- tags -------------------------------------------------------------------------


def test_tags_are_kept_with_the_queue(sqs: Any, other: Any, servers: tuple[Server, Server]) -> None:
    name = new_name("tags")
    url = sqs.create_queue(QueueName=name, tags={"team": "a"})["QueueUrl"]
    assert other.list_queue_tags(QueueUrl=url)["Tags"] == {"team": "a"}
    sqs.tag_queue(QueueUrl=url, Tags={"env": "ci", "team": "b"})
    seen(lambda: other.list_queue_tags(QueueUrl=url)["Tags"], {"env": "ci", "team": "b"})
    other.untag_queue(QueueUrl=url, TagKeys=["team", "absent"])  # edits the newest version, not its cache
    seen(lambda: sqs.list_queue_tags(QueueUrl=url)["Tags"], {"env": "ci"})
    assert vsqs.Spool(servers[0].spool).queue(name).settings["tags"] == {"env": "ci"}
    sqs.untag_queue(QueueUrl=url, TagKeys=["env"])
    assert "Tags" not in sqs.list_queue_tags(QueueUrl=url)
    wait_for(lambda: run_aws(servers[1], "list-queue-tags", "--queue-url", url) in (None, {}))


def test_tag_limits_are_amazons(sqs: Any) -> None:
    url = sqs.create_queue(QueueName=new_name("tags"))["QueueUrl"]
    sqs.tag_queue(QueueUrl=url, Tags={f"k{n}": "v" * 256 for n in range(50)})
    for tags in ({"one-too-many": "x"}, {"k" * 129: "x"}, {"k": "v" * 257}):
        with pytest.raises(ClientError) as caught:
            sqs.tag_queue(QueueUrl=url, Tags=tags)
        assert code_of(caught) == "InvalidParameterValue"
    assert len(sqs.list_queue_tags(QueueUrl=url)["Tags"]) == 50
    with pytest.raises(ClientError) as caught:
        sqs.create_queue(QueueName=new_name("tags"), tags={f"k{n}": "" for n in range(51)})
    assert code_of(caught) == "InvalidParameterValue"
    with pytest.raises(ClientError) as caught:
        sqs.list_queue_tags(QueueUrl=url.rsplit("/", 1)[0] + "/no-such-queue")
    assert code_of(caught) in ("AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist")


# -- Policy and permissions --------------------------------------------------------


def test_policy_is_stored_and_returned(sqs: Any, other: Any) -> None:
    policy = json.dumps({"Version": "2012-10-17", "Statement": []})
    url = sqs.create_queue(QueueName=new_name("policy"), Attributes={"Policy": policy})["QueueUrl"]
    assert other.get_queue_attributes(QueueUrl=url, AttributeNames=["Policy"])["Attributes"]["Policy"] == policy
    for bad in ("not json", "[1]", json.dumps({"x": "y" * 21000})):
        with pytest.raises(ClientError) as caught:
            sqs.set_queue_attributes(QueueUrl=url, Attributes={"Policy": bad})
        assert code_of(caught) == "InvalidAttributeValue"
    sqs.set_queue_attributes(QueueUrl=url, Attributes={"Policy": ""})
    assert "Policy" not in sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"]).get("Attributes", {})


def test_add_and_remove_permission_edit_the_policy(sqs: Any, other: Any) -> None:
    url = sqs.create_queue(QueueName=new_name("perm"))["QueueUrl"]
    sqs.add_permission(QueueUrl=url, Label="senders", AWSAccountIds=["111122223333"], Actions=["SendMessage"])
    other.add_permission(QueueUrl=url, Label="all", AWSAccountIds=["444455556666"], Actions=["*"])

    def policy_of(client: Any) -> Any:
        attributes = client.get_queue_attributes(QueueUrl=url, AttributeNames=["Policy"]).get("Attributes", {})
        return json.loads(attributes["Policy"]) if "Policy" in attributes else None

    policy = wait_for(lambda: (found := policy_of(sqs)) and len(found["Statement"]) == 2 and found)
    statements = {s["Sid"]: s for s in policy["Statement"]}
    assert set(statements) == {"senders", "all"}
    arn = arn_of(sqs, url)
    assert (policy["Version"], policy["Id"]) == ("2008-10-17", f"{arn}/SQSDefaultPolicy")  # Amazon's shape
    assert statements["senders"] == {"Sid": "senders", "Effect": "Allow", "Action": "SQS:SendMessage",
                                     "Principal": {"AWS": "arn:aws:iam::111122223333:root"}, "Resource": arn}
    sqs.add_permission(QueueUrl=url, Label="two", AWSAccountIds=["111122223333", "444455556666"],
                       Actions=["SendMessage", "ReceiveMessage"])
    two = wait_for(lambda: {s["Sid"]: s for s in policy_of(sqs)["Statement"]}.get("two"))
    assert two["Principal"] == {"AWS": ["arn:aws:iam::111122223333:root", "arn:aws:iam::444455556666:root"]}
    assert two["Action"] == ["SQS:SendMessage", "SQS:ReceiveMessage"]
    sqs.remove_permission(QueueUrl=url, Label="two")
    with pytest.raises(ClientError) as caught:
        sqs.add_permission(QueueUrl=url, Label="senders", AWSAccountIds=["1"], Actions=["SendMessage"])
    assert code_of(caught) == "InvalidParameterValue"
    with pytest.raises(ClientError) as caught:
        sqs.add_permission(QueueUrl=url, Label="x", AWSAccountIds=["1"], Actions=["DeleteQueue"])
    assert (code_of(caught), caught.value.response["Error"]["Message"]) == (
        "InvalidParameterValue", "Value SQS:DeleteQueue for parameter ActionName is invalid. Reason: Please refer to "
        "the appropriate WSDL for a list of valid actions. ")
    other.remove_permission(QueueUrl=url, Label="senders")
    wait_for(lambda: [s["Sid"] for s in policy_of(sqs)["Statement"]] == ["all"])
    with pytest.raises(ClientError) as caught:
        sqs.remove_permission(QueueUrl=url, Label="senders")
    assert code_of(caught) == "InvalidParameterValue"
    sqs.remove_permission(QueueUrl=url, Label="all")
    seen(lambda: policy_of(other), None)


# -- encryption attributes ---------------------------------------------------------


def test_encryption_attributes_are_accepted_stored_and_reported(sqs: Any, other: Any) -> None:
    url = sqs.create_queue(QueueName=new_name("sse"))["QueueUrl"]
    attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert attributes["SqsManagedSseEnabled"] == "true" and "KmsMasterKeyId" not in attributes
    sqs.set_queue_attributes(QueueUrl=url, Attributes={"KmsMasterKeyId": "alias/aws/sqs",
                                                       "KmsDataKeyReusePeriodSeconds": "600"})
    attributes = wait_for(lambda: (found := other.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])
                                   ["Attributes"]).get("KmsMasterKeyId") and found)
    assert attributes["KmsMasterKeyId"] == "alias/aws/sqs"
    assert attributes["KmsDataKeyReusePeriodSeconds"] == "600"
    assert attributes["SqsManagedSseEnabled"] == "false"
    sqs.set_queue_attributes(QueueUrl=url, Attributes={"KmsDataKeyReusePeriodSeconds": ""})  # "" unsets
    got = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["KmsDataKeyReusePeriodSeconds"])["Attributes"]
    assert got == {"KmsDataKeyReusePeriodSeconds": "300"}  # Amazon's default
    for bad in ({"KmsDataKeyReusePeriodSeconds": "59"}, {"KmsDataKeyReusePeriodSeconds": "86401"},
                {"SqsManagedSseEnabled": "maybe"}):
        with pytest.raises(ClientError) as caught:
            sqs.set_queue_attributes(QueueUrl=url, Attributes=bad)
        assert code_of(caught) == "InvalidAttributeValue"
    sqs.set_queue_attributes(QueueUrl=url, Attributes={"SqsManagedSseEnabled": "true"})
    attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert attributes["SqsManagedSseEnabled"] == "true" and "KmsMasterKeyId" not in attributes
    sqs.set_queue_attributes(QueueUrl=url, Attributes={"SqsManagedSseEnabled": "false"})
    got = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["SqsManagedSseEnabled"])["Attributes"]
    assert got == {"SqsManagedSseEnabled": "false"}


# -- dead-letter sources and move tasks --------------------------------------------


def with_dead_letters(sqs: Any, server: Server, count: int) -> tuple[str, str, vsqs.Queue, vsqs.Queue]:
    """A source queue whose RedrivePolicy names a new DLQ holding ``count`` of its messages."""
    dlq_name, source_name = new_name("dlq"), new_name("src")
    dlq_url = sqs.create_queue(QueueName=dlq_name)["QueueUrl"]
    policy = json.dumps({"deadLetterTargetArn": arn_of(sqs, dlq_url), "maxReceiveCount": 1})
    source_url = sqs.create_queue(QueueName=source_name, Attributes={"RedrivePolicy": policy,
                                                                     "VisibilityTimeout": "0"})["QueueUrl"]
    for n in range(0, count, 10):
        sqs.send_message_batch(QueueUrl=source_url, Entries=[{"Id": str(i), "MessageBody": f"m{n + i}"}
                                                              for i in range(min(10, count - n))])
    spool = vsqs.Spool(server.spool)
    source, dlq = spool.queue(source_name), spool.queue(dlq_name)
    while source.receive_batch(10):  # received once, then buried by the next receive
        pass
    assert dlq.stats().ready == count
    return source_url, dlq_url, source, dlq


def test_list_dead_letter_source_queues(sqs: Any, other: Any, servers: tuple[Server, Server]) -> None:
    dlq_url = sqs.create_queue(QueueName=new_name("dlq"))["QueueUrl"]
    policy = json.dumps({"deadLetterTargetArn": arn_of(sqs, dlq_url), "maxReceiveCount": 3})
    sources = sorted(sqs.create_queue(QueueName=new_name("src"), Attributes={"RedrivePolicy": policy})["QueueUrl"]
                     for _ in range(2))
    names = [url.rsplit("/", 1)[1] for url in sources]
    assert [url.rsplit("/", 1)[1] for url in other.list_dead_letter_source_queues(QueueUrl=dlq_url)["queueUrls"]] \
        == names
    first = sqs.list_dead_letter_source_queues(QueueUrl=dlq_url, MaxResults=1)
    assert first["queueUrls"] == sources[:1] and first["NextToken"]
    second = sqs.list_dead_letter_source_queues(QueueUrl=dlq_url, MaxResults=1, NextToken=first["NextToken"])
    assert second["queueUrls"] == sources[1:] and "NextToken" not in second
    assert run_aws(servers[0], "list-dead-letter-source-queues", "--queue-url", dlq_url)["queueUrls"] == sources
    sqs.set_queue_attributes(QueueUrl=sources[0], Attributes={"RedrivePolicy": ""})
    assert sqs.list_dead_letter_source_queues(QueueUrl=dlq_url)["queueUrls"] == sources[1:]
    assert sqs.list_dead_letter_source_queues(QueueUrl=sources[1])["queueUrls"] == []


def test_message_move_task_redrives_to_the_sources(sqs: Any, other: Any, servers: tuple[Server, Server]) -> None:
    source_url, dlq_url, source, dlq = with_dead_letters(sqs, servers[0], 12)
    dlq_arn = arn_of(sqs, dlq_url)
    handle = sqs.start_message_move_task(SourceArn=dlq_arn)["TaskHandle"]
    assert handle

    def completed() -> Any:
        results = other.list_message_move_tasks(SourceArn=dlq_arn)["Results"]
        return results if results[0]["Status"] == "COMPLETED" else None

    [task] = wait_for(completed)
    assert task["ApproximateNumberOfMessagesMoved"] == 12 and task["ApproximateNumberOfMessagesToMove"] == 12
    assert task["SourceArn"] == dlq_arn and task["StartedTimestamp"] > 0 and "TaskHandle" not in task
    assert source.stats().ready == 12 and dlq.stats().ready == 0
    with pytest.raises(ClientError) as caught:
        sqs.cancel_message_move_task(TaskHandle=handle)  # finished
    assert code_of(caught) == "ResourceNotFoundException"


def test_message_move_task_to_a_destination_at_a_rate_cancelled_from_another_gateway(
    sqs: Any, other: Any, servers: tuple[Server, Server]
) -> None:
    _, dlq_url, _, dlq = with_dead_letters(sqs, servers[0], 30)
    target_name = new_name("target")
    target_url = sqs.create_queue(QueueName=target_name)["QueueUrl"]
    dlq_arn, target_arn = arn_of(sqs, dlq_url), arn_of(sqs, target_url)
    handle = sqs.start_message_move_task(SourceArn=dlq_arn, DestinationArn=target_arn,
                                         MaxNumberOfMessagesPerSecond=1)["TaskHandle"]
    with pytest.raises(ClientError) as caught:
        other.start_message_move_task(SourceArn=dlq_arn)  # one active task per queue, across gateways
    assert caught.value.response["Error"] == {
        "Code": "InvalidParameterValue", "Type": "Sender", "QueryErrorCode": "InvalidParameterValueException",
        "Message": "There is already a task running. Only one active task is allowed for a source queue arn at a "
                   "given time."}
    [running] = other.list_message_move_tasks(SourceArn=dlq_arn, MaxResults=10)["Results"]
    assert running["Status"] == "RUNNING" and running["TaskHandle"] == handle
    assert running["DestinationArn"] == target_arn and running["MaxNumberOfMessagesPerSecond"] == 1
    moved = other.cancel_message_move_task(TaskHandle=handle)["ApproximateNumberOfMessagesMoved"]
    assert moved < 30

    def cancelled() -> Any:
        results = sqs.list_message_move_tasks(SourceArn=dlq_arn)["Results"]
        return results if results[0]["Status"] == "CANCELLED" else None

    [task] = wait_for(cancelled)
    assert task["ApproximateNumberOfMessagesMoved"] < 30
    target = vsqs.Spool(servers[0].spool).queue(target_name)
    assert target.stats().ready + dlq.stats().ready == 30


def test_message_move_task_errors(sqs: Any, servers: tuple[Server, Server]) -> None:
    """Amazon's codes, texts and statuses (a resource that is not there is a 404)."""
    plain_url = sqs.create_queue(QueueName=new_name("plain"))["QueueUrl"]
    plain_arn = arn_of(sqs, plain_url)
    missing_arn = plain_arn.rsplit(":", 1)[0] + ":no-such-queue"
    _, dlq_url, _, _ = with_dead_letters(sqs, servers[0], 1)
    dlq_arn = arn_of(sqs, dlq_url)

    def handle_of(task_id: str, source_arn: str) -> str:
        doc = json.dumps({"taskId": task_id, "sourceArn": source_arn}).encode()
        return base64.urlsafe_b64encode(doc).decode()

    def refusal(call: Any, **kwargs: Any) -> tuple[int, str, str]:
        with pytest.raises(ClientError) as caught:
            call(**kwargs)
        answer = caught.value.response
        return answer["ResponseMetadata"]["HTTPStatusCode"], answer["Error"]["Code"], answer["Error"]["Message"]

    no_source = (404, "ResourceNotFoundException",
                 "The resource that you specified for the SourceArn parameter doesn't exist.")
    assert refusal(sqs.start_message_move_task, SourceArn=plain_arn) == (
        400, "InvalidParameterValue", "Source queue must be configured as a Dead Letter Queue.")
    assert refusal(sqs.start_message_move_task, SourceArn=missing_arn) == no_source
    assert refusal(sqs.list_message_move_tasks, SourceArn=missing_arn) == no_source
    assert refusal(sqs.start_message_move_task, SourceArn=dlq_arn, DestinationArn=missing_arn) == (
        404, "ResourceNotFoundException", "The resource that you specified for the DestinationArn parameter "
        "doesn't exist.")
    assert refusal(sqs.cancel_message_move_task, TaskHandle=handle_of("1-2", missing_arn)) == no_source
    assert refusal(sqs.cancel_message_move_task, TaskHandle=handle_of("1-2", dlq_arn)) == (
        404, "ResourceNotFoundException", "Task does not exist.")
    for garbage in ("garbage", handle_of("1-2", "not-an-arn")):
        assert refusal(sqs.cancel_message_move_task, TaskHandle=garbage) == (
            400, "InvalidParameterValue", "Value for parameter TaskHandle is invalid.")
    with pytest.raises(ClientError) as caught:
        sqs.start_message_move_task(SourceArn="not-an-arn")
    assert code_of(caught) == "InvalidParameterValue"
    assert sqs.list_message_move_tasks(SourceArn=plain_arn)["Results"] == []
    listed = run_aws(servers[0], "list-message-move-tasks", "--source-arn", plain_arn)
    assert listed["Results"] == []
