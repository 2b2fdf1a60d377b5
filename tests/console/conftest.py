"""Fixtures of the console's browser tests: a headless Chromium (Debian's,
driven by Playwright), a real ``vsqs serve`` on a temporary spool, a page
on it, and screenshots kept as test artefacts.

Without Playwright or a Chromium the tests skip, saying which is missing;
``BROWSER_REQUIRED=1`` (set by .ci/run) turns that skip into a failure, so a
broken set-up cannot hide in CI.

Screenshots go to ``artifacts/console/`` at the top of the checkout
(ignored by git; ``$VSQS_ARTIFACTS`` names another directory), one PNG per
page a test looked at, named after the test, plus one of the page a test
failed on.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import vsqs
from tests.console.browser import LAUNCH_ARGS, find_browser, required
from tests.gateway.server import Server, running_gateway

ROOT = Path(__file__).resolve().parents[2]
VIEWPORT = {"width": 1280, "height": 800}  # the size the issue asks the console to be readable at
NARROW_VIEWPORT = {"width": 390, "height": 844}  # a phone
TIMEOUT_MS = 30_000  # a deadline for what the page must come to show, never a timing to assert
API_KEY = "console-test-key-0123456789"

Shoot = Callable[..., Path]


def _unavailable(reason: str) -> None:
    if required():
        pytest.fail("browser required (BROWSER_REQUIRED=1) but unavailable: " + reason)
    pytest.skip("browser tests need Playwright and a Chromium: " + reason)


@pytest.fixture(scope="session")
def artifacts() -> Path:
    """The directory of this run's screenshots, emptied at the start of the run."""
    base = Path(os.environ.get("VSQS_ARTIFACTS") or ROOT / "artifacts")
    directory = base / "console"
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    return directory


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One headless Chromium per test module (each test gets its own context:
    no shared cookies). Not one per session: while Playwright's sync API is
    started, its event loop counts as running in this thread, and a later
    test's ``asyncio.run()`` would fail."""
    try:
        from playwright.sync_api import Error as PlaywrightError
        from playwright.sync_api import expect, sync_playwright
    except ImportError:
        _unavailable("Playwright for Python is not installed (pip install -e '.[test]')")
    executable = find_browser()
    if executable is None:
        _unavailable("no Chromium on PATH (apt-get install chromium, or set VSQS_BROWSER)")
    expect.set_options(timeout=TIMEOUT_MS)
    with sync_playwright() as playwright:
        try:
            launched = playwright.chromium.launch(executable_path=executable, headless=True, args=list(LAUNCH_ARGS))
        except PlaywrightError as exc:
            _unavailable(f"{executable} did not start: {str(exc).splitlines()[0]}")
        yield launched
        launched.close()


def _spool(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A fresh spool one level down in a directory of its own."""
    path = tmp_path_factory.mktemp("console") / "spool"
    vsqs.Spool(path, create=True)
    return str(path)


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A ``vsqs serve`` with no API key (the loopback default) on a spool of its own."""
    spool = _spool(tmp_path_factory)
    with running_gateway(spool, "--gc-interval", "0", log_dir=str(Path(spool).parent)) as server:
        yield server


@pytest.fixture(scope="module")
def keyed_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A ``vsqs serve`` with an API key: the console asks to sign in."""
    spool = _spool(tmp_path_factory)
    with running_gateway(spool, "--gc-interval", "0", env={"VSQS_API_KEY": API_KEY},
                         log_dir=str(Path(spool).parent)) as server:
        yield server


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Keep each phase's report on the test, so the page fixture knows a test failed."""
    outcome = yield
    report = outcome.get_result()
    setattr(item, "report_" + report.when, report)


def _file_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-")[:120]


@pytest.fixture
def shoot(artifacts: Path, request: pytest.FixtureRequest) -> Shoot:
    """``shoot(page, "label")`` saves a full-page screenshot as
    ``artifacts/console/TEST--label.png`` and returns its path."""

    def save(page: Any, label: str) -> Path:
        path = artifacts / f"{_file_name(request.node.name)}--{_file_name(label)}.png"
        page.screenshot(path=str(path), full_page=True)
        return path

    return save


def _page(browser: Any, server: Server, request: pytest.FixtureRequest, shoot: Shoot,
          viewport: dict[str, int]) -> Iterator[Any]:
    """A page in a fresh browser context (no cookies) on ``server``; fails
    the test on any script error in the page, and screenshots a failure."""
    context = browser.new_context(base_url=server.url, viewport=viewport)
    context.set_default_timeout(TIMEOUT_MS)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    try:
        yield page
        report = getattr(request.node, "report_call", None)
        if report is not None and report.failed and not page.is_closed():
            shoot(page, "failed")
        assert not errors, f"script errors in the page: {errors}"
    finally:
        context.close()


@pytest.fixture
def page(browser: Any, gateway: Server, request: pytest.FixtureRequest, shoot: Shoot) -> Iterator[Any]:
    """A 1280x800 page on the key-less gateway."""
    yield from _page(browser, gateway, request, shoot, VIEWPORT)


@pytest.fixture
def narrow_page(browser: Any, gateway: Server, request: pytest.FixtureRequest, shoot: Shoot) -> Iterator[Any]:
    """A phone-sized page on the key-less gateway."""
    yield from _page(browser, gateway, request, shoot, NARROW_VIEWPORT)


@pytest.fixture
def keyed_page(browser: Any, keyed_gateway: Server, request: pytest.FixtureRequest, shoot: Shoot) -> Iterator[Any]:
    """A 1280x800 page on the gateway that has an API key (not signed in)."""
    yield from _page(browser, keyed_gateway, request, shoot, VIEWPORT)
