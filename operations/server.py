"""Server operations: ``server.running`` (speculative server running with config X) and ``server.stopped``."""
from __future__ import annotations

from dataclasses import replace

from pyinfra import host, state
from pyinfra.api import FunctionCommand, operation

from operations import gpu
from operations.controller import interrupt
from operations.controller import lease as lock
from operations.controller import output as report
from operations.controller import summary, supervisors, transition
from operations.controller.idle_converge import refusal
from operations.controller.readiness import live_problems, placement_problem, server_gpus
from operations.controller.remote import host_python
from operations.errors import ConfigError, Issue
from operations.facts.engine import check_engine, engine_key
from operations.facts.view import read_view
from operations.facts.server import read_server
from operations.model import config as configs
from operations.model import hostdata, topology
from operations.model.idle_plan import Selection, plan_idle
from operations.model.server_config import ServerConfig
from operations.model.server_state import FieldChange, drift
from operations.model.validation import HostContext, validate



def resolve(config, on_host=None) -> ServerConfig:
    """A ServerConfig, or a config name/path loaded from configs/; the host's launcher override applied."""
    return hostdata.config_for(config, host if on_host is None else on_host)


def check_inventory(config, hosts) -> ServerConfig:
    """Validate ``config`` for every host before any operation runs; raises one ConfigError listing every issue
    (field and host) across the inventory. Multi-node groups (host data ``specops_group``) are checked rank by
    rank (``operations.model.topology``); host data ``gpu_count`` is used when set; the GPU count read from each host is
    checked again when the server operations run.

    **Example** (top of a deploy file): ``server.check_inventory(host.data.get("config"), inventory)``
    """
    cfg = config if isinstance(config, ServerConfig) else configs.load(str(config))
    hosts = list(hosts)
    issues = []
    for group in sorted({h.data.get("specops_group") for h in hosts if h.data.get("specops_group")}):
        issues += topology.rank_issues(group, hosts)
    if issues:
        raise ConfigError(issues)
    for h in hosts:  # each host against its own config (host data ``config``), else this one
        own = h.data.get("config", config)
        if own in (None, "", "none"):
            continue
        own_cfg = cfg if own == config else (own if isinstance(own, ServerConfig) else configs.load(str(own)))
        issues += [replace(i, host=h.name) for i in topology.rank_config_issues(own_cfg, h, hosts, h.data.get("gpu_count"))]
    if issues:
        raise ConfigError(issues)
    return cfg


def _supervisor(name, supervisor, state_dir, python, on_host=None):
    return supervisors.for_host(name, supervisor, state_dir, python, host if on_host is None else on_host)


@operation()
def running(config, server_name: str = "llm", supervisor: str | None = None, state_dir: str | None = None,
            idle: bool = True, users=None, grace_s: float = 10.0, idle_deadline_s: float = 120.0,
            progress_s: float = 10.0, python: str | None = None):
    """
    Make a (speculative) inference server run with config X, verified live.

    + config: a ServerConfig, or the name/path of a YAML config (``configs/<name>.yaml``)
    + server_name: the server's name on the host (one state directory, one port); switching configs keeps it
    + supervisor: ``process`` (setsid, pidfile, log; default) or ``systemd`` (host data ``specops_supervisor``)
    + state_dir: where server directories live (host data ``specops_state_dir``, default /var/lib/specops)
    + idle: run ``gpu.idle`` on the server's GPUs before starting (set False only to force a start)
    + users, grace_s, idle_deadline_s: passed to ``gpu.idle``
    + progress_s: how often a progress line is printed while the server loads
    + python: interpreter on the host for the checks (host data ``specops_python``)

    Already running with the same config and healthy: no change. Otherwise: stop our server, ``gpu.idle`` its
    GPUs, render launch files, start, and wait until /health_generate answers, a real generation succeeds,
    /server_info reports the desired config and (speculative configs) the average accept length reaches
    ``min_accept_length``. A failed start fails this host with the server log tail and the GPU process table.
    ``--dry`` lists each changed field (``~ speculative_num_draft_tokens: 16 -> 8 (restart)``), ``--diff`` the
    launch file / unit diffs, and the GPU stop plan.

    **Examples:**

    .. code:: python

        from operations import server

        server.running(name="Llama EAGLE-3", config=host.data.get("config", "eagle3-llama3.1-8b"))
        server.running(name="baseline on GPUs 4-7", server_name="base", config=baseline_config)
    """
    if host.data.get("specops_group"):
        raise ConfigError([Issue("specops_group", f"this host is a rank of multi-node group "
                                         f"{host.data.get('specops_group')}: use multinode.running", host.name)])
    summary.watch(state)
    python = host_python(python)
    cfg = resolve(config)
    sup = _supervisor(server_name, supervisor, state_dir, python)
    key = engine_key(cfg, sup.path("engine.yaml"), host)
    gpus_now, status, kept = read_view(host, sup, cfg.port, python, key)  # a no-op converge is this round trip alone
    issues = validate(cfg, HostContext(host.name, len(gpus_now.gpus) if gpus_now.available else None))
    if issues:
        raise ConfigError(issues)
    if status.unsafe:
        yield summary.failure(f"server.running {server_name}: {status.problem}; nothing changed")
        return
    if status.problem:
        report.log(host, f"server.running {server_name}: {status.problem}: it will be set aside; specops "
                         f"cannot tell from it whether its server runs, and signals nothing it names", fg="yellow")
    changes = drift(cfg, status)
    misplaced = placement_problem(cfg, gpus_now, status.pid) if status.alive else None
    if misplaced:  # started before specops set CUDA_VISIBLE_DEVICES, or by hand: a restart puts it right
        changes.append(FieldChange("gpus", sorted(server_gpus(gpus_now, status.pid)), cfg.gpu_indices(), True))
    restart = [c for c in changes if c.restart]
    healthy = (status.alive and status.status == "running" and status.health == 200
               and status.config_hash == cfg.config_hash)  # "starting": never verified, so verify again
    if healthy and not restart:
        problems = live_problems(cfg, status.server_info)
        if problems:  # converged but underperforming: a restart would not change what the draft model accepts
            yield summary.failure(f"server.running {server_name}: running config {cfg.name}, pid {status.pid}, "
                                  f"but {'; '.join(problems)}; not restarting (a restart does not change the "
                                  f"draft model's acceptance): check the draft model, or lower min_accept_length")
            return
        extra = f"; {', '.join(str(c) for c in changes)}" if changes else ""
        version = (status.server_info or {}).get("version")
        engine = f"{'SGLang' if cfg.engine == 'sglang' else cfg.engine} {version}, " if version else ""
        host.noop(f"server {server_name} running config {cfg.name} ({cfg.config_hash}), {engine}pid {status.pid}, "
                  f"GPU {','.join(map(str, cfg.gpu_indices()))}, healthy{extra}")
        return
    blocker = _start_blocker(cfg, status, gpus_now, idle, users)
    if blocker:  # fail now, while the old server still serves, not after stopping it
        yield summary.failure(f"server.running {server_name}: {blocker}"
                              + ("; the running server was left as it was" if status.alive else ""))
        return
    check = check_engine(cfg, sup.path("engine.yaml"), host, kept)  # kept: no parse, no round trip
    if check.problem:  # the host's own SGLang would refuse to start it: fail while the old server still serves
        yield summary.failure(f"server.running {server_name}: {check.problem}"
                              + ("; the running server was left as it was" if status.alive else ""))
        return
    files = sup.files(cfg)
    if report.print_plan_now():
        report.log(host, f"server.running {server_name}: {_why(cfg, status, healthy)}")
        for change in changes + _version_change(status, check):
            report.log(host, f"    {change}")
        for note in check.notes if cfg.engine == "sglang" else ():
            report.log(host, f"    note: {note}", fg="yellow")
        if state.config.DIFF:
            transition.show_diffs(sup, files, status)
        if idle and gpus_now.available and not state.is_executing:  # at execute gpu.idle prints its own plan
            plan = plan_idle(gpus_now, Selection(frozenset(cfg.gpu_indices()), gpu.as_patterns(users)))
            ours = {status.pid} if status.alive else set()
            if ours:
                report.log(host, f"    stop server {server_name} (pid {status.pid}) through its supervisor")
            for line in plan.describe():  # the server's own processes: its supervisor stops their group
                if not any(f"pid {pid} " in line or f"(process group {pid})" in line for pid in ours):
                    report.log(host, f"    gpu.idle plan: {line}")
    if _rolling():  # a failed batch stops the rollout before this host is touched
        yield FunctionCommand(_rollout_gate, (host.current_op_hash, server_name), {})
    sel = Selection(frozenset(cfg.gpu_indices()), gpu.as_patterns(users))
    plan = transition.one_step_plan(cfg, status, gpus_now, idle, sel)
    if plan is not None:  # nothing to stop but our own server: the whole switch runs on the host at once
        if report.print_plan_now():
            report.log(host, f"    one host-side step: {'stop the server, ' if status.alive else ''}"
                             f"{'wait for GPU memory release, ' if idle else ''}start, wait until it generates")
        timing = gpu.timing_of(grace_s, idle_deadline_s)
        yield from transition.one_step(sup, cfg, files, status, gpus_now, plan, sel, timing, check.version, python,
                                       progress_s, idle)
        return
    yield from transition.stop_and_idle(sup, cfg, status.alive, idle, users, grace_s, idle_deadline_s, python)
    yield from transition.launch(sup, cfg, files, check.version)
    yield FunctionCommand(transition.verify_ready, (cfg, sup, python, progress_s), {})


def _version_change(status, check) -> list:
    """The engine version: what the running server reports against what the host has installed now."""
    running = (status.server_info or {}).get("version") if status.alive else None
    if running and check.version and running != check.version:
        return [FieldChange("engine_version", running, check.version, True)]
    return []


def _start_blocker(cfg: ServerConfig, status, gpus_now, idle: bool, users) -> str | None:
    """Why gpu.idle would refuse the server's GPUs (unreadable GPUs or memory, processes it may not stop),
    judged before the old server is stopped; our own server's processes do not count (its supervisor stops them)."""
    if not idle:
        return None
    if not gpus_now.available:
        return f"cannot read GPUs: {gpus_now.error}"
    ours = {status.pid} if status.alive else set()
    others = replace(gpus_now, processes=tuple(p for p in gpus_now.processes if p.pid not in ours and p.pgid not in ours))
    verdict = refusal(plan_idle(others, Selection(frozenset(cfg.gpu_indices()), gpu.as_patterns(users))))
    return f"gpu.idle would refuse GPU {','.join(map(str, cfg.gpu_indices()))}: {verdict.text}" if verdict else None


def _rolling() -> bool:
    # the batch size pyinfra itself uses for this operation (op argument _parallel, else --parallel); pyinfra has
    # no public accessor for an operation's global arguments, so it is read from the operation's meta
    batch = state.get_op_meta(host.current_op_hash).global_arguments.get("_parallel") if host.current_op_hash else 0
    return bool(batch) and batch < len(state.active_hosts)


def _rollout_gate(state, host, op_hash: str, server_name: str) -> bool:
    failed = summary.failed_in(state, op_hash) - {host.name}
    if not failed:
        return True
    report.error(host, f"server.running: rollout stopped: an earlier batch failed on {', '.join(sorted(failed))}; "
                       f"server {server_name} here left as it was")
    return False


def _why(cfg: ServerConfig, status, healthy: bool) -> str:
    if status.foreign:
        return (f"a server specops did not start answers on port {cfg.port} (hand-made drift); "
                f"it will be replaced by config {cfg.name}")
    if not status.alive:
        return f"not running ({status.status}); will start config {cfg.name} ({cfg.config_hash})"
    if status.config_hash != cfg.config_hash:
        return f"config changed {status.config_hash} -> {cfg.config_hash} ({cfg.name}): restart"
    if status.health != 200:
        return f"pid {status.pid} unhealthy (/health {status.health}): restart"
    return "the live server reports other settings than it was started with (drift): restart"


@operation()
def stopped(server_name: str = "llm", port: int = 30000, supervisor: str | None = None, state_dir: str | None = None,
            grace_s: float = 30.0, python: str | None = None):
    """
    Make sure the server ``name`` that specops started is not running (TERM its process group, KILL after grace).

    + server_name: the server's name on the host
    + port: its port (for the status check)
    + supervisor, state_dir, python: as for ``server.running``

    **Example:**

    .. code:: python

        server.stopped(server_name="llm")
    """
    port = hostdata.as_port(host, port)  # port=0 would read as "not running" and leave the server up
    python = host_python(python)
    sup = _supervisor(server_name, supervisor, state_dir, python)
    status = read_server(host, sup, port, python)
    if status.unsafe or (status.problem and status.health is not None):
        yield summary.failure(f"server.stopped {server_name}: {status.problem}"
                              + ("" if status.unsafe else f"; something answers on port {port}, and specops "
                                 f"cannot tell whether it is its server: not signalling it; stop it by hand"))
        return
    if not status.alive:
        other = f"; a server specops did not start answers on port {port}: left alone" if status.foreign else ""
        host.noop(f"server {server_name} not running ({status.problem or status.status}){other}")
        return
    yield lock.acquired(f"server.stopped {server_name}", grace_s + 600, python)
    yield interrupt.guard(f"stopping server {server_name}")
    yield from sup.stop(grace_s)
