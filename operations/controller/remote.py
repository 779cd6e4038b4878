"""Running a host program (a module of ``operations/remote/``) on a host, every value shell-quoted.

The host programs travel as files, not as inline program text: the whole ``operations/remote/`` package is one
bundle named by its content hash, installed under ``$HOME/.cache/specops/<hash>/`` (0700, owned by the user the
command runs as; a directory another user could write is refused) and run from there, so the host's Python
compiles each module once (its ``__pycache__``). A changed program is a new hash, hence a new directory: a host
never runs a stale or half-written copy (the copy is written beside and renamed into place).

The bundle is sent at most once per run: only the facts (a run's first contact with a host, read while
operations are prepared) carry it, as the argument of an installer that runs only when the directory is
missing. Every other command names the bundle by its hash alone and exits 97 with a ``specops: host programs
... not installed`` line if it is gone; ``ask`` then installs it and runs the command again.
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


MISSING = "specops: host programs not installed"  # what a lean command says when the bundle is gone
MISSING_RC = 97


class HostProgram(StringCommand):
    """A host program's command line, knowing its interpreter (so ``ask`` can install the bundle and retry)."""

    def __init__(self, python: str, *bits):
        super().__init__(*bits)
        self.python = python


def python_script(python: str, name: str, *args: str, install: bool = False) -> HostProgram:
    """``PY ~/.cache/specops/<hash>/run.py MODULE ARGS``. ``install``: carry the bundle and install it first
    where it is missing (the facts do); else exit 97 saying so when it is missing."""
    module = name.removesuffix(".py")
    digest, payload = bundle()
    if f"{module}.py" not in _names():
        raise ValueError(f"no host program {name!r} in operations/remote/")
    py = QuoteString(python)
    if install:
        head = ['{ [ -f "$D/ok" ] ||', py, "-c", QuoteString(INSTALLER), '"$D"', QuoteString(payload), "; } &&"]
    else:
        head = [f'{{ [ -f "$D/ok" ] || {{ echo "{MISSING} in $D" >&2; exit {MISSING_RC}; }}; }} &&']
    return HostProgram(python, f'D="{CACHE}/{digest}";', *head, py, '"$D/run.py"', module, *map(QuoteString, args))


def installer(python: str) -> StringCommand:
    """The bundle installed where it is missing (and nothing run)."""
    digest, payload = bundle()
    return StringCommand(f'D="{CACHE}/{digest}";', '[ -f "$D/ok" ] ||', QuoteString(python), "-c",
                         QuoteString(INSTALLER), '"$D"', QuoteString(payload))


@functools.cache
def _names() -> tuple[str, ...]:
    return tuple(p.name for p in resources.files("operations.remote").iterdir() if p.name.endswith(".py"))


def readable(raw: str) -> str:
    """A command with its installer and bundle path elided (``python3 <probe_gpu> ARGS``): how fixtures and
    ``--debug`` readers see it."""
    return re.sub(r'D="[^"]*"; \{ \[ -f "\$D/ok" \] \|\| (?:.*? -c .*? "\$D" \S+ ; |\{ echo .*? exit 97; \}; )\} && '
                  r'(.+?) "\$D/run.py" ([a-z_]+)', r"\1 <\2>", raw, flags=re.S)


def ask(on_host, command, unreadable=lambda why: {"error": why}) -> dict:
    """Run a host program's ``command`` on ``on_host`` and return the JSON document it printed; when it printed
    none (it crashed, the connection dropped), ``unreadable(why)``, ``why`` being its last stderr lines."""
    ok, out = on_host.run_shell_command(command)
    if not ok and _missing(out.stderr_lines) and isinstance(command, HostProgram):
        on_host.run_shell_command(installer(command.python))  # removed during the run: install, run again
        ok, out = on_host.run_shell_command(command)
    return _document(out.stdout_lines, out.stderr_lines, unreadable)


def _missing(stderr: list[str]) -> bool:
    return any(line.startswith(MISSING) for line in stderr)


def _document(stdout: list[str], stderr: list[str], unreadable) -> dict:
    try:
        doc = json.loads("\n".join(stdout))
    except ValueError:
        doc = None
    return doc if isinstance(doc, dict) else unreadable(" ".join(stderr[-3:]) or "no output")


PROGRESS = "specops: "  # a host program's progress line on stderr


def connector_arguments(on_host) -> dict:
    """The current operation's connector arguments (``_env``, ``_chdir``, ``_shell_executable``...: host data
    and op arguments merged, as pyinfra passes them to its own commands), taken while the operation is prepared:
    a FunctionCommand at execute time gets none, so its own commands would run without them."""
    from pyinfra.api.arguments import CONNECTOR_ARGUMENT_KEYS

    args = getattr(on_host, "current_op_global_arguments", None) or {}
    return {k: v for k, v in args.items() if k in CONNECTOR_ARGUMENT_KEYS and k not in RUN_ONLY}


RUN_ONLY = ("_timeout", "_get_pty", "_stdin", "_success_exit_codes")  # how to run, not the command line


def ask_streaming(on_host, command, on_progress, arguments: dict, unreadable=lambda why: {"error": why}) -> dict:
    """``ask``, with each progress line the program writes to stderr (``specops: ...``) passed to
    ``on_progress`` the moment it arrives, the command built with ``arguments`` (``connector_arguments``).
    Over pyinfra's SSH connector the channel is read line by line (in greenlets, as pyinfra reads its own);
    other connectors give the lines when the command has ended."""
    client = getattr(on_host.connector, "client", None) if hasattr(on_host, "connector") else None
    stdout, stderr = _stream(on_host, client, command, on_progress, arguments)
    if _missing(stderr) and isinstance(command, HostProgram):  # removed during the run: install, run again
        on_host.run_shell_command(installer(command.python), **arguments)
        stdout, stderr = _stream(on_host, client, command, on_progress, arguments)
    return _document(stdout, stderr, unreadable)


def _stream(on_host, client, command, on_progress, arguments: dict) -> tuple[list[str], list[str]]:
    if client is None or not hasattr(client, "exec_command"):
        ok, out = on_host.run_shell_command(command, **arguments)
        for line in out.stderr_lines:
            _progress(line, on_progress)
        return out.stdout_lines, out.stderr_lines
    import gevent
    from pyinfra.connectors.util import make_unix_command_for_host

    unix = make_unix_command_for_host(on_host.state, on_host, command, **arguments)
    stdin, out, err = client.exec_command(unix.get_raw_value())
    stdin.close()
    stderr: list[str] = []

    def pump() -> None:
        for line in err:
            stderr.append(line.rstrip("\n"))
            _progress(stderr[-1], on_progress)

    stdout: list[str] = []
    gevent.joinall([gevent.spawn(pump), gevent.spawn(lambda: stdout.extend(line.rstrip("\n") for line in out))])
    out.channel.recv_exit_status()
    return stdout, stderr


def _progress(line: str, on_progress) -> None:
    if line.startswith(PROGRESS):
        on_progress(line[len(PROGRESS):])


def guarded(python: str, command: StringCommand, fallback_stdout: str) -> StringCommand:
    """Run ``command`` if ``python`` exists on the host, else print ``fallback_stdout`` (keeps it one round trip)."""
    return StringCommand("if command -v", QuoteString(python), ">/dev/null 2>&1; then", command,
                         "; else echo", QuoteString(fallback_stdout), "; fi")
