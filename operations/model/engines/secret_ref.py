"""An argv element whose value is a secret (rendered as a reference to the server's 0600 environment file)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SecretRef:
    """An argv element whose value is a secret: rendered as a reference to the 0600 environment file."""

    key: str
    prefix: str = ""  # e.g. "--api-key=": rendered in front of the value, in the same argv element

    @property
    def variable(self) -> str:
        return "SPECOPS_SECRET_" + self.key.upper()
