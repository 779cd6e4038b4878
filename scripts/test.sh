#!/bin/sh
# The whole test suite on a fresh machine: installs what it needs, then runs pytest (extra args passed on).
set -eu
cd "$(dirname "$0")/.."
# the multi-host tests run real sshd in network namespaces (as root): install OpenSSH's server if missing
if [ "$(id -u)" = 0 ] && [ ! -x /usr/sbin/sshd ] && command -v apt-get >/dev/null 2>&1; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q openssh-server iproute2 >/dev/null ||
        { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q openssh-server iproute2 >/dev/null; } ||
        echo "test.sh: could not install openssh-server: the multi-host tests will be skipped" >&2
fi
. scripts/venv.sh
exec "$PY" -m pytest "$@"
