"""A process that holds GPU memory, as a CUDA job or daemon would.

``gpusim hold`` double-forks a detached *watcher* (the simulated driver's view of this context) which forks the
holder in its own session and process group, books its memory in the ledger, and when the holder dies records the
moment, so the memory is freed only after the release delay. The holder is exec'd with ``argv[0]`` and ``comm``
set to the requested name (e.g. ``nvidia-persistenced``), so ``/proc`` shows it as that program.

Like a CUDA process, the holder keeps DIR/dev/nvidiactl, nvidia-uvm and nvidia<i> of its GPUs open for its lifetime
(unless ``device_fds=False``). Faults it can model: ``report_pid`` (the driver lists the allocation under another
PID, as seen from a container without the host PID namespace) and ``pin_child`` (a descendant in its own session
inherits the device files and sleeps: the driver lists only the holder, and the memory stays allocated, unlisted,
until that descendant dies too).

The holder reports to its watcher (its PID, its pinning child's PID and start time); the watcher records the child
in the ledger and only then passes the report on, so the caller never learns a PID before the ledger knows it.
"""
from __future__ import annotations

import ctypes
import json
import os
import pwd
import select
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
         user: str | None = None, stuck: bool = False, release_delay_s: float | None = None,
         device_fds: bool = True, report_pid: int | None = None, pin_child: bool = False) -> dict:
    """Start a detached memory holder; returns {"pid", "watcher", "pgid"} once it is running, with "pin_pid" and
    "pin_start" (the unlisted child keeping the memory) when ``pin_child``."""
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
                _watch(root, w, mib_by_gpu, {"name": name, "on_term": on_term, "user": user, "stuck": stuck,
                                             "release_delay_s": release_delay_s, "device_fds": device_fds,
                                             "report_pid": report_pid, "pin_child": pin_child})
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


def _holder_argv(root, mib_by_gpu, opts, report_fd: int) -> list[str]:
    argv = [opts["name"], "-m", "gpusim.holder", "--ready-fd", str(report_fd), "--on-term", opts["on_term"],
            "--comm", opts["name"]]
    if opts["user"]:
        argv += ["--user", opts["user"]]
    if opts["device_fds"]:
        for path in ledger.device_paths(str(root), mib_by_gpu):
            argv += ["--device", path]
    if opts["pin_child"]:
        argv.append("--pin-child")
    return argv


def _watch(root, w, mib_by_gpu, opts) -> None:
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):  # never keep the caller's pipes open
        os.dup2(devnull, fd)
    set_comm("gpusim-driver")
    go_r, go_w = os.pipe()
    rep_r, rep_w = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(go_w)
        os.close(rep_r)
        os.close(w)  # the holder reports to the watcher only
        os.setsid()
        if os.read(go_r, 1) != b"g":
            os._exit(1)
        env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent))
        os.set_inheritable(rep_w, True)
        os.execve(sys.executable, _holder_argv(root, mib_by_gpu, opts, rep_w), env)
    os.close(go_r)
    os.close(rep_w)
    _write_line(w, {"watcher": os.getpid(), "pgid": child})
    try:
        path = ledger.allocate(root, child, mib_by_gpu, opts["name"], stuck=opts["stuck"],
                               release_delay_s=opts["release_delay_s"], report_pid=opts["report_pid"])
    except Exception as exc:  # noqa: BLE001 - reported to the caller, then the child is discarded
        _write_line(w, {"error": str(exc), "oom": isinstance(exc, ledger.OutOfMemory)})
        os.close(go_w)
        os.waitpid(child, 0)
        os._exit(1)
    os.write(go_w, b"g")
    os.close(go_w)
    with os.fdopen(rep_r) as fh:
        line = fh.readline()  # '' if the holder died before reporting: the caller sees no pid
    report = json.loads(line) if line.strip() else {}
    pin = _pin_fd(path, report)
    if report:
        _write_line(w, report)
    os.close(w)
    os.waitpid(child, 0)
    if pin is not None:  # the context lives on in the holder's descendant: tear down when it is gone too
        poller = select.poll()
        poller.register(pin, select.POLLIN)
        poller.poll()
    ledger.release_after_death(root, path)
    os._exit(0)


def _pin_fd(path: str, report: dict) -> int | None:
    """Record the holder's pinning child in the ledger; a pidfd to wait for its death (None if none or gone)."""
    pid, start = report.get("pin_pid"), report.get("pin_start")
    if not pid:
        return None
    ledger.set_pin(path, pid, start)
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return None
    if ledger.proc_start_time(pid) != start:  # already gone (and the PID reused)
        os.close(fd)
        return None
    return fd


def _fork_pin(report_fd: int) -> tuple[int, int | None]:
    """Fork the pinning child: its own session, the device fds inherited, nothing to do but live. Returns once
    the child is in its own session (it says so on a pipe), so whoever is told its PID sees it there."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(report_fd)
            os.close(r)
            os.setsid()
            os.write(w, b"1")
            os.close(w)
            while True:
                signal.pause()
        finally:
            os._exit(0)
    os.close(w)
    os.read(r, 1)
    os.close(r)
    return pid, ledger.proc_start_time(pid)


def main(argv: list[str]) -> None:
    import argparse

    p = argparse.ArgumentParser(prog="gpusim.holder")
    p.add_argument("--ready-fd", type=int, required=True)
    p.add_argument("--on-term", choices=TERM_MODES, default="exit")
    p.add_argument("--comm", default="python3")
    p.add_argument("--user")
    p.add_argument("--device", action="append", default=[], help="a device file to keep open (CUDA's view)")
    p.add_argument("--pin-child", action="store_true")
    a = p.parse_args(argv)
    set_comm(a.comm)
    if a.on_term == "ignore":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:  # before dropping privileges (the host directory may not be traversable by the user); kept for life
        devices = [os.open(path, os.O_RDWR) for path in a.device]
    except OSError as exc:
        _write_line(a.ready_fd, {"error": f"CUDA error: no CUDA-capable device is detected ({exc})"})
        os._exit(1)
    if a.user:
        pw = pwd.getpwnam(a.user)
        os.setgroups([])
        os.setgid(pw.pw_gid)
        os.setuid(pw.pw_uid)
    report = {"pid": os.getpid()}
    if a.pin_child:
        report["pin_pid"], report["pin_start"] = _fork_pin(a.ready_fd)
    _write_line(a.ready_fd, report)
    os.close(a.ready_fd)
    while True:
        signal.pause()


if __name__ == "__main__":
    main(sys.argv[1:])
