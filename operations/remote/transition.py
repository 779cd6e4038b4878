"""One server transition on the host, in one round trip (``run.py transition DIR JSON``): stop the old server,
wait until the driver has released its GPUs' memory, install the staged launch files, start, wait until the
new server generates; then one GPU reading for the controller's placement check. Prints one JSON document;
progress lines go to stderr as each step ends (``specops: ...``), which the controller prints as they come.

JSON (every key but ``start`` and ``wait`` optional; a step whose key is missing or null is skipped):

    stop      {"grace_s": G, "unit": U}          server_ctl stop (TERM the group, KILL after G s; pidfd wait)
    release   {"condition": C, "devices": GLOB, "nvml": true}   probe_gpu --wait C, sampled here
    staged    "staged.json"                      files [{"path", "content", "mode"}] uploaded into DIR ahead of
                                                 the stop; each written beside its target and renamed into place
    start     {"hash": H, "port": P, "unit": U}  server_ctl start (or systemctl start + record)
    annotate  {...}                              server_ctl annotate
    wait      {"budget_s", "prompt", "engine", "model", "progress_s"}   server_ctl wait
    devices, nvml                                the final GPU reading (probe_gpu)
    verdict   {"hash": H, "lease": {"path", "id"}}   after a run to "done", wait for the controller's one
                                                 line ("verified": server_ctl verified H; "verified release":
                                                 that, then the run's lease released), answered as a second
                                                 document; end of file: nothing

The document says how far it got: ``phase`` is the step it ended in ("done" when it ran through), with each
step's own reply under its name. The controller judges all of it (release verdict, readiness, placement) and
alone marks the server verified: over the same SSH channel when ``verdict`` is given (a round trip saved),
never on this program's own judgement.
"""
import json
import os
import subprocess
import sys
import time

from . import lease, probe_gpu, server_ctl
from .server_dir import load_state, refuse_unsafe

T0 = time.monotonic()


def say(line):
    sys.stderr.write(f"specops: [{time.monotonic() - T0:5.2f}s] {line}\n")
    sys.stderr.flush()


def install(d, staged):
    """The staged files into place (mode set before the rename, so no file is ever seen with a wider mode);
    the staging file removed whatever happens (it holds the secrets file)."""
    path = os.path.join(d, staged)
    try:
        with open(path) as fh:
            files = json.load(fh)["files"]
        for f in files:
            target = f["path"]
            if os.path.dirname(os.path.abspath(target)) != os.path.abspath(d) and not f.get("outside"):
                raise ValueError(f"staged file {target} is not in {d}")
            tmp = f"{target}.specops-{os.getpid()}"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "w") as fh:
                fh.write(f["content"])
            os.chmod(tmp, int(f["mode"], 8))
            os.rename(tmp, target)
        return {"installed": [f["path"] for f in files]}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return {"error": f"cannot install the staged launch files: {type(exc).__name__}: {exc}"}
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass


def stop(d, spec):
    was = load_state(d).get("pid")
    say(f"stopping the server (pid {was}, grace {spec['grace_s']:g}s)")
    out = server_ctl.cmd_stop(d, float(spec["grace_s"]), spec.get("unit"))
    if out.get("survivor"):
        out["error"] = f"pid {out['survivor']} survived SIGKILL"
    else:
        say(f"stopped{' by SIG' + out['signal'] if out.get('signal') else ''}")
    return out


def release(spec):
    cond = spec["condition"]
    say(f"waiting for GPU {','.join(map(str, cond['gpus']))} to be released (up to {cond['budget_s']:g}s)")
    doc = probe_gpu.probe(cond, spec.get("devices") or "/dev/nvidia*", spec.get("nvml", True))
    if doc["source"] == "none":
        doc["error"] = f"cannot read GPUs: {'; '.join(doc['errors'])}"
    elif doc.get("settled"):
        say(f"GPU memory released after {doc.get('waited_s', 0):.2f}s")
    else:
        others = probe_gpu.intruders(doc, cond) if cond.get("stop_on_intruders") else []
        doc["intruders"] = others
        doc["error"] = (f"pid {','.join(map(str, others))}, not planned for, holds GPU memory" if others else
                        f"GPU memory not released within {cond['budget_s']:g}s")
    return doc


def start(d, spec):
    if spec.get("unit"):
        for argv in (["systemctl", "daemon-reload"], ["systemctl", "start", spec["unit"]]):
            done = subprocess.run(argv, capture_output=True, text=True, check=False)
            if done.returncode:
                return {"error": f"{' '.join(argv)}: {done.stderr.strip()[-300:] or 'exit ' + str(done.returncode)}"}
        out = server_ctl.cmd_record(d, spec["hash"], spec["unit"])
    else:
        out = server_ctl.cmd_start(d, spec["hash"], spec.get("port"))
    if "error" not in out:
        say(f"started pid {out.get('pid')}")
    return out


def wait(d, port, opts):
    every, shown = float(opts.get("progress_s") or 10.0), [0.0]

    def on_round(doc, elapsed):
        if elapsed - shown[0] >= every:
            shown[0] = elapsed
            say(f"loading: {elapsed:.0f}s, /health_generate {doc.get('health_generate') or 'no answer yet'}")

    out = server_ctl.cmd_wait(d, port, opts, on_round)
    say("the server generates" if out.get("generation_ok") else
        "the server exited" if out.get("dead") else "not ready before the budget")
    return out


def main(argv):
    d, spec = argv[0], json.loads(argv[1])
    refuse_unsafe(d)
    doc = {"phase": None}
    steps = [("stop", lambda s: stop(d, s)), ("release", release), ("install", lambda s: install(d, s)),
             ("start", lambda s: start(d, s)),
             ("annotate", lambda s: server_ctl.cmd_annotate(d, s)),
             ("wait", lambda s: wait(d, spec["start"]["port"], s))]
    for name, step in steps:
        arg = spec.get("staged") if name == "install" else spec.get(name)
        if arg is None:
            continue
        doc["phase"] = name
        doc[name] = step(arg)
        if "error" in doc[name] or (name == "wait" and not doc[name].get("generation_ok")):
            break
    else:
        doc["phase"] = "done"
    if spec.get("staged"):  # never left behind by a step that failed before the install: it holds the secrets
        try:
            os.unlink(os.path.join(d, spec["staged"]))
        except OSError:
            pass
    if doc["phase"] in ("done", "wait"):  # where the new server's processes are, for the placement check
        doc["gpus"] = probe_gpu.probe(None, spec.get("devices") or "/dev/nvidia*", spec.get("nvml", True))
    sys.stdout.write(json.dumps(doc) + "\n")
    sys.stdout.flush()
    if spec.get("verdict") and doc["phase"] == "done":
        answer(d, spec["verdict"], sys.stdin.readline().split())


def answer(d, verdict, words):
    """The controller's one line: ``verified`` marks the server; ``verified release`` (the run's last
    operation on this host) also releases the run's lease (``verdict["lease"]``: path and owner id), saving
    the run's closing round trip. Anything else, or end of file: nothing."""
    if words[:1] != ["verified"]:
        return
    out = {"verified": server_ctl.cmd_verified(d, verdict["hash"])}
    if words[1:] == ["release"] and verdict.get("lease"):
        out["released"] = lease.cmd_release(verdict["lease"]["path"], verdict["lease"]["id"])
    sys.stdout.write(json.dumps(out) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
