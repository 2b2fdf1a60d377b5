"""The SQS face's regions: `vsqs serve --region-spool REGION=DIR` serves REGION
from a spool of its own. Real `vsqs serve` processes on loopback, boto3 clients
of several regions; one gateway with us-west-1 and eu-central-1 beside its home
region us-east-1, and gateways without the option."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import botocore.config
import httpx
import pytest
from botocore.auth import SigV4Auth, SigV4QueryAuth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from botocore.exceptions import ClientError
from click.testing import CliRunner

import vsqs
from tests.gateway.server import Server, running_gateway
from vsqs._core import format as _format
from vsqs._gateway.command import serve

KEY, SECRET = "AKIDREGIONS", "vsqs-regions-secret"
ACCOUNT = "000000000000"
HOME, WEST, CENTRAL = "us-east-1", "us-west-1", "eu-central-1"
ENV = {"VSQS_AWS_ACCESS_KEY_ID": KEY, "VSQS_AWS_SECRET_ACCESS_KEY": SECRET}

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def regions(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, dict[str, Path]]]:
    """A gateway of home region us-east-1 with spools for us-west-1 and eu-central-1
    (made by --create); with the path of each region's spool."""
    top = tmp_path_factory.mktemp("regions")
    spools = {HOME: top / "home", WEST: top / WEST, CENTRAL: top / CENTRAL}
    args = ["--create", "--region", HOME, "--region-spool", f"{WEST}={spools[WEST]}",
            "--region-spool", f"{CENTRAL}={spools[CENTRAL]}"]
    with running_gateway(str(spools[HOME]), *args, env=ENV, log_dir=str(top)) as server:
        yield server, spools
        assert "Traceback" not in server.log(), server.log()


def client(server: Server, region: str) -> Any:
    return boto3.client("sqs", endpoint_url=server.url, region_name=region, aws_access_key_id=KEY,
                        aws_secret_access_key=SECRET, config=botocore.config.Config(retries={"max_attempts": 1}))


def new_name(prefix: str = "q") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def error_code(exc: pytest.ExceptionInfo[ClientError]) -> str:
    return str(exc.value.response["Error"]["Code"])


def signed_get(server: Server, path: str, region: str, params: dict[str, str]) -> httpx.Response:
    """A Query-protocol GET of ``path``, signed in its headers for ``region`` (as LocalStack's
    tests send them to a queue's URL)."""
    request = AWSRequest(method="GET", url=server.url + path, params=params)
    SigV4Auth(Credentials(KEY, SECRET), "sqs", region).add_auth(request)
    prepared = request.prepare()
    return httpx.get(prepared.url, headers=dict(prepared.headers.items()), timeout=30)


def test_a_queue_name_in_two_regions_is_two_queues_with_urls_of_their_regions(regions) -> None:
    server, spools = regions
    name = new_name()
    home_url = client(server, HOME).create_queue(QueueName=name)["QueueUrl"]
    west_url = client(server, WEST).create_queue(QueueName=name)["QueueUrl"]
    assert home_url == f"{server.url}/{ACCOUNT}/{name}"
    assert west_url == f"{server.url}/queue/{WEST}/{ACCOUNT}/{name}"
    assert name in vsqs.Spool(spools[HOME]).queues()
    assert name in vsqs.Spool(spools[WEST]).queues()
    assert name not in vsqs.Spool(spools[CENTRAL]).queues()
    assert home_url in client(server, HOME).list_queues(QueueNamePrefix=name)["QueueUrls"]
    assert client(server, WEST).list_queues(QueueNamePrefix=name)["QueueUrls"] == [west_url]
    assert "QueueUrls" not in client(server, CENTRAL).list_queues(QueueNamePrefix=name)


def test_get_queue_url_answers_each_regions_own_queue(regions) -> None:
    server, _ = regions
    name = new_name()
    urls = {region: client(server, region).create_queue(QueueName=name)["QueueUrl"]
            for region in (HOME, CENTRAL)}
    assert urls[HOME] != urls[CENTRAL]
    for region in (HOME, CENTRAL):
        assert client(server, region).get_queue_url(QueueName=name)["QueueUrl"] == urls[region]
    with pytest.raises(ClientError) as refused:
        client(server, WEST).get_queue_url(QueueName=name)
    assert error_code(refused) == "AWS.SimpleQueueService.NonExistentQueue"


def test_a_message_sent_in_one_region_is_not_received_in_the_other(regions) -> None:
    server, _ = regions
    name = new_name()
    west, central = client(server, WEST), client(server, CENTRAL)
    west_url = west.create_queue(QueueName=name)["QueueUrl"]
    central_url = central.create_queue(QueueName=name)["QueueUrl"]
    west.send_message(QueueUrl=west_url, MessageBody="west only")
    assert "Messages" not in central.receive_message(QueueUrl=central_url, WaitTimeSeconds=0)
    got = west.receive_message(QueueUrl=west_url, WaitTimeSeconds=0)["Messages"]
    assert [message["Body"] for message in got] == ["west only"]


def test_query_requests_to_a_regions_queue_path_reach_that_regions_queue(regions) -> None:
    """LocalStack's test_endpoint_strategy_with_multi_region: Query GETs to each region's URL."""
    server, _ = regions
    name = new_name()
    west, central = client(server, WEST), client(server, CENTRAL)
    west_path = west.create_queue(QueueName=name)["QueueUrl"].removeprefix(server.url)
    central_path = central.create_queue(QueueName=name)["QueueUrl"].removeprefix(server.url)
    sent = signed_get(server, west_path, WEST, {"Action": "SendMessage", "MessageBody": "foobar"})
    assert sent.status_code == 200, sent.text
    nothing = signed_get(server, central_path, CENTRAL, {"Action": "ReceiveMessage", "VisibilityTimeout": "0"})
    assert nothing.status_code == 200 and "foobar" not in nothing.text
    got = signed_get(server, west_path, WEST, {"Action": "ReceiveMessage", "VisibilityTimeout": "0"})
    assert got.status_code == 200 and "foobar" in got.text


def test_a_presigned_query_is_served_from_the_spool_of_the_region_it_is_signed_for(regions) -> None:
    server, _ = regions
    name = new_name()
    west_url = client(server, WEST).create_queue(QueueName=name)["QueueUrl"]
    request = AWSRequest(method="GET", url=server.url + "/", params={"Action": "GetQueueUrl", "QueueName": name})
    SigV4QueryAuth(Credentials(KEY, SECRET), "sqs_query", WEST).add_auth(request)  # as LocalStack's tests sign
    answer = httpx.get(request.prepare().url, timeout=30)
    assert answer.status_code == 200, answer.text
    assert f"<QueueUrl>{west_url}</QueueUrl>" in answer.text


def test_arns_carry_the_queues_region(regions) -> None:
    server, _ = regions
    name = new_name()
    for region in (HOME, WEST):
        sqs = client(server, region)
        url = sqs.create_queue(QueueName=name)["QueueUrl"]
        arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        assert arn == f"arn:aws:sqs:{region}:{ACCOUNT}:{name}"


def test_the_region_a_url_names_wins_over_the_region_a_client_signs_for(regions) -> None:
    server, _ = regions
    name = new_name()
    west_url = client(server, WEST).create_queue(QueueName=name)["QueueUrl"]
    client(server, HOME).send_message(QueueUrl=west_url, MessageBody="by the url")
    got = client(server, WEST).receive_message(QueueUrl=west_url)["Messages"]
    assert [message["Body"] for message in got] == ["by the url"]


def test_a_client_signing_for_a_region_without_a_spool_is_served_the_home_spool(regions) -> None:
    server, spools = regions
    name = new_name()
    url = client(server, "ap-south-1").create_queue(QueueName=name)["QueueUrl"]
    assert url == f"{server.url}/{ACCOUNT}/{name}"
    assert name in vsqs.Spool(spools[HOME]).queues()


@pytest.mark.parametrize("path", [
    "/queue/eu-west-3/000000000000/{name}",  # a region without a spool
    "/queue/EU-WEST-1/000000000000/{name}",  # not a region name
    "/queue/us-west-1-but-a-very-long-region-name-1/000000000000/{name}",
    "/queue/../000000000000/{name}",
    "/queue/us-west-1/not-an-account!/{name}",
    "/queue/us-west-1/000000000000/bad%2Fname",
])
def test_a_url_naming_a_region_without_a_spool_or_a_bad_part_is_a_queue_that_does_not_exist(regions, path) -> None:
    server, spools = regions
    name = new_name()
    client(server, WEST).create_queue(QueueName=name)
    before = sorted(p.name for p in spools[WEST].parent.iterdir())
    with pytest.raises(ClientError) as refused:
        client(server, WEST).send_message(QueueUrl=server.url + path.format(name=name), MessageBody="x")
    assert error_code(refused) == "AWS.SimpleQueueService.NonExistentQueue"
    assert sorted(p.name for p in spools[WEST].parent.iterdir()) == before


def test_a_dead_letter_queue_in_another_region_is_refused(regions) -> None:
    server, _ = regions
    home, west = client(server, HOME), client(server, WEST)
    dlq = new_name("dlq")
    home.create_queue(QueueName=dlq)
    west.create_queue(QueueName=dlq)
    elsewhere = json.dumps({"deadLetterTargetArn": f"arn:aws:sqs:{HOME}:{ACCOUNT}:{dlq}", "maxReceiveCount": 2})
    with pytest.raises(ClientError) as refused:
        west.create_queue(QueueName=new_name("src"), Attributes={"RedrivePolicy": elsewhere})
    assert error_code(refused) == "InvalidParameterValue"
    assert "same region" in refused.value.response["Error"]["Message"]
    source = west.create_queue(QueueName=new_name("src"))["QueueUrl"]
    with pytest.raises(ClientError) as refused:
        west.set_queue_attributes(QueueUrl=source, Attributes={"RedrivePolicy": elsewhere})
    assert error_code(refused) == "InvalidParameterValue"
    here = json.dumps({"deadLetterTargetArn": f"arn:aws:sqs:{WEST}:{ACCOUNT}:{dlq}", "maxReceiveCount": 2})
    west.set_queue_attributes(QueueUrl=source, Attributes={"RedrivePolicy": here})
    policy = west.get_queue_attributes(QueueUrl=source, AttributeNames=["RedrivePolicy"])["Attributes"]
    assert json.loads(policy["RedrivePolicy"])["deadLetterTargetArn"] == f"arn:aws:sqs:{WEST}:{ACCOUNT}:{dlq}"
    dlq_url = west.get_queue_url(QueueName=dlq)["QueueUrl"]
    assert west.list_dead_letter_source_queues(QueueUrl=dlq_url)["queueUrls"] == [source]
    home_dlq_url = home.get_queue_url(QueueName=dlq)["QueueUrl"]
    assert home.list_dead_letter_source_queues(QueueUrl=home_dlq_url)["queueUrls"] == []


def test_move_tasks_find_their_queues_in_the_arns_region(regions) -> None:
    server, _ = regions
    home, west = client(server, HOME), client(server, WEST)
    dlq, source = new_name("dlq"), new_name("src")
    dlq_url = west.create_queue(QueueName=dlq)["QueueUrl"]
    policy = json.dumps({"deadLetterTargetArn": f"arn:aws:sqs:{WEST}:{ACCOUNT}:{dlq}", "maxReceiveCount": 1})
    west.create_queue(QueueName=source, Attributes={"RedrivePolicy": policy})
    home.create_queue(QueueName=source)
    west.send_message(QueueUrl=dlq_url, MessageBody="dead")
    west_dlq_arn = f"arn:aws:sqs:{WEST}:{ACCOUNT}:{dlq}"
    with pytest.raises(ClientError) as refused:  # (the home region has no queue of that name)
        home.start_message_move_task(SourceArn=f"arn:aws:sqs:{HOME}:{ACCOUNT}:{dlq}")
    assert error_code(refused) == "ResourceNotFoundException"
    with pytest.raises(ClientError) as refused:
        home.start_message_move_task(SourceArn=west_dlq_arn, DestinationArn=f"arn:aws:sqs:{HOME}:{ACCOUNT}:{source}")
    assert error_code(refused) == "InvalidParameterValue"
    with pytest.raises(ClientError) as refused:
        home.start_message_move_task(SourceArn=f"arn:aws:sqs:eu-west-3:{ACCOUNT}:{dlq}")
    assert error_code(refused) == "ResourceNotFoundException"
    home.start_message_move_task(SourceArn=west_dlq_arn,  # signed for the home region: the ARN's region counts
                                 DestinationArn=f"arn:aws:sqs:{WEST}:{ACCOUNT}:{source}")
    source_url = west.get_queue_url(QueueName=source)["QueueUrl"]
    deadline = time.monotonic() + 30
    got: list[Any] = []
    while not got and time.monotonic() < deadline:
        got = west.receive_message(QueueUrl=source_url, WaitTimeSeconds=1).get("Messages", [])
    assert [message["Body"] for message in got] == ["dead"]
    tasks = west.list_message_move_tasks(SourceArn=west_dlq_arn)["Results"]
    assert tasks[0]["SourceArn"] == west_dlq_arn
    assert tasks[0]["DestinationArn"] == f"arn:aws:sqs:{WEST}:{ACCOUNT}:{source}"


def test_housekeeping_sweeps_each_region_spool(tmp_path: Path) -> None:
    home, west = tmp_path / "home", tmp_path / WEST
    queue = vsqs.Spool(west, create=True).create_queue("orders", retention=0.5)
    queue.publish(b"stale")
    args = ["--create", "--gc-interval", "0.2", "--region-spool", f"{WEST}={west}"]
    queue_dir = west / "orders"
    assert len(_message_files(queue_dir)) == 1
    with running_gateway(str(home), *args, env=ENV, log_dir=str(tmp_path)):
        deadline = time.monotonic() + 60
        while _message_files(queue_dir) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _message_files(queue_dir) == []


def _message_files(queue_dir: Path) -> list[str]:
    return [p.name for p in queue_dir.iterdir() if _format.parse_name(p.name) is not None]


def test_without_region_spools_every_region_is_the_home_spool(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    with running_gateway(str(spool), "--create", "--region", HOME, env=ENV, log_dir=str(tmp_path)) as server:
        name = new_name()
        other = client(server, "eu-west-1")
        url = other.create_queue(QueueName=name)["QueueUrl"]
        assert url == f"{server.url}/{ACCOUNT}/{name}"
        arn = other.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        assert arn == f"arn:aws:sqs:{HOME}:{ACCOUNT}:{name}"
        assert client(server, WEST).get_queue_url(QueueName=name)["QueueUrl"] == url
        assert vsqs.Spool(spool).queues() == [name]
        # a URL in the form of another region's names the one spool's queue too, in either protocol
        other.send_message(QueueUrl=f"{server.url}/queue/eu-west-1/{ACCOUNT}/{name}", MessageBody="one")
        got = signed_get(server, f"/queue/eu-west-1/{ACCOUNT}/{name}", "eu-west-1", {"Action": "ReceiveMessage"})
        assert got.status_code == 200 and "<Body>one</Body>" in got.text


# -- the option ---------------------------------------------------------------------


@pytest.fixture
def started(monkeypatch):
    """The configurations `vsqs serve` would have started a server with."""
    configs: list[Any] = []
    monkeypatch.setattr("vsqs._gateway.app.serve", lambda config, **options: configs.append(config))
    return configs


def run(*args: str) -> Any:
    return CliRunner().invoke(serve, list(args), catch_exceptions=False)


def test_region_spool_maps_regions_to_their_directories(tmp_path: Path, started) -> None:
    west = tmp_path / "west"
    result = run(str(tmp_path / "home"), "--create", "--region-spool", f"{WEST}={west}")
    assert result.exit_code == 0, result.output
    assert started[0].region_spools == {WEST: str(west)}
    assert west.is_dir()


@pytest.mark.parametrize(("value", "says"), [
    ("us-west-1", "give REGION=DIR"),
    ("../x={dir}", "is not a region name"),
    ("US-WEST-1={dir}", "is not a region name"),
    ("us-east-1={dir}", "is the home region"),
    ("eu-west-1={home}", "is already the spool of SPOOL"),
    ("eu-west-1={home}/wq", "lie one inside the other"),  # a queue named wq would be that spool
    ("eu-west-1={tmp}", "lie one inside the other"),  # SPOOL would be a queue of the region's spool
])
def test_region_spool_refuses_what_is_not_a_region_of_its_own(tmp_path: Path, started, value, says) -> None:
    home = tmp_path / "home"
    result = run(str(home), "--create", "--region-spool", value.format(dir=tmp_path / "r", home=home, tmp=tmp_path))
    assert result.exit_code == 2
    assert says in result.output
    assert started == []


def test_region_spool_without_create_needs_the_directory(tmp_path: Path, started) -> None:
    (tmp_path / "home").mkdir()
    result = run(str(tmp_path / "home"), "--region-spool", f"{WEST}={tmp_path / 'missing'}")
    assert result.exit_code != 0
    assert "no spool at" in result.output
    assert started == []
