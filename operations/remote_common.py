"""Shared by the remote scripts (probe_gpu, server_ctl, signal_procs, host_lock): ``remote.python_script`` sends this file
ahead of each script, so on the host they are one self-contained program; locally, scripts import it."""
import json
import os
import re


def proc_stat(pid):
    """state, ppid, pgid, sid and start time (clock ticks) of a PID from /proc, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            stat = fh.read()
    except OSError:
        return None
    rest = stat[stat.rindex(")") + 2:].split()  # comm may contain spaces and parentheses
    return {"state": rest[0], "ppid": int(rest[1]), "pgid": int(rest[2]), "sid": int(rest[3]), "start": int(rest[19])}


def load_json(path, default=None):
    """The JSON document at path, or default when it is missing or unreadable."""
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return default


def save_json(path, doc):
    """Atomically (a reader sees the old or the new document, never half), mode 0600."""
    tmp = os.path.join(os.path.dirname(path), "." + os.path.basename(path) + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(doc, fh)
    os.replace(tmp, path)


def start_time(pid):
    """Start time of a live, non-zombie PID (what guards every signal against PID reuse); None otherwise."""
    st = proc_stat(pid)
    return None if st is None or st["state"] in ("Z", "X") else st["start"]


class StableWindow:
    """True once a condition has held for ``window`` seconds over at least ``need`` consecutive readings."""

    def __init__(self, window, need=2):
        self.window, self.need = window, need
        self.since, self.readings = None, 0

    def update(self, ok, now):
        if not ok:
            self.since, self.readings = None, 0
            return False
        if self.since is None:
            self.since = now
        self.readings += 1
        return self.readings >= self.need and now - self.since >= self.window

SECRET_FLAG = re.compile(r"^--?[\w-]*(api[-_]?key|token|secret|password)[\w-]*$", re.I)


def masked(argv):
    """argv with the values of secret-looking flags replaced (servers take --api-key on the command line)."""
    out, hide = [], False
    for arg in argv:
        flag, eq, _ = arg.partition("=")
        if hide:
            out.append("<secret>")
        elif eq and SECRET_FLAG.match(flag):
            out.append(flag + "=<secret>")
        else:
            out.append(arg)
        hide = not hide and not eq and bool(SECRET_FLAG.match(arg))
    return out
