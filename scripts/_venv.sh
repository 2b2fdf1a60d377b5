# Sourced by scripts/demo and scripts/test: make .venv if missing and install
# the project into it with the extras named in $VSQS_EXTRAS (again whenever
# setup.cfg changes). pip's whole output goes to .venv/install.log; a line
# per package it fetches or builds is shown, so a cold install is not silent.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
python="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    echo "creating .venv with $("$python" --version) (and pip in it)" >&2
    "$python" -m venv .venv
fi

# pip's output, whole, to the log; its progress (one line a package) to stderr
_vsqs_pip() {
    .venv/bin/python -m pip --disable-pip-version-check "$@" 2>&1 |
        while IFS= read -r line; do
            printf '%s\n' "$line" >> .venv/install.log
            case "$line" in
                Collecting*|Downloading*|Building*|Installing*|Successfully*)
                    printf '  %s\n' "${line:0:100}" >&2 ;;
            esac
        done
    return "${PIPESTATUS[0]}"
}

stamp=".venv/.vsqs-installed-${VSQS_EXTRAS//,/-}"
if [ ! -f "$stamp" ] || [ setup.cfg -nt "$stamp" ]; then
    echo "installing vsqs[$VSQS_EXTRAS] into .venv (the first time takes a minute or two; pyspark is 300 MB)" >&2
    : > .venv/install.log
    if ! { _vsqs_pip install --progress-bar off --upgrade pip &&
           _vsqs_pip install --progress-bar off -e ".[$VSQS_EXTRAS]"; }; then
        tail -n 40 .venv/install.log >&2
        echo "pip install failed; the whole log is in .venv/install.log" >&2
        exit 1
    fi
    echo "installed; pip's whole output is in .venv/install.log" >&2
    touch "$stamp"
fi
# The project's bytecode, as an installed wheel has it: an editable install's is
# written on first import, except where PYTHONDONTWRITEBYTECODE is set (as on
# some CI machines), and then every process that imports vsqs compiles it again
# (each Python worker Spark starts, each test's subprocess: 0.15 s of CPU each).
# Up-to-date files are skipped; a stale one is only ignored by Python. Only a
# saving: a file that cannot be compiled (or written) here fails nothing.
.venv/bin/python -m compileall -q vsqs pyspark_vsqs.py > /dev/null 2>&1 || :
export PATH="$root/.venv/bin:$PATH"
