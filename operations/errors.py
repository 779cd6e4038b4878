"""One exception tree for what specops raises in deploy code, and ``Issue``, one problem found by validation.

    SpecopsError
    ├── ConfigError    a server config or host data is invalid; ``issues`` lists every (host, field, message)
    └── Interrupted    Ctrl-C was pressed: the step must not signal, start or wait further (raised by
                       operations.controller.interrupt)
"""
from __future__ import annotations

from dataclasses import dataclass

from gevent.hub import Hub
from pyinfra.api.exceptions import OperationError


@dataclass(frozen=True)
class Issue:
    """One validation problem: the field (flag or setting), what is wrong, and the host it is for (``*``: any)."""

    field: str
    message: str
    host: str = "*"

    def __str__(self) -> str:
        return f"[{self.host}] {self.field}: {self.message}"


class SpecopsError(Exception):
    """Base of every specops error."""


class ConfigError(SpecopsError, OperationError):  # an OperationError, so the pyinfra CLI prints it plainly
    def __init__(self, issues):
        self.issues = list(issues)
        lines = "\n".join(f"  - {i}" for i in self.issues)
        super().__init__(f"{len(self.issues)} config error(s):\n{lines}")


class Interrupted(SpecopsError):
    """The user pressed Ctrl-C: the current step must not signal, start or wait any further."""


# An operation body runs in a gevent greenlet when pyinfra executes it; gevent prints a traceback for any exception
# a greenlet ends with, before pyinfra re-raises it and prints it plainly. A ConfigError is the user's input, not a
# crash: list it among gevent's documented "not errors" so only pyinfra's own report of it is shown.
Hub.NOT_ERROR = (*Hub.NOT_ERROR, ConfigError)
