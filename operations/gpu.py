"""GPU operations: ``gpu.idle`` makes GPUs free of compute processes and proves their memory is released."""
from __future__ import annotations

import json
from dataclasses import replace
from functools import partial

from pyinfra import host, state
from pyinfra.api import FunctionCommand, operation

from operations.model import hostdata

from operations.controller import interrupt

from operations.controller import lease as lock

from operations.controller import output as report

from operations.controller import summary
from operations.errors import Issue
from operations.errors import ConfigError
from operations.facts.gpu import read_gpus
from operations.controller.idle_converge import Timing, Verdict, converge_idle, refusal
from operations.model.idle_plan import (DEFAULT_PROTECTED, DEFAULT_PROTECTED_MAX_MIB, DEFAULT_THRESHOLD_MIB, Selection, is_protected,
                        plan_idle)
from operations.controller.remote import host_python, python_script
from operations.controller.waiting import RealClock


def timing_of(grace_s, deadline_s, stable_s=0.05, poll_s=0.02, progress_s=2.0) -> Timing:
    """The wait's timings, or a ConfigError naming this host and each bad field (before any command: nothing is
    stopped first). ``nan`` or ``inf`` would make the wait never end, so they are refused like ``-1``."""
    fields = dict(grace_s=grace_s, deadline_s=deadline_s, stable_s=stable_s, poll_s=poll_s, progress_s=progress_s)
    values = hostdata.gather(*(partial(hostdata.as_number, host, k, v) for k, v in fields.items()))
    try:
        return Timing(*values)
    except (TypeError, ValueError) as exc:
        raise ConfigError([Issue("grace_s/deadline_s", str(exc), host.name)]) from None


def as_patterns(value) -> tuple[str, ...] | None:
    """``"root"``, ``"root,sglang"`` or ``["root", "sglang"]`` -> a tuple of patterns (None stays None): a string
    is split on commas, as host data ``users=root,sglang`` and ``gpus=0,1`` are."""
    items = hostdata.split(value)
    return None if items is None else tuple(items)


@operation()
def idle(gpus=None, users=None, names=None, protected=DEFAULT_PROTECTED, extra_protected=(),
         threshold_mib: int = DEFAULT_THRESHOLD_MIB, grace_s: float = 10.0, deadline_s: float = 60.0,
         stable_s: float = 0.05, poll_s: float = 0.02, progress_s: float = 2.0, python: str | None = None,
         protected_max_mib: int = DEFAULT_PROTECTED_MAX_MIB):
    """
    Make GPUs idle: stop their compute processes (SIGTERM to the process group, SIGKILL after a grace period)
    and wait until the driver has released the memory, ending in a verdict.

    + gpus: GPU indices that must be idle (default: all GPUs on the host)
    + users: user-name patterns whose processes may be stopped (default: only the user pyinfra connects as);
      processes of other users on the chosen GPUs are never signalled and make the verdict ``blocked``
    + names: name/cmdline patterns a process must match to be stopped (default: any compute process)
    + protected: daemons never signalled and whose memory is tolerated (nvidia-persistenced, nv-hostengine,
      dcgm-exporter, nv-fabricmanager), up to ``protected_max_mib`` each
    + protected_max_mib: the most a protected daemon may hold and be tolerated (default 1024); one holding more
      is still never signalled, but blocks the verdict (its memory would make a server start OOM)
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
    gpus = hostdata.as_indices(host, "gpus", gpus)  # "0,1" as host data gives it, or a list
    sel = Selection(frozenset(gpus) if gpus is not None else None, as_patterns(users), as_patterns(names) or (),
                    tuple(protected) + tuple(extra_protected), threshold_mib, protected_max_mib)
    timing = timing_of(grace_s, deadline_s, stable_s, poll_s, progress_s)
    current = read_gpus(host, python)
    if not current.available:
        yield summary.failure(f"gpu.idle: cannot read GPUs: {current.error}")
        return
    missing = sorted(set(sel.indices(current)) - {g.index for g in current.gpus})
    if missing:
        yield summary.failure(f"gpu.idle: no GPU {','.join(map(str, missing))} on this host "
                              f"(it has {','.join(str(g.index) for g in current.gpus)})")
        return
    plan = plan_idle(current, sel)
    if plan.idle:
        host.noop(already_idle(plan, current))
        return
    if report.print_plan_now():
        for line in plan.describe():
            report.log(host, f"gpu.idle plan: {line}")
    refused = refusal(plan)
    if refused:
        yield summary.failure(f"gpu.idle: {refused.text}")
        return
    if plan.targets:
        yield lock.acquired("gpu.idle", deadline_s + grace_s + 600, python)
        yield interrupt.guard("signalling GPU processes")
        yield python_script(python, "signalling.py", "TERM", *(t.spec for t in plan.targets))
    yield FunctionCommand(_converge, (python, sel, plan, timing), {})


def already_idle(plan, current) -> str:
    return f"GPU {','.join(map(str, plan.gpus))} already idle ({sum(plan.held_mib.values())} MiB used, via {current.source})"


def converge_now(host, python, sel, timing) -> bool:
    """At execute time, within another operation: read the GPUs, plan, refuse or signal, and converge, exactly
    as ``gpu.idle`` does (its verdict printed, False when not idle)."""
    current = read_gpus(host, python)
    plan = plan_idle(current, sel) if current.available else None
    refused = refusal(plan) if plan is not None else None
    if plan is None or refused:
        report.error(host, f"gpu.idle: {refused.text if refused else 'cannot read GPUs: ' + str(current.error)}")
        return False
    for line in plan.describe():
        report.log(host, f"gpu.idle plan: {line}")
    if plan.targets:
        interrupt.check("signalling GPU processes")
        host.run_shell_command(python_script(python, "signalling.py", "TERM", *(t.spec for t in plan.targets)))
    return _converge(None, host, python, sel, plan, timing)


@interrupt.stops_on_interrupt
def _converge(state, host, python, sel, plan, timing) -> bool:
    def read(condition, budget):
        wait = None if condition is None else json.dumps({**condition, "budget_s": round(budget, 3)})
        return read_gpus(host, python, wait=wait)

    def kill(signal: str, targets) -> None:
        interrupt.check(f"sending SIG{signal}")
        ok, output = host.run_shell_command(python_script(python, "signalling.py", signal,
                                                          *(t.spec for t in targets)))
        for line in output.stdout_lines + output.stderr_lines:
            report.log(host, f"gpu.idle: {line}")

    verdict: Verdict = converge_idle(read, kill, plan, sel, timing, RealClock(), lambda m: report.log(host, f"gpu.idle: {m}"))
    if verdict.ok:
        report.log(host, f"gpu.idle: {verdict.text}", fg="green")
        return True
    if verdict.status == "needs-reset":  # name what still holds a GPU device open: it pins the memory
        holders = read_gpus(host, python, holders=True).fd_holders
        verdict = replace(verdict, fd_holders=tuple(p for p in holders if p.pid not in verdict.survivors
                                                    and not is_protected(p, sel.protected)))
    report.error(host, f"gpu.idle: {verdict.text}")
    return False
