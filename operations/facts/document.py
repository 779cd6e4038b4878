"""The JSON document a host program printed, as a fact's value."""
from __future__ import annotations

import json
from typing import Callable

from pyinfra.api.exceptions import FactProcessError


def read_document(output: list[str], check: Callable[[dict], object], what: str) -> dict:
    """The document in ``output``, refused here, where the output is at hand, when ``check`` (the model's
    reader) cannot read it."""
    try:
        doc = json.loads("\n".join(output))
        check(doc)
        return doc
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise FactProcessError(f"unreadable {what}: {exc}: {output[-3:]!r}") from exc
