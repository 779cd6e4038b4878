#!/bin/sh
# The whole test suite on a fresh machine: installs what it needs, then runs pytest (extra args passed on).
set -eu
cd "$(dirname "$0")/.."
# the multi-host tests run real sshd in network namespaces (as root), and pyinfra's --sudo uploads need sudo:
# install OpenSSH's server and sudo if missing
if [ "$(id -u)" = 0 ] && { [ ! -x /usr/sbin/sshd ] || ! command -v sudo >/dev/null 2>&1; } &&
        command -v apt-get >/dev/null 2>&1; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q openssh-server iproute2 sudo >/dev/null ||
        { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q openssh-server iproute2 sudo >/dev/null; } ||
        echo "test.sh: could not install openssh-server/sudo: the multi-host tests will be skipped" >&2
fi
. scripts/venv.sh
# a real SGLang 0.5.23 in .venv-sglang for tests/test_real_sglang.py (skipped when already built, or when
# SPECOPS_SGLANG_PYTHON names one). If it cannot be built the suite still runs: the reason is left in
# .venv-sglang.failed and those tests fail with it.
if [ -z "${SPECOPS_SGLANG_PYTHON:-}" ]; then
    sh scripts/sglang_venv.sh ||
        echo "test.sh: .venv-sglang could not be built (see .venv-sglang.failed): tests/test_real_sglang.py will fail" >&2
fi
exec "$PY" -m pytest "$@"
