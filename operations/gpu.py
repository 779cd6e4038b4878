"""GPU operations: ``gpu.idle`` makes GPUs free of compute processes and proves their memory is released."""
from __future__ import annotations

import json

from pyinfra import host, state
from pyinfra.api import FunctionCommand, operation

from . import lock, report, summary
from .config import Issue
from .errors import ConfigError
from .gpustate import GpuStateFact
from .idle_converge import Timing, Verdict, blocked_verdict, converge_idle
from .idle_plan import DEFAULT_PROTECTED, DEFAULT_THRESHOLD_MIB, Selection, plan_idle
from .remote import host_python, python_script
from .waiting import RealClock


def _fail(message: str) -> FunctionCommand:
    def fail(state, host):  # (state, host) signature: returning False fails this host only
        report.error(host, message)
        return False

    return FunctionCommand(fail, (), {})


def timing_of(grace_s, deadline_s, stable_s=0.05, poll_s=0.02, progress_s=2.0) -> Timing:
    """The wait's timings, or a ConfigError naming this host (before any command: nothing is stopped first)."""
    try:
        return Timing(float(grace_s), float(deadline_s), float(stable_s), float(poll_s), float(progress_s))
    except (TypeError, ValueError) as exc:
        raise ConfigError([Issue("grace_s/deadline_s", str(exc), host.name)]) from None


def as_patterns(value) -> tuple[str, ...] | None:
    """``"root"`` or ``["root", "sglang"]`` -> a tuple of patterns (None stays None)."""
    if value is None:
        return None
    return (value,) if isinstance(value, str) else tuple(value)


@operation()
def idle(gpus=None, users=None, names=None, protected=DEFAULT_PROTECTED, extra_protected=(),
         threshold_mib: int = DEFAULT_THRESHOLD_MIB, grace_s: float = 10.0, deadline_s: float = 60.0,
         stable_s: float = 0.05, poll_s: float = 0.02, progress_s: float = 2.0, python: str | None = None):
    """
    Make GPUs idle: stop their compute processes (SIGTERM to the process group, SIGKILL after a grace period)
    and wait until the driver has released the memory, ending in a verdict.

    + gpus: GPU indices that must be idle (default: all GPUs on the host)
    + users: user-name patterns whose processes may be stopped (default: only the user pyinfra connects as);
      processes of other users on the chosen GPUs are never signalled and make the verdict ``blocked``
    + names: name/cmdline patterns a process must match to be stopped (default: any compute process)
    + protected: daemons never signalled and whose memory is tolerated (nvidia-persistenced, nv-hostengine,
      dcgm-exporter, nv-fabricmanager)
    + extra_protected: patterns added to ``protected``
    + threshold_mib: memory per GPU (besides protected daemons) still counted as idle
    + grace_s: seconds between SIGTERM and SIGKILL
    + deadline_s: the whole wait, never overshot; past it the host fails with a ``busy`` or ``needs-reset`` verdict
    + stable_s: idle must hold this long over at least two readings
    + poll_s: pause between readings
    + progress_s: how often a progress line (elapsed, MiB still held) is printed while waiting
    + python: interpreter on the host for the probe (default: host data ``specops_python``, else ``python3``)

    Never uses ``fuser -k /dev/nvidia*`` and never resets a GPU. ``--dry`` prints the stop plan (PID, user,
    GPU, MiB, cmdline) and changes nothing.

    **Examples:**

    .. code:: python

        from operations import gpu

        gpu.idle(name="Free GPUs 0-3 for the server", gpus=[0, 1, 2, 3], grace_s=20)
        gpu.idle(users=["root", "sglang"], names=["*sglang*", "*vllm*"])
    """
    summary.watch(state)
    python = host_python(python)
    sel = Selection(frozenset(gpus) if gpus is not None else None, as_patterns(users), as_patterns(names) or (),
                    tuple(protected) + tuple(extra_protected), threshold_mib)
    timing = timing_of(grace_s, deadline_s, stable_s, poll_s, progress_s)
    current = host.get_fact(GpuStateFact, python=python)
    if not current.available:
        yield _fail(f"gpu.idle: cannot read GPUs: {current.error}")
        return
    missing = sorted(set(sel.indices(current)) - {g.index for g in current.gpus})
    if missing:
        yield _fail(f"gpu.idle: no GPU {','.join(map(str, missing))} on this host "
                    f"(it has {','.join(str(g.index) for g in current.gpus)})")
        return
    plan = plan_idle(current, sel)
    if plan.idle:
        used = sum(plan.held_mib.values())
        host.noop(f"GPU {','.join(map(str, plan.gpus))} already idle ({used} MiB used, via {current.source})")
        return
    if report.print_plan_now():
        for line in plan.describe():
            report.log(host, f"gpu.idle plan: {line}")
    if plan.foreign:
        yield _fail(blocked_verdict(plan).text)
        return
    if plan.targets:
        yield lock.acquired("gpu.idle", deadline_s + grace_s + 600, python)
        yield python_script(python, "signal_procs.py", "TERM", *(t.spec for t in plan.targets))
    yield FunctionCommand(_converge, (python, sel, plan, timing), {})


def _converge(state, host, python, sel, plan, timing) -> bool:
    def read(condition, budget):
        wait = None if condition is None else json.dumps({**condition, "budget_s": round(budget, 3)})
        return host.get_fact(GpuStateFact, python=python, wait=wait)

    def kill(signal: str, targets) -> None:
        ok, output = host.run_shell_command(python_script(python, "signal_procs.py", signal,
                                                          *(t.spec for t in targets)))
        for line in output.stdout_lines + output.stderr_lines:
            report.log(host, f"gpu.idle: {line}")

    verdict: Verdict = converge_idle(read, kill, plan, sel, timing, RealClock(), lambda m: report.log(host, f"gpu.idle: {m}"))
    if verdict.ok:
        report.log(host, f"gpu.idle: {verdict.text}", fg="green")
        return True
    report.error(host, f"gpu.idle: {verdict.text}")
    return False
