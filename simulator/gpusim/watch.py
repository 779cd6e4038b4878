"""The simulated driver's view of any process that books memory itself (e.g. the SGLang stand-in).

``watch(root, pid)`` detaches a watcher that waits for ``pid`` to exit (pidfd, no polling), records the moment in
the process's ledger entry and frees it after the release delay.
"""
from __future__ import annotations

import os
import select

from . import ledger
from .holder import set_comm


def watch(root: str, pid: int) -> int:
    """Start the watcher; returns its PID. Call before the process allocates (its entry is found at exit)."""
    start = ledger.proc_start_time(pid)
    r, w = os.pipe()
    mid = os.fork()
    if mid:
        os.close(w)
        os.waitpid(mid, 0)
        with os.fdopen(r) as fh:
            return int(fh.read() or 0)
    os.close(r)
    try:
        os.setsid()
        if os.fork():
            os._exit(0)
        set_comm("gpusim-driver")
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        fd = os.pidfd_open(pid)
        os.write(w, str(os.getpid()).encode())
        os.close(w)
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        poller.poll()
        ledger.release_after_death(root, os.path.join(root, "ledger", f"{pid}-{start}.json"))
    finally:
        os._exit(0)
