"""Find and launch the headless Chromium the console tests drive.

The browser is Debian's ``chromium`` package (``apt-get install chromium``;
scripts/test installs it in CI), driven by Playwright for Python through
``executable_path``: ``playwright install``, which downloads a browser build
of its own, is never used (it cannot work without the internet, and the
system package is the one that gets security updates). ``$VSQS_BROWSER``
names another Chromium-family binary.
"""

from __future__ import annotations

import os
import shutil

# What a headless Chromium needs as root on a closed network: no sandbox (root),
# no GPU, and nothing that phones home (QUIC, updates, sync, first-run pages).
# Playwright adds --headless and a fresh temporary --user-data-dir of its own.
LAUNCH_ARGS = (
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)
CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_browser() -> str | None:
    """The Chromium binary to drive: ``$VSQS_BROWSER``, else the first candidate on PATH."""
    named = os.environ.get("VSQS_BROWSER")
    if named:
        return shutil.which(named) or (named if os.access(named, os.X_OK) else None)
    for name in CANDIDATES:
        found = shutil.which(name)
        if found:
            return found
    return None


def required() -> bool:
    """True where a missing browser is a failure, not a skip (.ci/run sets BROWSER_REQUIRED=1)."""
    return os.environ.get("BROWSER_REQUIRED") == "1"
