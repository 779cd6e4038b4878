"""Executing an idle plan: TERM already sent, wait out the grace period, KILL survivors, then prove idle.

Everything that touches a host is injected (``read`` the fact, ``kill`` by signal, ``log``), so the loop and
its verdicts are tested with a synthetic clock and scripted readings.
"""
from __future__ import annotations

import math
from dataclasses import astuple, dataclass, field
from typing import Callable

from operations.model.gpus import GpuProcess, GpuState
from operations.model.idle_plan import IdlePlan, Selection, Target, held_mib, is_idle, unprotected, unreadable
from operations.controller.waiting import Clock, Deadline, ReadCost, Stable, poll


@dataclass(frozen=True)
class Timing:
    grace_s: float = 10.0  # SIGTERM to SIGKILL
    deadline_s: float = 60.0  # whole wait, never overshot
    stable_s: float = 0.05  # idle must hold this long (and over two readings)
    poll_s: float = 0.02
    progress_s: float = 2.0  # how often to print a progress line while waiting

    def __post_init__(self):
        if not all(map(math.isfinite, astuple(self))):  # nan compares false with everything: no deadline at all
            raise ValueError(f"timings must be finite numbers: {self}")
        if min(self.grace_s, self.deadline_s, self.stable_s, self.poll_s) < 0 or self.progress_s <= 0:
            raise ValueError(f"timings must be non-negative: {self}")
        if self.grace_s >= self.deadline_s:  # SIGKILL needs time left to prove the memory was released
            raise ValueError(f"grace_s ({self.grace_s}) must be shorter than deadline_s ({self.deadline_s})")


def _gpus(indices) -> str:
    return ",".join(str(i) for i in indices)


@dataclass(frozen=True)
class Verdict:
    status: str  # "idle" | "blocked" | "unreadable" | "busy" | "needs-reset"
    gpus: tuple[int, ...]
    elapsed: float = 0.0
    held_mib: dict[int, int] = field(default_factory=dict)
    remaining: tuple[GpuProcess, ...] = ()  # unprotected processes still on the GPUs
    refused: tuple[tuple[GpuProcess, str], ...] = ()
    stopped: dict[int, str] = field(default_factory=dict)  # pid -> last signal sent
    survivors: tuple[int, ...] = ()  # pids still on a GPU after SIGKILL
    unreadable: tuple[tuple[int, str], ...] = ()  # (GPU, why its memory cannot be read)
    fd_holders: tuple[GpuProcess, ...] = ()  # live local processes with a GPU device open (needs-reset)

    @property
    def ok(self) -> bool:
        return self.status == "idle"

    def _stopped(self) -> str:
        parts = [f"pid {pid} needed SIGKILL" if sig == "KILL" else f"pid {pid} stopped by SIGTERM"
                 for pid, sig in self.stopped.items()]
        return f" ({', '.join(parts)})" if parts else ""

    @property
    def text(self) -> str:
        if self.status == "idle":
            return f"idle: GPU {_gpus(self.gpus)} idle after {self.elapsed:.2f}s{self._stopped()}"
        if self.status == "unreadable":
            why = "; ".join(f"GPU {i}: {reason}" for i, reason in self.unreadable)
            return (f"unreadable: the memory use of GPU {_gpus(i for i, _ in self.unreadable)} cannot be read "
                    f"({why}), so specops cannot prove it idle (unreadable memory is never idle: a start could "
                    f"OOM).{self._stopped() or ' Nothing was signalled.'} On GPUs that do not report memory (e.g. GB10) or MIG without "
                    f"privileges, run specops where nvidia-smi shows memory.used, or leave these GPUs out (gpus=).")
        if self.status == "blocked":
            who = "; ".join(f"pid {p.pid} on GPU {p.gpu_index} (user {p.user}, {p.label}): {why}"
                            for p, why in self.refused)
            hint = (" Widen users=/names= or stop them yourself." if any(
                why.startswith(("user ", "name ")) for _, why in self.refused) else " Stop them where they run.")
            return (f"blocked: GPU {_gpus(sorted({p.gpu_index for p, _ in self.refused}))} held by processes "
                    f"this operation may not stop: {who}. Nothing was signalled.{hint}")
        held = ", ".join(f"GPU {i}: {mib} MiB" for i, mib in self.held_mib.items() if mib)
        if self.status == "busy":
            who = "; ".join(f"pid {p.pid} on GPU {p.gpu_index} (user {p.user}, {p.label})" for p in self.remaining)
            return (f"busy: after {self.elapsed:.1f}s processes still hold GPUs: {who}"
                    f"{'; ' + held if held else ''}{self._stopped()}")
        survivors = ", ".join(map(str, self.survivors)) or "none"
        holders = "; ".join(f"pid {p.pid} (user {p.user}, {p.label})" for p in self.fd_holders)
        pinned = (f"; live processes holding a GPU device open (they pin the memory; the driver does not list "
                  f"them): {holders}" if holders else "")
        return (f"needs-reset: after {self.elapsed:.1f}s {held or 'memory above threshold'} still allocated; "
                f"pids that survived SIGKILL: {survivors}{pinned}{self._stopped()}. The driver did not release the "
                f"memory; specops never resets GPUs: drain this host, then `nvidia-smi --gpu-reset -i "
                f"{_gpus(i for i, m in self.held_mib.items() if m) or _gpus(self.gpus)}` or reboot.")


def blocked_verdict(plan: IdlePlan) -> Verdict:
    return Verdict("blocked", plan.gpus, held_mib=plan.held_mib, refused=plan.foreign)


def unreadable_verdict(plan: IdlePlan) -> Verdict:
    return Verdict("unreadable", plan.gpus, refused=plan.foreign, unreadable=plan.unreadable)


def refusal(plan: IdlePlan) -> Verdict | None:
    """The verdict a plan already has before anything is signalled (unreadable memory, processes it may not
    stop), or None when it can go ahead."""
    if plan.unreadable:
        return unreadable_verdict(plan)
    if plan.foreign:
        return blocked_verdict(plan)
    return None


def _waited(state: GpuState) -> float:
    return state.waited_s


def _alive(targets, state: GpuState) -> list[Target]:
    live = {(p.pid, p.start) for p in state.processes}
    return [t for t in targets if (t.pid, t.start) in live]


class Progress:
    """Prints "elapsed, MiB still held" at most every ``every`` seconds."""

    def __init__(self, deadline: Deadline, sel: Selection, every: float, log: Callable[[str], None]):
        self.deadline, self.sel, self.every, self.log = deadline, sel, every, log
        self.next_at = every

    def __call__(self, state: GpuState) -> None:
        elapsed = self.deadline.elapsed()
        if elapsed < self.next_at:
            return
        self.next_at = elapsed + self.every
        held = held_mib(state, self.sel)
        pids = sorted({p.pid for p in unprotected(state, self.sel)})
        self.log(f"waiting for GPU {_gpus(held)}: {elapsed:.1f}s elapsed, {sum(held.values())} MiB still held"
                 f"{', pids ' + _gpus(pids) if pids else ''}")


def wait_condition(plan: IdlePlan, sel: Selection, timing: Timing, idle: bool) -> dict:
    """What the probe samples for on the host: the targets gone, or (``idle``) the chosen GPUs idle."""
    cond = {"gpus": list(plan.gpus), "absent": [t.pid for t in plan.targets], "idle": idle,
            "interval_s": timing.poll_s, "stable_s": timing.stable_s}
    if idle:
        tolerated: dict[str, int] = {}
        for p in plan.protected:
            tolerated[str(p.gpu_index)] = tolerated.get(str(p.gpu_index), 0) + (p.used_mib or 0)
        cond.update(tolerated_pids=[p.pid for p in plan.protected], tolerated_mib=tolerated,
                    threshold_mib=sel.threshold_mib)
    return cond


Read = Callable[[dict | None, float], GpuState]  # (condition to wait for on the host, budget seconds)


def converge_idle(read: Read, kill: Callable[[str, list[Target]], None], plan: IdlePlan,
                  sel: Selection, timing: Timing, clock: Clock, log: Callable[[str], None]) -> Verdict:
    """Run after SIGTERM went to ``plan.targets``; returns the verdict (never raises for a busy GPU)."""
    deadline = Deadline(clock, timing.deadline_s)
    progress = Progress(deadline, sel, timing.progress_s, log)
    stopped = {t.pid: "TERM" for t in plan.targets}
    cost = ReadCost()
    last = None
    if plan.targets:
        grace = Deadline(clock, min(timing.grace_s, deadline.remaining()))
        gone = wait_condition(plan, sel, timing, idle=False)
        waited = poll(lambda budget: read(gone, budget), lambda s: not _alive(plan.targets, s), grace,
                      timing.poll_s, progress, chunk=timing.progress_s, cost=cost, waited=_waited)
        last = waited.value
        if not waited.done and grace.remaining() > 0:  # poll stopped early so as not to overshoot: grace
            clock.sleep(grace.remaining())                # is a minimum, so wait it out and look again
            last = read(None, 0.0)
        survivors = _alive(plan.targets, last)
        if survivors:
            for t in survivors:
                log(f"pid {t.pid} ({t.label}) ignored SIGTERM for {grace.elapsed():.1f}s: sending SIGKILL")
                stopped[t.pid] = "KILL"
            kill("KILL", survivors)
    stable = Stable(clock, timing.stable_s)
    idle = wait_condition(plan, sel, timing, idle=True)

    def settled(s: GpuState) -> bool:  # the probe proved the window on the host, or we saw it across reads
        return stable.update(is_idle(s, sel)) or (s.settled and is_idle(s, sel))

    outcome = poll(lambda budget: read(idle, budget), settled, deadline, timing.poll_s, progress,
                   chunk=timing.progress_s, cost=cost, waited=_waited,
                   initial=last if plan.targets and deadline.remaining() - cost.margin() <= 0 else None)
    final = outcome.value
    common = dict(elapsed=deadline.elapsed(), held_mib=held_mib(final, sel), stopped=stopped)
    if outcome.done:
        return Verdict("idle", plan.gpus, **common)
    if unreadable(final, sel):
        return Verdict("unreadable", plan.gpus, unreadable=unreadable(final, sel), **common)
    survivors = tuple(t.pid for t in _alive(plan.targets, final) if stopped.get(t.pid) == "KILL")
    others = tuple(p for p in unprotected(final, sel) if p.pid not in stopped)
    status = "busy" if others and not survivors else "needs-reset"
    return Verdict(status, plan.gpus, remaining=tuple(unprotected(final, sel)), survivors=survivors, **common)
