"""Commands that run one of our stdlib-only scripts with the host's Python, every value shell-quoted."""
from __future__ import annotations

from importlib import resources

from pyinfra.api import QuoteString, StringCommand


def script_text(name: str) -> str:
    return resources.files(__package__).joinpath(name).read_text()


def python_script(python: str, name: str, *args: str) -> StringCommand:
    return StringCommand(QuoteString(python), "-c", QuoteString(script_text(name)), *map(QuoteString, args))


def guarded(python: str, command: StringCommand, fallback_stdout: str) -> StringCommand:
    """Run ``command`` if ``python`` exists on the host, else print ``fallback_stdout`` (keeps it one round trip)."""
    return StringCommand("if command -v", QuoteString(python), ">/dev/null 2>&1; then", command,
                         "; else echo", QuoteString(fallback_stdout), "; fi")
