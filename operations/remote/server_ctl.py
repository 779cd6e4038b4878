"""Server control on the target host (``run.py server_ctl COMMAND DIR ...``); prints one JSON document.

DIR holds one server: launch.sh (0700), secrets.env (0600, sourced by launch.sh), state.json (what specops
started: pid, start time, config hash), server.log. Every command but ``status`` refuses a DIR in
a tree another local user could write; state.json is schema-checked and a corrupt one is set aside (renamed
``state.json.corrupt-...``) by the commands that change the host, never acted upon. Secrets never travel on a
command line: the HTTP checks here
read the API key from secrets.env themselves.

    status DIR PORT [UNIT]         state, liveness, /health, /server_info, launch.sh + engine.yaml (read only)
    start DIR HASH [PORT]          setsid launch.sh >> server.log, record pid/start/hash (refused if PORT is taken)
    record DIR HASH UNIT           after systemctl start: record the unit's MainPID
    annotate DIR JSON              add what the server was started with (masked args, verify settings)
    verified DIR HASH              the controller verified it: status -> running (only the controller marks it so:
                                   this, and ``live`` for worker ranks in a group's last stage)
    stop DIR GRACE [UNIT]          TERM the process group, KILL after GRACE seconds; state -> stopped
    wait DIR PORT JSON             sample until ready (or dead, or budget spent); JSON: budget_s, prompt, engine

Benchmarks against the server are bench_ctl's.
"""
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time

from .common import masked, open_append, start_time
from .server_dir import (alive, cmd_status, http, load_state, log_tail, read, refuse_unsafe, reply, save_state,
                         server_info, unit_pid)

def listener(port):
    """'pid N (cmdline)' of whoever listens on TCP ``port``, 'unknown process' if hidden, None if free."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in (read(table, "") or "").splitlines()[1:]:
            cols = line.split()
            if len(cols) > 9 and cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(cols[9])
    if not inodes:
        return None
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
            if any(os.readlink(f"/proc/{pid}/fd/{fd}") in {f"socket:[{i}]" for i in inodes} for fd in fds):
                cmd = " ".join(masked((read(f"/proc/{pid}/cmdline", "") or "").split("\0"))).strip()
                return f"pid {pid} ({cmd[:160]})"
        except OSError:
            continue
    return "unknown process"


def detach(argv, log_path, env=None):
    """Start argv in its own session (stopped as a group, never with the caller), output appended to
    log_path (0600), stdin from /dev/null; returns its pid (it is re-parented, so nobody here waits on it)."""
    r, w = os.pipe()
    mid = os.fork()
    if mid == 0:
        os.close(r)
        os.setsid()
        pid = os.fork()
        if pid:
            os.write(w, str(pid).encode())
            os._exit(0)
        log = open_append(log_path)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.execve(argv[0], argv, env if env is not None else os.environ)
    os.close(w)
    os.waitpid(mid, 0)
    return int(os.read(r, 32) or 0)


def cmd_start(d, config_hash, port=None):
    notes = []
    state = load_state(d, notes)
    if alive(state):
        return {"error": f"already running as pid {state['pid']}"}
    owner = listener(port) if port else None
    if owner:  # starting now would only die with 'Address already in use' after loading the weights
        return {"error": f"port {port} is already in use by {owner}; not starting", "notes": notes}
    pid = detach(["/bin/sh", os.path.join(d, "launch.sh")], os.path.join(d, "server.log"))
    state = {"status": "starting", "pid": pid, "pgid": os.getpgid(pid), "start": start_time(pid),
             "config_hash": config_hash, "started_at": time.time(), "supervisor": "process"}
    save_state(d, state)
    return {**state, "notes": notes}


def cmd_record(d, config_hash, unit):
    notes = []
    load_state(d, notes)  # a corrupt one is set aside (and said) before it is replaced
    pid = unit_pid(unit)
    state = {"status": "starting", "pid": pid or None, "pgid": os.getpgid(pid) if pid else None,
             "start": start_time(pid), "config_hash": config_hash, "started_at": time.time(),
             "supervisor": "systemd", "unit": unit}
    save_state(d, state)
    return {**state, "notes": notes}


def cmd_annotate(d, recorded):
    """What the server was started with (masked arguments, verify settings), added to its state.json."""
    state = load_state(d, [])
    if not state:
        return {"error": "no state.json to annotate"}
    state = {**state, "recorded": recorded}
    save_state(d, state)
    return state


def cmd_verified(d, config_hash):
    """The controller verified the server (health, generation, reported config, accept length): only now is it
    'running'. Host-side waits never mark it so: a wait orphaned by a lost controller proves nothing."""
    state = load_state(d, [])
    if not alive(state) or state.get("config_hash") != config_hash:
        return {"error": f"not marking verified: the server is {'gone' if not alive(state) else 'on config ' + str(state.get('config_hash'))}"}
    state = {**state, "status": "running", "verified_at": time.time()}
    save_state(d, state)
    return state


def signal_group(state, grace, kill_wait):
    """TERM the process group of something we started, KILL it if it outlives ``grace`` seconds, wait up to
    ``kill_wait`` for that; the last signal sent ("TERM", "KILL", None). Nothing is signalled unless the pid is
    alive with its recorded start time; the group only while that pid is still in the recorded group, else the
    pid alone (a pgid from a stale or edited document never reaches killpg)."""
    sent = None
    for sig, wait_s in ((signal.SIGTERM, grace), (signal.SIGKILL, kill_wait)):
        if not alive(state):
            break
        pid, pgid = state["pid"], state.get("pgid")
        try:
            if isinstance(pgid, int) and pgid > 1 and os.getpgid(pid) == pgid:
                os.killpg(pgid, sig)
            else:
                os.kill(pid, sig)
        except ProcessLookupError:
            break  # gone already
        sent = sig.name[3:]
        wait_exit(state, wait_s)
    return sent


def wait_exit(state, timeout):
    """Until the recorded process exits or ``timeout`` passes: woken by its pidfd the moment it exits (Linux
    5.3+), else by polling its /proc start time every 20 ms."""
    end = time.monotonic() + timeout
    try:
        fd = os.pidfd_open(state["pid"])
    except (AttributeError, OSError):
        fd = None
    if fd is not None:
        try:
            if alive(state):  # checked after opening: the pidfd is of the recorded process, not a reused pid
                select.select([fd], [], [], max(0.0, end - time.monotonic()))
        finally:
            os.close(fd)
    while alive(state) and time.monotonic() < end:
        time.sleep(0.02)


def cmd_stop(d, grace, unit=None):
    notes = []
    state = load_state(d, notes)
    out = {"was": state.get("pid") if alive(state) else None, "signal": None, "notes": notes}
    if unit:
        subprocess.run(["systemctl", "stop", unit], check=False)
    elif out["was"]:
        out["signal"] = signal_group(state, grace, 10.0)
        if alive(state):  # e.g. stuck in the driver (D state): say so rather than hang
            out["survivor"] = state["pid"]
    if state:
        save_state(d, {**state, "status": "stopped", "stopped_at": time.time()})
    return out


def probe_ready(d, port, opts, end):
    """One look: is the server up, does it generate, what does it say about itself? (Each request's timeout
    ends by ``end``, so a hung server cannot stretch the caller's deadline.)"""
    def left(cap):
        return max(0.2, min(cap, end - time.monotonic()))

    doc = {"health_generate": None, "generated": None, "server_info": None}
    health = "/health" if opts.get("engine") == "vllm" else "/health_generate"  # vLLM has no health_generate
    code, _ = http(d, port, health, timeout=left(5.0))
    doc["health_generate"] = code
    if code != 200:
        return doc
    if opts.get("engine") == "vllm":
        code, out = http(d, port, "/v1/completions", {"model": opts.get("model"), "prompt": opts["prompt"],
                                                      "max_tokens": 8, "temperature": 0}, timeout=left(60))
        text = out["choices"][0]["text"] if code == 200 and isinstance(out, dict) else None
    else:
        code, out = http(d, port, "/generate", {"text": opts["prompt"],
                                                "sampling_params": {"max_new_tokens": 8, "temperature": 0}},
                         timeout=left(60))
        text = out.get("text") if code == 200 and isinstance(out, dict) else None
    doc["generated"] = text if text else f"generation failed: HTTP {code}: {str(out)[:200]}"
    doc["generation_ok"] = bool(text)
    info_code, info = server_info(d, port, timeout=left(2.0))
    doc["server_info"] = info if info_code == 200 else None
    return doc


def listening(port):
    """Something accepts TCP connections on localhost:``port`` (a cheap look before any HTTP request)."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
        return True
    except OSError:
        return False


def cmd_wait(d, port, opts, on_round=None):
    """Sample until the server generates, dies, or ``budget_s`` is spent: every 20 ms while its port is still
    closed (loading), every 100 ms once it answers HTTP. ``on_round(doc, elapsed)`` sees each look."""
    end = time.monotonic() + opts["budget_s"]
    t0 = time.monotonic()
    doc = {"health_generate": None, "generated": None, "server_info": None}
    while True:
        state = load_state(d)
        if not alive(state):
            if state.get("status") in ("starting", "running"):
                save_state(d, {**state, "status": "failed", "failed_at": time.time()})
            return {"dead": True, "log_tail": log_tail(d), "state": state, "waited_s": time.monotonic() - t0}
        pause = 0.02
        if listening(port):
            doc, pause = probe_ready(d, port, opts, end), 0.1
            if doc.get("generation_ok"):  # the controller judges the rest and marks it verified (cmd_verified)
                return {**doc, "dead": False, "pid": state.get("pid"), "waited_s": time.monotonic() - t0}
        if on_round:
            on_round(doc, time.monotonic() - t0)
        if time.monotonic() + pause > end:
            return {**doc, "dead": False, "log_tail": log_tail(d, 10), "waited_s": time.monotonic() - t0}
        time.sleep(pause)


def cmd_live(d, mark=True):
    """Liveness of a worker rank (no HTTP of its own): alive marks it running, dead marks it failed (unless
    ``mark`` is False: a peek while rank 0 still waits)."""
    state = load_state(d)
    if alive(state):
        if mark and state.get("status") == "starting":
            save_state(d, {**state, "status": "running"})
        return {"alive": True, "pid": state.get("pid")}
    if mark and state.get("status") in ("starting", "running"):
        save_state(d, {**state, "status": "failed", "failed_at": time.time()})
    return {"alive": False, "pid": state.get("pid"), "log_tail": log_tail(d, 10)}


def main(argv):
    cmd, d = argv[0], argv[1]
    if cmd != "status":
        refuse_unsafe(d)
    if cmd == "status":
        out = cmd_status(d, int(argv[2]), argv[3] if len(argv) > 3 else None)
    elif cmd == "start":
        out = cmd_start(d, argv[2], int(argv[3]) if len(argv) > 3 else None)
    elif cmd == "record":
        out = cmd_record(d, argv[2], argv[3])
    elif cmd == "annotate":
        out = cmd_annotate(d, json.loads(argv[2]))
    elif cmd == "verified":
        out = cmd_verified(d, argv[2])
    elif cmd == "stop":
        out = cmd_stop(d, float(argv[2]), argv[3] if len(argv) > 3 else None)
    elif cmd == "live":
        out = cmd_live(d, mark=argv[2:] != ["peek"])
    elif cmd == "wait":
        out = cmd_wait(d, int(argv[2]), json.loads(argv[3]))
    else:
        raise SystemExit(f"unknown command {cmd}")
    reply(out)


if __name__ == "__main__":
    main(sys.argv[1:])
