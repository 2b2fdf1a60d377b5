"""Make the README's screenshot of the web console (docs/console-overview.png).

    .venv/bin/python scripts/console_screenshot.py                 # about a minute
    .venv/bin/python scripts/console_screenshot.py --seconds 300 --out /tmp/overview.png

Starts ``vsqs serve`` on a temporary spool with a few queues at work for
``--seconds`` (orders piling up faster than they are taken, a few dying into
their dead-letter queue, e-mails drained, reports delayed, thumbnails
suspended), sampled every second for the charts, then saves the overview at
1280 pixels wide from Debian's Chromium through Playwright (the browser tests' set-up:
tests/console/browser.py). Needs the ``test`` and ``server`` extras and a
Chromium (``apt-get install chromium``).
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import vsqs
from tests.console.browser import LAUNCH_ARGS, find_browser
from tests.gateway.server import running_gateway


def make_spool(path: str) -> vsqs.Spool:
    spool = vsqs.Spool(path, create=True)
    spool.create_queue("orders.dlq")
    spool.create_queue("orders", dead_letter="orders.dlq", max_receives=1)
    spool.create_queue("emails")
    spool.create_queue("reports")
    spool.create_queue("thumbnails").publish_batch([b"img"] * 240)
    spool.queue("thumbnails").suspend()
    return spool


def work(spool: vsqs.Spool, seconds: float, rng: random.Random) -> None:
    """A minute of traffic, in steps of a tenth of a second."""
    orders, emails, reports = spool.queue("orders"), spool.queue("emails"), spool.queue("reports")
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        orders.publish_batch([b'{"order": %d}' % rng.randrange(10**6)] * rng.randint(2, 5), durable=False)
        for message in orders.receive_batch(rng.randint(1, 3), visibility_timeout=2):
            if rng.random() < 0.05:
                continue  # a poison order: never deleted, dies at its next receive
            message.delete()
        emails.publish_batch([b"hello"] * rng.randint(0, 6), durable=False)
        for message in emails.receive_batch(4, visibility_timeout=60):
            message.delete()
        if rng.random() < 0.2:
            reports.publish(b"monthly report", delay=3600)
        time.sleep(0.1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--out", default=str(ROOT / "docs" / "console-overview.png"))
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    executable = find_browser()
    if executable is None:
        sys.exit("no Chromium on PATH (apt-get install chromium, or set VSQS_BROWSER)")
    with tempfile.TemporaryDirectory() as tmp:
        spool = make_spool(f"{tmp}/spool")
        with running_gateway(spool.root, "--console-interval", "1", "--gc-interval", "0", log_dir=tmp) as server:
            work(spool, args.seconds, random.Random(14))
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=executable, args=list(LAUNCH_ARGS))
                page = browser.new_page(viewport={"width": 1280, "height": 400})  # full_page grows it to fit
                page.goto(server.url + "/ui?sort=ready&desc=1")
                page.wait_for_selector("[data-live-status]:has-text('updated')")
                page.screenshot(path=args.out, full_page=True)  # as tall as the page, no blank below
                browser.close()
    print(f"saved {args.out}")


if __name__ == "__main__":
    main()
