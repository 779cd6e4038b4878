"""Commands that run one of our stdlib-only scripts with the host's Python, every value shell-quoted."""
from __future__ import annotations

from importlib import resources

from pyinfra.api import QuoteString, StringCommand


def host_python(python: str | None = None, on_host=None) -> str:
    """The interpreter on the host (default: the current one) for our scripts: the argument, else host data
    ``specops_python``, else python3."""
    from pyinfra import host

    return python or (host if on_host is None else on_host).data.get("specops_python") or "python3"


def script_text(name: str) -> str:
    return resources.files(__package__).joinpath(name).read_text()


def python_script(python: str, name: str, *args: str) -> StringCommand:
    """``python -c <remote_common.py + script> ARGS``: one self-contained program on the host."""
    program = script_text("remote_common.py") + "\n" + script_text(name)
    return StringCommand(QuoteString(python), "-c", QuoteString(program), *map(QuoteString, args))


def guarded(python: str, command: StringCommand, fallback_stdout: str) -> StringCommand:
    """Run ``command`` if ``python`` exists on the host, else print ``fallback_stdout`` (keeps it one round trip)."""
    return StringCommand("if command -v", QuoteString(python), ">/dev/null 2>&1; then", command,
                         "; else echo", QuoteString(fallback_stdout), "; fi")
