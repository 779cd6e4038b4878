"""How operations print: host-prefixed lines, and plans shown once (in prepare, or at execute under -y)."""
from __future__ import annotations

from pyinfra import logger, state


def log(on_host, message: str, **style) -> None:
    on_host.log_styled(message, log_func=logger.info, **style)


def error(on_host, message: str) -> None:
    on_host.log_styled(message, fg="red", log_func=logger.error)


def print_plan_now() -> bool:
    # Print in prepare (so --dry shows it) and at execute only when prepare was skipped (-y): never twice.
    return not state.is_executing or not state.should_check_for_changes()
