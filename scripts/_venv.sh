# Sourced by scripts/demo and scripts/test: make .venv if missing and install
# the project into it with the extras named in $VSQS_EXTRAS.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
python="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    "$python" -m venv .venv
fi
stamp=".venv/.vsqs-installed-$VSQS_EXTRAS"
if [ ! -f "$stamp" ] || [ setup.cfg -nt "$stamp" ]; then
    .venv/bin/python -m pip install --quiet --upgrade pip
    .venv/bin/python -m pip install --quiet -e ".[$VSQS_EXTRAS]"
    touch "$stamp"
fi
export PATH="$root/.venv/bin:$PATH"
