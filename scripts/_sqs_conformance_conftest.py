"""Judging plugin for LocalStack's SQS tests, run by scripts/sqs_conformance.py.

The harness copies LocalStack's test tree into its cache and puts this file
there as tests/aws/services/sqs/conftest.py, the nearest conftest of every SQS
test, so its fixtures win over LocalStack's own. It is not imported by vsqs or
by vsqs's test suite. It:

* keeps only the tests that LocalStack's ``*.validation.json`` files list as
  validated against AWS (VSQS_JUDGE_VALIDATED, a JSON list of node ids) and
  deselects the rest;
* answers who the caller is, which fixtures would ask AWS's STS: the account
  and region are the gateway's (``000000000000``, ``us-east-1``), both as the
  ``account_id``/``region_name`` fixtures and as STS GetCallerIdentity, which
  never leaves the test process (the secondary test key is 000000000002);
* sends LocalStack's raw signed HTTP client (``aws_http_client_factory``) to
  the gateway instead of the public SQS endpoint;
* refuses every name lookup but loopback, so a test that reaches for another
  host fails here at once, and no request leaves the machine; the hosts a
  test reached for are recorded with its result;
* records, per test, its outcome, the one-line reason of a failure (of a
  skip: the test's own reason, as text) and which AWS services it called, to VSQS_JUDGE_RESULTS (JSON) at the end.

Snapshot waivers: LocalStack's ``skip_snapshot_verify`` markers are honoured
by localstack-snapshot only when TEST_TARGET is not AWS_CLOUD; the harness
runs with TEST_TARGET=AWS_CLOUD, so every recorded AWS answer is compared in
full. ``pytest_configure`` below checks that this still holds.
"""

from __future__ import annotations

import json
import os
import re
import socket
import threading

import botocore.client
import pytest

GATEWAY_URL = os.environ["VSQS_JUDGE_URL"]
RESULTS_PATH = os.environ["VSQS_JUDGE_RESULTS"]
with open(os.environ["VSQS_JUDGE_VALIDATED"], encoding="utf-8") as _f:
    VALIDATED = frozenset(json.load(_f))

ACCOUNT_ID = "000000000000"  # the gateway's one account (docs/gateway.md)
REGION = "us-east-1"

_LOOPBACK_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost", "::1"}
_real_getaddrinfo = socket.getaddrinfo


def _loopback_only(host, *args, **kwargs):
    name = host.decode() if isinstance(host, bytes) else host
    if name is not None and name not in _LOOPBACK_NAMES and not str(name).startswith("127."):
        nodeid = getattr(_current, "nodeid", None) or _Session.nodeid
        if nodeid:  # the judge groups such a test by this, whatever error its client makes of the refusal
            _refused.setdefault(nodeid, set()).add(str(name))
        raise socket.gaierror(socket.EAI_NONAME, f"judge: {name} is not loopback; only the gateway is reached")
    return _real_getaddrinfo(host, *args, **kwargs)


socket.getaddrinfo = _loopback_only


# which AWS API calls each test made (service, operation), to tell a test that
# needs another AWS service from one that exercises SQS alone
_calls: dict[str, list[tuple[str, str, str]]] = {}
_refused: dict[str, set[str]] = {}  # the hosts off this machine each test reached for
_current = threading.local()
_real_make_api_call = botocore.client.BaseClient._make_api_call


def _caller_identity(client) -> dict:
    """STS GetCallerIdentity as AWS answers it for the gateway's account (LocalStack's
    secondary test key is account 000000000002, as LocalStack has it)."""
    from localstack.testing.config import SECONDARY_TEST_AWS_ACCESS_KEY_ID, SECONDARY_TEST_AWS_ACCOUNT_ID

    key = client._request_signer._credentials.get_frozen_credentials().access_key
    account = SECONDARY_TEST_AWS_ACCOUNT_ID if key == SECONDARY_TEST_AWS_ACCESS_KEY_ID else ACCOUNT_ID
    return {"UserId": account, "Account": account, "Arn": f"arn:aws:iam::{account}:root",
            "ResponseMetadata": {"HTTPStatusCode": 200, "HTTPHeaders": {}, "RetryAttempts": 0}}


def _recording_make_api_call(self, operation_name, api_params):
    service = self.meta.service_model.service_name
    if (service, operation_name) == ("sts", "GetCallerIdentity"):
        # who the caller is, which fixtures and LocalStack's snapshot fixture ask: not SQS's to answer
        return _caller_identity(self)
    nodeid = getattr(_current, "nodeid", None) or _Session.nodeid
    error = ""
    try:
        return _real_make_api_call(self, operation_name, api_params)
    except Exception as exc:
        error = _one_line(str(exc)) or type(exc).__name__
        raise
    finally:
        if nodeid:
            _calls.setdefault(nodeid, []).append((service, operation_name, error))


botocore.client.BaseClient._make_api_call = _recording_make_api_call


class _Session:
    nodeid: str | None = None  # the test running now (calls from fixture threads count for it)
    results: dict[str, dict] = {}
    collected: list[str] = []
    collect_errors: dict[str, str] = {}  # a module that did not import: its path, why


def _one_line(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def pytest_configure(config):
    from localstack.testing.aws.util import is_aws_cloud

    if not is_aws_cloud():
        raise pytest.UsageError("judge: TEST_TARGET must be AWS_CLOUD, else snapshot waivers would apply")
    if config.getoption("snapshot_update", default=False) or os.environ.get("SNAPSHOT_UPDATE") == "1":
        raise pytest.UsageError("judge: a snapshot update would overwrite the recorded AWS answers")
    if config.getoption("snapshot_skip_all", default=False):
        raise pytest.UsageError("judge: --snapshot-skip-all would compare no recorded AWS answer")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    _Session.collected = [item.nodeid for item in items]
    kept = [item for item in items if item.nodeid in VALIDATED]
    dropped = [item for item in items if item.nodeid not in VALIDATED]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    items[:] = kept


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _Session.nodeid = item.nodeid
    _current.nodeid = item.nodeid
    try:
        yield
    finally:
        _Session.nodeid = None
        _current.nodeid = None


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _reason(report) -> str:
    """One line saying why a phase failed: a snapshot's match key and first
    differing path (localstack-snapshot's report: ">> match key: K" then lines
    "(~) /path expected → actual", "(-) /path (expected)", "(+) /path (actual)"),
    else the exception's own message."""
    if report.skipped and isinstance(report.longrepr, tuple) and len(report.longrepr) == 3:
        # a skip's report is (file, line, "Skipped: why"): its reason as text
        return _one_line(str(report.longrepr[2]).removeprefix("Skipped: "))
    text = _ANSI.sub("", report.longreprtext or "")
    if text.startswith(">> match key:"):
        key = re.match(r">> match key: (\S+)", text)
        diffs = [line.strip() for line in text.splitlines() if re.match(r"\s*\((?:[~+-])\) ", line)]
        more = f" (+{len(diffs) - 1} more)" if len(diffs) > 1 else ""
        return _one_line(f"snapshot {key.group(1)}: {diffs[0] if diffs else ''}{more}")
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None and crash.message:
        return _one_line(crash.message)
    lines = [line for line in text.splitlines() if line.startswith("E ")]
    if lines:
        return _one_line(lines[0][2:])
    return _one_line(text.strip().splitlines()[-1] if text.strip() else report.outcome)


def pytest_collectreport(report):
    if report.failed:
        _Session.collect_errors[report.nodeid] = _reason(report)


def pytest_runtest_logreport(report):
    entry = _Session.results.setdefault(
        report.nodeid, {"outcome": "passed", "reason": "", "phase": "", "seconds": 0.0, "detail": ""}
    )
    entry["seconds"] = round(entry["seconds"] + report.duration, 2)
    if report.outcome == "failed" and entry["outcome"] != "failed":
        entry.update(outcome="failed", phase=report.when, reason=_reason(report),
                     detail=(report.longreprtext or "")[-6000:])
    elif report.outcome == "skipped" and entry["outcome"] == "passed":
        entry.update(outcome="skipped", phase=report.when, reason=_reason(report))


def pytest_sessionfinish(session, exitstatus):
    """Each process writes its own file (RESULTS_PATH.WORKER.json; "main" without
    pytest-xdist, or for xdist's controller, which sees the reports but made no calls)."""
    for nodeid, entry in _Session.results.items():
        if nodeid in _refused:
            entry["off_machine_hosts"] = sorted(_refused[nodeid])
        if nodeid in _calls:
            calls = _calls[nodeid]
            entry["services"] = sorted({service for service, _, _ in calls})
            entry["failed_calls"] = [f"{service}.{op}: {error}" for service, op, error in calls if error][:5]
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    with open(f"{RESULTS_PATH}.{worker}.json", "w", encoding="utf-8") as f:
        json.dump({"collected": _Session.collected, "tests": _Session.results,
                   "collect_errors": _Session.collect_errors}, f, indent=1)


# --- fixtures that would otherwise ask AWS (STS) or reach the public endpoint ---


@pytest.fixture(scope="session")
def account_id():
    return ACCOUNT_ID


@pytest.fixture(scope="session")
def region_name():
    return REGION


@pytest.fixture(scope="session")
def secondary_account_id():
    from localstack.testing.config import SECONDARY_TEST_AWS_ACCOUNT_ID

    return SECONDARY_TEST_AWS_ACCOUNT_ID


@pytest.fixture(scope="class")
def aws_http_client_factory(aws_http_client_factory):
    """LocalStack's factory, with the gateway as the endpoint when none is named."""

    def factory(service, *args, **kwargs):
        if len(args) < 3 and not kwargs.get("endpoint_url"):
            kwargs["endpoint_url"] = GATEWAY_URL
        return aws_http_client_factory(service, *args, **kwargs)

    return factory
