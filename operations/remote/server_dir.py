"""A server directory and what its live server answers, read side: the host-program module behind
``server_ctl status`` and shared by ``server_ctl`` and ``bench_ctl``.

state.json is schema-checked before anything in it is trusted; secrets are read from secrets.env here, never
from a command line; everything that leaves (log tail, /server_info, errors) goes through ``redactor``.
"""
import json
import os
import shlex
import subprocess
import sys

from . import loopback
from .common import (DICT, INT, NUM, SHIPPED_FILES, STR, masked, private_dir, read_doc, save_json, secret_name,
                     set_aside, start_time, unsafe_tree)


LOG_TAIL = 40
STATUSES = ("starting", "running", "stopped", "failed")
# state.json: what specops started. Every field is type-checked before it is trusted: a pid or pgid from a
# document that does not pass is never signalled.
STATE_SCHEMA = {"status": (STR, False), "pid": (INT, True), "pgid": (INT, True), "start": (INT, True),
                "config_hash": (STR, True), "started_at": (NUM, True), "supervisor": (STR, True),
                "unit": (STR, True), "recorded": (DICT, True), "stopped_at": (NUM, True),
                "failed_at": (NUM, True), "verified_at": (NUM, True)}


def read(path, default=None):
    try:
        with open(path) as fh:
            return fh.read()
    except OSError:
        return default


def state_problem(d):
    """Why the server directory cannot be trusted or its state.json not be read, or None."""
    unsafe = unsafe_tree(d)
    if unsafe:
        return f"unsafe server directory {d}: {unsafe}"
    _, problem = read_doc(os.path.join(d, "state.json"), STATE_SCHEMA, required=("status",))
    return f"{os.path.join(d, 'state.json')}: {problem}" if problem else None


def load_state(d, notes=None):
    """state.json as a dict ({} when absent). A corrupt one reads as {}; where ``notes`` is given (a command that
    changes the host) it is also set aside, and that is noted, so the host is never wedged by it."""
    path = os.path.join(d, "state.json")
    doc, problem = read_doc(path, STATE_SCHEMA, required=("status",))
    if problem is None:
        return doc
    if doc is None and problem and notes is not None:
        try:
            notes.append(f"{path}: {problem}: set aside as {set_aside(path)}; nothing it names was signalled")
        except OSError as exc:
            notes.append(f"{path}: {problem}: could not set it aside ({exc.strerror})")
    return {}


def save_state(d, state):
    save_json(os.path.join(d, "state.json"), state)


def alive(state):
    """The process specops started still runs: a positive integer pid whose /proc start time is the recorded one.
    (A missing or null start never matches: None == None must not make a dead or unknown pid 'alive'.)"""
    pid, start = state.get("pid"), state.get("start")
    return isinstance(start, int) and not isinstance(start, bool) and start_time(pid) == start


def secrets(d):
    """NAME -> value of every entry in secrets.env (``NAME=value`` and ``export NAME=value``, shell-quoted; a
    quoted value may span lines, so the whole file is split as the shell reads it)."""
    try:
        words = shlex.split(read(os.path.join(d, "secrets.env"), "") or "", comments=True)
    except ValueError:  # unbalanced quotes: fall back to one entry a line
        words = [w for line in (read(os.path.join(d, "secrets.env"), "") or "").splitlines() for w in [line.strip()]]
    out = {}
    for word in words:
        key, eq, value = word.partition("=")
        if eq and key and key != "export":
            out[key] = value
    return out


def secret(d, name):
    return secrets(d).get(name)


def http(d, port, path, body=None, timeout=2.0):
    """(status code or None, parsed JSON or text or error string); the API key from secrets.env, if any."""
    key = secret(d, "SPECOPS_SECRET_API_KEY")
    try:
        code, raw = loopback.request(port, path, body, {"Authorization": f"Bearer {key}"} if key else None, timeout)
    except OSError as exc:
        return None, str(exc) if isinstance(exc, loopback.HTTPFailure) else f"{type(exc).__name__}: {exc}"
    text = raw.decode(errors="replace")
    if code >= 400:
        return code, text[:500]
    try:
        return code, json.loads(text)
    except ValueError:
        return code, text


MIN_SECRET_LEN = 4  # shorter values would blank ordinary words; their fields are still masked by name


def redactor(d):
    """A function that masks what the server reports or logs: fields and flags named like secrets (``api_key``,
    ``--api-key VALUE`` in ``launch_command``) and, anywhere in any string, every value in secrets.env."""
    values = sorted((v for v in secrets(d).values() if len(v) >= MIN_SECRET_LEN), key=len, reverse=True)

    def text(value):
        for v in values:
            value = value.replace(v, "<secret>")
        return value

    def walk(info, key=None):
        if isinstance(info, dict):
            return {k: ("<secret>" if secret_name(k) and v not in (None, "") else walk(v, k)) for k, v in info.items()}
        if isinstance(info, list):  # a command line given as a list: flags named like secrets hide their value
            items = [walk(v) for v in info]
            return masked(items) if all(isinstance(v, str) for v in items) else items
        if isinstance(info, str):  # values first (a key with a space is one value), then flags by name
            return " ".join(masked(text(info).split(" "))) if key == "launch_command" else text(info)
        return info

    return walk


def server_info(d, port, timeout=2.0):
    """(status, the server's own report, masked): ``/server_info`` (SGLang >= 0.5), ``/get_server_info`` only when
    that is missing (older SGLang; 0.5 logs a deprecation warning on every call of it)."""
    code, info = http(d, port, "/server_info", timeout=timeout)
    if code == 404:
        code, info = http(d, port, "/get_server_info", timeout=timeout)
    if code != 200 or not isinstance(info, dict):
        return code, None if code == 200 else redactor(d)(str(info)[:200])
    return code, redactor(d)(info)


def log_tail(d, n=LOG_TAIL):
    text = read(os.path.join(d, "server.log"), "") or ""
    return redactor(d)(text.splitlines()[-n:])


def unit_pid(unit):
    out = subprocess.run(["systemctl", "show", "-p", "MainPID", "--value", unit], capture_output=True, text=True)
    try:
        return int(out.stdout.strip() or 0)
    except ValueError:
        return 0


def cmd_prepare(d):
    """The server's own 0700 directory, created or checked: never a symlink, never in a tree another user can
    write (they could swap launch.sh, which this host's specops user runs)."""
    problem = private_dir(d)
    if problem:
        return {"error": problem}
    notes = []
    load_state(d, notes)  # a corrupt state.json is set aside now, and said, before anything else reads it
    return {"ready": d, "notes": notes}


def cmd_status(d, port, unit=None):
    problem = state_problem(d)
    state = load_state(d)
    if unit and state.get("status") in ("running", "starting"):
        pid = unit_pid(unit)
        state["pid"], state["start"] = (pid, start_time(pid)) if pid else (None, None)
    doc = {"state": state, "alive": alive(state), "launch_sh": read(os.path.join(d, "launch.sh")),
           "engine_yaml": read(os.path.join(d, "engine.yaml")),
           "shipped": {leaf: read(os.path.join(d, leaf)) for leaf in SHIPPED_FILES.values()
                       if os.path.exists(os.path.join(d, leaf))},
           "unit_file": read(f"/etc/systemd/system/{unit}") if unit else None}
    if problem:
        doc["problem"] = problem
    code, _ = http(d, port, "/health", timeout=1.0)
    doc["health"] = code
    if code is not None:
        info_code, info = server_info(d, port)
        doc["server_info"] = info if info_code == 200 else None
    return doc


def refuse_unsafe(d):
    unsafe = unsafe_tree(d)
    if unsafe:  # never write (or run launch.sh) in a tree another local user could have swapped
        reply({"error": f"unsafe server directory {d}: {unsafe}"})


def reply(out):
    """Print the answer (one JSON document), its notes and error on stderr; exit 1 on an error."""
    sys.stdout.write(json.dumps(out) + "\n")
    for note in out.get("notes") or ():
        sys.stderr.write(note + "\n")
    if "error" in out:
        sys.stderr.write(out["error"] + "\n")
        sys.exit(1)
