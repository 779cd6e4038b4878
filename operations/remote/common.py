"""Shared by every host program (probe_gpu, signalling, server_dir, server_ctl, bench_ctl, lease): JSON
documents with schemas, masking by the one secret-name rule, safe directories, /proc start times. Stdlib only, like
every module of this package: on a host it is one file of the content-hashed bundle (see ``controller.remote``)."""
import json
import math
import os
import re
import stat
import time


def proc_stat(pid):
    """state, ppid, pgid, sid and start time (clock ticks) of a PID from /proc, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            stat = fh.read()
    except OSError:
        return None
    rest = stat[stat.rindex(")") + 2:].split()  # comm may contain spaces and parentheses
    return {"state": rest[0], "ppid": int(rest[1]), "pgid": int(rest[2]), "sid": int(rest[3]), "start": int(rest[19])}


def make_dirs(path, mode=0o700):
    """``mkdir -p`` where every directory it creates gets ``mode`` (os.makedirs gives the parents it creates the
    umask's mode, e.g. 0775 under umask 002, which unsafe_tree would then refuse)."""
    missing = []
    while path and not os.path.isdir(path):
        missing.append(path)
        path = os.path.dirname(path.rstrip("/"))
    for p in reversed(missing):
        try:
            os.mkdir(p, mode)
        except FileExistsError:
            continue
        os.chmod(p, mode)


def _nofollow_fd(path, flags, mode=0o600):
    # O_NOFOLLOW: a symlink planted at this path is refused (ELOOP) instead of being written through
    return os.open(path, flags | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), mode)


def save_json(path, doc):
    """Atomically (a reader sees the old or the new document, never half), mode 0600, never through a symlink."""
    tmp = os.path.join(os.path.dirname(path), "." + os.path.basename(path) + ".tmp")
    try:
        os.unlink(tmp)  # a leftover of a run that died; unlink removes a planted symlink itself, not its target
    except FileNotFoundError:
        pass
    fd = _nofollow_fd(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    with os.fdopen(fd, "w") as fh:
        json.dump(doc, fh, allow_nan=False)
    os.replace(tmp, path)


def open_append(path):
    """A log file opened for appending (created 0600), never through a symlink."""
    return _nofollow_fd(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)


# ---- documents specops keeps on hosts (state.json, the lease): schema-checked, corrupt ones set aside -----------
INT, NUM, STR, DICT, BOOL = "int", "number", "string", "object", "bool"


def _is(value, kind):
    if kind == INT:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == NUM:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return isinstance(value, {STR: str, DICT: dict, BOOL: bool}[kind])


def doc_problem(doc, schema, required=()):
    """Why ``doc`` is not a document of this schema (field -> (kind, nullable)), or None. Unknown keys pass."""
    if not isinstance(doc, dict):
        return f"not a JSON object (got {'null' if doc is None else type(doc).__name__})"
    missing = [k for k in required if k not in doc]
    if missing:
        return f"missing {', '.join(missing)}"
    for key, (kind, nullable) in schema.items():
        if key in doc and not (_is(doc[key], kind) or (nullable and doc[key] is None)):
            return f"field {key!r} must be {'a' if kind != INT else 'an'} {kind}{' or null' if nullable else ''}, " \
                   f"got {json.dumps(doc[key])[:40]}"
    return None


def read_doc(path, schema, required=()):
    """(document, problem): ({}, None) when absent; (None, why) when it exists but is not a valid document."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return {}, None
    if not stat.S_ISREG(st.st_mode):
        return None, "not a regular file"
    try:
        with open(path) as fh:
            doc = json.loads(fh.read(1 << 20))  # NaN/Infinity parse as floats, which no field accepts
    except (OSError, ValueError, RecursionError) as exc:
        return None, f"unreadable JSON ({type(exc).__name__})"
    problem = doc_problem(doc, schema, required)
    return (None, problem) if problem else (doc, None)


def set_aside(path):
    """Move a corrupt document out of the way (kept for inspection, never deleted); returns where it went."""
    dest = f"{path}.corrupt-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"
    os.rename(path, dest)
    return dest


# ---- who may write where: a state directory nobody else can tamper with ------------------------------------------
def unsafe_tree(path):
    """Why ``path`` (a directory specops writes, existing or not) could be tampered with by another local user, or
    None. Every existing component must be a directory owned by root or by us and not writable by group or others
    (a sticky directory such as /tmp is allowed: others cannot rename or delete what we own in it); a symlink on
    the way must itself be owned by root or us."""
    me = os.geteuid()
    trusted = {0, me}
    cur = "/"
    for part in [p for p in path.split("/") if p]:
        cur = os.path.join(cur, part)
        try:
            st = os.lstat(cur)
        except FileNotFoundError:
            break
        if stat.S_ISLNK(st.st_mode) and st.st_uid not in trusted:
            return f"{cur} is a symlink owned by uid {st.st_uid}"
    real = os.path.realpath(path)
    cur = "/"
    for part in [""] + [p for p in real.split("/") if p]:
        cur = os.path.join(cur, part) if part else "/"
        try:
            st = os.stat(cur)
        except FileNotFoundError:
            break
        if not stat.S_ISDIR(st.st_mode):
            return f"{cur} is not a directory"
        if st.st_uid not in trusted:
            return f"{cur} is owned by uid {st.st_uid}, not by root or by uid {me}"
        if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
            return f"{cur} is writable by {'group and others' if st.st_mode & 0o022 == 0o022 else 'group' if st.st_mode & 0o020 else 'others'} (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def private_dir(path):
    """Create (0700) or check the directory ``path`` for specops' own files; returns a problem string or None."""
    problem = unsafe_tree(os.path.dirname(path.rstrip("/")) or "/")
    if problem:
        return f"refusing {path}: {problem}"
    try:
        make_dirs(path)
    except OSError as exc:
        return f"cannot create {path}: {exc.strerror}"
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        return f"refusing {path}: not a directory (a {'symlink' if stat.S_ISLNK(st.st_mode) else 'file'})"
    if st.st_uid != os.geteuid():
        return f"refusing {path}: owned by uid {st.st_uid}, not by uid {os.geteuid()} (who runs specops there)"
    if stat.S_IMODE(st.st_mode) != 0o700:
        os.chmod(path, 0o700)
    return unsafe_tree(path)


def start_time(pid):
    """Start time of a live, non-zombie PID (what guards every signal against PID reuse); None otherwise."""
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return None
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

# a flag or field whose value is a secret: api_key, admin_api_key, --api-key, ssl_keyfile_password, watermark_key,
# watermark_config, hf_token, --token... (whole words at the end only; SGLang's counters
# bucket_time_to_first_token and kt_max_deferred_experts_per_token, max_total_tokens and tokenizer_path are not
# secrets). Environment values are masked by value as well.
# files a config ships beside engine.yaml, by the argument that names them (operations.model.shipped uploads them,
# server_dir's status reads them back for --diff)
SHIPPED_FILES = {"speculative_adaptive_config": "adaptive-config.json"}

SECRET_NAME = re.compile(r"(^|[-_])(api[-_]?key|key|secret|password|passwd|watermark[-_]config)$"
                         r"|(^|(?<!first)(?<!per)[-_])token$", re.I)


def secret_name(name):
    return bool(SECRET_NAME.search(str(name).lstrip("-")))


def masked(argv):
    """argv with the values of secret-looking flags replaced (servers take --api-key on the command line)."""
    out, hide = [], False
    for arg in argv:
        flag, eq, _ = arg.partition("=")
        if hide:
            out.append("<secret>")
        elif eq and flag.startswith("-") and secret_name(flag):
            out.append(flag + "=<secret>")
        else:
            out.append(arg)
        hide = not hide and not eq and arg.startswith("-") and secret_name(arg)
    return out
