"""Deciding what "GPUs idle" needs on one host: pure functions from a GpuState to a plan and a verdict."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from fnmatch import fnmatchcase

from operations.model.gpus import GpuProcess, GpuState

# Never signalled, and their (small) memory does not count against idle.
DEFAULT_PROTECTED = ("nvidia-persistenced", "nv-hostengine", "dcgm-exporter", "nv-fabricmanager",
                     "nvidia-fabricmanager")
DEFAULT_THRESHOLD_MIB = 256
# What a protected daemon may hold and still be tolerated: the NVIDIA daemons hold a few MiB at most, so a
# process with a daemon's name holding gigabytes is not one of them, and its memory would make a start OOM.
DEFAULT_PROTECTED_MAX_MIB = 1024


def _base(text: str) -> str:
    return os.path.basename(text.split(" ", 1)[0]) if text else ""


def comm_matches(comm: str, pattern: str) -> bool:
    # the kernel truncates comm to 15 bytes: "nvidia-persistenced" shows as "nvidia-persiste"
    return fnmatchcase(comm, pattern) or (len(comm) == 15 and fnmatchcase(comm, pattern[:15]))


SYSTEM_UID_MAX = 999  # daemons run as root or a system user; a user's job named "dcgm-exporter" is not one


def is_protected(proc: GpuProcess, patterns: tuple[str, ...]) -> bool:
    if not 0 <= proc.uid <= SYSTEM_UID_MAX:
        return False
    names = {_base(proc.name), _base(proc.cmdline)} - {""}
    return any(comm_matches(proc.comm, pat) or any(fnmatchcase(n, pat) for n in names) for pat in patterns)


@dataclass(frozen=True)
class Selection:
    """Which GPUs must be idle and which processes the operation may stop to get there."""

    gpus: frozenset[int] | None = None  # None: every GPU on the host
    users: tuple[str, ...] | None = None  # fnmatch patterns; None: only the user the probe runs as
    names: tuple[str, ...] = ()  # fnmatch patterns on name/comm/cmdline; empty: any compute process
    protected: tuple[str, ...] = DEFAULT_PROTECTED
    threshold_mib: int = DEFAULT_THRESHOLD_MIB
    protected_max_mib: int = DEFAULT_PROTECTED_MAX_MIB

    def indices(self, state: GpuState) -> list[int]:
        present = [g.index for g in state.gpus]
        return present if self.gpus is None else sorted(self.gpus)

    def may_stop(self, proc: GpuProcess, state: GpuState) -> str | None:
        """None if the process may be stopped, else why not."""
        users = self.users if self.users is not None else (state.probe_user,)
        if not any(fnmatchcase(proc.user, u) for u in users):
            return f"user {proc.user} not in users={list(users)}"
        if self.names and not any(fnmatchcase(t, pat) for pat in self.names
                                  for t in (proc.name, proc.comm, proc.cmdline, _base(proc.name))):
            return f"name not matching names={list(self.names)}"
        return None


@dataclass(frozen=True)
class Target:
    """A process to stop. ``pgid`` is 0 when only the PID itself may be signalled."""

    pid: int
    start: int
    pgid: int
    user: str
    gpus: tuple[int, ...]
    mib: int | None
    label: str

    @property
    def spec(self) -> str:
        return f"{self.pid}:{self.start}:{self.pgid}"

    def describe(self) -> str:
        mib = "?" if self.mib is None else f"{self.mib}"
        how = f"process group {self.pgid}" if self.pgid else "pid only"
        return (f"stop pid {self.pid} ({how}), user {self.user}, GPU {','.join(map(str, self.gpus))}, "
                f"{mib} MiB: {self.label}")


@dataclass(frozen=True)
class IdlePlan:
    gpus: tuple[int, ...]
    targets: tuple[Target, ...] = ()
    protected: tuple[GpuProcess, ...] = ()  # tolerated: within protected_max_mib
    foreign: tuple[tuple[GpuProcess, str], ...] = ()  # on the GPUs, never signalled: why not
    held_mib: dict[int, int] = field(default_factory=dict)  # memory that counts against idle, per GPU
    idle: bool = False
    unreadable: tuple[tuple[int, str], ...] = ()  # (GPU, why its memory cannot be read)

    def describe(self) -> list[str]:
        lines = [t.describe() for t in self.targets]
        lines += [f"leave pid {p.pid} ({p.label}, user {p.user}) on GPU {p.gpu_index}: protected daemon"
                  for p in self.protected]
        lines += [f"refuse pid {p.pid} ({p.label}) on GPU {p.gpu_index}: {why}" for p, why in self.foreign]
        lines += [f"GPU {i}: memory use unreadable ({why}): cannot be proven idle" for i, why in self.unreadable]
        busy = [f"GPU {i}: {mib} MiB" for i, mib in self.held_mib.items() if mib]
        if busy and not self.targets and not self.foreign and not self.unreadable:
            lines.append(f"wait for the driver to release memory ({', '.join(busy)})")
        return lines


def tolerated(proc: GpuProcess, sel: Selection) -> bool:
    """A protected daemon within the memory a daemon plausibly holds (``[N/A]`` per-process memory: tolerated)."""
    return is_protected(proc, sel.protected) and (proc.used_mib or 0) <= sel.protected_max_mib


def held_mib(state: GpuState, sel: Selection) -> dict[int, int]:
    """Used memory per selected readable GPU, less what tolerated protected daemons hold."""
    held = {}
    for idx in sel.indices(state):
        gpu = state.gpu(idx)
        if gpu is None or not gpu.readable:
            continue
        allowed = sum(p.used_mib or 0 for p in state.on_gpu(idx) if tolerated(p, sel))
        held[idx] = max(0, gpu.used_mib - allowed)
    return held


def unreadable(state: GpuState, sel: Selection) -> tuple[tuple[int, str], ...]:
    return tuple((i, state.gpu(i).memory_error or "memory use not reported") for i in sel.indices(state)
                 if state.gpu(i) is not None and not state.gpu(i).readable)


def unprotected(state: GpuState, sel: Selection) -> list[GpuProcess]:
    chosen = set(sel.indices(state))
    return [p for p in state.processes if p.gpu_index in chosen and not tolerated(p, sel)]


def is_idle(state: GpuState, sel: Selection) -> bool:
    """Unreadable memory is never idle: nothing could prove it."""
    return (not unprotected(state, sel) and not unreadable(state, sel)
            and all(m <= sel.threshold_mib for m in held_mib(state, sel).values()))


def not_signallable(proc: GpuProcess, sel: Selection) -> str | None:
    """Why a listed GPU process must not be signalled from here though its user and name allow it, or None."""
    if is_protected(proc, sel.protected):
        return (f"protected daemon holding {proc.used_mib} MiB, above protected_max_mib={sel.protected_max_mib}: "
                f"never signalled, and its memory is not tolerated")
    if proc.start is None:
        return ("listed by the driver but not visible in this PID namespace ([Not Found]): it cannot be verified "
                "or signalled from here")
    if proc.gpu_fds is False:
        return (f"the driver lists pid {proc.pid}, but pid {proc.pid} here holds no GPU device open: a PID from "
                f"another PID namespace (a container without the host's PID namespace?) that maps to an "
                f"unrelated process here")
    if proc.gpu_fds is None:
        return f"cannot confirm that pid {proc.pid} holds a GPU device (/proc/{proc.pid}/fd is not readable here)"
    return None


def _signal_group(proc: GpuProcess, state: GpuState, sel: Selection, targets: set[int]) -> bool:
    """Signal the whole process group only if every member is ours to stop: same uid, nothing protected, and,
    when ``names`` restricts what may be stopped, each member a target or matching ``names`` itself."""
    if proc.pgid <= 1 or proc.sid == state.probe_sid or not proc.group:
        return False

    def ours(m) -> bool:
        if m.uid != proc.uid or any(comm_matches(m.comm, pat) for pat in sel.protected):
            return False
        return m.pid in targets or not sel.names or any(comm_matches(m.comm, pat) for pat in sel.names)

    return all(ours(m) for m in proc.group)


def plan_idle(state: GpuState, sel: Selection) -> IdlePlan:
    gpus = tuple(sel.indices(state))
    chosen = set(gpus)
    on_chosen = [p for p in state.processes if p.gpu_index in chosen]
    protected = tuple(p for p in on_chosen if tolerated(p, sel))
    foreign, by_pid = [], {}
    for proc in on_chosen:
        if proc in protected:
            continue
        why = (None if is_protected(proc, sel.protected) or proc.start is None else sel.may_stop(proc, state)) \
            or not_signallable(proc, sel)
        if why:
            foreign.append((proc, why))
        else:
            by_pid.setdefault(proc.pid, []).append(proc)
    targets = []
    for pid, entries in by_pid.items():
        first = entries[0]
        mibs = [e.used_mib for e in entries]
        targets.append(Target(pid, first.start, first.pgid if _signal_group(first, state, sel, set(by_pid)) else 0,
                              first.user,
                              tuple(e.gpu_index for e in entries), None if None in mibs else sum(mibs),
                              first.label))
    return IdlePlan(gpus, tuple(targets), protected, tuple(foreign), held_mib(state, sel), is_idle(state, sel),
                    unreadable(state, sel))
