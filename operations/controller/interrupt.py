"""Ctrl-C during a run: no further signals or starts, the host leases released, and a non-zero exit.

pyinfra's own SIGINT handler prints "Exiting upon user request!" and raises ``SystemExit(0)`` in whatever
greenlet happens to run, so an operation in another greenlet carries on signalling and starting, the run exits 0
and the lease stays. specops replaces it (once, in the pyinfra CLI's main thread, when its first operation is
prepared) with one that only raises a flag: every step that signals, starts or waits checks it first
(``guard()`` before a command, ``check()`` inside waits, through ``RealClock``), so each host stops at its next
step and fails with "interrupted". The failed hosts release their leases (``lock``) and pyinfra exits 1.
A second Ctrl-C releases what is still held and exits 130 at once.
"""
from __future__ import annotations

import os
import signal

from pyinfra import logger
from pyinfra.api import FunctionCommand

from operations.errors import Interrupted


_state = {"installed": False, "count": 0, "on_abort": None}


def install(on_abort=None) -> None:
    """Take over SIGINT for this process (the pyinfra CLI's main thread only; a no-op elsewhere). ``on_abort`` runs
    on the second Ctrl-C, before the process exits 130 (it releases the leases)."""
    if on_abort is not None:
        _state["on_abort"] = on_abort
    if _state["installed"] or signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        return  # already, or not the pyinfra CLI (an API user or a test harness keeps Python's KeyboardInterrupt)
    try:
        signal.signal(signal.SIGINT, _on_sigint)
    except ValueError:  # not the main thread
        return
    _state["installed"] = True


def _on_sigint(signum, frame) -> None:  # runs in whichever greenlet is current: only set the flag and log
    _state["count"] += 1
    if _state["count"] == 1:
        logger.warning("--> specops: interrupted (Ctrl-C): no further signals or starts; each host stops at its "
                       "next step and releases its lease. Ctrl-C again to abort at once.")
        return
    logger.warning("--> specops: interrupted again: releasing host leases and exiting now")
    import gevent

    gevent.spawn_later(15, os._exit, 130)  # a host that does not answer must not keep the process alive
    gevent.spawn(_abort)  # the handler may run in gevent's hub, where the release's I/O cannot block


def _abort() -> None:
    try:
        if _state["on_abort"]:
            _state["on_abort"]()
    finally:
        os._exit(130)


def interrupted() -> bool:
    return _state["count"] > 0


def check(what: str) -> None:
    if interrupted():
        raise Interrupted(f"interrupted (Ctrl-C) before {what}")


def guard(what: str) -> FunctionCommand:
    """A command that fails this host (and so ends its operation before the next command) once Ctrl-C was
    pressed; placed right before each command that signals or starts something."""
    return FunctionCommand(_guard, (what,), {})


def _guard(state, host, what: str) -> bool:
    if not interrupted():
        return True
    host.log_styled(f"interrupted (Ctrl-C): not {what}", fg="red", log_func=logger.error)
    return False


def stops_on_interrupt(fn):
    """For a ``(state, host, ...)`` FunctionCommand: an ``Interrupted`` raised inside fails this host with one
    clear line (instead of pyinfra's "Unexpected error in Python callback" and a traceback)."""
    def run(state, host, *args, **kwargs):
        try:
            return fn(state, host, *args, **kwargs)
        except Interrupted as exc:
            host.log_styled(f"{exc}: stopped here, nothing further signalled or started", fg="red",
                            log_func=logger.error)
            return False

    run.__name__, run.__doc__ = fn.__name__, fn.__doc__
    return run
