"""Judge `vsqs serve` by LocalStack's AWS-validated SQS tests.

    .venv/bin/python scripts/sqs_conformance.py --localstack-src ~/src/localstack
    .venv/bin/python scripts/sqs_conformance.py --self-check

LocalStack's tests under tests/aws/services/sqs/ record real AWS answers
(``*.snapshot.json``) and list the tests that were run against AWS
(``*.validation.json``). This script runs those tests against a `vsqs serve`
of this checkout instead of AWS and counts how many pass:

1. a Python 3.13 virtual environment in the cache (default
   ~/.cache/vsqs-conformance, never in this tree) with
   ``localstack-core[test]==LOCALSTACK_VERSION`` (LocalStack's own test
   dependencies: pytest, localstack-snapshot, the fixtures) and pytest-timeout.
   localstack-core 4.14.0 says it needs Python >= 3.10 but imports
   ``warnings.deprecated`` (3.13): a 3.12 venv is used only when no 3.13 is
   found and the SQS tests' imports of localstack-core succeed in it;
2. a copy of the checkout's tests/ tree in the cache, with
   scripts/_sqs_conformance_conftest.py put in as
   tests/aws/services/sqs/conftest.py (it selects the validated tests, answers
   the account and region, keeps every request on loopback and records the
   results); the checkout itself is never written to;
3. `vsqs serve` on a free loopback port with a fresh spool and the key pairs
   of LocalStack's primary (test/test) and secondary (000000000002/test2)
   test credentials, and Amazon's 60-second rules on (``--sqs-recently-deleted
   60 --sqs-purge-interval 60``, off by default): the tests that show them
   (``test_create_queue_recently_deleted``, ``test_successive_purge_calls_fail``)
   ask LocalStack for exactly these with ``SQS_DELAY_RECENTLY_DELETED`` and
   ``SQS_DELAY_PURGE_RETRY``, and the others delete or purge a queue at most
   once (LocalStack has these settings off by default);
4. pytest in LocalStack's "against real AWS" mode (TEST_TARGET=AWS_CLOUD),
   with AWS_ENDPOINT_URL sending every client to the gateway. In that mode
   localstack-snapshot compares each recorded AWS answer in full, after the
   transformers the tests add, and ignores LocalStack's own
   ``skip_snapshot_verify`` waivers. LocalStack's ``fixture_conflicts``
   plugin is left out: it aborts the session on any fixture defined twice,
   and the judging conftest overrides some of LocalStack's fixtures on purpose;
5. prints ``passed / judged``, one line per failing test with its reason, the
   failures grouped by cause, and writes a JSON result file.

Only tests that a ``*.validation.json`` lists are judged; both protocols run
where a test is parametrized over them (``[sqs]``: JSON, ``[sqs_query]``:
Query/XML). A test that skips itself (LocalStack marks some to run only by
hand) is listed as skipped, with its reason, and not judged. A test that
reaches for a host other than loopback (a presigned URL of
queue.amazonaws.com) is refused, judged failed, and grouped as such. A test
that calls another AWS service (STS, SNS, Lambda, KMS, CloudFormation, ...)
reaches the gateway too and fails: it is judged, and grouped as such.

LocalStack's tests are not on PyPI: no sdist or wheel of localstack-core or
localstack carries tests/ (its MANIFEST.in excludes them). The checkout comes
from LocalStack's repository at the tag of the pinned version (`git clone
--depth 1 --branch v4.14.0` of localstack/localstack on GitHub), so a machine
that reaches only package registries cannot run the judged suite; it can run
--self-check, which judges a small suite this script writes, to prove the
harness (venv, gateway, credentials, both protocols, waivers off, selection by
validation file, reasons) end to end.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tarfile
import time
import urllib.request
from pathlib import Path

LOCALSTACK_VERSION = "4.14.0"
EXTRA_REQUIREMENTS = ["pytest-timeout>=2.3"]
SQS_TESTS = "tests/aws/services/sqs"
REPO = Path(__file__).resolve().parent.parent
CONFTEST = Path(__file__).resolve().parent / "_sqs_conformance_conftest.py"
PRIMARY_KEYS = ("test", "test")
HOME_REGION = "us-east-1"
# the regions LocalStack's SQS tests sign for beside the home one (grep region_name= / region1 = in
# test_sqs.py): each gets a spool of its own under the run directory (vsqs serve --region-spool)
OTHER_REGIONS = ("us-west-1", "eu-central-1", "eu-north-1")
SECONDARY_KEYS = ("000000000002", "test2")
# the Pythons to make the venv with, best first: 3.13, else a 3.12 that imports the SQS tests
PYTHON_VERSIONS = ((3, 13), (3, 12))
# localstack-core modules the SQS tests import (3.12 fails on localstack.utils.tagging, through the provider)
SQS_TEST_IMPORTS = ("localstack.services.sqs.provider", "localstack.services.sqs.models",
                    "localstack.testing.pytest.fixtures", "localstack.utils.tagging")
# LocalStack plugins the run leaves out (-p no:...), and why
LEFT_OUT_PLUGINS = {
    "localstack.testing.pytest.validation_tracking": "would write the run's dates into the copied *.validation.json",
    "rerunfailures": "a difference that goes away on a second try is still one",
    "pytest_tinybird": "LocalStack CI's result upload",
    "localstack.testing.pytest.fixture_conflicts": "aborts the session on a fixture defined twice, and the judging "
                                                   "conftest overrides account_id, region_name and "
                                                   "aws_http_client_factory on purpose",
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--localstack-src", default=os.environ.get("VSQS_LOCALSTACK_SRC"),
                        help=f"a checkout of LocalStack at tag v{LOCALSTACK_VERSION} ($VSQS_LOCALSTACK_SRC)")
    parser.add_argument("--self-check", action="store_true",
                        help="judge a small suite written by this script instead (no LocalStack checkout needed)")
    parser.add_argument("--cache", default=os.environ.get("VSQS_CONFORMANCE_CACHE",
                                                          str(Path.home() / ".cache/vsqs-conformance")))
    parser.add_argument("--python", "--python312", dest="python",
                        default=os.environ.get("VSQS_PYTHON") or os.environ.get("VSQS_PYTHON312"),
                        help="the Python to make the venv with ($VSQS_PYTHON; else python3.13 on PATH or "
                             "pyenv's, else a 3.12 that imports the SQS tests)")
    parser.add_argument("--json", dest="json_path", help="result file (default: CACHE/result.json)")
    parser.add_argument("-k", dest="keyword", help="pytest -k expression: judge only matching tests")
    parser.add_argument("--timeout", type=int, default=600, help="seconds one test may take (default 600)")
    parser.add_argument("--workers", type=int, default=1, help="pytest-xdist processes (default 1: serial)")
    args = parser.parse_args(argv)

    cache = Path(args.cache).expanduser().resolve()
    run_dir = cache / "run"
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)

    if args.self_check:
        source = run_dir / "self-check-src"
        write_self_check_suite(source)
    elif args.localstack_src:
        source = Path(args.localstack_src).expanduser().resolve()
    else:
        print(f"need --localstack-src DIR: a checkout of LocalStack at tag v{LOCALSTACK_VERSION} "
              "(its tests are on no package registry), or --self-check", file=sys.stderr)
        return 2
    if not (source / SQS_TESTS).is_dir():
        print(f"{source} has no {SQS_TESTS}/", file=sys.stderr)
        return 2

    started = time.time()
    python = ensure_venv(cache, args.python, xdist=args.workers > 1)
    tests_root = run_dir / "localstack"
    copy_tests(source, tests_root)
    validated = validated_ids(tests_root / SQS_TESTS)
    (run_dir / "validated.json").write_text(json.dumps(sorted(validated)))
    if not validated:
        print(f"no *.validation.json entries under {source / SQS_TESTS}", file=sys.stderr)
        return 2

    with running_gateway(run_dir) as url:
        raw_path = run_dir / "raw-results"
        code = run_pytest(python, tests_root, run_dir, url, raw_path, args)
    wall = time.time() - started
    raw = merged_results(run_dir)
    if raw is None:
        print(f"pytest wrote no results (exit {code}); its output is in {run_dir / 'pytest.log'}", file=sys.stderr)
        return 2

    result = judge(raw, set(validated), args.keyword)
    recorded = [validated[n] for n in result["tests"] if validated.get(n) is not None]
    result["aws_seconds"] = round(sum(recorded)) if recorded else None
    result.update(
        localstack_core=LOCALSTACK_VERSION,
        localstack_tests=describe_source(source, args.self_check),
        vsqs=git_describe(REPO),
        wall_seconds=round(wall),
        pytest_exit=code,
    )
    json_path = Path(args.json_path) if args.json_path else cache / "result.json"
    json_path.write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n")
    print_report(result, json_path, run_dir)
    if args.self_check:
        return check_self_check(result)
    return 0


# --- the venv --------------------------------------------------------------------------


def python_version(path: str) -> tuple[int, int] | None:
    out = subprocess.run([path, "-c", "import sys; print(*sys.version_info[:2])"], capture_output=True, text=True)
    try:
        major, minor = out.stdout.split()
        return int(major), int(minor)
    except ValueError:
        return None


def find_pythons(given: str | None) -> list[tuple[str, tuple[int, int]]]:
    """The Pythons to try, best first: ``given`` alone if given, else each version of
    PYTHON_VERSIONS found on PATH or among pyenv's."""
    if given:
        path = shutil.which(given) or (given if os.access(given, os.X_OK) else None)
        version = python_version(path) if path else None
        if version is None:
            raise SystemExit(f"--python {given}: not a Python that runs")
        return [(path, version)]
    found = []
    for major, minor in PYTHON_VERSIONS:
        pyenv = sorted(Path.home().glob(f".pyenv/versions/{major}.{minor}.*/bin/python{major}.{minor}"), reverse=True)
        for candidate in [f"python{major}.{minor}", *map(str, pyenv)]:
            path = shutil.which(candidate) or (candidate if os.access(candidate, os.X_OK) else None)
            if path and python_version(path) == (major, minor):
                found.append((path, (major, minor)))
                break
    return found


def imports_sqs_tests(python: Path) -> str:
    """"" if the venv's Python imports what the SQS tests import of localstack-core, else why not."""
    code = "import importlib, sys\nfor name in sys.argv[1:]: importlib.import_module(name)"
    out = subprocess.run([str(python), "-c", code, *SQS_TEST_IMPORTS], capture_output=True, text=True)
    return "" if out.returncode == 0 else (out.stderr.strip().splitlines() or [f"exit {out.returncode}"])[-1]


def ensure_venv(cache: Path, given: str | None, xdist: bool) -> Path:
    """A venv in the cache made with the best Python found (3.13, else a 3.12) whose
    localstack-core imports what the SQS tests import; the first that does is used."""
    pythons = find_pythons(given)
    if not pythons:
        raise SystemExit(f"need a Python {'.'.join(map(str, PYTHON_VERSIONS[0]))} for localstack-core "
                         f"{LOCALSTACK_VERSION}: --python PATH or VSQS_PYTHON")
    why = ""
    for path, (major, minor) in pythons:
        venv_python = make_venv(cache, path, f"{major}.{minor}", xdist)
        why = imports_sqs_tests(venv_python)
        if not why:
            return venv_python
        print(f"Python {major}.{minor}: localstack-core {LOCALSTACK_VERSION} does not import the SQS tests' "
              f"modules ({why})", file=sys.stderr)
    raise SystemExit(f"no Python found imports localstack-core {LOCALSTACK_VERSION}'s SQS test modules ({why}); "
                     f"give a Python {'.'.join(map(str, PYTHON_VERSIONS[0]))} with --python")


def make_venv(cache: Path, python: str, version: str, xdist: bool) -> Path:
    """CACHE/venv-localstack-VERSION-pyX.Y with localstack-core[test], its versions pinned by the
    lock file LocalStack tests that release with (requirements-test.txt of its sdist; the
    newest releases of some dependencies break it: cbor2 6 lacks a module it imports).
    Made once; a stamp file marks it complete (a pip run cut short is redone)."""
    venv = cache / f"venv-localstack-{LOCALSTACK_VERSION}-py{version}"
    requirements = [f"localstack-core[test]=={LOCALSTACK_VERSION}", *EXTRA_REQUIREMENTS]
    if xdist:
        requirements.append("pytest-xdist>=3.5")
    stamp = venv / ".vsqs-installed"
    wanted = "\n".join([*requirements, f"-c requirements-test.txt of localstack-core {LOCALSTACK_VERSION}"])
    if stamp.exists() and stamp.read_text() == wanted:
        return venv / "bin/python"
    if not (venv / "bin/python").exists():
        print(f"making {venv} (localstack-core[test] is a few hundred MB; the first time takes minutes)",
              file=sys.stderr)
        subprocess.run([python, "-m", "venv", str(venv)], check=True)
    log = cache / "pip.log"
    pip = [str(venv / "bin/python"), "-m", "pip", "--disable-pip-version-check"]
    with open(log, "w") as out:
        constraints = lock_file(cache, pip, out)
        done = subprocess.run([*pip, "install", "--progress-bar", "off", "-c", str(constraints), *requirements],
                              stdout=out, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        raise SystemExit(f"pip install failed; its output is in {log}")
    stamp.write_text(wanted)
    return venv / "bin/python"


def lock_file(cache: Path, pip: list[str], out) -> Path:
    """requirements-test.txt of the pinned localstack-core's sdist, as pip constraints."""
    constraints = cache / f"requirements-test-{LOCALSTACK_VERSION}.txt"
    if constraints.exists():
        return constraints
    sdist_dir = cache / "sdist"
    done = subprocess.run([*pip, "download", "--no-deps", "--no-binary", ":all:", "-d", str(sdist_dir),
                           f"localstack-core=={LOCALSTACK_VERSION}"], stdout=out, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        raise SystemExit(f"could not download the localstack-core {LOCALSTACK_VERSION} sdist; see {out.name}")
    (sdist,) = sdist_dir.glob(f"localstack*core-{LOCALSTACK_VERSION}.tar.gz")
    with tarfile.open(sdist) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith("/requirements-test.txt")
                      and m.name.count("/") == 1)
        data = tar.extractfile(member).read()
    # the lock leaves localstack-core itself out (an "unsafe" package), as pip -c wants
    constraints.write_bytes(data)
    return constraints


# --- the tests -------------------------------------------------------------------------


def copy_tests(source: Path, dest: Path) -> None:
    """The checkout's tests/ (the SQS tests import fixtures and helpers from all over
    it) into the cache, and the judging conftest beside the SQS tests."""
    shutil.copytree(source / "tests", dest / "tests",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache"))
    conftest = dest / SQS_TESTS / "conftest.py"
    if conftest.exists():
        raise SystemExit(f"{SQS_TESTS}/conftest.py exists in the checkout: the harness needs that place")
    shutil.copy(CONFTEST, conftest)
    # no [tool.pytest] of LocalStack's own (addopts, plugins) and node ids relative to dest
    (dest / "pytest.ini").write_text("[pytest]\n")


def validated_ids(sqs_dir: Path) -> dict[str, float | None]:
    """Every test id the validation files list, with the seconds its last run against
    AWS took where the file records it (durations_in_seconds.total)."""
    ids: dict[str, float | None] = {}
    for path in sorted(sqs_dir.rglob("*.validation.json")):
        for nodeid, data in json.loads(path.read_text()).items():
            ids[nodeid] = (data.get("durations_in_seconds") or {}).get("total")
    return ids


def describe_source(source: Path, self_check: bool) -> str:
    if self_check:
        return "self-check suite"
    return f"{source} ({git_describe(source)})"


def git_describe(path: Path) -> str:
    out = subprocess.run(["git", "-C", str(path), "describe", "--tags", "--always", "--dirty"],
                         capture_output=True, text=True)
    return out.stdout.strip() or "not a git checkout"


# --- the gateway -----------------------------------------------------------------------


# Amazon's 60-second rules, which the tests that show them switch on in LocalStack (see step 3 above)
AMAZON_WAITS = ("--sqs-recently-deleted", "60", "--sqs-purge-interval", "60")


class running_gateway:
    """`vsqs serve` of this checkout on a free loopback port, with a fresh spool (and one
    for each of OTHER_REGIONS) and LocalStack's test key pairs; stopped on exit."""

    def __init__(self, run_dir: Path):
        self.run_dir = run_dir

    def __enter__(self) -> str:
        credentials = self.run_dir / "aws-credentials"
        credentials.write_text(
            "[default]\naws_access_key_id = {}\naws_secret_access_key = {}\n\n"
            "[secondary]\naws_access_key_id = {}\naws_secret_access_key = {}\n".format(*PRIMARY_KEYS,
                                                                                    *SECONDARY_KEYS))
        credentials.chmod(0o600)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("VSQS_", "AWS_"))}
        env["PYTHONPATH"] = str(REPO)
        self.log = open(self.run_dir / "gateway.log", "wb")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "vsqs", "serve", str(self.run_dir / "spool"), "--create", "--port", str(port),
             "--aws-credentials-file", str(credentials), "--region", HOME_REGION, "--log-level", "warning",
             *AMAZON_WAITS,
             *(arg for region in OTHER_REGIONS
               for arg in ("--region-spool", f"{region}={self.run_dir / 'regions' / region}"))],
            cwd=REPO, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while True:
            if self.process.poll() is not None:
                self.log.close()
                raise SystemExit(f"vsqs serve exited ({self.process.returncode}); see {self.run_dir}/gateway.log")
            try:
                with urllib.request.urlopen(self.url + "/healthz", timeout=1) as answer:
                    if answer.status == 200:
                        return self.url
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.__exit__()
                raise SystemExit(f"vsqs serve did not answer in 30 s; see {self.run_dir}/gateway.log")
            time.sleep(0.2)

    def __exit__(self, *exc) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()


# --- pytest ----------------------------------------------------------------------------


def run_pytest(python: Path, tests_root: Path, run_dir: Path, url: str, raw_path: Path,
               args: argparse.Namespace) -> int:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AWS_", "TEST_", "SECONDARY_TEST_", "SNAPSHOT_", "LOCALSTACK_", "PYTEST_"))}
    env.update(
        TEST_TARGET="AWS_CLOUD",  # LocalStack's "run against real AWS": full snapshot comparison
        AWS_ENDPOINT_URL=url,  # every boto3 client (any service) goes to the gateway
        AWS_ACCESS_KEY_ID=PRIMARY_KEYS[0],
        AWS_SECRET_ACCESS_KEY=PRIMARY_KEYS[1],
        AWS_DEFAULT_REGION=HOME_REGION,
        AWS_CONFIG_FILE=os.devnull,  # nothing from the user's ~/.aws
        AWS_SHARED_CREDENTIALS_FILE=os.devnull,
        VSQS_JUDGE_URL=url,
        VSQS_JUDGE_RESULTS=str(raw_path),
        VSQS_JUDGE_VALIDATED=str(run_dir / "validated.json"),
        PYTHONDONTWRITEBYTECODE="1",
    )
    command = [str(python), "-m", "pytest", "-c", str(tests_root / "pytest.ini"), "--rootdir", str(tests_root),
               "-p", "no:cacheprovider",
               *[arg for plugin in LEFT_OUT_PLUGINS for arg in ("-p", f"no:{plugin}")],
               # a module that does not import must not stop the others
               "--continue-on-collection-errors",
               f"--timeout={args.timeout}", "-q", "-rN", "--tb=long", "--color=no", SQS_TESTS]
    if args.keyword:
        command += ["-k", args.keyword]
    if args.workers > 1:
        command += ["-n", str(args.workers)]
    print(f"running {len(json.loads((run_dir / 'validated.json').read_text()))} validated ids against {url}; "
          f"pytest's output: {run_dir / 'pytest.log'}", file=sys.stderr)
    with open(run_dir / "pytest.log", "w") as log:
        return subprocess.run(command, cwd=tests_root, env=env, stdout=log, stderr=subprocess.STDOUT).returncode


# --- judging ---------------------------------------------------------------------------


def merged_results(run_dir: Path) -> dict | None:
    """The results of every pytest process (one, or xdist's controller and workers):
    a worker's entry, which knows the AWS calls its test made, wins over the controller's."""
    files = sorted(run_dir.glob("raw-results.*.json"), key=lambda p: p.name != "raw-results.main.json")
    if not files:
        return None
    merged: dict = {"collected": [], "tests": {}, "collect_errors": {}}
    for path in files:
        part = json.loads(path.read_text())
        merged["collected"] += part["collected"]
        merged["tests"].update(part["tests"])
        merged["collect_errors"].update(part.get("collect_errors", {}))
    return merged


_OTHER_SERVICE = "needs another AWS service"
_OFF_MACHINE = "reaches for a host off this machine"
_LOOPBACK_HOSTS = {"localhost", "localhost.localdomain", "ip6-localhost", "::1"}


def skip_reason(reason: str) -> str:
    """A skip's reason as text; results of earlier conftests held the report's
    ``(file, line, 'Skipped: why')`` tuple as its text."""
    m = re.fullmatch(r"\('[^']*', \d+, (?P<q>['\"])(?P<why>.*)(?P=q)\)", reason)
    return (m.group("why") if m else reason).removeprefix("Skipped: ")


def judge(raw: dict, validated: set[str], keyword: str | None) -> dict:
    tests = raw["tests"]
    collected = set(raw["collected"])  # after -k
    # a validated test of a module that did not import is judged, failed: the harness is at fault
    broken = {nodeid: f"harness: {module} did not import: {why}"
              for nodeid in validated - collected
              for module, why in raw.get("collect_errors", {}).items() if nodeid.startswith(module + "::")}
    judged = {}
    skipped = {}  # skipped by the test itself (LocalStack's own skips): not judged
    for nodeid in sorted(validated & collected | broken.keys()):
        entry = dict(tests.get(nodeid) or {"outcome": "failed", "phase": "", "seconds": 0.0, "detail": "",
                                          "reason": broken.get(nodeid, "no result: pytest ended before it ran")})
        if entry["outcome"] == "skipped":
            skipped[nodeid] = skip_reason(entry["reason"])
            continue
        entry["cause"] = cause(entry) if entry["outcome"] != "passed" else ""
        judged[nodeid] = entry
    passed = sum(1 for e in judged.values() if e["outcome"] == "passed")
    by_cause = collections.Counter(e["cause"] for e in judged.values() if e["outcome"] != "passed")
    return {
        "judged": len(judged),
        "passed": passed,
        "failed": len(judged) - passed,
        "skipped": skipped,
        "keyword": keyword,
        "causes": dict(by_cause.most_common()),
        # listed as validated but no such test in the checkout (renamed, removed) or left out by -k
        "validated_not_collected": sorted(validated - collected - broken.keys()) if not keyword else [],
        "collect_errors": raw.get("collect_errors", {}),
        "tests": judged,
    }


def cause(entry: dict) -> str:
    """A coarse group for a failure, for the summary: what kind of difference it is."""
    others = [s for s in entry.get("services", []) if not s.startswith("sqs")]
    if others:
        return f"{_OTHER_SERVICE} ({', '.join(others)})"
    reason = entry["reason"]
    if reason.startswith("harness: "):
        return reason.split(" did not import")[0] + " did not import"
    if entry["outcome"] == "skipped":
        return "skipped by the test itself"
    if reaches_off_machine(entry):
        return _OFF_MACHINE
    if reason.startswith("Failed: Timeout"):  # pytest-timeout's
        return "test timed out"
    if reason.startswith(("No state for", "State for key=")) or "recorded. Please (re-)generate" in reason:
        return "harness: no recorded AWS answer for this key"
    m = re.match(r"snapshot \S+: \((?P<kind>[~+-])\) (?P<path>\S+)", reason)
    if m:
        path = re.sub(r"/\[\d+\]", "/[]", m.group("path"))
        kind = {"~": "differs", "-": "missing", "+": "extra"}[m.group("kind")]
        return f"snapshot: {path} {kind}"
    if reason.startswith("snapshot"):
        return "snapshot: differs"
    m = re.search(r"An error occurred \((?P<code>[^)]+)\) when calling the (?P<op>\w+) operation", reason)
    if m:
        return f"unexpected error {m.group('code')} from {m.group('op')}"
    if reason.startswith("Failed: DID NOT RAISE"):
        return "no error where AWS gives one"
    if reason.startswith(("AssertionError", "assert ")):
        return "an assertion of the test"
    return reason.split(":")[0][:60]


def reaches_off_machine(entry: dict) -> bool:
    """Whether the test reached for a host other than loopback: the conftest records the
    hosts it refused; else the refusal's text, or a connection error naming such a host
    (requests: ``HTTPSConnectionPool(host='queue.amazonaws.com', ...)``)."""
    if entry.get("off_machine_hosts"):
        return True
    reason = entry["reason"]
    if "not loopback" in reason:
        return True
    m = re.search(r"ConnectionError: \w+ConnectionPool\(host='(?P<host>[^']+)'", reason)
    return bool(m) and m.group("host") not in _LOOPBACK_HOSTS and not m.group("host").startswith("127.")


def print_report(result: dict, json_path: Path, run_dir: Path) -> None:
    failing = {k: v for k, v in result["tests"].items() if v["outcome"] != "passed"}
    if failing:
        print(f"\nfailing ({len(failing)}):")
        for nodeid, entry in failing.items():
            short = nodeid.removeprefix(SQS_TESTS + "/")
            print(f"  {short}\n      {entry['reason']}")
    if result.get("skipped"):
        print(f"\nskipped by the test itself, not judged ({len(result['skipped'])}):")
        for nodeid, why in result["skipped"].items():
            print(f"  {nodeid.removeprefix(SQS_TESTS + '/')}\n      {why}")
    print("\nby cause:")
    for name, count in result["causes"].items():
        print(f"  {count:4d}  {name}")
    for module, why in result["collect_errors"].items():
        print(f"\nHARNESS: {module} did not import ({why}); its validated tests count as failed")
    if result["validated_not_collected"]:
        print(f"\n{len(result['validated_not_collected'])} validated ids name no collected test "
              "(not judged; listed in the JSON)")
    aws = f" (the same tests took {result['aws_seconds']} s against AWS)" if result["aws_seconds"] else ""
    print(f"\nwall time {result['wall_seconds']} s{aws}; JSON: {json_path}; logs: {run_dir}")
    skipped = f"; {len(result['skipped'])} skipped by the test itself, not judged" if result.get("skipped") else ""
    print(f"judged: {result['passed']} passed, {result['failed']} failed{skipped}")
    print(f"{result['passed']} / {result['judged']} passed")


# --- the self-check suite --------------------------------------------------------------
#
# A few tests in LocalStack's form (its fixtures, markers, snapshot and validation
# files), written by this script, each with a known verdict. The harness is sound on
# this machine when the verdicts come out as expected.

_SELF_CHECK_CONFTEST = '''
import pytest

pytest_plugins = [
    "localstack.testing.pytest.fixtures",
    "localstack_snapshot.pytest.snapshot",
    "localstack.testing.pytest.marking",
    "localstack.testing.pytest.in_memory_localstack",
    "localstack.testing.pytest.validation_tracking",
    # LocalStack's own list has it; the harness must leave it out (the judging conftest overrides fixtures)
    "localstack.testing.pytest.fixture_conflicts",
]


@pytest.fixture(scope="session")
def aws_session():
    from localstack.testing.aws.util import base_aws_session
    return base_aws_session()


@pytest.fixture(scope="session")
def aws_client_factory(aws_session):
    from localstack.testing.aws.util import base_aws_client_factory
    return base_aws_client_factory(aws_session)


@pytest.fixture(scope="session")
def aws_client(aws_client_factory):
    from localstack.testing.aws.util import base_testing_aws_client
    return base_testing_aws_client(aws_client_factory)


@pytest.fixture(scope="session")
def secondary_aws_client():
    from localstack.testing.aws.util import base_aws_client_factory, base_testing_aws_client, secondary_aws_session
    return base_testing_aws_client(base_aws_client_factory(secondary_aws_session()))


@pytest.fixture(scope="function")
def snapshot(_snapshot_session, account_id, region_name):
    from localstack_snapshot.snapshots.transformer import RegexTransformer
    from localstack.testing.snapshots.transformer_utility import SNAPSHOT_BASIC_TRANSFORMER, TransformerUtility
    _snapshot_session.transform = TransformerUtility
    _snapshot_session.add_transformer(RegexTransformer(account_id, "1" * 12), priority=2)
    _snapshot_session.add_transformer(RegexTransformer(region_name, "<region>"), priority=2)
    _snapshot_session.add_transformer(SNAPSHOT_BASIC_TRANSFORMER, priority=2)
    return _snapshot_session
'''

_SELF_CHECK_TESTS = '''
import pytest
from botocore.exceptions import ClientError

from localstack.testing.pytest import markers
from localstack.utils.strings import short_uid


@pytest.fixture(autouse=True)
def sqs_snapshot_transformer(snapshot):
    snapshot.add_transformer(snapshot.transform.sqs_api())


@pytest.fixture(params=["sqs", "sqs_query"])
def aws_sqs_client(aws_client, request):
    yield getattr(aws_client, request.param)


class TestSelfCheck:
    @markers.aws.validated
    def test_queue_attributes_match(self, sqs_create_queue, aws_sqs_client, snapshot):
        # passes: the recorded answer is what Amazon SQS gives, after the transformers
        url = sqs_create_queue(QueueName=f"judge-check-{short_uid()}")
        attributes = aws_sqs_client.get_queue_attributes(
            QueueUrl=url, AttributeNames=["VisibilityTimeout", "QueueArn"])
        snapshot.match("attributes", attributes)

    @markers.aws.validated
    @markers.snapshot.skip_snapshot_verify(paths=["$..Attributes.VisibilityTimeout"])
    def test_waiver_is_not_honoured(self, sqs_create_queue, aws_sqs_client, snapshot):
        # fails: the recorded answer says 31 and LocalStack's waiver would hide that
        url = sqs_create_queue(QueueName=f"judge-check-{short_uid()}")
        attributes = aws_sqs_client.get_queue_attributes(QueueUrl=url, AttributeNames=["VisibilityTimeout"])
        snapshot.match("attributes", attributes)

    @markers.aws.validated
    def test_missing_queue_error(self, aws_sqs_client, snapshot):
        # passes: the error Amazon SQS gives for a queue that does not exist
        with pytest.raises(ClientError) as e:
            aws_sqs_client.get_queue_url(QueueName="judge-check-no-such-queue")
        snapshot.match("error", e.value.response["Error"])

    @markers.aws.validated
    def test_caller_identity(self, aws_client, secondary_aws_client):
        # passes: the harness answers STS GetCallerIdentity for the gateway's account
        assert aws_client.sts.get_caller_identity()["Account"] == "000000000000"
        assert secondary_aws_client.sts.get_caller_identity()["Account"] == "000000000002"

    @markers.aws.validated
    def test_reaches_other_service(self, aws_client):
        # fails: the gateway serves SQS only
        aws_client.sns.list_topics()

    @markers.aws.validated
    def test_skips_itself(self, aws_client):
        # not judged: skipped by the test itself, its reason reported as text
        pytest.skip("only by hand")

    @markers.aws.validated
    def test_reaches_off_machine(self, aws_client):
        # fails, grouped as reaching off this machine: a presigned URL of Amazon's own endpoint
        import requests
        requests.get("https://queue.amazonaws.com/?Action=ListQueues", timeout=5)

    @markers.aws.validated
    def test_not_in_validation_file(self, aws_client):
        # not judged: absent from the validation file
        raise AssertionError("a test that is not AWS-validated ran")
'''

_SELF_CHECK_NODE = SQS_TESTS + "/test_self_check.py::TestSelfCheck::"


def _self_check_snapshots() -> dict:
    def attrs(visibility: str, arn: bool) -> dict:
        got = {"VisibilityTimeout": visibility}
        if arn:
            got["QueueArn"] = "arn:aws:sqs:<region>:111111111111:<resource:1>"
        return {"Attributes": got, "ResponseMetadata": {"HTTPHeaders": {}, "HTTPStatusCode": 200}}

    error = {"Code": "AWS.SimpleQueueService.NonExistentQueue", "Message": "The specified queue does not exist.",
             "QueryErrorCode": "QueueDoesNotExist", "Type": "Sender"}
    out = {}
    for protocol in ("sqs", "sqs_query"):
        the_error = dict(error)
        if protocol == "sqs_query":  # Query: no QueryErrorCode, Amazon's <Detail/> and its Query text
            # (as LocalStack recorded it from AWS: queue-does-not-exist-query in test_sqs.snapshot.json)
            the_error = {"Code": "AWS.SimpleQueueService.NonExistentQueue", "Detail": None,
                         "Message": "The specified queue does not exist for this wsdl version.", "Type": "Sender"}
        for name, content in (("test_queue_attributes_match", {"attributes": attrs("30", True)}),
                              ("test_waiver_is_not_honoured", {"attributes": attrs("31", False)}),
                              ("test_missing_queue_error", {"error": the_error})):
            out[f"{_SELF_CHECK_NODE}{name}[{protocol}]"] = {"recorded-date": "28-11-2026, 12:00:00",
                                                            "recorded-content": content}
    return out


SELF_CHECK_EXPECTED = {
    **{f"{_SELF_CHECK_NODE}{name}[{p}]": verdict for p in ("sqs", "sqs_query")
       for name, verdict in (("test_queue_attributes_match", "passed"), ("test_waiver_is_not_honoured", "failed"),
                             ("test_missing_queue_error", "passed"))},
    f"{_SELF_CHECK_NODE}test_caller_identity": "passed",
    f"{_SELF_CHECK_NODE}test_reaches_other_service": "failed",
    f"{_SELF_CHECK_NODE}test_reaches_off_machine": "failed",
}
# validated, skipped by the test itself: listed with its reason, not judged
SELF_CHECK_SKIPPED = {f"{_SELF_CHECK_NODE}test_skips_itself": "only by hand"}
SELF_CHECK_CAUSES = {f"{_SELF_CHECK_NODE}test_reaches_off_machine": _OFF_MACHINE,
                     f"{_SELF_CHECK_NODE}test_reaches_other_service": f"{_OTHER_SERVICE} (sns)"}


def write_self_check_suite(root: Path) -> None:
    sqs = root / SQS_TESTS
    sqs.mkdir(parents=True)
    for package in ("tests", "tests/aws", "tests/aws/services", SQS_TESTS):
        (root / package / "__init__.py").write_text("")
    (root / "tests/conftest.py").write_text(_SELF_CHECK_CONFTEST)
    (sqs / "test_self_check.py").write_text(_SELF_CHECK_TESTS)
    (sqs / "test_self_check.snapshot.json").write_text(json.dumps(_self_check_snapshots(), indent=2))
    validated = {nodeid: {"last_validated_date": "2026-11-28T12:00:00+00:00", "durations_in_seconds": {"total": 0.5}}
                 for nodeid in [*SELF_CHECK_EXPECTED, *SELF_CHECK_SKIPPED]}
    (sqs / "test_self_check.validation.json").write_text(json.dumps(validated, indent=2))


def check_self_check(result: dict) -> int:
    got = {nodeid: entry["outcome"] for nodeid, entry in result["tests"].items()}
    wrong = {k: (v, got.get(k)) for k, v in SELF_CHECK_EXPECTED.items() if got.get(k) != v}
    wrong.update({k: (None, v) for k, v in got.items() if k not in SELF_CHECK_EXPECTED})
    wrong.update({k: (f"skipped: {v}", result["skipped"].get(k)) for k, v in SELF_CHECK_SKIPPED.items()
                  if result["skipped"].get(k) != v})
    wrong.update({k: (f"cause: {v}", result["tests"].get(k, {}).get("cause")) for k, v in SELF_CHECK_CAUSES.items()
                  if result["tests"].get(k, {}).get("cause") != v})
    if wrong:
        print("\nself-check: the harness is NOT sound here:", file=sys.stderr)
        for nodeid, (expected, actual) in wrong.items():
            print(f"  {nodeid}: expected {expected}, got {actual}", file=sys.stderr)
        return 1
    print("\nself-check: every verdict as expected (the waiver did not hide its difference; the unvalidated "
          "test was not judged; the test that skips itself was listed, not judged; fixture_conflicts was left out; "
          "the hosts off this machine were refused)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
