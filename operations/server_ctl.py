"""Remote server control: ``python3 -c <this file> COMMAND DIR ...`` on the target host; prints one JSON document.

DIR holds one server: launch.sh (0700), secrets.env (0600, sourced by launch.sh), state.json (what specops
started: pid, start time, config hash), server.log. Secrets never travel on a command line: the HTTP checks here
read the API key from secrets.env themselves.

    status DIR PORT [UNIT]         state, liveness, /health, /get_server_info, launch.sh content
    start DIR HASH [PORT]          setsid launch.sh >> server.log, record pid/start/hash (refused if PORT is taken)
    record DIR HASH UNIT           after systemctl start: record the unit's MainPID
    annotate DIR JSON              add what the server was started with (masked args, verify settings)
    stop DIR GRACE [UNIT]          TERM the process group, KILL after GRACE seconds; state -> stopped
    wait DIR PORT JSON             sample until ready (or dead, or budget spent); JSON: budget_s, prompt, engine
    bench DIR NAME JSON            start (once per key) or attach to benchmark NAME, wait up to budget_s; JSON:
                                   key, argv, port, config_hash, budget_s (stop: true ends it)
"""
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

try:  # on the host, remote.python_script has already put remote_common.py's definitions above this line
    from operations.remote_common import load_json, masked, save_json, start_time
except ImportError:
    pass

LOG_TAIL = 40


def read(path, default=None):
    try:
        with open(path) as fh:
            return fh.read()
    except OSError:
        return default


def load_state(d):
    return load_json(os.path.join(d, "state.json"), {})


def save_state(d, state):
    save_json(os.path.join(d, "state.json"), state)


def alive(state):
    pid = state.get("pid")
    return bool(pid) and start_time(pid) == state.get("start")


def secret(d, name):
    for line in (read(os.path.join(d, "secrets.env"), "") or "").splitlines():
        key, _, value = line.partition("=")
        if key.strip() == name:
            return shlex.split(value)[0] if value.strip() else ""
    return None


def http(d, port, path, body=None, timeout=2.0):
    """(status code or None, parsed JSON or text or error string)."""
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method="POST" if body is not None else "GET",
                                 data=None if body is None else json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    key = secret(d, "SPECOPS_SECRET_API_KEY")
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw = resp.read().decode(errors="replace")
            code = resp.status
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")[:500]
    except (OSError, ValueError) as exc:
        return None, f"{type(exc).__name__}: {exc}"
    try:
        return code, json.loads(raw)
    except ValueError:
        return code, raw


SECRET_KEY = re.compile(r"(^|_)(api_key|token|secret|password)$", re.I)


def strip_secrets(info):
    if isinstance(info, dict):
        return {k: ("<secret>" if SECRET_KEY.search(k) else strip_secrets(v)) for k, v in info.items()}
    if isinstance(info, list):
        return [strip_secrets(v) for v in info]
    return info


def log_tail(d, n=LOG_TAIL):
    text = read(os.path.join(d, "server.log"), "") or ""
    return text.splitlines()[-n:]


def unit_pid(unit):
    out = subprocess.run(["systemctl", "show", "-p", "MainPID", "--value", unit], capture_output=True, text=True)
    try:
        return int(out.stdout.strip() or 0)
    except ValueError:
        return 0


def cmd_status(d, port, unit=None):
    state = load_state(d)
    if unit and state.get("status") in ("running", "starting"):
        pid = unit_pid(unit)
        state["pid"], state["start"] = (pid, start_time(pid)) if pid else (None, None)
    doc = {"state": state, "alive": alive(state), "launch_sh": read(os.path.join(d, "launch.sh")),
           "unit_file": read(f"/etc/systemd/system/{unit}") if unit else None}
    code, _ = http(d, port, "/health", timeout=1.0)
    doc["health"] = code
    if code is not None:
        info_code, info = http(d, port, "/get_server_info")
        if info_code != 200:
            info_code, info = http(d, port, "/server_info")  # vLLM, where enabled
        doc["server_info"] = strip_secrets(info) if info_code == 200 and isinstance(info, dict) else None
    return doc


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
        log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.execve(argv[0], argv, env if env is not None else os.environ)
    os.close(w)
    os.waitpid(mid, 0)
    return int(os.read(r, 32) or 0)


def cmd_start(d, config_hash, port=None):
    state = load_state(d)
    if alive(state):
        return {"error": f"already running as pid {state['pid']}"}
    owner = listener(port) if port else None
    if owner:  # starting now would only die with 'Address already in use' after loading the weights
        return {"error": f"port {port} is already in use by {owner}; not starting"}
    pid = detach(["/bin/sh", os.path.join(d, "launch.sh")], os.path.join(d, "server.log"))
    state = {"status": "starting", "pid": pid, "pgid": os.getpgid(pid), "start": start_time(pid),
             "config_hash": config_hash, "started_at": time.time(), "supervisor": "process"}
    save_state(d, state)
    return state


def cmd_record(d, config_hash, unit):
    pid = unit_pid(unit)
    state = {"status": "starting", "pid": pid, "pgid": os.getpgid(pid) if pid else None, "start": start_time(pid),
             "config_hash": config_hash, "started_at": time.time(), "supervisor": "systemd", "unit": unit}
    save_state(d, state)
    return state


def signal_group(state, grace, kill_wait):
    """TERM the process group of something we started (its pid and start time still match), KILL it if it
    outlives ``grace`` seconds, wait up to ``kill_wait`` for that; the last signal sent ("TERM", "KILL", None)."""
    sent = None
    for sig, wait_s in ((signal.SIGTERM, grace), (signal.SIGKILL, kill_wait)):
        if not alive(state):
            break
        try:
            os.killpg(state["pgid"], sig)
        except ProcessLookupError:
            break  # the group is gone already
        sent = sig.name[3:]
        end = time.monotonic() + wait_s
        while alive(state) and time.monotonic() < end:
            time.sleep(0.02)
    return sent


def cmd_stop(d, grace, unit=None):
    state = load_state(d)
    out = {"was": state.get("pid") if alive(state) else None, "signal": None}
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
    info_code, info = http(d, port, "/get_server_info", timeout=left(2.0))
    doc["server_info"] = strip_secrets(info) if info_code == 200 and isinstance(info, dict) else None
    return doc


def cmd_wait(d, port, opts):
    end = time.monotonic() + opts["budget_s"]
    t0 = time.monotonic()
    while True:
        state = load_state(d)
        if not alive(state):
            if state.get("status") in ("starting", "running"):
                save_state(d, {**state, "status": "failed", "failed_at": time.time()})
            return {"dead": True, "log_tail": log_tail(d), "state": state, "waited_s": time.monotonic() - t0}
        doc = probe_ready(d, port, opts, end)
        if doc.get("generation_ok"):
            if state.get("status") == "starting":
                save_state(d, {**state, "status": "running"})
            return {**doc, "dead": False, "waited_s": time.monotonic() - t0}
        if time.monotonic() + 0.1 > end:
            return {**doc, "dead": False, "log_tail": log_tail(d, 10), "waited_s": time.monotonic() - t0}
        time.sleep(0.1)


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


def cmd_bench(d, name, opts):
    """Benchmark NAME against the running server: started once per key (runner argv + config hash), detached,
    so a dropped connection or a re-run attaches to it instead of starting another; waits up to budget_s.
    Output: bench/NAME.log, bench/NAME.jsonl (the runner's --output-file), bench/NAME.run.json (the run)."""
    bdir = os.path.join(d, "bench")
    os.makedirs(bdir, mode=0o700, exist_ok=True)
    paths = {ext: os.path.join(bdir, f"{name}.{ext}") for ext in ("log", "jsonl", "rc", "run.json")}
    run = load_json(paths["run.json"], {})
    if opts.get("stop"):
        if run.get("key") == opts["key"]:
            signal_group(run, 5.0, 5.0)
        return {"stopped": True}
    if run.get("key") != opts["key"] or run.get("collected"):
        signal_group(run, 5.0, 5.0)  # an older benchmark of ours still loading the server would skew this one
        state = load_state(d)
        if not alive(state):
            return {"error": f"the server is not running ({state.get('status', 'never started')}); nothing to benchmark"}
        if state.get("config_hash") != opts["config_hash"]:
            return {"error": f"the server runs config {state.get('config_hash')}, not {opts['config_hash']} "
                             f"(changed by another deploy?); not benchmarking"}
        code, info = http(d, opts["port"], "/get_server_info", timeout=10.0)
        if code != 200 or not isinstance(info, dict):
            return {"error": f"/get_server_info answered {code}: {str(info)[:200]}"}
        for p in (paths["jsonl"], paths["rc"]):
            if os.path.exists(p):
                os.remove(p)
        env = dict(os.environ, SPECOPS_BENCH_RC=paths["rc"])
        key = secret(d, "SPECOPS_SECRET_API_KEY")
        if key:
            env["OPENAI_API_KEY"] = key  # how sglang.bench_serving authenticates; never on a command line
        with open(paths["log"], "a") as fh:
            fh.write(f"=== {time.strftime('%Y-%m-%d %H:%M:%S')} {shlex.join(opts['argv'])}\n")
        argv = ["/bin/sh", "-c", 'rc=0; "$@" || rc=$?; echo "$rc" > "$SPECOPS_BENCH_RC"', "sh",
                *opts["argv"], "--output-file", paths["jsonl"]]
        pid = detach(argv, paths["log"], env)
        run = {"key": opts["key"], "pid": pid, "pgid": pid, "start": start_time(pid), "started_at": time.time(),
               "config_hash": opts["config_hash"], "server_info": strip_secrets(info)}
        save_json(paths["run.json"], run)
    end = time.monotonic() + opts["budget_s"]
    while alive(run) and time.monotonic() < end:
        time.sleep(0.05)
    tail = (read(paths["log"], "") or "").splitlines()[-20:]
    rc = read(paths["rc"])
    if alive(run):
        return {"done": False, "elapsed_s": time.time() - run["started_at"], "last_line": tail[-1] if tail else ""}
    lines = (read(paths["jsonl"], "") or "").splitlines()
    try:
        result = json.loads(lines[-1]) if lines else None
    except ValueError:
        result = None
    save_json(paths["run.json"], {**run, "collected": True})
    return {"done": True, "rc": int(rc) if rc and rc.strip().isdigit() else None, "result": result,
            "server_info": run["server_info"], "elapsed_s": time.time() - run["started_at"], "log_tail": tail}


def main(argv):
    cmd, d = argv[0], argv[1]
    if cmd == "status":
        out = cmd_status(d, int(argv[2]), argv[3] if len(argv) > 3 else None)
    elif cmd == "start":
        out = cmd_start(d, argv[2], int(argv[3]) if len(argv) > 3 else None)
    elif cmd == "record":
        out = cmd_record(d, argv[2], argv[3])
    elif cmd == "annotate":
        out = {**load_state(d), "recorded": json.loads(argv[2])}
        save_state(d, out)
    elif cmd == "stop":
        out = cmd_stop(d, float(argv[2]), argv[3] if len(argv) > 3 else None)
    elif cmd == "live":
        out = cmd_live(d, mark=argv[2:] != ["peek"])
    elif cmd == "wait":
        out = cmd_wait(d, int(argv[2]), json.loads(argv[3]))
    elif cmd == "bench":
        out = cmd_bench(d, argv[2], json.loads(argv[3]))
    else:
        raise SystemExit(f"unknown command {cmd}")
    sys.stdout.write(json.dumps(out) + "\n")
    if "error" in out:
        sys.stderr.write(out["error"] + "\n")
        sys.exit(1)


if __name__ == "__main__":
    main(sys.argv[1:])
