"""Server operations: ``server.running`` (speculative server running with config X) and ``server.stopped``."""
from __future__ import annotations

import json
import posixpath
import uuid
from dataclasses import replace
from io import StringIO

from pyinfra import host, logger, state
from pyinfra.api import FileUploadCommand, FunctionCommand, QuoteString, StringCommand, operation
from pyinfra.operations.util.files import generate_color_diff

from operations.model import config as configs
from operations import gpu
from operations.model import hostdata
from operations.controller import interrupt
from operations.controller import lease as lock
from operations.controller import output as report
from operations.controller import summary
from operations.model import topology
from operations.model.server_config import ServerConfig
from operations.model.validation import HostContext, validate
from operations.errors import ConfigError, Issue
from operations.facts.gpu import read_gpus
from operations.model.gpus import process_table
from operations.controller.idle_converge import refusal
from operations.model.idle_plan import Selection, plan_idle
from operations.facts.engine import check_engine
from operations.controller.readiness import Readiness, await_ready, live_problems, placement_problem, server_gpus
from operations.controller.remote import host_python
from operations.facts.server import read_server
from operations.model.server_state import FieldChange, drift, recorded_view
from operations.controller import supervisors
from operations.controller.waiting import RealClock



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
        issues += [replace(i, host=h.name) for i in rank_config_issues(own_cfg, h, hosts, h.data.get("gpu_count"))]
    if issues:
        raise ConfigError(issues)
    return cfg


def rank_config_issues(cfg: ServerConfig, on_host, hosts, gpu_count) -> list:
    """Validation of ``cfg`` as ``on_host`` would run it (its rank filled in when it is in a group)."""
    rank = topology.rank_of(on_host, hosts)
    ctx = HostContext(on_host.name, gpu_count, rank.nnodes if rank else None)
    return topology.nnodes_issues(cfg, rank) + validate(topology.for_rank(cfg, rank), ctx)


def _supervisor(name, supervisor, state_dir, python, on_host=None):
    return supervisors.for_host(name, supervisor, state_dir, python, host if on_host is None else on_host)


def _file_diffs(sup, files, status) -> None:
    current = {sup.path("launch.sh"): status.launch_sh, sup.path("engine.yaml"): status.engine_yaml}
    if sup.unit:
        current[files[-1].path] = status.unit_file
    for f in files:
        if f.secret:
            report.log(host, f"    {f.path}: secrets file (mode {f.mode}), content never shown")
            continue
        old = current.get(f.path)
        if old == f.content:
            continue
        report.log(host, f"    {'Will modify' if old else 'Will create'} {f.path}")
        for line in generate_color_diff((old or "").splitlines(), f.content.splitlines()):
            logger.info("      %s", line)


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
    gpus_now = read_gpus(host, python)
    issues = validate(cfg, HostContext(host.name, len(gpus_now.gpus) if gpus_now.available else None))
    if issues:
        raise ConfigError(issues)
    status = read_server(host, sup, cfg.port, python)
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
    check = check_engine(cfg, sup.path("engine.yaml"), host)
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
            _file_diffs(sup, files, status)
        if idle and gpus_now.available and not state.is_executing:  # at execute gpu.idle prints its own plan
            plan = plan_idle(gpus_now, Selection(frozenset(cfg.gpu_indices()), gpu.as_patterns(users)))
            ours = {status.pid} if status.alive else set()
            if ours:
                report.log(host, f"    stop server {server_name} (pid {status.pid}) through its supervisor")
            for line in plan.describe():
                if not any(f"pid {pid} " in line for pid in ours):
                    report.log(host, f"    gpu.idle plan: {line}")
    if _rolling():  # a failed batch stops the rollout before this host is touched
        yield FunctionCommand(_rollout_gate, (host.current_op_hash, server_name), {})
    yield from stop_and_idle(sup, cfg, status.alive, idle, users, grace_s, idle_deadline_s, python)
    yield from launch(sup, cfg, files, check.version)
    yield FunctionCommand(_await_ready, (cfg, sup, python, progress_s), {})


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


def stop_and_idle(sup, cfg: ServerConfig, alive: bool, idle: bool, users, grace_s, idle_deadline_s, python):
    """Commands: this run's host lock, the server's 0700 directory, our old server stopped, then (``idle``) its
    GPUs made idle."""
    if idle:
        gpu.timing_of(grace_s, idle_deadline_s)  # a bad pair fails here, before the old server is stopped
    yield lock.acquired(f"server {sup.name} -> config {cfg.name}",
                        idle_deadline_s + grace_s + cfg.stop_grace_s + cfg.ready_timeout_s + 600, python)
    yield FunctionCommand(_prepare_dir, (sup,), {})
    if alive:
        yield interrupt.guard(f"stopping server {sup.name}")
        yield from sup.stop(cfg.stop_grace_s)
    if idle:
        yield from gpu.idle._inner(gpus=cfg.gpu_indices(), users=users, grace_s=grace_s,
                                   deadline_s=idle_deadline_s, python=python)


def _prepare_dir(state, host, sup) -> bool:
    """The server's 0700 directory created or checked (refused in a tree other users can write), a corrupt
    state.json set aside; what was done is said."""
    ok, out = host.run_shell_command(sup.ctl("prepare", sup.directory))
    try:
        doc = json.loads("\n".join(out.stdout_lines))
    except ValueError:
        doc = {"error": " ".join(out.stderr_lines[-3:]) or "no output"}
    for note in doc.get("notes") or ():
        report.log(host, f"server {sup.name}: {note}", fg="yellow")
    if "error" in doc:
        report.error(host, f"server {sup.name}: {doc['error']}; nothing changed")
        return False
    return True


def launch(sup, cfg: ServerConfig, files, engine_version: str | None = None):
    """Commands: upload the launch files with their modes, start the server, record what it was started with
    (and the engine version the host's own SGLang reported)."""
    yield from uploads(files)
    yield interrupt.guard(f"starting server {sup.name}")
    yield from sup.start(cfg)
    yield sup.ctl("annotate", sup.directory, json.dumps(recorded_view(cfg, engine_version), sort_keys=True))


ELEVATION = ("_sudo", "_doas", "_dzdo", "_su_user")  # pyinfra's arguments that make uploads go through a temp file
OTHER_USER = ("_su_user", "_sudo_user", "_doas_user", "_dzdo_user")  # pyinfra's put_file: the same order
AS_SSH_USER = {"_sudo": False, "_doas": False, "_dzdo": False, "_su_user": None}


def uploads(files):
    """Commands: each launch file uploaded and given its mode.

    With ``_sudo`` (or doas/dzdo/su) pyinfra's SSH connector first uploads to ``/tmp/pyinfra-<sha1 of the
    destination>`` (a name any local user can compute and pre-create), created with the SFTP default mode, then
    ``cp``s it with sudo and leaves it behind if that fails (pyinfra 3.10, connectors/ssh.py put_file). So here
    every file travels through a fresh directory with an unguessable name, created 0700 by the SSH user
    (``mkdir`` fails if anything already has that name), removed right after; a leftover of a failed run is
    removed before the next upload. Without elevation the upload writes the destination directly."""
    args = getattr(host, "current_op_global_arguments", None) or {}
    elevated = any(args.get(k) for k in ELEVATION)
    private = host.get_temp_filename(f"specops-upload-{uuid.uuid4().hex}", hash_filename=False) if elevated else None
    if private:
        pattern = posixpath.basename(private).rsplit("-", 1)[0] + "-*"
        yield StringCommand("find", QuoteString(posixpath.dirname(private)), "-maxdepth", "1", "-user",
                            '"$(id -u)"', "-name", QuoteString(pattern), "-exec", "rm", "-rf", "{}", "+", ";",
                            "mkdir", "-m", "700", QuoteString(private), **AS_SSH_USER)
        other = next((args.get(k) for k in OTHER_USER if args.get(k)), None)
        if other:  # pyinfra grants that user read on the file (setfacl); it must be able to enter the directory
            yield StringCommand("setfacl", "-m", QuoteString(f"u:{other}:x"), QuoteString(private), **AS_SSH_USER)
    for f in files:
        temp = posixpath.join(private, posixpath.basename(f.path)) if private else None
        yield FileUploadCommand(StringIO(f.content), f.path, remote_temp_filename=temp)
        yield StringCommand("chmod", f.mode, QuoteString(f.path))
    if private:
        yield StringCommand("rm", "-rf", QuoteString(private), **AS_SSH_USER)


def _rolling() -> bool:
    # the batch size pyinfra itself uses for this operation (op argument _parallel, else --parallel)
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


@interrupt.stops_on_interrupt
def _await_ready(state, host, cfg: ServerConfig, sup, python: str, progress_s: float, peers=None) -> bool:
    """Wait for readiness; ``peers()`` (multi-node rank 0) may report a dead rank between rounds."""
    pid = [None]

    def read(budget: float) -> dict:
        opts = {"budget_s": round(budget, 3), "prompt": cfg.prompt, "engine": cfg.engine,
                "model": cfg.args.get("served_model_name") or cfg.args.get("model")}
        ok, out = host.run_shell_command(sup.ctl("wait", sup.directory, str(cfg.port), json.dumps(opts)))
        try:
            doc = json.loads("\n".join(out.stdout_lines))
        except ValueError:
            return {"dead": False, "health_generate": None, "generated": f"server_ctl: {out.stderr_lines[-3:]}"}
        pid[0] = doc.get("pid") or pid[0]
        if peers is not None and not doc.get("dead") and not doc.get("generation_ok"):
            doc = peers() or doc
        return doc

    verdict = await_ready(read, cfg, RealClock(), lambda m: report.log(host, f"server.running: {m}"), progress_s)
    misplaced = placement_problem(cfg, read_gpus(host, python), pid[0]) if verdict.ok else None
    if misplaced:  # on GPUs another job may need: stop it, as any failed start is stopped
        verdict = Readiness("misplaced", verdict.elapsed, (misplaced,))
    if verdict.ok:  # only a completed verification marks the server running (never a host-side wait)
        ok, out = host.run_shell_command(sup.ctl("verified", sup.directory, cfg.config_hash))
        if not ok:
            report.error(host, f"server.running: verified, but could not record it: {' '.join(out.stderr_lines[-2:])}")
            return False
        report.log(host, f"server.running: {verdict.text}", fg="green")
        return True
    if verdict.status != "dead":  # leave nothing half-started holding the GPUs
        host.run_shell_command(sup.stop(cfg.stop_grace_s)[0])
    lines = [f"server.running: {verdict.text}"]
    if verdict.log_tail:
        lines += ["  last lines of the server log:"] + [f"    {line}" for line in verdict.log_tail]
    lines += ["  GPU processes now:"] + [f"    {line}" for line in process_table(read_gpus(host, python))]
    report.error(host, "\n".join(lines))
    return False


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
        host.noop(f"server {server_name} not running ({status.problem or status.status})")
        return
    yield lock.acquired(f"server.stopped {server_name}", grace_s + 600, python)
    yield interrupt.guard(f"stopping server {server_name}")
    yield from sup.stop(grace_s)
