# Sourced by scripts/demo and scripts/test: make .venv if missing and install
# the project into it with the extras named in $VSQS_EXTRAS (again whenever
# setup.cfg changes). pip's chatter goes to .venv/install.log.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
python="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    echo "creating .venv with $("$python" --version)" >&2
    "$python" -m venv .venv
fi
stamp=".venv/.vsqs-installed-${VSQS_EXTRAS//,/-}"
if [ ! -f "$stamp" ] || [ setup.cfg -nt "$stamp" ]; then
    echo "installing vsqs[$VSQS_EXTRAS] into .venv (the first time takes a minute or two)" >&2
    if ! { .venv/bin/python -m pip install --upgrade pip &&
           .venv/bin/python -m pip install -e ".[$VSQS_EXTRAS]"; } > .venv/install.log 2>&1; then
        tail -n 40 .venv/install.log >&2
        echo "pip install failed; the whole log is in .venv/install.log" >&2
        exit 1
    fi
    touch "$stamp"
fi
export PATH="$root/.venv/bin:$PATH"
