#!/bin/sh
# Builds .venv-sglang: a real SGLang 0.5.23 (CPU-usable) that the real-SGLang tests run specops against
# (tests/test_real_sglang.py; they find it as $SPECOPS_SGLANG_PYTHON, else .venv-sglang/bin/python).
#
# Idempotent: skipped when .venv-sglang/.specops-requirements.sha256 holds the sha256 of the requirements file and
# the interpreter still has sglang 0.5.23. On failure it exits 1, prints the reason and leaves it in
# .venv-sglang.failed (the tests quote that file); a success removes that file.
# Base interpreter: $SPECOPS_SGLANG_BASE_PYTHON, else python3.11, else python3 (must be CPython 3.11: the sglang
# wheel is cp311).
set -u
cd "$(dirname "$0")/.."
REQ=requirements/sglang-0.5.23-cpu.txt
VENV=.venv-sglang
MARKER=$VENV/.specops-requirements.sha256
FAILED=.venv-sglang.failed
LOG=$VENV.log

fail() {
    {
        echo "scripts/sglang_venv.sh: building $VENV failed: $1"
        if [ -s "$LOG" ]; then
            echo "--- last lines of $LOG:"
            grep -v "is ignored: it is neither a file nor a directory" "$LOG" | tail -n 25
        fi
    } >"$FAILED"
    cat "$FAILED" >&2
    exit 1
}

: >"$LOG"  # this run's output only
[ -f "$REQ" ] || fail "$REQ is missing"
WANT=$(sha256sum "$REQ" | cut -d' ' -f1) || fail "cannot hash $REQ (sha256sum)"

quick_probe() {  # the marked venv still runs and has sglang 0.5.23 installed (0.1 s; the full probe takes ~8 s)
    "$VENV/bin/python" -c 'import importlib.metadata as m; v = m.version("sglang"); assert v == "0.5.23", v' \
        >>"$LOG" 2>&1
}

probe() {  # the venv's interpreter imports sglang's server-args parser and is 0.5.23
    "$VENV/bin/python" -c 'import sglang, sglang.srt.server_args
assert sglang.__version__ == "0.5.23", sglang.__version__' >>"$LOG" 2>&1
}

if [ -x "$VENV/bin/python" ] && [ -f "$MARKER" ] && [ "$(cat "$MARKER")" = "$WANT" ]; then
    if quick_probe; then
        rm -f "$FAILED" "$LOG"
        echo "scripts/sglang_venv.sh: $VENV is up to date ($REQ sha256 ${WANT%"${WANT#????????????}"})"
        exit 0
    fi
    echo "scripts/sglang_venv.sh: $VENV has the right marker but no sglang 0.5.23: rebuilding" >&2
fi

BASE=${SPECOPS_SGLANG_BASE_PYTHON:-}
if [ -z "$BASE" ]; then
    for candidate in python3.11 python3; do
        if command -v "$candidate" >/dev/null 2>&1; then BASE=$candidate; break; fi
    done
fi
[ -n "$BASE" ] || fail "no python3.11 or python3 on PATH (set SPECOPS_SGLANG_BASE_PYTHON)"
VERSION=$("$BASE" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null) ||
    fail "$BASE does not run"
[ "$VERSION" = "3.11" ] ||
    fail "$BASE is Python $VERSION; the sglang 0.5.23 wheel needs CPython 3.11 (set SPECOPS_SGLANG_BASE_PYTHON)"

echo "scripts/sglang_venv.sh: building $VENV from $REQ (a few minutes; log in $LOG)" >&2
START=$(date +%s)
rm -rf "$VENV"
"$BASE" -m venv "$VENV" >>"$LOG" 2>&1 || fail "$BASE -m venv $VENV failed"
"$VENV/bin/python" -m pip install --no-deps --no-input --disable-pip-version-check --progress-bar off \
    --only-binary=:all: -r "$REQ" >>"$LOG" 2>&1 ||
    fail "pip install --no-deps -r $REQ failed (no network or index? a wheel missing for this platform?)"
probe || fail "installed, but '$VENV/bin/python -c \"import sglang.srt.server_args\"' fails (version or import error)"
echo "$WANT" >"$MARKER"
rm -f "$FAILED" "$LOG"
echo "scripts/sglang_venv.sh: built $VENV in $(($(date +%s) - START)) s ($(du -sh "$VENV" | cut -f1))" >&2
