"""Running a host program (a module of ``operations/remote/``) on a host, every value shell-quoted.

The host programs travel as files, not as inline program text: the whole ``operations/remote/`` package is one
bundle named by its content hash, installed on first use under ``$HOME/.cache/specops/<hash>/`` (0700, owned by
the user the command runs as; a directory another user could write is refused) and run from there, so the host's
Python compiles each module once (its ``__pycache__``) instead of parsing an inline program on every call. A
changed program is a new hash, hence a new directory: a host never runs a stale or half-written copy (the copy is
written beside and renamed into place). Each command carries the bundle as one argument of a guarded installer
that runs only when the directory is missing, so every command stays one self-contained round trip.
"""
from __future__ import annotations

import base64
import functools
import hashlib
import json
import re
import zlib
from importlib import resources

from pyinfra.api import QuoteString, StringCommand

PACKAGE = "specops_host"  # the bundle's package name on hosts (operations.remote at home)
CACHE = "${HOME:?HOME is not set}/.cache/specops"  # expanded by the host's shell: each user has their own cache

# Stdlib only: it runs before any of our code exists on the host. argv: DIR PAYLOAD.
INSTALLER = r"""import base64, json, os, shutil, stat, sys, zlib
d, files = sys.argv[1], json.loads(zlib.decompress(base64.b64decode(sys.argv[2])))
root = os.path.dirname(d)
os.makedirs(root, mode=0o700, exist_ok=True)
for p in (root, os.path.dirname(root)):
    st = os.lstat(p)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid not in (os.geteuid(), 0) or st.st_mode & 0o022:
        sys.exit("specops: refusing to install host programs under %s: not a directory only its owner can write" % p)
tmp = "%s.tmp-%d" % (d, os.getpid())
os.makedirs(os.path.join(tmp, "PACKAGE"), mode=0o700)
files["../run.py"] = "import runpy, sys\nrunpy.run_module('PACKAGE.' + sys.argv.pop(1), run_name='__main__', alter_sys=True)\n"
for name, text in files.items():
    with open(os.open(os.path.join(tmp, "PACKAGE", name), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as fh:
        fh.write(text)
open(os.path.join(tmp, "ok"), "w").close()
try:
    os.rename(tmp, d)
except OSError:  # another run installed the same bundle first: theirs is identical
    shutil.rmtree(tmp)
    if not os.path.isfile(os.path.join(d, "ok")):
        raise
""".replace("PACKAGE", PACKAGE)


def host_python(python: str | None = None, on_host=None) -> str:
    """The interpreter on the host (default: the current one) for our programs: the argument, else host data
    ``specops_python``, else python3."""
    from pyinfra import host

    return python or (host if on_host is None else on_host).data.get("specops_python") or "python3"


def script_text(name: str) -> str:
    """The source of host program ``name`` (``probe_gpu.py``)."""
    return resources.files("operations.remote").joinpath(name).read_text()


@functools.cache
def bundle() -> tuple[str, str]:
    """(content hash, payload) of every module in ``operations/remote/``."""
    root = resources.files("operations.remote")
    files = {p.name: p.read_text() for p in sorted(root.iterdir(), key=lambda p: p.name) if p.name.endswith(".py")}
    text = json.dumps(files, sort_keys=True)
    digest = hashlib.sha256((INSTALLER + text).encode()).hexdigest()[:20]
    return digest, base64.b64encode(zlib.compress(text.encode(), 9)).decode()


def python_script(python: str, name: str, *args: str) -> StringCommand:
    """``PY ~/.cache/specops/<hash>/run.py MODULE ARGS``, installing the bundle first where it is missing."""
    module = name.removesuffix(".py")
    digest, payload = bundle()
    if f"{module}.py" not in _names():
        raise ValueError(f"no host program {name!r} in operations/remote/")
    py = QuoteString(python)
    return StringCommand(f'D="{CACHE}/{digest}";', '{ [ -f "$D/ok" ] ||', py, "-c", QuoteString(INSTALLER), '"$D"',
                         QuoteString(payload), "; } &&", py, '"$D/run.py"', module, *map(QuoteString, args))


@functools.cache
def _names() -> tuple[str, ...]:
    return tuple(p.name for p in resources.files("operations.remote").iterdir() if p.name.endswith(".py"))


def readable(raw: str) -> str:
    """A command with its installer and bundle path elided (``python3 <probe_gpu> ARGS``): how fixtures and
    ``--debug`` readers see it."""
    return re.sub(r'D="[^"]*"; \{ \[ -f "\$D/ok" \] \|\| .*? -c .*? "\$D" \S+ ; \} && (.+?) "\$D/run.py" ([a-z_]+)',
                  r"\1 <\2>", raw, flags=re.S)


def ask(on_host, command, unreadable=lambda why: {"error": why}) -> dict:
    """Run a host program's ``command`` on ``on_host`` and return the JSON document it printed; when it printed
    none (it crashed, the connection dropped), ``unreadable(why)``, ``why`` being its last stderr lines."""
    ok, out = on_host.run_shell_command(command)
    try:
        doc = json.loads("\n".join(out.stdout_lines))
    except ValueError:
        doc = None
    return doc if isinstance(doc, dict) else unreadable(" ".join(out.stderr_lines[-3:]) or "no output")


def guarded(python: str, command: StringCommand, fallback_stdout: str) -> StringCommand:
    """Run ``command`` if ``python`` exists on the host, else print ``fallback_stdout`` (keeps it one round trip)."""
    return StringCommand("if command -v", QuoteString(python), ">/dev/null 2>&1; then", command,
                         "; else echo", QuoteString(fallback_stdout), "; fi")
