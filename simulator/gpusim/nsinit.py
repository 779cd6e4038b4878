"""PID 1 of one simulated cluster host (run by ``gpusim.cluster`` inside ``unshare --pid --mount --fork``).

    python -m gpusim.nsinit --bind SRC DST [--bind SRC DST ...] --log FILE -- sshd -D -e -f CONFIG

It bind-mounts each SRC onto DST, in order: the host's own simulator directory onto the common path (every host
sees its GPUs at the same path, as real nodes do) and the host's own /etc/passwd (root's home is the host's own,
as on a separate machine), starts sshd, and reaps every orphan (servers started with setsid end up here).
It stays up when sshd is stopped (an sshd outage, not a host crash); SIGTERM ends it, and with it every process
in the host's PID namespace.
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="gpusim.nsinit")
    p.add_argument("--bind", nargs=2, metavar=("SRC", "DST"), action="append", default=[])
    p.add_argument("--log", required=True)
    p.add_argument("command", nargs=argparse.REMAINDER)
    a = p.parse_args(argv)
    command = a.command[1:] if a.command[:1] == ["--"] else a.command
    for src, dst in a.bind:
        subprocess.run(["mount", "--bind", src, dst], check=True)
    os.makedirs("/run/sshd", exist_ok=True)  # sshd's privilege-separation directory
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    signal.signal(signal.SIGCHLD, lambda *_: None)  # so pause() wakes when an orphan arrives
    with open(a.log, "ab", buffering=0) as log:
        subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    while True:
        try:
            os.wait()
        except ChildProcessError:  # nothing left to reap: wait for the next orphan
            signal.pause()
        except InterruptedError:
            continue


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
