# Sourced by scripts/test after _venv.sh: the console's browser tests
# (tests/console) drive Debian's Chromium through Playwright. Where they are
# required (BROWSER_REQUIRED=1, set by .ci/run) and we are root, a missing
# Chromium is installed with apt-get; elsewhere we only say they will skip.
# (Never `playwright install`: it downloads a browser build of its own.)
browser_found() {
    if [ -n "${VSQS_BROWSER:-}" ]; then return 0; fi
    local name
    for name in chromium chromium-browser google-chrome google-chrome-stable; do
        if command -v "$name" > /dev/null 2>&1; then return 0; fi
    done
    return 1
}
if ! browser_found; then
    if [ "${BROWSER_REQUIRED:-}" = 1 ] && [ "$(id -u)" = 0 ] && command -v apt-get > /dev/null 2>&1; then
        echo "installing Debian's chromium for the browser tests (apt-get; the whole log goes to .venv/apt-chromium.log)" >&2
        export DEBIAN_FRONTEND=noninteractive
        # Progress: one line per package fetched and set up, so a slow mirror is visible.
        if ! { apt-get update -q &&
               apt-get install -y -q --no-install-recommends chromium fonts-liberation fonts-dejavu-core; } 2>&1 |
                tee .venv/apt-chromium.log | awk '/^(Get:|Setting up |E: )/ { print "  " $0; fflush() }' >&2; then
            tail -n 30 .venv/apt-chromium.log >&2
            echo "apt-get install chromium failed; the whole log is in .venv/apt-chromium.log" >&2
            exit 1
        fi
        echo "chromium installed: $(command -v chromium)" >&2
    else
        echo "no Chromium on PATH: the browser tests (tests/console) will skip (apt-get install chromium)" >&2
    fi
fi
