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


class Conversation:
    """A host program run with its progress lines (stderr, ``specops: ...``) passed to ``on_progress`` the
    moment they arrive, whose JSON document (its first stdout line) is ``document``; over pyinfra's SSH connector
    the program may then wait for one line from the controller (``replies``: the command was built for that), which
    ``reply`` sends, returning the program's second document. ``close`` (or the ``with`` block's end) ends it:
    a program still waiting reads end-of-file and exits having done nothing more.

    Over other connectors (no channel to write to) the command runs to its end first (``replies`` False), and
    the lines come when it has ended. A bundle removed during the run is installed and the command run again."""

    def __init__(self, on_host, build, on_progress, arguments: dict, unreadable=lambda why: {"error": why}):
        """``build(replies) -> HostProgram``: the command, told whether the program may wait for a reply;
        ``arguments``: the connector arguments it is built with (``connector_arguments``)."""
        self.on_host, self.on_progress, self.arguments, self.unreadable = on_host, on_progress, arguments, unreadable
        client = getattr(on_host.connector, "client", None) if hasattr(on_host, "connector") else None
        self.client = client if client is not None and hasattr(client, "exec_command") else None
        self.replies = self.client is not None
        self.command = build(self.replies)
        self._channel = None
        self.document = self._run()
        if self._channel is None and _missing(self.stderr) and isinstance(self.command, HostProgram):
            on_host.run_shell_command(installer(self.command.python), **arguments)  # removed during the run
            self.document = self._run()

    def __enter__(self):
        return self

    def __exit__(self, *_):
        self.close()

    def _run(self) -> dict:
        self.stdout, self.stderr = [], []
        if self.client is None:
            ok, out = self.on_host.run_shell_command(self.command, **self.arguments)
            self.stderr = list(out.stderr_lines)
            for line in self.stderr:
                _progress(line, self.on_progress)
            return _document(out.stdout_lines, self.stderr, self.unreadable)
        import gevent
        from pyinfra.connectors.util import make_unix_command_for_host

        unix = make_unix_command_for_host(self.on_host.state, self.on_host, self.command, **self.arguments)
        stdin, out, err = self.client.exec_command(unix.get_raw_value())
        self._err = gevent.spawn(self._pump, err)
        first = next(iter(out.readline, ""), "")  # the document, or "" when the program ended without one
        if not first:
            self._finish(stdin, out)
            return _document([], self.stderr, self.unreadable)
        self._channel = (stdin, out)
        return _document([first.rstrip("\n")], self.stderr, self.unreadable)

    def _pump(self, err) -> None:
        for line in err:
            self.stderr.append(line.rstrip("\n"))
            _progress(self.stderr[-1], self.on_progress)

    def _finish(self, stdin, out) -> list[str]:
        stdin.close()
        rest = [line.rstrip("\n") for line in out]
        out.channel.recv_exit_status()
        self._err.join()
        return rest

    @property
    def waiting(self) -> bool:
        """The program printed its document and waits for a reply."""
        return self._channel is not None

    def reply(self, line: str) -> dict:
        """Send ``line`` to the waiting program; its answer (a JSON document), or ``unreadable(why)``."""
        if self._channel is None:
            return self.unreadable("the host program is not waiting for a reply")
        stdin, out = self._channel
        self._channel = None
        try:
            stdin.write(line.rstrip("\n") + "\n")
            stdin.flush()
        except OSError as exc:  # the channel went away: the program is gone too
            return self.unreadable(f"{type(exc).__name__}: {exc}")
        return _document(self._finish(stdin, out), self.stderr, self.unreadable)

    def close(self) -> None:
        if self._channel is not None:
            stdin, out = self._channel
            self._channel = None
            self._finish(stdin, out)


def _progress(line: str, on_progress) -> None:
    if line.startswith(PROGRESS):
        on_progress(line[len(PROGRESS):])


def guarded(python: str, command: StringCommand, fallback_stdout: str) -> StringCommand:
    """Run ``command`` if ``python`` exists on the host, else print ``fallback_stdout`` (keeps it one round trip)."""
    return StringCommand("if command -v", QuoteString(python), ">/dev/null 2>&1; then", command,
                         "; else echo", QuoteString(fallback_stdout), "; fi")
