"""One exception tree for what specops raises in deploy code.

    SpecopsError
    └── ConfigError    a server config is invalid; ``issues`` lists every (host, field, message)
"""
from __future__ import annotations

from pyinfra.api.exceptions import OperationError


class SpecopsError(Exception):
    """Base of every specops error."""


class ConfigError(SpecopsError, OperationError):  # an OperationError, so the pyinfra CLI prints it plainly
    def __init__(self, issues):
        self.issues = list(issues)
        lines = "\n".join(f"  - {i}" for i in self.issues)
        super().__init__(f"{len(self.issues)} config error(s):\n{lines}")
