"""Benchmark control on the host: ``bench DIR NAME JSON`` runs benchmark NAME against the server in DIR (see
server_ctl) and prints one JSON document.

    bench DIR NAME JSON     start (once per key) or attach to benchmark NAME, wait up to budget_s; JSON: key, argv,
                            port, config_hash, budget_s (stop: true ends it)
"""
import json
import os
import shlex
import sys
import time

from .common import DICT, INT, NUM, STR, make_dirs, open_append, read_doc, save_json, set_aside, start_time
from .server_ctl import detach, signal_group
from .server_dir import alive, load_state, read, redactor, refuse_unsafe, reply, secret, server_info

RUN_SCHEMA = {"key": (STR, False), "pid": (INT, True), "pgid": (INT, True), "start": (INT, True),
              "started_at": (NUM, True), "config_hash": (STR, True), "server_info": (DICT, True)}


def cmd_bench(d, name, opts):
    """Benchmark NAME against the running server: started once per key (runner argv + config hash), detached,
    so a dropped connection or a re-run attaches to it instead of starting another; waits up to budget_s.
    Output: bench/NAME.log, bench/NAME.jsonl (the runner's --output-file), bench/NAME.run.json (the run)."""
    bdir = os.path.join(d, "bench")
    make_dirs(bdir)
    paths = {ext: os.path.join(bdir, f"{name}.{ext}") for ext in ("log", "jsonl", "rc", "run.json")}
    run, problem = read_doc(paths["run.json"], RUN_SCHEMA)
    notes = []
    if run is None:  # corrupt: set aside and said, and nothing it names is signalled
        try:
            notes.append(f"{paths['run.json']}: {problem}: set aside as {set_aside(paths['run.json'])}")
        except OSError as exc:
            notes.append(f"{paths['run.json']}: {problem}: could not set it aside ({exc.strerror}); ignored")
        run = {}
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
        code, info = server_info(d, opts["port"], timeout=10.0)
        if code != 200 or info is None:
            return {"error": f"/server_info answered {code}: {info}"}
        for p in (paths["jsonl"], paths["rc"]):
            if os.path.exists(p):
                os.remove(p)
        env = dict(os.environ, SPECOPS_BENCH_RC=paths["rc"])
        key = secret(d, "SPECOPS_SECRET_API_KEY")
        if key:
            env["OPENAI_API_KEY"] = key  # how sglang.bench_serving authenticates; never on a command line
        with os.fdopen(open_append(paths["log"]), "a") as fh:
            fh.write(f"=== {time.strftime('%Y-%m-%d %H:%M:%S')} {shlex.join(opts['argv'])}\n")
        argv = ["/bin/sh", "-c", 'rc=0; "$@" || rc=$?; echo "$rc" > "$SPECOPS_BENCH_RC"', "sh",
                *opts["argv"], "--output-file", paths["jsonl"]]
        pid = detach(argv, paths["log"], env)
        run = {"key": opts["key"], "pid": pid, "pgid": pid, "start": start_time(pid), "started_at": time.time(),
               "config_hash": opts["config_hash"], "server_info": info}
        save_json(paths["run.json"], run)
    end = time.monotonic() + opts["budget_s"]
    while alive(run) and time.monotonic() < end:
        time.sleep(0.05)
    tail = redactor(d)((read(paths["log"], "") or "").splitlines()[-20:])
    rc = read(paths["rc"])
    if alive(run):
        return {"done": False, "notes": notes, "elapsed_s": time.time() - (run.get("started_at") or time.time()), "last_line": tail[-1] if tail else ""}
    lines = (read(paths["jsonl"], "") or "").splitlines()
    try:
        result = redactor(d)(json.loads(lines[-1])) if lines else None
    except ValueError:
        result = None
    save_json(paths["run.json"], {**run, "collected": True})
    return {"done": True, "notes": notes, "rc": int(rc) if rc and rc.strip().isdigit() else None, "result": result,
            "server_info": run.get("server_info"), "elapsed_s": time.time() - (run.get("started_at") or time.time()), "log_tail": tail}


def main(argv):
    if argv[:1] != ["bench"] or len(argv) != 4:
        raise SystemExit("usage: bench_ctl bench DIR NAME JSON")
    refuse_unsafe(argv[1])
    reply(cmd_bench(argv[1], argv[2], json.loads(argv[3])))


if __name__ == "__main__":
    main(sys.argv[1:])
