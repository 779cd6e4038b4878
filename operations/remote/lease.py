"""Remote side of the host lock: ``run.py lease acquire PATH OWNER_JSON TTL_S [BREAK_ID] [--prepare DIR]`` or
``release PATH OWNER_ID``; prints one JSON document (exit 1 for an unsafe state directory). ``--prepare``: once the lease is this run's, the server
directory DIR is created or checked too (``server_dir.cmd_prepare``, its reply under ``prepared``), saving the
switch a round trip.

The lease (PATH, JSON, 0600) names the specops run that holds the host: its id, controller, pid, what it does, and
when it expires. flock on PATH.flock is held only while the lease is read and written, never across commands, so a
run that dies leaves a lease that expires (or is broken by its own controller, which can see the run is gone).
"""
import fcntl
import json
import os
import sys
import time

from .common import (INT, NUM, STR, _nofollow_fd, make_dirs, read_doc, save_json, set_aside,
                    unsafe_tree)
from .server_dir import cmd_prepare

LEASE_SCHEMA = {"id": (STR, False), "controller": (STR, True), "pid": (INT, True), "pid_start": (INT, True),
                "user": (STR, True), "what": (STR, True), "acquired_at": (NUM, True), "expires_at": (NUM, False)}


def load_lease(path, notes):
    """The lease ({} when there is none). A corrupt one (wrong type, NaN expiry, ...) binds nobody: it is set
    aside, noted, and treated as absent."""
    held, problem = read_doc(path, LEASE_SCHEMA, required=("id", "expires_at"))
    if held is None:
        try:
            notes.append(f"the host lease {path} was unreadable ({problem}): set aside as {set_aside(path)}")
        except OSError as exc:
            notes.append(f"the host lease {path} was unreadable ({problem}) and could not be set aside "
                         f"({exc.strerror}): it is ignored")
        return {}
    return held


def acquire(path, me, ttl, break_id=None):
    now = time.time()
    notes = []
    held = load_lease(path, notes)
    mine = bool(held) and held.get("id") == me["id"]
    if held and not mine and held.get("expires_at", 0) > now and held.get("id") != break_id:
        return {"acquired": False, "holder": held, "now": now, **({"notes": notes} if notes else {})}
    lease = {**me, "acquired_at": held["acquired_at"] if mine else now, "expires_at": now + ttl}
    save_json(path, lease)
    took = None if mine or not held else {**held, "why": "broken" if held.get("id") == break_id else "expired"}
    return {"acquired": True, "took_over": took, "fresh": not mine, **({"notes": notes} if notes else {})}


def release(path, owner_id):
    held, _ = read_doc(path, LEASE_SCHEMA, required=("id", "expires_at"))
    if held and held.get("id") == owner_id:
        os.remove(path)
        return {"released": True}
    return {"released": False, "holder": held}


def locked(path, act):
    """``act()`` under the lease's flock, or the refusal of a state directory others could write."""
    unsafe = unsafe_tree(os.path.dirname(path))
    if unsafe:  # a lease in a directory others can write could be forged or swapped for a symlink
        return {"error": f"unsafe state directory {os.path.dirname(path)}: {unsafe}"}
    make_dirs(os.path.dirname(path))
    fd = _nofollow_fd(path + ".flock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        return act()
    finally:
        os.close(fd)


def cmd_release(path, owner_id):
    """Release the lease if ``owner_id`` holds it (also the transition's last act when its run ends there)."""
    return locked(path, lambda: release(path, owner_id))


def main(argv):
    cmd, path = argv[0], argv[1]
    if cmd == "acquire":
        rest, prepare = argv[4:], None
        if "--prepare" in rest:
            at = rest.index("--prepare")
            prepare, rest = rest[at + 1], rest[:at] + rest[at + 2:]
        out = locked(path, lambda: acquire(path, json.loads(argv[2]), float(argv[3]), rest[0] if rest else None))
        if prepare and out.get("acquired"):  # outside the lease's flock: it guards the lease only
            out["prepared"] = cmd_prepare(prepare)
    elif cmd == "release":
        out = cmd_release(path, argv[2])
    else:
        raise SystemExit(f"unknown command {cmd}")
    sys.stdout.write(json.dumps(out) + "\n")
    if "error" in out:
        sys.exit(1)


if __name__ == "__main__":
    main(sys.argv[1:])
