# Sourced by scripts/test: the instruction budget (tests/test_instruction_budget.py)
# counts with Debian's valgrind (callgrind). Where it is required
# (INSTRUCTIONS_REQUIRED=1, set by .ci/run) and we are root, a missing valgrind
# is installed with apt-get; elsewhere we only say the budget test will skip.
if ! command -v valgrind > /dev/null 2>&1; then
    if [ "${INSTRUCTIONS_REQUIRED:-}" = 1 ] && [ "$(id -u)" = 0 ] && command -v apt-get > /dev/null 2>&1; then
        echo "installing Debian's valgrind for the instruction budget (apt-get; the log goes to .venv/apt-valgrind.log)" >&2
        export DEBIAN_FRONTEND=noninteractive
        if ! { apt-get update -q && apt-get install -y -q --no-install-recommends valgrind; } \
                > .venv/apt-valgrind.log 2>&1; then
            tail -n 30 .venv/apt-valgrind.log >&2
            echo "apt-get install valgrind failed; the whole log is in .venv/apt-valgrind.log" >&2
            exit 1
        fi
    elif [ "${INSTRUCTIONS_REQUIRED:-}" = 1 ]; then
        echo "no valgrind on PATH, and not root with apt-get to install it: the instruction budget test will fail" >&2
    else
        echo "no valgrind on PATH: the instruction budget test will skip (apt-get install valgrind)" >&2
    fi
fi
