"""A process that holds GPU memory, as a CUDA job or daemon would.

``gpusim hold`` double-forks a detached *watcher* (the simulated driver's view of this context) which forks the
holder in its own session and process group, books its memory in the ledger, and when the holder dies records the
moment, so the memory is freed only after the release delay. The holder is exec'd with ``argv[0]`` and ``comm``
set to the requested name (e.g. ``nvidia-persistenced``), so ``/proc`` shows it as that program.
"""
from __future__ import annotations

import ctypes
import json
import os
import pwd
import signal
import sys
from pathlib import Path

from . import ledger

TERM_MODES = ("exit", "ignore")


def set_comm(name: str) -> None:
    """Set /proc/self/comm (what ps and fuser show) via prctl(PR_SET_NAME)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(15, ctypes.c_char_p(name.encode()[:15]), 0, 0, 0)


def _write_line(fd: int, obj: dict) -> None:
    os.write(fd, (json.dumps(obj) + "\n").encode())


def hold(root: Path, mib_by_gpu: dict[int, int], *, name: str = "python3", on_term: str = "exit",
         user: str | None = None, stuck: bool = False, release_delay_s: float | None = None) -> dict:
    """Start a detached memory holder; returns {"pid", "watcher", "pgid"} once it is running."""
    if on_term not in TERM_MODES:
        raise ValueError(f"on_term must be one of {TERM_MODES}")
    if user is not None:
        pwd.getpwnam(user)  # fail here, not in the detached child
        if os.geteuid() != 0:
            raise PermissionError("holding memory as another user needs root")
    ledger.load_host(root)
    r, w = os.pipe()
    mid = os.fork()
    if mid == 0:  # intermediate: detach, so the watcher is nobody's child in the caller's session
        os.close(r)
        try:
            os.setsid()
            if os.fork() == 0:
                _watch(root, w, mib_by_gpu, name, on_term, user, stuck, release_delay_s)
        finally:
            os._exit(0)
    os.close(w)
    os.waitpid(mid, 0)
    with os.fdopen(r) as fh:
        lines = [json.loads(line) for line in fh if line.strip()]
    merged: dict = {}
    for line in lines:
        merged.update(line)
    if "error" in merged or "pid" not in merged:
        raise ledger.OutOfMemory(merged.get("error", "holder failed to start")) if merged.get("oom") \
            else RuntimeError(merged.get("error", "holder failed to start"))
    return merged


def _watch(root, w, mib_by_gpu, name, on_term, user, stuck, release_delay_s) -> None:
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):  # never keep the caller's pipes open
        os.dup2(devnull, fd)
    set_comm("gpusim-driver")
    go_r, go_w = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(go_w)
        os.setsid()
        if os.read(go_r, 1) != b"g":
            os._exit(1)
        env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent))
        argv = [name, "-m", "gpusim.holder", "--ready-fd", str(w), "--on-term", on_term, "--comm", name]
        if user:
            argv += ["--user", user]
        os.set_inheritable(w, True)
        os.execve(sys.executable, argv, env)
    os.close(go_r)
    _write_line(w, {"watcher": os.getpid(), "pgid": child})
    try:
        path = ledger.allocate(root, child, mib_by_gpu, name, stuck=stuck, release_delay_s=release_delay_s)
    except Exception as exc:  # noqa: BLE001 - reported to the caller, then the child is discarded
        _write_line(w, {"error": str(exc), "oom": isinstance(exc, ledger.OutOfMemory)})
        os.close(go_w)
        os.waitpid(child, 0)
        os._exit(1)
    os.write(go_w, b"g")
    os.close(go_w)
    os.close(w)
    os.waitpid(child, 0)
    ledger.release_after_death(root, path)
    os._exit(0)


def main(argv: list[str]) -> None:
    import argparse

    p = argparse.ArgumentParser(prog="gpusim.holder")
    p.add_argument("--ready-fd", type=int, required=True)
    p.add_argument("--on-term", choices=TERM_MODES, default="exit")
    p.add_argument("--comm", default="python3")
    p.add_argument("--user")
    a = p.parse_args(argv)
    set_comm(a.comm)
    if a.on_term == "ignore":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if a.user:
        pw = pwd.getpwnam(a.user)
        os.setgroups([])
        os.setgid(pw.pw_gid)
        os.setuid(pw.pw_uid)
    _write_line(a.ready_fd, {"pid": os.getpid()})
    os.close(a.ready_fd)
    while True:
        signal.pause()


if __name__ == "__main__":
    main(sys.argv[1:])
