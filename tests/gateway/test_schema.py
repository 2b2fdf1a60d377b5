"""Property-based tests of the gateway's native API, generated from its own
OpenAPI schema (schemathesis): whatever the input, no 5xx, and every answer
the schema documents matches the schema."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("fastapi", reason="the gateway needs the server extra: pip install 'vsqs[server]'")
schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, given, settings
from schemathesis.specs.openapi.checks import response_schema_conformance

from tests.gateway.server import running_gateway, tree_around
from vsqs._gateway.limits import MAX_WAIT

# a hang guard, not a timing: some 500 generated requests take over 120 s on a loaded machine
pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    spool = str(tmp_path_factory.mktemp("schema") / "spool")
    os.mkdir(spool)
    with running_gateway(spool, "--max-body-bytes", "2048") as server:
        yield server


@pytest.fixture(scope="module")
def api_schema(gateway):
    import httpx

    # a queue that exists, so that generated requests reach past the 404
    for name in ("q", "0", "A"):
        httpx.put(f"{gateway.url}/queues/{name}")
        httpx.post(f"{gateway.url}/queues/{name}/messages", content=b"seed")
    return schemathesis.openapi.from_url(f"{gateway.url}/openapi.json")


@schemathesis.check
def no_server_error(ctx, response, case):
    """No 5xx, but for the one the API promises: 503 for an operation suspended
    on the queue (generated requests do suspend queues)."""
    if response.status_code >= 500:
        promised = response.status_code == 503 and '"queue_suspended"' in response.text
        assert promised, f"{response.status_code}: {response.text[:500]}"


def operations(schema):
    for result in schema.get_all_operations():
        yield result.ok()


def aimed_at_seeded_queue(case):
    """The same request sent to queue q (which exists, and holds a message),
    with long polls cut short so an empty queue costs no wall time."""
    if case.path_parameters and "queue" in case.path_parameters:
        case.path_parameters["queue"] = "q"
    if case.query and isinstance(case.query.get("wait"), (int, float)):
        case.query["wait"] = 0
    if isinstance(case.body, dict) and isinstance(case.body.get("wait"), (int, float)):
        case.body["wait"] = 0
    return case


def generated_requests(operation, aim, checks, url):
    import httpx

    @given(case=operation.as_strategy().map(aim))
    @settings(max_examples=15, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    def requests_to(case):
        httpx.put(f"{url}/queues/q")
        httpx.post(f"{url}/queues/q/messages", content=b"seed")
        # a generated long poll on a queue that exists waits up to MAX_WAIT: the client waits longer
        case.call_and_validate(checks=checks, timeout=MAX_WAIT + 30)

    requests_to()


def test_no_server_errors(api_schema, gateway):
    """Every operation: 15 generated requests as generated (queue names fuzzed
    too) and 15 aimed at an existing queue. Schemathesis's pytest plugin does
    not run under pytest 9 yet, so hypothesis drives each operation here."""
    import httpx

    tried = 0
    for operation in operations(api_schema):
        checks = [no_server_error, response_schema_conformance]
        if operation.path.endswith("/messages") and operation.method.upper() == "GET":
            # raw receive answers the body with the Content-Type its publisher gave, which
            # generated publishes pick at random (JSON over binary bodies, say)
            checks = [no_server_error]
        for aim in (lambda case: case, aimed_at_seeded_queue):
            generated_requests(operation, aim, checks, gateway.url)
        tried += 1
    assert tried >= 15  # every operation of the native API was generated for
    # whatever the generated names, nothing was made beside the spool, and the spool holds only queues
    assert [path for path in tree_around(gateway.spool) if not path.startswith("spool")] == []
    for entry in os.listdir(gateway.spool):
        assert os.path.isdir(os.path.join(gateway.spool, entry)), entry
    outcomes = httpx.get(f"{gateway.url}/metrics").text
    for operation in ("publish", "receive", "delete_batch", "change_visibility_batch", "create_queue"):
        assert f'vsqs_gateway_requests_total{{operation="{operation}",outcome="ok"}}' in outcomes, [
            line for line in outcomes.splitlines() if f'operation="{operation}"' in line and "_total" in line]
