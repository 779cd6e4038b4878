"""One exception tree for everything specops raises.

    SpecopsError
    ├── ProbeError        a host's GPU probe produced output we cannot read
    └── NotIdle           gpu.idle ended in a failure verdict (blocked / busy / needs-reset)
"""
from __future__ import annotations


class SpecopsError(Exception):
    """Base of every specops error."""


class ProbeError(SpecopsError):
    """The remote probe's output could not be parsed."""


class NotIdle(SpecopsError):
    """GPUs did not reach idle; ``verdict`` carries the details."""

    def __init__(self, verdict):
        super().__init__(verdict.text)
        self.verdict = verdict
