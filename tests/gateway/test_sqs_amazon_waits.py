"""Amazon's two 60-second rules on the SQS face, off by default:
``--sqs-recently-deleted SECONDS`` (CreateQueue of a name deleted less than
SECONDS ago: ``QueueDeletedRecently``) and ``--sqs-purge-interval SECONDS``
(a PurgeQueue less than SECONDS after the queue's last purge:
``PurgeQueueInProgress``), against real gateways on loopback with boto3
(JSON) and raw Query requests.

The gateways share one spool: two with the rules at Amazon's 60 s (what one
records, the other applies; a refusal never depends on how fast a request
is answered, 60 s being far longer than any test step), one with 1 s (the
tests wait past it, then the create or purge goes through), one with the
rules off."""

from __future__ import annotations

import time
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from typing import Any

import boto3
import botocore.config
import httpx
import pytest
from botocore.exceptions import ClientError

import vsqs
from tests.gateway.server import Server, running_gateway

REGION = "us-east-1"
NS = "{http://queue.amazonaws.com/doc/2012-11-05/}"
AMAZON = ("--sqs-recently-deleted", "60", "--sqs-purge-interval", "60")
SHORT = ("--sqs-recently-deleted", "1", "--sqs-purge-interval", "1")
DELETED_TEXT = "You must wait 60 seconds after deleting a queue before you can create another with the same name."


class Gateways:
    def __init__(self, spool: str, amazon: Server, other: Server, short: Server, off: Server) -> None:
        self.spool, self.amazon, self.other, self.short, self.off = spool, amazon, other, short, off


@pytest.fixture(scope="module")
def gateways(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateways]:
    spool = tmp_path_factory.mktemp("sqs-waits") / "spool"
    spool.mkdir()
    logs = str(tmp_path_factory.mktemp("sqs-waits-logs"))
    with running_gateway(str(spool), *AMAZON, log_dir=logs) as amazon, \
            running_gateway(str(spool), *AMAZON, log_dir=logs) as other, \
            running_gateway(str(spool), *SHORT, log_dir=logs) as short, \
            running_gateway(str(spool), log_dir=logs) as off:
        yield Gateways(str(spool), amazon, other, short, off)
        for running in (amazon, other, short, off):
            assert "Traceback" not in running.log(), running.log()


def client(server: Server) -> Any:
    return boto3.client("sqs", endpoint_url=server.url, region_name=REGION, aws_access_key_id="k",
                        aws_secret_access_key="s", config=botocore.config.Config(retries={"max_attempts": 1}))


def new_name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def refused(call: Any, **kwargs: Any) -> dict[str, Any]:
    with pytest.raises(ClientError) as caught:
        call(**kwargs)
    return caught.value.response


def query(server: Server, form: dict[str, str]) -> tuple[int, str, str, str]:
    """(status, Type, Code, Message) of a Query request that must fail."""
    response = httpx.post(server.url + "/", data={**form, "Version": "2012-11-05"}, timeout=30)
    assert response.headers["content-type"].startswith("text/xml"), response.text
    error = ET.fromstring(response.content).find(f"{NS}Error")
    assert error is not None, response.text
    return (response.status_code, error.findtext(f"{NS}Type") or "", error.findtext(f"{NS}Code") or "",
            error.findtext(f"{NS}Message") or "")


def wait_past(moment: float, seconds: float) -> None:
    """Sleep until ``seconds`` after ``moment`` (epoch) have gone by, and a little more."""
    time.sleep(max(0.0, moment + seconds + 0.2 - time.time()))


# -- CreateQueue after DeleteQueue --------------------------------------------------


def test_create_queue_of_a_name_just_deleted_is_queue_deleted_recently(gateways: Gateways) -> None:
    sqs, other = client(gateways.amazon), client(gateways.other)
    name = new_name("deleted")
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    sqs.delete_queue(QueueUrl=url)
    for gateway in (sqs, other):  # the record is in the spool: every gateway on it applies it
        answer = refused(gateway.create_queue, QueueName=name)
        assert answer["ResponseMetadata"]["HTTPStatusCode"] == 400
        assert answer["Error"]["Code"] == "AWS.SimpleQueueService.QueueDeletedRecently"
        assert answer["Error"]["QueryErrorCode"] == "QueueDeletedRecently"
        assert answer["Error"]["Type"] == "Sender" and answer["Error"]["Message"] == DELETED_TEXT
    with pytest.raises(sqs.exceptions.QueueDeletedRecently):
        sqs.create_queue(QueueName=name)
    assert name not in vsqs.Spool(gateways.spool).queues()  # nothing was made


def test_the_query_protocol_answers_queue_deleted_recently_in_xml(gateways: Gateways) -> None:
    name = new_name("deleted-query")
    sqs = client(gateways.amazon)
    sqs.delete_queue(QueueUrl=sqs.create_queue(QueueName=name)["QueueUrl"])
    assert query(gateways.other, {"Action": "CreateQueue", "QueueName": name}) == (
        400, "Sender", "AWS.SimpleQueueService.QueueDeletedRecently", DELETED_TEXT)


def test_a_deletion_through_the_library_counts_and_a_refusal_leaves_the_record_as_it_was(
        gateways: Gateways) -> None:
    spool = vsqs.Spool(gateways.spool)
    name = new_name("library")
    spool.create_queue(name)
    spool.delete_queue(name)
    deleted = spool.deleted_at(name)
    refused(client(gateways.amazon).create_queue, QueueName=name)
    assert spool.deleted_at(name) == deleted  # the wait runs from the deletion, not from the refusal


def test_create_queue_of_an_existing_queue_is_not_refused(gateways: Gateways) -> None:
    spool = vsqs.Spool(gateways.spool)
    name = new_name("existing")
    spool.create_queue(name)
    spool.delete_queue(name)
    spool.create_queue(name)  # made again at once through the library, which keeps no such rule
    assert spool.deleted_at(name) is not None
    url = client(gateways.amazon).create_queue(QueueName=name)["QueueUrl"]  # idempotent: the queue is there
    assert url.endswith(f"/{name}")


def test_create_queue_goes_through_once_the_wait_is_over(gateways: Gateways) -> None:
    sqs = client(gateways.short)
    name = new_name("later")
    sqs.delete_queue(QueueUrl=sqs.create_queue(QueueName=name)["QueueUrl"])
    deleted = vsqs.Spool(gateways.spool).deleted_at(name)
    assert deleted is not None
    wait_past(deleted, 1)
    assert sqs.create_queue(QueueName=name)["QueueUrl"].endswith(f"/{name}")
    assert name in vsqs.Spool(gateways.spool).queues()


def test_without_the_option_a_deleted_name_is_made_again_at_once(gateways: Gateways) -> None:
    sqs = client(gateways.off)
    name = new_name("off")
    sqs.delete_queue(QueueUrl=sqs.create_queue(QueueName=name)["QueueUrl"])
    assert vsqs.Spool(gateways.spool).deleted_at(name) is not None  # recorded, and not consulted
    assert sqs.create_queue(QueueName=name)["QueueUrl"].endswith(f"/{name}")


# -- PurgeQueue after PurgeQueue --------------------------------------------------------


def test_a_second_purge_within_the_interval_is_purge_queue_in_progress_and_purges_nothing(
        gateways: Gateways) -> None:
    sqs, other = client(gateways.amazon), client(gateways.other)
    name = new_name("purged")
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="before")
    sqs.purge_queue(QueueUrl=url)
    sqs.send_message(QueueUrl=url, MessageBody="after")
    for gateway in (sqs, other):
        answer = refused(gateway.purge_queue, QueueUrl=url)
        assert answer["ResponseMetadata"]["HTTPStatusCode"] == 403
        assert answer["Error"]["Code"] == "AWS.SimpleQueueService.PurgeQueueInProgress"
        assert answer["Error"]["QueryErrorCode"] == "PurgeQueueInProgress"
        assert answer["Error"]["Type"] == "Sender"
        assert answer["Error"]["Message"] == f"Only one PurgeQueue operation on {name} is allowed every 60 seconds."
    with pytest.raises(sqs.exceptions.PurgeQueueInProgress):
        sqs.purge_queue(QueueUrl=url)
    assert [m["Body"] for m in sqs.receive_message(QueueUrl=url).get("Messages", [])] == ["after"]


def test_the_query_protocol_answers_purge_queue_in_progress_in_xml(gateways: Gateways) -> None:
    sqs = client(gateways.amazon)
    name = new_name("purged-query")
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    sqs.purge_queue(QueueUrl=url)
    assert query(gateways.other, {"Action": "PurgeQueue", "QueueUrl": url}) == (
        403, "Sender", "AWS.SimpleQueueService.PurgeQueueInProgress",
        f"Only one PurgeQueue operation on {name} is allowed every 60 seconds.")


def test_a_purge_through_the_library_counts(gateways: Gateways) -> None:
    name = new_name("library-purge")
    queue = vsqs.Spool(gateways.spool).create_queue(name)
    queue.purge()
    sqs = client(gateways.amazon)
    url = sqs.get_queue_url(QueueName=name)["QueueUrl"]
    assert refused(sqs.purge_queue, QueueUrl=url)["Error"]["QueryErrorCode"] == "PurgeQueueInProgress"


def test_purge_of_a_missing_queue_is_still_queue_does_not_exist(gateways: Gateways) -> None:
    sqs = client(gateways.amazon)
    name = new_name("missing")
    sqs.delete_queue(QueueUrl=sqs.create_queue(QueueName=name)["QueueUrl"])
    answer = refused(sqs.purge_queue, QueueUrl=f"{gateways.amazon.url}/000000000000/{name}")
    assert answer["Error"]["QueryErrorCode"] == "QueueDoesNotExist"
    assert vsqs.Spool(gateways.spool).deleted_at(name) is not None


def test_a_purge_goes_through_once_the_interval_is_over(gateways: Gateways) -> None:
    sqs = client(gateways.short)
    name = new_name("purge-later")
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    sqs.purge_queue(QueueUrl=url)
    purged = vsqs.Spool(gateways.spool).queue(name).purged_at
    assert purged is not None
    sqs.send_message(QueueUrl=url, MessageBody="x")
    wait_past(purged, 1)
    sqs.purge_queue(QueueUrl=url)
    assert vsqs.Spool(gateways.spool).queue(name).stats().ready == 0
    later = vsqs.Spool(gateways.spool).queue(name).purged_at
    assert later is not None and later > purged


def test_without_the_option_a_purge_may_follow_at_once(gateways: Gateways) -> None:
    sqs = client(gateways.off)
    name = new_name("purge-off")
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    sqs.purge_queue(QueueUrl=url)
    assert vsqs.Spool(gateways.spool).queue(name).purged_at is not None  # recorded, and not consulted
    sqs.send_message(QueueUrl=url, MessageBody="x")
    sqs.purge_queue(QueueUrl=url)
    assert vsqs.Spool(gateways.spool).queue(name).stats().ready == 0
