"""The steps of a server transition, shared by ``server.running`` and ``multinode.running``: the host lease,
the server directory, the old server stopped and its GPUs made idle, the launch files uploaded (safely under
privilege elevation), the start, and the wait until the live server is verified; plus the ``--diff`` of the
launch files. Each is a generator of pyinfra commands or a FunctionCommand body."""
from __future__ import annotations

import json
import posixpath
import uuid
from io import StringIO

from pyinfra import host, logger
from pyinfra.api import FileUploadCommand, FunctionCommand, QuoteString, StringCommand
from pyinfra.operations.util.files import generate_color_diff

from operations import gpu
from operations.controller import interrupt
from operations.controller import lease as lock
from operations.controller import output as report
from operations.controller.readiness import Readiness, await_ready, placement_problem
from operations.controller.remote import ask
from operations.controller.waiting import RealClock
from operations.facts.gpu import read_gpus
from operations.model.gpus import process_table
from operations.model.server_config import ServerConfig
from operations.model.server_state import recorded_view


def show_diffs(sup, files, status) -> None:
    """``--diff``: each launch file against what the host has (secrets files named, never shown)."""
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


def stop_and_idle(sup, cfg: ServerConfig, alive: bool, idle: bool, users, grace_s, idle_deadline_s, python):
    """Commands: this run's host lock, the server's 0700 directory, our old server stopped, then (``idle``) its
    GPUs made idle."""
    if idle:
        gpu.timing_of(grace_s, idle_deadline_s)  # a bad pair fails here, before the old server is stopped
    yield lock.acquired(f"server {sup.name} -> config {cfg.name}",
                        idle_deadline_s + grace_s + cfg.stop_grace_s + cfg.ready_timeout_s + 600, python)
    yield FunctionCommand(prepare_dir, (sup,), {})
    if alive:
        yield interrupt.guard(f"stopping server {sup.name}")
        yield from sup.stop(cfg.stop_grace_s)
    if idle:
        yield from gpu.idle._inner(gpus=cfg.gpu_indices(), users=users, grace_s=grace_s,
                                   deadline_s=idle_deadline_s, python=python)


def prepare_dir(state, host, sup) -> bool:
    """The server's 0700 directory created or checked (refused in a tree other users can write), a corrupt
    state.json set aside; what was done is said."""
    doc = ask(host, sup.ctl("prepare", sup.directory))
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


@interrupt.stops_on_interrupt
def verify_ready(state, host, cfg: ServerConfig, sup, python: str, progress_s: float, peers=None) -> bool:
    """Wait for readiness; ``peers()`` (multi-node rank 0) may report a dead rank between rounds."""
    pid = [None]

    def read(budget: float) -> dict:
        opts = {"budget_s": round(budget, 3), "prompt": cfg.prompt, "engine": cfg.engine,
                "model": cfg.args.get("served_model_name") or cfg.args.get("model")}
        doc = ask(host, sup.ctl("wait", sup.directory, str(cfg.port), json.dumps(opts)),
                  lambda why: {"dead": False, "health_generate": None, "generated": f"server_ctl: {why}"})
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
