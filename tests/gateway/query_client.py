"""Real clients of SQS's Query protocol for the gateway tests, each installed
on first use into a directory of the project's .venv and run in a subprocess:

* botocore 1.34.89, the last release whose SQS model says ``"protocol":
  "query"`` (1.34.90 moved SQS to JSON 1.0; the test venv's own botocore is
  a current one), installed with pip;
* the AWS SDK for JavaScript v2 at 2.1400.0 (its later releases moved SQS to
  JSON 1.0 too), installed with npm.

Without one (no network, no pip, no node) the tests that need it skip,
saying why, except where SQS_QUERY_CLIENT_REQUIRED=1 (CI's .ci/run sets
it): there they fail.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

BOTOCORE_VERSION = "1.34.89"
JS_SDK_VERSION = "2.1400.0"
REQUIRED_ENV = "SQS_QUERY_CLIENT_REQUIRED"
_ROOT = Path(__file__).resolve().parents[2]
_TARGET = _ROOT / ".venv" / f"sqs-query-botocore-{BOTOCORE_VERSION}"
_READY = _TARGET / ".installed"
_JS_TARGET = _ROOT / ".venv" / f"sqs-query-aws-sdk-{JS_SDK_VERSION}"

_PRELUDE = """
import base64, json, sys
import botocore, botocore.config, botocore.session
from botocore import UNSIGNED
from botocore.exceptions import ClientError

assert botocore.__version__ == {version!r}, botocore.__file__

def client(url={url!r}, key={key!r}, secret={secret!r}, signed=True):
    unsigned = {{}} if signed else {{"signature_version": UNSIGNED}}
    config = botocore.config.Config(retries={{"max_attempts": 1}}, **unsigned)
    made = botocore.session.get_session().create_client(
        "sqs", region_name="us-east-1", endpoint_url=url, aws_access_key_id=key, aws_secret_access_key=secret,
        config=config)
    assert made.meta.service_model.protocol == "query"
    return made

def error(call, **kwargs):
    '''(the error code the client saw, the exception's class name) of a call that must fail'''
    try:
        call(**kwargs)
    except ClientError as exc:
        return [exc.response["Error"]["Code"], type(exc).__name__]
    raise AssertionError("the call did not fail")

def plain(value):
    if isinstance(value, dict):
        return {{k: plain(v) for k, v in value.items() if k != "ResponseMetadata"}}
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, bytes):
        return {{"bytes": base64.b64encode(value).decode()}}
    return value

sqs = client()
result = None
"""


def _installed(target: Path, what: str, command: list[str]) -> Path:
    """``target``, made by ``command`` (which installs into the path it is given
    last) if it is not there yet; skips the test (fails under
    SQS_QUERY_CLIENT_REQUIRED=1) if it cannot be."""
    if (target / ".installed").exists():
        return target
    staging = target.with_name(f"{target.name}.tmp{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        done = subprocess.run([*command, str(staging)], check=False, capture_output=True, text=True, timeout=600)
        failure = None if done.returncode == 0 else (done.stderr or done.stdout)[-2000:]
    except (OSError, subprocess.TimeoutExpired) as exc:
        failure = str(exc)
    if failure is not None:
        shutil.rmtree(staging, ignore_errors=True)
        reason = f"cannot install {what} (a Query-protocol client): {failure}"
        if os.environ.get(REQUIRED_ENV) == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    (staging / ".installed").touch()
    try:
        staging.rename(target)
    except OSError:  # another process installed it meanwhile
        shutil.rmtree(staging, ignore_errors=True)
    return target


def client_dir() -> Path:
    """The directory holding the Query-protocol botocore (installed if missing)."""
    return _installed(_TARGET, f"botocore=={BOTOCORE_VERSION}",
                      [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                       "--no-input", f"botocore=={BOTOCORE_VERSION}", "--target"])


def js_client_dir() -> Path:
    """The directory whose node_modules hold the JavaScript SDK v2 (installed if missing)."""
    npm = shutil.which("npm")
    command = [npm or "npm", "install", "--silent", "--no-audit", "--no-fund", "--no-save",
               f"aws-sdk@{JS_SDK_VERSION}", "--prefix"]
    return _installed(_JS_TARGET, f"aws-sdk@{JS_SDK_VERSION} with npm", command)


def model_path() -> Path:
    """The SQS service model of the Query-protocol botocore (the authority on Query names)."""
    return client_dir() / "botocore" / "data" / "sqs" / "2012-11-05" / "service-2.json.gz"


def run_client(url: str, script: str, key: str = "AKIDQUERY", secret: str = "query-secret") -> Any:
    """Run ``script`` with ``sqs`` a Query-protocol botocore client of the gateway at
    ``url`` (helpers: ``client()``, ``error(call, **kwargs)``, ``plain(answer)``);
    return the JSON value it leaves in ``result``."""
    code = (_PRELUDE.format(version=BOTOCORE_VERSION, url=url, key=key, secret=secret)
            + textwrap.dedent(script) + "\nprint(json.dumps(result))\n")
    env = {**os.environ, "PYTHONPATH": str(client_dir())}
    done = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, env=env,
                          timeout=120)
    if done.returncode != 0:
        raise AssertionError(f"the Query client failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_js(url: str, script: str, key: str = "AKIDQUERY", secret: str = "query-secret") -> Any:
    """Run ``script`` (the body of an async function) with ``sqs`` a JavaScript SDK v2
    client of the gateway at ``url`` (helper: ``await error(request)``, the error
    code of a request that must fail); return the JSON value it returns."""
    code = f"""
const AWS = require("aws-sdk");
if (AWS.VERSION !== {json.dumps(JS_SDK_VERSION)}) throw new Error("aws-sdk " + AWS.VERSION);
const sqs = new AWS.SQS({{endpoint: {json.dumps(url)}, region: "us-east-1", accessKeyId: {json.dumps(key)},
                         secretAccessKey: {json.dumps(secret)}, maxRetries: 0}});
if (sqs.api.protocol !== "query") throw new Error("the SDK speaks " + sqs.api.protocol);
async function error(request) {{
  try {{ await request.promise(); }} catch (e) {{ return e.code; }}
  throw new Error("the request did not fail");
}}
(async () => {{ {script} }})().then(
  (result) => {{ process.stdout.write(JSON.stringify(result === undefined ? null : result) + "\\n"); }},
  (e) => {{ console.error(e); process.exit(1); }});
"""
    node = shutil.which("node")
    if node is None:
        reason = "node is not installed (the JavaScript SDK v2 runs on it)"
        if os.environ.get(REQUIRED_ENV) == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    env = {**os.environ, "NODE_PATH": str(js_client_dir() / "node_modules"),
           "AWS_SDK_JS_SUPPRESS_MAINTENANCE_MODE_MESSAGE": "1"}
    done = subprocess.run([node, "-e", code], check=False, capture_output=True, text=True, env=env, timeout=120)
    if done.returncode != 0:
        raise AssertionError(f"the JavaScript client failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def from_bytes(value: dict[str, str]) -> bytes:
    return base64.b64decode(value["bytes"])
