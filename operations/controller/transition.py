"""The steps of a server transition, shared by ``server.running`` and ``multinode.running``: the host lease,
the server directory, the old server stopped and its GPUs made idle, the launch files uploaded (safely under
privilege elevation), the start, and the wait until the live server is verified; plus the ``--diff`` of the
launch files. Each is a generator of pyinfra commands or a FunctionCommand body."""
from __future__ import annotations

import json
import posixpath
import uuid
from dataclasses import replace
from io import StringIO

from pyinfra import host, logger
from pyinfra.api import FileUploadCommand, FunctionCommand, QuoteString, StringCommand
from pyinfra.operations.util.files import generate_color_diff

from operations import gpu
from operations.controller import interrupt
from operations.controller import lease as lock
from operations.controller import output as report
from operations.controller.readiness import Readiness, await_ready, placement_problem
from operations.controller.idle_converge import wait_condition
from operations.controller.remote import Conversation, ask, connector_arguments
from operations.controller.waiting import RealClock
from operations.facts.gpu import read_gpus
from operations.model.gpus import parse_probe, process_table
from operations.model.idle_plan import IdlePlan, plan_idle
from operations.model.server_config import ServerConfig
from operations.model.server_state import recorded_view


def show_diffs(sup, files, status) -> None:
    """``--diff``: each launch file against what the host has (secrets files named, never shown)."""
    current = {sup.path("launch.sh"): status.launch_sh, sup.path("engine.yaml"): status.engine_yaml,
               **{sup.path(leaf): text for leaf, text in status.shipped.items()}}
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


def stop_and_idle(sup, cfg: ServerConfig, alive: bool, idle: bool, users, grace_s, idle_deadline_s, python):
    """Commands: this run's host lock and the server's 0700 directory (one round trip), our old server stopped, then (``idle``) its
    GPUs made idle."""
    if idle:
        gpu.timing_of(grace_s, idle_deadline_s)  # a bad pair fails here, before the old server is stopped
    yield lock.acquired(f"server {sup.name} -> config {cfg.name}",
                        idle_deadline_s + grace_s + cfg.stop_grace_s + cfg.ready_timeout_s + 600, python, sup.directory)
    if alive:
        yield interrupt.guard(f"stopping server {sup.name}")
        yield from sup.stop(cfg.stop_grace_s)
    if idle:
        yield from gpu.idle._inner(gpus=cfg.gpu_indices(), users=users, grace_s=grace_s,
                                   deadline_s=idle_deadline_s, python=python)


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


@interrupt.stops_on_interrupt
def verify_ready(state, host, cfg: ServerConfig, sup, python: str, progress_s: float, peers=None) -> bool:
    """Wait for readiness; ``peers()`` (multi-node rank 0) may report a dead rank between rounds."""
    return judge_ready(host, cfg, sup, python, progress_s, peers)


def judge_ready(host, cfg: ServerConfig, sup, python: str, progress_s: float, peers=None, first: dict | None = None,
                placed: dict | None = None, talk: Conversation | None = None) -> bool:
    """The readiness verdict, the placement check, and (only then) the server marked verified; a failed start
    is stopped. ``first``: a reading the host-side transition already took (its wait time counts against
    ``ready_timeout_s``), ``placed``: the GPU probe it took right after, ``talk``: that transition, still
    waiting to be told to mark the server verified (else the mark is a command of its own)."""
    pid, reads = [None], [0]

    def read(budget: float) -> dict:
        reads[0] += 1
        if first is not None and reads[0] == 1:
            pid[0] = first.get("pid")
            return first
        opts = {"budget_s": round(budget, 3), "prompt": cfg.prompt, "engine": cfg.engine,
                "model": cfg.args.get("served_model_name") or cfg.args.get("model")}
        doc = ask(host, sup.ctl("wait", sup.directory, str(cfg.port), json.dumps(opts)),
                  lambda why: {"dead": False, "health_generate": None, "generated": f"server_ctl: {why}"})
        pid[0] = doc.get("pid") or pid[0]
        if peers is not None and not doc.get("dead") and not doc.get("generation_ok"):
            doc = peers() or doc
        return doc

    spent = float(first.get("waited_s") or 0.0) if first else 0.0
    verdict = await_ready(read, cfg, RealClock(), lambda m: report.log(host, f"server.running: {m}"), progress_s,
                          spent_s=spent)
    misplaced = None
    if verdict.ok:  # the transition's own GPU reading, unless later reads let the server move on since
        gpus = parse_probe(placed) if placed is not None and reads[0] == 1 else read_gpus(host, python)
        misplaced = placement_problem(cfg, gpus, pid[0])
    if misplaced:  # on GPUs another job may need: stop it, as any failed start is stopped
        verdict = Readiness("misplaced", verdict.elapsed, (misplaced,))
    answered = None
    if talk is not None and talk.waiting:  # the transition waits for the mark: only "verified" marks the server
        lease = lock.handover(host)  # the run's last operation here: the transition also releases the lease
        answered = talk.reply("verified release" if lease else "verified") if verdict.ok else talk.close()
        lock.handed_over(host, answered)
    if verdict.ok:  # only a completed verification marks the server running (never a host-side wait)
        problem = _mark_verified(host, cfg, sup, answered)
        if problem:
            report.error(host, f"server.running: verified, but could not record it: {problem}")
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


def _mark_verified(host, cfg: ServerConfig, sup, answered: dict | None) -> str | None:
    """Why the verified mark could not be recorded, or None; ``answered``: the waiting transition's answer."""
    if answered is not None:
        mark = answered.get("verified")
        if isinstance(mark, dict):
            return mark.get("error")
        return answered.get("error") or "the transition did not answer"
    ok, out = host.run_shell_command(sup.ctl("verified", sup.directory, cfg.config_hash))
    return None if ok else " ".join(out.stderr_lines[-2:])


# ---- the one-step switch: the whole transition run by one host program ------------------------------------
STAGED = "staged.json"  # the launch files, uploaded into the server's 0700 directory ahead of the stop


def one_step_plan(cfg: ServerConfig, status, gpus_now, idle: bool, sel):
    """The idle plan when the whole switch can run on the host in one step (``transition.py``), else None: no
    privilege elevation (its uploads take their own path), readable GPUs, and nothing on the server's GPUs to
    stop but our own server (its supervisor stops it; the host then only waits for the memory). Anything else
    takes the step-by-step path (``stop_and_idle``, ``launch``, ``verify_ready``)."""
    args = getattr(host, "current_op_global_arguments", None) or {}
    if any(args.get(k) for k in ELEVATION):
        return None
    if not idle:
        return IdlePlan(tuple(cfg.gpu_indices()), idle=True)
    if not gpus_now.available:
        return None
    plan = plan_idle(gpus_now, sel)
    ours = {status.pid} if status.alive and status.pid else set()
    if plan.foreign or plan.unreadable or any(t.pid not in ours and t.pgid not in ours for t in plan.targets):
        return None
    return plan


def one_step(sup, cfg: ServerConfig, files, status, gpus_now, plan, sel, timing, engine_version, python, progress_s,
             idle):
    """Commands: the lease with the server directory (one round trip), the launch files uploaded as one staged file while the old
    server still serves, then one host program for stop -> release -> start -> ready (``switch``)."""
    yield lock.acquired(f"server {sup.name} -> config {cfg.name}",
                        timing.deadline_s + timing.grace_s + cfg.stop_grace_s + cfg.ready_timeout_s + 600, python,
                        sup.directory)
    yield FileUploadCommand(StringIO(staged(sup, files)), sup.path(STAGED))
    devices = host.data.get("specops_gpu_devices") or None
    release = idle and (status.alive or not plan.idle)
    if idle and not release:  # nothing stopped, nothing held: as gpu.idle says it
        host.noop(gpu.already_idle(plan, gpus_now))
    spec = {"stop": {"grace_s": cfg.stop_grace_s, "unit": sup.unit} if status.alive else None,
            "release": ({"condition": {**wait_condition(plan, sel, timing, idle=True), "budget_s": timing.deadline_s,
                                       "stop_on_intruders": True}, "devices": devices} if release else None),
            "staged": STAGED, "start": {"hash": cfg.config_hash, "port": cfg.port, "unit": sup.unit},
            "annotate": recorded_view(cfg, engine_version), "devices": devices,
            "wait": {"budget_s": cfg.ready_timeout_s, "prompt": cfg.prompt, "engine": cfg.engine,
                     "model": cfg.args.get("served_model_name") or cfg.args.get("model"), "progress_s": progress_s}}
    yield interrupt.guard(f"switching server {sup.name}")
    yield FunctionCommand(switch, (cfg, sup, spec, files, sel, timing, python, progress_s,
                                   connector_arguments(host)), {})


def staged(sup, files) -> str:
    """The launch files as one document for ``transition.py`` (paths outside the server directory: the unit)."""
    return json.dumps({"files": [{"path": f.path, "content": f.content, "mode": f.mode,
                                  "outside": posixpath.dirname(f.path) != sup.directory} for f in files]})


@interrupt.stops_on_interrupt
def switch(state, host, cfg: ServerConfig, sup, spec: dict, files, sel, timing, python, progress_s,
           arguments: dict) -> bool:
    """Run the host-side transition, printing its progress lines as they come, then judge it: a release the
    host could not prove goes through ``gpu.idle``'s own converge (same verdicts, same kills) and, once idle,
    the rest runs again on the host; then readiness, placement and the verified mark as ``verify_ready`` (the
    mark over the transition's own channel when it can wait for it)."""
    with _transition(host, sup, spec, arguments) as talk:
        return _judge_switch(host, cfg, sup, spec, files, sel, timing, python, progress_s, arguments, talk)


def _judge_switch(host, cfg, sup, spec, files, sel, timing, python, progress_s, arguments, talk) -> bool:
    doc = talk.document
    if doc.get("phase") in ("stop", "release"):
        step = doc[doc["phase"]]
        report.log(host, f"server.running: {step.get('error')}: handing over to gpu.idle", fg="yellow")
        if doc["phase"] == "release" and not step.get("intruders") and step.get("source") != "none":
            # the host already waited the whole deadline for the release: judge what is there, do not wait again
            timing = replace(timing, grace_s=0.0, deadline_s=max(0.5, 4 * timing.stable_s))
        if not gpu.converge_now(host, python, sel, timing):
            return False
        if not host.put_file(StringIO(staged(sup, files)), sup.path(STAGED)):
            report.error(host, f"server.running: could not upload {sup.path(STAGED)}")
            return False
        talk.close()
        with _transition(host, sup, {**spec, "stop": None, "release": None}, arguments) as talk:
            return _judge_switch(host, cfg, sup, {**spec, "stop": None, "release": None}, files, sel, timing,
                                 python, progress_s, arguments, talk)
    if doc.get("phase") not in ("wait", "done"):
        step = doc.get(doc.get("phase") or "")
        why = (step.get("error") if isinstance(step, dict) else None) or doc.get("error")
        report.error(host, f"server.running: {doc.get('phase') or 'transition'} failed: {why}")
        return False
    return judge_ready(host, cfg, sup, python, progress_s, first=doc["wait"], placed=doc.get("gpus"), talk=talk)


def _transition(host, sup, spec: dict, arguments: dict) -> Conversation:
    def build(replies: bool):  # a program that can be answered waits for the verified mark
        asked = ({**spec, "verdict": {"hash": spec["start"]["hash"], "lease": lock.handover(host)}} if replies
                 else spec)
        return sup.ctl(sup.directory, json.dumps(asked, sort_keys=True), program="transition.py")

    return Conversation(host, build, lambda line: report.log(host, f"server.running: {line}"), arguments,
                        lambda why: {"phase": None, "error": f"transition: {why}"})
