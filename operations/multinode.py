"""``multinode.running``: one model served by a group of hosts (SGLang ``--nnodes``), converged all-or-nothing.

The group and the ranks come from the inventory (``operations.model.topology``: host data ``specops_group``, optional
``specops_rank``). One decision is taken for the whole group from every rank's status: if all ranks run the
desired config (their own rank's args) and rank 0 is healthy, nothing changes anywhere; otherwise the whole group
is restarted in order, as five operations that each finish on every rank before the next begins:

1. every rank: stop our server, ``gpu.idle`` on its GPUs (no rank starts into a CUDA OOM);
2. rank 0 starts (it hosts the rendezvous at ``dist_init_addr``);
3. ranks > 0 start and join it;
4. rank 0 must become ready (health, a real generation, the config it reports, accept length), while the
   other ranks are watched: one that dies fails the wait at once, with its log tail;
5. ranks > 0 must be alive; if rank 0 failed they stop themselves, so no half group holds GPUs.

A rank whose host is unreachable fails the group's run on every reachable rank, and nothing is changed.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import gevent
from gevent.event import AsyncResult
from pyinfra import host, state
from pyinfra.api import FunctionCommand, deploy, operation

from operations.controller import output as report
from operations.controller import run_state, summary, supervisors, transition
from operations.controller.readiness import live_problems, placement_problem
from operations.controller.remote import ask, host_python
from operations.controller.supervisors import Supervisor
from operations.errors import ConfigError, Issue
from operations.facts.engine import check_engine
from operations.facts.gpu import read_gpus
from operations.facts.server import read_server
from operations.model import hostdata, topology
from operations.model.engine_check import EngineCheck
from operations.model.server_config import ServerConfig
from operations.model.server_state import ServerStatus, drift


@dataclass(frozen=True)
class Member:
    host: object  # the pyinfra Host
    rank: topology.Rank
    cfg: ServerConfig  # as this rank runs it
    sup: Supervisor
    python: str
    status: ServerStatus | None  # None: unreachable
    check: EngineCheck | None = None  # what the host's own SGLang says of this rank's command line (restarts)

    @property
    def label(self) -> str:
        return f"rank {self.rank.rank} ({self.host.name})"

    @property
    def healthy(self) -> bool:
        s = self.status
        if s is None or not (s.alive and s.status == "running" and s.config_hash == self.cfg.config_hash):
            return False
        if self.rank.rank > 0:
            return True  # workers serve no HTTP: liveness is all there is
        return s.health == 200 and not any(c.restart for c in drift(self.cfg, s))

    def why(self) -> str:
        s = self.status
        if s is None:
            return f"{self.label}: unreachable"
        if not s.alive:
            gone = s.status in ("starting", "running")
            return f"{self.label}: " + (f"pid {s.pid} exited (was {s.status})" if gone else f"not running ({s.status})")
        if s.config_hash != self.cfg.config_hash:
            return f"{self.label}: runs config {s.config_hash}, want {self.cfg.config_hash} ({self.cfg.name})"
        if s.status != "running":
            return f"{self.label}: pid {s.pid} never verified ({s.status})"
        if self.rank.rank == 0 and s.health != 200:
            return f"{self.label}: pid {s.pid} unhealthy (/health {s.health})"
        return f"{self.label}: reports other settings than it was started with (drift)"


@dataclass(frozen=True)
class GroupPlan:
    group: str
    members: tuple[Member, ...]

    @property
    def unreachable(self) -> list[Member]:
        return [m for m in self.members if m.status is None]

    @property
    def restart(self) -> bool:
        return not self.unreachable and not all(m.healthy for m in self.members)

    def member(self, on_host) -> Member:
        return next(m for m in self.members if m.host.name == on_host.name)

    @property
    def leader(self) -> Member:
        return self.members[0]


def group_plan(config, server_name: str, supervisor, state_dir, python) -> GroupPlan:
    """The group's plan, read once per stage (prepare/execute) by whichever rank asks first."""
    rank = topology.rank_of(host, state.inventory)
    plans = run_state.scoped(state, "group_plans", lambda _state: {})  # key -> AsyncResult
    key = (state.is_executing, rank.group, server_name)
    if key not in plans:
        plans[key] = result = AsyncResult()
        try:
            result.set(_read_group(rank, config, server_name, supervisor, state_dir, python))
        except BaseException as exc:
            result.set_exception(exc)
    return plans[key].get()


def _read_group(rank, config, server_name, supervisor, state_dir, python) -> GroupPlan:
    hosts = topology.members(rank.group, state.inventory)
    issues = topology.rank_issues(rank.group, list(state.inventory))
    if issues:
        raise ConfigError(issues)

    def one(h) -> Member:
        h_rank = topology.rank_of(h, state.inventory)
        h_python = host_python(python, on_host=h)
        cfg = topology.for_rank(hostdata.config_for(config, h), h_rank)
        sup = supervisors.for_host(server_name, supervisor, state_dir, h_python, h)
        status = None
        if h in state.active_hosts:
            try:
                status = read_server(h, sup, cfg.port, h_python)
            except Exception:  # connection lost: the rank is unreachable for this run
                status = None
        return Member(h, h_rank, cfg, sup, h_python, status)

    jobs = [gevent.spawn(one, h) for h in hosts]
    gevent.joinall(jobs, raise_error=True)
    plan = GroupPlan(rank.group, tuple(j.value for j in jobs))
    if not plan.restart:
        return plan
    # a restart: every rank's host must accept its command line before any rank is stopped
    checks = [gevent.spawn(check_engine, m.cfg, m.sup.path("engine.yaml"), m.host) for m in plan.members]
    gevent.joinall(checks, raise_error=True)
    return replace(plan, members=tuple(replace(m, check=c.value) for m, c in zip(plan.members, checks)))


def _validated(me: Member) -> None:
    gpus_now = read_gpus(host, me.python)
    issues = topology.rank_config_issues(me.cfg, host, list(state.inventory),
                                       len(gpus_now.gpus) if gpus_now.available else None)
    if issues:
        raise ConfigError(issues)


@operation()
def _stop_and_idle(config, server_name, supervisor, state_dir, idle, users, grace_s, idle_deadline_s, python):
    summary.watch(state)
    plan = group_plan(config, server_name, supervisor, state_dir, python)
    me = plan.member(host)
    if plan.unreachable:
        gone = ", ".join(m.label for m in plan.unreachable)
        yield summary.failure(f"group {plan.group}: {gone} unreachable; the group cannot converge, "
                              f"nothing changed on {me.label}")
        return
    _validated(me)
    refused = [f"{m.label}: {m.check.problem}" for m in plan.members if m.check and m.check.problem]
    if refused:
        yield summary.failure(f"group {plan.group}: {'; '.join(refused)}; nothing changed on {me.label}")
        return
    if not plan.restart:
        s = me.status
        problems = live_problems(me.cfg, s.server_info) if me.rank.rank == 0 else []
        if problems:  # converged but underperforming: a group restart would not change the draft's acceptance
            yield summary.failure(f"group {plan.group}: {me.label} runs config {me.cfg.name}, but "
                                  f"{'; '.join(problems)}; not restarting the group")
            return
        host.noop(f"group {plan.group}: {me.label} of {me.rank.nnodes} runs config {me.cfg.name} "
                  f"({me.cfg.config_hash}), pid {s.pid}, {'healthy' if me.rank.rank == 0 else 'alive'}")
        return
    if report.print_plan_now():
        report.log(host, f"multinode.running {server_name}: group {plan.group} restarts all {me.rank.nnodes} "
                         f"ranks in order; " + "; ".join(m.why() for m in plan.members if not m.healthy))
        for change in drift(me.cfg, me.status):
            report.log(host, f"    {change}")
        for note in me.check.notes if me.check and me.cfg.engine == "sglang" else ():
            report.log(host, f"    note: {note}", fg="yellow")
    yield from transition.stop_and_idle(me.sup, me.cfg, me.status.alive, idle, users, grace_s, idle_deadline_s,
                                    me.python)


@operation()
def _start_ranks(config, server_name, supervisor, state_dir, python, leader: bool):
    plan = group_plan(config, server_name, supervisor, state_dir, python)
    me = plan.member(host)
    if not plan.restart or (me.rank.rank == 0) != leader:
        return
    files = me.sup.files(me.cfg)
    if report.print_plan_now() and state.config.DIFF:
        transition.show_diffs(me.sup, files, me.status)
    yield from transition.launch(me.sup, me.cfg, files, me.check.version if me.check else None)


@operation()
def _leader_ready(config, server_name, supervisor, state_dir, python, progress_s):
    plan = group_plan(config, server_name, supervisor, state_dir, python)
    me = plan.member(host)
    if not plan.restart or me.rank.rank != 0:
        return
    workers = plan.members[1:]

    def peers() -> dict | None:
        for m in workers:
            doc = _live(m, mark=False)
            if not doc.get("alive"):
                return {"dead": True, "reason": f"{m.label} exited while rank 0 waited for the group",
                        "log_tail": [f"{m.label}: {line}" for line in doc.get("log_tail") or []]}
        return None

    yield FunctionCommand(transition.verify_ready, (me.cfg, me.sup, me.python, progress_s, peers), {})


def _live(m: Member, mark: bool = True) -> dict:
    args = ("live", m.sup.directory) + (() if mark else ("peek",))
    return ask(m.host, m.sup.ctl(*args), lambda why: {"alive": False, "log_tail": [f"server_ctl: {why}"]})


def _await_worker(state, host, plan: GroupPlan, me: Member) -> bool:
    if plan.leader.host in state.failed_hosts:
        host.run_shell_command(me.sup.stop(me.cfg.stop_grace_s)[0])
        report.error(host, f"multinode.running: {plan.leader.label} did not become ready; {me.label} stopped "
                           f"so no half group holds GPUs")
        return False
    doc = _live(me)
    misplaced = placement_problem(me.cfg, read_gpus(host, me.python), doc.get("pid")) if doc.get("alive") else None
    if misplaced:  # on GPUs another job may need: stopped, and rank 0 with it (no half group holds GPUs)
        host.run_shell_command(me.sup.stop(me.cfg.stop_grace_s)[0])
        lead = plan.leader
        lead.host.run_shell_command(lead.sup.stop(lead.cfg.stop_grace_s)[0])
        report.error(host, f"multinode.running: {me.label} runs on other GPUs than its config declares: "
                           f"{misplaced}; it and {lead.label} stopped (the group restarts on the next run)")
        return False
    if doc.get("alive"):
        report.log(host, f"multinode.running: {me.label} alive (pid {doc.get('pid')}), group {plan.group} "
                         f"ready", fg="green")
        return True
    tail = "\n".join(f"    {me.cfg.redact(line)}" for line in doc.get("log_tail") or [])
    report.error(host, f"multinode.running: {me.label} exited after rank 0 became ready\n"
                       f"  last lines of the server log:\n{tail}")
    return False


@operation()
def _workers_live(config, server_name, supervisor, state_dir, python):
    plan = group_plan(config, server_name, supervisor, state_dir, python)
    me = plan.member(host)
    if not plan.restart or me.rank.rank == 0:
        return
    yield FunctionCommand(_await_worker, (plan, me), {})


@deploy("Multi-node server")
def running(config, server_name: str = "llm", supervisor: str | None = None, state_dir: str | None = None,
            idle: bool = True, users=None, grace_s: float = 10.0, idle_deadline_s: float = 120.0,
            progress_s: float = 10.0, python: str | None = None):
    """
    Make a group of hosts serve one model (SGLang multi-node) with config X, all-or-nothing.

    + config: a ServerConfig or config name/path; ``nnodes``, ``node-rank`` and ``dist-init-addr`` are filled in
      per rank from the inventory group (``specops_group``; ``specops_rank``, ``specops_dist_host``,
      ``specops_dist_port`` optional)
    + server_name, supervisor, state_dir, idle, users, grace_s, idle_deadline_s, progress_s, python: as for
      ``server.running``

    Every rank healthy with the desired config: no change. Any rank dead, unverified or on another config: the
    whole group is restarted in order (stop + GPUs idle everywhere, rank 0, the other ranks, rank 0 ready, the
    other ranks alive).

    **Examples:**

    .. code:: python

        from operations import multinode

        multinode.running(config="eagle3-llama3.1-70b-2node")   # hosts with specops_group="llama70b"
    """
    group = host.data.get("specops_group")
    if not group:
        raise ConfigError([Issue("specops_group", "multinode.running needs the host in a group (host data "
                                                  "specops_group); use server.running for a single host", host.name)])
    common = dict(config=config, server_name=server_name, supervisor=supervisor, state_dir=state_dir,
                  python=python)
    _stop_and_idle(name=f"group {group}: stop, GPUs idle", idle=idle, users=users, grace_s=grace_s,
                   idle_deadline_s=idle_deadline_s, **common)
    _start_ranks(name=f"group {group}: start rank 0", leader=True, **common)
    _start_ranks(name=f"group {group}: start ranks > 0", leader=False, **common)
    _leader_ready(name=f"group {group}: rank 0 ready", progress_s=progress_s, **common)
    _workers_live(name=f"group {group}: ranks > 0 alive", **common)
