"""How scripts/sqs_conformance.py counts and groups LocalStack's test results.

The run itself needs a Python 3.13 venv with localstack-core and a LocalStack
checkout (`scripts/sqs_conformance.py --self-check` proves that part); these
tests pin the judging on results shaped as its conftest writes them."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "sqs_conformance.py"
SQS = "tests/aws/services/sqs/test_sqs.py::TestSqsProvider::"


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("sqs_conformance", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def entry(outcome: str, reason: str = "", services: tuple[str, ...] = ("sqs",)) -> dict:
    return {"outcome": outcome, "reason": reason, "phase": "call", "seconds": 0.1, "detail": "",
            "services": list(services), "failed_calls": []}


def test_only_validated_collected_tests_are_judged(script):
    raw = {
        "collected": [SQS + "test_a[sqs]", SQS + "test_a[sqs_query]", SQS + "test_b"],
        "tests": {SQS + "test_a[sqs]": entry("passed"),
                  SQS + "test_a[sqs_query]": entry("failed", "AssertionError: assert 1 == 2"),
                  SQS + "test_b": entry("passed")},
    }
    validated = {SQS + "test_a[sqs]", SQS + "test_a[sqs_query]", SQS + "test_gone"}

    result = script.judge(raw, validated, keyword=None)

    assert (result["passed"], result["judged"], result["failed"]) == (1, 2, 1)
    assert sorted(result["tests"]) == [SQS + "test_a[sqs]", SQS + "test_a[sqs_query]"]
    assert result["validated_not_collected"] == [SQS + "test_gone"]


def test_a_collected_test_without_a_result_counts_as_failed(script):
    raw = {"collected": [SQS + "test_a", SQS + "test_b"], "tests": {SQS + "test_a": entry("passed")}}

    result = script.judge(raw, {SQS + "test_a", SQS + "test_b"}, keyword=None)

    assert (result["passed"], result["judged"]) == (1, 2)
    assert result["tests"][SQS + "test_b"]["reason"].startswith("no result")


def test_a_keyword_run_does_not_list_the_validated_tests_it_left_out(script):
    raw = {"collected": [SQS + "test_a"], "tests": {SQS + "test_a": entry("passed")}}

    result = script.judge(raw, {SQS + "test_a", SQS + "test_b"}, keyword="test_a")

    assert result["validated_not_collected"] == []
    assert result["judged"] == 1


@pytest.mark.parametrize("failure, expected", [
    (entry("failed", "snapshot get_attrs: (~) /Attributes/QueueArn 'a' → 'b' ... (expected → actual)"),
     "snapshot: /Attributes/QueueArn differs"),
    (entry("failed", "snapshot receive: (-) /Messages/[0]/MD5OfBody ( 'x' ) (+2 more)"),
     "snapshot: /Messages/[]/MD5OfBody missing"),
    (entry("failed", "snapshot error: (+) /Error/Detail ( None )"), "snapshot: /Error/Detail extra"),
    (entry("failed", "botocore.exceptions.ClientError: An error occurred (SignatureDoesNotMatch) when calling "
                     "the Publish operation: scoped to service 'sqs'", services=("sqs", "sns")),
     "needs another AWS service (sns)"),
    (entry("failed", "botocore.exceptions.ClientError: An error occurred (InvalidParameterValue) when calling "
                     "the SendMessage operation: bad"),
     "unexpected error InvalidParameterValue from SendMessage"),
    (entry("failed", "Failed: DID NOT RAISE <class 'botocore.exceptions.ClientError'>"),
     "no error where AWS gives one"),
    (entry("failed", "AssertionError: assert 'abc' == 'abd'"), "an assertion of the test"),
    (entry("failed", "KeyError: 'Messages'"), "KeyError"),
    (entry("failed", "State for key='x' missing in t. Please (re-)generate the snapshot for this test."),
     "harness: no recorded AWS answer for this key"),
    (entry("failed", "socket.gaierror: [Errno -2] judge: sqs.us-east-1.amazonaws.com is not loopback; only the "
                     "gateway is reached"),
     "reaches for a host off this machine"),
    (entry("skipped", "Skipped: not here"), "skipped by the test itself"),
    (entry("failed", "requests.exceptions.ConnectionError: HTTPSConnectionPool(host='queue.amazonaws.com', "
                     "port=443): Max retries exceeded with url: /?Action=ReceiveMessage&QueueUrl=http%3A..."),
     "reaches for a host off this machine"),
    ({**entry("failed", "KeyError: 'Messages'"), "off_machine_hosts": ["sqs.us-east-1.amazonaws.com"]},
     "reaches for a host off this machine"),
    (entry("failed", "Failed: Timeout (>600.0s) from pytest-timeout."), "test timed out"),
])
def test_a_failure_is_grouped_by_its_cause(script, failure, expected):
    assert script.cause(failure) == expected


def test_a_workers_result_wins_over_the_controllers(script, tmp_path):
    (tmp_path / "raw-results.main.json").write_text(json.dumps(
        {"collected": [], "tests": {SQS + "test_a": entry("failed", "x", services=())}}))
    (tmp_path / "raw-results.gw0.json").write_text(json.dumps(
        {"collected": [SQS + "test_a"], "tests": {SQS + "test_a": entry("failed", "x", services=("sqs", "kms"))}}))

    merged = script.merged_results(tmp_path)

    assert merged["collected"] == [SQS + "test_a"]
    assert merged["tests"][SQS + "test_a"]["services"] == ["sqs", "kms"]


def test_validation_files_give_ids_and_the_seconds_aws_took(script, tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "test_sqs.validation.json").write_text(json.dumps({
        SQS + "test_a": {"last_validated_date": "2025-01-01T00:00:00+00:00",
                         "durations_in_seconds": {"setup": 1.0, "call": 2.0, "teardown": 0.5, "total": 3.5}},
        SQS + "test_b": {"last_validated_date": "2024-01-01T00:00:00+00:00"},
    }))
    (tmp_path / "sub" / "test_more.validation.json").write_text(json.dumps({"x::test_c": {}}))

    assert script.validated_ids(tmp_path) == {SQS + "test_a": 3.5, SQS + "test_b": None, "x::test_c": None}


def test_a_validated_test_of_a_module_that_did_not_import_counts_as_failed(script):
    raw = {"collected": [SQS + "test_a"], "tests": {SQS + "test_a": entry("passed")},
           "collect_errors": {"tests/aws/services/sqs/test_sqs_move_task.py": "ImportError: no module x"}}
    moved = "tests/aws/services/sqs/test_sqs_move_task.py::TestSqsMoveTask::test_move[sqs]"

    result = script.judge(raw, {SQS + "test_a", moved, SQS + "test_gone"}, keyword=None)

    assert (result["passed"], result["judged"]) == (1, 2)
    assert result["tests"][moved]["cause"] == "harness: tests/aws/services/sqs/test_sqs_move_task.py did not import"
    assert result["validated_not_collected"] == [SQS + "test_gone"]


def test_a_connection_error_to_loopback_is_not_off_machine(script):
    failure = entry("failed", "requests.exceptions.ConnectionError: HTTPConnectionPool(host='127.0.0.1', port=1): "
                              "Max retries exceeded")
    assert script.cause(failure) == "requests.exceptions.ConnectionError"


def test_a_test_that_skips_itself_is_listed_with_its_reason_and_not_judged(script):
    raw = {"collected": [SQS + "test_a", SQS + "test_b", SQS + "test_c"],
           "tests": {SQS + "test_a": entry("passed"),
                     SQS + "test_b": entry("skipped", "this test requires 5 minutes to run. Only execute manually"),
                     # as an earlier conftest wrote it: the skip report's tuple
                     SQS + "test_c": entry("skipped", "('/x/tests/aws/services/sqs/test_sqs.py', 3994, "
                                                      "'Skipped: unconditional skip')")}}

    result = script.judge(raw, {SQS + "test_a", SQS + "test_b", SQS + "test_c"}, keyword=None)

    assert (result["passed"], result["failed"], result["judged"]) == (1, 0, 1)
    assert result["skipped"] == {SQS + "test_b": "this test requires 5 minutes to run. Only execute manually",
                                 SQS + "test_c": "unconditional skip"}
    assert result["causes"] == {}


def test_the_report_prints_skips_as_text_apart_from_the_verdicts(script, tmp_path, capsys):
    raw = {"collected": [SQS + "test_a", SQS + "test_b"],
           "tests": {SQS + "test_a": entry("failed", "AssertionError: assert 1 == 2"),
                     SQS + "test_b": entry("skipped", "only by hand")}}
    result = script.judge(raw, {SQS + "test_a", SQS + "test_b"}, keyword=None)
    result.update(aws_seconds=None, wall_seconds=1)

    script.print_report(result, tmp_path / "result.json", tmp_path)

    out = capsys.readouterr().out
    assert ("skipped by the test itself, not judged (1):\n"
            "  test_sqs.py::TestSqsProvider::test_b\n      only by hand") in out
    assert "judged: 0 passed, 1 failed; 1 skipped by the test itself, not judged" in out
    assert out.rstrip().endswith("0 / 1 passed")


def test_fixture_conflicts_is_left_out_of_the_run(script):
    """LocalStack's plugin aborts the session on a fixture defined twice; the judging
    conftest overrides account_id, region_name and aws_http_client_factory on purpose."""
    assert "localstack.testing.pytest.fixture_conflicts" in script.LEFT_OUT_PLUGINS


def test_python_313_comes_first_and_312_only_if_it_imports_the_sqs_tests(script, tmp_path, monkeypatch):
    made = []

    def make_venv(cache, python, version, xdist):
        made.append(version)
        return tmp_path / f"py{version}"

    monkeypatch.setattr(script, "find_pythons", lambda given: [("/p/3.13", (3, 13)), ("/p/3.12", (3, 12))])
    monkeypatch.setattr(script, "make_venv", make_venv)
    monkeypatch.setattr(script, "imports_sqs_tests", lambda python: "")
    assert script.ensure_venv(tmp_path, None, xdist=False) == tmp_path / "py3.13"
    assert made == ["3.13"]

    made.clear()
    monkeypatch.setattr(script, "find_pythons", lambda given: [("/p/3.12", (3, 12))])
    assert script.ensure_venv(tmp_path, None, xdist=False) == tmp_path / "py3.12"  # no 3.13, and it imports

    made.clear()
    monkeypatch.setattr(script, "imports_sqs_tests",
                        lambda python: "ImportError: cannot import name 'deprecated' from 'warnings'")
    with pytest.raises(SystemExit, match="does not|no Python found"):
        script.ensure_venv(tmp_path, None, xdist=False)
    assert made == ["3.12"]


def test_the_gateway_judged_applies_amazons_60_second_rules(script, tmp_path, monkeypatch):
    """The tests that show QueueDeletedRecently and PurgeQueueInProgress switch them on in
    LocalStack; the harness's gateway has them on too, at Amazon's 60 s."""
    started: list[list[str]] = []

    class Exited:
        returncode = 2

        def __init__(self, command, **options):
            started.append(list(command))

        def poll(self):
            return 2

    monkeypatch.setattr(script.subprocess, "Popen", Exited)
    with pytest.raises(SystemExit):
        script.running_gateway(tmp_path).__enter__()
    [command] = started
    assert command[command.index("--sqs-recently-deleted") + 1] == "60"
    assert command[command.index("--sqs-purge-interval") + 1] == "60"
