"""The host lock: one specops run at a time changes a host.

Every operation that changes a host (``server.running``, ``server.stopped``, ``gpu.idle`` when it signals,
``multinode.running``, ``sweep.benchmarked``) first takes the host's lease, ``<state dir>/.specops-lock.json``
(host data ``specops_state_dir``, default /var/lib/specops). The lease belongs to the run (one pyinfra
invocation), not to one operation, so a second deploy cannot slip in between a sweep's server start and its
benchmark; each operation renews it for as long as it may take. The run releases it after its last operation.

A second run meanwhile waits (host data ``specops_lock_wait_s``, default 300 s; a progress line every 10 s,
naming the holder) and then fails that host, touching nothing. A run that died (Ctrl-C, lost controller) leaves
its lease until it expires; when the next run comes from the same controller and the holder's pid is gone, the
lease is broken at once and that is said.
"""
from __future__ import annotations

import atexit
import getpass
import json
import os
import posixpath
import socket
import time
import uuid

import gevent
from pyinfra.api import FunctionCommand
from pyinfra.api.state import BaseStateCallback, State

from operations.model import hostdata

from operations.controller import interrupt, run_state

from operations.controller import output as report
from operations.controller.remote import ask, host_python, python_script
from operations.remote.common import start_time
from operations.controller.waiting import Deadline, RealClock, poll

DEFAULT_STATE_DIR = "/var/lib/specops"
LEASE = ".specops-lock.json"


class _Run(BaseStateCallback):
    """This run's owner identity. Releases a host's lease when that host fails (it leaves the run), every lease
    when the run's last operation ends, and whatever is still held when the process exits (an aborted run)."""

    def __init__(self, state):
        self.state = state
        self.owner = {"id": uuid.uuid4().hex, "controller": socket.gethostname(), "pid": os.getpid(),
                      "pid_start": start_time(os.getpid()), "user": _user(), "started_at": time.time()}
        self.held: dict[str, str] = {}  # host name -> python used there

    def operation_end(self, state, op_hash):
        order = state.get_op_order()
        if order and op_hash == order[-1]:
            release_all(state)

    def operation_host_error(self, state, host, op_hash, retry_count=0, max_retries=0):
        if retry_count < max_retries or host.name not in self.held:
            return
        try:
            ignored = state.get_op_data_for_host(host, op_hash).global_arguments.get("_ignore_errors")
        except (KeyError, AttributeError):
            ignored = False
        if not ignored:  # the host is out of this run: a failed run must not keep the host for its whole TTL
            release(state, host.name)


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return str(os.getuid())


def run_of(state) -> _Run:
    """This run's identity and the hosts it holds (made once per run, kept on its State)."""
    return run_state.scoped(state, "lease", _new_run)


def _new_run(state) -> _Run:
    run = _Run(state)
    if hasattr(state, "add_callback_handler"):
        state.add_callback_handler(run)
    if isinstance(state, State):  # a real run: an aborted one (Ctrl-C, "No hosts remaining") releases too
        atexit.register(release_all, state)  # pyinfra has no public end-of-run hook that also fires on an abort
        interrupt.install(on_abort=lambda: release_all(state))
    return run


def lease_path(on_host) -> str:
    return posixpath.join(on_host.data.get("specops_state_dir") or DEFAULT_STATE_DIR, LEASE)


def acquired(what: str, ttl_s: float, python: str | None = None, prepare: str | None = None) -> FunctionCommand:
    """The command that takes (or renews) this run's lease on the host before ``what`` changes it; ``prepare``:
    a server directory created or checked in the same round trip once the lease is held (0700, never in a tree
    other users can write; a corrupt state.json set aside), what was done said."""
    return FunctionCommand(_acquire, (what, float(ttl_s), python, prepare), {})


def _ctl(host, python: str, *args: str) -> dict:
    return ask(host, python_script(python, "lease.py", *args))


def describe(holder: dict, now: float) -> str:
    since = time.strftime("%H:%M:%S", time.localtime(holder.get("acquired_at") or now))
    return (f"{holder.get('user')}@{holder.get('controller')} pid {holder.get('pid')} ({holder.get('what')}), "
            f"since {since}, lease expires in {max(0, (holder.get('expires_at') or now) - now):.0f} s")


def _not_checkable(holder: dict, me: dict, path: str, now: float) -> str:
    """One line for a lease held from another controller, whose process this run cannot see."""
    if holder.get("controller") == me["controller"]:
        return ""
    until = time.strftime("%H:%M:%S", time.localtime(holder.get("expires_at") or now))
    return (f" [held from controller {holder.get('controller')}: if pid {holder.get('pid')} is no longer running "
            f"there, the lease expires at {until}, or remove {path}]")


def _gone_here(holder: dict, me: dict) -> bool:
    """The holder is a run on this controller whose process has ended: its lease can be broken now."""
    return (holder.get("controller") == me["controller"] and holder.get("pid") != me["pid"]
            and start_time(holder.get("pid") or 0) != holder.get("pid_start"))


@interrupt.stops_on_interrupt
def _acquire(state, host, what: str, ttl_s: float, python: str | None, prepare: str | None = None) -> bool:
    run = run_of(state)
    python = host_python(python, host)
    me = {**run.owner, "what": what}
    clock, path = RealClock(), lease_path(host)
    wait_s = hostdata.lock_wait_s(host)
    deadline, breaking, shown = Deadline(clock, wait_s), [None], [None]  # shown: when the last waiting line was

    def attempt(_budget: float) -> dict:
        doc = _take(host, python, path, me, ttl_s, what, breaking[0], prepare)
        holder = doc.get("holder")
        if holder and _gone_here(holder, me) and breaking[0] != holder.get("id"):
            breaking[0] = holder.get("id")  # its run has ended on this controller: take the lease over at once
            doc = _take(host, python, path, me, ttl_s, what, breaking[0], prepare)
        return doc

    def progress(doc: dict) -> None:
        holder = doc.get("holder")
        if doc.get("acquired") or holder is None or (shown[0] is not None and clock.now() - shown[0] < 10):
            return
        shown[0] = clock.now()
        report.log(host, f"lock: waiting for another specops run: {describe(holder, doc['now'])} "
                         f"({deadline.elapsed():.0f} of {wait_s:.0f} s){_not_checkable(holder, me, path, doc['now'])}")

    # one lease read per second until it is ours, it cannot be read, or the wait is over (tenacity, via poll)
    doc = poll(attempt, lambda d: bool(d.get("acquired")) or d.get("holder") is None, deadline, interval=1.0,
               on_read=progress).value
    if doc.get("acquired"):
        run.held[host.name] = python
        took = doc.get("took_over")
        if took:
            report.log(host, f"lock: took over the lease of {describe(took, time.time())}: "
                             f"{'its run has ended' if took['why'] == 'broken' else 'it had expired'}")
        elif doc.get("fresh") and shown[0] is not None:
            report.log(host, f"lock: acquired after {deadline.elapsed():.0f} s")
        return _prepared(host, prepare, doc.get("prepared"))
    holder = doc.get("holder")
    if holder is None:
        report.error(host, f"lock: cannot take the host lease {path}: {doc.get('error')}")
        return False
    report.error(host, f"{what}: another specops run holds this host: {describe(holder, doc['now'])}; "
                       f"waited {deadline.elapsed():.0f} s, nothing changed here. Run again when it is done (or, if "
                       f"that run is gone, when its lease expires, or remove {path})"
                       f"{_not_checkable(holder, me, path, doc['now'])}")
    return False


def _prepared(host, directory: str | None, doc: dict | None) -> bool:
    """What preparing the server directory did (notes), or why it was refused (the host fails, nothing changed)."""
    if directory is None:
        return True
    doc = doc if isinstance(doc, dict) else {"error": "the lease program did not prepare it"}
    for note in doc.get("notes") or ():
        report.log(host, f"server directory {directory}: {note}", fg="yellow")
    if "error" in doc:
        report.error(host, f"server directory {directory}: {doc['error']}; nothing changed")
        return False
    return True


def _take(host, python: str, path: str, me: dict, ttl_s: float, what: str, breaking: str | None,
          prepare: str | None = None) -> dict:
    """One ``lease.py acquire`` (with the id of a lease being broken, if any); its notes are printed."""
    interrupt.check(f"taking the host lease for {what}")
    doc = _ctl(host, python, "acquire", path, json.dumps(me), str(ttl_s), *([breaking] if breaking else []),
               *(["--prepare", prepare] if prepare else []))
    for note in doc.get("notes") or ():
        report.log(host, f"lock: {note}", fg="yellow")
    return doc


def release(state, name: str) -> None:
    """Release the lease this run holds on host ``name`` (best effort: a host that went away keeps it until it
    expires, and that is said)."""
    run = run_state.peek(state, "lease")
    if run is None or name not in run.held:
        return
    python = run.held.pop(name)
    on_host = state.inventory.get_host(name)
    try:
        doc = _ctl(on_host, python, "release", lease_path(on_host), run.owner["id"])
    except Exception as exc:  # noqa: BLE001 - a host that went away keeps the lease until it expires
        doc = {"error": f"{type(exc).__name__}: {exc}"}
    if "error" in doc:
        report.log(on_host, f"lock: could not release the host lease ({doc['error']}); it expires by itself")


def release_all(state) -> None:
    """Release every lease this run still holds (after its last operation, and at exit), every host at once:
    one after another, N hosts would add N round trips to the end of the run."""
    run = run_state.peek(state, "lease")
    names = list(run.held) if run is not None else []
    if len(names) > 1:
        gevent.joinall([gevent.spawn(release, state, name) for name in names])
    for name in names if len(names) == 1 else ():
        release(state, name)


def handover(on_host) -> dict | None:
    """The lease a host program may release as its last act (path and owner id): this run's, while the
    operation running is the run's last on that host; else None. Saves the run's closing round trip."""
    run = run_state.peek(on_host.state, "lease")
    order = getattr(on_host, "op_hash_order", None) or ()
    if run is None or on_host.name not in run.held or not order or on_host.current_op_hash != order[-1]:
        return None
    return {"path": lease_path(on_host), "id": run.owner["id"]}


def handed_over(on_host, answer: dict | None) -> None:
    """A host program's answer: when it released the lease, the lease is no longer this run's to release."""
    run = run_state.peek(on_host.state, "lease")
    if run is not None and isinstance(answer, dict) and (answer.get("released") or {}).get("released") is True:
        run.held.pop(on_host.name, None)
