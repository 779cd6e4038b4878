#!/bin/sh
# The whole test suite on a fresh machine: installs what it needs, then runs pytest (extra args passed on).
set -eu
cd "$(dirname "$0")/.."
. scripts/venv.sh
exec "$PY" -m pytest "$@"
